"""Goodput functions against hand-computed cases from the paper's definitions (§3, App. C)."""

import numpy as np
import pytest

from jitserve.scheduler.goodput import (
    RequestRecord,
    latency_on_time_tokens,
    max_goodput,
    program_goodput,
    request_goodput,
    soft_utility,
    stage_stake,
)
from jitserve.scheduler.slo import SLO, GoodputWeights


def test_latency_token_timeline():
    # TTFT 2 s, TBT 0.1 s, arrival 10: token i is due at 12 + 0.1 i.
    slo = SLO.latency(ttft=2.0, tbt=0.1)
    times = [11.5, 12.1, 12.3, 12.31, 12.5]  # due: 12.0, 12.1, 12.2, 12.3, 12.4
    rec = RequestRecord(slo=slo, arrival=10.0, input_len=50, token_times=times, finish=12.5)
    g = request_goodput(rec)
    assert g.tokens == 2  # tokens 0 and 1 are on time; 2, 3, 4 are late
    assert not g.met


def test_latency_all_on_time_meets_request_slo():
    slo = SLO.latency(ttft=1.0, tbt=0.5, weights=GoodputWeights(input=3, output=2))
    rec = RequestRecord(slo=slo, arrival=0.0, input_len=9, token_times=[1.0, 1.5, 1.9], finish=1.9)
    g = request_goodput(rec)
    assert g.tokens == 6  # w_o * 3; latency goodput does not count input tokens
    assert g.met


def test_latency_without_tbt_only_constrains_first_token():
    slo = SLO.latency(ttft=1.0, tbt=None)
    assert latency_on_time_tokens(np.array([0.9, 50.0, 99.0]), 0.0, 1.0, 1e18) == 3
    rec = RequestRecord(slo=slo, arrival=0.0, input_len=1, token_times=[1.2, 1.3], finish=1.3)
    assert request_goodput(rec).tokens == 1  # first token late, the rest have no due time


def test_deadline_all_or_nothing_counts_input_and_output():
    slo = SLO.deadline_slo(deadline=20.0, weights=GoodputWeights(input=1, output=2))
    on_time = RequestRecord(slo=slo, arrival=5.0, input_len=100, token_times=[0] * 40, finish=25.0)
    late = RequestRecord(slo=slo, arrival=5.0, input_len=100, token_times=[0] * 40, finish=25.01)
    assert request_goodput(on_time).tokens == 100 + 2 * 40
    assert request_goodput(late).tokens == 0
    assert not request_goodput(late).met


def test_dropped_request_earns_nothing():
    rec = RequestRecord(
        slo=SLO.latency(), arrival=0, input_len=5, token_times=[0.1], finish=0.1, dropped=True
    )
    assert request_goodput(rec).tokens == 0


def test_compound_program_all_or_nothing():
    slo = SLO.compound(stages=2, per_stage=10)
    calls = [
        RequestRecord(slo=slo, arrival=0, input_len=10, token_times=[1] * 5, finish=3),
        RequestRecord(slo=slo, arrival=4, input_len=20, token_times=[1] * 7, finish=15),
    ]
    assert program_goodput(calls, 0.0, 20.0, 15.0).tokens == 10 + 5 + 20 + 7
    assert program_goodput(calls, 0.0, 20.0, 20.5).tokens == 0
    assert program_goodput(calls, 0.0, 20.0, None).tokens == 0


def test_a_stage_carries_its_whole_programs_stake():
    """A compound stage that misses loses the program's every token, the later stages' included: its
    stake is what the finished calls earned plus, per stage still to come, their average (before any
    finished, the caller's estimate of a stage). The last stage carries the finished calls alone."""
    assert stage_stake(done=0.0, stage=0, stages_left=4, first_stage=10.0) == 3 * 10.0
    assert stage_stake(done=15.0, stage=1, stages_left=3, first_stage=99.0) == 15.0 + 2 * 15.0
    assert stage_stake(done=60.0, stage=2, stages_left=2, first_stage=99.0) == 60.0 + 30.0
    assert stage_stake(done=90.0, stage=3, stages_left=1, first_stage=99.0) == 90.0
    # a stage past the plan's count (more stages than expected) still carries what was earned
    assert stage_stake(done=90.0, stage=5, stages_left=-1, first_stage=99.0) == 90.0


def test_max_goodput_and_soft_utility():
    assert max_goodput(SLO.latency(), 100, 10) == 10
    assert max_goodput(SLO.deadline_slo(), 100, 10) == 110
    assert soft_utility(2.0, 1.0) == 1.0
    assert soft_utility(2.0, 4.0) == pytest.approx(0.5)
    assert soft_utility(2.0, 4.0, alpha=2) == pytest.approx(0.25)
