"""The reference proxies of `bench/router.py --floor` relay whole streams over kept-alive connections.

Their added latency is compared with the router's (docs/benchmarks/router.md, "What each layer costs"),
which is only fair if they do the same work: every byte of every stream reaches the client, in order,
over one client connection reused request after request. Runs the real processes: the benchmark's fake
backend and each reference proxy, as `bench/router.py` starts them.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from router_fakes import bench_process

TOKENS = 7


@pytest.fixture(scope="module")
def backends() -> Iterator[list[str]]:
    args = ("router.py", "backend", "--tokens", str(TOKENS))
    with bench_process(*args) as first, bench_process(*args) as second:
        yield [first, second]


@pytest.mark.parametrize("mode", ["raw", "decide", "asgi", "aiohttp"])
def test_reference_proxy_relays_every_stream_whole(backends: list[str], mode: str) -> None:
    body = {"model": "bench-model", "prompt": "hello", "max_tokens": TOKENS, "stream": True}
    engines = ",".join(backends)
    with (
        bench_process("proxy_floor.py", "--mode", mode, "--engines", engines) as url,
        httpx.Client(timeout=10) as c,
    ):
        with c.stream("POST", backends[0] + "/v1/completions", json=body) as direct:
            expected = b"".join(direct.iter_bytes())
        assert expected.count(b"data: {") == TOKENS and expected.endswith(b"data: [DONE]\n\n")
        for _ in range(10):  # one client connection, kept alive; both engines take turns
            with c.stream("POST", url + "/v1/completions", json=body) as resp:
                assert resp.status_code == 200
                assert resp.headers["content-type"].startswith("text/event-stream")
                assert b"".join(resp.iter_bytes()) == expected
