"""Autellix PLAS (Luo et al., 2025), as the JITServe paper describes it: program-level least
attained service, an imitation of SJF for multi-call programs without length knowledge.

Each call inherits its program's attained service (tokens already produced by the program's
finished and running calls). Service is discretized into queues with exponentially growing
thresholds (a multi-level feedback queue: level = floor(log2(1 + service / quantum))), FCFS by
program arrival within a level. The scheduler is preemptive: at every quantum (`frame_steps`
steps) running calls whose program has climbed to a lower-priority level yield to waiting calls of
higher-priority levels. Anti-starvation: calls waiting longer than `starvation_s` move to the top
queue (level 0, FCFS by program arrival inside, as any MLFQ priority boost).
The wait counts from when the call last stopped running (arrival, or its last preemption), and a
promotion is an MLFQ priority boost: the program's service is counted from the boost on, so a promoted
call keeps the top level for a quantum of service once it runs. The earlier model put a starving call
above every level (-1) while it waited: it fell back to its old level the moment it ran and was
evicted at the next quantum by the next starving call, so with more than a batch of calls waiting
over `starvation_s` the whole batch was replaced every quantum, each time with a re-prefill (~50
preemptions per replica-second and no progress, bursty workload at twice saturation;
docs/decisions/sim.md, "Preemption storms").
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
    _last_ran: dict[str, float] = field(default_factory=dict)  # call -> last plan that saw it running
    _boost: dict[str, float] = field(default_factory=dict)  # program -> its service when last promoted

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
        running = table.running[slots]
        for rid, run in zip(ids, running.tolist(), strict=True):
            if run:
                self._last_ran[rid] = now
        since = np.asarray([self._last_ran.get(rid, float(a)) for rid, a in zip(ids, arrival, strict=True)])
        for rid in [r for r in self._last_ran if r not in live]:
            del self._last_ran[rid]
        starving = ~running & (now - since > self.starvation_s)
        for i in np.flatnonzero(starving).tolist():  # the boost: service counts from here on
            self._boost[progs[i]] = service[i]
        boost = np.asarray([self._boost.get(prog, 0.0) for prog in progs])
        level = np.floor(np.log2(1.0 + np.maximum(service - boost, 0.0) / self.quantum_tokens))
        level = np.where(starving, 0.0, level)  # the top queue, FCFS by program arrival inside
        span = max(now + 1.0, 1.0)
        return level * span * 4 + first  # level first, program arrival within a level


def setup(ctx: SimContext) -> PolicySetup:
    policy = PLASPolicy(name="autellix", batch_size=ctx.batch_size, frame_steps=50, preemptive=True)
    return PolicySetup(
        policy, engine={"chunked_prefill": True, "token_budget": ctx.sarathi_budget}, label="Autellix (PLAS)"
    )
