"""GMAX invariants (JITServe §4.2): feasibility, best window, starvation, preemption cost."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from conftest import deadline_request
from hypothesis import given, settings
from hypothesis import strategies as st

from jitserve.scheduler.gmax import (
    CutoffTuner,
    EngineSpeed,
    GMAXParams,
    analyze,
    end_frame,
    plan_frame,
    select_group,
)
from jitserve.scheduler.requests import NewRequest, RequestTable
from jitserve.scheduler.slo import SLO, GoodputWeights

SPEED = EngineSpeed(step_time=0.05, prefill_tokens_per_s=1e4)


def test_bandwidth_and_priority_by_hand(table):
    table.add(deadline_request("a", deadline=10.0, input_len=1000, ub=100))
    an = analyze(table, now=0.0, speed=SPEED, params=GMAXParams())
    t_gen = 100 * 0.05 + 1000 / 1e4  # decode + prefill = 5.1 s
    assert an.t_gen[0] == pytest.approx(t_gen)
    assert an.t_rem[0] == pytest.approx(10.0)
    assert an.bw[0] == pytest.approx(t_gen / 10.0)
    assert an.goodput[0] == pytest.approx(1100)  # w_i * L_i + w_o * L_o
    assert an.priority[0] == pytest.approx(1100 / t_gen)
    assert an.feasible[0]
    # 5 s later only 5 s remain for 5.1 s of work: infeasible
    assert not analyze(table, 5.0, SPEED, GMAXParams()).feasible[0]


def test_latency_goodput_counts_tokens_that_can_still_be_on_time(table):
    # arrival 0, TTFT 1 s, TBT 0.1 s, 20 tokens, step 0.05 s, no prefill left, nothing generated.
    table.add(NewRequest("l", SLO.latency(ttft=1.0, tbt=0.1), arrival=0.0, input_len=0, max_tokens=20))
    # now = 1.5: token j finishes at 1.5 + (j + 1) * 0.05, due at 1 + 0.1 j -> on time iff j >= 11
    an = analyze(table, 1.5, SPEED, GMAXParams())
    assert an.goodput[0] == pytest.approx(20 - 11)
    assert an.feasible[0]
    # at now = 0 every token is on time
    assert analyze(table, 0.0, SPEED, GMAXParams()).goodput[0] == pytest.approx(20)
    # far too late: token 19 is due at 2.9 s
    assert not analyze(table, 10.0, SPEED, GMAXParams()).feasible[0]


def _brute_force_best_window(priority, input_len, b, cutoff):
    n = len(priority)
    bp = np.sort(priority)[::-1][b - 1]
    cand = [i for i in range(n) if priority[i] >= bp * cutoff]
    cand.sort(key=lambda i: input_len[i])
    return max(sum(priority[cand[s : s + b]]) for s in range(len(cand) - b + 1))


@settings(max_examples=200, deadline=None)
@given(
    data=st.lists(st.tuples(st.floats(0.01, 100), st.integers(1, 5000)), min_size=1, max_size=40),
    b=st.integers(1, 12),
    cutoff=st.sampled_from([0.5, 0.8, 0.95, 1.0]),
)
def test_selected_group_is_the_best_window(data, b, cutoff):
    priority = np.array([p for p, _ in data])
    input_len = np.array([n for _, n in data])
    group = select_group(priority, input_len, b, cutoff)
    assert len(set(group.tolist())) == len(group) == min(b, len(data))
    if len(data) > b:
        assert priority[group].sum() == pytest.approx(
            _brute_force_best_window(priority, input_len, b, cutoff)
        )
        bp = np.sort(priority)[::-1][b - 1]
        assert (priority[group] >= bp * cutoff - 1e-12).all()


def test_group_prefers_homogeneous_lengths():
    # four equal-priority requests: two short, two long; B = 2 -> a same-length pair, not a mix
    priority = np.array([1.0, 1.0, 1.0, 1.0])
    input_len = np.array([10, 2000, 12, 2100])
    group = sorted(select_group(priority, input_len, 2, 0.95).tolist())
    assert group in ([0, 2], [1, 3])


@settings(max_examples=100, deadline=None)
@given(
    reqs=st.lists(
        st.tuples(st.floats(0.5, 60), st.integers(1, 3000), st.integers(1, 400)), min_size=1, max_size=30
    ),
    b=st.integers(1, 8),
    now=st.floats(0, 30),
)
def test_infeasible_never_ahead_of_feasible(reqs, b, now):
    table = RequestTable()
    for i, (deadline, input_len, ub) in enumerate(reqs):
        table.add(deadline_request(str(i), deadline, input_len, ub))
    plan = plan_frame(table, now, SPEED, GMAXParams(batch_size=b), drop_expired=False)
    an = analyze(table, now, SPEED, GMAXParams(batch_size=b), plan.order)
    feasible = an.feasible.tolist()
    # feasible requests come first in the queue order...
    assert feasible == sorted(feasible, reverse=True)
    # ...and an infeasible one only gets a batch slot when every feasible one already has one
    in_batch = set(plan.batch.tolist())
    if any(not f and s in in_batch for f, s in zip(feasible, plan.order.tolist(), strict=True)):
        assert all(s in in_batch for f, s in zip(feasible, plan.order.tolist(), strict=True) if f)


PAPER = GMAXParams(ranking="paper")


def _run_frames(delta: float, frames: int, ranking: str = "paper", be_deadline: float = 8e4) -> bool:
    """One old, low-priority best-effort request against a steady stream of short, valuable ones.
    Returns whether the old request ever got a batch slot."""
    table = RequestTable()
    table.add(
        NewRequest(
            "old",
            SLO.best_effort(deadline=be_deadline, waiting_time=8e4),
            arrival=0.0,
            input_len=10,
            max_tokens=500,
            len_ub=500,
        )
    )
    params = GMAXParams(batch_size=2, starvation_delta=delta, preemption="never", ranking=ranking)
    now, k = 0.0, 0
    for _ in range(frames):
        while len(table) < 4:  # keep three short requests queued
            table.add(deadline_request(f"s{k}", deadline=now + 1e4, input_len=500, ub=5, arrival=now))
            k += 1
        plan = plan_frame(table, now, SPEED, params)
        if table.slot("old") in plan.batch:
            return True
        for s in plan.batch:  # the batch runs to completion within the frame
            table.remove(table.id_of[int(s)])
        end_frame(table, plan)
        now += 2.5
    return False


def test_starvation_delta_eventually_schedules_every_request():
    # Algorithm 1's ranking: old: goodput 510 over t_gen 25 s; the shorts: 505 over 0.3 s. With
    # delta = 50 the old one overtakes after (505 / 0.3 * 25 - 510) / 50 ~ 831 frames.
    assert _run_frames(delta=50.0, frames=900)


def test_without_starvation_delta_the_old_request_starves():
    # the same stream with delta = 0: proves the previous test can fail
    assert not _run_frames(delta=0.0, frames=300)


def test_jit_best_effort_runs_once_its_default_deadline_nears():
    # Just in time, best-effort work takes only capacity no SLO needs, until its default deadline
    # (100 s here) comes within its service time plus a frame: then it competes by priority, and its
    # priority (510 / 25 s = 20) beats none of the shorts (1680): it needs the starvation term too.
    assert _run_frames(delta=50.0, frames=100, ranking="jit", be_deadline=100.0) is False
    assert _run_frames(delta=50.0, frames=900, ranking="jit", be_deadline=100.0)
    # with a default deadline far away it stays behind the SLO work all along
    assert not _run_frames(delta=50.0, frames=900, ranking="jit", be_deadline=8e4)


def _two_running_one_waiting(
    victim_input_len: int, incoming_deadline: float, keep_ub: int = 400, keep_deadline: float = 1000.0
):
    """`keep` and `victim` run; `urgent` waits. The victim's value is its output only, so a huge
    prompt makes it expensive to restore without making it valuable."""
    table = RequestTable()
    table.add(deadline_request("keep", keep_deadline, input_len=10, ub=keep_ub))
    output_only = SLO.deadline_slo(1000.0, waiting_time=1e4, weights=GoodputWeights(input=0, output=1))
    table.add(NewRequest("victim", output_only, arrival=0.0, input_len=victim_input_len, max_tokens=400))
    for rid in ("keep", "victim"):
        table.set_running(rid, True)
        table.progress(rid, generated=1, computed=table.input_len[table.slot(rid)] + 1)
    table.add(deadline_request("urgent", incoming_deadline, input_len=50, ub=20))
    return table


def test_preempts_when_gain_beats_stall():
    table = _two_running_one_waiting(victim_input_len=100, incoming_deadline=3.0)
    plan = plan_frame(table, 0.0, SPEED, GMAXParams(batch_size=2, ranking="paper"))
    assert table.ids(plan.preempt) == ["victim"]  # Algorithm 1: the least valuable one
    assert "urgent" in table.ids(plan.batch)
    # Just in time, both can wait a frame at no loss: the one cheaper to restore yields
    plan = plan_frame(table, 0.0, SPEED, GMAXParams(batch_size=2))
    assert table.ids(plan.preempt) == ["keep"]
    assert "urgent" in table.ids(plan.batch)


def test_paper_no_preemption_when_the_stall_costs_more():
    # restoring a 200k-token victim stalls the whole batch for 20 s: not worth one urgent request
    table = _two_running_one_waiting(victim_input_len=200_000, incoming_deadline=3.0)
    plan = plan_frame(table, 0.0, SPEED, GMAXParams(batch_size=2, ranking="paper"))
    assert plan.preempt.size == 0
    assert "urgent" not in table.ids(plan.batch)
    assert table.ids(plan.order)[0] == "urgent"  # it still heads the queue for the next free slot


def test_jit_no_preemption_when_the_stall_makes_the_batch_miss():
    # Just in time, a stall costs what it makes late. `keep` (20 s of work left, 21.5 s to its
    # deadline) cannot yield a frame, and the 20 s restore of `victim` would push it past its deadline:
    # that is worth more than the urgent request.
    table = _two_running_one_waiting(victim_input_len=200_000, incoming_deadline=3.0, keep_deadline=21.5)
    plan = plan_frame(table, 0.0, SPEED, GMAXParams(batch_size=2))
    assert plan.preempt.size == 0
    assert set(table.ids(plan.order[:2])) == {"keep", "urgent"}  # both reserved; keep runs on
    # with slack for the stall, `keep` loses nothing: the urgent request goes in
    table = _two_running_one_waiting(victim_input_len=200_000, incoming_deadline=3.0, keep_deadline=1000.0)
    plan = plan_frame(table, 0.0, SPEED, GMAXParams(batch_size=2))
    assert plan.preempt.size == 1 and "urgent" in table.ids(plan.batch)


def test_jit_waits_for_a_slot_that_frees_in_time_instead_of_preempting():
    # `keep` ends in 0.45 s; the urgent request (1 s of work, 3 s to its deadline) can wait for it.
    table = _two_running_one_waiting(victim_input_len=100, incoming_deadline=3.0, keep_ub=10)
    plan = plan_frame(table, 0.0, SPEED, GMAXParams(batch_size=2))
    assert plan.preempt.size == 0
    assert table.ids(plan.order)[0] == "urgent"
    # Algorithm 1 preempts anyway (its gain ignores that a slot frees within the frame)
    assert plan_frame(table, 0.0, SPEED, GMAXParams(batch_size=2, ranking="paper")).preempt.size == 1


@pytest.mark.parametrize("ranking", ["jit", "paper"])
def test_never_mode_and_free_slots_do_not_preempt(ranking):
    table = _two_running_one_waiting(victim_input_len=100, incoming_deadline=3.0)
    never = GMAXParams(batch_size=2, preemption="never", ranking=ranking)
    assert plan_frame(table, 0.0, SPEED, never).preempt.size == 0
    assert plan_frame(table, 0.0, SPEED, GMAXParams(batch_size=3, ranking=ranking)).preempt.size == 0


@pytest.mark.parametrize("ranking", ["jit", "paper"])
def test_swap_is_costed_by_bandwidth(ranking):
    slow_swap = EngineSpeed(step_time=0.05, prefill_tokens_per_s=1e4, swap_bytes_per_s=1e3)
    table = _two_running_one_waiting(victim_input_len=100, incoming_deadline=3.0)
    swap = GMAXParams(batch_size=2, preemption="swap", ranking=ranking)
    auto = GMAXParams(batch_size=2, preemption="auto", ranking=ranking)
    assert plan_frame(table, 0.0, slow_swap, swap).preempt.size == 0
    assert plan_frame(table, 0.0, slow_swap, auto).preempt.size == 1


def test_waiting_time_drops_only_unstarted_requests():
    table = RequestTable()
    stream = SLO.latency(ttft=20.0, tbt=None, waiting_time=1.0)
    table.add(NewRequest("w", stream, arrival=0.0, input_len=5, max_tokens=5))
    table.add(NewRequest("r", stream, arrival=0.0, input_len=5, max_tokens=5))
    table.set_running("r", True)
    plan = plan_frame(table, 2.0, SPEED, GMAXParams())
    assert table.ids(plan.drop) == ["w"]
    assert "w" not in table.ids(plan.order)


def test_unstarted_deadline_work_waits_for_its_deadline_not_its_waiting_time():
    """Dropped at its waiting_time while its deadline is still reachable, a compound stage would lose
    its whole program, and unstarted it holds no slot: deadline work is dropped unstarted once its
    deadline has passed, a compound stage once its program's has (not its sub-deadline D_s, which only
    paces the stages: `NewRequest.drop_at`; docs/decisions/core.md, "A stage waits for its program")."""
    table = RequestTable()
    table.add(NewRequest("d", SLO.deadline_slo(20, waiting_time=1.0), arrival=0.0, input_len=5, max_tokens=5))
    stage = NewRequest(
        "c",
        SLO.compound(2, waiting_time=1.0),
        arrival=0.0,
        input_len=5,
        max_tokens=5,
        deadline_abs=8.0,
        program_deadline_abs=14.0,
    )
    table.add(stage)
    assert stage.drop_at() == 14.0
    assert replace(stage, program_deadline_abs=None).drop_at() == 8.0  # no program known: its own D_s
    assert table.ids(plan_frame(table, 2.0, SPEED, GMAXParams()).drop) == []
    assert table.ids(plan_frame(table, 9.0, SPEED, GMAXParams()).drop) == []  # past D_s, program still on
    assert table.ids(plan_frame(table, 15.0, SPEED, GMAXParams()).drop) == ["c"]
    assert set(table.ids(plan_frame(table, 21.0, SPEED, GMAXParams()).drop)) == {"c", "d"}  # still unstarted


def test_a_stage_behind_its_sub_deadline_keeps_its_share_of_what_is_left_of_the_program():
    """D_s paces a program's stages; the program counts if it ends by D. A stage that can no longer meet
    D_s is judged against the share of what is left of D that D_s gave it when it arrived (here 8 of 16 s,
    a half), not against D itself, which would leave its later stages no time, and not against D_s,
    which ranked it with the infeasible until it was dropped at D (docs/decisions/core.md, "A late stage
    keeps its share of what is left"). A deadline request has no program: past its deadline it stays
    infeasible."""
    table = RequestTable()
    stage = NewRequest(
        "c", SLO.compound(2), arrival=2.0, input_len=0, max_tokens=40, len_ub=40,
        deadline_abs=10.0, program_deadline_abs=18.0,
    )  # fmt: skip
    table.add(stage)  # 40 tokens x 0.05 s = 2 s of work
    table.add(NewRequest("d", SLO.deadline_slo(8.0), arrival=2.0, input_len=0, max_tokens=40, len_ub=40))
    on_time = analyze(table, 4.0, SPEED, GMAXParams())
    assert on_time.t_rem[0] == pytest.approx(6.0) and on_time.feasible.all()  # D_s still reachable
    late = analyze(table, 9.0, SPEED, GMAXParams())  # 1 s to D_s, 2 s of work
    assert late.t_rem[0] == pytest.approx(0.5 * (18.0 - 9.0))
    assert late.feasible[0]
    assert not late.feasible[1]  # the deadline request: 1 s left of its 8 s, no program to lean on
    assert not analyze(table, 15.5, SPEED, GMAXParams()).feasible[0]  # a half of 2.5 s left: too late


def _two_tenants(fairness: float) -> RequestTable:
    """Tenant 0 has the densest and the second densest work; tenant 1's one request, the least dense,
    is in a class with this fairnessWeight."""
    table = RequestTable()
    for rid, tenant, ub in (("top", 0, 10), ("mid", 0, 30), ("low", 1, 50)):
        slo = SLO(type="deadline", deadline=100, fairness=fairness if tenant else 0.0)
        table.add(NewRequest(rid, slo, arrival=0, input_len=100, max_tokens=ub, tenant=tenant))
    return table


@pytest.mark.parametrize("ranking", ["jit", "paper"])
def test_fairness_term_lifts_the_underserved_tenant_by_its_class_weight(ranking):
    """Algorithm 1's (1-f) x priority / max + f x Fair(r), f = the request's class's fairnessWeight: a
    weighted request of a tenant the engine has been failing overtakes denser work of unweighted classes
    (the densest keeps its place: its normalized priority is 1, which no mix exceeds)."""
    two = GMAXParams(batch_size=2, ranking=ranking)
    fair = np.array([0.0, 1.0])  # tenant 1 has met nothing lately
    table = _two_tenants(fairness=0.9)
    assert sorted(table.ids(plan_frame(table, 0, SPEED, two).batch)) == ["mid", "top"]  # no attainment known
    assert sorted(table.ids(plan_frame(table, 0, SPEED, two, tenant_fair=fair).batch)) == ["low", "top"]
    # a class without a weight ignores the tenants' attainment; so does a tenant with no outcome yet
    unweighted = _two_tenants(fairness=0.0)
    assert sorted(unweighted.ids(plan_frame(unweighted, 0, SPEED, two, tenant_fair=fair).batch)) == [
        "mid",
        "top",
    ]
    no_news = np.array([0.0])
    assert sorted(table.ids(plan_frame(table, 0, SPEED, two, tenant_fair=no_news).batch)) == ["mid", "top"]


def test_cutoff_tuner_converges_to_the_best_arm():
    tuner = CutoffTuner(epsilon=0.05, seed=1)
    reward = {0.8: 1.0, 0.85: 2.0, 0.9: 5.0, 0.95: 3.0, 1.0: 0.5}
    picks = [tuner.cutoff]
    for _ in range(200):
        picks.append(tuner.record(reward[tuner.cutoff]))
    assert max(set(picks[-100:]), key=picks[-100:].count) == 0.9


@pytest.mark.parametrize(
    "bad", [{"batch_size": 0}, {"cutoff": 0}, {"cutoff": 1.5}, {"class_fairness": 2}, {"preemption": "x"}]
)
def test_params_reject_nonsense(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        GMAXParams(**bad)


def test_the_shortest_reply_is_what_vllm_can_end_a_request_with():
    from jitserve.scheduler.requests import shortest_reply

    assert shortest_reply(40) == 1  # any token may be EOS
    assert shortest_reply(40, min_tokens=12) == 12  # min_tokens holds off every stop
    assert shortest_reply(40, min_tokens=0, ignore_eos=True) == 40  # only max_tokens ends it
    assert shortest_reply(40, min_tokens=5, ignore_eos=True, stops=True) == 5  # its own stop strings still do
    assert shortest_reply(40, min_tokens=99) == 40  # never past max_tokens


def test_a_length_bound_never_goes_below_the_shortest_reply(table):
    """Neither the bound a request arrives with nor the analyzer's later ones (`set_bounds`) may plan a
    reply shorter than the request allows, or longer than max_tokens."""
    slo = SLO.deadline_slo(10.0)
    table.add(NewRequest("a", slo, arrival=0.0, input_len=10, max_tokens=40, len_ub=8, min_len=30))
    table.add(NewRequest("b", slo, arrival=0.0, input_len=10, max_tokens=40, len_ub=8))
    slots = np.array([table.slot("a"), table.slot("b")])
    assert table.len_ub[slots].tolist() == [30, 8]
    table.progress("b", 12)
    table.set_bounds(slots, np.array([5, 5]))
    assert table.len_ub[slots].tolist() == [30, 13]  # b: one past the 12 it generated
    table.set_bounds(slots, np.array([99, 99]))
    assert table.len_ub[slots].tolist() == [40, 40]
    with pytest.raises(ValueError, match=r"min_len: must be in \[1, max_tokens=40\], got 41"):
        NewRequest("c", slo, arrival=0.0, input_len=10, max_tokens=40, min_len=41)
