"""Hardening of the real router (issue 14) in front of FAKE engines: hostile input answers 400 with no
traceback, auth covers every endpoint but the probes and /metrics, best-effort requests queue instead of
failing, a hung engine (a SIGSTOPped process) ends its streams and stops getting requests, and a burst
of streams through a narrow connect gate leaves every engine up.

The engines are FAKE (router_fakes.py) because these tests steer them exactly (a loaded state, a
process to stop); the router is the real one. No assertion is on speed: each waits for an outcome, and
a generous client timeout only bounds a hang (the router's own --read-timeout, 600 s, is far longer,
so a router that did not end a hung stream fails the test).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable

import httpx
import openai
import pytest
from router_fakes import MODEL, FakeEngine, FakeEngineProcess, RunningRouter, free_port, loaded_state

MSG = [{"role": "user", "content": "hello"}]


def wait_until(fn: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not fn():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting: {what}")
        time.sleep(0.05)


def post(
    r: RunningRouter, body: dict | bytes, headers: dict | None = None, path: str = "/v1/chat/completions"
):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(
        r.url + path,
        content=content,
        headers={"content-type": "application/json", **(headers or {})},
        timeout=60,
    )


def metric(r: RunningRouter, line_start: str) -> float | None:
    for line in httpx.get(r.url + "/metrics").text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def health(r: RunningRouter, url: str, key: str | None = None) -> str:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    replicas = httpx.get(r.url + "/jitserve/status", headers=headers).json()["replicas"]
    return replicas[url.split("://")[1]]["health"]


@pytest.fixture
def routed(
    fake_engines: tuple[FakeEngine, FakeEngine], start_router: Callable[..., RunningRouter]
) -> tuple[RunningRouter, FakeEngine, FakeEngine]:
    a, b = fake_engines
    return start_router("--engines", f"{a.url},{b.url}", ready=2), a, b


# -- hostile input --------------------------------------------------------------------------------------
@pytest.mark.parametrize("depth", [65, 1_000, 100_000])
def test_deeply_nested_json_is_a_400_not_a_500(routed, depth: int, caplog) -> None:
    r, a, b = routed
    nested = "[" * depth + "]" * depth
    raw = b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "x": %s}' % (
        MODEL.encode(),
        nested.encode(),
    )
    with caplog.at_level(logging.INFO, logger="jitserve"):
        resp = post(r, raw)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == "json_too_deep"
    assert a.received == [] and b.received == []
    assert not [rec for rec in caplog.records if rec.exc_info], "a bad request must not log a traceback"


def test_json_nested_within_the_limit_is_forwarded(routed) -> None:
    r, a, b = routed
    nested: object = "leaf"
    for _ in range(60):
        nested = {"k": nested}
    resp = post(r, {"model": MODEL, "messages": MSG, "max_tokens": 1, "metadata_blob": nested})
    assert resp.status_code == 200, resp.text
    assert len(a.received) + len(b.received) == 1


_SLO_BOUND_CASES = [
    ({"deadline": 86_401}, "deadline"),
    ({"deadline": 1e300}, "deadline"),
    ({"target_ttft": 100_000}, "target_ttft"),
    ({"target_ttft": 1, "target_tbt": 90_000}, "target_tbt"),
    ({"waiting_time": 1e9}, "waiting_time"),
    ({"slo_class": "latency", "target_ttft": 1e6}, "target_ttft"),
    ({"slo_class": "deadline", "deadline": "1e400"}, "deadline"),
    ({"deadline": "nan"}, "deadline"),
    ({"deadline": True}, "deadline"),
]


@pytest.mark.parametrize(
    ("fields", "param", "where"),
    [
        (fields, param, where)
        for fields, param in _SLO_BOUND_CASES
        for where in ("body", "headers")
        # a header carries a string only: a JSON boolean cannot be sent there
        if where == "body" or not any(isinstance(v, bool) for v in fields.values())
    ],
)
def test_every_slo_bound_is_a_400_naming_the_field(
    routed, fields: dict, param: str, where: str, caplog
) -> None:
    r, a, b = routed
    if where == "body":
        resp = post(r, {"model": MODEL, "messages": MSG, **fields})
    else:
        header = {
            "slo_class": "X-SLO-Class",
            "deadline": "X-SLO-Deadline",
            "target_ttft": "X-SLO-Target-TTFT",
            "target_tbt": "X-SLO-Target-TBT",
            "waiting_time": "X-SLO-Waiting-Time",
        }
        with caplog.at_level(logging.INFO, logger="jitserve"):
            resp = post(r, {"model": MODEL, "messages": MSG}, {header[k]: str(v) for k, v in fields.items()})
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["code"] == "invalid_slo" and err["param"] == param and param in err["message"], err
    assert a.received == [] and b.received == []
    assert not [rec for rec in caplog.records if rec.exc_info]


def test_the_largest_slo_times_are_accepted(routed) -> None:
    r, a, b = routed
    resp = post(
        r, {"model": MODEL, "messages": MSG, "max_tokens": 1, "deadline": 86_400, "waiting_time": 86_400}
    )
    assert resp.status_code == 200, resp.text
    assert (a.received + b.received)[0]["vllm_xargs"]["deadline"] == 86_400


def test_a_flood_of_bad_requests_logs_a_line_not_a_line_each(routed, caplog) -> None:
    r, _, _ = routed
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="jitserve"):
        for _ in range(30):
            assert post(r, {"model": MODEL, "messages": MSG, "deadline": -1}).status_code == 400
    took = time.monotonic() - started
    lines = [rec for rec in caplog.records if "rejected request" in rec.getMessage()]
    # one line per 10 s at most (however slow this machine is today), never one per request
    assert 1 <= len(lines) <= 1 + int(took // 10), [rec.getMessage() for rec in lines]
    assert not [rec for rec in caplog.records if rec.exc_info]
    assert metric(r, 'jitserve_router_bad_requests_total{code="invalid_slo"}') == 30


# -- auth --------------------------------------------------------------------------------------------------
def test_with_keys_every_endpoint_but_probes_and_metrics_needs_one(
    fake_engines: tuple[FakeEngine, FakeEngine], start_router: Callable[..., RunningRouter], tmp_path
) -> None:
    a, b = fake_engines
    keys = tmp_path / "keys"
    keys.write_text("sk-alpha team-a\n")
    r = start_router("--engines", f"{a.url},{b.url}", "--auth-file", str(keys), ready=2)
    for path in ("/v1/models", "/jitserve/status", "/openapi.json", "/docs", "/v1/nothing"):
        for headers in ({}, {"Authorization": "Bearer sk-wrong"}):
            resp = httpx.get(r.url + path, headers=headers)
            assert resp.status_code == 401, (path, resp.text)
            assert resp.json()["error"]["code"] in ("missing_api_key", "invalid_api_key")
            assert a.url.split("://")[1] not in resp.text  # no engine address leaks
    good = {"Authorization": "Bearer sk-alpha"}
    assert httpx.get(r.url + "/jitserve/status", headers=good).json()["replicas"]
    c = openai.OpenAI(base_url=r.url + "/v1", api_key="sk-alpha", max_retries=0)
    assert [m.id for m in c.models.list()] == [MODEL]
    assert httpx.get(r.url + "/openapi.json", headers=good).status_code == 200
    for path in ("/healthz", "/readyz", "/metrics"):
        assert httpx.get(r.url + path).status_code == 200, path


# -- best-effort: queued, never dropped for waiting ---------------------------------------------------------
def test_best_effort_is_served_by_a_loaded_engine_instead_of_a_429(
    start_router: Callable[..., RunningRouter],
) -> None:
    engine = FakeEngine("busy", state=loaded_state("busy", queue_delay_s=30.0)).start()
    try:
        r = start_router("--engines", engine.url, ready=1)
        # an SLO request is still refused at once: no engine can start it within its waiting_time
        refused = post(r, {"model": MODEL, "messages": MSG, "slo_class": "deadline"})
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "slo_unattainable"
        # best-effort (no SLO fields, what a plain client sends) queues there instead
        for stream in (False, True):
            resp = post(r, {"model": MODEL, "messages": MSG, "max_tokens": 2, "stream": stream})
            assert resp.status_code == 200, resp.text
            assert resp.headers["x-jitserve-slo-class"] == "best-effort"
        # the engine is told never to drop it for waiting (the SLO model's longest waiting_time)
        assert {body["vllm_xargs"]["waiting_time"] for body in engine.received[-2:]} == {86_400.0}
    finally:
        engine.stop()


def test_best_effort_queue_full_is_a_fast_429_with_retry_after_and_queued_ones_are_served(
    start_router: Callable[..., RunningRouter],
) -> None:
    engine = FakeEngine("one", tokens=1000, token_delay_s=0.05).start()
    try:
        r = start_router(
            "--engines", engine.url, "--best-effort-slots", "1", "--best-effort-queue", "1", ready=1
        )
        with httpx.stream(
            "POST",
            r.url + "/v1/completions",
            json={"model": MODEL, "prompt": "x", "max_tokens": 1000, "stream": True},
            timeout=60,
        ) as holder:
            assert holder.status_code == 200
            chunks = holder.iter_raw()  # (kept: a dropped iterator would close the stream)
            assert next(chunks)  # the stream runs: it holds the only best-effort slot
            queued: dict[str, httpx.Response] = {}
            t = threading.Thread(
                target=lambda: queued.setdefault(
                    "resp", post(r, {"model": MODEL, "prompt": "y", "max_tokens": 2}, path="/v1/completions")
                )
            )
            t.start()
            wait_until(lambda: metric(r, "jitserve_router_best_effort_queued") == 1, "the second one queued")
            full = post(r, {"model": MODEL, "prompt": "z", "max_tokens": 2}, path="/v1/completions")
            assert full.status_code == 429, full.text
            assert full.json()["error"]["code"] == "queue_full"
            assert int(full.headers["retry-after"]) >= 1
            assert not t.is_alive() or "resp" not in queued  # still queued behind the holder
        # the holder left: its slot passes to the queued request, which is served (not dropped)
        t.join(timeout=60)
        assert queued["resp"].status_code == 200, queued["resp"].text
        assert metric(r, 'jitserve_router_drops_total{reason="queue_full",slo_class="best-effort"}') == 1
    finally:
        engine.stop()


def test_best_effort_waits_for_an_engine_to_come_up_instead_of_a_503(
    start_router: Callable[..., RunningRouter],
) -> None:
    port = free_port()
    engine = FakeEngine("late", port=port)  # not started yet: connection refused
    r = start_router("--engines", engine.url, "--served-model-name", MODEL)
    got: dict[str, httpx.Response] = {}
    # waiting_time 0.3 s without an SLO: best-effort, which waiting_time no longer drops
    body = {"model": MODEL, "prompt": "x", "max_tokens": 2, "waiting_time": 0.3}
    t = threading.Thread(target=lambda: got.setdefault("resp", post(r, body, path="/v1/completions")))
    t.start()
    try:
        wait_until(lambda: metric(r, "jitserve_router_best_effort_queued") == 1, "queued with no engine")
        time.sleep(0.5)  # past its waiting_time: the request must still be waiting, not failed
        assert "resp" not in got
        engine.start()
        t.join(timeout=60)
        assert got["resp"].status_code == 200, got["resp"].text
        assert len(engine.received) == 1
    finally:
        engine.stop()


# -- a hung engine -----------------------------------------------------------------------------------------
def read_sse(resp: httpx.Response) -> list[dict | str]:
    events: list[dict | str] = []
    for line in resp.iter_lines():
        if line.startswith("data: "):
            data = line[6:]
            events.append("[DONE]" if data == "[DONE]" else json.loads(data))
            if data == "[DONE]":
                break
    return events


def test_a_sigstopped_engine_ends_its_streams_retries_what_had_no_answer_and_gets_nothing_new(
    start_router: Callable[..., RunningRouter],
) -> None:
    hung = FakeEngineProcess("hung", tokens=2000, token_delay_s=0.05).start()
    # the other engine looks loaded, so the SLO stream below lands on `hung`; best-effort still may go here
    other = FakeEngine("other", state=loaded_state("other", queue_delay_s=30.0)).start()
    try:
        r = start_router(
            "--engines", f"{hung.url},{other.url}", "--poll-timeout", "0.5", "--unresponsive-timeout", "5",
            ready=2,
        )  # fmt: skip
        body = {"model": MODEL, "prompt": "x", "max_tokens": 2000, "stream": True, "slo_class": "deadline"}
        with httpx.stream("POST", r.url + "/v1/completions", json=body, timeout=60) as running:
            assert (
                running.status_code == 200 and running.headers["x-jitserve-pod"] == hung.url.split("://")[1]
            )
            lines = running.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))  # tokens flow
            hung.pause()  # SIGSTOP: connections still open, nothing answers any more
            # (found hung no sooner than --poll-timeout + --unresponsive-timeout = 5.5 s from now: the two
            # requests below reach it well before, so both must be retried)
            # requests sent now reach `hung` (not detected yet) and get nothing back: they must be
            # retried on `other`, a unary one and a stream alike (the client had nothing yet)
            results: dict[str, httpx.Response] = {}

            def send(key: str, stream: bool) -> None:
                results[key] = post(
                    r,
                    {"model": MODEL, "prompt": "y", "max_tokens": 2, "stream": stream},
                    path="/v1/completions",
                )

            threads = [threading.Thread(target=send, args=(k, k == "stream")) for k in ("unary", "stream")]
            for t in threads:
                t.start()
            # the running stream ends with an error event, not a 600 s silence (httpx would time out at 60)
            rest = [line for line in lines if line.startswith("data: ")]
            assert rest[-1] == "data: [DONE]"
            error = json.loads(rest[-2][6:])["error"]
            assert error["code"] == "upstream_unresponsive", error
        for t in threads:
            t.join(timeout=60)
        for key in ("unary", "stream"):
            resp = results[key]
            assert resp.status_code == 200, (key, resp.text)
            assert resp.headers["x-jitserve-pod"] == other.url.split("://")[1]
        assert health(r, hung.url) == "down"
        assert httpx.get(r.url + "/jitserve/status").json()["replicas"][hung.url.split("://")[1]][
            "unresponsive"
        ]
        assert metric(r, 'jitserve_router_retries_total{reason="unresponsive"}') == 2  # both were retried
        # nothing new goes to it while it is down
        before = len(other.received)
        for _ in range(3):
            resp = post(r, {"model": MODEL, "prompt": "z", "max_tokens": 1}, path="/v1/completions")
            assert resp.status_code == 200 and resp.headers["x-jitserve-pod"] == other.url.split("://")[1]
        assert len(other.received) == before + 3
        assert metric(r, "jitserve_router_replica_unresponsive_total") == 1
        # SIGCONT: it answers its polls again and is usable again
        hung.resume()
        wait_until(lambda: health(r, hung.url) == "fresh", "the resumed engine back in the pool")
    finally:
        hung.stop()
        other.stop()


# -- a burst of streams ------------------------------------------------------------------------------------
def test_a_burst_of_streams_through_a_narrow_connect_gate_leaves_every_engine_up(
    fake_engines: tuple[FakeEngine, FakeEngine], start_router: Callable[..., RunningRouter]
) -> None:
    a, b = fake_engines
    a.token_delay_s = b.token_delay_s = 0.01
    # at most 4 engine connects at once: the other streams wait their turn before the connect timeout
    # starts, so none of them times out connecting and no engine is marked down
    r = start_router(
        "--engines", f"{a.url},{b.url}", "--max-connecting", "4", "--connect-timeout", "2", ready=2
    )
    n = 300

    async def burst() -> list[tuple[int, bytes]]:
        limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
        async with httpx.AsyncClient(limits=limits, timeout=120) as c:

            async def one(i: int) -> tuple[int, bytes]:
                body = {"model": MODEL, "prompt": f"p{i}", "max_tokens": 4, "stream": True}
                resp = await c.post(r.url + "/v1/completions", json=body)
                return resp.status_code, resp.content

            return await asyncio.gather(*(one(i) for i in range(n)))

    results = asyncio.run(burst())
    statuses = [s for s, _ in results]
    assert statuses.count(200) == n, {s: statuses.count(s) for s in set(statuses)}
    assert all(
        content.rstrip().endswith(b"data: [DONE]") and b'"error"' not in content for _, content in results
    )
    assert health(r, a.url) != "down" and health(r, b.url) != "down"
    assert len(a.received) + len(b.received) == n


def test_a_connect_timeout_marks_an_engine_down_only_if_its_probe_gets_no_answer() -> None:
    """Pool level, with real sockets: an engine that answers and a socket that accepts connections (the
    kernel completes them) but never answers, like a SIGSTOPped process. The connect timeout itself is
    handed in as aiohttp's own exception: making a real one happen on demand needs an overloaded host."""
    import socket

    import aiohttp

    from jitserve.router.pool import Pool

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    alive = FakeEngine("alive").start()
    try:

        async def go() -> None:
            pool = Pool(unresponsive_timeout_s=1.0)
            pool.set_targets({"alive": alive.url, "silent": f"http://127.0.0.1:{silent.getsockname()[1]}"})
            async with aiohttp.ClientSession() as session:
                pool.client = session
                for r in pool.replicas.values():
                    r.healthy = True  # as after a good poll
                    pool.connect_failed(r, aiohttp.ConnectionTimeoutError("connect timed out"))
                    assert not r.down  # a timeout alone (perhaps our own overload) is not "down"
                await asyncio.gather(*pool._probes)
            assert not pool.replicas["alive"].down  # its probe answered: healthy, stays in the pool
            assert pool.replicas["silent"].down and pool.replicas["silent"].unresponsive

        asyncio.run(go())
    finally:
        alive.stop()
        silent.close()


