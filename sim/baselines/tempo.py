"""Tempo LSDF (largest service density first), per the Tempo paper (seeds/tempo.txt, Alg. 1):

- service gain with Tempo's soft utility f = min(1, (SLO / x)^alpha), alpha = 1, weights
  w_i : w_o = 1 : 2; latency requests: w_i L_i f(TTFT) + sum over remaining tokens of w_o f(TBT);
  throughput (deadline) and collective requests: (w_i L_i + w_o L_o) f(SLO_TTLT, est. TTLT);
- density = gain / remaining processing time (length upper bound x per-token time);
- collective (compound) calls use their stage budget (Tempo's graph matching: the simulator gives
  them the same analyzer sub-deadlines as JITServe);
- cost-aware preemption only at quanta of 20 decoding steps; 10% of the batch reserved for
  SLO-insensitive (best-effort) requests, served FCFS, backfilled when unused.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jitserve.scheduler.gmax import EngineSpeed, stall_seconds
from jitserve.scheduler.requests import BEST_EFFORT, LATENCY, RequestTable
from jitserve.sim.baselines.common import RankedPolicy
from jitserve.sim.policies import PolicySetup, SimContext

W_IN, W_OUT, ALPHA = 1.0, 2.0, 1.0


def _f(slo: np.ndarray, x: np.ndarray) -> np.ndarray:
    return np.minimum(1.0, (slo / np.maximum(x, 1e-9)) ** ALPHA)


@dataclass
class LSDFPolicy(RankedPolicy):
    reserve: float = 0.10

    def density(self, table: RequestTable, slots: np.ndarray, now: float, speed: EngineSpeed) -> np.ndarray:
        v = float(np.mean(speed.step_time))
        gen = table.generated[slots]
        ub = np.maximum(table.len_ub[slots], gen + 1)
        rem = (ub - gen).astype(np.float64)
        prefill = np.maximum(table.input_len[slots] + gen - table.computed[slots], 0) / float(
            np.mean(speed.prefill_tokens_per_s)
        )
        t_gen = rem * v + prefill + 1e-6
        elapsed = now - table.arrival[slots]
        inp = table.input_len[slots].astype(np.float64)
        lat = table.slo_type[slots] == LATENCY
        # latency: TTFT term only until the first token, then per-token TBT utility
        ttft_est = elapsed + prefill + v
        gain_lat = np.where(gen == 0, W_IN * inp * _f(table.ttft[slots], ttft_est), 0.0) + W_OUT * rem * _f(
            table.tbt[slots], np.full(slots.size, v)
        )
        # a late compound stage can arrive after its sub-deadline: its budget is 0 (no gain), never
        # negative (a negative gain made every density negative and every preemption look worth it,
        # docs/decisions/sim.md, "Preemption storms")
        ttlt_slo = np.maximum(table.deadline_abs[slots] - table.arrival[slots], 0.0)
        gain_thr = (W_IN * inp + W_OUT * ub) * _f(ttlt_slo, elapsed + t_gen)
        gain = np.where(lat, gain_lat, gain_thr)
        return gain / t_gen

    def key(self, table: RequestTable, slots: np.ndarray, now: float, speed: EngineSpeed) -> np.ndarray:
        d = self.density(table, slots, now, speed)
        be = table.slo_type[slots] == BEST_EFFORT
        key = -d
        if be.any():
            # the reserve: the first reserve*B best-effort requests (FCFS) rank with the best
            n_res = max(int(self.reserve * self.batch_size), 1)
            be_pos = np.flatnonzero(be)
            first = be_pos[np.argsort(table.arrival[slots][be_pos], kind="stable")][:n_res]
            key[first] = -np.inf
        return key

    def may_evict(
        self, table: RequestTable, victims: np.ndarray, incoming: np.ndarray, now: float, speed: EngineSpeed
    ) -> np.ndarray:
        pairs = min(victims.size, incoming.size)
        if pairs == 0:
            return victims[:0]
        d_in = self.density(table, incoming[:pairs], now, speed)
        d_out = self.density(table, victims[:pairs], now, speed)
        quantum_s = self.frame_steps * float(np.mean(speed.step_time))
        gain = (d_in - d_out) * quantum_s
        loss = stall_seconds(table, victims[:pairs], speed, "recompute") * d_out
        worth = gain > loss
        count = pairs if worth.all() else int(np.argmin(worth))
        return victims[:count]


def setup(ctx: SimContext) -> PolicySetup:
    policy = LSDFPolicy(name="tempo", batch_size=ctx.gmax_batch_size, frame_steps=20, preemptive=True)
    return PolicySetup(
        policy,
        engine={"chunked_prefill": True, "token_budget": ctx.sarathi_budget},
        deadlines="analyzer",
        label="Tempo (LSDF)",
    )
