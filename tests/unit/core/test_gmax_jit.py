"""Just-in-time GMAX (docs/decisions/core.md, "Just-in-time bandwidth"): what each request needs to stay
on schedule is reserved first, work with slack fills the rest, best-effort takes what no SLO needs.

Each test also runs Algorithm 1's ranking (`ranking="paper"`) where it decides differently, so a JIT
implementation that fell back to the paper's ranking would fail here.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from conftest import deadline_request

from jitserve.scheduler.gmax import (
    EngineSpeed,
    GMAXParams,
    analyze,
    expired,
    margin_goodput,
    plan_frame,
    stall_seconds,
)
from jitserve.scheduler.policy import POLICY_NAMES, make_policy
from jitserve.scheduler.requests import NewRequest, RequestTable
from jitserve.scheduler.slo import SLO

SPEED = EngineSpeed(step_time=0.05, prefill_tokens_per_s=2000.0)
JIT = GMAXParams(batch_size=4)
PAPER = GMAXParams(batch_size=4, ranking="paper")
PAPER_ONE = GMAXParams(batch_size=1, frame_steps=20, ranking="paper")  # a one-slot batch, frames of 1 s


def _running(table: RequestTable, rid: str, generated: int = 1) -> None:
    table.set_running(rid, True)
    table.progress(rid, generated=generated, computed=int(table.input_len[table.slot(rid)]) + generated)


def _full_batch_of_loose_deadlines(table: RequestTable, n: int = 4) -> None:
    for i in range(n):
        table.add(deadline_request(f"loose{i}", deadline=600.0, input_len=200, ub=300))
        _running(table, f"loose{i}")


def _chat(rid: str, arrival: float = 0.0, ttft: float = 1.0, tbt: float = 0.1) -> NewRequest:
    slo = SLO.latency(ttft=ttft, tbt=tbt, waiting_time=5.0)
    return NewRequest(rid, slo, arrival=arrival, input_len=100, max_tokens=200, len_ub=200)


def test_a_compound_stage_with_stages_after_it_is_reserved_on_arrival():
    """A stage with stages after it has no slack of its own: what it waits comes out of the stages after
    it. Its whole value is at stake from its arrival, so it is reserved ahead of denser work with slack
    while still well on time for its sub-deadline D_s (docs/decisions/core.md, "A program's earlier
    stages are reserved on arrival"). The program's last stage, whose deadline is the program's own,
    waits like any work with slack until it cannot."""
    one = GMAXParams(batch_size=1, frame_steps=20)  # a frame of 1 s
    table = RequestTable()
    stage = NewRequest(
        "stage", SLO.compound(2), arrival=2.0, input_len=0, max_tokens=40, len_ub=40,
        deadline_abs=10.0, program_deadline_abs=18.0,
    )  # fmt: skip
    table.add(stage)  # 2 s of work; D_s = 10, D = 18
    # denser work with a minute of slack: by priority alone it would win the slot
    table.add(deadline_request("dense", deadline=60.0, input_len=400, ub=10))
    an = analyze(table, 4.0, SPEED, one)
    assert an.priority[1] > an.priority[0]
    early = plan_frame(table, 4.0, SPEED, one)  # 6 s to D_s, 4 s of it slack
    assert table.ids(early.batch) == ["stage"]
    assert table.ids(early.order)[:2] == ["stage", "dense"]
    assert early.reservation is not None and early.reservation.waiting == 0
    assert table.ids(plan_frame(table, 4.0, SPEED, PAPER_ONE).batch) == ["dense"]  # Algorithm 1: priority

    last = RequestTable()  # the same call as its program's last stage: its deadline is the program's
    last.add(
        NewRequest(
            "last", SLO.compound(2), arrival=2.0, input_len=0, max_tokens=40, len_ub=40,
            deadline_abs=18.0, program_deadline_abs=18.0,
        )
    )  # fmt: skip
    last.add(deadline_request("dense", deadline=60.0, input_len=400, ub=10))
    on_time = plan_frame(last, 4.0, SPEED, one)  # 14 s to D, 2 s of work: slack, no reservation
    assert last.ids(on_time.batch) == ["dense"]
    assert last.ids(plan_frame(last, 15.5, SPEED, one).batch) == ["last"]  # 2.5 s left: at stake


def test_a_chat_behind_a_full_batch_of_loose_work_preempts_at_once():
    table = RequestTable()
    _full_batch_of_loose_deadlines(table)
    table.add(_chat("chat"))
    plan = plan_frame(table, 0.0, SPEED, JIT)
    assert plan.preempt.size == 1
    assert "chat" in table.ids(plan.batch)
    assert table.ids(plan.order)[0] == "chat"
    assert make_policy("jitserve", 4).preempts_midframe  # the engine carries it out mid-frame
    # Algorithm 1 values the loose work's prompt tokens: the chat waits for a slot to free
    assert "chat" not in table.ids(plan_frame(table, 0.0, SPEED, PAPER).batch)
    assert not make_policy("jitserve-paper", 4).preempts_midframe


def test_work_with_slack_is_not_reserved_until_a_frame_before_it_would_miss():
    table = RequestTable()
    table.add(deadline_request("d", deadline=30.0, input_len=0, ub=100))  # 5 s of work
    slots = table.active_slots()
    horizon = JIT.frame_steps * SPEED.step_time  # 2.5 s
    value = analyze(table, 0.0, SPEED, JIT).goodput
    assert margin_goodput(table, 0.0, SPEED, JIT, slots, value, horizon)[0] == 0.0  # 25 s of slack
    late = 30.0 - 5.0 - horizon + 0.1  # slack now shorter than a frame
    value = analyze(table, late, SPEED, JIT).goodput
    assert margin_goodput(table, late, SPEED, JIT, slots, value, horizon)[0] == pytest.approx(100.0)


def test_a_request_about_to_pass_its_waiting_time_has_all_its_goodput_at_stake():
    table = RequestTable()
    loose_stream = SLO.latency(ttft=600.0, tbt=None, waiting_time=3.0)
    table.add(NewRequest("w", loose_stream, arrival=0.0, input_len=10, max_tokens=10))
    slots = table.active_slots()
    value = analyze(table, 1.0, SPEED, JIT).goodput
    assert margin_goodput(table, 1.0, SPEED, JIT, slots, value, 2.5)[0] == pytest.approx(value[0])
    assert margin_goodput(table, 1.0, SPEED, JIT, slots, value, 1.0)[0] == 0.0


def test_a_chat_about_to_miss_its_first_token_has_the_whole_stream_at_stake():
    """Token by token, a frame's delay costs the chat only the tokens a fast decoder cannot win back
    (32 of 200 here); its user sees a missed TTFT. Counted whole, it outranks a deadline request
    that is about to miss, whose prompt tokens outweighed those 32 before."""
    table = RequestTable()
    table.add(_chat("chat"))  # TTFT 1 s; first token at 0.1 s if started now, 2.65 s after a frame
    table.add(deadline_request("tight", deadline=4.0, input_len=60, ub=40))  # 1.9 s of slack
    slots = table.active_slots()
    horizon = JIT.frame_steps * SPEED.step_time
    value = analyze(table, 0.0, SPEED, JIT).goodput
    margins = margin_goodput(table, 0.0, SPEED, JIT, slots, value, horizon)
    assert margins[0] == pytest.approx(200.0)  # the whole stream, not 32 late tokens
    assert margins[1] == pytest.approx(100.0)  # the deadline request's prompt and reply
    one_slot = GMAXParams(batch_size=1)
    assert table.ids(plan_frame(table, 0.0, SPEED, one_slot).batch) == ["chat"]


def test_a_chat_already_past_its_ttft_is_priced_token_by_token():
    """Once the first token is late the stream has missed its SLO whatever happens: a further delay
    costs only the tokens it makes late, as the paper's token-level goodput counts them."""
    table = RequestTable()
    table.add(_chat("chat"))
    slots = table.active_slots()
    value = analyze(table, 1.5, SPEED, JIT).goodput  # first token due at 1 s: already late
    assert 0 < value[0] < 200
    margin = margin_goodput(table, 1.5, SPEED, JIT, slots, value, 2.5)[0]
    assert 0 < margin < value[0]
    assert margin == pytest.approx(50.0)  # tokens 12..61 fall behind their due times


def test_best_effort_takes_only_capacity_no_slo_needs():
    table = RequestTable()
    # a prompt-heavy best-effort job: Algorithm 1 ranks it first (its prompt tokens count as goodput)
    table.add(NewRequest("batch", SLO.best_effort(), arrival=0.0, input_len=2000, max_tokens=50, len_ub=50))
    for i in range(4):
        table.add(deadline_request(f"d{i}", deadline=60.0, input_len=50, ub=100))
    assert "batch" in table.ids(plan_frame(table, 0.0, SPEED, PAPER).batch)
    plan = plan_frame(table, 0.0, SPEED, JIT)
    assert "batch" not in table.ids(plan.batch)
    assert table.ids(plan.order)[-1] == "batch"
    # with a slot no SLO work needs, it runs (work conservation)
    table.remove("d3")
    assert "batch" in table.ids(plan_frame(table, 0.0, SPEED, JIT).batch)


def test_best_effort_is_never_dropped_for_waiting():
    table = RequestTable()
    table.add(NewRequest("be", SLO.best_effort(waiting_time=1.0), arrival=0.0, input_len=5, max_tokens=5))
    table.add(NewRequest("d", SLO.deadline_slo(20, waiting_time=1.0), arrival=0.0, input_len=5, max_tokens=5))
    assert table.ids(expired(table, 10.0)) == []  # deadline work waits for its deadline (20 s)
    assert table.ids(expired(table, 25.0)) == ["d"]
    assert table.ids(plan_frame(table, 25.0, SPEED, JIT).drop) == ["d"]


def test_a_stream_ahead_of_its_timeline_keeps_its_slot():
    """Recomputed, a paused stream loses its place on its timeline and re-prefills everything; on real
    engines preempting streams for first tokens cost throughput and client timeouts (docs/decisions/
    core.md, "Streams keep their slots"). With swap it yields; a deadline request that can wait a frame
    yields either way."""
    table = RequestTable()
    _full_batch_of_loose_deadlines(table, n=3)
    # a stream 60 tokens in at 50 ms/token against a 100 ms TBT: 3 s ahead of its timeline
    table.add(_chat("ahead", arrival=0.0, ttft=1.0, tbt=0.1))
    _running(table, "ahead", generated=60)
    now = 0.95 + 60 * 0.05
    # the other three have 0.5 s of slack: they cannot yield a frame, so only the stream ahead can
    for i in range(3):
        table.deadline_abs[table.slot(f"loose{i}")] = now + 300 * 0.05 + 0.5
    table.add(_chat("new", arrival=now))
    plan = plan_frame(table, now, SPEED, JIT)  # recompute, as vLLM V1 preempts
    assert plan.preempt.size == 0
    assert "new" not in table.ids(plan.batch) and "ahead" in table.ids(plan.batch)
    # where the KV cache survives the pause (swap), the stream ahead yields its slot
    assert table.ids(plan_frame(table, now, SPEED, replace(JIT, preemption="swap")).preempt) == ["ahead"]
    # give one deadline request a frame of slack: it yields to the new chat instead
    table.deadline_abs[table.slot("loose0")] = now + 300 * 0.05 + 60.0
    plan = plan_frame(table, now, SPEED, JIT)
    assert table.ids(plan.preempt) == ["loose0"]
    assert "new" in table.ids(plan.batch)


def test_a_request_yields_its_slot_at_most_once_where_preemption_recomputes():
    """Recomputed, a victim re-prefills its prompt and reply; under overload victims became urgent and
    preempted each other in turn (real engines: 170 preemptions in a 2-minute trace, some requests
    9 times; docs/decisions/core.md, "One recompute per request"). A request preempted once keeps its
    slot after, where preemption recomputes; with swap it may yield again."""
    table = RequestTable()
    _full_batch_of_loose_deadlines(table)
    for i in (0, 1, 3):
        table.mark_preempted(table.slot(f"loose{i}"))  # yielded before, and admitted again since
    table.add(_chat("chat"))
    assert table.ids(plan_frame(table, 0.0, SPEED, JIT).preempt) == ["loose2"]
    table.mark_preempted(table.slot("loose2"))
    plan = plan_frame(table, 0.0, SPEED, JIT)
    assert plan.preempt.size == 0 and "chat" not in table.ids(plan.batch)
    assert plan_frame(table, 0.0, SPEED, replace(JIT, preemption="swap")).preempt.size == 1
    table.remove("loose0")  # its slot frees: the preempted-before rule does not stop admission
    assert "chat" in table.ids(plan_frame(table, 0.0, SPEED, JIT).batch)


def test_a_recompute_engine_does_not_preempt_while_its_committed_bandwidth_exceeds_the_batch():
    """A recompute adds a re-prefill to an engine that already owes more bandwidth than its batch has:
    the victim would not get its slot back in time, and the preemption only moves a miss at a cost
    (real engines: 0.7x stock vLLM's goodput; docs/decisions/core.md, "Preempt only what the batch can
    repay"). Where the KV cache survives (swap), nothing changes."""
    table = RequestTable()
    _full_batch_of_loose_deadlines(table)
    table.add(_chat("chat"))
    assert plan_frame(table, 0.0, SPEED, JIT).preempt.size == 1  # 4 loose requests + a chat: fits
    for i in range(5):  # 5 s of work each, due in 6 s: 0.83 of a slot each
        table.add(deadline_request(f"tight{i}", deadline=6.0, input_len=0, ub=100))
    an = analyze(table, 0.0, SPEED, JIT)
    assert an.bw[an.feasible].sum() > JIT.batch_size
    plan = plan_frame(table, 0.0, SPEED, JIT)
    assert plan.preempt.size == 0
    assert table.ids(plan.order)[0] == "chat"  # still first in the queue: it takes the next slot that frees
    assert plan_frame(table, 0.0, SPEED, replace(JIT, preemption="swap")).preempt.size >= 1


def test_a_preemption_pays_for_the_tokens_the_batch_would_have_made_in_its_stall():
    """A re-prefill stalls the whole batch; with the batch full and a request waiting, the tokens it
    would have made in that time are lost to the queue even when every running request has slack
    (§4.2: goodput_loss = stall x token generation speed; docs/decisions/core.md, "A re-prefill costs
    the tokens the batch would have made"). Victims with 2,000-token prompts stall 1 s: 4 slots / 50 ms
    x 1 s = 80 tokens. A 20-token chat does not earn that; a 200-token one does, and so does the short
    chat where the victims' prompts are short (200 tokens: a 0.1 s stall, 8 tokens). Margins alone
    (the loose work has minutes of slack) would preempt for all three."""

    def plan(prompt: int, chat_tokens: int, speed: EngineSpeed = SPEED) -> np.ndarray:
        table = RequestTable()
        for i in range(4):
            table.add(deadline_request(f"loose{i}", deadline=600.0, input_len=prompt, ub=300))
            _running(table, f"loose{i}")
        slo = SLO.latency(ttft=1.0, tbt=0.1, waiting_time=5.0)
        chat = NewRequest("chat", slo, arrival=0.0, input_len=100, max_tokens=chat_tokens, len_ub=chat_tokens)
        table.add(chat)
        return plan_frame(table, 0.0, speed, JIT).preempt

    assert plan(prompt=2000, chat_tokens=20).size == 0  # earns 20, costs 80
    assert plan(prompt=2000, chat_tokens=200).size == 1  # earns 200
    assert plan(prompt=200, chat_tokens=20).size == 1  # costs 8
    # a prefix cache that keeps the victims' full 32-token blocks leaves 17 tokens to re-prefill
    assert plan(prompt=2000, chat_tokens=20, speed=replace(SPEED, prefix_block_tokens=32)).size == 1


def test_a_recompute_stalls_for_what_the_prefix_cache_did_not_keep():
    """vLLM's prefix cache serves back a preempted request's full blocks, short of its last token
    (which is always recomputed); a swap moves the whole sequence either way."""
    table = RequestTable()
    for rid, prompt, generated in (("a", 100, 0), ("b", 95, 1), ("c", 96, 1), ("d", 10, 5)):
        table.add(deadline_request(rid, deadline=600.0, input_len=prompt, ub=300))
        _running(table, rid, generated=generated)
    slots = np.array([table.slot(r) for r in "abcd"])
    unit = EngineSpeed(prefill_tokens_per_s=1.0, swap_bytes_per_s=1.0, kv_bytes_per_token=0.5)
    assert stall_seconds(table, slots, unit, "recompute").tolist() == [100, 96, 97, 15]
    cached = replace(unit, prefix_block_tokens=32)
    assert stall_seconds(table, slots, cached, "recompute").tolist() == [4, 32, 1, 15]
    assert stall_seconds(table, slots, cached, "swap").tolist() == [100, 96, 97, 15]
    with pytest.raises(ValueError, match="prefix_block_tokens"):
        replace(unit, prefix_block_tokens=-1)


def test_a_stream_on_its_timeline_is_reserved_and_kept():
    table = RequestTable()
    table.add(_chat("on-time", arrival=0.0, ttft=1.0, tbt=0.06))  # 10 ms per token of margin only
    _running(table, "on-time", generated=10)
    for i in range(3):
        table.add(deadline_request(f"loose{i}", deadline=600.0, input_len=200, ub=300))
        _running(table, f"loose{i}")
    table.add(_chat("new", arrival=1.5))
    plan = plan_frame(table, 1.5, SPEED, JIT)
    assert "on-time" in table.ids(plan.batch)
    assert "on-time" not in table.ids(plan.preempt)
    assert "new" in table.ids(plan.batch)


def test_everything_runs_when_it_fits():
    table = RequestTable()
    table.add(_chat("c"))
    table.add(deadline_request("d", deadline=600.0))
    table.add(NewRequest("be", SLO.best_effort(), arrival=0.0, input_len=5, max_tokens=5))
    plan = plan_frame(table, 0.0, SPEED, JIT)
    assert sorted(table.ids(plan.batch)) == ["be", "c", "d"]
    assert plan.preempt.size == 0


def test_analyze_with_per_slot_delays_matches_one_request_at_a_time():
    table = RequestTable()
    table.add(_chat("a"))
    table.add(deadline_request("b", deadline=10.0))
    table.add(_chat("c", ttft=0.5, tbt=0.2))
    slots = table.active_slots()
    delays = np.array([0.3, 1.0, 2.0])
    together = analyze(table, 0.0, SPEED, JIT, slots, queue_delay=delays)
    for i, slot in enumerate(slots):
        alone = analyze(table, 0.0, SPEED, JIT, slots[i : i + 1], queue_delay=float(delays[i]))
        assert together.goodput[i] == pytest.approx(alone.goodput[0]), int(slot)
        assert together.t_rem[i] == pytest.approx(alone.t_rem[0])


def test_the_paper_ranking_stays_selectable():
    assert "jitserve-paper" in POLICY_NAMES
    assert make_policy("jitserve-paper", 4).params.ranking == "paper"
    assert make_policy("jitserve", 4).params.ranking == "jit"
    with pytest.raises(ValueError, match="ranking"):
        GMAXParams(ranking="fastest")


def _chat_and_denser_deadline(table: RequestTable) -> None:
    """Two urgent requests for one slot: a paused chat (its first token sent, a swapping engine paused
    it) whose later tokens are at stake, and a deadline request about to miss whose prompt makes it
    worth more per slot-second. A stream still waiting for its first token would go first whatever
    the densities ("First tokens first"), so the fairness term is seen on a stream past it."""
    table.add(_chat("chat"))
    table.progress("chat", generated=1, computed=101)  # waiting again, its first token delivered
    table.add(deadline_request("dense", deadline=2.0, input_len=1000, ub=20))  # 1,020 over 1.5 s


def test_the_reservation_serves_the_type_it_has_been_failing_first():
    """§4.2's fairness extension on the reservation: (1 - f) x density / max + f x Fair(r), Fair(r) =
    1 - the SLO type's recent attainment. Without it the denser deadline request takes the slot."""
    table = RequestTable()
    _chat_and_denser_deadline(table)
    one_slot = GMAXParams(batch_size=1, class_fairness=0.5)
    failing_chats = np.array([1.0, 0.0, 0.0, 0.0])  # latency met none lately, deadline work all of it
    assert table.ids(plan_frame(table, 0.0, SPEED, one_slot).batch) == ["dense"]
    assert table.ids(plan_frame(table, 0.0, SPEED, one_slot, type_fair=failing_chats).batch) == ["chat"]
    # (chat 0.5 x its density / the deadline's + 0.5 x 1 > 0.5 x 1 + 0.) f = 0 turns the term off; a type
    # served as well as the other gains nothing
    off = GMAXParams(batch_size=1, class_fairness=0.0)
    assert table.ids(plan_frame(table, 0.0, SPEED, off, type_fair=failing_chats).batch) == ["dense"]
    even = np.array([0.3, 0.3, 0.0, 0.0])
    assert table.ids(plan_frame(table, 0.0, SPEED, one_slot, type_fair=even).batch) == ["dense"]


def test_the_policy_reads_the_attainment_its_outcomes_built():
    """GMAXPolicy keeps the outcomes the frame driver reports (engine and simulator alike) and plans
    with them: missed chats lift the next chat over the denser deadline request."""
    table = RequestTable()
    _chat_and_denser_deadline(table)
    policy = make_policy("jitserve", 1, class_fairness=0.5)
    assert table.ids(policy.plan(table, 0.0, SPEED).batch) == ["dense"]
    for _ in range(9):
        policy.outcome(0, met=False, now=0.0)  # latency: none met
        policy.outcome(1, met=True, now=0.0)  # deadline: all met
    assert table.ids(policy.plan(table, 0.0, SPEED).batch) == ["chat"]


def test_the_policy_weighs_tenants_by_their_outcomes_and_the_class_weight():
    """The frame driver reports each ending's tenant; a class with a fairnessWeight lifts the tenant the
    engine has been failing over denser work (scheduler/fairness.py, TenantAttainment)."""
    table = RequestTable()
    weighted = SLO(type="deadline", deadline=100, fairness=0.9)
    for rid, ub in (("densest", 5), ("dense", 10)):
        table.add(NewRequest(rid, SLO.deadline_slo(100), arrival=0, input_len=1000, max_tokens=ub, tenant=0))
    table.add(NewRequest("failed", weighted, arrival=0, input_len=10, max_tokens=10, tenant=1))
    policy = make_policy("jitserve", 2)
    assert sorted(table.ids(policy.plan(table, 0.0, SPEED).batch)) == ["dense", "densest"]
    for _ in range(5):
        policy.outcome(1, met=True, now=0.0, tenant=0)
        policy.outcome(1, met=False, now=0.0, tenant=1)
    assert sorted(table.ids(policy.plan(table, 0.0, SPEED).batch)) == ["densest", "failed"]


def test_the_plan_says_what_it_reserved_for_the_replica_report():
    """Placement reads how much reserved work waits and how much running work can yield
    (`FramePlan.reservation`, reported as `reserved_waiting` / `yieldable`)."""
    table = RequestTable()
    _full_batch_of_loose_deadlines(table)
    plan = plan_frame(table, 0.0, SPEED, JIT)
    assert (plan.reservation.waiting, plan.reservation.yieldable) == (0, 4)  # all four can wait
    for i in range(5):
        table.add(_chat(f"chat{i}"))  # five urgent chats, four slots: one preempts... all it can
    plan = plan_frame(table, 0.0, SPEED, JIT)
    reserved_in_batch = 4 - plan.reservation.yieldable
    assert reserved_in_batch + plan.reservation.waiting == 5
    assert plan.reservation.waiting >= 1
    assert plan_frame(table, 0.0, SPEED, PAPER).reservation is None  # Algorithm 1 reserves nothing
    # a stream ahead of its timeline can wait, but is not reported as yieldable (pausing it rarely pays)
    streams = RequestTable()
    _full_batch_of_loose_deadlines(streams, n=3)
    streams.add(_chat("ahead", ttft=1.0, tbt=0.1))
    _running(streams, "ahead", generated=60)
    plan = plan_frame(streams, 0.95 + 60 * 0.05, SPEED, JIT)
    assert (plan.reservation.waiting, plan.reservation.yieldable) == (0, 3)


def test_streams_on_time_for_their_first_token_are_reserved_in_due_order():
    """Two chats about to miss their first token, one slot: the one due first takes it, though the later
    one has the longer length bound (more goodput at stake, so the higher density). By density alone the
    later arrival overtook the earlier, which then passed its TTFT and its waiting_time unstarted."""
    table = RequestTable()
    for i in range(3):
        table.add(deadline_request(f"held{i}", deadline=600.0, input_len=0, ub=10))
        _running(table, f"held{i}")
    slo = SLO.latency(ttft=1.0, tbt=0.1, waiting_time=5.0)
    table.add(NewRequest("early", slo, arrival=0.0, input_len=100, max_tokens=200, len_ub=20))
    table.add(NewRequest("late", slo, arrival=0.3, input_len=100, max_tokens=200, len_ub=200))
    plan = plan_frame(table, 0.4, SPEED, replace(JIT, preemption="never"))
    assert table.ids(plan.order)[:2] == ["early", "late"]
    assert "early" in table.ids(plan.batch) and "late" not in table.ids(plan.batch)
    # a chat already past its first token's due time keeps density's place: due order is for the on-time
    late_table = RequestTable()
    # 5 s late, not dropped yet, and still feasible: from token 90 on it is back on its timeline
    patient = SLO.latency(ttft=1.0, tbt=0.1, waiting_time=30.0)
    late_table.add(NewRequest("missed", patient, arrival=-5.0, input_len=100, max_tokens=200, len_ub=200))
    late_table.add(NewRequest("fresh", slo, arrival=0.3, input_len=100, max_tokens=200, len_ub=200))
    late_plan = plan_frame(late_table, 0.4, SPEED, JIT)
    assert late_plan.analysis is not None and late_plan.analysis.feasible.all()  # both are candidates
    assert late_table.ids(late_plan.order) == ["fresh", "missed"]


def test_a_first_token_on_time_goes_ahead_of_denser_urgent_work():
    """Among the batch's worth of the densest reserved requests, a chat waiting for its first token goes
    ahead of a deadline request about to miss that is worth five times as much per slot-second: a missed
    first token fails the chat whatever follows (docs/decisions/core.md, "First tokens lead the batch").
    Algorithm 1 and a paused stream (first token sent) leave the head to the denser request."""
    two_slots = GMAXParams(batch_size=2)
    table = RequestTable()
    table.add(_chat("chat"))
    table.add(deadline_request("dense", deadline=2.0, input_len=1000, ub=20))
    assert table.ids(plan_frame(table, 0.0, SPEED, two_slots).order) == ["chat", "dense"]
    assert table.ids(plan_frame(table, 0.0, SPEED, replace(two_slots, ranking="paper")).order)[0] == "dense"
    paused = RequestTable()
    _chat_and_denser_deadline(paused)
    assert paused.ids(plan_frame(paused, 0.0, SPEED, two_slots).order) == ["dense", "chat"]


def test_a_first_token_below_the_batchs_worth_of_denser_work_waits():
    """A first token leads only the B densest reserved requests. Ranked below them, the chat waits as its
    density says: before, its first token took a slot from work worth many times more per slot-second,
    and at paper 2x on real engines the chats' first tokens held the slots while 51-68 compound programs
    per seed lost their first stage unstarted (docs/decisions/core.md, "First tokens lead the batch")."""
    one_slot = GMAXParams(batch_size=1)
    table = RequestTable()
    table.add(_chat("chat"))
    table.add(deadline_request("dense", deadline=2.0, input_len=1000, ub=20))
    plan = plan_frame(table, 0.0, SPEED, one_slot)
    assert table.ids(plan.batch) == ["dense"]
    assert plan.reservation is not None and plan.reservation.waiting == 1  # the chat: reserved, waiting
    two_slots = GMAXParams(batch_size=2)
    crowded = RequestTable()
    crowded.add(_chat("chat"))
    crowded.add(deadline_request("dense", deadline=2.0, input_len=1000, ub=20))
    crowded.add(deadline_request("denser", deadline=2.0, input_len=1200, ub=20))
    assert sorted(crowded.ids(plan_frame(crowded, 0.0, SPEED, two_slots).batch)) == ["dense", "denser"]


def test_an_unstarted_stream_past_its_first_token_waits_behind_work_with_slack():
    """A chat that would start after its first token's due time can still earn the tokens that catch
    up with its timeline, so it is not dropped; but it is served after every feasible SLO request,
    with slack or not, and before best-effort work that no deadline presses."""
    one_slot = GMAXParams(batch_size=1)
    patient = SLO.latency(ttft=1.0, tbt=0.1, waiting_time=30.0)
    table = RequestTable()
    table.add(NewRequest("missed", patient, arrival=-5.0, input_len=100, max_tokens=200, len_ub=200))
    table.add(deadline_request("slack", deadline=120.0, input_len=100, ub=20))
    table.add(NewRequest("batch", SLO.best_effort(), arrival=0.0, input_len=100, max_tokens=20, len_ub=20))
    plan = plan_frame(table, 0.0, SPEED, one_slot)
    assert plan.analysis is not None and plan.analysis.feasible.all()
    assert table.ids(plan.order) == ["slack", "missed", "batch"]
    assert plan.reservation is not None and plan.reservation.waiting == 0  # nothing reserved
    # with its first token still on time it is reserved and goes first
    fresh = RequestTable()
    fresh.add(NewRequest("chat", patient, arrival=0.0, input_len=100, max_tokens=200, len_ub=200))
    fresh.add(deadline_request("slack", deadline=120.0, input_len=100, ub=20))
    assert fresh.ids(plan_frame(fresh, 0.0, SPEED, one_slot).order)[0] == "chat"
