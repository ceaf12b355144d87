"""Compound programs: calls sharing a program id form one program with one deadline D.

Each call (stage s, 0-based) is sent with a sub-deadline D_s so that the engine schedules the stage
against its share of the program's budget, as in JITServe §4.1: D_s = arrival + phi(s) * D, where phi
is the cumulative share of the program's work done after stage s. phi comes from a matched pattern
graph when the analyzer provides one (`PhiEstimator`); without one the router falls back to:
- with `program_stages` n from the client: phi(s) = (s + 1) / n, but never less than an even split of
  what is left (a late stage does not inherit an already-passed sub-deadline);
- without it: the whole remaining program budget (phi = 1), the only bound that is never too tight.
A per-stage class with unknown stage count grows the program deadline by its per-stage budget each
stage. The partial pattern graph (the stages seen so far: prompt and output lengths) is kept per
program; programs end after `idle_timeout` without calls and their compound goodput is then counted.
Memory is bounded: at most `max_programs` programs (least recently used evicted first).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from jitserve.scheduler.goodput import Goodput, RequestRecord, program_goodput
from jitserve.scheduler.slo import SLO

MAX_STAGES_KEPT = 64  # stages of the partial pattern graph kept per program


class PhiEstimator(Protocol):
    def phi(self, stages: list[tuple[int, int]], stage: int) -> float | None:
        """Cumulative share of the program's work after `stage`, from a matched pattern graph."""
        ...


@dataclass(frozen=True, slots=True)
class StagePlan:
    stage: int
    deadline_abs: float  # D_s, absolute (router clock)
    program_deadline_abs: float
    program_goodput: float  # weighted tokens of earlier finished calls (rides on this stage)
    source: str  # "pattern-graph", "stages-hint" or "remaining-budget"


@dataclass(eq=False)
class Program:
    program_id: str
    slo_class: str
    arrival: float
    deadline_abs: float
    per_stage: float | None  # per-stage budget when the deadline grows with each stage
    stages_hint: int | None
    stages: int = 0
    open_calls: int = 0
    last_seen: float = 0.0
    last_finish: float | None = None
    calls: list[RequestRecord] = field(default_factory=list)
    shape: list[tuple[int, int]] = field(default_factory=list)  # partial pattern graph
    goodput_so_far: float = 0.0
    dropped: bool = False


class ProgramTracker:
    def __init__(
        self,
        max_programs: int = 10_000,
        idle_timeout: float = 60.0,
        phi: PhiEstimator | None = None,
        on_finish: Callable[[Program, Goodput], None] | None = None,
    ) -> None:
        self.max_programs = max_programs
        self.idle_timeout = idle_timeout
        self.phi = phi
        self.on_finish = on_finish
        self._programs: OrderedDict[str, Program] = OrderedDict()

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
    ) -> StagePlan:
        """Register a new call of the program and return its sub-deadline."""
        self.expire(now)
        prog = self._programs.get(program_id)
        if prog is None:
            assert slo.deadline is not None
            while len(self._programs) >= self.max_programs:
                self._finish(self._programs.popitem(last=False)[1])
            prog = Program(program_id, slo_class, now, now + slo.deadline, per_stage, stages_hint)
            self._programs[program_id] = prog
        else:
            self._programs.move_to_end(program_id)
            if stages_hint is not None:
                prog.stages_hint = stages_hint
        s = prog.stages
        prog.stages += 1
        prog.open_calls += 1
        prog.last_seen = now
        if prog.per_stage is not None and prog.stages_hint is None:
            prog.deadline_abs = max(prog.deadline_abs, prog.arrival + prog.per_stage * prog.stages)
        total = prog.deadline_abs - prog.arrival
        remaining = max(prog.deadline_abs - now, 0.0)
        phi = self.phi.phi(prog.shape, s) if self.phi is not None else None
        if phi is not None:
            deadline, source = prog.arrival + min(max(phi, 0.0), 1.0) * total, "pattern-graph"
        elif prog.stages_hint is not None and s < prog.stages_hint:
            n = prog.stages_hint
            even = now + remaining / (n - s)
            deadline, source = max(prog.arrival + (s + 1) / n * total, even), "stages-hint"
        else:
            deadline, source = prog.deadline_abs, "remaining-budget"
        return StagePlan(s, min(deadline, prog.deadline_abs), prog.deadline_abs, prog.goodput_so_far, source)

    def end_call(self, program_id: str, record: RequestRecord) -> None:
        """A call finished (or was dropped): extend the partial pattern graph and the program goodput."""
        prog = self._programs.get(program_id)
        if prog is None:
            return
        prog.open_calls = max(prog.open_calls - 1, 0)
        if record.dropped or record.finish is None:
            prog.dropped = True
        else:
            prog.last_finish = max(prog.last_finish or record.finish, record.finish)
            prog.goodput_so_far += record.slo.weights.input * record.input_len + (
                record.slo.weights.output * record.output_len
            )
        if len(prog.calls) < MAX_STAGES_KEPT:
            prog.calls.append(record)
            prog.shape.append((record.input_len, record.output_len))

    def expire(self, now: float) -> int:
        """End programs idle for `idle_timeout` with no call open; returns how many ended."""
        ended = 0
        while self._programs:
            prog = next(iter(self._programs.values()))
            if prog.open_calls > 0 or now - prog.last_seen < self.idle_timeout:
                break
            self._programs.popitem(last=False)
            self._finish(prog)
            ended += 1
        return ended

    def _finish(self, prog: Program) -> None:
        if self.on_finish is None:
            return
        finish = None if prog.dropped else prog.last_finish
        g = program_goodput(prog.calls, prog.arrival, prog.deadline_abs - prog.arrival, finish)
        self.on_finish(prog, g)
