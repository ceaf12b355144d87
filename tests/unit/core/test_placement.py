"""Power-of-K placement over replica-specific priorities (JITServe §4.3)."""

import numpy as np

from jitserve.scheduler.gmax import GMAXParams
from jitserve.scheduler.placement import Rejection, ReplicaState, ShortReplyRule, place, stage_slot_wait
from jitserve.scheduler.requests import NewRequest
from jitserve.scheduler.slo import SLO


def replica(name: str, **kw) -> ReplicaState:
    base = dict(
        pod=name,
        model="m",
        step_time_s=0.05,
        prefill_tokens_per_s=4000.0,
        batch_size=8,
        running=0,
        waiting=0,
        committed_bandwidth=0.0,
        residual_capacity=8.0,
        admission_priority=0.0,
        queue_delay_s=0.0,
        kv_usage=0.1,
        cutoff=0.95,
        frames=1,
        updated_at=0.0,
    )
    base.update(kw)
    return ReplicaState(**base)


def tight(rid="r", deadline=3.0) -> NewRequest:
    return NewRequest(rid, SLO.deadline_slo(deadline), arrival=0.0, input_len=200, max_tokens=40)


def test_loaded_replica_is_avoided():
    loaded = replica("a", running=8, waiting=20, queue_delay_s=2.5, admission_priority=300.0)
    idle = replica("b")
    assert place(tight(), [loaded, idle], now=0.0).replica == 1
    assert place(tight(), [idle, loaded], now=0.0).replica == 0


def test_a_faster_report_is_scored_but_not_ranked():
    """Replicas of a pool are the same hardware: the priority each reports uses its own step time (it
    decides feasibility), but they are ranked at the slowest, so equal loads tie."""
    slow = replica("slow", step_time_s=0.06)
    fast = replica("fast", step_time_s=0.02)
    p = place(tight(), [slow, fast], now=0.0)
    assert p.priorities[1] > p.priorities[0]  # replica-specific, as reported
    assert p.replica == 0  # a tie at the common speed: the first of the equally loaded
    # only the fast one can meet a deadline its report makes feasible: it takes the request
    due = place(tight(deadline=1.2), [slow, fast], now=0.0)
    assert due.replica == 1 and due.priorities[0] == 0


def test_a_faster_prefill_report_is_not_ranked_either():
    """Prefill rates, like step times, differ between a pool's replicas by load and measurement lag: a
    long prompt is ranked at the slowest reported rate, so the less loaded replica takes it, not the one
    that happened to measure a faster prefill."""
    long_prompt = NewRequest("r", SLO.deadline_slo(8.0), arrival=0.0, input_len=8000, max_tokens=40)
    fast_busy = replica("fast", prefill_tokens_per_s=8000.0, running=1)
    slow_idle = replica("slow", prefill_tokens_per_s=4000.0)
    p = place(long_prompt, [fast_busy, slow_idle], now=0.0)
    assert p.priorities[0] > p.priorities[1]  # replica-specific, as reported
    assert p.replica == 1


def test_prompts_ahead_delay_a_newcomer():
    """A chunked-prefill engine computes the prompts it already holds before a newcomer's (vLLM keeps
    started prefills ahead of new requests): 20,000 pending tokens at 4,000/s start a newcomer 5 s late,
    which a 3 s deadline cannot afford there, whatever the order of the replicas."""
    prefilling = replica("a", running=1, pending_prefill_tokens=20_000)
    decoding = replica("b", running=1)
    assert place(tight(), [prefilling, decoding], now=0.0).replica == 1
    assert place(tight(), [decoding, prefilling], now=0.0).replica == 0
    # behind that much prefill everywhere, not even a one-token reply is on time
    p = place(tight(), [prefilling, prefilling.model_copy(update={"pod": "c"})], now=0.0)
    assert p.replica is None and p.rejection is Rejection.NO_TIME
    # a looser deadline is feasible on both, and the replica with less prefill ahead takes it
    assert (
        place(
            tight(deadline=10.0),
            [prefilling, decoding.model_copy(update={"pending_prefill_tokens": 4000})],
            now=0.0,
        ).replica
        == 1
    )


def test_unattainable_slo_has_no_placement():
    # the prompt alone takes 200 / 4000 = 0.05 s plus a 2.5 s queue: a 1 s deadline is out of reach
    queued = [replica("a", queue_delay_s=2.5), replica("b", queue_delay_s=2.5)]
    p = place(tight(deadline=1.0), queued, now=0.0)
    assert p.replica is None
    assert "no replica" in p.reason


