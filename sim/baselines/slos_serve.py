"""SLOs-Serve (Chen et al.), single replica, per seeds/slos-serve.txt §3-4:

- every request gets a prefill deadline and a decode TPOT: latency requests their TTFT and TBT;
  deadline and compound calls (E2EL only) a prefill deadline at 20% of their budget and the loosest
  of the paper's TPOT tiers (50 / 100 ms) that spreads the rest over the length bound;
- admission: on arrival, the admitted set must stay feasible: prefill work, in prefill-deadline
  order, must fit in the prefill budget the decodes leave, and the KV of prompts plus bounds must
  fit in memory. With unit values (the request-count objective) the paper's DP reduces to
  Moore-Hodgson on one resource, which is exact and what we run: insert in deadline order and, on
  a violation, decline the request with the most prefill work. Running requests are force-admitted;
- batch formation: the token budget of every step is time2bs(tightest running TPOT) (Algorithm 2's
  dynamic batch size), decodes first, prefill chunks in prefill-deadline (EDF) order;
- declined requests go to the best-effort tier: served with leftover slots, preempted by arrivals
  (KV dropped, tokens kept, one re-prefill on resume).
Re-planning happens on every arrival and completion (its "new requests" and "finished" triggers).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from jitserve.scheduler.gmax import EngineSpeed, FramePlan, expired
from jitserve.scheduler.requests import LATENCY, RequestTable
from jitserve.sim.policies import PolicySetup, SimContext
from jitserve.sim.profiles import BatchTimeModel

PREFILL_SHARE = 0.2
TPOT_TIERS = (0.05, 0.1)  # SLOs-Serve Table 3: tight and loose TPOT


@dataclass
class SLOsServePolicy:
    batch_size: int
    timing: BatchTimeModel
    kv_capacity: int
    name: str = "slos-serve"
    frame_steps: int = 1
    _admitted: set[str] = field(default_factory=set)
    _declined: set[str] = field(default_factory=set)

    def _slo(self, table: RequestTable, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(prefill deadline, TPOT) per slot."""
        lat = table.slo_type[slots] == LATENCY
        arrival = table.arrival[slots]
        budget = np.maximum(table.deadline_abs[slots] - arrival, 1e-3)
        ub = np.maximum(table.len_ub[slots], 1).astype(np.float64)
        pddl = np.where(lat, arrival + table.ttft[slots], arrival + PREFILL_SHARE * budget)
        # E2EL requests take the loosest of the paper's TPOT tiers (50 / 100 ms) that meets the deadline
        implied = (1 - PREFILL_SHARE) * budget / ub
        tier = np.where(implied >= TPOT_TIERS[1], TPOT_TIERS[1], TPOT_TIERS[0])
        tpot = np.where(lat, table.tbt[slots], tier)
        return pddl, tpot

    def token_budget(self, table: RequestTable, now: float, speed: EngineSpeed, ceiling: int) -> int:
        """Algorithm 2's dynamic batch size: the step the tightest running TPOT allows (the engine's
        configured `ceiling` plays no part in the paper's rule)."""
        slots = table.active_slots()
        run = slots[table.running[slots]]
        if run.size == 0:
            return 2048
        _pddl, tpot = self._slo(table, run)
        return max(self.timing.max_tokens_within(float(tpot.min()), ctx=1024.0), self.batch_size // 8, 64)

    def _admit(self, table: RequestTable, slots: np.ndarray, now: float, speed: EngineSpeed) -> None:
        ids = table.ids(slots)
        new = [i for i, rid in enumerate(ids) if rid not in self._admitted and rid not in self._declined]
        if not new:
            return
        keep = np.asarray(
            [rid in self._admitted or table.running[s] for rid, s in zip(ids, slots, strict=True)]
        )
        cand = np.flatnonzero(keep | np.isin(np.arange(slots.size), new))
        pddl, tpot = self._slo(table, slots[cand])
        order = cand[np.argsort(pddl, kind="stable")]
        pddl_sorted = np.sort(pddl, kind="stable")
        prefill_work = table.prefill_left(slots)
        decodes = int(table.running[slots].sum())
        step = max(self.timing.decode_step_time(max(decodes, 1), 1024.0), 1e-3)
        budget_tokens = self.timing.max_tokens_within(float(max(tpot.min(), step)), ctx=1024.0)
        prefill_rate = max(budget_tokens - decodes, 1) / step  # prefill tokens per second left
        kv_need = (table.input_len[slots] + table.len_ub[slots]).astype(np.float64)
        accepted: list[int] = []
        work = 0.0
        mem = 0.0
        forced = set(np.flatnonzero(keep).tolist())
        for pos, due in zip(order.tolist(), pddl_sorted.tolist(), strict=True):
            accepted.append(pos)
            work += prefill_work[pos]
            mem += kv_need[pos]
            while accepted and (now + work / prefill_rate > due or mem > self.kv_capacity):
                optional = [p for p in accepted if p not in forced]
                if not optional:
                    break
                worst = max(optional, key=lambda p: prefill_work[p])  # Moore-Hodgson
                accepted.remove(worst)
                work -= prefill_work[worst]
                mem -= kv_need[worst]
            # forced (running) requests stay even if the set is infeasible
        acc = set(accepted)
        for i in new:
            (self._admitted if i in acc else self._declined).add(ids[i])

    def plan(self, table: RequestTable, now: float, speed: EngineSpeed) -> FramePlan:
        slots = table.active_slots()
        if slots.size == 0:
            return FramePlan(slots, slots, slots, slots)
        self._admit(table, slots, now, speed)
        ids = table.ids(slots)
        live = set(ids)
        self._admitted &= live
        self._declined &= live
        standard = np.asarray([rid in self._admitted for rid in ids])
        pddl, _tpot = self._slo(table, slots)
        # standard tier by prefill deadline, then best effort FCFS
        key = np.where(standard, pddl, 1e12 + table.arrival[slots])
        order = slots[np.argsort(key, kind="stable")]
        running = order[table.running[order]]
        want = order[: self.batch_size]
        incoming = want[~table.running[want]]
        free = max(self.batch_size - running.size, 0)
        preempt = slots[:0]
        if incoming.size > free:
            std_in = incoming[np.isin(incoming, slots[standard])]
            be_running = running[~np.isin(running, slots[standard])][::-1]
            preempt = be_running[: max(std_in.size - free, 0)]
        kept = running[~np.isin(running, preempt)]
        room = max(self.batch_size - kept.size, 0)
        batch = np.concatenate([kept, order[~table.running[order]][:room]])
        return FramePlan(order=order, batch=batch, preempt=preempt, drop=expired(table, now, slots)[:0])

    def end_frame(self, table: RequestTable, plan: FramePlan, goodput_per_s: float | None = None) -> None:
        return None


def setup(ctx: SimContext) -> PolicySetup:
    policy = SLOsServePolicy(ctx.batch_size, ctx.timing, ctx.profile.kv_capacity)
    return PolicySetup(
        policy,
        engine={"chunked_prefill": True, "token_budget": ctx.sarathi_budget, "preemption": "recompute"},
        placement="round-robin",
        label="SLOs-Serve",
    )
