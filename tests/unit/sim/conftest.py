from __future__ import annotations

import numpy as np
import pytest

from jitserve.sim.calibrate import Sample
from jitserve.sim.profiles import BatchTimeModel


@pytest.fixture
def flat_timing() -> BatchTimeModel:
    """Every step costs 10 ms plus 1 ms per prefill token: easy to compute by hand."""
    return BatchTimeModel(
        flops_per_s=1e30,
        bytes_per_s=1e30,
        weight_bytes=0.0,
        params=1.0,
        attn_flops_per_ctx=0.0,
        kv_bytes_per_token=0.0,
        heterogeneity=0.0,
        overhead_s=0.01,
        prefill_token_overhead_s=0.001,
    )


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


LINE = {"a": 0.020, "b": 0.0005, "c": 0.0002, "d": 50e-9, "e": 0.003}


@pytest.fixture
def line() -> dict:
    """Step-time samples of a known line (20 ms per step, 0.5 ms per token, 0.2 ms more per prefill token,
    50 ns per attention pair, 3 ms per HTTP round trip): the coefficients and the samples."""
    a, b, c, d, e = LINE["a"], LINE["b"], LINE["c"], LINE["d"], LINE["e"]
    out = []
    for p in (16, 256, 512, 1024, 1536):
        s = Sample("prefill", 0, 0.0, p, 0.0)
        out.append(Sample("prefill", 0, 0.0, p, a + e + (b + c) * p + d * s.attention_pairs))
    for ctx in (72.0, 808.0):
        for n in (1, 4, 8):
            out.append(Sample("decode", n, ctx, 0, a + b * n + d * n * ctx))
    return {**LINE, "samples": out}
