"""Calibration of the CPU profile: the fit and its translation into a profile, by hand."""

from __future__ import annotations

import numpy as np
import pytest

from jitserve.sim.calibrate import Calibration, check_profile, fit, to_profile
from jitserve.sim.profiles import BatchTimeModel, load_profile


def test_fit_recovers_a_known_line(line: dict) -> None:
    A, B, C, D, E = (line[k] for k in "abcde")  # noqa: N806
    cal = fit(line["samples"])
    assert cal.overhead_s == pytest.approx(A, rel=1e-3)
    assert cal.per_token_s == pytest.approx(B, rel=1e-3)
    assert cal.per_prefill_token_s == pytest.approx(C, rel=1e-3)
    assert cal.per_pair_s == pytest.approx(D, rel=1e-3)
    assert cal.http_s == pytest.approx(E, rel=1e-2)
    assert cal.max_rel_error < 1e-3


def test_fit_needs_both_kinds_of_sample(line: dict) -> None:
    with pytest.raises(ValueError):
        fit([s for s in line["samples"] if s.kind == "decode"])


def test_profile_from_a_calibration_reproduces_its_step_times(line: dict) -> None:
    A, B, C, D = (line[k] for k in "abcd")  # noqa: N806
    cal = fit(line["samples"])
    cal.kv_capacity_tokens = 5760
    base = load_profile("smollm2-135m-vllm-cpu")
    prof = to_profile(cal, base, name="calibrated")
    assert prof.kv_capacity == 5760
    assert check_profile(cal, prof) < 1e-6
    t = BatchTimeModel.from_profile(prof)
    # by hand: 8 decodes at context 512 -> 20 + 32 + 8 * 512 * 50e-6 ms = 52.2 ms
    assert t.step_time(np.full(8, 512.0)) == pytest.approx(A + 8 * B + 8 * 512 * D, rel=1e-6)
    # a 512-token chunk on top: + 512 * 5 ms + the chunk's own attention pairs
    mixed = t.step_time(np.full(8, 512.0), np.asarray([512]), np.zeros(1))
    assert mixed == pytest.approx(A + 520 * B + 512 * C + D * (8 * 512 + 512 * 513 / 2), rel=1e-6)


def test_calibration_round_trips_through_json(line: dict, tmp_path) -> None:
    cal = fit(line["samples"])
    path = tmp_path / "cal.json"
    cal.save(path)
    again = Calibration.load(path)
    assert again.samples == cal.samples
    assert again.step(8, 512) == pytest.approx(cal.step(8, 512))