def test_a_short_reply_may_still_make_it_on_an_idle_replica():
    # 40 bound tokens at 50 ms need 2 s, but a reply of up to ~18 tokens fits 1 s: light load, admitted
    p = place(tight(deadline=1.0), [replica("a"), replica("b")], now=0.0)
    assert p.replica is not None
    assert "shorter than its length bound" in p.reason
    # one sequence in a batch of 8 is still under a quarter: admitted
    assert place(tight(deadline=1.0), [replica("a", running=1)], now=0.0).replica == 0


def test_a_short_reply_is_rejected_on_a_busy_replica():
    # the same request where the replica holds a quarter of its batch (running + waiting >= B/4)
    for busy in (replica("a", running=2), replica("a", running=1, waiting=1), replica("a", running=8)):
        p = place(tight(deadline=1.0), [busy], now=0.0)
        assert p.replica is None
        assert p.reason.startswith("rejected: replica busy")
        assert "shorter than the length bound" in p.reason
        assert p.rejection is Rejection.BUSY_SHORT_REPLY


def test_a_short_reply_goes_to_the_idle_replica():
    # the busy replica is faster (higher priority) but a request on time only with under half its bound
    # (0.6 s: ~18 of 40 tokens at 30 ms, ~11 at 50 ms) goes only where it is idle
    busy = replica("a", running=4, step_time_s=0.03)
    idle = replica("b", running=1)
    assert place(tight(deadline=0.6), [busy, idle], now=0.0).replica == 1
    assert place(tight(deadline=0.6), [idle, busy], now=0.0).replica == 0


def test_a_likely_reply_goes_to_a_busy_replica():
    """The deployed rule (HALF_BOUND): a request on time with half its q0.9 bound, about its median
    reply, is admitted where it is; the busy rule holds only requests that need a still shorter reply."""
    half = replica("a", running=4)  # half full: busy
    # 40 bound tokens at 50 ms: a 1.2 s deadline fits ~23 (>= half the bound), 1.0 s only ~19
    likely = place(tight(deadline=1.2), [half], now=0.0)
    assert likely.replica == 0 and "shorter than its length bound" in likely.reason
    unlikely = place(tight(deadline=1.0), [half], now=0.0)
    assert unlikely.replica is None and unlikely.rejection is Rejection.BUSY_SHORT_REPLY
    # the same 1.2 s request under the occupancy rule alone (deployed until 2026-11-28) is turned away
    occupancy = place(tight(deadline=1.2), [half], now=0.0, short_reply=ShortReplyRule.OCCUPANCY)
    assert occupancy.rejection is Rejection.BUSY_SHORT_REPLY


def test_the_short_reply_rules_kept_for_the_ablation():
    req = tight(deadline=1.0)  # on time only with a reply shorter than its 40-token bound
    half = replica("a", running=4)  # half full, no queue
    assert place(req, [half], now=0.0).replica is None  # deployed: under half its bound, >= B/4
    assert place(req, [half], now=0.0, short_reply=ShortReplyRule.OCCUPANCY).replica is None
    assert place(req, [half], now=0.0, short_reply=ShortReplyRule.NO_QUEUE).replica == 0
    queued = replica("a", running=8, waiting=1, queue_delay_s=0.01)
    assert place(req, [queued], now=0.0, short_reply=ShortReplyRule.NO_QUEUE).replica is None
    assert place(req, [replica("a")], now=0.0, short_reply=ShortReplyRule.BOUND).replica is None
    assert place(req, [queued], now=0.0, short_reply=ShortReplyRule.ONE_TOKEN).replica == 0


def test_the_refinement_measured_and_not_kept():
    """LATER_STAGES (docs/decisions/core.md, "The busy-replica rule, refined") lets through exactly the
    short-reply requests it names, and the busy rule still holds the others."""
    half = replica("a", running=4)  # half full: busy
    # the same request carrying an earlier call's goodput goes to the busy replica (1.0 s: ~19 tokens of 40)
    stage = NewRequest(
        "s", SLO.deadline_slo(1.0), arrival=0.0, input_len=200, max_tokens=40, program_goodput=50
    )
    assert place(stage, [half], now=0.0, short_reply=ShortReplyRule.LATER_STAGES).replica == 0
    assert place(stage, [half], now=0.0).rejection is Rejection.BUSY_SHORT_REPLY
    fresh = place(tight(deadline=1.0), [half], now=0.0, short_reply=ShortReplyRule.LATER_STAGES)
    assert fresh.rejection is Rejection.BUSY_SHORT_REPLY


