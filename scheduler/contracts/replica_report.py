"""The replica report: what an engine pod publishes every frame (`/jitserve/state`) and the router's
placement reads. The schema is `ReplicaState` (scheduler/placement.py); this is the one place that fills
it from a replica's numbers, for the engine pod (engine/runner.py, which adds its diagnostics) and the
simulated replica (sim/simulator.py) alike, so the router sees the same report from either.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from jitserve.scheduler.gmax import EngineSpeed, Reservation
from jitserve.scheduler.placement import ClassGoodput, ReplicaState, replica_load
from jitserve.scheduler.requests import RequestTable

S = TypeVar("S", bound=ReplicaState)


def assemble_replica_state(
    table: RequestTable,
    now: float,
    speed: EngineSpeed,
    *,
    pod: str,
    model: str,
    batch_size: int,
    cutoff: float,
    running: int,
    waiting: int,
    kv_usage: float,
    frames: int,
    dropped_total: int = 0,
    preempted_total: int = 0,
    goodput: Mapping[str, ClassGoodput] | None = None,
    reservation: Reservation | None = None,
    state_type: type[S] = ReplicaState,  # type: ignore[assignment]
    extra: Mapping[str, Any] | None = None,
    validate: bool = True,
) -> S:
    """A `state_type` (ReplicaState or a subclass, whose own fields come in `extra`) for this moment.
    `reservation`: what the policy's latest plan reserved (`FramePlan.reservation`; None: it reserves
    nothing, and placement sees only the queue delay).

    `validate=False` builds it unchecked (`model_construct`): the engine builds its state several times
    a second from values it computed itself, where validating again would cost more than the rest."""
    load = replica_load(table, now, speed, batch_size, cutoff, running, waiting)
    fields: dict[str, Any] = {
        "pod": pod,
        "model": model,
        "step_time_s": float(speed.step_time),
        "prefill_tokens_per_s": float(speed.prefill_tokens_per_s),
        "batch_size": batch_size,
        "running": running,
        "waiting": waiting,
        "committed_bandwidth": load.committed_bandwidth,
        "residual_capacity": batch_size - load.committed_bandwidth,
        "admission_priority": load.admission_priority,
        "queue_delay_s": load.queue_delay_s,
        "pending_prefill_tokens": load.pending_prefill_tokens,
        "reserved_waiting": None if reservation is None else reservation.waiting,
        "yieldable": None if reservation is None else reservation.yieldable,
        "kv_usage": min(max(kv_usage, 0.0), 1.0),
        "cutoff": cutoff,
        "frames": frames,
        "dropped_total": dropped_total,
        "preempted_total": preempted_total,
        "goodput": dict(goodput or {}),
        "updated_at": now,
        **(extra or {}),
    }
    return state_type(**fields) if validate else state_type.model_construct(**fields)
