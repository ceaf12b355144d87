"""The router's HTTP API in front of FAKE engines: bad input, SLO fields in body and headers, what the
engine receives, auth, status and metrics. (Real-engine SDK tests: test_router_real_engines.py.)"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import httpx
import openai
import pytest
from router_fakes import MODEL, FakeEngine, RunningRouter, idle_state

MSG = [{"role": "user", "content": "hello"}]


@pytest.fixture
def routed(
    fake_engines: tuple[FakeEngine, FakeEngine], start_router: Callable[..., RunningRouter]
) -> tuple[RunningRouter, FakeEngine, FakeEngine]:
    a, b = fake_engines
    return start_router("--engines", f"{a.url},{b.url}", "--max-body-bytes", "20000", ready=2), a, b


def sent(a: FakeEngine, b: FakeEngine) -> dict:
    bodies = a.received + b.received
    assert len(bodies) == 1
    return bodies[0]


def post(r: RunningRouter, path: str, content: bytes | str, headers: dict | None = None) -> httpx.Response:
    return httpx.post(
        r.url + path, content=content, headers={"content-type": "application/json", **(headers or {})}
    )


def assert_openai_error(resp: httpx.Response, status: int, code: str, param: str | None = None) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == code and err["param"] == param and err["message"]
    return err


def test_malformed_json_is_a_400_naming_the_problem(routed) -> None:
    r, a, b = routed
    err = assert_openai_error(post(r, "/v1/chat/completions", b'{"model": "x", '), 400, "invalid_json")
    assert "not valid JSON" in err["message"]
    assert_openai_error(post(r, "/v1/completions", b"[1, 2]"), 400, "invalid_json")
    assert a.received == [] and b.received == []


def test_oversized_body_is_a_413(routed) -> None:
    r, _, _ = routed
    body = json.dumps({"model": MODEL, "prompt": "x" * 30000})
    err = assert_openai_error(post(r, "/v1/completions", body), 413, "body_too_large")
    assert "20000 bytes" in err["message"]


@pytest.mark.parametrize(
    ("extra", "param", "code"),
    [
        ({"deadline": -1}, "deadline", "invalid_slo"),
        ({"target_ttft": 0}, "target_ttft", "invalid_slo"),
        ({"waiting_time": "soon"}, "waiting_time", "invalid_slo"),
        ({"target_tbt": 0.1}, "target_tbt", "invalid_slo"),
        ({"slo_class": "gold"}, "slo_class", "unknown_slo_class"),
        ({"max_tokens": 0}, "max_tokens", "invalid_value"),
        ({"max_tokens": 10**30}, "max_tokens", "invalid_value"),
        ({"program_stages": 0, "program_id": "p"}, "program_stages", "invalid_value"),
        ({"messages": []}, "messages", "invalid_value"),
    ],
)
def test_bad_fields_are_400s_naming_the_field(routed, extra: dict, param: str, code: str) -> None:
    r, a, b = routed
    body = {"model": MODEL, "messages": MSG, **extra}
    err = assert_openai_error(post(r, "/v1/chat/completions", json.dumps(body)), 400, code, param)
    assert param in err["message"]
    assert a.received == [] and b.received == []


def test_sdk_sees_bad_input_as_exceptions(routed) -> None:
    r, _, _ = routed
    c = openai.OpenAI(base_url=r.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as bad:
        c.chat.completions.create(model=MODEL, messages=MSG, extra_body={"slo_class": "gold"})
    assert bad.value.code == "unknown_slo_class" and "gold" in bad.value.message
    with pytest.raises(openai.NotFoundError) as missing:
        c.completions.create(model="no-such-model", prompt="x")
    assert missing.value.code == "model_not_found" and MODEL in missing.value.message


def test_slo_in_the_body_reaches_the_engine_in_vllm_xargs(routed) -> None:
    r, a, b = routed
    body = {
        "model": MODEL, "messages": MSG, "max_tokens": 3, "slo_class": "latency", "target_ttft": 1.5,
        "waiting_time": 2, "vllm_xargs": {"custom_key": 7, "slo_class": "cheat", "tenant": "someone-else"},
    }  # fmt: skip
    resp = post(r, "/v1/chat/completions", json.dumps(body))
    assert resp.status_code == 200
    got = sent(a, b)
    assert not {"slo_class", "target_ttft", "waiting_time"} & got.keys()  # router-only fields stripped
    x = got["vllm_xargs"]
    assert x["slo_class"] == "latency" and x["target_ttft"] == 1.5 and x["target_tbt"] == 0.1
    assert x["waiting_time"] == 2 and x["tenant"] == "default" and x["custom_key"] == 7
    assert "deadline" not in x


def test_slo_in_headers_and_body_wins_over_headers(routed) -> None:
    r, a, b = routed
    headers = {"X-SLO-Class": "deadline", "X-SLO-Deadline": "12.5", "X-SLO-Waiting-Time": "3"}
    resp = post(
        r,
        "/v1/completions",
        json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 4, "deadline": 9}),
        headers,
    )
    assert resp.status_code == 200 and resp.headers["x-jitserve-slo-class"] == "deadline"
    x = sent(a, b)["vllm_xargs"]
    assert x["slo_class"] == "deadline" and x["deadline"] == 9 and x["waiting_time"] == 3


def test_explicit_times_without_a_class_and_the_default_class(routed) -> None:
    r, a, b = routed
    post(r, "/v1/completions", json.dumps({"model": MODEL, "prompt": "x", "target_ttft": 0.5}))
    x = sent(a, b)["vllm_xargs"]
    assert "slo_class" not in x and x["target_ttft"] == 0.5  # "custom": the engine resolves the fields
    a.received.clear()
    b.received.clear()
    resp = post(r, "/v1/completions", json.dumps({"model": MODEL, "prompt": "x"}))
    assert resp.headers["x-jitserve-slo-class"] == "best-effort"  # the built-in classes' default
    assert sent(a, b)["vllm_xargs"]["deadline"] == 300


def test_program_calls_get_growing_sub_deadlines_and_program_goodput(routed) -> None:
    r, a, b = routed
    deadlines = []
    for _ in range(3):
        body = {
            "model": MODEL,
            "prompt": "step",
            "max_tokens": 2,
            "program_id": "agent-7",
            "program_stages": 3,
        }
        assert post(r, "/v1/completions", json.dumps(body)).status_code == 200
    for got in sorted(a.received + b.received, key=lambda g: g["vllm_xargs"]["stage_deadline"]):
        x = got["vllm_xargs"]
        assert x["slo_class"] == "compound" and x["program_id"] == "agent-7"
        deadlines.append((x["stage_deadline"], x["deadline"], x["program_goodput"]))
    # 3 stages x 20 s per stage: D = 60 s split evenly with no history. The program's stake rides along:
    # stage 1 carries stage 0's tokens and one more stage like it, stage 2 the two calls before it, alike
    stage, program, goodput = zip(*deadlines, strict=True)
    assert [round(s, -1) for s in stage] == [20, 40, 60]
    assert all(55 < p <= 60 for p in program)
    assert goodput[1] > 0 and goodput[1] == pytest.approx(goodput[2])


def test_a_program_on_just_in_time_engines_budgets_each_later_stages_wait(
    start_router: Callable[..., RunningRouter],
) -> None:
    """Engines report a reservation: a stage at stake waits 2 s for a slot on one, 4 s on the other. The
    router budgets their mean, 3 s, for each later stage, so stage 0 of three (D = 60 s) ends before its
    even 20 s by 2 x 3 s x 20 / 60; stage 1 by one wait; the last stage gets the rest. Each call carries
    its times relative to when it was sent (`deadline`: what is left of D then), so each is checked
    against what was left of D when it was sent, however long the calls took."""
    full = dict(running=8, waiting=8, queue_delay_s=9.0, yieldable=0)  # a slot turn is 1 s
    a = FakeEngine("a", state=idle_state("a", **full, reserved_waiting=1)).start()
    b = FakeEngine("b", state=idle_state("b", **full, reserved_waiting=3)).start()
    try:
        r = start_router("--engines", f"{a.url},{b.url}", ready=2)
        for _ in range(3):
            polls, give_up = a.state_polls + b.state_polls, time.monotonic() + 10.0
            while a.state_polls + b.state_polls < polls + 4:  # fresh reports: no dispatch counted in them yet
                assert time.monotonic() < give_up, "the router stopped polling the engines' state"
                time.sleep(0.02)
            body = {"model": MODEL, "prompt": "step", "max_tokens": 2, "program_id": "p", "program_stages": 3}
            assert post(r, "/v1/completions", json.dumps(body)).status_code == 200
        got = sorted(
            (g["vllm_xargs"]["stage_deadline"], g["vllm_xargs"]["deadline"]) for g in a.received + b.received
        )
    finally:
        a.stop()
        b.stop()
    (s0, left0), (s1, left1), (s2, left2) = got
    # stage s's uniform plan ends at (s + 1) x 20 s of the program: left - (60 - 20 (s + 1)) from its send
    assert s0 == pytest.approx((left0 - 40.0) * (left0 - 2 * 3.0) / left0, abs=0.05)
    assert s1 == pytest.approx((left1 - 20.0) * (left1 - 3.0) / left1, abs=0.05)
    assert s2 == pytest.approx(left2, abs=0.01) and 55 < left2 < left1 < left0 <= 60


def test_status_and_metrics_report_per_class_goodput(routed) -> None:
    r, _, _ = routed
    c = openai.OpenAI(base_url=r.url + "/v1", api_key="unused", max_retries=0)
    for _ in range(2):
        c.chat.completions.create(
            model=MODEL, messages=MSG, max_tokens=3, extra_body={"slo_class": "latency"}
        )
    list(
        c.completions.create(model=MODEL, prompt="x", max_tokens=3, stream=True, extra_body={"deadline": 30})
    )
    status = httpx.get(r.url + "/jitserve/status").json()
    lat = status["classes"]["latency"]
    assert lat["finished"] == 2 and lat["attainment"] == 1.0 and lat["goodput"] > 0
    # streamed: no usage block, so the prompt counts as the router's estimate (1 token for "x") + 3 tokens
    assert status["classes"]["custom"]["goodput_tokens_total"] == 1 + 3
    metrics = httpx.get(r.url + "/metrics").text
    for line in (
        'jitserve_router_requests_total{endpoint="chat",slo_class="latency"} 2.0',
        'jitserve_router_admissions_total{decision="admitted",slo_class="latency"} 2.0',
        'jitserve_router_slo_met_requests_total{slo_class="latency"} 2.0',
        'jitserve_router_ttft_seconds_count{slo_class="custom"} 1.0',
        'jitserve_router_tbt_seconds_count{slo_class="custom"} 2.0',
        'jitserve_router_replicas{health="fresh"} 2.0',
    ):
        assert line in metrics
    assert "jitserve_router_e2e_latency_seconds_bucket" in metrics
    assert (
        "jitserve_router_goodput_tokens_total" in metrics and "jitserve_router_pod_choices_total" in metrics
    )


def test_models_health_and_readiness(routed) -> None:
    r, _, _ = routed
    assert httpx.get(r.url + "/healthz").json() == {"status": "ok"}
    assert httpx.get(r.url + "/readyz").status_code == 200
    c = openai.OpenAI(base_url=r.url + "/v1", api_key="unused", max_retries=0)
    assert [m.id for m in c.models.list()] == [MODEL]
    nf = httpx.get(r.url + "/v1/nothing")
    assert nf.status_code == 404 and nf.json()["error"]["code"] == "not_found"


def test_api_keys_map_to_tenants(
    fake_engines: tuple[FakeEngine, FakeEngine], start_router: Callable[..., RunningRouter], tmp_path
) -> None:
    a, b = fake_engines
    keys = tmp_path / "keys"
    keys.write_text("# key tenant\nsk-alpha team-a\nsk-beta team-b\n")
    r = start_router("--engines", f"{a.url},{b.url}", "--auth-file", str(keys), ready=2)
    with pytest.raises(openai.AuthenticationError) as missing:
        openai.OpenAI(base_url=r.url + "/v1", api_key="sk-wrong", max_retries=0).completions.create(
            model=MODEL, prompt="x"
        )
    assert missing.value.code == "invalid_api_key"
    assert post(r, "/v1/completions", json.dumps({"model": MODEL, "prompt": "x"})).status_code == 401
    c = openai.OpenAI(base_url=r.url + "/v1", api_key="sk-beta", max_retries=0)
    c.completions.create(model=MODEL, prompt="x", max_tokens=1)
    assert sent(a, b)["vllm_xargs"]["tenant"] == "team-b"
    assert httpx.get(r.url + "/healthz").status_code == 200  # probes need no key


def test_classes_file_in_the_operators_configmap_format(
    fake_engines: tuple[FakeEngine, FakeEngine], start_router: Callable[..., RunningRouter], tmp_path
) -> None:
    from jitserve.scheduler.contracts.classes_configmap import render_classes
    from jitserve.scheduler.slo import SLOClassSpec

    a, b = fake_engines
    classes = {
        "chat": SLOClassSpec(type="latency", ttftSeconds=0.8, tbtSeconds=0.05),
        "jobs": SLOClassSpec(type="deadline", deadlineSeconds=40),
    }
    path = tmp_path / "cm.json"
    path.write_text(json.dumps(render_classes(classes, "jobs")))  # exactly what the operator writes
    r = start_router("--engines", f"{a.url},{b.url}", "--classes-file", str(path), ready=2)
    post(r, "/v1/completions", json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 4}))
    assert sent(a, b)["vllm_xargs"] == {
        "waiting_time": 5.0,
        "tenant": "default",
        "slo_class": "jobs",
        "deadline": 40,
    }
    resp = post(r, "/v1/completions", json.dumps({"model": MODEL, "prompt": "x", "slo_class": "latency"}))
    assert_openai_error(resp, 400, "unknown_slo_class", "slo_class")  # only the pool's classes exist
