"""Compound programs: calls sharing a program id form one program with one deadline D.

Each stage s (0-based) is sent with a sub-deadline D_s = arrival + phi(s) * D (JITServe §4.1), phi
from the analyzer's pattern graphs (`PatternStore.plan`): the program's partial graph (stages so far
plus the stage starting now) is matched against finished programs, and every program that ends is
added to the history. Without a match the store falls back to a uniform split over the client's
`program_stages` (if given) or the typical stage count. Two guards of the router's own:
- a stage never gets less than an even split of what is left of D (a stage that starts late must
  not inherit a sub-deadline that has already passed while the program as a whole can still finish);
- what is left of D is first cut by each later stage's expected wait for a slot on a just-in-time
  engine (the reserved delay its replicas report), so the stages before it finish early enough;
- a per-stage class with unknown stage count grows D by its per-stage budget at every new stage.

Stages: calls that start while another call of the program is still open run in parallel and share
its stage; a call that starts when none is open begins the next stage.

A program ends after `idle_timeout` without open calls; its compound goodput is then counted once.
Memory is bounded: at most `max_programs` programs (least recently used ended first), at most
`MAX_CALLS_KEPT` calls recorded per program.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from jitserve.scheduler.analyzer.patterns import PatternGraph, PatternNode, PatternStore, guard_late_stage
from jitserve.scheduler.goodput import Goodput, RequestRecord, program_goodput, stage_stake
from jitserve.scheduler.slo import SLO

MAX_CALLS_KEPT = 64


@dataclass(frozen=True, slots=True)
class StageDeadline:
    """What one call of a compound program is given: its stage and sub-deadline D_s (the core's
    `StagePlan` holds a whole program's phi and sub-deadlines)."""

    stage: int
    deadline_abs: float  # D_s, absolute (router clock)
    program_deadline_abs: float
    # program goodput riding on this stage besides its own tokens: earlier calls' and the later stages'
    # expected (`stage_stake`)
    program_goodput: float
    source: str  # "match" (pattern graph), "fallback" (uniform split) or "remaining" (no store)


@dataclass(frozen=True, slots=True)
class Call:
    stage: int
    model: str
    record: RequestRecord
    duration_s: float | None


@dataclass(eq=False)
class Program:
    program_id: str
    slo_class: str
    arrival: float
    # D, relative to arrival: kept as such because arrival + a tiny D rounds back to arrival (a valid
    # 1e-20 s deadline made D 0.0 by subtraction, which the pattern store rejects: a 500, found by fuzzing)
    budget: float
    per_stage: float | None  # per-stage budget when D grows with each stage
    stages_hint: int | None
    stage: int = -1  # current stage
    open_calls: int = 0
    last_seen: float = 0.0
    last_finish: float | None = None
    calls: list[Call] = field(default_factory=list)
    goodput_so_far: float = 0.0
    dropped: bool = False

    @property
    def deadline_abs(self) -> float:
        return self.arrival + self.budget

    def graph(self, extra: tuple[int, str, int] | None = None) -> PatternGraph:
        """The partial pattern graph: recorded calls, plus (stage, model, input_len) of one starting."""
        nodes = [
            PatternNode.llm(c.stage, c.model, c.record.input_len, c.record.output_len, c.duration_s)
            for c in self.calls
        ]
        if extra is not None:
            nodes.append(PatternNode.llm(extra[0], extra[1], extra[2], 0))
        stages = sorted({n.stage for n in nodes})
        renumber = {s: i for i, s in enumerate(stages)}  # stages whose calls were not kept leave gaps
        return PatternGraph(
            tuple(
                PatternNode.llm(renumber[n.stage], n.identity, n.input_len, n.output_len, n.duration_s)
                for n in nodes
            )
        )


class ProgramTracker:
    def __init__(
        self,
        max_programs: int = 10_000,
        idle_timeout: float = 60.0,
        store: PatternStore | None = None,
        on_finish: Callable[[Program, Goodput], None] | None = None,
    ) -> None:
        self.max_programs = max_programs
        self.idle_timeout = idle_timeout
        self.store = store
        self.on_finish = on_finish
        self._programs: OrderedDict[str, Program] = OrderedDict()
        self._next_sweep = float("-inf")

    def __len__(self) -> int:
        return len(self._programs)

    def get(self, program_id: str) -> Program | None:
        return self._programs.get(program_id)

    def begin_stage(
        self,
        program_id: str,
        slo_class: str,
        slo: SLO,
        now: float,
        stages_hint: int | None,
        per_stage: float | None,
        model: str = "",
        input_len: int = 0,
        slot_wait_s: float = 0.0,
    ) -> StageDeadline:
        """Register a new call of the program and return its stage and sub-deadline. `slot_wait_s`: how long
        a later stage is expected to wait for a slot once at stake (`guard_late_stage`)."""
        self.expire(now)
        prog = self._programs.get(program_id)
        if prog is None:
            assert slo.deadline is not None
            while len(self._programs) >= self.max_programs:
                self._finish(self._programs.popitem(last=False)[1], now)
            prog = Program(program_id, slo_class, now, slo.deadline, per_stage, stages_hint)
            self._programs[program_id] = prog
        else:
            self._programs.move_to_end(program_id)
            if stages_hint is not None:
                prog.stages_hint = stages_hint
        if prog.open_calls == 0:
            prog.stage += 1  # no call open: this call starts the next stage
        s = prog.stage
        prog.open_calls += 1
        prog.last_seen = now
        if prog.per_stage is not None and prog.stages_hint is None:
            prog.budget = max(prog.budget, prog.per_stage * (s + 1))
        total = prog.budget
        if self.store is not None:
            plan = self.store.plan(
                prog.graph((s, model or "llm", input_len)),
                completed_stages=min(s, len(prog.calls)),
                deadline=total,
                now=now,
                expected_stages=prog.stages_hint,
            )
            deadline, source = prog.arrival + plan.deadline_for_stage(s), plan.source
            n_left = max(plan.num_stages - s, 1)
        else:
            deadline, source = prog.deadline_abs, "remaining"
            n_left = 1
        if prog.stages_hint is not None:
            n_left = max(prog.stages_hint - s, 1)
        deadline = guard_late_stage(deadline, prog.deadline_abs, now, n_left, slot_wait_s)
        stake = stage_stake(prog.goodput_so_far, s, n_left, slo.weights.input * input_len)
        return StageDeadline(s, deadline, prog.deadline_abs, stake, source)

    def end_call(
        self, program_id: str, record: RequestRecord, model: str = "", started: float | None = None
    ) -> None:
        """A call finished (or was dropped): extend the partial pattern graph and the program goodput."""
        prog = self._programs.get(program_id)
        if prog is None:
            return
        prog.open_calls = max(prog.open_calls - 1, 0)
        if record.dropped or record.finish is None:
            prog.dropped = True
        else:
            prog.last_finish = max(prog.last_finish or record.finish, record.finish)
            w = record.slo.weights
            prog.goodput_so_far += w.input * record.input_len + w.output * record.output_len
        if len(prog.calls) < MAX_CALLS_KEPT:
            duration = None if record.finish is None or started is None else max(record.finish - started, 0.0)
            prog.calls.append(Call(max(prog.stage, 0), model or "llm", record, duration))

    def expire(self, now: float, force: bool = False) -> int:
        """End programs idle for `idle_timeout` with no call open; returns how many ended.

        A full sweep costs O(programs), so it runs at most once a second unless forced."""
        if not force and now < self._next_sweep:
            return 0
        self._next_sweep = now + 1.0
        ended = 0
        for pid in [
            p
            for p, prog in self._programs.items()
            if prog.open_calls == 0 and now - prog.last_seen >= self.idle_timeout
        ]:
            self._finish(self._programs.pop(pid), now)
            ended += 1
        return ended

    def _finish(self, prog: Program, now: float) -> None:
        if self.store is not None and prog.calls and not prog.dropped:
            self.store.add(prog.graph(), now=now)
        if self.on_finish is None:
            return
        finish = None if prog.dropped else prog.last_finish
        records = [c.record for c in prog.calls]
        g = program_goodput(records, prog.arrival, prog.budget, finish)
        self.on_finish(prog, g)
