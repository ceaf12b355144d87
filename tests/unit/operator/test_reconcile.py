"""The pure decision core: plans, default classes, conditions and the router report."""

from __future__ import annotations

from typing import Any

from jitserve.operator.children import Images
from jitserve.operator.models import ServingPoolSpec
from jitserve.operator.reconcile import (
    Observed,
    choose_default_class,
    parse_router_report,
    plan_pool,
    pool_status,
)
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


def deployment(replicas: int, ready: int, generation: int = 1, observed: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"generation": generation},
        "spec": {"replicas": replicas},
        "status": {"readyReplicas": ready, "updatedReplicas": replicas, "observedGeneration": observed},
    }


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
        p, Observed(deployment(2, 2), deployment(1, 1)), 1, None, "T0", apply_error="taken"
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
