"""Learning to Rank (Fu et al., 2024), as the JITServe paper runs it: an OPT-125M ranker predicts
the relative order of output lengths and the scheduler runs the shortest-ranked first (SJF
imitation), with preemption on re-ranking and starvation prevention.

The ranker is modelled by its published quality: scores whose Kendall tau with the true lengths is
0.6 (the paper reports 0.5-0.65 on LMSYS/ShareGPT). For log-normal lengths that is a score
log(L) + noise with noise sd = 0.73 x the log-length sd (tau = 2/pi * asin(rho), rho = 0.81).
Starvation prevention as in the paper: a request waiting longer than `starvation_s` is promoted
ahead of every ranked request (FCFS among promoted ones).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from jitserve.scheduler.gmax import EngineSpeed
from jitserve.scheduler.requests import RequestTable
from jitserve.sim.baselines.common import RankedPolicy
from jitserve.sim.policies import PolicySetup, SimContext

KENDALL_TAU = 0.6
LOG_LENGTH_SD = 1.0  # typical sd of log output length in the paper mix


@dataclass
class LTRPolicy(RankedPolicy):
    starvation_s: float = 10.0
    seed: int = 0
    _scores: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        rho = np.sin(np.pi * KENDALL_TAU / 2)
        self._noise_sd = LOG_LENGTH_SD * np.sqrt(1 / rho**2 - 1)
        self._rng = np.random.default_rng(self.seed + 17)

    def key(self, table: RequestTable, slots: np.ndarray, now: float, speed: EngineSpeed) -> np.ndarray:
        ids = table.ids(slots)
        scores = np.empty(slots.size)
        for i, (rid, s) in enumerate(zip(ids, slots.tolist(), strict=True)):
            score = self._scores.get(rid)
            if score is None:
                true = max(int(table.true_len[s]), 1)
                score = float(np.log(true) + self._rng.normal(0.0, self._noise_sd))
                self._scores[rid] = score
            scores[i] = score
        if len(self._scores) > 4 * max(slots.size, 1024):  # forget finished requests
            live = set(ids)
            self._scores = {k: v for k, v in self._scores.items() if k in live}
        starving = ~table.started[slots] & (now - table.arrival[slots] > self.starvation_s)
        # promoted requests first (by arrival), then the ranking
        return np.where(starving, -1e9 + table.arrival[slots], scores)


def setup(ctx: SimContext) -> PolicySetup:
    policy = LTRPolicy(name="ltr", batch_size=ctx.batch_size, preemptive=True, seed=ctx.seed)
    return PolicySetup(
        policy, engine={"chunked_prefill": True, "token_budget": ctx.sarathi_budget}, label="LTR"
    )
