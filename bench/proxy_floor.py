"""Reference proxies for `bench/router.py --floor MODE`: what a Python proxy adds at the least, and what
each layer of `jitserve router`'s data path costs on top of it. Not a product: no retries, no errors, no
admission; each passes `/v1/completions` streams round robin to the fake backends and nothing else.

Modes (each a layer of the real router's path, measured in the same run as the router):
- `raw`: uvloop + httptools on both sides, callbacks only (no task per request); the response head and
  the first chunk leave in one write. The floor of a Python proxy on this host.
- `decide`: `raw` plus the router's per-request decision: the body parsed as JSON and the core's
  `decide()` (GMAX `analyze` on K = 2 replicas, power-of-K) over two replica states as the fake backends
  report them.
- `asgi`: uvicorn (httptools, uvloop) in front of a bare ASGI app, the `raw` engine side behind it.
- `aiohttp`: uvicorn and a bare ASGI app in front, the router's own aiohttp session
  (`router/upstream.py`'s `make_session`) behind it.

    python bench/proxy_floor.py --mode raw --engines http://127.0.0.1:8001,http://127.0.0.1:8002 --port 9000
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
from collections.abc import Callable
from typing import Any

import httptools
import uvloop

REQUEST_HEAD = b"POST /v1/completions HTTP/1.1\r\nhost: engine\r\ncontent-type: application/json\r\n"
STREAM_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
HEALTHY = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


def engine_request(body: bytes) -> bytes:
    return REQUEST_HEAD + b"content-length: %d\r\n\r\n%b" % (len(body), body)


def host_port(url: str) -> tuple[str, int]:
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    return host, int(port)


class EngineConnection(asyncio.Protocol):
    """One keep-alive connection to an engine. Hands each body piece to `on_piece` (None at the end),
    then returns itself to its pool."""

    def __init__(self, pool: list[EngineConnection]) -> None:
        self.pool = pool
        self.on_piece: Callable[[bytes | None], None] | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        if self.on_piece is not None:
            self.on_piece(body)

    def on_message_complete(self) -> None:
        on_piece, self.on_piece = self.on_piece, None
        self.parser = httptools.HttpResponseParser(self)
        self.pool.append(self)
        if on_piece is not None:
            on_piece(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.pool:
            self.pool.remove(self)


class Engines:
    """Round robin over the engines, each with a pool of idle keep-alive connections."""

    def __init__(self, urls: list[str]) -> None:
        self.addresses = [host_port(u) for u in urls]
        self.pools: list[list[EngineConnection]] = [[] for _ in urls]
        self._next = itertools.cycle(range(len(urls)))

    def send(self, body: bytes, on_piece: Callable[[bytes | None], None]) -> None:
        i = next(self._next)
        pool = self.pools[i]
        if pool:
            conn = pool.pop()
            conn.on_piece = on_piece
            assert conn.transport is not None
            conn.transport.write(engine_request(body))
        else:
            asyncio.get_running_loop().create_task(self._connect(i, body, on_piece))

    async def _connect(self, i: int, body: bytes, on_piece: Callable[[bytes | None], None]) -> None:
        pool = self.pools[i]
        _, conn = await asyncio.get_running_loop().create_connection(
            lambda: EngineConnection(pool), *self.addresses[i]
        )
        conn.on_piece = on_piece
        assert conn.transport is not None
        conn.transport.write(engine_request(body))


class Decision:
    """The router's per-request work in `decide` mode: parse the body, build the request, place it."""

    def __init__(self) -> None:
        import numpy as np

        from jitserve.scheduler.admission import decide
        from jitserve.scheduler.placement import ReplicaState
        from jitserve.scheduler.requests import NewRequest
        from jitserve.scheduler.slo import PAPER_CLASSES, SLO, OverloadAction
        from router import STATE  # bench/router.py: what its fake backends report

        self.decide, self.new_request, self.slo = decide, NewRequest, SLO.latency()
        self.overload, self.classes = OverloadAction.REJECT, PAPER_CLASSES
        self.rng = np.random.default_rng(0)
        self.ids = itertools.count()
        reported = {**STATE, "updated_at": time.time()}
        self.states = [ReplicaState(**{**reported, "pod": f"engine-{i}"}) for i in range(2)]

    def __call__(self, body: bytes) -> None:
        doc = json.loads(body)
        now = time.time()
        new = self.new_request(
            f"r{next(self.ids)}", self.slo, now, len(doc.get("prompt", "")) // 4, doc.get("max_tokens", 16)
        )
        self.decide(new, "latency", self.overload, self.classes, self.states, now, rng=self.rng)


