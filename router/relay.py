"""Moving an engine's answer to the client: a unary body, or a stream relayed chunk by chunk.

The first chunk of a stream is read before the response is committed, so a pod that fails before the
first token can be retried elsewhere (the caller gets a reason string, not a response) and a drop
before the first token is a real HTTP error. After that, nothing is retried: failures end the stream
with an SSE error event. Chunks are never buffered whole.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
from starlette.responses import Response, StreamingResponse

from jitserve.router import sse
from jitserve.router.errors import RouterError
from jitserve.router.flight import Flight, Outcomes
from jitserve.router.http import NO_RETRY, error_response
from jitserve.router.replicas import Replica
from jitserve.router.upstream import RETRYABLE, Attempt


class Relay:
    def __init__(
        self,
        outcomes: Outcomes,
        drops: sse.DropDetector,
        drop_finish_reasons: frozenset[str],
        clock: Callable[[], float],
        unresponsive_timeout_s: float,
        release_slot: Callable[[], None],
    ) -> None:
        self.outcomes = outcomes
        self.drops = drops
        self.drop_finish_reasons = drop_finish_reasons
        self.clock = clock
        self.unresponsive_timeout_s = unresponsive_timeout_s
        self.release_slot = release_slot  # the router's open-request slot, held until a stream ends

    def dropped(self, flight: Flight, chunk: bytes = b"") -> Response:
        """The engine dropped the request before anything reached the client: a 503, not retried."""
        flight.dropped = True
        self.outcomes.finish(flight, self.clock(), "waiting_time")
        return error_response(flight.drop_error(chunk), extra=NO_RETRY)

    async def unary(
        self,
        upstream: aiohttp.ClientResponse,
        flight: Flight,
        headers: dict[str, str],
        release: Callable[[], None],
        attempt: Attempt,
    ) -> Response | str:
        try:
            content = await upstream.read()
        except RETRYABLE as exc:
            upstream.close()
            release()
            return "unresponsive" if attempt.aborted else type(exc).__name__
        upstream.release()
        release()
        now = self.clock()
        finish_reason = None
        try:
            doc = json.loads(content)
            usage = doc.get("usage") or {}
            flight.prompt_tokens = usage.get("prompt_tokens")
            flight.completion_tokens = usage.get("completion_tokens")
            choices = doc.get("choices") or []
            finish_reason = choices[0].get("finish_reason") if choices else None
        except (ValueError, AttributeError, TypeError, RecursionError):
            pass
        n = flight.completion_tokens if isinstance(flight.completion_tokens, int) else 0
        flight.token_times.extend([now] * max(min(n, 1 << 24), 0))
        if finish_reason in self.drop_finish_reasons:
            flight.dropped = True
            self.outcomes.finish(flight, now, "waiting_time")
            return error_response(flight.drop_error(content), extra=NO_RETRY)
        flight.finish = now
        self.outcomes.finish(flight, now, None)
        return Response(content, 200, headers, "application/json")

    async def stream(
        self,
        upstream: aiohttp.ClientResponse,
        flight: Flight,
        headers: dict[str, str],
        release: Callable[[], None],
        replica: Replica,
        attempt: Attempt,
        first_deadline: float | None,
    ) -> Response | str:
        chunks = upstream.content.iter_any()
        drops = self.drops
        try:
            async with asyncio.timeout_at(first_deadline):
                first = await anext(chunks)
                if sse.role_only(first):
                    # A chat stream opens with its role event, written with the first engine output in
                    # the same iteration: when the read holds the role event alone, read on, so a drop
                    # (role event, then [DONE]) is still an HTTP error rather than an error event in a
                    # committed 200 stream. A read that already holds the first token is relayed as it
                    # is: reading on would hold that token back until the engine's next step.
                    first += await anext(chunks)
        except (StopAsyncIteration, *RETRYABLE) as exc:
            upstream.close()
            release()
            return "unresponsive" if attempt.aborted else type(exc).__name__
        except TimeoutError:
            # Not started within waiting_time (plus prefill and grace): closing the stream aborts it in
            # the engine, and the client learns why.
            upstream.close()
            release()
            return self.dropped(flight)
        replica.last_byte = self.clock()
        dropped_at_once = drops.is_drop(first) and not drops.events_before_drop(first)
        if dropped_at_once or sse.ended_unfinished(first):
            upstream.close()
            release()
            return self.dropped(flight, first)
        state = {"reason": "client_disconnect", "closed": False, "last": False, "finished": False}

        async def close() -> None:
            # Idempotent; runs from the relay's finally, or from RelayResponse if the relay never started.
            if state["closed"]:
                return
            state["closed"] = True
            # A finished stream returns its connection to the pool; any other end closes it, which
            # makes the engine abort the request (no work for a client that is gone).
            if state["reason"] is None:
                upstream.release()
            else:
                upstream.close()
            release()
            if state["reason"] == "client_disconnect":
                flight.dropped = True
            self.outcomes.finish(flight, self.clock(), state["reason"])
            self.release_slot()

        return RelayResponse(
            self._relay(first, chunks, flight, state, close, upstream.content.at_eof, replica, attempt),
            close,
            lambda: state["last"],
            status_code=200,
            headers=headers,
            media_type=upstream.headers.get("content-type", "text/event-stream"),
        )

    async def _relay(
        self,
        first: bytes,
        chunks: AsyncIterator[bytes],
        flight: Flight,
        state: dict[str, Any],
        close: Callable[[], Awaitable[None]],
        at_eof: Callable[[], bool],
        replica: Replica,
        attempt: Attempt,
    ) -> AsyncIterator[bytes]:
        drops, tokens, clock = self.drops, self.outcomes.tokens, self.clock
        try:
            chunk: bytes | None = first
            while chunk is not None:
                if drops.is_drop(chunk):
                    flight.dropped = True
                    state["reason"] = "waiting_time"
                    # Events before the drop are the client's; the abort event and [DONE] become the error.
                    kept = drops.events_before_drop(chunk)
                    if kept:
                        tokens(flight, kept)
                        yield kept
                    yield flight.drop_error(chunk).sse_event() + b"data: [DONE]\n\n"
                    return
                state["finished"] = state["finished"] or sse.has_finish(chunk)
                if not state["finished"] and sse.ended_unfinished(chunk):
                    # Dropped before its first token: vLLM writes no finish chunk then (only the chat
                    # role chunk was relayed), so without this the client would see an empty success.
                    flight.dropped = True
                    state["reason"] = "waiting_time"
                    kept = drops.events_before_drop(chunk)
                    if kept:
                        yield kept
                    yield flight.drop_error(chunk).sse_event() + b"data: [DONE]\n\n"
                    return
                tokens(flight, chunk)
                # The engine's stream already ended (its terminating chunk is read): nothing can follow.
                state["last"] = at_eof()
                yield chunk
                chunk = await anext(chunks, None)
                replica.last_byte = clock()  # alive: its probe must not call it hung
            flight.finish = clock()
            state["reason"] = None
        except (*RETRYABLE, TimeoutError) as exc:
            flight.dropped = True
            if attempt.aborted:
                state["reason"] = "upstream_unresponsive"
                err = RouterError(
                    502,
                    f"engine pod {replica.name} stopped responding (no answer to its health check within "
                    f"{self.unresponsive_timeout_s:g}s); the stream ends here",
                    "api_error",
                    None,
                    "upstream_unresponsive",
                )
            else:
                state["reason"] = "upstream_error"
                err = RouterError(
                    502,
                    f"engine pod failed mid-stream: {type(exc).__name__}",
                    "api_error",
                    None,
                    "upstream_failed",
                )
            yield err.sse_event() + b"data: [DONE]\n\n"
        finally:
            await close()


class RelayResponse(StreamingResponse):
    """A relayed stream. Leaner than Starlette's StreamingResponse (one watcher task instead of an anyio
    task group per response: CPU per stream matters at hundreds of streams a second), and its cleanup
    runs however it ends: finished, client gone (the watcher cancels the relay, which closes the engine
    connection so the engine aborts the request), or never started."""

    def __init__(
        self,
        content: AsyncIterator[bytes],
        on_close: Callable[[], Awaitable[None]],
        is_last: Callable[[], bool],
        **kw: Any,
    ) -> None:
        super().__init__(content, **kw)
        self._on_close = on_close
        self._is_last = is_last  # true when the chunk just yielded ends the stream
        self._also: list[Callable[[], None]] = []

    def also_on_close(self, fn: Callable[[], None]) -> None:
        """Run `fn` too when the stream ends (however it ends), after the relay's own cleanup."""
        self._also.append(fn)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        relay = asyncio.current_task()
        assert relay is not None
        gone = False

        async def watch() -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass  # the body was read already; only the disconnect remains to arrive
            gone = True
            relay.cancel()

        watcher = asyncio.get_running_loop().create_task(watch())
        body = self.body_iterator
        try:
            await send(
                {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            )
            ended = False
            async for chunk in body:
                if ended:
                    continue  # nothing follows the engine's end of stream; never send after the end
                if self._is_last():
                    # The last chunk ends the response in the same write. The response is complete
                    # then, which the watcher would read as a disconnect: stop it first.
                    ended = True
                    watcher.cancel()
                await send({"type": "http.response.body", "body": chunk, "more_body": not ended})
            if not ended:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not gone:
                raise
            relay.uncancel()  # the client left: a normal end for us, not a cancelled server
        finally:
            watcher.cancel()
            try:
                await body.aclose()  # type: ignore[attr-defined]
                await self._on_close()
            finally:
                for fn in self._also:
                    fn()
