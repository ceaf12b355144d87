"""The pure decision core: plans, default classes, conditions and the router report."""

from __future__ import annotations

from typing import Any

from jitserve.operator.children import Images
from jitserve.operator.decisions import (
    Failure,
    Observed,
    choose_default_class,
    parse_router_report,
    plan_pool,
    pool_status,
    transition_events,
)
from jitserve.operator.events import NORMAL, WARNING, Event
from jitserve.operator.models import ServingPoolSpec
from jitserve.scheduler.slo import PAPER_CLASSES

SPEC: dict[str, Any] = {
    "model": {"name": "org/m", "servedName": "m"},
    "replicas": 2,
    "sloClasses": {"allowed": ["latency", "deadline"]},
}
CLASSES = {name: spec.model_dump(mode="json") for name, spec in PAPER_CLASSES.items()}


def plan(spec: dict[str, Any] = SPEC, classes: dict[str, Any] | None = None):  # noqa: ANN201
    classes = CLASSES if classes is None else classes
    allowed = spec["sloClasses"]["allowed"]
    return plan_pool("p", "ns", "uid", spec, {c: classes.get(c) for c in allowed}, Images())


def deployment(
    replicas: int,
    ready: int,
    generation: int = 1,
    observed: int = 1,
    pods: int | None = None,
    conditions: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "replicas": replicas if pods is None else pods,
        "readyReplicas": ready,
        "updatedReplicas": replicas,
        "observedGeneration": observed,
    }
    if conditions is not None:
        status["conditions"] = conditions
    return {"metadata": {"generation": generation}, "spec": {"replicas": replicas}, "status": status}


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_missing_classes_block_the_plan_and_are_named() -> None:
    p = plan({**SPEC, "sloClasses": {"allowed": ["latency", "gold", "silver"]}})
    assert p.pool is None and p.problem is not None
    assert p.problem.reason == "SLOClassNotFound"
    assert "gold, silver" in p.problem.message and "latency" not in p.problem.message
    status = pool_status(p, Observed(), 3, None, "T0")
    assert conditions(status) == {
        "Ready": ("False", "SLOClassNotFound"),
        "Progressing": ("False", "Blocked"),
        "Degraded": ("True", "SLOClassNotFound"),
    }
    assert status["observedGeneration"] == 3 and "endpoint" not in status


def test_invalid_spec_and_invalid_class_are_reported() -> None:
    bad = plan({**SPEC, "replicas": -3})
    assert (
        bad.problem is not None and bad.problem.reason == "InvalidSpec" and "replicas" in bad.problem.message
    )
    broken = plan(classes={**CLASSES, "latency": {"type": "latency"}})
    assert broken.problem is not None and broken.problem.reason == "InvalidSLOClass"
    assert "latency" in broken.problem.message


def test_default_class_rules() -> None:
    spec = ServingPoolSpec.model_validate(SPEC)
    assert choose_default_class(spec, PAPER_CLASSES) == "latency"  # first allowed
    marked = ServingPoolSpec.model_validate({**SPEC, "sloClasses": {"allowed": ["latency", "best-effort"]}})
    assert choose_default_class(marked, PAPER_CLASSES) == "best-effort"  # marked default: true
    explicit = ServingPoolSpec.model_validate(
        {**SPEC, "sloClasses": {"allowed": ["latency", "best-effort"], "default": "latency"}}
    )
    assert choose_default_class(explicit, PAPER_CLASSES) == "latency"  # the pool's choice wins


def test_ready_progressing_degraded_follow_the_deployments() -> None:
    p = plan()
    nothing = pool_status(p, Observed(), 1, None, "T0")
    assert conditions(nothing)["Ready"] == ("False", "EnginesNotReady")
    assert conditions(nothing)["Progressing"] == ("True", "RollingOut")
    partial = pool_status(p, Observed(deployment(2, 1), deployment(1, 1)), 1, None, "T0")
    assert conditions(partial)["Ready"] == ("True", "Ready")  # serving with one of two engines
    assert conditions(partial)["Progressing"] == ("True", "RollingOut")
    full = pool_status(p, Observed(deployment(2, 2), deployment(1, 1)), 1, None, "T0")
    assert conditions(full) == {
        "Ready": ("True", "Ready"),
        "Progressing": ("False", "RolloutComplete"),
        "Degraded": ("False", "AsExpected"),
    }
    assert full["readyReplicas"] == 2 and full["routerReadyReplicas"] == 1
    assert full["endpoint"] == "http://p-router.ns.svc.cluster.local:8080/v1"
    stale = pool_status(
        p, Observed(deployment(2, 2, generation=2, observed=1), deployment(1, 1)), 1, None, "T0"
    )
    assert conditions(stale)["Progressing"] == ("True", "RollingOut")  # controller has not seen the new spec
    no_router = pool_status(p, Observed(deployment(2, 2), deployment(1, 0)), 1, None, "T0")
    assert conditions(no_router)["Ready"] == ("False", "RouterNotReady")
    conflict = pool_status(
        p, Observed(deployment(2, 2), deployment(1, 1)), 1, None, "T0", [Failure("ApplyFailed", "taken")]
    )
    assert conditions(conflict)["Degraded"] == ("True", "ApplyFailed")
    assert conditions(conflict)["Ready"][0] == "False"


