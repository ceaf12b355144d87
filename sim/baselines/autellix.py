"""Autellix PLAS (Luo et al., 2025), as the JITServe paper describes it: program-level least
attained service, an imitation of SJF for multi-call programs without length knowledge.

Each call inherits its program's attained service (tokens already produced by the program's
finished and running calls). Service is discretized into queues with exponentially growing
thresholds (a multi-level feedback queue: level = floor(log2(1 + service / quantum))), FCFS by
program arrival within a level. The scheduler is preemptive: at every quantum (`frame_steps`
steps) running calls whose program has climbed to a lower-priority level yield to waiting calls of
higher-priority levels. Anti-starvation: calls waiting longer than `starvation_s` move to the top.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from jitserve.scheduler.gmax import EngineSpeed
from jitserve.scheduler.requests import RequestTable
from jitserve.sim.baselines.common import RankedPolicy, program_of
from jitserve.sim.policies import PolicySetup, SimContext


@dataclass
class PLASPolicy(RankedPolicy):
    quantum_tokens: float = 256.0
    starvation_s: float = 30.0
    _done: dict[str, float] = field(default_factory=dict)  # program -> service of finished calls
    _seen: dict[str, tuple[str, float]] = field(default_factory=dict)  # call -> (program, generated)
    _first: dict[str, float] = field(default_factory=dict)  # program -> first arrival

    def key(self, table: RequestTable, slots: np.ndarray, now: float, speed: EngineSpeed) -> np.ndarray:
        ids = table.ids(slots)
        progs = program_of(table, slots)
        live = set(ids)
        for rid in [r for r in self._seen if r not in live]:  # calls that left: bank their service
            prog, gen = self._seen.pop(rid)
            self._done[prog] = self._done.get(prog, 0.0) + gen
        gen = table.generated[slots].astype(np.float64)
        service_running: dict[str, float] = {}
        for rid, prog, g in zip(ids, progs, gen.tolist(), strict=True):
            self._seen[rid] = (prog, g)
            service_running[prog] = service_running.get(prog, 0.0) + g
        arrival = table.arrival[slots]
        service = np.empty(slots.size)
        first = np.empty(slots.size)
        for i, prog in enumerate(progs):
            service[i] = self._done.get(prog, 0.0) + service_running[prog]
            first[i] = self._first.setdefault(prog, float(arrival[i]))
        level = np.floor(np.log2(1.0 + service / self.quantum_tokens))
        starving = ~table.running[slots] & (now - arrival > self.starvation_s)
        level = np.where(starving, -1.0, level)
        span = max(now + 1.0, 1.0)
        return level * span * 4 + first  # level first, program arrival within a level


def setup(ctx: SimContext) -> PolicySetup:
    policy = PLASPolicy(name="autellix", batch_size=ctx.batch_size, frame_steps=50, preemptive=True)
    return PolicySetup(
        policy, engine={"chunked_prefill": True, "token_budget": ctx.sarathi_budget}, label="Autellix (PLAS)"
    )
