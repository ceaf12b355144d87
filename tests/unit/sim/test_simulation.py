"""End to end: every policy runs, results are deterministic, goodput goes through the core.

Nothing is mocked. One test wraps the simulated engine's `Engine.add` with monkeypatch only to record the
requests the simulator releases (the engine itself runs unchanged), since the simulator has no hook that
hands them out."""

from __future__ import annotations

import json

import numpy as np
import pytest

from jitserve.scheduler.goodput import request_goodput
from jitserve.scheduler.placement import Rejection, ShortReplyRule
from jitserve.scheduler.slo import SLOType
from jitserve.sim.metrics import program_result, report
from jitserve.sim.policies import POLICIES
from jitserve.sim.predictor import ConditionalBounds
from jitserve.sim.profiles import load_profile
from jitserve.sim.runner import RunConfig, compare
from jitserve.sim.simulator import simulate
from jitserve.sim.workload import generate, load_workload

SMALL = RunConfig(rate_per_replica=1.5, replicas=1, duration_s=40.0, predictor="conditional", drain_s=200.0)


@pytest.fixture(scope="module")
def spec():  # type: ignore[no-untyped-def]
    return load_workload("paper-mix")


def test_every_policy_runs_on_the_same_arrivals(spec) -> None:  # type: ignore[no-untyped-def]
    reports = compare(spec, list(POLICIES), SMALL)
    counts = {r.requests for r in reports.values()}
    assert len(counts) == 1 and counts.pop() > 20
    for name, r in reports.items():
        assert np.isfinite(r.token_goodput) and r.token_goodput >= 0, name
        assert 0 <= r.token_attainment <= 1 + 1e-9, name


def test_same_seed_same_numbers(spec) -> None:  # type: ignore[no-untyped-def]
    a = compare(spec, ["jitserve", "ltr"], SMALL)
    b = compare(spec, ["jitserve", "ltr"], SMALL)
    strip = lambda rs: {k: {f: v for f, v in r.to_json().items() if f != "wall_s"} for k, r in rs.items()}  # noqa: E731
    assert json.dumps(strip(a), sort_keys=True) == json.dumps(strip(b), sort_keys=True)
    c = compare(
        spec,
        ["jitserve"],
        RunConfig(**{**SMALL.__dict__})
        if False
        else RunConfig(
            rate_per_replica=1.5, replicas=1, duration_s=40.0, predictor="conditional", drain_s=200.0, seed=99
        ),
    )
    assert (
        c["jitserve"].requests != a["jitserve"].requests
        or c["jitserve"].token_goodput != a["jitserve"].token_goodput
    )


def test_report_goodput_is_the_cores_goodput(spec) -> None:  # type: ignore[no-untyped-def]
    progs = generate(spec, rate=1.0, replicas=1, duration_s=30.0)
    out = simulate(progs, "sarathi", load_profile("llama-3.1-8b-a100"), 1, ConditionalBounds(), 30.0)
    rep = report(out)
    total = 0.0
    for st in out.programs:
        g = program_result(st)
        if st.program.slo_type is not SLOType.COMPOUND and st.records:
            assert g == request_goodput(st.records[0])
        total += g.tokens
    assert rep.token_goodput_total == pytest.approx(total)
    # every call of every finished program produced exactly its true length
    for st in out.programs:
        if st.finish is not None:
            assert sorted(r.output_len for r in st.records) == sorted(c.output_len for c in st.program.calls)


@pytest.mark.parametrize("placement", ["round-robin", "least-load", "power-of-two", "power-of-k"])
def test_placements_spread_work_over_replicas(spec, placement: str) -> None:  # type: ignore[no-untyped-def]
    progs = generate(spec, rate=1.0, replicas=3, duration_s=20.0)
    out = simulate(
        progs,
        "jitserve",
        load_profile("llama-3.1-8b-a100"),
        3,
        ConditionalBounds(),
        20.0,
        placement=placement,
    )
    busy = [e.stats.decode_tokens for e in out.engines]
    assert sum(1 for b in busy if b > 0) >= 2


def test_workload_matches_its_table(spec) -> None:  # type: ignore[no-untyped-def]
    progs = generate(spec, rate=5.0, replicas=1, duration_s=2000.0)
    types = [p.slo_type for p in progs]
    for t in (SLOType.LATENCY, SLOType.DEADLINE, SLOType.COMPOUND):
        assert types.count(t) / len(types) == pytest.approx(1 / 3, abs=0.03)
    chat_out = [p.calls[0].output_len for p in progs if p.app == 0 and p.slo_type is not SLOType.COMPOUND]
    assert np.percentile(chat_out, 50) == pytest.approx(225, rel=0.15)  # Table 2: P50 225
    assert np.percentile(chat_out, 95) == pytest.approx(1024, rel=0.2)  # Table 2: P95 1024


def test_conditional_bounds_cover_and_tighten() -> None:
    rng = np.random.default_rng(1)
    mu, sigma = 5.0, 0.8
    true = np.exp(mu + sigma * rng.standard_normal(20_000))
    feats = np.tile([mu, sigma, 100, 1, 0, 1e6], (true.size, 1))
    b = ConditionalBounds(quantile=0.9)
    ub0 = b.bounds(feats, np.zeros(true.size, np.int64))
    assert np.mean(true <= ub0) == pytest.approx(0.9, abs=0.01)
    g = np.full(true.size, 200)
    ub = b.bounds(feats, g)
    assert np.all(ub >= 201)


