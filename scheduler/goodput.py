"""Goodput accounting (JITServe §3, App. C): the one implementation every report uses.

Token-level goodput:
- latency: output token i (0-based) counts w_o if it finished by arrival + TTFT + i * TBT;
- deadline, best-effort: w_i * L_i + w_o * L_o if the response finished by the deadline, else 0;
- compound: the sum of all sub-requests' weighted tokens if the program finished by its deadline.

Request-level goodput counts requests that met their SLO (1 or 0). A latency request meets it when
every token is on its timeline; a dropped request never does.

Tempo's soft utility min(1, (SLO / x) ** alpha) is available as `soft_utility` for reports that
want partial credit for late requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from jitserve.scheduler.slo import SLO, SLOType


@dataclass(frozen=True, slots=True)
class Goodput:
    tokens: float  # token-level goodput (weighted tokens)
    met: bool  # request-level: the SLO was met

    @property
    def requests(self) -> int:
        return int(self.met)


@dataclass(slots=True)
class RequestRecord:
    """What happened to one request, in seconds since an arbitrary epoch."""

    slo: SLO
    arrival: float
    input_len: int
    token_times: Sequence[float] | np.ndarray = field(default_factory=list)  # finish time per token
    finish: float | None = None  # None while running or if dropped
    dropped: bool = False

    @property
    def output_len(self) -> int:
        return len(self.token_times)


def latency_on_time_tokens(token_times: np.ndarray, arrival: float, ttft: float, tbt: float) -> int:
    """Number of tokens finished by arrival + TTFT + i * TBT (token i is 0-based)."""
    times = np.asarray(token_times, dtype=np.float64)
    if times.size == 0:
        return 0
    due = arrival + ttft + np.arange(times.size, dtype=np.float64) * tbt
    return int(np.count_nonzero(times <= due + 1e-9))


def latency_met(on_time: int, output_len: int, finished: bool) -> bool:
    """A stream met its SLO: it finished, produced tokens, and every one of them was on its timeline."""
    return finished and output_len > 0 and on_time == output_len


def request_goodput(record: RequestRecord) -> Goodput:
    """Goodput of a single (non-compound) request; compound programs use `program_goodput`."""
    slo = record.slo
    if record.dropped:
        return Goodput(0.0, False)
    if slo.type is SLOType.LATENCY:
        tbt = slo.effective_tbt if slo.tbt is not None else 1e18
        on_time = latency_on_time_tokens(np.asarray(record.token_times), record.arrival, slo.ttft, tbt)
        met = latency_met(on_time, record.output_len, record.finish is not None)
        return Goodput(slo.weights.output * on_time, met)
    assert slo.deadline is not None
    finished_on_time = record.finish is not None and record.finish <= record.arrival + slo.deadline + 1e-9
    if not finished_on_time:
        return Goodput(0.0, False)
    tokens = slo.weights.input * record.input_len + slo.weights.output * record.output_len
    return Goodput(tokens, True)


def program_goodput(
    calls: Sequence[RequestRecord], program_arrival: float, deadline: float, program_finish: float | None
) -> Goodput:
    """Compound goodput: every call's weighted tokens if the whole program finished by the deadline."""
    if program_finish is None or any(c.dropped for c in calls):
        return Goodput(0.0, False)
    if program_finish > program_arrival + deadline + 1e-9:
        return Goodput(0.0, False)
    tokens = sum(c.slo.weights.input * c.input_len + c.slo.weights.output * c.output_len for c in calls)
    return Goodput(float(tokens), True)


def stage_stake(done: float, stage: int, stages_left: int, first_stage: float) -> float:
    """Program goodput riding on a compound stage, besides the stage's own tokens: what the program's
    finished calls earned plus what its later stages are expected to add.

    A program's goodput is all or nothing, so a stage that misses loses every stage's tokens, the
    later ones included (§3). `done`: weighted tokens of the finished calls; `stage`: 0-based;
    `stages_left`: stages still to run, this one included (the pattern graph's plan, or the client's
    hint); `first_stage`: what a stage is expected to earn before any has finished (the caller's
    weighted prompt tokens of this stage). Later stages are expected to earn what the finished ones
    did on average (docs/decisions/core.md, "A stage carries its program's stake").
    """
    per_stage = done / stage if stage > 0 else first_stage
    return done + max(stages_left - 1, 0) * per_stage


def max_goodput(slo: SLO, input_len: int, output_len: int) -> float:
    """Goodput the request would earn if served perfectly: the denominator of attainment."""
    if slo.type is SLOType.LATENCY:
        return slo.weights.output * output_len
    return slo.weights.input * input_len + slo.weights.output * output_len


def soft_utility(slo_seconds: float, observed_seconds: float, alpha: float = 1.0) -> float:
    """Tempo's utility min(1, (SLO / x) ** alpha): 1 when on time, decaying when late."""
    if observed_seconds <= 0:
        return 1.0
    return float(min(1.0, (slo_seconds / observed_seconds) ** alpha))