def test_a_stream_without_response_headers_is_retried_elsewhere_and_the_engine_stays_up(
    fake_engines: tuple[FakeEngine, FakeEngine], start_router: Callable[..., RunningRouter]
) -> None:
    a, b = fake_engines
    a.mode = "hang_headers"  # completions hang before the headers; its /health still answers
    b.state = loaded_state("b", queue_delay_s=30.0)  # so best-effort tries the idle-looking `a` first
    r = start_router("--engines", f"{a.url},{b.url}", "--header-timeout", "1", ready=2)
    resp = post(r, {"model": MODEL, "prompt": "x", "max_tokens": 2, "stream": True}, path="/v1/completions")
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-jitserve-pod"] == b.url.split("://")[1] and len(a.received) == 1
    assert metric(r, 'jitserve_router_retries_total{reason="header_timeout"}') == 1
    wait_until(lambda: not r.router.pool.replicas[a.url.split("://")[1]].probing, "a's probe to finish")
    assert health(r, a.url) != "down"  # it answered its probe: slow, not hung


def test_the_first_token_bound_of_an_slo_stream_covers_the_wait_for_headers(
    fake_engines: tuple[FakeEngine, FakeEngine], start_router: Callable[..., RunningRouter]
) -> None:
    a, b = fake_engines
    a.mode = b.mode = "hang_headers"
    # headers may take 600 s here: only the first-token bound (0.5 + 0.5 s + prefill) can end the wait
    r = start_router(
        "--engines", f"{a.url},{b.url}", "--header-timeout", "600", "--first-token-grace", "0.5", ready=2
    )
    body = {
        "model": MODEL,
        "prompt": "x",
        "max_tokens": 2,
        "stream": True,
        "target_ttft": 20,  # a stream: dropped unstarted at its waiting_time (deadline work would wait 20 s)
        "waiting_time": 0.5,
    }
    resp = post(r, body, path="/v1/completions")  # (the client gives up after 60 s: that would fail)
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "waiting_time_exceeded", resp.text


