"""The per-request placement input (router/pool.py: Pool.candidates): K sampled first, the same
decisions as place() over every replica, stateless engines spread evenly, state updated on events."""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np
from replica_states import MODEL, idle_state, loaded_state

from jitserve.router.config import RouterConfig
from jitserve.router.pool import Pool
from jitserve.router.replicas import Replica
from jitserve.scheduler.placement import ReplicaState, place
from jitserve.scheduler.requests import NewRequest
from jitserve.scheduler.slo import SLO

NOW = [100.0]


def pool_of(states: list[dict | None]) -> Pool:
    pool = Pool(clock=lambda: NOW[0])
    pool.set_targets({f"r{i}": f"http://r{i}" for i in range(len(states))})
    for r, s in zip(pool.replicas.values(), states, strict=True):
        r.healthy, r.models = True, frozenset({MODEL})
        if s is not None:
            r.state, r.state_at = ReplicaState.model_validate(s), NOW[0]
    return pool


def request(i: int, deadline: float = 5.0) -> NewRequest:
    slo = SLO.deadline_slo(deadline=deadline, waiting_time=2.0)
    return NewRequest(f"q{i}", slo, NOW[0], input_len=200, max_tokens=64, len_ub=64)


def test_sampling_k_first_decides_as_place_over_all_replicas() -> None:
    states = [loaded_state(f"r{i}", queue_delay_s=float(i)) if i % 3 else idle_state(f"r{i}", running=i)
              for i in range(12)]  # fmt: skip
    pool = pool_of(states)
    every = [ReplicaState.model_validate(s) for s in states]
    for k in (1, 3, 5, 12, None):
        ours, theirs = np.random.default_rng(7), np.random.default_rng(7)
        for i in range(40):
            reps, sampled = pool.candidates(MODEL, k=k, rng=ours)
            mine = place(request(i), sampled, NOW[0])
            ref = place(request(i), every, NOW[0], k=k, rng=theirs)
            assert len(reps) == min(k or 12, 12)
            # the same replica set and the same choice (ties aside: the order is rotated on purpose)
            assert sorted(r.name for r in reps) == sorted(f"r{j}" for j in ref.sampled)
            if ref.replica is None:
                assert mine.replica is None
            else:
                assert mine.replica is not None
                chosen, best = reps[mine.replica].name, f"r{ref.replica}"
                top = ref.priorities[list(ref.sampled).index(ref.replica)]
                assert chosen == best or np.isclose(mine.priorities[mine.replica], top, rtol=0.02)


def test_stateless_engines_with_nothing_open_take_turns() -> None:
    pool = pool_of([None, None, None])
    chosen = Counter()
    for i in range(300):
        reps, states = pool.candidates(MODEL)
        p = place(request(i, deadline=60.0), states, NOW[0])
        assert p.replica is not None
        chosen[reps[p.replica].name] += 1  # each stream ends before the next arrives: nothing stays open
    assert sorted(chosen.values()) == [100, 100, 100]


def test_dispatches_since_the_report_and_releases_update_the_state_placement_reads() -> None:
    pool = pool_of([idle_state("r0"), None])
    fresh, stateless = pool.replicas["r0"], pool.replicas["r1"]
    view = {r.name: s for r, s in zip(*pool.candidates(MODEL), strict=True)}
    assert view["r0"].waiting == 0 and view["r1"].running == 0
    for r, prompt in ((fresh, 3000), (fresh, 500), (stateless, 100)):
        pool.dispatched(r, prompt)
    view = {r.name: s for r, s in zip(*pool.candidates(MODEL), strict=True)}
    assert view["r0"].waiting == 2 and view["r1"].running == 1
    assert view["r0"].pending_prefill_tokens == 3500  # their prompts, ahead of the next newcomer's
    pool.released(stateless)
    view = {r.name: s for r, s in zip(*pool.candidates(MODEL), strict=True)}
    assert view["r1"].running == 0
    NOW[0] += 10.0  # the report goes stale: the router's own in-flight count (2 open on r0)
    try:
        view = {r.name: s for r, s in zip(*pool.candidates(MODEL), strict=True)}
        assert view["r0"].running == 2 and view["r0"].waiting == 0
    finally:
        NOW[0] -= 10.0


def test_the_model_index_follows_health_and_models() -> None:
    pool = pool_of([idle_state("r0"), idle_state("r1")])
    assert pool.models() == {MODEL} and len(pool.serving(MODEL)) == 2
    pool.replicas["r0"].down = True
    assert [r.name for r in pool.serving(MODEL)] == ["r1"]
    pool.replicas["r1"].models = frozenset({"other"})
    assert pool.serving(MODEL) == [] and pool.models() == {"other"}
    assert pool.candidates(MODEL) == ([], [])
    pool.set_targets({"r9": "http://r9"})  # pending until its first poll
    assert pool.models() == frozenset() and isinstance(pool.replicas["r9"], Replica)


def test_flag_defaults_are_the_configs_own() -> None:
    from jitserve.router.cli import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([])
    config, pool = RouterConfig(), Pool()
    assert args.poll_interval == config.poll_interval_s == pool.poll_interval_s
    assert args.poll_timeout == config.poll_timeout_s == pool.poll_timeout_s
    assert args.down_after == config.down_after == pool.down_after
    assert args.unresponsive_timeout == config.unresponsive_timeout_s == pool.unresponsive_timeout_s
    assert (args.k, args.max_inflight, args.max_retries) == (
        config.k,
        config.max_inflight,
        config.max_retries,
    )
    assert args.stale_after == config.defaults.stale_after_s
    assert args.default_batch_size == config.defaults.batch_size
