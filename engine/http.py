"""Engine-pod HTTP endpoints, added to vLLM's API server with `--middleware
jitserve.engine.http.JITServeStateMiddleware` (a supported vLLM extension point):

- `GET /jitserve/state`: the `EngineState` JSON the scheduler last wrote (503 before the first frame);
- `GET /jitserve/state/schema`: its JSON schema;
- `GET /jitserve/metrics`: the `jitserve_engine_*` Prometheus metrics alone;
- `GET /metrics`: vLLM's own metrics with ours appended, so one scrape gets both.

A pure ASGI middleware (not `BaseHTTPMiddleware`): every other request, streaming completions included,
passes through untouched. The state comes from the runtime dir (`JITSERVE_RUNTIME_DIR`), which the
scheduler in the engine-core process writes; see `state.py` for why a file.
"""

from __future__ import annotations

import gzip
import json
import os
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from jitserve.engine.state import prometheus_text, read_state, state_schema

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

STATE_PATH = "/jitserve/state"
SCHEMA_PATH = "/jitserve/state/schema"
METRICS_PATH = "/jitserve/metrics"
PROM_TYPE = b"text/plain; version=0.0.4; charset=utf-8"


class JITServeStateMiddleware:
    def __init__(self, app: ASGIApp, runtime_dir: str | None = None) -> None:
        self.app = app
        self.runtime_dir = runtime_dir or os.environ.get("JITSERVE_RUNTIME_DIR", "")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or scope.get("method") not in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if path == STATE_PATH:
            state = read_state(self.runtime_dir) if self.runtime_dir else None
            if state is None:
                body = {
                    "error": {
                        "message": "no JITServe state yet (scheduler not started or no frame run)",
                        "type": "unavailable",
                        "code": 503,
                    }
                }
                await _respond(send, 503, json.dumps(body).encode(), b"application/json")
            else:
                await _respond(send, 200, state.model_dump_json().encode(), b"application/json")
        elif path == SCHEMA_PATH:
            await _respond(send, 200, json.dumps(state_schema()).encode(), b"application/json")
        elif path == METRICS_PATH:
            await _respond(send, 200, self._metrics(), PROM_TYPE)
        elif path == "/metrics":
            await self._append_metrics(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    def _metrics(self) -> bytes:
        return prometheus_text(read_state(self.runtime_dir) if self.runtime_dir else None, time.time())

    async def _append_metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Buffer vLLM's (small) /metrics answer, append ours, fix Content-Length."""
        start: Message | None = None
        chunks: list[bytes] = []

        async def capture(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
                return
            if message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if message.get("more_body"):
                    return
                assert start is not None
                body = b"".join(chunks)
                headers = list(start.get("headers", []))
                if start["status"] == 200:
                    if (b"content-encoding", b"gzip") in [(k.lower(), v.lower()) for k, v in headers]:
                        # prometheus-client gzips for scrapers that accept it; ours is appended plain
                        body = gzip.decompress(body)
                        headers = [(k, v) for k, v in headers if k.lower() != b"content-encoding"]
                    body = body + self._metrics()
                headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
                headers.append((b"content-length", str(len(body)).encode()))
                await send({**start, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
            await send(message)

        await self.app(scope, receive, capture)


async def _respond(send: Send, status: int, body: bytes, content_type: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