def test_an_engine_whose_scheduler_is_stuck_is_found_by_its_unmoving_report(
    fake_engines: tuple[FakeEngine, FakeEngine], start_router: Callable[..., RunningRouter]
) -> None:
    """A stuck GPU: the engine's HTTP server (and /health) still answer, its stream stops after a token
    and its state report's updated_at stops moving (the JITServe engine refreshes it every second while
    it steps or idles)."""
    a, b = fake_engines
    a.mode = "stuck_after_first"
    b.state = loaded_state("b", queue_delay_s=30.0)  # the SLO stream goes to `a`
    r = start_router("--engines", f"{a.url},{b.url}", "--unresponsive-timeout", "1", ready=2)
    body = {"model": MODEL, "prompt": "x", "max_tokens": 50, "stream": True, "slo_class": "deadline"}
    with httpx.stream("POST", r.url + "/v1/completions", json=body, timeout=60) as resp:
        assert resp.status_code == 200 and resp.headers["x-jitserve-pod"] == a.url.split("://")[1]
        a.frozen_updated_at = time.time()  # its scheduler stops stepping
        events = read_sse(resp)
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "upstream_unresponsive", events
    assert health(r, a.url) == "down"
    resp = post(r, {"model": MODEL, "prompt": "y", "max_tokens": 1}, path="/v1/completions")
    assert resp.status_code == 200 and resp.headers["x-jitserve-pod"] == b.url.split("://")[1]
    a.mode, a.frozen_updated_at = "ok", None  # it steps again: back in the pool
    wait_until(lambda: health(r, a.url) == "fresh", "the recovered engine back in the pool")


