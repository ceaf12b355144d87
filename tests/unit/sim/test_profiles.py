"""The roofline batch-time model against hand-computed steps."""

from __future__ import annotations

import numpy as np
import pytest

from jitserve.sim.profiles import BatchTimeModel, load_profile, profile_names


def _model(h: float = 0.0) -> BatchTimeModel:
    # 1e9 params, 1e12 FLOP/s, 1e11 B/s, 2e9 weight bytes, 1000 KV bytes/token, 3 ms overhead
    return BatchTimeModel(1e12, 1e11, 2e9, 1e9, 0.0, 1000.0, h, 0.003, 0.0)


def test_decode_step_is_memory_bound_by_hand() -> None:
    m = _model()
    ctx = np.array([1000.0, 3000.0])
    # bytes = 2e9 + 1000 * 4000 = 2.004e9 -> 20.04 ms; flops = 2e9 * 2 = 4e9 -> 4 ms
    assert m.step_time(ctx) == pytest.approx(0.003 + 2.004e9 / 1e11)


def test_prefill_step_is_compute_bound_by_hand() -> None:
    m = _model()
    # 2048 tokens: flops = 2e9 * 2048 = 4.096e12 -> 4.096 s; bytes ~2e9 -> 20 ms
    t = m.step_time(np.zeros(0), np.array([2048]), np.array([0]))
    assert t == pytest.approx(0.003 + 4.096)


def test_heterogeneity_charges_the_longest_context() -> None:
    flat, skew = _model(0.0), _model(1.0)
    ctx = np.array([100.0, 10_000.0])
    # h = 1: both sequences cost as much as the longest: 2 * 10,000 tokens of KV
    assert skew.step_time(ctx) == pytest.approx(0.003 + (2e9 + 1000 * 20_000) / 1e11)
    assert skew.step_time(ctx) > flat.step_time(ctx)
    same = np.array([5000.0, 5000.0])
    assert skew.step_time(same) == pytest.approx(flat.step_time(same))


def test_time2bs_is_the_inverse_of_step_time() -> None:
    m = _model()
    n = m.max_tokens_within(0.5, ctx=0.0)
    assert m.step_time(np.zeros(0), np.array([n]), np.array([0])) <= 0.5
    assert m.step_time(np.zeros(0), np.array([n + 1]), np.array([0])) > 0.5


@pytest.mark.parametrize("name", profile_names())
def test_shipped_profiles_load_and_fit_in_memory(name: str) -> None:
    p = load_profile(name)
    assert p.kv_capacity > 10_000
    t = BatchTimeModel.from_profile(p)
    assert 0 < t.decode_step_time(1, 512) < t.decode_step_time(64, 4096)


def test_cpu_profile_matches_the_measurements_on_this_machine() -> None:
    # design.md: a decode step of 8 sequences ~40-56 ms; a 512-token chunk adds ~250 ms
    t = BatchTimeModel.from_profile(load_profile("smollm2-135m-vllm-cpu"))
    decode = t.decode_step_time(8, 512)
    assert 0.035 <= decode <= 0.06
    with_chunk = t.step_time(np.full(8, 512.0), np.array([512]), np.array([0]))
    assert 0.2 <= with_chunk - decode <= 0.3
