"""The router's metrics (router/metrics.py) without a server: what /metrics exposes."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from jitserve.router.metrics import BulkHistogram


def test_bulk_histogram_exposes_what_repeated_observes_would() -> None:
    buckets = (0.001, 0.01, 0.1, 1.0)
    reg_a, reg_b = CollectorRegistry(), CollectorRegistry()
    plain = Histogram("x_seconds", "doc", ["c"], buckets=buckets, registry=reg_a)
    bulk = BulkHistogram("x_seconds", "doc", "c", buckets, reg_b)
    for value, count, label in [
        (0.0, 3, "a"),
        (0.001, 1, "a"),
        (0.0011, 2, "b"),
        (1.0, 1, "b"),
        (7.5, 2, "a"),
    ]:
        for _ in range(count):
            plain.labels(label).observe(value)
        bulk.observe(label, value, count)
    lines_a, lines_b = (sorted(generate_latest(reg).decode().splitlines()) for reg in (reg_a, reg_b))
    assert [x for x in lines_a if "_sum" not in x] == [x for x in lines_b if "_sum" not in x]
    sums_a, sums_b = ([float(x.split()[-1]) for x in lines if "_sum{" in x] for lines in (lines_a, lines_b))
    assert sums_a == pytest.approx(sums_b)  # value x count vs repeated adds: rounding only
