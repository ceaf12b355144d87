"""The FastAPI app: routes, OpenAPI schemas of the request bodies, and the background tasks' lifecycle.

Handlers take the raw `Request` (no pydantic model per request: the router validates only what it
uses, in inbound.py, and parsing the whole body into models would cost latency on every call). The
schemas below document the bodies in the OpenAPI spec, which the schemathesis fuzz tests generate from.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from jitserve.router.errors import RouterError
from jitserve.router.http import error_response
from jitserve.router.inbound import MAX_SLO_SECONDS, Kind
from jitserve.router.service import Router

log = logging.getLogger("jitserve.router")

_SECONDS = {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_SLO_SECONDS, "description": "seconds"}
_SLO_PROPS: dict[str, Any] = {
    "slo_class": {"type": "string", "description": "name of an SLOClass (header X-SLO-Class)"},
    "deadline": {**_SECONDS, "description": "end-to-end deadline in seconds (header X-SLO-Deadline)"},
    "target_ttft": {**_SECONDS, "description": "time-to-first-token target, seconds (X-SLO-Target-TTFT)"},
    "target_tbt": {**_SECONDS, "description": "time-between-tokens target, seconds (X-SLO-Target-TBT)"},
    "waiting_time": {
        **_SECONDS,
        "description": "drop if not started within this; deadline work: not before its deadline "
        "(X-SLO-Waiting-Time)",
    },
    "program_id": {"type": "string", "description": "compound program id (header X-Program-Id)"},
    "program_stages": {"type": "integer", "minimum": 1, "description": "expected stages (X-Program-Stages)"},
}
_COMMON: dict[str, Any] = {
    "model": {"type": "string"},
    "stream": {"type": "boolean"},
    "max_tokens": {"type": "integer", "minimum": 1},
    "temperature": {"type": "number"},
    "vllm_xargs": {"type": "object"},
    **_SLO_PROPS,
}
CHAT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["model", "messages"],
    "properties": {
        **_COMMON,
        "max_completion_tokens": {"type": "integer", "minimum": 1},
        "messages": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["role", "content"],
                "properties": {"role": {"type": "string"}, "content": {"type": "string"}},
            },
        },
    },
}
COMPLETION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["model", "prompt"],
    "properties": {
        **_COMMON,
        "prompt": {
            "oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}]
        },
    },
}
_ERROR_SCHEMA = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
_NUMBER_HEADER = {"type": "string", "pattern": r"^[0-9]{1,9}(\.[0-9]{1,6})?$", "description": "seconds"}
_SLO_HEADERS = [
    {"name": h, "in": "header", "required": False, "schema": schema}
    for h, schema in (
        ("X-SLO-Class", {"type": "string"}),
        ("X-SLO-Deadline", _NUMBER_HEADER),
        ("X-SLO-Target-TTFT", _NUMBER_HEADER),
        ("X-SLO-Target-TBT", _NUMBER_HEADER),
        ("X-SLO-Waiting-Time", _NUMBER_HEADER),
        ("X-Program-Id", {"type": "string"}),
        ("X-Program-Stages", {"type": "string", "pattern": "^[0-9]{1,5}$"}),
    )
]


def _openapi(schema: dict[str, Any]) -> dict[str, Any]:
    responses = {
        str(code): {"description": desc, "content": {"application/json": {"schema": _ERROR_SCHEMA}}}
        for code, desc in (
            (400, "bad input"),
            (401, "missing or invalid API key"),
            (404, "unknown model"),
            (413, "body too large"),
            (429, "SLO unattainable, router overloaded, or best-effort queue full"),
            (503, "no replica, or dropped past waiting_time"),
        )
    }
    return {
        "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
        "parameters": _SLO_HEADERS,
        "responses": {
            "200": {"description": "OpenAI response (JSON, or SSE when stream is true)"},
            **responses,
        },
    }


def create_app(router: Router, background: list[Callable[[], Awaitable[None]]] | None = None) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        tasks = [asyncio.create_task(fn()) for fn in (background or [])]
        try:
            yield
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await router.aclose()

    app = FastAPI(
        title="JITServe router",
        version="0.1.0",
        description="OpenAI-compatible endpoint with SLO admission and power-of-K placement (docs/api.md).",
        lifespan=lifespan,
    )
    app.state.router = router

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_response(
            RouterError(exc.status_code, str(exc.detail), "invalid_request_error", None, code)
        )

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> Response:
        err = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        param = ".".join(str(p) for p in err.get("loc", ()))
        return error_response(
            RouterError(400, f"{param}: {err.get('msg')}", "invalid_request_error", param, "invalid_request")
        )

    @app.post("/v1/chat/completions", openapi_extra=_openapi(CHAT_SCHEMA), response_model=None)
    async def chat(request: Request) -> Response:
        return await router.handle("chat", request)

    @app.post("/v1/completions", openapi_extra=_openapi(COMPLETION_SCHEMA), response_model=None)
    async def completions(request: Request) -> Response:
        return await router.handle("completion", request)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        names = sorted(router.pool.models() | router.config.served_models)
        created = int(time.time())
        return {
            "object": "list",
            "data": [{"id": n, "object": "model", "created": created, "owned_by": "jitserve"} for n in names],
        }

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", response_model=None)
    async def readyz() -> Response:
        counts = router.pool.health_counts()
        usable = counts["fresh"] + counts["stale"] + counts["stateless"]
        if usable == 0:
            return JSONResponse(
                {"status": "not ready", "reason": "no engine replica is usable", "replicas": counts}, 503
            )
        if router.classes.awaiting is not None:
            # the pool's classes are not read yet: serving now would resolve against the wrong table
            reason = f"SLO classes not loaded yet from {router.classes.awaiting}"
            return JSONResponse({"status": "not ready", "reason": reason, "replicas": counts}, 503)
        return JSONResponse({"status": "ready", "replicas": counts})

    @app.get("/metrics", response_model=None)
    async def metrics() -> Response:
        # the per-class goodput the operator copies into ServingPool status, on the keyless /metrics
        router.metrics.set_class_window(router.accounting.status(router.clock()))
        for health, n in router.pool.health_counts().items():
            router.metrics.replicas.labels(health).set(n)
        return Response(generate_latest(router.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/jitserve/status")
    async def status() -> dict[str, Any]:
        return router.status()

    return app


def serve_app(router: Router, background: list[Callable[[], Awaitable[None]]] | None = None) -> FastPath:
    """The ASGI app to serve: `FastPath` in front of the FastAPI app (outermost, not as a middleware
    inside it, so a completion passes through no FastAPI/Starlette layer at all)."""
    return FastPath(create_app(router, background), router)


FAST_PATHS: dict[str, Kind] = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}
# What answers without an API key when keys are configured: the kubelet's probes and Prometheus.
PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


def _authorization(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"authorization":
            return bytes(value).decode("latin-1")
    return None


class FastPath:
    """Completions go straight to the Router, skipping FastAPI's routing, dependency solving and
    middleware stack (a measurable share of the router's CPU per request); the FastAPI routes above
    still describe them in the OpenAPI spec and serve anything this does not take (lifespan included)."""

    def __init__(self, app: ASGIApp, router: Router) -> None:
        self.app = app
        self.router = router

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = FAST_PATHS.get(scope.get("path", "")) if scope["type"] == "http" else None
        if kind is None or scope.get("method") != "POST":
            if (
                scope["type"] == "http"
                and scope.get("path") not in PUBLIC_PATHS
                and self.router.keyring.required
            ):
                # Every endpoint but the probes and /metrics needs a key: /v1/models names the models,
                # /jitserve/status the engines' addresses, the OpenAPI spec the whole surface.
                try:
                    self.router.keyring.tenant(_authorization(scope))
                except RouterError as err:
                    self.router.metrics.child(self.router.metrics.bad_requests, err.code or "auth").inc()
                    await error_response(err)(scope, receive, send)
                    return
            await self.app(scope, receive, send)
            return
        try:
            response = await self.router.handle(kind, Request(scope, receive))
        except Exception as exc:  # a bug must still answer in the API's error shape, and be logged
            # with its traceback, but at most once per interval: a client that found the bug could
            # otherwise fill the logs with it
            self.router.log_limited(
                logging.ERROR, f"bug:{type(exc).__name__}", "unhandled error in %s: %r",
                scope.get("path"), exc, exc_info=True,
            )  # fmt: skip
            response = error_response(
                RouterError(500, "internal router error", "api_error", None, "internal")
            )
        await response(scope, receive, send)
