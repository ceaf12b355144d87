"""A FAKE engine for the fault suite that counts how each request ended at the engine: finished, or cut
by its client (the router) before the end. The app is router_fakes.FakeEngine's (stream-faithful: the
same chunks vLLM sends), plus `GET /fake/stats`; it runs in a process of its own so a test can kill -9
or SIGSTOP it, and it stops streaming when the router goes away, as vLLM aborts such a request.

    python tests/faults/fake_engine.py NAME PORT TOKENS TOKEN_DELAY_S
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
for _path in (ROOT, ROOT / "tests" / "integration" / "router"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import httpx  # noqa: E402
import uvicorn  # noqa: E402
from router_fakes import FakeEngine, FakeEngineProcess, free_port  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse, Response, StreamingResponse  # noqa: E402


@dataclass
class TrackingEngine(FakeEngine):
    """FakeEngine that counts requests `finished` (the whole answer written) and `aborted` (a stream
    whose client left before its end: the engine stops generating, as vLLM aborts the request)."""

    counts: dict[str, int] = field(default_factory=lambda: {"requests": 0, "finished": 0, "aborted": 0})

    def app(self) -> Starlette:
        app = super().app()

        async def stats(_: Request) -> Response:
            return JSONResponse({**self.counts, "open": self.counts["requests"] - self.finished_or_aborted})

        app.add_route("/fake/stats", stats)
        return app

    @property
    def finished_or_aborted(self) -> int:
        return self.counts["finished"] + self.counts["aborted"]

    async def _complete(self, request: Request, chat: bool) -> Response:
        self.counts["requests"] += 1
        resp = await super()._complete(request, chat)
        if not isinstance(resp, StreamingResponse):
            self.counts["finished"] += 1
            return resp
        inner = resp.body_iterator

        async def tracked() -> AsyncIterator[Any]:
            done = False
            try:
                async for chunk in inner:
                    yield chunk
                done = True
            finally:  # cancelled (Starlette saw http.disconnect) or closed unfinished
                self.counts["finished" if done else "aborted"] += 1

        resp.body_iterator = tracked()
        return resp


@dataclass
class TrackingEngineProcess(FakeEngineProcess):
    """A TrackingEngine in a process of its own: `kill()` is kill -9, `pause()` SIGSTOP."""

    def start(self, timeout: float = 60.0) -> TrackingEngineProcess:
        return self.launch().wait_started(timeout)

    def launch(self) -> TrackingEngineProcess:
        """Start the process and return at once (start several, then wait for each)."""
        cmd = [sys.executable, __file__, self.name, str(self.port), str(self.tokens), str(self.token_delay_s)]
        self.proc = subprocess.Popen(cmd)
        return self

    def wait_started(self, timeout: float = 60.0) -> TrackingEngineProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"fake engine process {self.name} did not start")

    def stats(self) -> dict[str, int]:
        return httpx.get(self.url + "/fake/stats", timeout=10).json()

    def kill(self) -> None:
        """kill -9: the kernel closes its sockets (connections reset, new connects refused)."""
        self.proc.kill()
        self.proc.wait(timeout=10)


if __name__ == "__main__":
    name, port, tokens, delay = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    engine = TrackingEngine(name, port=port, tokens=tokens, token_delay_s=delay)
    uvicorn.run(engine.app(), host="127.0.0.1", port=port, log_level="warning", lifespan="off")

__all__ = ["TrackingEngine", "TrackingEngineProcess", "free_port"]
