"""Compound sub-deadlines D_s = phi(s) * D, by hand."""

from __future__ import annotations

import pytest

from jitserve.scheduler.slo import SLO
from jitserve.sim.subdeadlines import SubDeadlines
from jitserve.sim.workload import Call, Program, Stage, load_workload


def _program() -> Program:
    # stage 0: one call, 1000 prompt tokens, 100 output; a 2 s tool; stage 1: two parallel calls
    stages = [
        Stage([Call(1000, 100)], tool_time_s=2.0),
        Stage([Call(500, 300), Call(500, 100)]),
    ]
    return Program(
        0, 0, SLO.compound(stages=2, per_stage=20.0), arrival=10.0, stages=stages, expected_stages=4.0
    )


def test_oracle_phi_from_true_stage_times() -> None:
    sub = SubDeadlines(load_workload("paper-mix"), v_token=0.02, prefill_rate=10_000.0)
    p = _program()
    # stage 0: 1000/10k + 100 * 0.02 = 2.1 s; stage 1: 2 s tool + max(0.05 + 6, 0.05 + 2) = 8.05 s
    t0, t1 = 2.1, 8.05
    assert sub.stage_seconds(p).tolist() == pytest.approx([t0, t1])
    assert sub(p, 0, "oracle", 0.0, 0.0) == pytest.approx(10.0 + 40.0 * t0 / (t0 + t1))
    assert sub(p, 1, "oracle", 0.0, 0.0) == pytest.approx(50.0)


def test_program_mode_and_uniform_stand_in() -> None:
    sub = SubDeadlines(load_workload("paper-mix"), v_token=0.02, prefill_rate=10_000.0)
    p = _program()
    assert sub(p, 0, "program", 0.0, 0.0) == pytest.approx(50.0)
    # no pattern store: a uniform split over the app's expected 4 stages
    assert sub(p, 0, "analyzer", 0.0, 0.0) == pytest.approx(10.0 + 40.0 * 1 / 4)
    assert sub(p, 1, "analyzer", 0.0, 0.0) == pytest.approx(10.0 + 40.0 * 2 / 4)


def test_pattern_store_gives_monotone_deadlines_within_the_program_deadline() -> None:
    pytest.importorskip("jitserve.scheduler.analyzer.patterns")
    from jitserve.sim.workload import generate

    spec = load_workload("paper-mix")
    warm = generate(spec, rate=2.0, replicas=1, seed=5, duration_s=300.0)
    sub = SubDeadlines(spec, v_token=0.02, prefill_rate=10_000.0)
    sub.train(warm)
    for p in [q for q in generate(spec, rate=2.0, replicas=1, seed=6, duration_s=120.0) if len(q.stages) > 2][
        :10
    ]:
        ds = [sub(p, s, "analyzer", 0.0, 0.0) for s in range(len(p.stages))]  # stage releases, in order
        assert all(a <= b + 1e-9 for a, b in zip(ds, ds[1:], strict=False))
        assert p.arrival < ds[0] and ds[-1] <= p.arrival + p.slo.deadline + 1e-9
