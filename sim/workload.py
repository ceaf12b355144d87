"""Workloads: the YAML format (docs/workloads.md) and the arrivals and programs it generates.

A workload is a set of applications. Each request first draws its type from `mix` (the paper's
1:1:1 over latency, deadline, compound), then an application in proportion to
`app.weight * app.types[type]`. Single requests (latency, deadline) take one LLM call from the
application's `single` lengths; compound requests are programs of stages of parallel calls with
tool calls in between, their lengths drawn from the application's `compound` program totals.

Lengths are log-normal, fitted from (p50, p95) or (mean, std). Output length is correlated with the
prompt length by `length_correlation` (rho) in log space, which is what a prompt-feature length
predictor can learn: log L_out = mu + sigma * (rho * z_prompt + sqrt(1 - rho^2) * z_noise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from jitserve.scheduler.slo import SLO, SLOType

_Z95 = 1.6448536269514722


class LengthDist(BaseModel):
    """A log-normal length distribution, from (p50, p95) or (mean, std); the other pair is
    documentation of the source table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mean: float | None = Field(None, gt=0)
    std: float | None = Field(None, ge=0)
    p50: float | None = Field(None, gt=0)
    p95: float | None = Field(None, gt=0)
    min: int = Field(1, ge=1)
    max: int = Field(32768, ge=1)
    fit: Literal["quantiles", "moments"] = "quantiles"

    @model_validator(mode="after")
    def _check(self) -> LengthDist:
        if self.fit == "quantiles" and (self.p50 is None or self.p95 is None):
            raise ValueError("fit 'quantiles' needs p50 and p95")
        if self.fit == "moments" and (self.mean is None or self.std is None):
            raise ValueError("fit 'moments' needs mean and std")
        if self.p50 is not None and self.p95 is not None and self.p95 < self.p50:
            raise ValueError("p95 must be >= p50")
        return self

    @property
    def mu_sigma(self) -> tuple[float, float]:
        if self.fit == "quantiles":
            assert self.p50 is not None and self.p95 is not None
            return math.log(self.p50), max(math.log(self.p95 / self.p50) / _Z95, 1e-6)
        assert self.mean is not None and self.std is not None
        s2 = math.log(1.0 + (self.std / self.mean) ** 2)
        return math.log(self.mean) - s2 / 2.0, max(math.sqrt(s2), 1e-6)

    def from_normal(self, z: np.ndarray) -> np.ndarray:
        mu, sigma = self.mu_sigma
        return np.clip(np.rint(np.exp(mu + sigma * z)), self.min, self.max).astype(np.int64)


