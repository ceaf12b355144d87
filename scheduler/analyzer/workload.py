"""Synthetic request lengths and compound programs from the papers' application statistics.

Pure numpy, seeded. Each length is log-normal, fitted to the table's P50 and P95
(sigma = ln(P95 / P50) / 1.645); for the rows JITServe's Table 2 (thesis Table 6.1) publishes this
reproduces the published means within 10%. The two applications the paper does not tabulate
(agentic code generation, math reasoning) use our assumptions, marked below. Prompt and output
lengths are coupled by a Gaussian copula (rho = 0.35, our assumption: the papers publish no joint
statistics) so that the prompt carries some, but not much, information about the output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from jitserve.scheduler.analyzer.features import SLO_TYPE_CODE, IntArray
from jitserve.scheduler.analyzer.patterns import PatternGraph, PatternNode
from jitserve.scheduler.slo import SLOType

Z95 = 1.6448536269514722


@dataclass(frozen=True, slots=True)
class LogNormal:
    """A log-normal length given its median and 95th percentile."""

    p50: float
    p95: float

    @property
    def sigma(self) -> float:
        return math.log(self.p95 / self.p50) / Z95

    def from_normal(self, z: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        return np.exp(math.log(self.p50) + self.sigma * z)


@dataclass(frozen=True, slots=True)
class AppProfile:
    name: str
    model: str
    model_code: int
    prompt: LogNormal
    output: LogNormal
    max_tokens: int
    # shares of latency / deadline / best-effort among single requests (sum to 1)
    slo_shares: tuple[float, float, float]
    program_input: LogNormal  # whole compound program: summed over its LLM calls
    program_output: LogNormal


# Table 2 / Table 6.1 rows (P50, P95). SLO shares: the user study (Table 1 / 2.1), Real-Time ->
# latency, Direct Use -> deadline, Content-Based split evenly, minus 5% best-effort (our choice).
APPS: dict[str, AppProfile] = {
    "chatbot": AppProfile(
        name="chatbot",
        model="llama-3.1-8b",
        model_code=0,
        prompt=LogNormal(27, 391),
        output=LogNormal(225, 1024),
        max_tokens=2048,
        slo_shares=(0.65, 0.30, 0.05),  # not in the user study: chat streams, our assumption
        program_input=LogNormal(1097, 2767),
        program_output=LogNormal(4417, 6452),
    ),
    "deep_research": AppProfile(
        name="deep_research",
        model="qwen2.5-14b",
        model_code=1,
        prompt=LogNormal(403, 7573),
        output=LogNormal(410, 1544),
        max_tokens=4096,
        slo_shares=(0.43, 0.52, 0.05),
        program_input=LogNormal(10807, 29282),
        program_output=LogNormal(3148, 7525),
    ),
    # Not tabulated by the paper; our assumptions: code prompts carry context, answers are code.
    "agentic_codegen": AppProfile(
        name="agentic_codegen",
        model="qwen3-30b-a3b",
        model_code=2,
        prompt=LogNormal(600, 3000),
        output=LogNormal(350, 1400),
        max_tokens=4096,
        slo_shares=(0.51, 0.44, 0.05),
        program_input=LogNormal(4000, 12000),
        program_output=LogNormal(1500, 4000),
    ),
    # Not tabulated; our assumption after SLOs-Serve's reasoning row (prompt ~127, think ~4.7k).
    "math_reasoning": AppProfile(
        name="math_reasoning",
        model="llama-3.1-70b",
        model_code=3,
        prompt=LogNormal(130, 420),
        output=LogNormal(2500, 7000),
        max_tokens=8192,
        slo_shares=(0.38, 0.57, 0.05),
        program_input=LogNormal(2000, 6000),
        program_output=LogNormal(6000, 14000),
    ),
}
APP_NAMES: tuple[str, ...] = tuple(APPS)
PROMPT_OUTPUT_RHO = 0.35
USER_MAX_TOKENS = (256, 512, 1024, 2048)  # what a user who sets max_tokens picks from
USER_MAX_TOKENS_SHARE = 0.2


@dataclass(frozen=True, slots=True)
class RequestSample:
    """n single requests: app index (into APP_NAMES), serving-time features and the true length."""

    app: IntArray
    prompt_len: IntArray
    output_len: IntArray  # true output length, <= max_tokens
    slo_type: IntArray
    class_code: IntArray
    model_code: IntArray
    max_tokens: IntArray

    def __len__(self) -> int:
        return int(self.app.size)

    def take(self, index: npt.ArrayLike) -> RequestSample:
        idx = np.asarray(index)
        return RequestSample(*(getattr(self, n)[idx] for n in RequestSample.__slots__))


def sample_requests(
    n: int, seed: int, apps: tuple[str, ...] = APP_NAMES, app_weights: tuple[float, ...] | None = None
) -> RequestSample:
    """n single (non-compound) requests drawn from the given applications."""
    if n < 0:
        raise ValueError(f"n: must be >= 0, got {n}")
    unknown = [a for a in apps if a not in APPS]
    if unknown or not apps:
        raise ValueError(f"apps: unknown application(s) {unknown} (known: {', '.join(APP_NAMES)})")
    weights = np.full(len(apps), 1.0 / len(apps)) if app_weights is None else np.asarray(app_weights, float)
    if weights.shape != (len(apps),) or np.any(weights < 0) or weights.sum() <= 0:
        raise ValueError("app_weights: need one non-negative weight per app, not all zero")
    rng = np.random.default_rng(seed)
    which = rng.choice(len(apps), size=n, p=weights / weights.sum())
    z1, z2 = rng.standard_normal(n), rng.standard_normal(n)
    z_out = PROMPT_OUTPUT_RHO * z1 + math.sqrt(1 - PROMPT_OUTPUT_RHO**2) * z2
    cols = {k: np.zeros(n, dtype=np.int64) for k in RequestSample.__slots__}
    slo_codes = np.array(
        [SLO_TYPE_CODE[SLOType.LATENCY], SLO_TYPE_CODE[SLOType.DEADLINE], SLO_TYPE_CODE[SLOType.BEST_EFFORT]]
    )
    u_slo, u_cap, u_pick = rng.random(n), rng.random(n), rng.integers(len(USER_MAX_TOKENS), size=n)
    for i, name in enumerate(apps):
        m = which == i
        prof = APPS[name]
        cols["app"][m] = APP_NAMES.index(name)
        cols["prompt_len"][m] = np.clip(np.round(prof.prompt.from_normal(z1[m])), 1, 131_072)
        cap = np.where(
            u_cap[m] < USER_MAX_TOKENS_SHARE,
            np.minimum(np.asarray(USER_MAX_TOKENS)[u_pick[m]], prof.max_tokens),
            prof.max_tokens,
        )
        cols["max_tokens"][m] = cap
        cols["output_len"][m] = np.clip(np.round(prof.output.from_normal(z_out[m])), 1, cap)
        edges = np.cumsum(prof.slo_shares)
        cols["slo_type"][m] = slo_codes[np.minimum(np.searchsorted(edges, u_slo[m], side="right"), 2)]
        cols["model_code"][m] = prof.model_code
    cols["class_code"] = cols["slo_type"].copy()  # one SLO class per type, as the paper's classes
    return RequestSample(**cols)


def _split(total: float, parts: int, rng: np.random.Generator) -> npt.NDArray[np.int64]:
    """Split a program total across its calls (Dirichlet(2): uneven but rarely degenerate)."""
    shares = rng.dirichlet(np.full(parts, 2.0))
    return np.maximum(1, np.round(shares * total)).astype(np.int64)


def _tool_seconds(median: float, rng: np.random.Generator, size: int) -> npt.NDArray[np.float64]:
    return np.exp(math.log(median) + 0.6 * rng.standard_normal(size))


def sample_program(app: str, rng: np.random.Generator) -> PatternGraph:
    """One compound program of an application, stages joined by barriers (all-to-all edges).

    Shapes (our assumptions; the paper's Fig. 6 shows one five-stage example):
    - chatbot: 2-6 sequential LLM turns;
    - deep_research: plan, then 1-3 rounds of (1-3 parallel web searches, one read per result),
      then a final write;
    - agentic_codegen: write code, then 1-3 rounds of (run tests, fix);
    - math_reasoning: tree of thoughts, 2-4 levels of 2-3 parallel thoughts, then a vote.
    """
    if app not in APPS:
        raise ValueError(f"app: unknown application {app!r} (known: {', '.join(APP_NAMES)})")
    prof = APPS[app]
    # stages as lists of ("llm", model) or ("tool", name)
    stages: list[list[tuple[str, str]]]
    if app == "chatbot":
        stages = [[("llm", prof.model)] for _ in range(rng.integers(2, 7))]
    elif app == "deep_research":
        stages = [[("llm", prof.model)]]
        for _ in range(rng.integers(1, 4)):
            fan = int(rng.integers(1, 4))
            stages += [[("tool", "web_search")] * fan, [("llm", prof.model)] * fan]
        stages.append([("llm", prof.model)])
    elif app == "agentic_codegen":
        stages = [[("llm", prof.model)]]
        for _ in range(rng.integers(1, 4)):
            stages += [[("tool", "run_tests")], [("llm", prof.model)]]
    else:
        stages = [[("llm", prof.model)] * int(rng.integers(2, 4)) for _ in range(rng.integers(2, 5))]
        stages.append([("llm", prof.model)])
    n_llm = sum(kind == "llm" for stage in stages for kind, _ in stage)
    z1 = rng.standard_normal()
    z2 = PROMPT_OUTPUT_RHO * z1 + math.sqrt(1 - PROMPT_OUTPUT_RHO**2) * rng.standard_normal()
    inputs = _split(float(prof.program_input.from_normal(np.array([z1]))[0]), n_llm, rng)
    outputs = _split(float(prof.program_output.from_normal(np.array([z2]))[0]), n_llm, rng)
    tool_median = {"web_search": 1.5, "run_tests": 4.0}
    nodes: list[PatternNode] = []
    edges: list[tuple[int, int]] = []
    prev: list[int] = []
    k = 0
    for s, stage in enumerate(stages):
        current = []
        for kind, identity in stage:
            if kind == "llm":
                nodes.append(PatternNode.llm(s, identity, int(inputs[k]), int(outputs[k])))
                k += 1
            else:
                seconds = float(_tool_seconds(tool_median[identity], rng, 1)[0])
                nodes.append(PatternNode.tool(s, identity, seconds))
            current.append(len(nodes) - 1)
        edges += [(p, c) for p in prev for c in current]
        prev = current
    return PatternGraph(tuple(nodes), tuple(edges))


def sample_programs(n: int, seed: int, apps: tuple[str, ...] = APP_NAMES) -> list[PatternGraph]:
    """n compound programs, applications drawn uniformly."""
    if n < 0:
        raise ValueError(f"n: must be >= 0, got {n}")
    rng = np.random.default_rng(seed)
    return [sample_program(apps[int(rng.integers(len(apps)))], rng) for _ in range(n)]
