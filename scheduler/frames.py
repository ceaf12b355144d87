"""The frame driver: when to ask the policy for a plan, and a frame's bookkeeping.

The vLLM adapter (engine/runner.py) and the simulator (sim/engine.py) both drive a `Policy` through one
`FrameDriver`; each keeps only what is its own (vLLM's queues and KV cache, or the modelled engine's
macro steps and step times) and tells the driver what happened:

    driver.mark_dirty()            # an event a plan may answer (an arrival, a departure, ...)
    driver.record(goodput)         # goodput observed this frame (the cutoff tuner's reward)
    driver.outcome(slo_type, met, tenant)  # a request ended, on time or not (GMAX's fairness terms)
    driver.advance(k)              # k engine steps ran
    kind = driver.due()            # FULL, LIGHT or None: is a plan due now, and which
    plan = driver.plan(kind, speed)

A FULL plan at a frame boundary (every `frame_steps` steps, and the first plan) first closes the
frame before it: `policy.end_frame(table, plan, goodput / elapsed)`. A LIGHT plan between boundaries
answers events: its order and drops apply, its preemptions only if the policy `preempts_midframe`
(just-in-time GMAX); Algorithm 1 preempts at frame boundaries only (§4.2). Time comes from the
injected `clock`: wall time in the engine, simulated time in the simulator.

Where the two adapters differ, the difference is a named argument (docs/decisions/core.md, "One frame
driver"):
- `framed=False` (the simulator, for policies with `frame_steps == 1`): no frames at all; a plan is due
  on events only and every plan is full, with no `end_frame`. A policy whose decisions change only on
  events (the vLLM-style baselines) plans the same there as every step, at a fraction of the cost.
  The engine frames every policy: vLLM runs its steps without asking us, so a plan at a steady
  cadence is what keeps its queue order current.
- `due(has_room=...)`: the simulator re-plans a framed policy on an event only while a batch slot is
  free (or the policy preempts mid-frame): it hands out freed slots itself, after asking the policy.
  The engine cannot: vLLM admits from the head of its waiting queue into a freed slot on its own,
  so the queue must already be in the plan's order, and every arrival (appended at the tail) is
  re-planned at once, full batch or not (`has_room=True`, the default).
- `close_with`: which plan `end_frame` ages. "frame_plan" (the engine): the frame's boundary plan,
  restricted to its requests still in the table, so a slot freed during the frame and taken by a new
  arrival does not inherit the frame's aging. "last_plan" (the simulator): the latest plan, boundary or
  light, as it is; the simulator's published results were produced this way (a frame's light plans
  there order the requests that arrived during it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Literal

import numpy as np

from jitserve.scheduler.gmax import EngineSpeed, FramePlan
from jitserve.scheduler.policy import Policy
from jitserve.scheduler.requests import RequestTable

PlanKind = Literal["full", "light"]
FULL: PlanKind = "full"
LIGHT: PlanKind = "light"
CloseWith = Literal["frame_plan", "last_plan"]
# A frame's elapsed time is at least this much, so a reward is finite even when the clock did not move.
MIN_FRAME_S = 1e-9


class FrameDriver:
    """Steps in the frame, the dirty flag, plan kinds, frame closing and counters around one policy.

    `clock()` is read once per plan: for `policy.plan`'s `now` and for the frame's elapsed time.
    `frame_steps` defaults to the policy's own (the engine passes its flag: its vLLM-style baselines,
    whose policies say 1, re-plan at the same cadence as GMAX).
    """

    def __init__(
        self,
        policy: Policy,
        table: RequestTable,
        clock: Callable[[], float],
        *,
        frame_steps: int | None = None,
        framed: bool = True,
        close_with: CloseWith = "frame_plan",
    ) -> None:
        self.policy = policy
        self.table = table
        self.clock = clock
        self.frame_steps = int(policy.frame_steps if frame_steps is None else frame_steps)
        if self.frame_steps < 1:
            raise ValueError(f"frame_steps: must be >= 1, got {self.frame_steps}")
        if close_with not in ("frame_plan", "last_plan"):
            raise ValueError(f"close_with: must be frame_plan or last_plan, got {close_with!r}")
        self.framed = framed
        self.close_with: CloseWith = close_with
        self.steps = 0  # engine steps, in all
        self.steps_in_frame = 0
        self.plans = 0  # plans of either kind
        self.frames = 0  # frames begun (boundary plans)
        self.frames_closed = 0  # end_frame calls
        self.dirty = False
        self.last_plan: FramePlan | None = None  # the latest plan as carried out (either kind)
        self._open = False  # a frame has begun
        self._frame_plan: FramePlan | None = None  # this frame's boundary plan
        self._frame_ids: list[str] = []  # its order's request ids (close_with="frame_plan")
        self._frame_start = 0.0
        self._frame_goodput = 0.0

    # ------------------------------------------------------------------------------ events
    @property
    def preempts_midframe(self) -> bool:
        """Whether light plans keep their preemptions (read from the policy at each plan)."""
        return bool(getattr(self.policy, "preempts_midframe", False))

    def mark_dirty(self) -> None:
        """Something a plan may answer happened (an arrival, a departure, a cancelled call, ...)."""
        self.dirty = True

    def record(self, goodput: float) -> None:
        """Goodput observed now: it counts towards the current frame's reward."""
        self._frame_goodput += goodput

    def outcome(self, slo_type: int, met: bool, tenant: int = 0) -> None:
        """A request of `slo_type` (its table code) and `tenant` (its table id) ended, `met` if on time;
        dropped ones count as missed. Policies that weigh recent attainment (GMAX's fairness terms) are
        told; others ignore it."""
        tell = getattr(self.policy, "outcome", None)
        if tell is not None:
            tell(slo_type, met, self.clock(), tenant)

    def advance(self, steps: int = 1) -> None:
        """`steps` engine steps ran (the simulator runs several identical steps at once)."""
        self.steps += steps
        self.steps_in_frame += steps

    def steps_left(self) -> int | None:
        """Steps to the next frame boundary (at least 1); None without frames."""
        if not self.framed:
            return None
        return max(self.frame_steps - self.steps_in_frame, 1)

    # ------------------------------------------------------------------------------ planning
    def frame_due(self) -> bool:
        """A frame boundary: the first plan, then every `frame_steps` steps."""
        return self.framed and (not self._open or self.steps_in_frame >= self.frame_steps)

    def due(self, has_room: bool = True) -> PlanKind | None:
        """Which plan is due now, if any. An empty table is never planned (there is nothing to order;
        the boundary stays due until a request arrives). `has_room`: whether a batch slot is free
        (the simulator's; see the module docstring for why the engine always passes True)."""
        if len(self.table) == 0:
            return None
        if self.frame_due():
            return FULL
        if not self.dirty:
            return None
        if not self.framed:
            return FULL  # no frames to be light within: every plan is full
        if has_room or self.preempts_midframe:
            return LIGHT
        return None

    def plan(self, kind: PlanKind, speed: EngineSpeed) -> FramePlan:
        """Ask the policy for a plan of this kind. A framed FULL plan closes the frame before it and
        begins the next; a LIGHT plan keeps its preemptions only if the policy preempts mid-frame."""
        now = self.clock()
        boundary = kind == FULL and self.framed
        if boundary:
            self._close_frame(now)
        plan = self.policy.plan(self.table, now, speed)
        self.plans += 1
        if kind == LIGHT and not self.preempts_midframe:
            plan = replace(plan, preempt=plan.preempt[:0])  # Algorithm 1: preempt at frame boundaries
        if boundary:
            self._open = True
            self.frames += 1
            self.steps_in_frame = 0
            self._frame_start, self._frame_goodput = now, 0.0
            self._frame_plan = plan
            if self.close_with == "frame_plan":
                self._frame_ids = self.table.ids(plan.order)
        self.last_plan = plan
        self.dirty = False
        return plan

    def _close_frame(self, now: float) -> None:
        """End the frame that began at the last boundary: starvation aging and the tuner's reward."""
        if not self._open:
            return
        if self.close_with == "last_plan":
            assert self.last_plan is not None
            plan = self.last_plan
        else:
            assert self._frame_plan is not None
            t = self.table
            live = np.asarray([t.slot(r) for r in self._frame_ids if r in t], dtype=np.int64)
            plan = replace(self._frame_plan, order=live)
        elapsed = max(now - self._frame_start, MIN_FRAME_S)
        self.policy.end_frame(self.table, plan, self._frame_goodput / elapsed)
        self.frames_closed += 1
