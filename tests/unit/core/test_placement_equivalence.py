"""`place()` must decide exactly as the straightforward version did.

`_reference_place` is `place()` as it was before its hot path was made cheap (commit d243811): it builds
a fresh K-row `RequestTable` with one dummy copy of the request per sampled replica and runs GMAX's
`analyze` over it. It stays here as the test's reference only; the production `place()` must return the
same replica, priorities (bit for bit), sampled set and reason on every input. (The busy-replica rule
for short-reply requests, the waiting_time check below every bar, the ranking at the slowest
reported step time and prefill rate, the start of reserved work, the half-bound step of the deployed
short-reply rule, the prompts a replica still has to prefill and a late stage judged by its program's
deadline were added to both later, and the shortest reply a request allows, below which no fallback
goes.)
"""

from __future__ import annotations

import numpy as np
import pytest

from jitserve.scheduler.gmax import EngineSpeed, GMAXParams, analyze
from jitserve.scheduler.placement import Placement, ReplicaState, place
from jitserve.scheduler.requests import NewRequest, RequestTable
from jitserve.scheduler.slo import SLO, GoodputWeights

_TIE_TOLERANCE = 0.02


def _reference_place(
    request: NewRequest,
    replicas: list[ReplicaState],
    now: float,
    k: int | None = None,
    cached_tokens: list[int] | None = None,
    rng: np.random.Generator | None = None,
    params: GMAXParams = GMAXParams(),
) -> Placement:
    m = len(replicas)
    if m == 0:
        return Placement(None, np.zeros(0), np.zeros(0, dtype=np.int64), "no ready replica")
    if k is None or k >= m:
        sampled = np.arange(m)
    else:
        rng = rng or np.random.default_rng()
        sampled = np.sort(rng.choice(m, size=max(k, 1), replace=False))
    n = sampled.size
    table = RequestTable(capacity=n)
    for i in range(n):
        table.add(
            NewRequest(
                request_id=f"{request.request_id}#{i}",
                slo=request.slo,
                arrival=request.arrival,
                input_len=request.input_len,
                max_tokens=request.max_tokens,
                len_ub=request.len_ub,
                min_len=request.min_len,
                true_len=request.true_len,
                deadline_abs=request.deadline_abs,
                program_deadline_abs=request.program_deadline_abs,
                program_goodput=request.program_goodput,
                tenant=request.tenant,
            )
        )
    slots = table.active_slots()
    bound = table.len_ub[slots].copy()
    if cached_tokens is not None:
        cached = np.asarray([cached_tokens[j] for j in sampled], dtype=np.int64)
        table.computed[slots] = np.minimum(cached, request.input_len)
    states = [replicas[j] for j in sampled]
    speed = EngineSpeed(
        step_time=np.asarray([s.step_time_s for s in states]),  # type: ignore[arg-type]
        prefill_tokens_per_s=np.asarray([s.prefill_tokens_per_s for s in states]),  # type: ignore[arg-type]
    )
    # no newcomer starts before the prompts already on the replica are computed
    prefill_wait = np.asarray([s.pending_prefill_tokens / s.prefill_tokens_per_s for s in states])
    delay = np.maximum(np.asarray([s.queue_delay_s for s in states]), prefill_wait)
    # where a request the replica would reserve starts: behind its reserved work still waiting, a slot
    # turn apart, after what can yield (straight from the report's fields)
    reserved = []
    for s in states:
        turns = None if s.reserved_waiting is None else s.reserved_waiting + 1 - (s.yieldable or 0)
        ahead_of = s.running + s.waiting - s.batch_size + 1
        turn = s.queue_delay_s / ahead_of if ahead_of > 0 and s.queue_delay_s > 0 else None
        if turns is None:
            reserved.append(s.queue_delay_s)
        elif turns <= 0:
            reserved.append(0.0)
        elif turn is None:
            reserved.append(s.queue_delay_s)
        else:
            reserved.append(min(turns * turn, s.queue_delay_s))
    reserved_delay = np.maximum(np.asarray(reserved), prefill_wait)
    reserves = np.asarray([s.reserved_waiting is not None for s in states])

    def judge() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        behind = analyze(table, now, speed, params, slots, queue_delay=delay)  # type: ignore[arg-type]
        there = analyze(table, now, speed, params, slots, queue_delay=reserved_delay)  # type: ignore[arg-type]
        ahead = reserves & there.feasible & ~behind.feasible
        return (
            ahead,
            ahead | behind.feasible,
            np.where(ahead, there.priority, behind.priority),
            behind.feasible,
        )

    ahead, feasible_any, an_priority, feasible_behind = judge()
    short_reply = shorter_than_bound = False
    floor = min(request.min_len, int(bound[0]))  # no reply is shorter than the request allows
    if not feasible_any.any() and max(int(bound[0]) // 2, floor) < bound[0]:  # deployed: half the bound first
        table.len_ub[slots] = max(int(bound[0]) // 2, floor)
        ahead, feasible_any, an_priority, feasible_behind = judge()
        shorter_than_bound = bool(feasible_any.any())
    if not feasible_any.any() and floor < table.len_ub[slots[0]]:
        table.len_ub[slots] = floor
        ahead, feasible_any, an_priority, feasible_behind = judge()
        short_reply = shorter_than_bound = True
    behind_share = False
    program_end = request.program_deadline_abs
    if not feasible_any.any() and program_end is not None and program_end > request.due():
        # a compound stage late for its share: judged by its program's deadline, with its whole bound
        table.len_ub[slots] = bound
        table.deadline_abs[slots] = program_end
        ahead, feasible_any, an_priority, feasible_behind = judge()
        behind_share = bool(feasible_any.any())
        short_reply = shorter_than_bound = not behind_share
    # ranked at the slowest reported step time and prefill rate (feasibility above keeps each replica's own)
    slowest = EngineSpeed(
        step_time=np.full(len(states), float(np.max(speed.step_time))),  # type: ignore[arg-type]
        prefill_tokens_per_s=np.full(len(states), float(np.min(speed.prefill_tokens_per_s))),  # type: ignore[arg-type]
    )
    start = np.where(ahead, reserved_delay, delay)
    rank = analyze(table, now, slowest, params, slots, queue_delay=start).priority  # type: ignore[arg-type]
    priority = np.where(feasible_any, an_priority, 0.0)
    if not feasible_any.any():
        reply = "a one-token reply" if floor <= 1 else f"the shortest reply it allows ({floor} tokens)"
        return Placement(None, priority, sampled, f"no replica can meet the SLO, even with {reply}")
    feasible = feasible_any
    if short_reply:  # on time only with under half its bound: only on a replica under B/4
        idle = np.asarray([s.running + s.waiting < 0.25 * s.batch_size for s in states])
        feasible = feasible & idle
        if not feasible.any():
            reason = "rejected: replica busy and the SLO needs a reply shorter than the length bound"
            return Placement(None, priority, sampled, reason)
    has_room = np.asarray([s.running + s.waiting < s.batch_size for s in states])
    bar = np.asarray([s.admission_priority for s in states])
    eligible = feasible & (has_room | (priority >= bar) | ahead)
    if eligible.any():
        score = np.where(eligible, rank, -np.inf)
        reason = "admitted by replica-specific priority"
        if behind_share:
            reason = "admitted: late for its share of the program's deadline, on time for the program"
        elif shorter_than_bound:
            reason = "admitted: on time only if the reply is shorter than its length bound"
        elif not (eligible & feasible_behind).any():
            reason = (
                "admitted ahead of the queue: reserved, it starts in time behind the replica's reserved work"
            )
    else:  # below every bar: only where the queue ahead ends before the request would be dropped
        patience = request.drop_at() - now
        feasible = feasible & (delay < patience)
        if not feasible.any():
            reason = (
                "rejected: below every replica's admission bar, and the queue ahead is longer than it may "
                f"wait unstarted ({patience:.3g} s)"
            )
            return Placement(None, priority, sampled, reason)
        score = np.where(feasible, priority / np.maximum(bar, 1e-12), -np.inf)
        reason = "queued: below every replica's admission bar"
    top = score.max()
    best = np.flatnonzero(score >= top - _TIE_TOLERANCE * abs(top))
    if best.size > 1:
        load = np.asarray([(s.running + s.waiting) / s.batch_size for s in states])
        best = best[np.lexsort((delay[best], load[best]))]
    return Placement(int(sampled[best[0]]), priority, sampled, reason)


def _random_slo(rng: np.random.Generator) -> SLO:
    weights = GoodputWeights(input=float(rng.choice([0.0, 0.5, 1.0])), output=float(rng.choice([1.0, 2.0])))
    kind = rng.integers(5)
    waiting = float(rng.uniform(1, 60))
    if kind == 0:
        return SLO.latency(
            ttft=float(rng.uniform(0.05, 3)),
            tbt=float(rng.uniform(0.01, 0.2)),
            waiting_time=waiting,
            weights=weights,
        )
    if kind == 1:
        return SLO.latency(ttft=float(rng.uniform(0.05, 3)), tbt=None, waiting_time=waiting, weights=weights)
    if kind == 2:
        return SLO.deadline_slo(deadline=float(rng.uniform(0.2, 30)), waiting_time=waiting, weights=weights)
    if kind == 3:
        return SLO.compound(
            stages=int(rng.integers(1, 4)),
            per_stage=float(rng.uniform(0.5, 10)),
            waiting_time=waiting,
            weights=weights,
        )
    return SLO.best_effort(deadline=float(rng.uniform(1, 100)), waiting_time=waiting, weights=weights)


def _random_request(rng: np.random.Generator, i: int) -> NewRequest:
    slo = _random_slo(rng)
    max_tokens = int(rng.integers(1, 2048))
    arrival = float(rng.uniform(0, 5))
    staged = slo.type.value == "compound" and rng.random() < 0.5
    sub = arrival + float(rng.uniform(0.1, 20))
    program_end = sub + float(rng.uniform(0, 60)) if staged and rng.random() < 0.7 else None
    # a third hold vLLM back from ending the reply early (min_tokens; ignore_eos: exactly max_tokens)
    min_len = int(rng.choice([1, 1, rng.integers(1, max_tokens + 1), max_tokens]))
    return NewRequest(
        request_id=f"r{i}",
        slo=slo,
        arrival=arrival,
        input_len=int(rng.integers(0, 4000)),
        max_tokens=max_tokens,
        len_ub=None if rng.random() < 0.3 else int(rng.integers(0, max_tokens + 50)),
        true_len=-1 if rng.random() < 0.5 else int(rng.integers(1, max_tokens + 1)),
        deadline_abs=sub if staged else None,
        program_goodput=float(rng.choice([0.0, rng.uniform(0, 500)])),
        tenant=int(rng.integers(0, 3)),
        program_deadline_abs=program_end,
        min_len=min_len,
    )


def _random_replica(rng: np.random.Generator, i: int, shared: dict | None) -> ReplicaState:
    if shared is not None and rng.random() < 0.5:  # identical speeds and load: near-ties
        return ReplicaState(**{**shared, "pod": f"p{i}"})
    batch = int(rng.integers(1, 33))
    running = int(rng.integers(0, batch + 1))
    return ReplicaState(
        pod=f"p{i}",
        model="m",
        step_time_s=float(rng.uniform(0.005, 0.1)),
        prefill_tokens_per_s=float(rng.uniform(500, 20000)),
        batch_size=batch,
        running=running,
        waiting=int(rng.integers(0, 3 * batch)) if rng.random() < 0.6 else 0,
        committed_bandwidth=float(rng.uniform(0, batch)),
        residual_capacity=float(rng.uniform(-batch, batch)),
        admission_priority=float(rng.choice([0.0, rng.uniform(0, 50), rng.uniform(0, 5000)])),
        queue_delay_s=float(rng.choice([0.0, rng.uniform(0, 3), rng.uniform(0, 40)])),
        kv_usage=float(rng.uniform(0, 1)),
        pending_prefill_tokens=int(rng.choice([0, rng.integers(0, 4000), rng.integers(0, 100_000)])),
        cutoff=0.95,
        frames=int(rng.integers(0, 100)),
        updated_at=0.0,
        **(
            {"reserved_waiting": int(rng.integers(0, 10)), "yieldable": int(rng.integers(0, running + 1))}
            if rng.random() < 0.5
            else {}
        ),
    )


def _case(seed: int):
    rng = np.random.default_rng(seed)
    request = _random_request(rng, seed)
    m = int(rng.integers(1, 9))
    shared = _random_replica(rng, -1, None).model_dump()
    replicas = [_random_replica(rng, i, shared) for i in range(m)]
    k = None if rng.random() < 0.5 else int(rng.integers(1, m + 2))
    cached = None if rng.random() < 0.4 else [int(rng.integers(0, 5000)) for _ in range(m)]
    params = GMAXParams(oracle=bool(rng.random() < 0.2), starvation_delta=float(rng.choice([0.0, 8.0])))
    now = request.arrival + float(rng.choice([0.0, rng.uniform(0, 5), rng.uniform(0, 60)]))
    return request, replicas, now, k, cached, params


def _assert_same(got: Placement, want: Placement) -> None:
    assert got.replica == want.replica
    assert got.reason == want.reason
    assert np.array_equal(got.sampled, want.sampled)
    assert got.priorities.shape == want.priorities.shape
    assert np.array_equal(got.priorities, want.priorities)  # bit for bit: the same formula, same inputs


@pytest.mark.parametrize("block", range(10))
def test_place_matches_the_straightforward_version(block: int) -> None:
    for seed in range(block * 300, (block + 1) * 300):
        request, replicas, now, k, cached, params = _case(seed)
        want = _reference_place(
            request, replicas, now, k=k, cached_tokens=cached, rng=np.random.default_rng(seed), params=params
        )
        got = place(
            request, replicas, now, k=k, cached_tokens=cached, rng=np.random.default_rng(seed), params=params
        )
        _assert_same(got, want)


def test_the_random_cases_reach_every_branch() -> None:
    reasons = set()
    for seed in range(3000):
        request, replicas, now, k, cached, params = _case(seed)
        got = place(
            request, replicas, now, k=k, cached_tokens=cached, rng=np.random.default_rng(seed), params=params
        )
        reasons.add(got.reason.split(" (")[0])  # the branch, without the request's numbers
    assert len(reasons) == 9, reasons


def test_repeated_calls_do_not_leak_state() -> None:
    """A reused scratch state must not carry one call's request (or its one-token retry) into the next."""
    cases = [_case(seed) for seed in range(200)]
    first = [place(r, reps, now, k=None, cached_tokens=c, params=p) for r, reps, now, _k, c, p in cases]
    for (r, reps, now, _k, c, p), got in zip(reversed(cases), reversed(first), strict=True):
        _assert_same(place(r, reps, now, k=None, cached_tokens=c, params=p), got)
        _assert_same(got, _reference_place(r, reps, now, k=None, cached_tokens=c, params=p))