class Client(asyncio.Protocol):
    """One client connection of the raw front: keep-alive, content-length bodies, one request at a time."""

    def __init__(self, engines: Engines, decision: Decision | None) -> None:
        self.engines, self.decision = engines, decision
        self.parser = httptools.HttpRequestParser(self)
        self.url, self.body = b"", bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_begin(self) -> None:
        self.url, self.body = b"", bytearray()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        assert self.transport is not None
        if not self.url.startswith(b"/v1/completions"):
            self.transport.write(HEALTHY)
            return
        body = bytes(self.body)
        if self.decision is not None:
            self.decision(body)
        write, started = self.transport.write, False

        def on_piece(piece: bytes | None) -> None:
            nonlocal started
            if piece is None:
                write(b"0\r\n\r\n")
                return
            framed = b"%x\r\n%b\r\n" % (len(piece), piece)
            if not started:
                started = True
                framed = STREAM_HEAD + framed
            write(framed)

        self.engines.send(body, on_piece)


def asgi_app(engines: list[str], client: str) -> Callable[..., Any]:
    """A bare ASGI proxy: the body read, one engine request, every piece sent on as it arrives."""
    raw = Engines(engines)
    sessions: list[Any] = []
    turn = itertools.cycle(engines)

    async def app(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["path"] != "/v1/completions":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        head = [(b"content-type", b"text/event-stream")]
        start = {"type": "http.response.start", "status": 200, "headers": head}
        if client == "raw":
            pieces: asyncio.Queue[bytes | None] = asyncio.Queue()
            raw.send(body, pieces.put_nowait)
            piece = await pieces.get()
            await send(start)
            while piece is not None:
                await send({"type": "http.response.body", "body": piece, "more_body": True})
                piece = await pieces.get()
        else:
            from jitserve.router.config import RouterConfig
            from jitserve.router.upstream import make_session

            if not sessions:  # the router's own data-path session, with its default settings
                sessions.append(make_session(RouterConfig()))
            upstream = await sessions[0].post(
                next(turn) + "/v1/completions", data=body, headers={"content-type": "application/json"}
            )
            await send(start)
            async for piece in upstream.content.iter_any():
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            upstream.release()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


async def serve_raw(engines: list[str], host: str, port: int, decide: bool) -> None:
    pool = Engines(engines)
    decision = Decision() if decide else None
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Client(pool, decision), host, port, backlog=4096)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mode", choices=("raw", "decide", "asgi", "aiohttp"), required=True)
    parser.add_argument("--engines", required=True, help="comma-separated engine URLs")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    engines = args.engines.split(",")
    if args.mode in ("raw", "decide"):
        uvloop.run(serve_raw(engines, args.host, args.port, args.mode == "decide"))
        return
    import uvicorn

    app = asgi_app(engines, "raw" if args.mode == "asgi" else "aiohttp")
    # keep-alive as the router sets it (router/cli.py): uvicorn's 5 s default closes the load client's
    # connections between rounds, racing with their reuse
    uvicorn.run(app, host=args.host, port=args.port, loop="uvloop", http="httptools", log_level="warning",
                access_log=False, timeout_keep_alive=75)  # fmt: skip


if __name__ == "__main__":
    main()
