"""The router's pure decision functions, without a server: stale-state fallback, admission with
downgrade, compound sub-deadlines, goodput windows, keys, request parsing, class tables."""

from __future__ import annotations

import json

import numpy as np
import pytest
from replica_states import idle_state, loaded_state

from jitserve.router.accounting import Accounting
from jitserve.router.auth import Keyring, keys_from_secret_data, parse_keys
from jitserve.router.errors import RouterError
from jitserve.router.inbound import parse_inbound
from jitserve.router.programs import ProgramTracker
from jitserve.router.replicas import Defaults, Health, Replica, effective_state
from jitserve.scheduler.admission import Action, decide
from jitserve.scheduler.analyzer.patterns import PatternStore
from jitserve.scheduler.contracts.classes_configmap import snapshot_from_data
from jitserve.scheduler.goodput import RequestRecord
from jitserve.scheduler.placement import Rejection, ReplicaState
from jitserve.scheduler.requests import NewRequest
from jitserve.scheduler.slo import PAPER_CLASSES, SLO, OverloadAction, SLOClassSpec

DEFAULTS = Defaults(stale_after_s=2.0)


def replica(state: dict | None, at: float, inflight: int = 0) -> Replica:
    r = Replica("p", "http://p", ReplicaState.model_validate(state) if state else None, at, frozenset({"m"}))
    r.healthy, r.inflight = True, inflight
    return r


def test_fresh_state_counts_requests_sent_since_the_report() -> None:
    r = replica(idle_state("p", running=7), at=100.0)
    r.sent_since_state = 3  # one fills the last slot, two queue behind a full batch
    s = effective_state(r, 0.0, 100.5, DEFAULTS)
    assert s is not None and s.waiting == 3 and s.queue_delay_s > 0
    assert r.health(100.5, 2.0) is Health.FRESH


def test_requests_sent_past_a_full_report_wait_one_slot_turn_each() -> None:
    """Continuous batching frees a slot whenever one running request ends, so each request the router
    sent past a full replica's report waits one more turn: the report's own queue delay over the
    requests it counts. It used to wait a whole batch of `assumed_output_tokens` (128 steps, 27 s at
    this machine's 213 ms steps for the stacks benchmark's 10-40-token jobs), which rejected every SLO
    request until the next report (docs/decisions/router.md, "Requests sent since the report")."""
    full = idle_state("p", running=8, waiting=3, queue_delay_s=2.0)  # 4 counted ahead: a turn is 0.5 s
    for sent in (1, 3):
        r = replica(full, at=100.0)
        r.sent_since_state = sent
        s = effective_state(r, 0.0, 100.2, DEFAULTS)
        assert s is not None and s.queue_delay_s == pytest.approx(2.0 + 0.5 * sent)
    # a report with free slots: the sends fill them first, then each queues for the assumed turn
    r = replica(idle_state("p", running=6), at=100.0)
    r.sent_since_state = 4
    s = effective_state(r, 0.0, 100.2, DEFAULTS)
    turn = DEFAULTS.assumed_output_tokens * 0.05 / 8
    assert s is not None and s.queue_delay_s == pytest.approx(2 * turn)


def test_requests_sent_past_a_full_report_count_as_reserved_work_waiting() -> None:
    """A just-in-time engine reports the reserved requests still waiting for a slot; what the router sent
    since, beyond the report's free slots, may all be reserved there too, so placement counts it."""
    reserving = idle_state("p", running=6, reserved_waiting=0, yieldable=2)
    r = replica(reserving, at=100.0)
    r.sent_since_state = 5  # two fill the free slots, three queue
    s = effective_state(r, 0.0, 100.2, DEFAULTS)
    assert s is not None and (s.reserved_waiting, s.yieldable) == (3, 2)
    r = replica(idle_state("p", running=6), at=100.0)  # no reservation reported: none invented
    r.sent_since_state = 5
    s = effective_state(r, 0.0, 100.2, DEFAULTS)
    assert s is not None and s.reserved_waiting is None


