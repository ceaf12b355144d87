"""Recent attainment per SLO type (scheduler/fairness.py): the Fair(r) GMAX's reservation mixes in."""

from __future__ import annotations

import numpy as np
import pytest

from jitserve.scheduler.fairness import TenantAttainment, TypeAttainment, counted_outcome
from jitserve.scheduler.requests import COMPOUND, DEADLINE, LATENCY


def test_fair_is_one_minus_recent_attainment_and_zero_without_evidence():
    att = TypeAttainment(window_s=60.0, buckets=12)
    for met in (True, False, False, False):
        att.record(LATENCY, met, now=1.0)
    att.record(DEADLINE, True, now=2.0)
    fair = att.fair(now=3.0)
    assert fair[LATENCY] == pytest.approx(0.75)
    assert fair[DEADLINE] == 0.0
    assert fair[2] == 0.0 and fair[3] == 0.0  # no outcome yet: no boost


def test_outcomes_leave_the_window_a_bucket_at_a_time():
    att = TypeAttainment(window_s=10.0, buckets=5)  # 2 s buckets
    att.record(LATENCY, False, now=0.5)
    att.record(LATENCY, True, now=9.0)
    assert att.counts(now=9.9)[1][LATENCY] == 2
    # at 10.5 the oldest bucket (0-2 s) has left the 10 s window: only the met one remains
    met, ended = att.counts(now=10.5)
    assert (met[LATENCY], ended[LATENCY]) == (1, 1)
    assert att.fair(now=10.5)[LATENCY] == 0.0
    assert np.all(att.fair(now=100.0) == 0.0)  # everything aged out


@pytest.mark.parametrize("bad", [-1, 4])
def test_unknown_type_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="slo_type"):
        TypeAttainment().record(bad, True, now=0.0)


@pytest.mark.parametrize("kwargs", [{"window_s": 0}, {"buckets": 0}])
def test_nonsense_windows_are_rejected(kwargs):
    with pytest.raises(ValueError):
        TypeAttainment(**kwargs)


def test_tenants_are_tracked_as_they_appear():
    """Tenant ids are handed out by the engine as API keys show up: the tracker sizes to the largest
    one seen, and a tenant without outcomes gets no boost."""
    att = TenantAttainment()
    assert att.fair(now=0.0).size == 0
    att.record(2, False, now=1.0)
    att.record(0, True, now=1.0)
    assert att.fair(now=2.0).tolist() == [0.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="tenant"):
        att.record(-1, True, now=2.0)


def test_a_compound_program_counts_once_by_its_last_stage_or_its_first_loss():
    inf = float("inf")
    # a stage with stages after it (sub-deadline D_s = 10 before the program's D = 30): no verdict yet,
    # on time for D_s or not, unless it did not finish: then its program is lost
    assert counted_outcome(COMPOUND, True, finished_at=9.0, stage_due=10.0, program_due=30.0) is None
    assert counted_outcome(COMPOUND, True, finished_at=12.0, stage_due=10.0, program_due=30.0) is None
    assert counted_outcome(COMPOUND, False, finished_at=None, stage_due=10.0, program_due=30.0) is False
    # the last stage (its deadline is the program's): the program's verdict
    assert counted_outcome(COMPOUND, True, finished_at=29.0, stage_due=30.0, program_due=30.0) is True
    assert counted_outcome(COMPOUND, False, finished_at=31.0, stage_due=30.0, program_due=30.0) is False
    assert counted_outcome(COMPOUND, True, finished_at=31.0, stage_due=30.0, program_due=30.0) is False
    # a call without a stage plan: its own deadline is its program's
    assert counted_outcome(COMPOUND, True, finished_at=5.0, stage_due=10.0, program_due=inf) is True
    # every other type: its own SLO's verdict alone
    assert counted_outcome(DEADLINE, True, finished_at=12.0, stage_due=10.0, program_due=inf) is True
    assert counted_outcome(LATENCY, False, finished_at=1.0, stage_due=10.0, program_due=inf) is False
