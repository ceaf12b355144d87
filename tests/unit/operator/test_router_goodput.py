"""The operator reads the pools' goodput from the router's keyless Prometheus `/metrics` (issue 14: with
`spec.router.authSecret`, `/jitserve/status` needs an API key the operator does not hold). The exposition
parsed here is the router's own (its RouterMetrics registry), so the two sides cannot drift apart."""

from __future__ import annotations

from typing import Any

from prometheus_client import generate_latest

from jitserve.operator.decisions import parse_router_metrics, parse_router_report
from jitserve.operator.reconciler import DEFAULT_ROUTER_STATUS_URL
from jitserve.router.metrics import RouterMetrics
from jitserve.scheduler.contracts.router_metrics import CLASS_ATTAINMENT, CLASS_GOODPUT
from tests.unit.operator.test_drift import _pool_kube, _reconciler

# what router/accounting.py's status(now) returns per class (the source of both the JSON and the gauges)
WINDOW: dict[str, dict[str, Any]] = {
    "latency": {"goodput": 812.5, "attainment": 0.97, "finished": 40, "goodput_tokens_total": 9e4},
    "deadline": {"goodput": 90.0, "attainment": None, "finished": 0},  # nothing finished in the window
    "best-effort": {"goodput": 0.0, "attainment": 1.0, "finished": 3},
}


def exposition(window: dict[str, dict[str, Any]] = WINDOW) -> str:
    metrics = RouterMetrics()
    metrics.set_class_window(window)  # what the router's /metrics handler does at each scrape
    metrics.child(metrics.goodput, "latency").inc(5)  # other families with an slo_class label are ignored
    return generate_latest(metrics.registry).decode()


def test_the_router_exposes_the_status_figures_as_gauges_and_the_operator_reads_them() -> None:
    text = exposition()
    assert f'{CLASS_GOODPUT}{{slo_class="latency"}} 812.5' in text
    assert f'{CLASS_ATTAINMENT}{{slo_class="deadline"}}' not in text  # no attainment without finished ones
    assert parse_router_metrics(text) == {
        "best-effort": {"goodput": 0.0, "attainment": 1.0},
        "deadline": {"goodput": 90.0},
        "latency": {"goodput": 812.5, "attainment": 0.97},
    }
    # the same status.classes rows as from the JSON status the operator read before
    assert parse_router_report(text) == parse_router_report({"classes": WINDOW})
    assert parse_router_report(text) == [
        {"name": "best-effort", "goodput": 0.0, "attainment": 1.0},
        {"name": "deadline", "goodput": 90.0},
        {"name": "latency", "goodput": 812.5, "attainment": 0.97},
    ]


def test_the_gauges_follow_the_window_at_each_scrape() -> None:
    metrics = RouterMetrics()
    metrics.set_class_window({})
    assert parse_router_metrics(generate_latest(metrics.registry).decode()) == {}
    metrics.set_class_window({"latency": {"goodput": 3.0, "attainment": 0.5}, "old": {"goodput": 1.0}})
    metrics.set_class_window({"latency": {"goodput": 4.0, "attainment": None}})  # "old" left the table
    assert parse_router_metrics(generate_latest(metrics.registry).decode()) == {"latency": {"goodput": 4.0}}


def test_what_is_not_an_exposition_reads_as_no_classes() -> None:
    for text in ("", "garbage", "<html><body>502 Bad Gateway</body></html>", f"{CLASS_GOODPUT}{{"):
        assert parse_router_metrics(text) == {}
        assert parse_router_report(text) == []
    # NaN/Inf never reach the pool status
    assert parse_router_metrics(f'{CLASS_GOODPUT}{{slo_class="a"}} NaN\n') == {}


def test_the_default_url_is_the_keyless_metrics_endpoint() -> None:
    assert DEFAULT_ROUTER_STATUS_URL.endswith(":{port}/metrics")


def test_a_reconcile_copies_the_goodput_from_the_metrics_text() -> None:
    kube = _pool_kube()
    reconciler = _reconciler(kube)
    urls: list[str] = []

    def http_get(url: str) -> str:
        urls.append(url)
        return exposition()

    reconciler.http_get = http_get
    result = reconciler.reconcile("ns", "p", read_router=True)
    assert result is not None
    assert urls == ["http://p-router.ns.svc.cluster.local:8080/metrics"]
    status = kube.objects[("ServingPool", "p")]["status"]
    assert status["classes"] == parse_router_report({"classes": WINDOW})
    assert status["classesUpdated"] == "2026-01-01T00:00:00Z"