def test_prompts_sent_since_the_report_count_as_prefill_ahead() -> None:
    """The report's pending prefill predates what the router sent since: placement must see those
    prompts too, or a burst of long prompts all lands on the replica that reported none."""
    r = replica(idle_state("p", running=2, pending_prefill_tokens=1000), at=100.0)
    r.sent_since_state, r.prompt_tokens_since_state = 2, 6000
    s = effective_state(r, 0.0, 100.2, DEFAULTS)
    assert s is not None and s.pending_prefill_tokens == 7000
    assert s.prefill_wait_s() == pytest.approx(7000 / s.prefill_tokens_per_s)


def test_engines_that_report_nothing_queue_one_turn_per_request_ahead() -> None:
    r = replica(None, at=-np.inf, inflight=DEFAULTS.batch_size + 2)  # two wait: a newcomer is third
    s = effective_state(r, 0.0, 5.0, DEFAULTS)
    turn = DEFAULTS.assumed_output_tokens * DEFAULTS.step_time_s / DEFAULTS.batch_size
    assert s is not None and s.queue_delay_s == pytest.approx(3 * turn)


def test_stale_state_falls_back_to_last_speeds_and_router_in_flight_counts() -> None:
    r = replica(loaded_state("p", step_time_s=0.07), at=100.0, inflight=2)
    s = effective_state(r, 0.0, 110.0, DEFAULTS)  # 10 s old: the pod's own load figures are not trusted
    assert r.health(110.0, 2.0) is Health.STALE
    assert s is not None and s.step_time_s == 0.07 and s.running == 2 and s.waiting == 0
    assert s.queue_delay_s == 0 and s.admission_priority == 0


def test_engines_without_state_use_defaults_and_down_ones_are_excluded() -> None:
    r = replica(None, at=-np.inf, inflight=10)
    s = effective_state(r, 0.0, 5.0, DEFAULTS)
    assert s is not None and s.step_time_s == DEFAULTS.step_time_s and s.waiting == 10 - DEFAULTS.batch_size
    r.down = True
    assert effective_state(r, 0.0, 5.0, DEFAULTS) is None
    pending = Replica("q", "http://q")
    assert effective_state(pending, 0.0, 5.0, DEFAULTS) is None


def request(slo: SLO, max_tokens: int = 50) -> NewRequest:
    return NewRequest("r1", slo, arrival=0.0, input_len=100, max_tokens=max_tokens)


def test_admission_places_rejects_or_downgrades() -> None:
    busy = ReplicaState.model_validate(loaded_state("a", queue_delay_s=30))
    idle = ReplicaState.model_validate(idle_state("b"))
    tight = request(SLO.deadline_slo(deadline=5))
    d = decide(tight, "deadline", OverloadAction.REJECT, PAPER_CLASSES, [busy, idle], now=0.0)
    assert d.action is Action.ADMIT and d.replica == 1 and d.rejection is None
    d = decide(tight, "deadline", OverloadAction.REJECT, PAPER_CLASSES, [busy, busy], now=0.0)
    assert d.action is Action.REJECT and d.replica is None and d.retry_after_s == 30
    assert d.rejection is Rejection.NO_TIME  # late behind 30 s on both, even with a one-token reply
    d = decide(tight, "deadline", OverloadAction.DOWNGRADE, PAPER_CLASSES, [busy, busy], now=0.0)
    # as best-effort it would still queue behind 30 s of work, past its 5 s waiting_time: rejected
    assert d.action is Action.REJECT and d.replica is None
    # behind a 4 s queue the deadline is still out of reach, but best-effort work can start in time
    shorter = ReplicaState.model_validate(loaded_state("a", queue_delay_s=4))
    d = decide(tight, "deadline", OverloadAction.REJECT, PAPER_CLASSES, [shorter], now=0.0)
    assert d.action is Action.REJECT
    d = decide(tight, "deadline", OverloadAction.DOWNGRADE, PAPER_CLASSES, [shorter], now=0.0)
    assert d.action is Action.DOWNGRADE and d.slo_class == "best-effort"
    assert d.request.slo.type.value == "best-effort" and d.request.slo.waiting_time == tight.slo.waiting_time


