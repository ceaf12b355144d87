"""The reference proxies of `bench/router.py --floor` relay whole streams over kept-alive connections.

Their added latency is compared with the router's (docs/benchmarks/router.md, "What each layer costs"),
which is only fair if they do the same work: every byte of every stream reaches the client, in order,
over one client connection reused request after request. Runs the real processes: the benchmark's fake
backend and each reference proxy, as `bench/router.py` starts them.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from router_fakes import free_port

ROOT = Path(__file__).resolve().parents[3]
TOKENS = 7


def _wait_healthy(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while True:
        assert proc.poll() is None, f"{proc.args} exited with {proc.returncode}"
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            assert time.monotonic() < deadline, f"{url} not healthy within 30 s"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def backends() -> Iterator[list[str]]:
    procs, urls = [], []
    try:
        for _ in range(2):
            port = free_port()
            cmd = [sys.executable, str(ROOT / "bench" / "router.py"), "backend", "--port", str(port)]
            procs.append(subprocess.Popen([*cmd, "--tokens", str(TOKENS)]))
            urls.append(f"http://127.0.0.1:{port}")
            _wait_healthy(urls[-1], procs[-1])
        yield urls
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=10)


@pytest.mark.parametrize("mode", ["raw", "decide", "asgi", "aiohttp"])
def test_reference_proxy_relays_every_stream_whole(backends: list[str], mode: str) -> None:
    port = free_port()
    cmd = [sys.executable, str(ROOT / "bench" / "proxy_floor.py"), "--mode", mode,
           "--engines", ",".join(backends), "--port", str(port)]  # fmt: skip
    proc = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{port}"
    body = {"model": "bench-model", "prompt": "hello", "max_tokens": TOKENS, "stream": True}
    try:
        _wait_healthy(url, proc)
        with httpx.Client(timeout=10) as c:
            with c.stream("POST", backends[0] + "/v1/completions", json=body) as direct:
                expected = b"".join(direct.iter_bytes())
            assert expected.count(b"data: {") == TOKENS and expected.endswith(b"data: [DONE]\n\n")
            for _ in range(10):  # one client connection, kept alive; both engines take turns
                with c.stream("POST", url + "/v1/completions", json=body) as resp:
                    assert resp.status_code == 200
                    assert resp.headers["content-type"].startswith("text/event-stream")
                    assert b"".join(resp.iter_bytes()) == expected
    finally:
        proc.terminate()
        proc.wait(timeout=10)
