"""Shared machinery of the ranked baselines: sort every active request by a key, run the best B.

Baselines plug a key (lower is better) and, if preemptive, a rule for which running requests may
be evicted for better-ranked waiting ones. They implement the scheduler core's `Policy` protocol,
so the engine drives them exactly like GMAX.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from jitserve.scheduler.gmax import EngineSpeed, FramePlan, expired
from jitserve.scheduler.requests import RequestTable


def program_of(table: RequestTable, slots: np.ndarray) -> list[str]:
    """Program id of each slot: the simulator names calls '<program>.<stage>.<call>'."""
    return [rid.split(".", 1)[0] for rid in table.ids(slots)]


@dataclass
class RankedPolicy:
    name: str
    batch_size: int
    frame_steps: int = 1
    preemptive: bool = False
    drop_expired: bool = False
    stats: dict[str, int] = field(default_factory=lambda: {"plans": 0})

    def key(self, table: RequestTable, slots: np.ndarray, now: float, speed: EngineSpeed) -> np.ndarray:
        raise NotImplementedError

    def may_evict(
        self, table: RequestTable, victims: np.ndarray, incoming: np.ndarray, now: float, speed: EngineSpeed
    ) -> np.ndarray:
        """Which of `victims` (worst first) to evict for `incoming` (best first); default: all pairs."""
        return victims[: incoming.size]

    def plan(self, table: RequestTable, now: float, speed: EngineSpeed) -> FramePlan:
        self.stats["plans"] += 1
        slots = table.active_slots()
        drop = expired(table, now, slots) if self.drop_expired else slots[:0]
        if drop.size:
            slots = np.setdiff1d(slots, drop, assume_unique=True)
        if slots.size == 0:
            return FramePlan(slots, slots, slots, drop)
        order = slots[np.argsort(self.key(table, slots, now, speed), kind="stable")]
        running_mask = table.running[order]
        running = order[running_mask]
        target = order[: self.batch_size]
        in_target = np.zeros(order.size, dtype=bool)
        in_target[: self.batch_size] = True
        incoming = target[~table.running[target]]
        free = max(self.batch_size - running.size, 0)
        preempt = slots[:0]
        if self.preemptive and incoming.size > free:
            victims = order[running_mask & ~in_target][::-1]  # worst-ranked first
            preempt = self.may_evict(table, victims, incoming[free:], now, speed)
        kept = running[~np.isin(running, preempt)]
        room = max(self.batch_size - kept.size, 0)
        batch = np.concatenate([kept, order[~running_mask][:room]])
        return FramePlan(order=order, batch=batch, preempt=preempt, drop=drop)

    def end_frame(self, table: RequestTable, plan: FramePlan, goodput_per_s: float | None = None) -> None:
        waiting = plan.order[table.active[plan.order] & ~table.running[plan.order]]
        if waiting.size:
            table.frames_waited[waiting] += 1
