"""Fixtures shared by the simulator's tests and `jitserve bench`'s (tests/unit/sim, tests/unit/local)."""

from __future__ import annotations

import pytest

from jitserve.sim.calibrate import Sample

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
