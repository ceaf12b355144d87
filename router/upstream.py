"""The engine side of the data path: aiohttp sessions, the bounded connector, and `Attempt`, one
request in flight on one engine (the health probe can end it)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aiohttp

from jitserve.router.config import RouterConfig
from jitserve.router.inbound import Kind

PATHS: dict[Kind, str] = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}
# Failures of the engine connection: before the first token they mean "try another pod".
RETRYABLE = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError)


class Attempt:
    """One request in flight on one engine, registered with its replica so the health probe can end it
    when the engine stops answering: before the response headers, by expiring the phase's timeout
    scope; after, by failing the response body's reader (the relay then sends an error event, or the
    request is retried elsewhere while the client has nothing yet)."""

    __slots__ = ("scope", "upstream", "aborted")

    def __init__(self) -> None:
        self.scope: asyncio.Timeout | None = None
        self.upstream: aiohttp.ClientResponse | None = None
        self.aborted = False

    def enter(self, scope: asyncio.Timeout) -> None:
        self.scope = scope
        if self.aborted:
            scope.reschedule(0)  # aborted between phases: expire at once

    def abort(self) -> None:
        if self.aborted:
            return
        self.aborted = True
        if self.scope is not None:
            with contextlib.suppress(RuntimeError):  # already expiring or left
                self.scope.reschedule(0)
        if self.upstream is not None:
            self.upstream.content.set_exception(aiohttp.ClientPayloadError("engine pod stopped responding"))
            self.upstream.close()


class BoundedConnector(aiohttp.TCPConnector):
    """At most `max_connecting` new engine connections being set up at once; the rest wait their turn
    *before* the connect timeout starts. A burst of 2,000 streams otherwise opens 2,000 connects at
    once: the engines' accept queues overflow, connects time out, and healthy engines look down."""

    def __init__(self, *args: Any, max_connecting: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._connecting = asyncio.Semaphore(max(max_connecting, 1))

    async def _create_connection(self, req: Any, traces: Any, timeout: Any) -> Any:
        async with self._connecting:
            return await super()._create_connection(req, traces, timeout)


def make_session(config: RouterConfig) -> aiohttp.ClientSession:
    """The data path's engine connections."""
    connector = BoundedConnector(
        limit=config.max_inflight + 64,
        limit_per_host=0,
        keepalive_timeout=30,
        max_connecting=config.max_connecting,
    )
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=config.connect_timeout_s, sock_read=config.read_timeout_s
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        auto_decompress=False,
        skip_auto_headers=("User-Agent",),
        # no cookies: one session serves every client, so an engine's Set-Cookie must not be replayed
        # on other clients' requests (and the jar lookup costs time per request)
        cookie_jar=aiohttp.DummyCookieJar(),
    )


def make_poll_session() -> aiohttp.ClientSession:
    """Connections for the state polls, apart from the data path's."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30),
        cookie_jar=aiohttp.DummyCookieJar(),
        skip_auto_headers=("User-Agent",),
    )
