"""The QRF output-length upper bound: coverage, tightening, fallbacks, the table, persistence."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jitserve.scheduler.analyzer.length import (
    LengthPredictor,
    LengthPredictorConfig,
    RequestFeatures,
    training_rows,
)
from jitserve.scheduler.analyzer.workload import RequestSample, sample_requests

# Fewer trees than the paper's 300 keep the suite quick; the bench measures the 300-tree forest.
TEST_CONFIG = LengthPredictorConfig(n_estimators=60, seed=7)


def _observe(p: LengthPredictor, s: RequestSample) -> None:
    p.observe_many(s.prompt_len, s.output_len, s.slo_type, s.class_code, s.model_code, s.max_tokens)


def _bounds(p: LengthPredictor, s: RequestSample, generated: int | np.ndarray) -> np.ndarray:
    return p.upper_bounds(s.prompt_len, generated, s.slo_type, s.class_code, s.model_code, s.max_tokens)


@pytest.fixture(scope="module")
def trained() -> LengthPredictor:
    p = LengthPredictor(TEST_CONFIG)
    _observe(p, sample_requests(3000, seed=1))
    assert p.fit()
    return p


@pytest.fixture(scope="module")
def held_out() -> RequestSample:
    return sample_requests(4000, seed=2)


def test_training_rows_every_refresh_below_the_length():
    f = RequestFeatures.of([10, 20, 30, 40], 0, 1, 1, 0, 4096)
    rows, targets = training_rows(f, np.array([1, 50, 51, 120]), refresh_tokens=50)
    assert rows.generated.tolist() == [0, 0, 0, 50, 0, 50, 100]
    assert targets.tolist() == [1, 50, 51, 51, 120, 120, 120]
    assert rows.prompt_len.tolist() == [10, 20, 30, 30, 40, 40, 40]


def test_untrained_bound_is_max_tokens():
    p = LengthPredictor(TEST_CONFIG)
    _observe(p, sample_requests(150, seed=3))  # below min_history_requests (200)
    assert not p.fit()
    assert not p.maybe_refit()
    s = sample_requests(100, seed=4)
    np.testing.assert_array_equal(_bounds(p, s, 0), s.max_tokens)
    assert p.upper_bound(100, 0, 1, 1, 0, 777) == 777


def test_coverage_near_the_configured_quantile(trained, held_out):
    s = held_out
    ub = _bounds(trained, s, 0)
    coverage = float(np.mean(ub >= s.output_len))
    assert 0.86 <= coverage <= 0.95, coverage
    # and not by returning max_tokens: the bound is informative on average
    assert np.mean(ub) < 0.6 * np.mean(s.max_tokens)


@pytest.mark.parametrize("generated", [100, 300, 1000])
def test_coverage_holds_conditionally_on_progress(trained, held_out, generated):
    alive = held_out.take(np.flatnonzero(held_out.output_len > generated))
    ub = _bounds(trained, alive, generated)
    coverage = float(np.mean(ub >= alive.output_len))
    assert 0.84 <= coverage <= 0.97, coverage


def test_bound_tightens_as_tokens_are_generated(trained, held_out):
    """Over-estimation (bound / true length) of the requests still running shrinks with progress."""
    ratios = []
    for generated in (0, 100, 300, 1000):
        alive = held_out.take(np.flatnonzero(held_out.output_len > generated))
        ratios.append(float(np.mean(_bounds(trained, alive, generated) / alive.output_len)))
    assert all(a >= b for a, b in zip(ratios, ratios[1:], strict=False)), ratios
    assert ratios[-1] < 0.8 * ratios[0], ratios


def test_table_equals_the_forest_inside_the_support(trained, held_out):
    s = held_out.take(np.arange(400))
    generated = np.random.default_rng(0).integers(0, s.output_len)
    fast = _bounds(trained, s, generated)
    exact = trained.upper_bounds_exact(
        s.prompt_len, generated, s.slo_type, s.class_code, s.model_code, s.max_tokens
    )
    np.testing.assert_array_equal(fast, exact)


def test_unseen_context_gets_max_tokens(trained):
    assert trained.upper_bound(100, 0, 1, 1, 99, 3000) == 3000  # model code 99 never seen


def test_more_progress_than_history_ever_saw_gets_max_tokens():
    """Past the longest request of its context, history says nothing: fall back to max_tokens."""
    rng = np.random.default_rng(0)
    p = LengthPredictor(LengthPredictorConfig(n_estimators=5, min_samples_leaf=5))
    n = 300
    p.observe_many(rng.integers(10, 100, n), rng.integers(1, 300, n), 1, 1, 0, 4096)
    assert p.fit()
    assert p.upper_bound(50, 0, 1, 1, 0, 4096) < 300  # inside the support: from the forest
    assert p.upper_bound(50, 1000, 1, 1, 0, 4096) == 4096  # a forest would say ~300 -> 1001


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prompt=st.integers(0, 200_000),
    generated=st.integers(0, 20_000),
    slo=st.integers(0, 3),
    cls=st.integers(0, 5),
    model=st.integers(0, 5),
    max_tokens=st.integers(1, 20_000),
)
def test_bound_always_within_generated_plus_one_and_max_tokens(
    trained, prompt, generated, slo, cls, model, max_tokens
):
    ub = trained.upper_bound(prompt, generated, slo, cls, model, max_tokens)
    assert min(generated + 1, max_tokens) <= ub <= max_tokens


def test_vectorized_matches_scalar(trained, held_out):
    s = held_out.take(np.arange(50))
    vec = _bounds(trained, s, 50)
    scalar = [
        trained.upper_bound(
            int(s.prompt_len[i]),
            50,
            int(s.slo_type[i]),
            int(s.class_code[i]),
            int(s.model_code[i]),
            int(s.max_tokens[i]),
        )
        for i in range(50)
    ]
    assert vec.tolist() == scalar


def test_save_load_round_trip_gives_identical_bounds(trained, held_out, tmp_path):
    path = tmp_path / "length.npz"
    trained.save(path)
    loaded = LengthPredictor.load(path)
    assert loaded.config == trained.config
    np.testing.assert_array_equal(loaded.history(), trained.history())
    for generated in (0, 150, 900):
        np.testing.assert_array_equal(
            _bounds(loaded, held_out, generated), _bounds(trained, held_out, generated)
        )
    with pytest.raises(RuntimeError, match="fit"):
        loaded.upper_bounds_exact(10, 0, 1, 1, 0, 100)


def test_load_rejects_other_formats(tmp_path):
    path = tmp_path / "bad.npz"
    np.savez(path, meta=np.array('{"format": 999}'), history=np.zeros((0, 6), dtype=np.int64))
    with pytest.raises(ValueError, match="format"):
        LengthPredictor.load(path)


def test_history_is_a_capped_ring_buffer():
    p = LengthPredictor(LengthPredictorConfig(history_requests_cap=100, min_history_requests=10))
    s = sample_requests(250, seed=5)
    for i in range(0, 250, 30):  # uneven batches wrap the ring more than once
        _observe(p, s.take(np.arange(i, min(i + 30, 250))))
    assert p.history_size == 100
    np.testing.assert_array_equal(p.history()[:, 0], s.prompt_len[-100:])
    np.testing.assert_array_equal(p.history()[:, 1], s.output_len[-100:])


def test_maybe_refit_waits_for_enough_new_requests():
    cfg = LengthPredictorConfig(n_estimators=5, min_history_requests=200, refit_every_requests=300)
    p = LengthPredictor(cfg)
    s = sample_requests(700, seed=6)
    _observe(p, s.take(np.arange(199)))
    assert not p.maybe_refit()
    _observe(p, s.take(np.arange(199, 200)))
    assert p.maybe_refit() and p.trained
    _observe(p, s.take(np.arange(200, 499)))
    assert not p.maybe_refit()
    _observe(p, s.take(np.arange(499, 500)))
    assert p.maybe_refit()


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("prompt_len", {"prompt_len": -1}),
        ("generated", {"generated": -5}),
        ("max_tokens", {"max_tokens": 0}),
        ("class_code", {"class_code": 70_000}),
        ("slo_type_code", {"slo_type_code": 1.5}),
    ],
)
def test_bad_input_names_the_field(field, kwargs):
    args = {
        "prompt_len": 10,
        "generated": 0,
        "slo_type_code": 1,
        "class_code": 1,
        "model_code": 0,
        "max_tokens": 100,
    } | kwargs
    with pytest.raises(ValueError, match=field):
        LengthPredictor(TEST_CONFIG).upper_bounds(**args)


def test_mismatched_lengths_are_rejected():
    p = LengthPredictor(TEST_CONFIG)
    with pytest.raises(ValueError, match="generated"):
        p.upper_bounds([1, 2, 3], [0, 0], 1, 1, 0, 100)
    with pytest.raises(ValueError, match="output_len"):
        p.observe_many([1, 2, 3], [5, 6], 1, 1, 0, 100)
    p.observe_many(10, [5, 6, 7], 1, 1, 0, 100)  # scalars broadcast
    assert p.history()[:, 1].tolist() == [5, 6, 7]


def test_config_validates_quantile():
    with pytest.raises(ValueError, match="quantile"):
        LengthPredictorConfig(quantile=0.4)
