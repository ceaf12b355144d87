"""The client side's small HTTP helpers: reading a bounded body, error responses."""

from __future__ import annotations

from collections.abc import Mapping

from starlette.requests import Request
from starlette.responses import Response

from jitserve.router.errors import RouterError
from jitserve.router.inbound import body_too_large

NO_RETRY = {"x-should-retry": "false"}  # tells the OpenAI SDK not to retry (the SLO is already lost)


async def read_body(request: Request, limit: int) -> bytes:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise body_too_large(limit)
    buf = bytearray()
    async for chunk in request.stream():
        buf += chunk
        if len(buf) > limit:
            raise body_too_large(limit)
    return bytes(buf)


def error_response(err: RouterError, extra: Mapping[str, str] | None = None) -> Response:
    headers = err.headers()
    if extra:
        headers.update(extra)
    return Response(err.json_bytes(), err.status, headers, "application/json")
