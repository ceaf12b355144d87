"""The policy interface the vLLM adapter, the router and the simulator all drive.

A policy sees the request table, the clock and the engine's speed at a frame boundary and returns a
`FramePlan`: the queue order, the batch to run, whom to preempt and whom to drop. Adapters carry the
plan out; they never decide themselves. Baselines live behind the same interface so every comparison
runs the same machinery.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from jitserve.scheduler.budget import paced_token_budget
from jitserve.scheduler.fairness import TenantAttainment, TypeAttainment
from jitserve.scheduler.gmax import (
    CutoffTuner,
    EngineSpeed,
    FramePlan,
    GMAXParams,
    end_frame,
    expired,
    plan_frame,
)
from jitserve.scheduler.requests import LATENCY, RequestTable


class Policy(Protocol):
    name: str
    frame_steps: int  # re-plan every this many engine steps

    def plan(self, table: RequestTable, now: float, speed: EngineSpeed) -> FramePlan: ...

    def end_frame(self, table: RequestTable, plan: FramePlan, goodput_per_s: float | None = None) -> None:
        """Called after the frame ran; `goodput_per_s` is what the engine observed in it, if known."""
        ...


@dataclass
class GMAXPolicy:
    """JITServe: GMAX with cost-aware preemption, waiting_time drops and online cutoff tuning.

    `ranking` overrides `params.ranking`: "jit" (just-in-time bandwidth, the default) or "paper"
    (Algorithm 1's ranking alone; `jitserve-paper`, kept for the ablation).
    """

    params: GMAXParams = GMAXParams()
    tune_cutoff: bool = True
    tuner_epoch_frames: int = 20
    name: str = "jitserve"
    ranking: str | None = None
    attainment: TypeAttainment = field(default_factory=TypeAttainment)
    tenants: TenantAttainment = field(default_factory=TenantAttainment)

    def __post_init__(self) -> None:
        if self.ranking is not None:
            self.params = replace(self.params, ranking=self.ranking)
        self._tuner = CutoffTuner(initial=self.params.cutoff) if self.tune_cutoff else None
        self._epoch_frames = 0
        self._epoch_goodput = 0.0

    @property
    def frame_steps(self) -> int:
        return self.params.frame_steps

    @property
    def preempts_midframe(self) -> bool:
        """Whether the engine carries out `plan.preempt` of plans made between frame boundaries.

        Just-in-time GMAX preempts only for a request that would lose goodput before the next frame,
        so an urgent arrival takes a slot at once; Algorithm 1 preempts at frame boundaries only."""
        return self.params.ranking == "jit"

    @property
    def orders_prompts(self) -> bool:
        """Whether the engine orders a step's prompts by `budget.prompt_order` (started streams' prompts
        first) and caps them by `budget.prompt_chunk_cap` while streams wait: just-in-time GMAX only;
        `jitserve-paper` keeps vLLM's own order."""
        return self.params.ranking == "jit"

    def token_budget(self, table: RequestTable, now: float, speed: EngineSpeed, ceiling: int) -> int:
        """Tokens the engine's next step may schedule, at most its configured `ceiling`: just-in-time
        GMAX keeps the step within the tightest running pace (`scheduler.budget`); Algorithm 1 alone
        (`jitserve-paper`) leaves the engine's budget as configured."""
        if self.params.ranking != "jit":
            return ceiling
        return paced_token_budget(table, now, speed, ceiling, self.params.oracle)

    def plan(self, table: RequestTable, now: float, speed: EngineSpeed) -> FramePlan:
        # only the just-in-time reservation reads Fair(r)
        uses = self.params.ranking == "jit" and self.params.class_fairness > 0
        type_fair = self.attainment.fair(now) if uses else None
        # Fair(r) per tenant, read only by requests whose class gives it a weight
        tenant_fair = self.tenants.fair(now) if table.fairness.any() else None
        return plan_frame(table, now, speed, self.params, tenant_fair, type_fair=type_fair)

    def outcome(self, slo_type: int, met: bool, now: float, tenant: int = 0) -> None:
        """A request of `slo_type` and `tenant` ended (`met`: on time): the attainment the fairness
        terms read."""
        self.attainment.record(slo_type, met, now)
        self.tenants.record(tenant, met, now)

    def end_frame(self, table: RequestTable, plan: FramePlan, goodput_per_s: float | None = None) -> None:
        end_frame(table, plan)
        if self._tuner is None or goodput_per_s is None:
            return
        self._epoch_frames += 1
        self._epoch_goodput += goodput_per_s
        if self._epoch_frames >= self.tuner_epoch_frames:
            cutoff = self._tuner.record(self._epoch_goodput / self._epoch_frames)
            self.params = replace(self.params, cutoff=cutoff)
            self._epoch_frames, self._epoch_goodput = 0, 0.0


