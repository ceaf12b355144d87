"""The frame driver (scheduler/frames.py): when a plan is due, which kind, and a frame's bookkeeping.

The engine and the simulator both drive their policy through it, so these tests pin its rules with a
scripted policy and a fake clock; no wall time is read anywhere (time.time & co. raise here).

Why not real parts: the driver is pure, and its contract is "time comes only from the injected
clock"; a scripted policy records what the driver asked of it, which a real GMAX would hide. The
real policies run through this driver in the simulator tests and the real-engine tests.
Monkeypatching `time` is the check, not a stand-in: any wall-clock read fails.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest
from conftest import deadline_request

from jitserve.scheduler.frames import FULL, LIGHT, FrameDriver
from jitserve.scheduler.gmax import EngineSpeed, FramePlan
from jitserve.scheduler.requests import RequestTable

SPEED = EngineSpeed()


class Recorder:
    """Test double of the `Policy` protocol: orders by slot, preempts every running request, and
    records what it is asked (plan times, end_frame orders and rewards)."""

    name = "recorder"

    def __init__(self, frame_steps: int = 3, preempts_midframe: bool = False) -> None:
        self.frame_steps = frame_steps
        self.preempts_midframe = preempts_midframe
        self.plan_times: list[float] = []
        self.ends: list[tuple[list[str], float | None]] = []

    def plan(self, table: RequestTable, now: float, speed: EngineSpeed) -> FramePlan:
        self.plan_times.append(now)
        slots = table.active_slots()
        return FramePlan(order=slots, batch=slots, preempt=slots[table.running[slots]], drop=slots[:0])

    def end_frame(self, table: RequestTable, plan: FramePlan, goodput_per_s: float | None = None) -> None:
        self.ends.append((table.ids(plan.order), goodput_per_s))


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def no_wall_time(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Any read of the wall or monotonic clock fails the test: time comes from the injected clock."""

    def forbidden() -> float:
        raise AssertionError("the frame driver read the wall clock")

    with monkeypatch.context() as m:
        for name in ("time", "monotonic", "perf_counter", "time_ns", "monotonic_ns"):
            m.setattr(time, name, forbidden)
        yield


def make(
    policy: Recorder, clock: Clock | None = None, **kw: object
) -> tuple[FrameDriver, RequestTable, Clock]:
    table = RequestTable(capacity=4)
    clock = clock or Clock()
    return FrameDriver(policy, table, clock, **kw), table, clock  # type: ignore[arg-type]


def plan_due(driver: FrameDriver) -> FramePlan:
    kind = driver.due()
    assert kind is not None
    return driver.plan(kind, SPEED)


def run(driver: FrameDriver, steps: int, has_room: bool = True) -> list[str | None]:
    """Engine style: each step counts, then asks; a due plan is made at once."""
    kinds: list[str | None] = []
    for _ in range(steps):
        driver.advance(1)
        kind = driver.due(has_room)
        if kind is not None:
            driver.plan(kind, SPEED)
        kinds.append(kind)
    return kinds


def test_full_plan_at_the_first_step_then_every_frame_steps_steps() -> None:
    d, table, _ = make(Recorder(frame_steps=3))
    table.add(deadline_request("a", 10.0))
    assert run(d, 10) == [FULL, None, None, FULL, None, None, FULL, None, None, FULL]
    assert (d.frames, d.frames_closed, d.plans, d.steps) == (4, 3, 4, 10)


def test_macro_steps_advance_several_steps_and_stop_at_the_boundary() -> None:
    d, table, _ = make(Recorder(frame_steps=5))
    table.add(deadline_request("a", 10.0))
    plan_due(d)
    assert d.steps_left() == 5
    d.advance(3)
    assert d.steps_left() == 2 and d.due() is None
    d.advance(2)
    assert d.steps_left() == 1 and d.due() == FULL  # at least one step to go: never zero
    d.advance(4)  # an adapter may overshoot; the boundary is still due
    assert d.due() == FULL


def test_an_event_makes_a_light_plan_between_boundaries() -> None:
    d, table, _ = make(Recorder(frame_steps=10))
    table.add(deadline_request("a", 10.0))
    assert run(d, 2) == [FULL, None]
    table.add(deadline_request("b", 10.0))
    d.mark_dirty()
    assert run(d, 3) == [LIGHT, None, None]  # once: the plan answers the event
    assert d.frames == 1 and d.plans == 2 and d.steps_in_frame == 4  # a light plan begins no frame
    assert d.last_plan is not None and table.ids(d.last_plan.order) == ["a", "b"]


def test_without_a_free_slot_only_a_midframe_preempting_policy_answers_events() -> None:
    d, table, _ = make(Recorder(frame_steps=10))
    table.add(deadline_request("a", 10.0))
    run(d, 1)
    d.mark_dirty()
    assert d.due(has_room=False) is None
    assert d.due(has_room=True) == LIGHT  # the event waits, not lost, until a slot frees
    d, table, _ = make(Recorder(frame_steps=10, preempts_midframe=True))
    table.add(deadline_request("a", 10.0))
    run(d, 1)
    d.mark_dirty()
    assert d.due(has_room=False) == LIGHT