def test_router_admission_rejects_only_under_jitserve_and_by_its_rule(spec) -> None:  # type: ignore[no-untyped-def]
    import dataclasses

    from jitserve.sim import policies

    cfg = RunConfig(rate_per_replica=3.5, replicas=1, duration_s=60.0, predictor="conditional", drain_s=200.0)
    on = compare(spec, ["jitserve", "sarathi"], cfg)
    off = compare(spec, ["jitserve"], dataclasses.replace(cfg, router_admission=False))["jitserve"]
    assert on["jitserve"].rejected > 0  # overloaded: place() finds requests nobody can serve on time
    assert off.rejected == 0 and on["sarathi"].rejected == 0
    # each rejected call is counted under its type and the rule that turned it away (a program counts once
    # in `rejected`, each of its rejected calls once here)
    by_rule = on["jitserve"].rejections_by_rule
    assert sum(by_rule.values()) >= on["jitserve"].rejected
    rules = {r.value for r in Rejection}
    types = {t.value for t in spec.mix}
    assert all(k.split(": ")[0] in types and k.split(": ")[1] in rules for k in by_rule), by_rule
    assert off.rejections_by_rule == {} and on["sarathi"].rejections_by_rule == {}
    policies.FACTORIES["_bound"] = lambda ctx: dataclasses.replace(
        policies._jitserve(ctx, False), short_reply=ShortReplyRule.BOUND
    )
    try:
        bound = compare(spec, ["_bound"], cfg)["_bound"]
    finally:
        del policies.FACTORIES["_bound"]
    # admission by the length bound also rejects what only a shorter-than-bound reply would save; place()
    # does so too on a replica with a queue, which under this overload is every one: more programs are
    # turned away (per call the counts depend on how far each program got, so programs are compared)
    assert bound.rejected > on["jitserve"].rejected
    assert any(k.endswith(": busy_short_reply") for k in bound.rejections_by_rule)


def test_overload_downgrade_serves_what_admission_would_reject(spec) -> None:  # type: ignore[no-untyped-def]
    """`overload: downgrade` (the router's `decide()`): what JITServe's admission rejects runs as
    best-effort instead; it is still scored against its own SLO, so it earns goodput only if on time."""
    cfg = RunConfig(rate_per_replica=3.5, replicas=1, duration_s=60.0, predictor="conditional", drain_s=200.0)
    runs = compare(spec, ["jitserve", "jitserve-downgrade"], cfg)
    reject, downgrade = runs["jitserve"], runs["jitserve-downgrade"]
    assert reject.rejected > 0
    assert downgrade.rejected == 0  # a best-effort request is never infeasible, so always placed
    assert downgrade.requests == reject.requests
    # the downgraded requests do run: more output than the run that turned them away (in all: the run with
    # more work may take longer to drain, so not necessarily per second)
    assert downgrade.output_tokens > reject.output_tokens


def test_a_compound_call_is_priced_as_the_router_prices_it(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The simulated router gives each call of a compound stage the program goodput the real router's
    `ProgramTracker` gives it (`stage_stake` with the call's own prompt, undivided: losing any call of a
    stage loses the program). Parallel calls with different prompts carry different stakes.

    No mock: the simulated engine runs as it is; `Engine.add` is only wrapped (monkeypatch) to record the
    request it receives, since the simulator keeps no log of what it sent. The router part is the real
    `ProgramTracker`, without HTTP (its pricing needs none)."""
    from jitserve.router.programs import ProgramTracker
    from jitserve.scheduler.goodput import RequestRecord
    from jitserve.scheduler.slo import SLO
    from jitserve.sim.engine import Engine
    from jitserve.sim.workload import Call, Program, Stage

    slo = SLO.compound(stages=2, per_stage=60.0)
    prog = Program(
        pid=0,
        app=0,
        slo=slo,
        arrival=0.0,
        stages=[Stage([Call(100, 20), Call(300, 30)]), Stage([Call(50, 10)])],
        max_tokens=64,
        expected_stages=2.0,
    )
    sent: dict[str, float] = {}
    add = Engine.add

    def record(self, req, info, now):  # type: ignore[no-untyped-def]
        sent[req.request_id] = req.program_goodput
        add(self, req, info, now)

    monkeypatch.setattr(Engine, "add", record)
    simulate([prog], "jitserve", load_profile("llama-3.1-8b-a100"), 1, ConditionalBounds(), 120.0)
    assert set(sent) == {"0.0.0", "0.0.1", "0.1.0"}  # every call reached an engine

    # the real router, fed the same calls in the same order (the client says the program has 2 stages)
    tracker = ProgramTracker(store=None)
    first = [
        tracker.begin_stage("p", "c", slo, 0.0, 2, None, input_len=c.input_len) for c in prog.stages[0].calls
    ]
    for c in prog.stages[0].calls:
        tokens = [1.0 + i * 0.01 for i in range(c.output_len)]
        tracker.end_call("p", RequestRecord(slo, 0.0, c.input_len, tokens, finish=tokens[-1]))
    second = tracker.begin_stage("p", "c", slo, 3.0, 2, None, input_len=50)

    assert sent["0.0.0"] == pytest.approx(first[0].program_goodput)
    assert sent["0.0.1"] == pytest.approx(first[1].program_goodput)
    assert sent["0.0.1"] == pytest.approx(3 * sent["0.0.0"]) and sent["0.0.0"] > 0  # own prompt, not a share
    assert sent["0.1.0"] == pytest.approx(second.program_goodput) and second.program_goodput > 0
