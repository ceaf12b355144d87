"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with the right HTTP status.

Every rejection the router makes goes through `RouterError`, so clients (and the OpenAI SDK, which maps
status codes to exception classes) always see one shape, and the message names the problem.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(eq=False)
class RouterError(Exception):
    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    retry_after: float | None = None  # seconds; sent as Retry-After on 429/503

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def body(self) -> dict[str, dict[str, str | None]]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def json_bytes(self) -> bytes:
        return json.dumps(self.body(), separators=(",", ":")).encode()

    def headers(self) -> dict[str, str]:
        if self.retry_after is None:
            return {}
        # Retry-After takes whole seconds; round up so a client never retries too early.
        return {"Retry-After": str(max(1, int(-(-self.retry_after // 1))))}

    def sse_event(self) -> bytes:
        """The error as one SSE event, for failures after a stream has begun (the SDK raises on it)."""
        return b"data: " + self.json_bytes() + b"\n\n"


def bad_request(message: str, param: str | None = None, code: str = "invalid_request") -> RouterError:
    return RouterError(400, message, "invalid_request_error", param, code)


def rate_limited(message: str, code: str, retry_after: float, param: str | None = None) -> RouterError:
    return RouterError(429, message, "rate_limit_error", param, code, retry_after)


def unavailable(message: str, code: str, retry_after: float | None = 1.0) -> RouterError:
    return RouterError(503, message, "service_unavailable", None, code, retry_after)
