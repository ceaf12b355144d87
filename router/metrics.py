"""Prometheus metrics of the router (`GET /metrics`), one registry per app so tests can run several.

Names follow Prometheus conventions: `jitserve_router_` prefix, base units in the name (`_seconds`),
`_total` on counters. Label values are bounded: SLO class names come from the class table (or
"custom" / "best-effort"), pods from discovery, reasons and codes from fixed sets in the code.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

# The per-class series the operator copies into ServingPool status (a contract with the operator).
from jitserve.scheduler.contracts.router_metrics import CLASS_ATTAINMENT, CLASS_GOODPUT, CLASS_LABEL

# `_created` series double the exposition size and no dashboard here reads them.
disable_created_metrics()

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0, 300.0)
_TBT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class BulkHistogram:
    """A histogram with one label whose `observe` takes a count: `count` observations of one value in a
    single call. Chunks that arrive in one read are that many tokens with zero gaps; a prometheus_client
    `Histogram` would need one `observe` (about 2 us) per token. Exposed like a `Histogram` (`_bucket`,
    `_count`, `_sum`); updated and collected on the event loop's thread only."""

    def __init__(
        self, name: str, documentation: str, label: str, buckets: Sequence[float], registry: CollectorRegistry
    ) -> None:
        self.name, self.documentation, self.label = name, documentation, label
        self._bounds = (*(float(b) for b in buckets), math.inf)
        self._le = [floatToGoString(b) for b in self._bounds]
        self._series: dict[str, list[float]] = {}  # label value -> count per bucket (not cumulative), sum
        registry.register(self)

    def observe(self, label: str, value: float, count: int = 1) -> None:
        s = self._series.get(label)
        if s is None:
            s = self._series[label] = [0.0] * (len(self._bounds) + 1)
        s[bisect.bisect_left(self._bounds, value)] += count  # the first bucket with value <= le
        s[-1] += value * count

    def describe(self) -> list[Metric]:
        return [HistogramMetricFamily(self.name, self.documentation, labels=[self.label])]

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=[self.label])
        for value, s in list(self._series.items()):
            cumulative = itertools.accumulate(s[:-1])
            family.add_metric([value], list(zip(self._le, cumulative, strict=True)), s[-1])
        yield family


class RouterMetrics:
    def child(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)`, cached: the lookup costs more than the update on the hot path."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def __init__(self) -> None:
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "jitserve_router_requests_total",
            "Requests received, by endpoint and resolved SLO class",
            ["endpoint", "slo_class"],
            registry=r,
        )
        self.admissions = Counter(
            "jitserve_router_admissions_total",
            "Admission decisions (admitted, downgraded, rejected)",
            ["slo_class", "decision"],
            registry=r,
        )
        self.rejections = Counter(
            "jitserve_router_rejections_total",
            "Requests admission turned away, by the placement rule that did (no_time, busy_short_reply, "
            "queue_too_long, no_replica)",
            ["slo_class", "rule"],
            registry=r,
        )
        self.drops = Counter(
            "jitserve_router_drops_total",
            "Requests ended without a full response, by reason (waiting_time, no_replica, upstream_error, "
            "upstream_unresponsive, client_disconnect, router_overloaded, queue_full)",
            ["slo_class", "reason"],
            registry=r,
        )
        self.bad_requests = Counter(
            "jitserve_router_bad_requests_total",
            "Requests refused for bad input or auth, by error code",
            ["code"],
            registry=r,
        )
        self.ttft = Histogram(
            "jitserve_router_ttft_seconds",
            "Time to first token seen by the router, by SLO class",
            ["slo_class"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tbt = BulkHistogram(
            "jitserve_router_tbt_seconds",
            "Time between streamed tokens (SSE events), by SLO class",
            "slo_class",
            _TBT_BUCKETS,
            r,
        )
        self.e2el = Histogram(
            "jitserve_router_e2e_latency_seconds",
            "End-to-end latency of finished requests, by SLO class",
            ["slo_class"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.goodput = Counter(
            "jitserve_router_goodput_tokens_total",
            "Token goodput (weighted on-time tokens), by SLO class",
            ["slo_class"],
            registry=r,
        )
        self.finished = Counter(
            "jitserve_router_finished_requests_total",
            "Requests finished or dropped, by SLO class",
            ["slo_class"],
            registry=r,
        )
        self.slo_met = Counter(
            "jitserve_router_slo_met_requests_total",
            "Requests that met their SLO, by SLO class",
            ["slo_class"],
            registry=r,
        )
        self.pod_choice = Counter(
            "jitserve_router_pod_choices_total",
            "Requests placed on each pod",
            ["pod"],
            registry=r,
        )
        self.retries = Counter(
            "jitserve_router_retries_total",
            "Requests retried on another pod before their first token",
            ["reason"],
            registry=r,
        )
        self.placement = Histogram(
            "jitserve_router_placement_seconds",
            "Time to decide admission and placement",
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05),
            registry=r,
        )
        self.inflight = Gauge("jitserve_router_inflight_requests", "Requests open in the router", registry=r)
        self.replicas = Gauge(
            "jitserve_router_replicas",
            "Known engine replicas by health (fresh, stale, stateless, pending, down)",
            ["health"],
            registry=r,
        )
        self.best_effort_queued = Gauge(
            "jitserve_router_best_effort_queued",
            "Best-effort requests waiting in the router for room at the engines",
            registry=r,
        )
        self.best_effort_active = Gauge(
            "jitserve_router_best_effort_active",
            "Best-effort requests open at the engines (bounded by the engines' best-effort slots)",
            registry=r,
        )
        self.unresponsive = Counter(
            "jitserve_router_replica_unresponsive_total",
            "Times an engine replica was marked down for not answering its health probe",
            registry=r,
        )
        self.classes_reloads = Counter(
            "jitserve_router_class_reloads_total",
            "SLO class table reloads, by result (ok, error)",
            ["result"],
            registry=r,
        )
        self.class_goodput = Gauge(
            CLASS_GOODPUT,
            "Token goodput per second over the status window, by SLO class (set at each scrape)",
            [CLASS_LABEL],
            registry=r,
        )
        self.class_attainment = Gauge(
            CLASS_ATTAINMENT,
            "Share of the requests finished in the status window that met their SLO, by SLO class "
            "(set at each scrape; absent while none finished)",
            [CLASS_LABEL],
            registry=r,
        )

    def set_class_window(self, classes: Mapping[str, Mapping[str, Any]]) -> None:
        """The per-class figures of `GET /jitserve/status` (router/accounting.py: status) as gauges,
        replacing the last scrape's (a class gone from the table goes from /metrics too)."""
        self.class_goodput.clear()
        self.class_attainment.clear()
        for name, row in classes.items():
            self.class_goodput.labels(name).set(float(row.get("goodput") or 0.0))
            if row.get("attainment") is not None:
                self.class_attainment.labels(name).set(float(row["attainment"]))
