"""What the simulator records per call: the call's own arrival and first token, and the sub-deadline
guard the router applies to a stage that starts late."""

from __future__ import annotations

import numpy as np
import pytest

from jitserve.scheduler.slo import SLO
from jitserve.sim.predictor import ConditionalBounds
from jitserve.sim.profiles import load_profile
from jitserve.sim.simulator import router_stage_guard, simulate
from jitserve.sim.workload import Call, Program, Stage


def _compound(tool_s: float) -> Program:
    slo = SLO.compound(stages=2, per_stage=300.0)
    stages = [Stage([Call(200, 40, 3.7)], tool_time_s=tool_s), Stage([Call(100, 30, 3.4)])]
    return Program(0, 0, slo, 5.0, stages, max_tokens=64, expected_stages=2)


def test_a_later_stage_records_its_own_arrival_and_every_call_its_first_token() -> None:
    out = simulate(
        [_compound(2.0)], "vllm-v1", load_profile("llama-3.1-8b-a100"), 1, ConditionalBounds(), 10.0
    )
    first, second = out.programs[0].records
    assert first.arrival == 5.0
    # released when the first stage finished plus its tool time, not at the program's arrival
    assert second.arrival == pytest.approx(first.finish + 2.0)
    for rec in (first, second):
        times = np.asarray(rec.token_times)
        assert times.size == rec.output_len
        # the first token comes after the prefill, well before the last of 30-40 decode steps
        assert rec.arrival < times[0] < rec.finish
        assert times[-1] == rec.finish


def test_a_late_stage_gets_an_even_share_of_what_is_left() -> None:
    prog = _compound(0.0)  # arrival 5, deadline 600: ends at 605
    # on time: the pattern graph's sub-deadline stands
    assert router_stage_guard(400.0, prog, 0, now=5.0) == 400.0
    # planned before the even split of the whole deadline (5 + 600 / 2): raised to it
    assert router_stage_guard(300.0, prog, 0, now=5.0) == pytest.approx(305.0)
    # stage 0 of 2 starting at 405: its planned 300 has passed; half of the 200 s left is its share
    assert router_stage_guard(300.0, prog, 0, now=405.0) == pytest.approx(505.0)
    # the last stage gets everything left, and never more than the program's deadline
    assert router_stage_guard(300.0, prog, 1, now=405.0) == pytest.approx(605.0)
    assert router_stage_guard(900.0, prog, 1, now=405.0) == pytest.approx(605.0)


def test_the_simulated_router_budgets_a_later_stages_wait_as_the_router_does() -> None:
    prog = _compound(0.0)  # arrival 5, deadline 600, two stages: ends at 605
    # one later stage waits 100 s for a slot: 500 s of work left of 600, stage 0's planned 300 s scaled so
    assert router_stage_guard(305.0, prog, 0, now=5.0, slot_wait_s=100.0) == pytest.approx(
        5.0 + 300.0 * 500 / 600
    )
    # the last stage waits for no stage after it
    assert router_stage_guard(305.0, prog, 1, now=405.0, slot_wait_s=100.0) == pytest.approx(605.0)