def oracle_policy(params: GMAXParams = GMAXParams()) -> GMAXPolicy:
    """Oracle JITServe: GMAX with the true lengths (and, in the simulator, the true graphs)."""
    return GMAXPolicy(params=replace(params, oracle=True), name="jitserve-oracle")


def paper_policy(params: GMAXParams = GMAXParams()) -> GMAXPolicy:
    """JITServe with Algorithm 1's ranking alone (no reservation, frame-boundary preemption only)."""
    return GMAXPolicy(params=params, ranking="paper", name="jitserve-paper")


@dataclass
class KeyedPolicy:
    """A non-preemptive order-by-key baseline (vLLM-style): running requests keep their slots, free
    slots go to the waiting requests with the smallest key. No drops unless asked."""

    name: str
    batch_size: int = 8
    frame_steps: int = 1
    drop_expired: bool = False

    def key(self, table: RequestTable, slots: np.ndarray, now: float, speed: EngineSpeed) -> np.ndarray:
        raise NotImplementedError

    def plan(self, table: RequestTable, now: float, speed: EngineSpeed) -> FramePlan:
        slots = table.active_slots()
        drop = expired(table, now, slots) if self.drop_expired else slots[:0]
        if drop.size:
            slots = np.setdiff1d(slots, drop, assume_unique=True)
        order = slots[np.argsort(self.key(table, slots, now, speed), kind="stable")]
        running = order[table.running[order]]
        waiting = order[~table.running[order]]
        room = max(self.batch_size - running.size, 0)
        batch = np.concatenate([running, waiting[:room]])
        return FramePlan(order=order, batch=batch, preempt=slots[:0], drop=drop)

    def end_frame(self, table: RequestTable, plan: FramePlan, goodput_per_s: float | None = None) -> None:
        return None


class FCFSPolicy(KeyedPolicy):
    """vLLM's default: first come, first served."""

    def __init__(self, batch_size: int = 8, **kw: object) -> None:
        super().__init__(name="fcfs", batch_size=batch_size, **kw)  # type: ignore[arg-type]

    def key(self, table: RequestTable, slots: np.ndarray, now: float, speed: EngineSpeed) -> np.ndarray:
        return table.arrival[slots]


def next_due(table: RequestTable, slots: np.ndarray) -> np.ndarray:
    """Each request's next due time: the next token's timeline point (latency) or the deadline."""
    is_latency = table.slo_type[slots] == LATENCY
    return np.where(is_latency, table.token_due(slots), table.deadline_abs[slots])


class EDFPolicy(KeyedPolicy):
    """Earliest deadline first on each request's next due time."""

    def __init__(self, batch_size: int = 8, **kw: object) -> None:
        super().__init__(name="edf", batch_size=batch_size, **kw)  # type: ignore[arg-type]

    def key(self, table: RequestTable, slots: np.ndarray, now: float, speed: EngineSpeed) -> np.ndarray:
        return next_due(table, slots)


class SJFPolicy(KeyedPolicy):
    """Shortest job first on the predicted remaining length (the analyzer's bound; LTR-style)."""

    def __init__(self, batch_size: int = 8, **kw: object) -> None:
        super().__init__(name="sjf", batch_size=batch_size, **kw)  # type: ignore[arg-type]

    def key(self, table: RequestTable, slots: np.ndarray, now: float, speed: EngineSpeed) -> np.ndarray:
        return (table.len_ub[slots] - table.generated[slots]).astype(np.float64)


def make_policy(name: str, batch_size: int, **gmax_overrides: object) -> Policy:
    """Build a policy by name (CLI, engine flags, simulator configs)."""
    params = replace(GMAXParams(batch_size=batch_size), **gmax_overrides)  # type: ignore[arg-type]
    if name == "jitserve":
        return GMAXPolicy(params=params)
    if name == "jitserve-oracle":
        return oracle_policy(params)
    if name == "jitserve-paper":
        return paper_policy(params)
    simple: dict[str, type[KeyedPolicy]] = {"fcfs": FCFSPolicy, "edf": EDFPolicy, "sjf": SJFPolicy}
    if name in simple:
        return simple[name](batch_size=batch_size)
    known = ", ".join(["jitserve", "jitserve-oracle", "jitserve-paper", *simple])
    raise ValueError(f"policy: unknown policy {name!r} (known: {known})")


POLICY_NAMES = ("jitserve", "jitserve-oracle", "jitserve-paper", "fcfs", "edf", "sjf")