@pytest.mark.parametrize("midframe", [False, True])
def test_light_plans_keep_preemptions_only_if_the_policy_preempts_midframe(midframe: bool) -> None:
    d, table, _ = make(Recorder(frame_steps=10, preempts_midframe=midframe))
    table.add(deadline_request("a", 10.0))
    table.set_running("a", True)
    full = plan_due(d)
    assert table.ids(full.preempt) == ["a"]  # a boundary plan's preemptions always stand
    d.mark_dirty()
    assert d.due() == LIGHT
    light = plan_due(d)
    assert table.ids(light.preempt) == (["a"] if midframe else [])
    assert d.last_plan is light and table.ids(light.order) == ["a"]


def test_a_boundary_closes_the_frame_with_its_goodput_per_second_on_the_injected_clock() -> None:
    policy = Recorder(frame_steps=2)
    d, table, clock = make(policy, Clock(10.0))
    table.add(deadline_request("a", 10.0))
    d.record(999.0)  # before any frame: not this frame's reward
    assert run(d, 1) == [FULL]
    assert policy.ends == [] and policy.plan_times == [10.0]  # the first plan closes nothing
    d.record(30.0)
    d.record(20.0)
    clock.now = 12.5
    assert run(d, 2) == [None, FULL]
    assert policy.ends == [(["a"], pytest.approx(50.0 / 2.5))]
    assert policy.plan_times == [10.0, 12.5]
    clock.now = 16.5  # nothing recorded in this frame: reward 0 over its 4 s
    run(d, 2)
    assert policy.ends[-1] == (["a"], 0.0) and d.frames_closed == 2


def test_a_frame_that_took_no_time_still_has_a_finite_reward() -> None:
    policy = Recorder(frame_steps=1)
    d, table, _ = make(policy)
    table.add(deadline_request("a", 10.0))
    run(d, 1)
    d.record(1.0)
    run(d, 1)
    reward = policy.ends[0][1]
    assert reward is not None and np.isfinite(reward) and reward > 0


def test_frame_plan_closing_ages_only_the_boundary_plans_requests_still_there() -> None:
    policy = Recorder(frame_steps=3)
    d, table, _ = make(policy, close_with="frame_plan")
    table.add(deadline_request("a", 10.0))
    table.add(deadline_request("b", 10.0))
    run(d, 1)
    table.remove("a")
    table.add(deadline_request("c", 10.0))  # takes a's slot mid-frame
    d.mark_dirty()
    run(d, 2)  # a light plan orders b and c
    assert run(d, 1) == [FULL]
    assert policy.ends[0][0] == ["b"]


def test_last_plan_closing_ages_the_latest_plans_order() -> None:
    policy = Recorder(frame_steps=3)
    d, table, _ = make(policy, close_with="last_plan")
    table.add(deadline_request("a", 10.0))
    run(d, 1)
    table.add(deadline_request("b", 10.0))
    d.mark_dirty()
    run(d, 2)
    assert run(d, 1) == [FULL]
    assert sorted(policy.ends[0][0]) == ["a", "b"]  # the light plan's order, with b


def test_unframed_plans_only_on_events_each_a_full_plan_without_frames() -> None:
    policy = Recorder(frame_steps=1)
    d, table, _ = make(policy, framed=False)
    table.add(deadline_request("a", 10.0))
    table.set_running("a", True)
    assert run(d, 3) == [None, None, None]  # no boundaries at all
    assert d.steps_left() is None
    d.mark_dirty()
    assert d.due(has_room=False) == FULL  # every event, free slot or not
    plan = d.plan(FULL, SPEED)
    assert table.ids(plan.preempt) == ["a"]
    assert policy.ends == [] and d.frames == 0 and d.plans == 1


def test_an_empty_table_is_never_planned() -> None:
    policy = Recorder(frame_steps=2)
    d, table, _ = make(policy)
    d.mark_dirty()
    assert run(d, 5) == [None] * 5  # the first boundary stays due until a request arrives
    table.add(deadline_request("a", 10.0))
    assert run(d, 1) == [FULL]
    table.remove("a")
    assert run(d, 4) == [None] * 4
    assert policy.plan_times == [100.0]


def test_frame_steps_is_the_policys_unless_given() -> None:
    assert make(Recorder(frame_steps=7))[0].frame_steps == 7
    assert make(Recorder(frame_steps=1), frame_steps=50)[0].frame_steps == 50
    with pytest.raises(ValueError, match="frame_steps"):
        make(Recorder(), frame_steps=0)
    with pytest.raises(ValueError, match="close_with"):
        make(Recorder(), close_with="first_plan")