def test_a_request_on_time_with_its_bound_ignores_busyness():
    # feasible with the full 40-token bound (3 s deadline): a busy replica with free slots still takes it
    p = place(tight(deadline=3.0), [replica("a", running=6)], now=0.0)
    assert p.replica == 0
    assert p.reason == "admitted by replica-specific priority"


def stage(program_deadline: float, true_len: int = 40) -> NewRequest:
    """A compound stage due 0.5 s after its release (its share of a 20 s program is 2.5%), 40 tokens."""
    return NewRequest(
        "p.1.0", SLO.compound(stages=4, per_stage=5.0), arrival=0.0, input_len=200, max_tokens=40,
        len_ub=40, true_len=true_len, deadline_abs=0.5, program_deadline_abs=program_deadline,
        program_goodput=300.0,
    )  # fmt: skip


def test_a_stage_late_for_its_share_is_judged_by_its_programs_deadline():
    """Behind a 1 s queue, the stage's 40 true tokens (2.05 s) cannot fit its share of what is left of the
    program (2.5% of 19 s) even for the oracle, which knows the reply is no shorter. Only the program's
    deadline is scored and a rejection loses the program's earlier stages: on time for a 20 s program, it is
    admitted wherever there is room; late even for a 2.5 s program, it is rejected."""
    oracle = GMAXParams(oracle=True)
    queued = replica("a", running=6, queue_delay_s=1.0)
    p = place(stage(program_deadline=20.0), [queued], now=0.0, params=oracle)
    assert p.replica == 0
    assert p.reason == "admitted: late for its share of the program's deadline, on time for the program"
    late = place(stage(program_deadline=2.5), [queued], now=0.0, params=oracle)
    assert late.replica is None and late.rejection is Rejection.NO_TIME
    # a 10-token reply (0.55 s) still misses the share but makes the 2.5 s program; a deadline request has
    # no program to be judged by
    assert place(stage(2.5, true_len=10), [queued], now=0.0, params=oracle).replica == 0
    alone = NewRequest("d", SLO.deadline_slo(0.5), arrival=0.0, input_len=200, max_tokens=40, true_len=40)
    assert place(alone, [queued], now=0.0, params=oracle).rejection is Rejection.NO_TIME


def test_queueing_delay_makes_a_replica_infeasible():
    late = replica("a", queue_delay_s=10.0, running=8, waiting=30)
    p = place(tight(deadline=5.0), [late], now=0.0)
    assert p.replica is None
    assert p.rejection is Rejection.NO_TIME


def test_prefix_cache_hit_raises_priority():
    a, b = replica("a"), replica("b")
    p = place(tight(), [a, b], now=0.0, cached_tokens=[0, 200])
    assert p.replica == 1


def test_k_samples_a_subset_deterministically():
    reps = [replica(str(i)) for i in range(6)]
    p1 = place(tight(), reps, now=0.0, k=2, rng=np.random.default_rng(7))
    p2 = place(tight(), reps, now=0.0, k=2, rng=np.random.default_rng(7))
    assert p1.sampled.size == 2 and p1.replica == p2.replica and p1.replica in p1.sampled


def test_no_replicas():
    p = place(tight(), [], now=0.0)
    assert p.replica is None
    assert p.rejection is Rejection.NO_REPLICA


def test_equal_replicas_share_the_load():
    # identical speeds, all with free slots: the least loaded one wins, not always the first
    busy = replica("a", running=6)
    quiet = replica("b", running=1)
    assert place(tight(), [busy, quiet], now=0.0).replica == 1
    assert place(tight(), [quiet, busy], now=0.0).replica == 0


def test_below_every_bar_a_stream_queues_only_if_it_can_start_within_its_waiting_time():
    """A full replica whose top-B work outranks the request: it waits behind the queue. A stream with a
    loose TTFT (60 s) is feasible even after either queue; whether it may queue depends on the queue
    delay against its waiting_time, after which the engine would drop it unstarted."""
    slo = SLO.latency(ttft=60.0, tbt=None)
    req = NewRequest("r", slo, arrival=0.0, input_len=200, max_tokens=40)
    short = replica("a", running=8, waiting=4, admission_priority=1e9, queue_delay_s=slo.waiting_time / 2)
    p = place(req, [short], now=0.0)
    assert p.replica == 0
    assert p.reason.startswith("queued: below every replica's admission bar")
    assert p.rejection is None  # placed: no rule turned it away
    long = replica("a", running=8, waiting=40, admission_priority=1e9, queue_delay_s=slo.waiting_time * 2)
    p = place(req, [long], now=0.0)
    assert p.replica is None
    assert "queue ahead is longer than it may wait unstarted (5 s)" in p.reason
    assert p.rejection is Rejection.QUEUE_TOO_LONG
    # with the short queue on the other replica, it goes there
    assert place(req, [long, short], now=0.0).replica == 1
    # time already spent (the router saw it late) counts against its waiting_time
    assert place(req, [short], now=slo.waiting_time * 0.6).replica is None


