"""What the router sends to the engine: the client's body plus the resolved SLO in `vllm_xargs`.

The engine gets absolute numbers (seconds, relative to its own arrival time), not only a class name, so
a router and an engine that briefly disagree about a class (a ConfigMap edit propagating) still agree
about this request. A compound stage carries its sub-deadline D_s as `deadline`.
"""

from __future__ import annotations

import json
from typing import Any

from jitserve.router.inbound import SLO_BODY_FIELDS
from jitserve.scheduler.slo import SLO, SLOType

CUSTOM_CLASS = "custom"  # resolve_request_slo's name for explicit fields without a class
MIN_DEADLINE_S = 0.001


def engine_xargs(
    slo_class: str,
    slo: SLO,
    tenant: str,
    deadline_rel: float | None = None,
    program_id: str | None = None,
    program_stage: int | None = None,
    program_goodput: float = 0.0,
) -> dict[str, Any]:
    x: dict[str, Any] = {"waiting_time": slo.waiting_time, "slo_type": slo.type.value, "tenant": tenant}
    if slo_class != CUSTOM_CLASS:
        x["slo_class"] = slo_class
    if slo.type is SLOType.LATENCY:
        x["target_ttft"] = slo.ttft
        if slo.tbt is not None:
            x["target_tbt"] = slo.tbt
    else:
        deadline = slo.deadline if deadline_rel is None else deadline_rel
        x["deadline"] = max(float(deadline or 0.0), MIN_DEADLINE_S)
    if program_id is not None:
        x["program_id"] = program_id
        x["program_stage"] = program_stage
        x["program_goodput"] = program_goodput
    x["w_in"], x["w_out"] = slo.weights.input, slo.weights.output
    return x


def forward_body(body: dict[str, Any], xargs: dict[str, Any]) -> bytes:
    """The engine's request body. The client's own vllm_xargs survive, except SLO keys: the router's
    resolution wins, so a client cannot give itself a tighter SLO than admission checked."""
    out = dict(body)
    client = out.get("vllm_xargs")
    merged = {k: v for k, v in client.items() if k not in SLO_BODY_FIELDS} if isinstance(client, dict) else {}
    merged.update(xargs)
    out["vllm_xargs"] = merged
    return json.dumps(out, separators=(",", ":")).encode()
