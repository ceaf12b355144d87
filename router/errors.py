"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with the right HTTP status.

Every rejection the router makes goes through `RouterError`, so clients (and the OpenAI SDK, which maps
status codes to exception classes) always see one shape, and the message names the problem.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

# On a 429 from admission: which placement rule turned the request away (`Rejection`'s codes), so a client
# or a benchmark can tell "late everywhere" from "every replica busy" without parsing the message.
REJECTION_HEADER = "X-JITServe-Rejection"


@dataclass(eq=False)
class RouterError(Exception):
    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    retry_after: float | None = None  # seconds; sent as Retry-After on 429/503
    extra_headers: dict[str, str] = field(default_factory=dict)  # e.g. X-JITServe-Rejection on a 429

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def body(self) -> dict[str, dict[str, str | None]]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def json_bytes(self) -> bytes:
        return json.dumps(self.body(), separators=(",", ":")).encode()

    def headers(self) -> dict[str, str]:
        headers = dict(self.extra_headers)
        if self.retry_after is not None:
            # Retry-After takes whole seconds; round up so a client never retries too early.
            headers["Retry-After"] = str(max(1, int(-(-self.retry_after // 1))))
        return headers

    def sse_event(self) -> bytes:
        """The error as one SSE event, for failures after a stream has begun (the SDK raises on it)."""
        return b"data: " + self.json_bytes() + b"\n\n"


def bad_request(message: str, param: str | None = None, code: str = "invalid_request") -> RouterError:
    return RouterError(400, message, "invalid_request_error", param, code)


def rate_limited(
    message: str,
    code: str,
    retry_after: float,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> RouterError:
    return RouterError(429, message, "rate_limit_error", param, code, retry_after, dict(headers or {}))


def unavailable(message: str, code: str, retry_after: float | None = 1.0) -> RouterError:
    return RouterError(503, message, "service_unavailable", None, code, retry_after)


class RateLimitedLog:
    """At most one log line per `interval_s` (per key); the next line says how many were left out.

    Clients control what bad requests look like and how many arrive: a line (never a traceback) per
    request would let any client flood the logs."""

    def __init__(self, logger: logging.Logger, interval_s: float = 10.0, clock: Any = time.monotonic) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self.clock = clock
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def __call__(self, level: int, key: str, msg: str, *args: Any, exc_info: Any = None) -> bool:
        """Log unless a line with this key went out within the interval; True if logged."""
        now = self.clock()
        if now - self._last.get(key, -math.inf) < self.interval_s:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return False
        if len(self._last) >= 1024:  # keys come from a small fixed set; bound them anyway
            self._last.clear()
            self._suppressed.clear()
        self._last[key] = now
        left_out = self._suppressed.pop(key, 0)
        if left_out:
            msg += f" ({left_out} similar left out of the log in the last {self.interval_s:g}s)"
        self.logger.log(level, msg, *args, exc_info=exc_info)
        return True