def test_below_every_bar_deadline_work_may_wait_for_its_deadline():
    """Deadline work is dropped unstarted only once its deadline passes, not at its waiting_time
    (`NewRequest.drop_at`): behind a queue twice its waiting_time it queues while its 60 s deadline
    allows, and is turned away behind a queue that outlasts the deadline."""
    slo = SLO.deadline_slo(60.0)
    req = NewRequest("r", slo, arrival=0.0, input_len=200, max_tokens=40)
    assert req.drop_at() == 60.0
    long = replica("a", running=8, waiting=40, admission_priority=1e9, queue_delay_s=slo.waiting_time * 2)
    p = place(req, [long], now=0.0)
    assert p.replica == 0 and p.reason.startswith("queued")
    endless = replica("a", running=8, waiting=400, admission_priority=1e9, queue_delay_s=70.0)
    assert place(req, [endless], now=0.0).replica is None


def test_a_replica_measured_before_a_burst_does_not_take_all_of_it():
    """A replica's step time is an average that lags its load (the simulator's profile step, an
    engine's meter), so a replica that measured a short step before a burst reports it for a while as
    it fills up. Ranked at its report
    it took every request of the burst (the pile-up of docs/benchmarks/sim.md, "Where JITServe
    loses"); ranked at the slowest report, the less loaded replica takes the next one."""
    stale = replica("stale", step_time_s=0.014, running=6, batch_size=32)
    fresh = replica("fresh", step_time_s=0.05, running=2, batch_size=32)
    p = place(tight(deadline=10.0), [stale, fresh], now=0.0)
    assert p.priorities[0] > p.priorities[1]
    assert p.replica == 1
    # idle beside busy: the idle one, as before
    assert (
        place(
            tight(deadline=10.0), [replica("busy", step_time_s=0.014, running=3), replica("idle")], 0.0
        ).replica
        == 1
    )


def test_reserved_delay_counts_the_reserved_work_ahead_and_what_can_yield():
    """A just-in-time engine serves work that cannot wait ahead of work that can: a newcomer it would
    reserve starts behind the reserved requests still waiting, a slot turn apart, in a slot a yieldable
    request gives up at once if there is one to spare."""
    full = dict(running=8, waiting=8, queue_delay_s=9.0)  # 9 ahead of a newcomer: a slot turn is 1 s
    assert replica("a", **full).reserved_delay_s() == 9.0  # no reservation reported: the whole queue
    assert replica("a", **full, reserved_waiting=1, yieldable=0).reserved_delay_s() == 2.0
    assert replica("a", **full, reserved_waiting=1, yieldable=2).reserved_delay_s() == 0.0
    assert replica("a", **full, reserved_waiting=30, yieldable=0).reserved_delay_s() == 9.0  # capped


def test_a_later_stage_is_budgeted_the_mean_reserved_delay_of_the_replicas_that_reserve():
    """Which replica a later stage lands on is decided when it arrives: its expected wait is the mean
    reserved delay; an engine that reports no reservation serves in arrival order and adds no wait."""
    full = dict(running=8, waiting=8, queue_delay_s=9.0)  # a slot turn is 1 s
    jit_a = replica("a", **full, reserved_waiting=1, yieldable=0)  # 2 s
    jit_b = replica("b", **full, reserved_waiting=3, yieldable=0)  # 4 s
    stock = replica("c", **full)  # no reservation: its 9 s queue is not a just-in-time wait
    assert stage_slot_wait([jit_b, jit_a, stock]) == 3.0
    assert stage_slot_wait([stock]) == 0.0
    assert stage_slot_wait([]) == 0.0


