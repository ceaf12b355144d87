"""The router's per-class series the operator copies into a ServingPool's status.

The router exports them on its Prometheus `GET /metrics` (router/metrics.py: ClassWindowCollector), the
operator reads them there by name (operator's `parse_router_metrics`). On /metrics, not on
`GET /jitserve/status`: /metrics answers without an API key and names no engine addresses, so the
operator reads them with no key of its own. Both series carry the label `slo_class`.
"""

from __future__ import annotations

CLASS_GOODPUT = "jitserve_router_class_goodput_tokens_per_second"
CLASS_ATTAINMENT = "jitserve_router_class_slo_attainment_ratio"
CLASS_LABEL = "slo_class"
