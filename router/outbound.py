"""What the router sends to the engine: the client's body plus the resolved SLO in `vllm_xargs`.

Keys are the engine's contract (scheduler/xargs.py). The engine gets explicit numbers, not
only a class name, so a router and an engine that briefly disagree about a class (a ConfigMap edit
propagating) still agree about this request; a class the engine does not know is never sent (the
engine would fall back to its default class). A compound stage carries its sub-deadline D_s as
`stage_deadline` and the program's remaining budget as `deadline`, both relative to now.
"""

from __future__ import annotations

import json
from typing import Any

from jitserve.scheduler.slo import SLO, SLOType

CUSTOM_CLASS = "custom"  # resolve_request_slo's name for explicit fields without a class
MIN_SECONDS = 0.001
BEST_EFFORT_WAITING_TIME = 86_400.0  # the SLO model's largest time (scheduler/slo.py: PositiveSeconds)
# Every key the engine schedules by (scheduler/xargs.py): only the router may set them.
ENGINE_KEYS = frozenset(
    {
        "slo_class",
        "deadline",
        "target_ttft",
        "target_tbt",
        "waiting_time",
        "program_id",
        "stages",
        "stage_deadline",
        "program_goodput",
        "tenant",
        "length_bound",
    }
)


def engine_xargs(
    slo_class: str,
    slo: SLO,
    tenant: str,
    send_class: bool = True,
    deadline_rel: float | None = None,
    stage_deadline_rel: float | None = None,
    program_id: str | None = None,
    program_goodput: float = 0.0,
    length_bound: int | None = None,
) -> dict[str, Any]:
    # Best-effort is never dropped for waiting (docs/decisions/router.md): it gets the longest
    # waiting_time the SLO model allows, so an engine of any version keeps it queued.
    waiting = BEST_EFFORT_WAITING_TIME if slo.type is SLOType.BEST_EFFORT else slo.waiting_time
    x: dict[str, Any] = {"waiting_time": waiting, "tenant": tenant}
    if send_class and slo_class != CUSTOM_CLASS:
        x["slo_class"] = slo_class
    if slo.type is SLOType.LATENCY:
        x["target_ttft"] = slo.ttft
        if slo.tbt is not None:
            x["target_tbt"] = slo.tbt
    else:
        deadline = slo.deadline if deadline_rel is None else deadline_rel
        x["deadline"] = max(float(deadline or 0.0), MIN_SECONDS)
    if program_id is not None:
        x["program_id"] = program_id
        x["program_goodput"] = float(program_goodput)
        if stage_deadline_rel is not None:
            x["stage_deadline"] = max(stage_deadline_rel, MIN_SECONDS)
    if length_bound is not None:
        x["length_bound"] = int(length_bound)
    return x


class EngineBody:
    """The engine's request body, serialised once per request: the client's body (router fields and
    its `vllm_xargs` taken out) as JSON bytes; each attempt only splices in its own `vllm_xargs`
    (deadlines are relative to the moment of sending, so they differ between retries)."""

    __slots__ = ("_head", "_client_xargs")

    def __init__(self, body: dict[str, Any]) -> None:
        rest = {k: v for k, v in body.items() if k != "vllm_xargs"}
        client = body.get("vllm_xargs")
        self._client_xargs = (
            {k: v for k, v in client.items() if k not in ENGINE_KEYS} if isinstance(client, dict) else {}
        )
        head = json.dumps(rest, separators=(",", ":")).encode()
        # `{...}` without its closing brace, ready for one more member
        self._head = head[:-1] + b"," if rest else b"{"

    def with_xargs(self, xargs: dict[str, Any]) -> bytes:
        """The body with `vllm_xargs` = the client's own (minus the engine's scheduling keys) + `xargs`:
        the router's resolution wins, so a client cannot give itself a tighter SLO than admission
        checked, another tenant, or a smaller length bound."""
        merged = {**self._client_xargs, **xargs} if self._client_xargs else xargs
        return self._head + b'"vllm_xargs":' + json.dumps(merged, separators=(",", ":")).encode() + b"}"


def forward_body(body: dict[str, Any], xargs: dict[str, Any]) -> bytes:
    """The engine's request body for one attempt (`EngineBody` when there may be several)."""
    return EngineBody(body).with_xargs(xargs)
