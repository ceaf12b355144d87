"""What the router sends to the engine: the client's body plus the resolved SLO in `vllm_xargs`.

The keys and how a resolved SLO becomes them are the engine's contract (scheduler/contracts/xargs.py:
`render_xargs`). A class the engine does not know is never sent (the engine would fall back to its
default class). A compound stage carries its sub-deadline D_s as `stage_deadline` and the program's
remaining budget as `deadline`, both relative to now.
"""

from __future__ import annotations

import json
from typing import Any

from jitserve.scheduler.contracts.xargs import XARGS_KEYS

# Every key the engine schedules by: only the router may set them (a set: looked up per client key).
ENGINE_KEYS = frozenset(XARGS_KEYS)


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