def test_program_sub_deadlines_without_history_split_the_budget_and_never_lag() -> None:
    tracker = ProgramTracker(store=PatternStore())
    slo = SLO.compound(stages=4, per_stage=10)  # D = 40 s
    p0 = tracker.begin_stage("p", "compound", slo, now=0.0, stages_hint=4, per_stage=None, input_len=10)
    assert (p0.stage, p0.deadline_abs, p0.program_deadline_abs) == (0, 10.0, 40.0)
    assert p0.program_goodput == 3 * 10  # nothing finished: each later stage is expected to earn a prompt
    tracker.end_call("p", RequestRecord(slo, 0.0, 10, [1.0] * 5, finish=1.0), "m", started=0.0)
    p1 = tracker.begin_stage("p", "compound", slo, now=25.0, stages_hint=4, per_stage=None)
    # uniform phi says 20 s, already past: the stage gets an even share of the 15 s left instead
    assert p1.stage == 1 and p1.deadline_abs == pytest.approx(25.0 + 15.0 / 3)
    # stage 0's 10 prompt + 5 output tokens ride on it, and the two stages after it are expected to earn
    # as much each: a program that misses loses them all ("A stage carries its program's stake")
    assert p1.program_goodput == 15 + 2 * 15


def test_a_program_budgets_its_later_stages_waits_for_a_slot() -> None:
    """With replicas reporting a 4 s wait for a slot, the first of four stages (D = 40 s) ends before its
    uniform 10 s: three later stages' waits come out first. The last stage waits for no stage after it."""
    tracker = ProgramTracker(store=PatternStore())
    slo = SLO.compound(stages=4, per_stage=10)
    p0 = tracker.begin_stage("p", "compound", slo, 0.0, 4, None, input_len=10, slot_wait_s=4.0)
    assert p0.deadline_abs == pytest.approx(10.0 * (40.0 - 3 * 4.0) / 40.0)
    for _ in range(1, 4):
        tracker.end_call("p", RequestRecord(slo, 0.0, 10, [1.0], finish=1.0), "m", started=0.0)
        last = tracker.begin_stage("p", "compound", slo, 30.0, 4, None, input_len=10, slot_wait_s=4.0)
    assert last.stage == 3 and last.deadline_abs == 40.0


def test_a_deadline_too_small_for_the_clock_still_plans_a_stage() -> None:
    """A valid but tiny program deadline (1e-20 s) vanishes when added to a large clock reading; the
    pattern store must still get the program's positive budget, not the difference of absolute times
    (0.0, a ValueError and a 500 before; found by the fuzz test)."""
    tracker = ProgramTracker(store=PatternStore())
    slo = SLO.compound(stages=1, per_stage=1e-20)
    first = tracker.begin_stage("p", "compound", slo, now=1.0e6, stages_hint=1, per_stage=None)
    assert first.stage == 0 and first.deadline_abs <= first.program_deadline_abs == 1.0e6
    done = RequestRecord(slo, 1.0e6, 10, [1.0e6 + 1.0], finish=1.0e6 + 1.0)
    tracker.end_call("p", done, "m", started=1.0e6)
    later = tracker.begin_stage("p", "compound", slo, now=1.0e6 + 2.0, stages_hint=None, per_stage=None)
    assert later.stage == 1 and later.program_deadline_abs == 1.0e6