def test_scaled_to_zero_is_not_ready() -> None:
    p = plan({**SPEC, "replicas": 0})
    status = pool_status(p, Observed(deployment(0, 0), deployment(1, 1)), 1, None, "T0")
    assert conditions(status)["Ready"] == ("False", "ScaledToZero")


def test_transition_times_move_only_on_change() -> None:
    p = plan()
    first = pool_status(p, Observed(), 1, None, "T0")
    same = pool_status(p, Observed(), 1, first, "T1")
    assert [c["lastTransitionTime"] for c in same["conditions"]] == ["T0", "T0", "T0"]
    ready = pool_status(p, Observed(deployment(2, 2), deployment(1, 1)), 1, same, "T2")
    times = {c["type"]: c["lastTransitionTime"] for c in ready["conditions"]}
    assert times == {"Ready": "T2", "Progressing": "T2", "Degraded": "T0"}
    assert pool_status(p, Observed(deployment(2, 2), deployment(1, 1)), 1, ready, "T3") == ready


def test_router_numbers_are_kept_and_blocked_pools_keep_their_last_state() -> None:
    p = plan()
    previous = pool_status(p, Observed(deployment(2, 2), deployment(1, 1)), 1, None, "T0")
    previous["classes"] = [{"name": "latency", "goodput": 3.0}]
    kept = pool_status(p, Observed(deployment(2, 2), deployment(1, 1)), 1, previous, "T1")
    assert kept["classes"] == previous["classes"]
    blocked = plan({**SPEC, "sloClasses": {"allowed": ["gone"]}})
    status = pool_status(blocked, Observed(), 2, previous, "T2")
    assert status["endpoint"] == previous["endpoint"] and status["readyReplicas"] == 2


def test_router_report_shapes() -> None:
    expected = [{"name": "a", "goodput": 1.0, "attainment": 0.5}, {"name": "b", "goodput": 2.0}]
    assert (
        parse_router_report({"classes": {"a": {"goodput": 1, "attainment": 0.5}, "b": {"goodput": 2}}})
        == expected
    )
    assert parse_router_report({"a": {"goodput": 1, "attainment": 0.5}, "b": {"goodput": 2}}) == expected
    assert (
        parse_router_report(
            {"classes": [{"name": "b", "goodput": 2}, {"name": "a", "goodput": 1, "attainment": 0.5}]}
        )
        == expected
    )
    assert parse_router_report("garbage") == [] and parse_router_report({"classes": {"a": 3}}) == []
    assert parse_router_report({"a": {"goodput": "fast", "attainment": True}}) == [{"name": "a"}]


T0, LATER = "2026-01-01T00:00:00Z", "2026-01-01T01:00:00Z"  # an hour apart (the deadline is 40 min)
EXCEEDED = {
    "type": "Progressing",
    "status": "False",
    "reason": "ProgressDeadlineExceeded",
    "message": 'ReplicaSet "p-engine-5f" has timed out progressing.',
}


def test_api_failures_become_degraded_with_the_api_reason_and_message() -> None:
    p = plan()
    forbidden = Failure(
        "Forbidden", 'applying Role p-router: Forbidden: roles is forbidden: cannot create "roles"'
    )
    invalid = Failure("Invalid", "applying Deployment p-engine: Invalid: spec.template...cpu: Invalid value")
    status = pool_status(p, Observed(deployment(2, 2), deployment(1, 1)), 1, None, T0, [forbidden, invalid])
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "Forbidden")
    assert "cannot create" in degraded["message"] and "Invalid value" in degraded["message"]
    assert conditions(status)["Ready"] == ("False", "Forbidden")  # children do not match the spec
    # Not ready anyway: the engines' state comes first.
    waiting = pool_status(p, Observed(), 1, None, T0, [forbidden])
    assert conditions(waiting)["Ready"] == ("False", "EnginesNotReady")
    assert conditions(waiting)["Degraded"] == ("True", "Forbidden")


def test_status_replicas_are_the_observed_pods_not_the_spec() -> None:
    p = plan()  # spec.replicas = 2
    surging = pool_status(p, Observed(deployment(2, 1, pods=3), deployment(1, 1)), 1, None, T0)
    assert (surging["replicas"], surging["updatedReplicas"], surging["readyReplicas"]) == (3, 2, 1)
    missing = pool_status(p, Observed(None, None), 1, None, T0)
    assert missing["replicas"] == 0 and missing["readyReplicas"] == 0


