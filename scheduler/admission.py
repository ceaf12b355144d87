"""Admission and placement: one pure decision per request, over the replicas' effective states. The
router and the simulator both call `decide` (the core, so the simulator never imports the router).

`place` (scheduler/placement.py, the same GMAX analysis every engine runs) picks the replica where the
request's replica-specific priority is best, or none when no replica can still meet the SLO. Then the
class's overload action applies: reject (429 + Retry-After) or downgrade to best-effort and place again.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from jitserve.scheduler.gmax import GMAXParams
from jitserve.scheduler.placement import (
    DEPLOYED_SHORT_REPLY,
    Rejection,
    ReplicaState,
    ShortReplyRule,
    place,
)
from jitserve.scheduler.requests import NewRequest
from jitserve.scheduler.slo import SLO, OverloadAction, SLOClassSpec

BEST_EFFORT = "best-effort"


class Action(StrEnum):
    ADMIT = "admitted"
    DOWNGRADE = "downgraded"
    REJECT = "rejected"


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    replica: int | None  # index into the states given; None when rejected
    request: NewRequest  # as admitted (a downgraded request carries the best-effort SLO)
    slo_class: str  # class the engine is told (best-effort after a downgrade)
    reason: str
    retry_after_s: float | None = None
    rejection: Rejection | None = None  # the placement rule that rejected it (REJECT only)


def best_effort_slo(classes: dict[str, SLOClassSpec], waiting_time: float) -> tuple[str, SLO]:
    """The SLO a downgraded request gets: the pool's best-effort class if it has one."""
    spec = classes.get(BEST_EFFORT)
    if spec is None or spec.type.value != BEST_EFFORT:
        from jitserve.scheduler.slo import PAPER_CLASSES

        spec = PAPER_CLASSES[BEST_EFFORT]
    return BEST_EFFORT, spec.to_slo(overrides={"waiting_time": waiting_time})


def retry_after(states: list[ReplicaState]) -> float:
    """A hint for Retry-After: when the least-loaded replica expects to have drained its queue."""
    if not states:
        return 1.0
    return max(1.0, min(s.queue_delay_s for s in states))


def decide(
    request: NewRequest,
    slo_class: str,
    overload: OverloadAction,
    classes: dict[str, SLOClassSpec],
    states: list[ReplicaState],
    now: float,
    k: int | None = None,
    cached_tokens: list[int] | None = None,
    rng: np.random.Generator | None = None,
    params: GMAXParams = GMAXParams(),
    short_reply: ShortReplyRule = DEPLOYED_SHORT_REPLY,
) -> Decision:
    """Admit on the best replica, downgrade, or reject. `states` must be non-empty. `params` and
    `short_reply` go to `place()` (the simulator studies them; the router runs the defaults)."""
    placer = functools.partial(
        place, replicas=states, now=now, k=k, cached_tokens=cached_tokens, rng=rng, params=params,
        short_reply=short_reply,
    )  # fmt: skip
    p = placer(request)
    if p.replica is not None:
        return Decision(Action.ADMIT, p.replica, request, slo_class, p.reason)
    if overload is OverloadAction.DOWNGRADE and request.slo.type.value != BEST_EFFORT:
        name, slo = best_effort_slo(classes, request.slo.waiting_time)
        downgraded = dataclasses.replace(
            request, slo=slo, deadline_abs=None, program_deadline_abs=None, program_goodput=0.0
        )
        p2 = placer(downgraded)
        if p2.replica is not None:
            return Decision(Action.DOWNGRADE, p2.replica, downgraded, name, f"downgraded: {p.reason}")
    return Decision(Action.REJECT, None, request, slo_class, p.reason, retry_after(states), p.rejection)