def test_parallel_calls_share_a_stage_and_per_stage_classes_grow_the_deadline() -> None:
    tracker = ProgramTracker(store=None)
    slo = SLO.compound(stages=1, per_stage=10)
    a = tracker.begin_stage("p", "c", slo, now=0.0, stages_hint=None, per_stage=10.0)
    b = tracker.begin_stage("p", "c", slo, now=0.5, stages_hint=None, per_stage=10.0)
    assert a.stage == b.stage == 0
    for _ in range(2):
        tracker.end_call("p", RequestRecord(slo, 0.0, 1, [2.0], finish=2.0))
    c = tracker.begin_stage("p", "c", slo, now=3.0, stages_hint=None, per_stage=10.0)
    assert c.stage == 1 and c.program_deadline_abs == 20.0 and c.deadline_abs == 20.0


def test_programs_end_when_idle_and_count_compound_goodput_once() -> None:
    done = []
    tracker = ProgramTracker(idle_timeout=5.0, on_finish=lambda prog, g: done.append((prog.program_id, g)))
    slo = SLO.compound(stages=1, per_stage=10)
    tracker.begin_stage("p", "c", slo, now=0.0, stages_hint=None, per_stage=None)
    tracker.end_call("p", RequestRecord(slo, 0.0, 4, [1.0, 2.0], finish=2.0))
    assert tracker.expire(4.0, force=True) == 0
    assert tracker.expire(8.0, force=True) == 1 and len(tracker) == 0
    assert done[0][0] == "p" and done[0][1].tokens == 6 and done[0][1].met


def test_program_memory_is_bounded() -> None:
    tracker = ProgramTracker(max_programs=3)
    slo = SLO.compound(stages=1, per_stage=10)
    for i in range(10):
        tracker.begin_stage(f"p{i}", "c", slo, now=float(i), stages_hint=None, per_stage=None)
    assert len(tracker) == 3 and tracker.get("p9") is not None and tracker.get("p0") is None


def test_goodput_window_and_attainment() -> None:
    acc = Accounting(window_s=10)
    slo = SLO.latency(ttft=1.0, tbt=0.5)
    acc.record("chat", RequestRecord(slo, 0.0, 3, [0.5, 1.0, 1.5], finish=1.5), now=2.0)  # on time
    acc.record("chat", RequestRecord(slo, 0.0, 3, [3.0, 3.1], finish=3.1), now=3.0)  # first token late
    st = acc.status(now=5.0)["chat"]
    assert st["finished"] == 2 and st["attainment"] == 0.5 and st["goodput"] == pytest.approx(3 / 10)
    later = acc.status(now=100.0)["chat"]  # the window moved on; totals remain
    assert later["finished"] == 0 and later["attainment"] is None and later["finished_total"] == 2


def test_api_keys_file_and_secret_formats() -> None:
    keys = parse_keys("sk-1 alice\n\n# comment\nsk-2   # no tenant\n", "f")
    assert keys == {"sk-1": "alice", "sk-2": "default"}
    with pytest.raises(ValueError, match="f:1"):
        parse_keys("a b c", "f")
    assert keys_from_secret_data({"api-keys": "k1 t1", "extra": "k2 t2"}, "s") == {"k1": "t1", "k2": "t2"}
    ring = Keyring(keys)
    assert ring.tenant("Bearer sk-1") == "alice"
    with pytest.raises(RouterError) as err:
        ring.tenant("Bearer sk-3")
    assert err.value.status == 401
    assert Keyring().tenant(None) == "default"  # no keys configured: auth off
    locked = Keyring()
    locked.replace({})  # a Secret with no keys locks the router rather than opening it
    with pytest.raises(RouterError):
        locked.tenant("Bearer anything")


def test_request_parsing_estimates_and_strips() -> None:
    body = {"model": "m", "prompt": [1, 2, 3, 4], "max_tokens": 9, "program_id": 17, "slo_class": "x"}
    inbound = parse_inbound("completion", body, {"x-slo-deadline": "4", "x-program-stages": "3"})
    assert inbound.input_len == 4 and inbound.max_tokens == 9 and inbound.program_id == "17"
    assert inbound.program_stages == 3 and inbound.slo_fields == {"slo_class": "x", "deadline": "4"}
    assert "program_id" not in inbound.body and "slo_class" not in inbound.body
    with pytest.raises(RouterError) as err:
        parse_inbound("completion", {"model": "m", "prompt": [True]}, {})
    assert err.value.param == "prompt"