def test_a_deployment_reporting_its_progress_deadline_stops_rolling_out() -> None:
    p = plan()
    stuck = Observed(deployment(2, 1, conditions=[EXCEEDED]), deployment(1, 1))
    status = pool_status(p, stuck, 1, None, T0)
    assert conditions(status)["Progressing"] == ("False", "ProgressDeadlineExceeded")
    assert conditions(status)["Degraded"] == ("True", "ProgressDeadlineExceeded")
    assert conditions(status)["Ready"] == ("True", "Ready")  # still serving with one engine
    progressing = next(c for c in status["conditions"] if c["type"] == "Progressing")
    assert "p-engine" in progressing["message"] and "timed out" in progressing["message"]
    # It stays exceeded while the spec is the same, even if the Deployment's condition goes ...
    again = pool_status(p, Observed(deployment(2, 1), deployment(1, 1)), 1, status, LATER)
    assert conditions(again)["Progressing"] == ("False", "ProgressDeadlineExceeded")
    # ... and a new spec (generation) is a new attempt, as is a finished rollout.
    retried = pool_status(p, Observed(deployment(2, 1), deployment(1, 1)), 2, status, LATER)
    assert conditions(retried)["Progressing"] == ("True", "RollingOut")
    assert conditions(retried)["Degraded"] == ("False", "AsExpected")
    done = pool_status(p, Observed(deployment(2, 2), deployment(1, 1)), 1, status, LATER)
    assert conditions(done)["Progressing"] == ("False", "RolloutComplete")


def test_without_a_controller_reporting_the_operator_times_the_rollout() -> None:
    p = plan()  # progressDeadlineSeconds: 2400
    first = pool_status(p, Observed(deployment(2, 0), deployment(1, 0)), 1, None, T0)
    assert conditions(first)["Progressing"] == ("True", "RollingOut")
    soon = pool_status(p, Observed(deployment(2, 0), deployment(1, 0)), 1, first, "2026-01-01T00:39:00Z")
    assert conditions(soon)["Progressing"] == ("True", "RollingOut")
    late = pool_status(p, Observed(deployment(2, 0), deployment(1, 0)), 1, first, LATER)
    assert conditions(late)["Progressing"] == ("False", "ProgressDeadlineExceeded")
    assert "2400 s" in next(c["message"] for c in late["conditions"] if c["type"] == "Progressing")
    # A Deployment controller that reports progress is trusted instead (it counts from its last progress).
    moving = {"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated"}
    reported = Observed(deployment(2, 0, conditions=[moving]), deployment(1, 0, conditions=[moving]))
    assert conditions(pool_status(p, reported, 1, first, LATER))["Progressing"] == ("True", "RollingOut")
    # A shorter deadline in the spec is honoured.
    quick = plan({**SPEC, "progressDeadlineSeconds": 60})
    short = pool_status(quick, Observed(), 1, first, "2026-01-01T00:01:01Z")
    assert conditions(short)["Progressing"] == ("False", "ProgressDeadlineExceeded")


def test_events_follow_condition_transitions_only() -> None:
    p = plan()
    created = pool_status(p, Observed(), 1, None, T0)
    assert transition_events(None, created["conditions"]) == [
        Event(NORMAL, "RollingOut", "engines 0/2 ready, routers 0/1 ready")
    ]
    assert transition_events(created["conditions"], created["conditions"]) == []  # steady: nothing
    ready = pool_status(p, Observed(deployment(2, 2), deployment(1, 1)), 1, created, T0)
    assert {(e.type, e.reason) for e in transition_events(created["conditions"], ready["conditions"])} == {
        (NORMAL, "Ready"),
        (NORMAL, "RolloutComplete"),
    }
    failing = pool_status(
        p, Observed(deployment(2, 2), deployment(1, 1)), 1, ready, T0, [Failure("Forbidden", "no Role")]
    )
    events = transition_events(ready["conditions"], failing["conditions"])
    assert events == [Event(WARNING, "Forbidden", "no Role")]  # Degraded and Ready lost: one event
    healed = pool_status(p, Observed(deployment(2, 2), deployment(1, 1)), 1, failing, T0)
    reasons = {(e.type, e.reason) for e in transition_events(failing["conditions"], healed["conditions"])}
    assert reasons == {(NORMAL, "Recovered"), (NORMAL, "Ready")}
    engines_lost = pool_status(p, Observed(deployment(2, 0), deployment(1, 1)), 1, healed, T0)
    reasons = {
        (e.type, e.reason) for e in transition_events(healed["conditions"], engines_lost["conditions"])
    }
    assert reasons == {(WARNING, "EnginesNotReady"), (NORMAL, "RollingOut")}
    stuck = pool_status(p, Observed(deployment(2, 0, conditions=[EXCEEDED]), deployment(1, 1)), 1, None, T0)
    reasons = {(e.type, e.reason) for e in transition_events(created["conditions"], stuck["conditions"])}
    assert reasons == {(WARNING, "ProgressDeadlineExceeded")}


def test_names_the_crd_would_refuse_are_refused_by_the_plan_too() -> None:
    bad = plan_pool("My.Pool", "ns", "uid", SPEC, {c: CLASSES[c] for c in ("latency", "deadline")}, Images())
    assert bad.pool is None and bad.problem is not None and bad.problem.reason == "InvalidSpec"
    bad_key = plan({**SPEC, "nodeSelector": {"bad key": "x"}})
    assert bad_key.problem is not None and "nodeSelector" in bad_key.problem.message
