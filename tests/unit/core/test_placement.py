"""Power-of-K placement over replica-specific priorities (JITServe §4.3)."""

import numpy as np

from jitserve.scheduler.placement import ReplicaState, place
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


def test_faster_replica_wins_for_the_same_request():
    slow = replica("slow", step_time_s=0.06)
    fast = replica("fast", step_time_s=0.02)
    p = place(tight(), [slow, fast], now=0.0)
    assert p.replica == 1
    assert p.priorities[1] > p.priorities[0]


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


def test_a_short_reply_goes_to_the_idle_replica():
    # the busy replica is faster (higher priority) but the short-reply request goes only where it is idle
    busy = replica("a", running=4, step_time_s=0.03)
    idle = replica("b", running=1)
    assert place(tight(deadline=1.0), [busy, idle], now=0.0).replica == 1
    assert place(tight(deadline=1.0), [idle, busy], now=0.0).replica == 0


def test_a_request_on_time_with_its_bound_ignores_busyness():
    # feasible with the full 40-token bound (3 s deadline): a busy replica with free slots still takes it
    p = place(tight(deadline=3.0), [replica("a", running=6)], now=0.0)
    assert p.replica == 0
    assert p.reason == "admitted by replica-specific priority"


def test_queueing_delay_makes_a_replica_infeasible():
    late = replica("a", queue_delay_s=10.0, running=8, waiting=30)
    p = place(tight(deadline=5.0), [late], now=0.0)
    assert p.replica is None


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
    assert place(tight(), [], now=0.0).replica is None


def test_equal_replicas_share_the_load():
    # identical speeds, all with free slots: the least loaded one wins, not always the first
    busy = replica("a", running=6)
    quiet = replica("b", running=1)
    assert place(tight(), [busy, quiet], now=0.0).replica == 1
    assert place(tight(), [quiet, busy], now=0.0).replica == 0


def test_below_every_bar_queues_only_if_it_can_start_within_its_waiting_time():
    """A full replica whose top-B work outranks the request: it waits behind the queue. A 60 s deadline
    request is feasible even after either queue; whether it may queue
    depends on the queue delay against its waiting_time."""
    slo = SLO.deadline_slo(60.0)
    req = NewRequest("r", slo, arrival=0.0, input_len=200, max_tokens=40)
    short = replica("a", running=8, waiting=4, admission_priority=1e9, queue_delay_s=slo.waiting_time / 2)
    p = place(req, [short], now=0.0)
    assert p.replica == 0
    assert p.reason.startswith("queued: below every replica's admission bar")
    long = replica("a", running=8, waiting=40, admission_priority=1e9, queue_delay_s=slo.waiting_time * 2)
    p = place(req, [long], now=0.0)
    assert p.replica is None
    assert "queue ahead is longer than its waiting_time" in p.reason
    # with the short queue on the other replica, it goes there
    assert place(req, [long, short], now=0.0).replica == 1
    # time already spent (the router saw it late) counts against its waiting_time
    assert place(req, [short], now=slo.waiting_time * 0.6).replica is None


def test_a_busy_replica_measuring_a_short_step_does_not_outrank_an_idle_one():
    """A replica running a few sequences measures a short step; an idle one reports its prior. Scored
    as reported, the busy one always looked faster and took every request until it was full (the
    pile-up of docs/benchmarks/sim.md, "Where JITServe loses")."""
    busy = replica("busy", step_time_s=0.014, running=3)
    idle = replica("idle", step_time_s=0.05)
    p = place(tight(deadline=10.0), [busy, idle], now=0.0)
    assert p.replica == 1  # equal after the floor: the tie goes to the less loaded replica
    assert p.priorities[0] == p.priorities[1]
    # two idle replicas keep their own measured speeds (different hardware is really faster)
    assert (
        place(tight(), [replica("slow", step_time_s=0.06), replica("fast", step_time_s=0.02)], 0.0).replica
        == 1
    )