def test_a_request_the_engine_would_reserve_is_judged_where_reserved_work_starts():
    """Late behind the whole queue but on time behind the replica's reserved work: admitted there, bar or
    not (the bar cuts the fill, not the reservation). Without a reservation in the report, or behind
    too much reserved work, it is rejected as before."""
    req = tight(deadline=4.5)  # 2.05 s of work: on time if it starts within ~2.4 s
    full = dict(running=8, waiting=8, queue_delay_s=9.0, admission_priority=1e9)
    p = place(req, [replica("a", **full, reserved_waiting=1, yieldable=0)], now=0.0)  # 2 turns: 2 s
    assert p.replica == 0 and p.reason.startswith("admitted ahead of the queue")
    assert place(req, [replica("a", **full)], now=0.0).replica is None
    assert place(req, [replica("a", **full, reserved_waiting=4, yieldable=0)], now=0.0).replica is None
    # work that is on time behind the queue is not reserved: the bar and how long it may wait unstarted
    # decide, as before. A loose stream may wait its waiting_time (5 s, against 9 s of queue): turned
    # away; loose deadline work may wait for its deadline (60 s): queued.
    stream = NewRequest("s", SLO.latency(ttft=60.0, tbt=None), arrival=0.0, input_len=200, max_tokens=40)
    p = place(stream, [replica("a", **full, reserved_waiting=0, yieldable=0)], now=0.0)
    assert p.replica is None and p.reason.startswith("rejected: below every replica's admission bar")
    p = place(tight(deadline=60.0), [replica("a", **full, reserved_waiting=0, yieldable=0)], now=0.0)
    assert p.replica == 0 and p.reason.startswith("queued: below every replica's admission bar")


def test_a_replica_reports_the_prompt_tokens_its_batch_has_yet_to_compute():
    """What `analyze` counts as a request's prefill left, summed over the batch (vLLM's running list,
    whose prefills go before a newcomer's): a half-done prompt's rest, a rescheduled preempted request's
    recompute (prompt plus what it generated), nothing for one decoding. A waiting request is not
    counted: the queue delay covers it, and GMAX may start a newcomer ahead of it."""
    from jitserve.scheduler.gmax import EngineSpeed
    from jitserve.scheduler.placement import replica_load
    from jitserve.scheduler.requests import RequestTable

    table = RequestTable()
    for rid, input_len in (("prefilling", 1000), ("decoding", 500), ("resumed", 300), ("waiting", 5000)):
        table.add(NewRequest(rid, SLO.deadline_slo(10.0), arrival=0.0, input_len=input_len, max_tokens=40))
    for rid in ("prefilling", "decoding", "resumed"):
        table.set_running(rid, True)
    table.progress("prefilling", 0, 400)
    table.progress("decoding", 20, 520)
    table.progress("resumed", 10, 0)  # preempted earlier, its KV dropped: prompt and replies again
    speed = EngineSpeed(step_time=0.05, prefill_tokens_per_s=4000.0)
    load = replica_load(table, 0.0, speed, batch_size=8, cutoff=0.95, running=3, waiting=1)
    assert load.pending_prefill_tokens == 600 + 0 + 310


def test_no_reply_shorter_than_the_request_allows_is_hoped_for():
    """The fallbacks "on time with half its bound" and "on time with a one-token reply" assume the reply
    can end early. A request whose body holds vLLM back (min_tokens; ignore_eos, its reply exactly
    max_tokens) is judged by the shortest reply it allows: turned away at once, with the reason, where the
    engine would only drop it later (docs/decisions/core.md, "A reply no shorter than the request allows")."""
    half = replica("a", running=4)  # half full: busy
    idle = replica("b")
    # 40 bound tokens at 50 ms: a 1.2 s deadline fits ~23 tokens, 1.0 s ~19
    assert place(tight(deadline=1.2), [half], now=0.0).replica == 0  # half its bound (20) is on time
    exact = NewRequest("x", SLO.deadline_slo(1.2), arrival=0.0, input_len=200, max_tokens=40, min_len=40)
    p = place(exact, [half, idle], now=0.0)
    assert p.replica is None and p.rejection is Rejection.NO_TIME
    assert p.reason == "no replica can meet the SLO, even with the shortest reply it allows (40 tokens)"
    # a floor under half the bound leaves that fallback as it was
    twenty = NewRequest("y", SLO.deadline_slo(1.2), arrival=0.0, input_len=200, max_tokens=40, min_len=20)
    assert place(twenty, [half], now=0.0).replica == 0
    # the one-token fallback (an idle replica takes a 1.0 s request only if its reply ends early) stops
    # at the floor: 15 tokens fit, 25 do not
    for floor, placed in ((15, True), (25, False)):
        req = NewRequest("z", SLO.deadline_slo(1.0), arrival=0.0, input_len=200, max_tokens=40, min_len=floor)
        assert (place(req, [idle], now=0.0).replica == 0) is placed
    assert place(tight(deadline=1.0), [idle], now=0.0).replica == 0