def test_configmap_tables_validate_and_name_the_problem() -> None:
    good = {"classes.json": json.dumps({"a": {"type": "deadline", "deadlineSeconds": 3}})}
    table = snapshot_from_data(good, "cm")
    assert table.classes["a"] == SLOClassSpec(type="deadline", deadlineSeconds=3) and table.default is None
    with pytest.raises(ValueError, match="class 'a': ttftSeconds"):
        snapshot_from_data({"classes.json": json.dumps({"a": {"type": "latency", "ttftSeconds": -1}})}, "cm")
    with pytest.raises(ValueError, match="default class 'zz'"):
        snapshot_from_data({**good, "default": "zz"}, "cm")


def test_length_bounds_start_at_max_tokens_and_learn_from_finished_requests() -> None:
    import asyncio

    from jitserve.router.analysis import LengthBounds
    from jitserve.scheduler.analyzer.length import LengthPredictorConfig
    from jitserve.scheduler.slo import SLOType

    cfg = LengthPredictorConfig(n_estimators=10, min_samples_leaf=5, min_history_requests=40)
    bounds = LengthBounds(True, cfg, min_refit_interval_s=0.0)

    async def run() -> int:
        assert bounds.bound(30, SLOType.DEADLINE, "jobs", "m", 1000) == 1000  # nothing learned yet
        for i in range(40):  # short answers (10-29 tokens) to prompts of ~30 tokens
            bounds.observe(30, 10 + i % 20, SLOType.DEADLINE, "jobs", "m", 1000)
        while bounds.fitting:  # the fit runs in a child process
            await asyncio.sleep(0.01)
        return bounds.bound(30, SLOType.DEADLINE, "jobs", "m", 1000)

    learned = asyncio.run(run())
    bounds.close()
    assert 20 <= learned < 1000  # a 90% bound near the observed lengths, far below max_tokens
    assert (
        LengthBounds(False).bound(30, SLOType.DEADLINE, "jobs", "m", 77) == 77
    )  # --length-predictor max-tokens


def test_slo_resolution_is_cached_per_class_table_and_follows_a_swap() -> None:
    from jitserve.router.classes import ClassRegistry
    from jitserve.router.resolution import Resolver

    classes = {
        "a": {"type": "deadline", "deadlineSeconds": 3, "default": True},
        "s": {"type": "compound", "deadlineSeconds": 2, "perStage": True},
    }
    first = snapshot_from_data({"classes.json": json.dumps(classes)}, "1")
    registry = ClassRegistry(first)

    def router() -> Resolver:
        return Resolver(registry)

    cached = router()

    def resolve(r: Resolver, body: dict) -> tuple:
        return r.resolve(parse_inbound("completion", {"model": "m", "prompt": "x", **body}, {}))

    bodies = [{}, {"slo_class": "a"}, {"slo_class": "s"}, {"slo_class": "s", "program_stages": 3}]
    for body in bodies * 2:  # the second pass answers from the cache: the same as a fresh router's answer
        assert resolve(cached, body) == resolve(router(), body)
    assert len(cached.cache) == len(bodies)
    assert resolve(cached, {"slo_class": "a", "deadline": 9})[1].deadline == 9  # explicit numbers: not cached
    assert len(cached.cache) == len(bodies)
    registry.replace(
        snapshot_from_data(
            {"classes.json": json.dumps({"a": {"type": "deadline", "deadlineSeconds": 5}})}, "2"
        )
    )
    assert resolve(cached, {"slo_class": "a"})[1].deadline == 5  # a class edit applies to the next request
    assert resolve(cached, {})[0] == "best-effort"  # no default class any more
    with pytest.raises(RouterError):
        resolve(cached, {"slo_class": "s"})
