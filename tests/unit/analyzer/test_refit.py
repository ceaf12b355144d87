"""When the length predictor refits (`scheduler/analyzer/refit.py`): enough requests finished, and the
fits' CPU kept to a share of one core.

The fits here are real (`fit_saved`, a small forest) on `BackgroundRefit`'s own waiting thread, but in
this process rather than a child interpreter, and they report a fixed CPU cost, so the pacing they set is
known; the clock is a list the test moves (the pacing is about time, and a test must not wait minutes
for it). tests/unit/analyzer/test_fit_worker.py and the engine's and router's fit tests run the child.
"""

from __future__ import annotations

import time
from concurrent.futures import Executor
from pathlib import Path

import pytest

from jitserve.scheduler.analyzer.length import LengthPredictor, LengthPredictorConfig
from jitserve.scheduler.analyzer.refit import BackgroundRefit, RefitPacing, fit_saved

FIT_CPU_S = 20.0  # what each fit here reports having cost


def _fit_here(src: str, dst: str) -> tuple[bool, float]:
    return fit_saved(src, dst), FIT_CPU_S


def test_pacing_waits_the_last_fits_cpu_over_its_share_and_never_less_than_the_interval() -> None:
    pacing = RefitPacing(min_interval_s=60.0, cpu_share=0.01)
    assert pacing.wait_s(0.2) == 60.0  # a cheap fit: the interval
    assert pacing.wait_s(3.0) == pytest.approx(300.0)  # 3 s of CPU at 1% of a core
    with pytest.raises(ValueError, match="cpu_share"):
        RefitPacing(cpu_share=0.0)
    with pytest.raises(ValueError, match="min_interval_s"):
        RefitPacing(min_interval_s=-1.0)


def _wait_idle(refit: BackgroundRefit) -> None:
    deadline = time.monotonic() + 120  # not a timing: a 5-tree fit ends in well under a second
    while refit.fitting and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not refit.fitting


def test_a_refit_due_by_count_waits_for_its_pacing_and_the_first_fit_does_not() -> None:
    now = [1000.0]
    cfg = LengthPredictorConfig(
        n_estimators=5, min_samples_leaf=5, min_history_requests=20, refit_every_requests=10
    )
    pacing = RefitPacing(min_interval_s=30.0, cpu_share=0.5)
    fitted: list[int] = []
    refit = BackgroundRefit(
        LengthPredictor(cfg),
        pacing,
        on_fitted=lambda p: fitted.append(p.history_size),
        clock=lambda: now[0],
        fit=_fit_here,
    )
    try:
        for i in range(20):  # the 20th request makes the first fit due: it starts at once
            refit.observe(100 + i, 10 + i % 5, 0, 0, 0, 256)
        assert refit.fits_started == 1
        _wait_idle(refit)
        assert refit.predictor.trained and fitted == [20]
        assert refit.last_fit_cpu_s == FIT_CPU_S and refit.fit_cpu_s_total == FIT_CPU_S
        assert refit.next_fit_at() == pytest.approx(1000.0 + 40.0)  # 20 s of CPU at half a core

        now[0] = refit.next_fit_at() - 0.5
        for i in range(12):  # due by count (10 new), but too soon after the last fit
            refit.observe(200 + i, 40 + i % 5, 0, 0, 0, 256)
        assert refit.predictor.refit_due() and refit.fits_started == 1

        now[0] += 0.5  # the pacing's wait is over: the next finished request starts the fit
        refit.observe(300, 45, 0, 0, 0, 256)
        assert refit.fits_started == 2
        _wait_idle(refit)
        assert fitted == [20, 33]  # nothing observed meanwhile was lost
        assert refit.fits_finished == 2 and refit.fit_cpu_s_total == 2 * FIT_CPU_S
        assert refit.next_fit_at() == pytest.approx(now[0] + 40.0)
    finally:
        refit.close()


def test_a_refit_that_cannot_start_keeps_the_bounds_and_tries_again() -> None:
    cfg = LengthPredictorConfig(n_estimators=5, min_samples_leaf=5, min_history_requests=20)
    calls = [0]

    def broken() -> Executor:
        calls[0] += 1
        raise OSError("no threads left")

    refit = BackgroundRefit(LengthPredictor(cfg), executor=broken)
    for i in range(21):
        refit.observe(100 + i, 10, 0, 0, 0, 256)
    assert calls[0] == 2 and not refit.fitting and not refit.predictor.trained
    assert refit.predictor.history_size == 21


def test_a_fit_child_that_fails_says_why(tmp_path: Path) -> None:
    """A real child interpreter (`fit_in_child`) given no predictor file: the error carries its exit
    code and the last line it wrote, for the refit's log."""
    from jitserve.scheduler.analyzer.refit import fit_in_child

    with pytest.raises(RuntimeError, match=r"exited with 1: .*(No such file|FileNotFoundError)"):
        fit_in_child(str(tmp_path / "missing.npz"), str(tmp_path / "out.npz"))
