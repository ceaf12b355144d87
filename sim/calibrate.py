"""Calibrate a CPU engine profile against a running vLLM engine on this machine.

A CPU backend is not a roofline machine: its step time grows linearly with the tokens in the step,
plus the attention work, plus a fixed per-step cost (Python scheduling, sampling, the API server
sharing the cores). The probes measure exactly that on the live engine:

- prefill: one request with a P-token prompt and `max_tokens=1` on an idle engine; its time to first
  token is one prefill step (P < the 2048-token budget) plus the HTTP round trip;
- decode: n streams with equal C-token prompts generating together; the median gap between their
  tokens is one decode step of n sequences at context ~C.

and fit, by non-negative least squares,

    step = a + b * tokens + c * prefill_tokens + d * attention_pairs      (+ e per HTTP round trip)

with attention pairs counted as the batch-time model counts them (decode: the contexts' sum; a
prefill chunk: each token's prefix). The fit becomes a `Profile` on which the roofline reduces to
exactly that line: memory bandwidth effectively unlimited (the memory term never binds),
FLOP/s = 2 x params / b, `attention_flops_factor` so that one (query, key) pair costs d, the
per-prefill-token overhead c, the step overhead a.

Prompts are random token ids, so neither the prefix cache nor a tokenizer blurs the lengths.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from jitserve.sim.profiles import BatchTimeModel, Profile

PREFILL_LENGTHS = (16, 256, 512, 1024, 1536)
DECODE_BATCHES = (1, 4, 8)
DECODE_CONTEXTS = (32, 768)
DECODE_TOKENS = 72  # generated per decode stream; gaps after the first 8 tokens are measured
UNLIMITED_BANDWIDTH = 1e15  # bytes/s: the memory term of the roofline never binds


@dataclass(frozen=True)
class Sample:
    """One measured step: `n_dec` decodes at context `ctx` (mean), or one `n_pre`-token prefill."""

    kind: str  # "decode" | "prefill"
    n_dec: int
    ctx: float
    n_pre: int
    seconds: float
    spread: float = 0.0  # interquartile range of the repetitions

    @property
    def attention_pairs(self) -> float:
        return self.n_dec * self.ctx + self.n_pre * (self.n_pre + 1) / 2.0


@dataclass
class Calibration:
    """The samples, the fitted coefficients and how well they fit."""

    samples: list[Sample]
    overhead_s: float  # a
    per_token_s: float  # b
    per_prefill_token_s: float  # c
    per_pair_s: float  # d
    http_s: float  # e
    max_rel_error: float  # worst |fit - measured| / measured over the samples
    measured_at: float = field(default_factory=time.time)
    kv_capacity_tokens: int | None = None

    def predict(self, s: Sample) -> float:
        t = (
            self.overhead_s
            + self.per_token_s * (s.n_dec + s.n_pre)
            + self.per_prefill_token_s * s.n_pre
            + self.per_pair_s * s.attention_pairs
        )
        return t + (self.http_s if s.kind == "prefill" else 0.0)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Calibration:
        doc = dict(doc)
        doc["samples"] = [Sample(**s) for s in doc["samples"]]
        return cls(**doc)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=1))

    @classmethod
    def load(cls, path: Path) -> Calibration:
        return cls.from_json(json.loads(path.read_text()))

    def summary(self) -> str:
        return (
            f"step = {self.overhead_s * 1e3:.1f} ms + {self.per_token_s * 1e3:.2f} ms/token "
            f"+ {self.per_prefill_token_s * 1e3:.2f} ms/prefill token + {self.per_pair_s * 1e9:.2f} ns/pair; "
            f"decode of 8 at 512: {self.step(8, 512) * 1e3:.0f} ms, 512-token prefill: "
            f"{self.step(0, 0, 512) * 1e3:.0f} ms; worst fit error {self.max_rel_error:.0%}"
        )

    def step(self, n_dec: int, ctx: float, n_pre: int = 0) -> float:
        return self.predict(Sample("decode", n_dec, ctx, n_pre, 0.0))


def fit(samples: list[Sample]) -> Calibration:
    """Non-negative least squares on relative errors (every sample weighs the same)."""
    from scipy.optimize import nnls

    if not any(s.kind == "decode" for s in samples) or not any(s.kind == "prefill" for s in samples):
        raise ValueError("calibration: need both decode and prefill samples")
    rows, y = [], []
    for s in samples:
        row = [1.0, s.n_dec + s.n_pre, s.n_pre, s.attention_pairs, 1.0 if s.kind == "prefill" else 0.0]
        rows.append([v / s.seconds for v in row])
        y.append(1.0)
    coef, _ = nnls(np.asarray(rows), np.asarray(y))
    a, b, c, d, e = (float(v) for v in coef)
    if b <= 0:  # degenerate (a flat line): charge every token something
        b = 1e-6
    cal = Calibration(samples, a, b, c, d, e, 0.0)
    cal.max_rel_error = max(abs(cal.predict(s) - s.seconds) / s.seconds for s in samples)
    return cal


def to_profile(cal: Calibration, base: Profile, name: str | None = None) -> Profile:
    """`base` (model, KV, limits) with times from the calibration (see the module docstring)."""
    m = base.model
    flops = 2.0 * m.params / cal.per_token_s  # achieved FLOP/s
    attn_flops_per_pair = 4.0 * m.layers * m.hidden
    hw = base.hardware.model_copy(
        update={"peak_flops": flops / base.mfu, "mem_bandwidth": UNLIMITED_BANDWIDTH / base.mbu}
    )
    update: dict[str, Any] = {
        "name": name or base.name,
        "hardware": hw,
        "step_overhead_s": cal.overhead_s,
        "prefill_token_overhead_s": cal.per_prefill_token_s,
        "attention_flops_factor": max(cal.per_pair_s * flops / attn_flops_per_pair, 1e-9),
    }
    if cal.kv_capacity_tokens:
        update["kv_capacity_tokens"] = cal.kv_capacity_tokens
    return base.model_copy(update=update)


def check_profile(cal: Calibration, profile: Profile) -> float:
    """Worst relative gap between the profile's step times and the calibration's line (a self-test)."""
    t = BatchTimeModel.from_profile(profile)
    worst = 0.0
    for s in cal.samples:
        sim = t.step_time(
            np.full(s.n_dec, s.ctx),
            np.asarray([s.n_pre]) if s.n_pre else None,
            np.zeros(1) if s.n_pre else None,
        )
        line = cal.predict(s) - (cal.http_s if s.kind == "prefill" else 0.0)
        worst = max(worst, abs(sim - line) / line)
    return worst


# --------------------------------------------------------------------------------------------------
# probes (a live engine's OpenAI completions endpoint)


async def _stream(client: Any, url: str, model: str, prompt: list[int], max_tokens: int) -> list[float]:
    t0 = time.perf_counter()
    times: list[float] = []
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "temperature": 0.0,
        # probes are best-effort work that a JITServe engine must not drop (its per-request keys)
        "vllm_xargs": {"slo_class": "best-effort", "waiting_time": 3600},
    }
    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                times.append(time.perf_counter() - t0)
    return times


async def probe(
    url: str,
    model: str,
    max_num_seqs: int = 8,
    repeats: int = 3,
    progress: Any = None,
    seed: int = 0,
) -> list[Sample]:
    """Measure prefill and decode steps on the engine at `url` (its own port, no router)."""
    import httpx

    rng = random.Random(seed)

    def prompt(n: int) -> list[int]:
        return [rng.randrange(1000, 30000) for _ in range(n)]

    samples: list[Sample] = []
    async with httpx.AsyncClient(timeout=600.0) as client:
        await _stream(client, url, model, prompt(64), 8)  # warm-up
        for p in PREFILL_LENGTHS:
            ttft = []
            for _ in range(repeats):
                ttft.append((await _stream(client, url, model, prompt(p), 1))[0])
                if progress:
                    progress()
            q = np.percentile(ttft, [25, 50, 75])
            samples.append(Sample("prefill", 0, 0.0, p, float(q[1]), float(q[2] - q[0])))
        for ctx in DECODE_CONTEXTS:
            for n in DECODE_BATCHES:
                if n > max_num_seqs:
                    continue
                meds = []
                for _ in range(max(repeats - 1, 1)):
                    res = await asyncio.gather(
                        *(_stream(client, url, model, prompt(ctx), DECODE_TOKENS) for _ in range(n))
                    )
                    gaps = [b - a for t in res for a, b in zip(t[8:-1], t[9:], strict=True)]
                    meds.append(statistics.median(gaps))
                    if progress:
                        progress()
                mid = ctx + 8 + (DECODE_TOKENS - 8) / 2.0
                samples.append(Sample("decode", n, mid, 0, float(np.median(meds)), float(np.ptp(meds))))
    return samples


def probe_count(max_num_seqs: int = 8, repeats: int = 3) -> int:
    dec = sum(1 for n in DECODE_BATCHES if n <= max_num_seqs) * len(DECODE_CONTEXTS)
    return len(PREFILL_LENGTHS) * repeats + dec * max(repeats - 1, 1)


def calibrate_engine(
    url: str, model: str, max_num_seqs: int = 8, kv_capacity: int | None = None
) -> Calibration:
    """Probe and fit (with a progress bar)."""
    import sys

    from tqdm import tqdm

    quiet = not sys.stderr.isatty()  # a log file would fill with the bar's redraws
    total = probe_count(max_num_seqs)
    with tqdm(total=total, desc="calibrating", unit="probe", dynamic_ncols=True, disable=quiet) as bar:
        samples = asyncio.run(probe(url, model, max_num_seqs, progress=lambda: bar.update(1)))
    cal = fit(samples)
    cal.kv_capacity_tokens = kv_capacity
    return cal
