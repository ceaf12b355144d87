"""Engine replicas as the router sees them, and the state placement runs on.

Each replica's state comes from the pod itself (`GET /jitserve/state`, a `ReplicaState`). Between polls
the router adds what it dispatched since the report, so a burst does not all land on the replica that
looked emptiest at the last poll. When the report is stale (the pod stopped answering in time) the
router falls back to the last known speeds plus its own in-flight count; an engine that serves no state
at all (plain vLLM) is judged by configured default speeds. Down replicas are left out entirely.
`effective_state` is pure; the poller and the proxy are the only writers of `Replica`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

from jitserve.router.config import Defaults
from jitserve.scheduler.placement import ReplicaState


class Health(StrEnum):
    PENDING = "pending"  # discovered, not yet answered a poll
    FRESH = "fresh"  # state reported within stale_after
    STALE = "stale"  # state older than stale_after: fallback estimate
    STATELESS = "stateless"  # healthy but serves no /jitserve/state: defaults
    DOWN = "down"


# Fields that decide which replicas may serve which model: writing one bumps `MEMBERSHIP.version`, so
# the pool rebuilds its per-model index only after such a write, never per request.
_MEMBERSHIP_FIELDS = frozenset({"healthy", "down", "models"})


class _Version:
    __slots__ = ("version",)

    def __init__(self) -> None:
        self.version = 0


MEMBERSHIP = _Version()


@dataclass(eq=False)
class Replica:
    name: str
    url: str  # base URL, e.g. http://10.0.0.7:8000
    state: ReplicaState | None = None
    state_at: float = -math.inf  # router clock (monotonic) when `state` arrived
    models: frozenset[str] = frozenset()
    healthy: bool = False  # answered its last poll (state or health)
    down: bool = False  # failed its last polls, or a request failed to connect
    failures: int = 0
    inflight: int = 0  # requests the router has open on it
    sent_since_state: int = 0  # dispatched after the last state report
    prompt_tokens_since_state: int = 0  # their prompt tokens (the report's pending prefill lacks them)
    chosen_total: int = 0
    tags: dict[str, str] = field(default_factory=dict)
    unresponsive: bool = False  # down because it stopped answering (its health probe timed out)
    probing: bool = False  # a liveness probe is out (a poll or a request timed out on it)
    last_byte: float = -math.inf  # router clock of the last bytes relayed from it (it is alive)
    state_moved_at: float = -math.inf  # router clock when its report's updated_at last advanced
    attempts: set = field(default_factory=set)  # requests on it that can be ended (upstream.Attempt)
    # effective_state's last answer and what it was computed from (placement_state)
    _view: ReplicaState | None = field(default=None, repr=False)
    _view_key: tuple = field(default=(), repr=False)

    def __setattr__(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)
        if name in _MEMBERSHIP_FIELDS:
            MEMBERSHIP.version += 1

    def health(self, now: float, stale_after: float) -> Health:
        if self.down:
            return Health.DOWN
        if not self.healthy:
            return Health.PENDING
        if self.state is None:
            return Health.STATELESS
        return Health.FRESH if now - self.state_at <= stale_after else Health.STALE

    def serves(self, model: str) -> bool:
        return model in self.models

    def placement_state(self, now_wall: float, now_mono: float, defaults: Defaults) -> ReplicaState | None:
        """`effective_state`, recomputed only when what it depends on changed (a poll's report, a
        dispatch, a release while the report is stale or absent, the report going stale): a request
        reads the sampled replicas' states, it copies none of them."""
        health = self.health(now_mono, defaults.stale_after_s)
        if health is Health.FRESH:
            count = self.sent_since_state
        elif health is Health.STALE or health is Health.STATELESS:
            count = self.inflight
        else:
            return None
        key = self._view_key
        if key and key[0] is health and key[1] is self.state and key[2] == count:
            return self._view
        view = effective_state(self, now_wall, now_mono, defaults)
        self._view, self._view_key = view, (health, self.state, count)
        return view


def _overflow_delay(queued: int, batch: int, step_time: float, defaults: Defaults) -> float:
    """Expected wait of a request behind `queued` others when `batch` run at once, knowing nothing of
    their lengths: continuous batching frees a slot each time one of the `batch` running requests ends,
    so with `assumed_output_tokens` each the queue moves one place every assumed / batch steps."""
    if queued <= 0:
        return 0.0
    return queued * defaults.assumed_output_tokens * step_time / max(batch, 1)


def _turn(s: ReplicaState, defaults: Defaults) -> float:
    """Seconds between slots freeing on a replica that reported `s`: as its own queue delay implies,
    else the assumed length's."""
    turn = s.slot_turn_s()
    return turn if turn is not None else _overflow_delay(1, s.batch_size, s.step_time_s, defaults)


def effective_state(r: Replica, now_wall: float, now_mono: float, defaults: Defaults) -> ReplicaState | None:
    """The state placement should use for `r`, or None if `r` must not receive requests."""
    health = r.health(now_mono, defaults.stale_after_s)
    if health in (Health.DOWN, Health.PENDING):
        return None
    s = r.state
    if health is Health.FRESH:
        assert s is not None
        extra = r.sent_since_state
        if extra == 0:
            return s
        free = max(s.batch_size - s.running - s.waiting, 0)
        spill = max(extra - free, 0)
        update: dict[str, object] = {
            "pending_prefill_tokens": s.pending_prefill_tokens + r.prompt_tokens_since_state
        }
        if s.reserved_waiting is not None:
            # what the router sent since beyond the free slots may all be work the engine reserves
            update["reserved_waiting"] = s.reserved_waiting + spill
        return s.model_copy(
            update=update
            | {
                "waiting": s.waiting + extra,
                "queue_delay_s": s.queue_delay_s + spill * _turn(s, defaults),
                "committed_bandwidth": s.committed_bandwidth + extra,
                "residual_capacity": s.residual_capacity - extra,
            }
        )
    # STALE or STATELESS: last known speeds (or defaults) and the router's own in-flight count.
    step = s.step_time_s if s is not None else defaults.step_time_s
    prefill = s.prefill_tokens_per_s if s is not None else defaults.prefill_tokens_per_s
    batch = s.batch_size if s is not None else defaults.batch_size
    running = min(r.inflight, batch)
    waiting = max(r.inflight - batch, 0)
    return ReplicaState(
        pod=r.name,
        model=s.model if s is not None else next(iter(sorted(r.models)), ""),
        step_time_s=step,
        prefill_tokens_per_s=prefill,
        batch_size=batch,
        running=running,
        waiting=waiting,
        committed_bandwidth=float(r.inflight),
        residual_capacity=float(batch - r.inflight),
        admission_priority=s.admission_priority if (s is not None and waiting > 0) else 0.0,
        queue_delay_s=_overflow_delay(waiting + 1 if waiting else 0, batch, step, defaults),
        kv_usage=s.kv_usage if s is not None else 0.0,
        cutoff=s.cutoff if s is not None else 0.95,
        frames=s.frames if s is not None else 0,
        updated_at=now_wall,
    )
