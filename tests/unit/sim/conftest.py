from __future__ import annotations

import numpy as np
import pytest

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