def test_a_client_that_leaves_the_best_effort_queue_gives_its_place_up(
    start_router: Callable[..., RunningRouter],
) -> None:
    engine = FakeEngine("one", tokens=1000, token_delay_s=0.05).start()
    try:
        r = start_router("--engines", engine.url, "--best-effort-slots", "1", ready=1)
        with httpx.stream(
            "POST",
            r.url + "/v1/completions",
            json={"model": MODEL, "prompt": "x", "max_tokens": 1000, "stream": True},
            timeout=60,
        ) as holder:
            chunks = holder.iter_raw()
            assert next(chunks)  # holds the only slot
            with pytest.raises(httpx.ReadTimeout):  # queued behind it; this client gives up
                httpx.post(r.url + "/v1/completions", json={"model": MODEL, "prompt": "ghost"}, timeout=1.0)
            wait_until(
                lambda: metric(r, "jitserve_router_best_effort_queued") == 0, "the ghost left the queue"
            )
            assert (
                metric(r, 'jitserve_router_drops_total{reason="client_disconnect",slo_class="best-effort"}')
                == 1
            )
        # the holder is gone too: the next request is served at once, and the ghost never reached the engine
        resp = post(r, {"model": MODEL, "prompt": "after", "max_tokens": 1}, path="/v1/completions")
        assert resp.status_code == 200
        assert [b["prompt"] for b in engine.received] == ["x", "after"]
    finally:
        engine.stop()
