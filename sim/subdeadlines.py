"""Sub-deadlines of compound programs: D_s = phi(s) * D (JITServe §4.1).

- `analyzer`: the scheduler's pattern-graph store (`jitserve.scheduler.analyzer.patterns`), filled
  with the programs of a warm-up slice of the same workload; at every stage release the partial
  program (finished stages with their outputs, the new stage's inputs) is matched against it;
- `oracle`: phi from the program's own true stage times (JITServe*);
- `program`: no amortization, every call carries the program's deadline (the baselines).

Tools are not separate pattern nodes here: a stage's LLM nodes carry the duration of the tool call
that precedes them, so the store's stage indices are the program's LLM stages. Every stage release
re-matches the program; sub-deadlines are kept monotone across those re-matches.
"""

from __future__ import annotations

import math

import numpy as np

from jitserve.scheduler.slo import SLOType
from jitserve.sim.workload import Program, WorkloadSpec


def _tool_name(spec: WorkloadSpec, program: Program) -> str:
    return f"llm@{spec.applications[program.app].name}"


class SubDeadlines:
    def __init__(self, spec: WorkloadSpec, v_token: float, prefill_rate: float) -> None:
        self.spec = spec
        self.v_token = v_token
        self.prefill_rate = prefill_rate
        self.store = None
        self._last: dict[int, float] = {}  # program -> its previous stage's sub-deadline

    def stage_seconds(self, program: Program, upto: int | None = None) -> np.ndarray:
        out = []
        for s, stage in enumerate(program.stages[: upto if upto is not None else len(program.stages)]):
            llm = max(c.input_len / self.prefill_rate + c.output_len * self.v_token for c in stage.calls)
            tool = program.stages[s - 1].tool_time_s if s > 0 else 0.0
            out.append(llm + tool)
        return np.asarray(out)

    def _graph(self, program: Program, stages: int, with_outputs: int):  # type: ignore[no-untyped-def]
        from jitserve.scheduler.analyzer.patterns import PatternGraph, PatternNode

        name = _tool_name(self.spec, program)
        times = self.stage_seconds(program, stages)
        nodes = []
        for s in range(stages):
            done = s < with_outputs
            for c in program.stages[s].calls:
                nodes.append(
                    PatternNode.llm(
                        s, name, c.input_len, c.output_len if done else 0, float(times[s]) if done else None
                    )
                )
        return PatternGraph(tuple(nodes))

    def train(self, programs: list[Program], seed: int = 0) -> None:
        """Fill the pattern store with finished warm-up programs (up to its 500-graph capacity)."""
        from jitserve.scheduler.analyzer.patterns import PatternConfig, PatternStore

        store = PatternStore(PatternConfig(seed=seed), now=0.0)
        for p in programs:
            if p.slo_type is SLOType.COMPOUND:
                store.add(self._graph(p, len(p.stages), len(p.stages)), now=0.0)
        self.store = store

    def __call__(self, program: Program, stage: int, mode: str, v_token: float, prefill_rate: float) -> float:
        if program.slo.deadline is None:
            return math.inf
        d = program.slo.deadline
        if program.slo_type is not SLOType.COMPOUND or mode == "program":
            return program.arrival + d
        if mode == "oracle":
            times = self.stage_seconds(program)
            return program.arrival + float(times[: stage + 1].sum() / max(times.sum(), 1e-9)) * d
        if self.store is None:  # no analyzer: a uniform split over the app's typical stage count
            return program.arrival + min(1.0, (stage + 1) / max(program.expected_stages, 1.0)) * d
        partial = self._graph(program, stage + 1, stage)
        plan = self.store.plan(partial, stage, d, now=0.0, record_reuse=False)
        deadline = program.arrival + plan.deadline_for_stage(stage)
        # Each stage re-matches with more revealed; a new match may put this stage's deadline before
        # the previous stage's. A stage cannot be due before its predecessor: keep them monotone.
        if stage > 0:
            deadline = max(deadline, self._last.get(program.pid, deadline))
        if stage + 1 < len(program.stages):
            self._last[program.pid] = deadline
        else:
            self._last.pop(program.pid, None)
        return deadline
