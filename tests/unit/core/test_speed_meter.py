"""The engine speed GMAX plans with (`scheduler/speed.py`): one meter, fed real steps by the vLLM
adapter and simulated ones by the simulator."""

from __future__ import annotations

import pytest

from jitserve.scheduler.speed import SpeedMeter


def test_speed_meter_separates_decode_and_prefill() -> None:
    m = SpeedMeter()
    for _ in range(50):
        m.observe(0.040, decode_seqs=4, prefill_tokens=0)
    assert m.step_time == pytest.approx(0.040)
    for _ in range(50):
        m.observe(0.040 + 512 / 2000, decode_seqs=4, prefill_tokens=512)  # 512 prompt tokens at 2000/s
    assert m.prefill_tokens_per_s == pytest.approx(2000, rel=1e-6)
    m.observe(0.5, decode_seqs=4, prefill_tokens=3)  # a tiny prompt: admission overhead, not a rate sample
    assert m.prefill_tokens_per_s == pytest.approx(2000, rel=1e-6)


def test_speed_meter_step_time_is_what_a_running_request_waits() -> None:
    """v_token is the wall time of every decoding step, prompt work in it or not: running requests wait
    for those steps too. The old meter sampled decode-only steps and reported 40 ms here."""
    m = SpeedMeter()
    for _ in range(200):  # three steps in four admit a small prompt (about 10 ms more each)
        m.observe(0.040, decode_seqs=8, prefill_tokens=0)
        for _ in range(3):
            m.observe(0.050, decode_seqs=8, prefill_tokens=20)
    assert m.step_time == pytest.approx(0.0475, rel=0.02)  # the mean step, not the decode-only one
    assert m.decode_step_time == pytest.approx(0.040)
    m.observe(1.0, decode_seqs=0, prefill_tokens=512)  # nothing decoding: no one waited on this step
    assert m.step_time == pytest.approx(0.0475, rel=0.02)
    assert m.speed().step_time == m.step_time


@pytest.mark.parametrize("decode_seqs, prefill_tokens", [(8, 0), (8, 300), (0, 700)])
def test_a_run_of_identical_steps_counts_as_that_many_steps(decode_seqs: int, prefill_tokens: int) -> None:
    """The simulator advances k identical steps at once: the meter must end where k single steps end,
    or the simulated engine plans with another speed than the real one would."""
    one_by_one, at_once = SpeedMeter(), SpeedMeter()
    for m in (one_by_one, at_once):  # a history first, so the prior is not simply replaced
        for _ in range(5):
            m.observe(0.04, decode_seqs=8, prefill_tokens=0)
            m.observe(0.3, decode_seqs=8, prefill_tokens=400)
    for _ in range(37):
        one_by_one.observe(0.09, decode_seqs, prefill_tokens)
    at_once.observe(0.09, decode_seqs, prefill_tokens, steps=37)
    for name in ("step_time", "decode_step_time", "prefill_tokens_per_s", "step_samples", "prefill_samples"):
        assert getattr(at_once, name) == pytest.approx(getattr(one_by_one, name), rel=1e-9), name