class IntRange(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    min: int = Field(ge=1)
    max: int = Field(ge=1)

    @model_validator(mode="after")
    def _check(self) -> IntRange:
        if self.max < self.min:
            raise ValueError("max must be >= min")
        return self


class CompoundShape(BaseModel):
    """A program: `stages` LLM stages; the first stage has `first_fanout` parallel calls, the last
    one call, every stage in between `fanout`; a tool call of `tool_time_s` seconds runs between
    consecutive stages. `input` and `output` are program totals (sum over calls), split across calls
    with Dirichlet shares."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stages: IntRange
    fanout: IntRange = IntRange(min=1, max=1)
    first_fanout: IntRange = IntRange(min=1, max=1)
    tool_time_s: LengthDist | None = None  # seconds, same log-normal fit (p50/p95)
    input: LengthDist
    output: LengthDist
    share_concentration: float = Field(4.0, gt=0, description="Dirichlet alpha of the per-call split")


class Application(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    weight: float = Field(1.0, ge=0)
    types: dict[SLOType, float] = Field(description="relative share of each request type in this app")
    single: tuple[LengthDist, LengthDist] | None = Field(None, description="(input, output) of one call")
    compound: CompoundShape | None = None
    max_tokens: int = Field(16384, ge=1, description="the request's max_tokens (bound of last resort)")

    @model_validator(mode="after")
    def _check(self) -> Application:
        singles = (SLOType.LATENCY, SLOType.DEADLINE, SLOType.BEST_EFFORT)
        needs_single = any(self.types.get(t, 0) > 0 for t in singles)
        if needs_single and self.single is None:
            raise ValueError(
                f"application {self.name}: latency/deadline/best-effort types need `single` lengths"
            )
        if self.types.get(SLOType.COMPOUND, 0) > 0 and self.compound is None:
            raise ValueError(f"application {self.name}: the compound type needs a `compound` shape")
        return self


class SLOSpec(BaseModel):
    """The SLO of each request type; compound deadlines are `per_stage` x LLM stages."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ttft: float = Field(2.0, gt=0)
    tbt: float = Field(0.1, gt=0)
    deadline: float = Field(20.0, gt=0)
    per_stage: float = Field(20.0, gt=0)
    waiting_time: float = Field(5.0, gt=0)
    best_effort_deadline: float = Field(
        300.0, gt=0, description="best-effort: its deadline, and how long it may wait (it never starves)"
    )
    scale: float = Field(1.0, gt=0, description="multiplies every SLO (the paper's SLO-scaling study)")

    def slo(self, slo_type: SLOType, stages: int = 1) -> SLO:
        s = self.scale
        if slo_type is SLOType.LATENCY:
            return SLO.latency(ttft=self.ttft * s, tbt=self.tbt * s, waiting_time=self.waiting_time)
        if slo_type is SLOType.DEADLINE:
            return SLO.deadline_slo(deadline=self.deadline * s, waiting_time=self.waiting_time)
        if slo_type is SLOType.COMPOUND:
            return SLO.compound(stages=stages, per_stage=self.per_stage * s, waiting_time=self.waiting_time)
        d = self.best_effort_deadline * s
        return SLO.best_effort(deadline=d, waiting_time=d)


class Arrivals(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    process: Literal["poisson", "gamma", "trace"] = "poisson"
    rate_per_replica: float = Field(0.5, gt=0, description="requests/s per replica (scaled by replicas)")
    cv: float = Field(1.0, gt=0, description="gamma: coefficient of variation of inter-arrival times")
    trace: str | None = Field(None, description="trace: file of arrival times in seconds, one a line")
    saturation_per_replica: float | None = Field(
        None,
        gt=0,
        description="requests/s per replica that vLLM FCFS sustains on this workload (measured: "
        "`python bench/sim.py --saturation NAME`); `--load X` runs at X times it",
    )


class WorkloadSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    seed: int = 0
    duration_s: float = Field(600.0, gt=0)
    replicas: int = Field(1, ge=1)
    profile: str = "llama-3.1-8b-a100"
    mix: dict[SLOType, float] = Field(description="request-type shares")
    slo: SLOSpec = SLOSpec()
    arrivals: Arrivals = Arrivals()
    length_correlation: float = Field(0.3, ge=0, lt=1, description="rho between log prompt and output")
    warmup_requests: int = Field(1000, ge=0, description="extra requests to train the length predictor")
    applications: list[Application]

    @model_validator(mode="after")
    def _check(self) -> WorkloadSpec:
        for t, share in self.mix.items():
            if share > 0 and not any(a.weight * a.types.get(t, 0) > 0 for a in self.applications):
                raise ValueError(f"mix: no application serves type {t.value}")
        if self.arrivals.process == "trace" and not self.arrivals.trace:
            raise ValueError("arrivals.trace: a trace file is needed for process 'trace'")
        return self


@dataclass(slots=True)
class Call:
    """One LLM invocation."""

    input_len: int
    output_len: int
    # feature code and the predictor's prior (what a length predictor can know before generation)
    prior_mu: float = 0.0
    prior_sigma: float = 1.0


@dataclass(slots=True)
class Stage:
    calls: list[Call]
    tool_time_s: float = 0.0  # tool call after this stage, before the next one


@dataclass(slots=True)
class Program:
    """A request: one call (latency, deadline) or a compound program."""

    pid: int
    app: int  # index into the spec's applications
    slo: SLO
    arrival: float
    stages: list[Stage]
    max_tokens: int = 16384
    expected_stages: float = 1.0  # the app's mean stage count (what history suggests)
    meta: dict[str, float] = field(default_factory=dict)

    @property
    def slo_type(self) -> SLOType:
        return self.slo.type

    @property
    def calls(self) -> list[Call]:
        return [c for s in self.stages for c in s.calls]


def load_workload(name_or_path: str) -> WorkloadSpec:
    """A shipped workload by name (`paper-mix`) or a YAML file path."""
    path = Path(name_or_path)
    if path.exists():
        text = path.read_text()
    else:
        res = resources.files("jitserve.sim").joinpath("workloads", f"{name_or_path}.yaml")
        if not res.is_file():
            raise ValueError(f"workload: no file or shipped workload named {name_or_path!r}")
        text = res.read_text()
    return WorkloadSpec.model_validate(yaml.safe_load(text))


def arrival_times(spec: WorkloadSpec, rate: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times in [0, duration) for a total rate (requests/s)."""
    a = spec.arrivals
    if a.process == "trace":
        assert a.trace is not None
        times = np.sort(np.loadtxt(a.trace, ndmin=1).astype(np.float64))
        times -= times[0]
        span = max(float(times[-1]), 1e-9)
        # rescale the trace to the requested mean rate over the duration
        n = max(int(round(rate * spec.duration_s)), 1)
        idx = np.linspace(0, times.size - 1, n).astype(np.int64) if times.size >= n else np.arange(times.size)
        return times[idx] / span * spec.duration_s
    n_max = int(rate * spec.duration_s * 1.5 + 50)
    if a.process == "poisson":
        gaps = rng.exponential(1.0 / rate, n_max)
    else:
        shape = 1.0 / a.cv**2
        gaps = rng.gamma(shape, 1.0 / (rate * shape), n_max)
    times = np.cumsum(gaps)
    while times[-1] < spec.duration_s:  # pragma: no cover - only for extreme cv
        times = np.concatenate([times, times[-1] + np.cumsum(rng.exponential(1.0 / rate, n_max))])
    return times[times < spec.duration_s]


def _correlated_normals(rng: np.random.Generator, n: int, rho: float) -> tuple[np.ndarray, np.ndarray]:
    z_in = rng.standard_normal(n)
    z_out = rho * z_in + math.sqrt(1.0 - rho * rho) * rng.standard_normal(n)
    return z_in, z_out


def _single_calls(app: Application, rho: float, rng: np.random.Generator, n: int) -> list[Call]:
    assert app.single is not None
    din, dout = app.single
    z_in, z_out = _correlated_normals(rng, n, rho)
    ins, outs = din.from_normal(z_in), dout.from_normal(z_out)
    mu, sigma = dout.mu_sigma
    prior_mu = mu + sigma * rho * z_in
    prior_sigma = sigma * math.sqrt(1 - rho * rho)
    outs = np.minimum(outs, app.max_tokens)
    return [
        Call(int(i), int(o), float(pm), prior_sigma) for i, o, pm in zip(ins, outs, prior_mu, strict=True)
    ]


def _program_stages(app: Application, rho: float, rng: np.random.Generator) -> list[Stage]:
    shape = app.compound
    assert shape is not None
    n_stages = int(rng.integers(shape.stages.min, shape.stages.max + 1))
    first = int(rng.integers(shape.first_fanout.min, shape.first_fanout.max + 1))
    fan = [first] + [
        int(rng.integers(shape.fanout.min, shape.fanout.max + 1)) for _ in range(max(n_stages - 2, 0))
    ]
    if n_stages > 1:
        fan.append(1)
    n_calls = sum(fan)
    z_in, z_out = _correlated_normals(rng, 1, rho)
    total_in = int(shape.input.from_normal(z_in)[0])
    total_out = int(shape.output.from_normal(z_out)[0])
    share_in = rng.dirichlet(np.full(n_calls, shape.share_concentration))
    share_out = rng.dirichlet(np.full(n_calls, shape.share_concentration))
    ins = np.maximum(np.rint(share_in * total_in), 1).astype(np.int64)
    outs = np.clip(np.rint(share_out * total_out), 1, app.max_tokens).astype(np.int64)
    # Per-call prior: the program-level prior scaled by the call's expected share (1/n_calls).
    mu, sigma = shape.output.mu_sigma
    prior_mu = mu + sigma * rho * float(z_in[0]) - math.log(n_calls)
    prior_sigma = math.sqrt(sigma * sigma * (1 - rho * rho) + 1.0 / (shape.share_concentration * n_calls))
    stages: list[Stage] = []
    k = 0
    for s, width in enumerate(fan):
        calls = [Call(int(ins[k + j]), int(outs[k + j]), prior_mu, prior_sigma) for j in range(width)]
        k += width
        tool = 0.0
        if shape.tool_time_s is not None and s < len(fan) - 1:
            tool = float(shape.tool_time_s.from_normal(rng.standard_normal(1)).astype(np.float64)[0])
        stages.append(Stage(calls, tool))
    return stages


def generate(
    spec: WorkloadSpec,
    rate: float | None = None,
    replicas: int | None = None,
    seed: int | None = None,
    duration_s: float | None = None,
    start_pid: int = 0,
) -> list[Program]:
    """The request stream: deterministic for (spec, rate, replicas, seed, duration)."""
    replicas = replicas or spec.replicas
    rate_total = (rate if rate is not None else spec.arrivals.rate_per_replica) * replicas
    if duration_s is not None:
        spec = spec.model_copy(update={"duration_s": duration_s})
    rng = np.random.default_rng(spec.seed if seed is None else seed)
    times = arrival_times(spec, rate_total, rng)
    types = [t for t, w in spec.mix.items() if w > 0]
    type_p = np.asarray([spec.mix[t] for t in types], dtype=np.float64)
    type_p /= type_p.sum()
    type_idx = rng.choice(len(types), size=times.size, p=type_p)
    apps = spec.applications
    programs: list[Program] = []
    rho = spec.length_correlation
    for i, (t, ti) in enumerate(zip(times, type_idx, strict=True)):
        slo_type = types[ti]
        w = np.asarray([a.weight * a.types.get(slo_type, 0.0) for a in apps])
        ai = int(rng.choice(len(apps), p=w / w.sum()))
        app = apps[ai]
        if slo_type is SLOType.COMPOUND:
            stages = _program_stages(app, rho, rng)
            assert app.compound is not None
            expected = (app.compound.stages.min + app.compound.stages.max) / 2.0
        else:
            stages = [Stage(_single_calls(app, rho, rng, 1))]
            expected = 1.0
        slo = spec.slo.slo(slo_type, stages=len(stages))
        programs.append(Program(start_pid + i, ai, slo, float(t), stages, app.max_tokens, expected))
    return programs
