"""QLM (Patke et al.), single-model form, per seeds/qlm.txt:

- request groups: requests of like SLO and output length (k-means over SLO value and token
  distribution; here the equivalent 2-d bucketing: SLO type x log2 of the length bound), groups larger
  than delta x the average batch are split (delta = 4);
- one virtual queue per engine: the plan orders groups by their most urgent member's deadline (the
  min-expected-slack solution when no model swaps exist), FCFS within a group. A request's deadline
  is fixed at arrival (TTFT for latency requests, the E2E deadline otherwise): ranking running latency
  requests by their next token's due time, which moves with every token, made a running group and a
  waiting one overtake each other again and again, each time with an eviction (~70 preemptions per
  replica-second on the bursty workload; docs/decisions/sim.md, "Preemption storms");
- the RCT estimator: waiting time = output tokens queued ahead / token throughput;
- request eviction: only when the estimator predicts that a head-group request would miss its SLO
  waiting, and meet it if started now, does the agent evict running requests of later groups (KV
  dropped, one re-prefill on restart). Evicting for a request that misses either way was a storm
  under overload (docs/decisions/sim.md, "Preemption storms").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jitserve.scheduler.gmax import EngineSpeed
from jitserve.scheduler.requests import LATENCY, RequestTable
from jitserve.sim.baselines.common import RankedPolicy
from jitserve.sim.policies import PolicySetup, SimContext

DELTA = 4


def fixed_due(table: RequestTable, slots: np.ndarray) -> np.ndarray:
    """A request's SLO deadline as set at arrival: arrival + TTFT (latency) or the E2E deadline."""
    lat = table.slo_type[slots] == LATENCY
    return np.where(lat, table.arrival[slots] + table.ttft[slots], table.deadline_abs[slots])


@dataclass
class QLMPolicy(RankedPolicy):
    def groups(self, table: RequestTable, slots: np.ndarray) -> np.ndarray:
        bucket = np.floor(np.log2(np.maximum(table.len_ub[slots], 1))).astype(np.int64)
        gid = table.slo_type[slots].astype(np.int64) * 64 + bucket
        # split groups bigger than delta x B, in arrival order
        cap = DELTA * self.batch_size
        order = np.lexsort((table.arrival[slots], gid))
        sub = np.zeros(slots.size, np.int64)
        g_sorted = gid[order]
        starts = np.r_[0, np.flatnonzero(np.diff(g_sorted)) + 1]
        rank = np.arange(slots.size) - np.repeat(starts, np.diff(np.r_[starts, slots.size]))
        sub[order] = rank // cap
        return gid * 1024 + sub

    def key(self, table: RequestTable, slots: np.ndarray, now: float, speed: EngineSpeed) -> np.ndarray:
        gid = self.groups(table, slots)
        due = fixed_due(table, slots)
        uniq, inv = np.unique(gid, return_inverse=True)
        group_due = np.full(uniq.size, np.inf)
        np.minimum.at(group_due, inv, due)
        g_rank = np.argsort(np.argsort(group_due, kind="stable"), kind="stable")[inv]
        return g_rank * 1e7 + (table.arrival[slots] - table.arrival[slots].min())

    def may_evict(
        self, table: RequestTable, victims: np.ndarray, incoming: np.ndarray, now: float, speed: EngineSpeed
    ) -> np.ndarray:
        # RCT: a head request starts when the first running request drains; evict only if then it
        # would miss its deadline and, started now, it would meet it (an eviction that saves nothing
        # only costs the victim a re-prefill)
        v = float(np.mean(speed.step_time))
        active = table.active_slots()
        running = active[table.running[active]]
        rem = np.maximum(table.len_ub[running] - table.generated[running], 0)
        wait = float(rem.min()) * v if rem.size else 0.0
        own = (table.len_ub[incoming] - table.generated[incoming]) * v
        due = fixed_due(table, incoming)
        n = int(((now + wait + own > due) & (now + own <= due)).sum())
        return victims[: min(n, victims.size)]


def setup(ctx: SimContext) -> PolicySetup:
    policy = QLMPolicy(name="qlm", batch_size=ctx.batch_size, preemptive=True)
    return PolicySetup(
        policy, engine={"chunked_prefill": True, "token_budget": ctx.sarathi_budget}, label="QLM"
    )
