"""The engine's vLLM-free parts: xargs, classes file, speed meter, goodput window, CLI, HTTP, metrics."""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from jitserve.engine.accounting import GoodputWindow
from jitserve.engine.classes import ClassSource
from jitserve.engine.cli import ADAPTER_CLS, CPU_JIT_BLOCK_SIZE, MIDDLEWARE, add_arguments, build_command
from jitserve.engine.http import JITServeStateMiddleware
from jitserve.engine.runner import FrameRunner
from jitserve.engine.settings import SchedulerSettings
from jitserve.engine.state import EngineState, prometheus_text, read_state, write_atomic
from jitserve.scheduler.contracts.xargs import XARGS_KEYS, parse_xargs
from jitserve.scheduler.frames import FULL, LIGHT
from jitserve.scheduler.goodput import RequestRecord
from jitserve.scheduler.policy import GMAXPolicy
from jitserve.scheduler.requests import COMPOUND, DEADLINE, LATENCY
from jitserve.scheduler.slo import PAPER_CLASSES, SLO, SLOType

# ------------------------------------------------------------------------------------------- xargs


def test_xargs_resolve_classes_overrides_and_compound_fields() -> None:
    info = parse_xargs(
        {"slo_class": "compound", "stages": 3, "stage_deadline": 12.5, "program_id": "p1",
         "program_goodput": 40, "tenant": "acme", "length_bound": 64},
        PAPER_CLASSES, "best-effort", arrival=100.0,
    )  # fmt: skip
    assert info.error is None and info.slo.type is SLOType.COMPOUND
    assert info.slo.deadline == 60.0  # per-stage class deadline x 3 stages
    assert info.deadline_abs == 112.5 and info.program_id == "p1" and info.program_goodput == 40.0
    assert info.program_deadline_abs == 160.0  # the program's: a stage waits for it, not for D_s
    assert (info.tenant, info.length_bound) == ("acme", 64)


@pytest.mark.parametrize(
    "xargs, field",
    [
        ({"deadline": -1}, "deadline"),
        ({"target_tbt": 0.1}, "target_tbt"),
        ({"slo_class": "gold"}, "slo_class"),
        ({"stage_deadline": "soon"}, "stage_deadline"),
        ({"length_bound": 2.5}, "length_bound"),
        ({"stages": 0}, "stages"),
    ],
)
def test_bad_xargs_fall_back_to_the_default_class(xargs: dict[str, Any], field: str) -> None:
    info = parse_xargs(xargs, PAPER_CLASSES, "deadline", arrival=0.0)
    assert info.slo_class == "deadline" and info.slo.type is SLOType.DEADLINE
    assert info.error is not None and info.error.startswith(field)


def test_xargs_keys_are_the_documented_set() -> None:
    assert set(XARGS_KEYS) == {
        "slo_class", "deadline", "target_ttft", "target_tbt", "waiting_time", "program_id", "stages",
        "stage_deadline", "program_goodput", "tenant", "length_bound",
    }  # fmt: skip


# ----------------------------------------------------------------------------------------- classes


def test_classes_file_reloads_on_change_and_keeps_last_good(tmp_path: Path) -> None:
    path = tmp_path / "classes.json"
    path.write_text(json.dumps({"a": {"type": "deadline", "deadlineSeconds": 5}}))
    src = ClassSource(str(path), default_flag="a")
    assert set(src.snapshot.classes) == {"a"} and src.snapshot.default == "a" and src.snapshot.version == 1
    assert src.poll() is False  # unchanged: no reload
    path.write_text(
        json.dumps({"a": {"type": "deadline", "deadlineSeconds": 5}, "b": {"type": "best-effort"}})
    )
    os.utime(path, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    assert src.poll() is True and set(src.snapshot.classes) == {"a", "b"} and src.snapshot.version == 2
    path.write_text('{"a": {"type": "latency"}}')  # invalid: latency needs ttft
    os.utime(path, ns=(time.time_ns() + 2 * 10**9, time.time_ns() + 2 * 10**9))
    assert src.poll() is False and "class 'a'" in (src.last_error or "")
    assert set(src.snapshot.classes) == {"a", "b"}  # last good kept


def test_classes_file_in_configmap_shapes(tmp_path: Path) -> None:
    # the operator's ConfigMap mounted as files: classes.json plus a sibling `default`
    (tmp_path / "classes.json").write_text(json.dumps({"x": {"type": "best-effort"}, "y": {"type": "deadline",
                                                       "deadlineSeconds": 3}}))  # fmt: skip
    (tmp_path / "default").write_text("y\n")
    assert ClassSource(str(tmp_path / "classes.json"), default_flag="x").snapshot.default == "y"
    data = tmp_path / "data.json"  # the ConfigMap's data object as one JSON file
    data.write_text(json.dumps({"classes.json": json.dumps({"z": {"type": "best-effort"}}), "default": "z"}))
    snap = ClassSource(str(data)).snapshot
    assert set(snap.classes) == {"z"} and snap.default == "z"
    with pytest.raises(ValueError, match="default class 'nope'"):
        ClassSource(str(_write(tmp_path, "nope")))


def _write(tmp_path: Path, default: str) -> Path:
    p = tmp_path / "bad.json"
    p.write_text(json.dumps({"classes.json": {"z": {"type": "best-effort"}}, "default": default}))
    return p


# ------------------------------------------------------------------------------------------ goodput


def test_goodput_window_per_class() -> None:
    w = GoodputWindow(window_s=10)
    slo = SLO.deadline_slo(deadline=5)
    w.record("d", RequestRecord(slo=slo, arrival=0, input_len=10, token_times=[1, 2], finish=2), now=2)
    w.record("d", RequestRecord(slo=slo, arrival=0, input_len=10, token_times=[9], finish=9), now=9)  # late
    w.record("d", RequestRecord(slo=slo, arrival=0, input_len=10, dropped=True), now=9)
    s = w.summary(now=9)["d"]
    assert (s.finished, s.attainment, s.goodput_tokens_per_s) == (3, pytest.approx(1 / 3), 1.2)
    assert w.totals["d"].dropped == 1 and w.totals["d"].goodput_tokens == 12
    assert w.summary(now=30)["d"].finished == 0  # out of the window, still in the totals


def test_goodput_window_buckets_match_a_rescan_of_every_event() -> None:
    """The bucketed window answers what rescanning every finished request would, with the window's
    oldest edge rounded to a bucket (1 s of 60 s here)."""
    import random

    rng = random.Random(7)
    w = GoodputWindow(window_s=60.0, buckets=60)
    events: list[tuple[float, str, int, bool]] = []
    now = 0.0
    for _ in range(3000):
        now += rng.expovariate(20.0)
        cls = rng.choice(["latency", "deadline"])
        n = rng.randint(1, 9)
        slo = SLO.deadline_slo(deadline=5)
        late = rng.random() < 0.3
        finish = now + (6 if late else 1)
        rec = RequestRecord(slo=slo, arrival=now, input_len=0, token_times=[finish] * n, finish=finish)
        tokens = w.record(cls, rec, now).tokens
        events.append((now, cls, tokens, not late))
        if rng.random() < 0.01:
            got = w.summary(now)
            edge = (int((now - 60.0) // 1.0) + 1) * 1.0  # the oldest bucket still in the window
            for c in ("latency", "deadline"):
                live = [e for e in events if e[1] == c and e[0] >= edge]
                if not live:
                    continue
                assert got[c].finished == len(live)
                assert got[c].attainment == pytest.approx(sum(e[3] for e in live) / len(live))
                assert got[c].goodput_tokens_per_s == pytest.approx(sum(e[2] for e in live) / 60.0)


def settings(**values: object) -> SchedulerSettings:
    """Scheduler settings from these values alone (validated; the environment is not read)."""
    return SchedulerSettings.model_validate(values)


def test_runner_plans_full_frames_and_light_replans_without_preemption() -> None:
    now = [100.0]  # the runner's injected clock: no wall time
    r = FrameRunner(
        settings(policy="jitserve-paper", frame_steps=3, analyzer=False), batch_size=1, clock=lambda: now[0]
    )
    assert r.step_kind() is None  # an empty table is not planned
    r.admit("a", {"deadline": 10}, arrival=now[0], input_len=5, max_tokens=8)
    assert r.step_kind() == FULL  # the first plan begins a frame
    r.plan(FULL)
    assert [r.step_kind() for _ in range(3)] == [None, None, FULL]  # then every frame_steps steps
    r.plan(FULL)
    assert r.frames == 2 and r.steps == 5
    r.sync([("a", True, 1, 6)])
    r.admit("b", {"deadline": 1}, arrival=now[0], input_len=5, max_tokens=8)
    assert r.step_kind() == LIGHT
    plan = r.plan(LIGHT)
    assert plan.preempt.size == 0 and sorted(r.table.ids(plan.order)) == ["a", "b"]
    assert r.step_kind() is None
    assert r.frames == 2  # a light plan begins no frame


def test_runner_tells_the_policy_each_outcome_by_slo_type() -> None:
    """What GMAX's attainment fairness reads (scheduler/fairness.py): an on-time chat is met; a dropped
    deadline request and a chat whose first token came after its TTFT are missed."""
    now = [0.0]
    r = FrameRunner(settings(policy="jitserve", analyzer=False), batch_size=2, clock=lambda: now[0])
    r.admit("on-time", {"slo_class": "latency", "target_ttft": 1.0}, arrival=0.0, input_len=5, max_tokens=2)
    r.admit("late", {"slo_class": "latency", "target_ttft": 1.0}, arrival=0.0, input_len=5, max_tokens=2)
    r.admit("dropped", {"slo_class": "deadline", "deadline": 10}, arrival=0.0, input_len=5, max_tokens=8)
    r.tokens("on-time", 1, 0.5)
    r.tokens("on-time", 1, 0.6)
    r.tokens("late", 1, 1.5)
    r.tokens("late", 1, 1.6)
    now[0] = 2.0
    r.end("on-time", 0.6, "finished")
    r.end("late", 1.6, "finished")
    r.end("dropped", 2.0, "dropped")
    met, ended = r.policy.attainment.counts(now[0])  # type: ignore[attr-defined]
    assert (met[LATENCY], ended[LATENCY]) == (1, 2)
    assert (met[DEADLINE], ended[DEADLINE]) == (0, 1)


def test_runner_counts_a_compound_program_once() -> None:
    """Fair(r) counts a compound program's outcome once (fairness.counted_outcome): an early stage that
    finishes decides nothing, whether by its sub-deadline D_s or after it; a dropped one loses the
    program; the last stage, whose deadline is the program's, gives the verdict."""
    now = [0.0]
    r = FrameRunner(settings(policy="jitserve", analyzer=False), batch_size=2, clock=lambda: now[0])
    early = {"slo_class": "compound", "deadline": 30, "stage_deadline": 10, "program_id": "p"}
    for rid in ("on-plan", "behind-plan", "dropped"):
        r.admit(rid, early, arrival=0.0, input_len=5, max_tokens=2)
    r.tokens("on-plan", 2, 5.0)
    r.tokens("behind-plan", 2, 20.0)
    now[0] = 20.0
    assert r.end("on-plan", 5.0, "finished") > 0
    assert r.end("behind-plan", 20.0, "finished") > 0  # its own SLO met: its tokens count in goodput
    met, ended = r.policy.attainment.counts(now[0])  # type: ignore[attr-defined]
    assert ended[COMPOUND] == 0
    r.end("dropped", 20.0, "dropped")
    last = {"slo_class": "compound", "deadline": 10, "stage_deadline": 10, "program_id": "p"}
    r.admit("last", last, arrival=20.0, input_len=5, max_tokens=2)
    r.tokens("last", 2, 25.0)
    now[0] = 25.0
    r.end("last", 25.0, "finished")
    met, ended = r.policy.attainment.counts(now[0])  # type: ignore[attr-defined]
    assert (met[COMPOUND], ended[COMPOUND]) == (1, 2)


# ------------------------------------------------------------------------------------ CLI and HTTP


def cli_args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(argv)


def test_engine_command_line() -> None:
    args = cli_args(
        "--model", "/m", "--port", "9000", "--policy", "edf", "--frame-steps", "20", "--device", "cpu",
        "--runtime-dir", "/run/x",
    )  # fmt: skip
    cmd, env = build_command(args, ["--", "--max-model-len", "512"])
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    joined = " ".join(cmd)
    assert f"--scheduler-cls {ADAPTER_CLS}" in joined and f"--middleware {MIDDLEWARE}" in joined
    assert "--scheduling-policy fcfs" in joined and "--dtype float32" in joined and "--enforce-eager" in cmd
    assert cmd[-2:] == ["--max-model-len", "512"] and "--" not in cmd
    assert env["JITSERVE_POLICY"] == "edf" and env["JITSERVE_FRAME_STEPS"] == "20"
    assert env["JITSERVE_RUNTIME_DIR"] == "/run/x"
    stock, stock_env = build_command(
        cli_args("--model", "/m", "--policy", "vllm-priority", "--device", "gpu"), []
    )
    assert "--scheduler-cls" not in stock and "--scheduling-policy" in stock and stock_env == {}
    assert stock[stock.index("--scheduling-policy") + 1] == "priority" and "--dtype" not in stock
    # CPU builds: the JITServe scheduler gets 32-token KV blocks unless the user chose a size; stock
    # policies and GPU builds keep vLLM's default
    assert cmd[cmd.index("--block-size") + 1] == str(CPU_JIT_BLOCK_SIZE) == "32"
    own, _ = build_command(args, ["--block-size", "64"])
    assert own.count("--block-size") == 1 and own[own.index("--block-size") + 1] == "64"
    own, _ = build_command(args, ["--block-size=16"])
    assert "--block-size" not in own and "--block-size=16" in own
    for policy, device in (("vllm", "cpu"), ("vllm-priority", "cpu"), ("jitserve", "gpu")):
        other, _ = build_command(cli_args("--model", "/m", "--policy", policy, "--device", device), [])
        assert "--block-size" not in other, (policy, device)
    with pytest.raises(ValueError, match="frame-steps"):
        build_command(cli_args("--model", "/m", "--frame-steps", "0"), [])


def test_scheduler_flags_reach_the_policy() -> None:
    """--cutoff / --starvation-delta / --class-fairness / --preemption travel CLI -> env -> engine
    process -> GMAX."""
    args = cli_args(
        "--model", "/m", "--device", "gpu",
        "--cutoff", "0.8", "--starvation-delta", "3", "--class-fairness", "0.2", "--preemption", "never",
    )  # fmt: skip
    _, env = build_command(args, [])
    policy = FrameRunner(SchedulerSettings.from_env(env), batch_size=4, model="m").policy
    assert isinstance(policy, GMAXPolicy)
    assert policy.params.class_fairness == 0.2
    assert (policy.params.cutoff, policy.params.starvation_delta, policy.params.preemption) == (
        0.8,
        3.0,
        "never",
    )
    assert policy.params.batch_size == 4
    # defaults: vLLM V1 only recomputes, so `auto` prices preemptions as recomputes
    _, env = build_command(cli_args("--model", "/m", "--device", "gpu"), [])
    policy = FrameRunner(SchedulerSettings.from_env(env), batch_size=4, model="m").policy
    assert isinstance(policy, GMAXPolicy)
    assert (policy.params.cutoff, policy.params.starvation_delta, policy.params.preemption) == (
        0.95, 8.0, "recompute",
    )  # fmt: skip
    bad = (("--cutoff", "0"), ("--cutoff", "1.5"), ("--starvation-delta", "-1"), ("--class-fairness", "2"))
    for flag, value in bad:
        with pytest.raises(ValueError, match=flag):
            build_command(cli_args("--model", "/m", flag, value), [])
    with pytest.raises(SystemExit):  # argparse: swap is not a choice (vLLM V1 cannot swap)
        cli_args("--model", "/m", "--preemption", "swap")


def test_cli_help_does_not_import_vllm() -> None:
    code = "import sys, jitserve.main as m; m.build_parser(); print('vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr[-2000:]


def _state(**kw: Any) -> EngineState:
    base: dict[str, Any] = dict(
        pod="p", model="m", step_time_s=0.05, prefill_tokens_per_s=1000, batch_size=4, running=2,
        waiting=3, committed_bandwidth=1.5, residual_capacity=2.5, admission_priority=3.0, queue_delay_s=0.7,
        kv_usage=0.4, cutoff=0.95, frames=7, updated_at=time.time(), policy="jitserve", frame_steps=50,
    )  # fmt: skip
    base.update(kw)
    return EngineState(**base)


def asgi_get(
    app: Any, path: str, headers: list[tuple[bytes, bytes]] | None = None
) -> tuple[int, dict, bytes]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": path, "headers": headers or []}
    asyncio.run(app(scope, receive, send))
    start = sent[0]
    return start["status"], dict(start["headers"]), b"".join(m.get("body", b"") for m in sent[1:])


def test_middleware_serves_state_schema_and_metrics(tmp_path: Path) -> None:
    async def vllm_app(scope: Any, receive: Any, send: Any) -> None:  # stands in for vLLM's FastAPI app
        body = gzip.compress(b"vllm:num_requests_running 2.0\n") if scope["path"] == "/metrics" else b"{}"
        headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
        if scope["path"] == "/metrics":
            headers.append((b"content-encoding", b"gzip"))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    app = JITServeStateMiddleware(vllm_app, runtime_dir=str(tmp_path))
    assert asgi_get(app, "/jitserve/state")[0] == 503  # nothing written yet
    write_atomic(str(tmp_path / "state.json"), _state().model_dump_json())
    status, _, body = asgi_get(app, "/jitserve/state")
    assert status == 200 and json.loads(body)["queue_delay_s"] == 0.7
    assert "admission_priority" in json.loads(asgi_get(app, "/jitserve/state/schema")[2])["properties"]
    status, headers, body = asgi_get(app, "/metrics")
    text = body.decode()
    assert "vllm:num_requests_running 2.0" in text and "jitserve_engine_waiting_requests 3.0" in text
    assert int(headers[b"content-length"]) == len(body) and b"content-encoding" not in headers
    assert asgi_get(app, "/v1/models")[2] == b"{}"  # everything else passes through


def test_prometheus_text_names_and_labels() -> None:
    from jitserve.engine.state import ClassTotalsModel
    from jitserve.scheduler.placement import ClassGoodput

    st = _state(
        goodput={"gold": ClassGoodput(goodput_tokens_per_s=12.5, attainment=0.5, finished=2)},
        totals={"gold": ClassTotalsModel(finished=2, met=1, goodput_tokens=100)},
        dropped_total=4,
        length_fits_total=3,
        length_fit_cpu_seconds_total=4.5,
    )
    text = prometheus_text(st, now=st.updated_at + 2).decode()
    assert 'jitserve_engine_goodput_tokens_per_second{slo_class="gold"} 12.5' in text
    assert "jitserve_engine_length_fits_total 3.0" in text
    assert "jitserve_engine_length_fit_cpu_seconds_total 4.5" in text
    assert 'jitserve_engine_finished_requests_total{slo_class="gold"} 2.0' in text
    assert "jitserve_engine_dropped_requests_total 4.0" in text
    assert "jitserve_engine_state_age_seconds 2.0" in text
    assert "jitserve_engine_up 0.0" in prometheus_text(None, now=0).decode()
    # what just-in-time GMAX reserved: exported when the policy reports it, absent (not 0) otherwise
    assert "reserved_waiting" not in text and "yieldable" not in text
    reserving = _state(reserved_waiting=3, yieldable=1)
    text = prometheus_text(reserving, now=reserving.updated_at).decode()
    assert "jitserve_engine_reserved_waiting_requests 3.0" in text
    assert "jitserve_engine_yieldable_requests 1.0" in text
    # the step's token budget: only while the pace holds it below the engine's configured one
    assert "step_token_budget" not in text
    paced = _state(step_token_budget=201)
    text = prometheus_text(paced, now=paced.updated_at).decode()
    assert "jitserve_engine_step_token_budget_tokens 201.0" in text


def test_state_file_round_trip(tmp_path: Path) -> None:
    assert read_state(str(tmp_path)) is None
    write_atomic(str(tmp_path / "state.json"), _state(running=1).model_dump_json())
    st = read_state(str(tmp_path))
    assert st is not None and st.running == 1 and not list(tmp_path.glob(".state-*"))


def test_history_rows_are_written_by_the_publishers_thread_and_none_is_lost_at_close(tmp_path: Path) -> None:
    """The step loop does no file I/O for history: the runner hands its finished rows to the publisher
    with the state, the writer thread appends them, and closing writes every row handed over (the
    runner's own close appends any not yet taken)."""
    from jitserve.engine.state import HISTORY_FILE, StatePublisher

    now = [0.0]
    r = FrameRunner(
        settings(policy="jitserve", analyzer=False, runtime_dir=str(tmp_path)), batch_size=2,
        clock=lambda: now[0],
    )  # fmt: skip
    publisher = StatePublisher(str(tmp_path), interval_s=60.0)
    for i in range(5):
        rid = f"r{i}"
        r.admit(rid, {"slo_class": "deadline", "deadline": 10}, arrival=0.0, input_len=7 + i, max_tokens=8)
        r.tokens(rid, 1, 0.5)
        r.end(rid, 0.5, "finished")
        if i == 2:  # three rows handed over with a state, two left with the runner
            publisher.publish(r.state(1.0, 0, 0, 0.0), busy=False, history=r.take_history())
            assert r.take_history() == []  # handed over, not kept
    publisher.close()
    r.close()
    rows = [json.loads(line) for line in (tmp_path / HISTORY_FILE).read_text().splitlines()]
    assert [row["prompt_len"] for row in rows] == [7, 8, 9, 10, 11]
    assert {(row["output_len"], row["slo_class"]) for row in rows} == {(1, "deadline")}


def test_a_history_file_that_cannot_be_written_is_logged_and_the_writer_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from jitserve.engine.state import HISTORY_FILE, StatePublisher

    (tmp_path / HISTORY_FILE).mkdir()  # appending to it raises IsADirectoryError (an OSError)
    publisher = StatePublisher(str(tmp_path), interval_s=60.0)
    publisher.publish(_state(running=3), busy=True, history=[{"prompt_len": 1}, {"prompt_len": 2}])
    publisher.close()  # the rows are appended by the time it returns, or reported lost
    assert "cannot append 2 history row(s)" in caplog.text
    assert not publisher._thread.is_alive()


class FixedBoundPredictor:
    """Test double of the analyzer's LengthPredictor: trained, bound = generated + 10 (the real QRF needs
    hundreds of finished requests and seconds of fitting; its own tests live in tests/unit/analyzer)."""

    trained = True

    def __init__(self) -> None:
        self.queries = 0

    def upper_bounds(self, prompt_len: Any, generated: Any, *rest: Any) -> Any:
        import numpy as np

        self.queries += 1
        return np.asarray(generated) + 10


def test_length_bounds_refresh_every_50_generated_tokens(tmp_path: Path) -> None:
    r = FrameRunner(settings(policy="jitserve", runtime_dir=str(tmp_path)), batch_size=2)
    assert r.bounds is not None, "the analyzer ships with the package: the runner must load it"
    fake = FixedBoundPredictor()
    r.bounds.predictor = fake  # type: ignore[assignment]
    r.admit("a", None, arrival=0.0, input_len=5, max_tokens=500)
    r.admit("b", {"length_bound": 300}, arrival=0.0, input_len=5, max_tokens=500)  # the router's bound wins
    t = r.table
    assert t.len_ub[t.slot("a")] == 10 and t.len_ub[t.slot("b")] == 300
    r.sync([("a", True, 49, 54), ("b", True, 49, 54)])
    assert t.len_ub[t.slot("a")] == 50  # stale bound (<= generated) bumped by the table, not re-predicted
    r.sync([("a", True, 50, 55), ("b", True, 50, 55)])
    assert t.len_ub[t.slot("a")] == 60 and t.len_ub[t.slot("b")] == 300
    queries = fake.queries
    r.sync([("a", True, 70, 75)])
    assert fake.queries == queries  # not due before another 50 tokens
    r.sync([("a", True, 100, 105)])
    assert t.len_ub[t.slot("a")] == 110


def test_the_state_reports_what_the_length_fits_cost(tmp_path: Path) -> None:
    """The engine's state (and so `jitserve_engine_length_fit_cpu_seconds_total`) carries the fits'
    count and CPU as its `BackgroundRefit` counted them."""
    r = FrameRunner(settings(policy="jitserve", runtime_dir=str(tmp_path)), batch_size=2)
    assert r.bounds is not None
    st = r.state(1.0, 0, 0, 0.0)
    assert st.length_fits_total == 0 and st.length_fit_cpu_seconds_total == 0.0
    r.bounds.refit.fits_finished, r.bounds.refit.fit_cpu_s_total = 2, 3.25
    st = r.state(2.0, 0, 0, 0.0)
    assert st.length_fits_total == 2 and st.length_fit_cpu_seconds_total == 3.25


def test_length_bounds_fit_in_a_child_process_and_keep_what_finished_meanwhile(tmp_path: Path) -> None:
    """The engine's QRF fit runs in a fresh, niced child interpreter (never in vLLM's engine core,
    where a fitting thread held the GIL and the pinned core for seconds); rows observed while it fits
    are replayed into the fitted predictor, and the history file is written."""
    from jitserve.engine.runner import EngineLengthBounds
    from jitserve.scheduler.analyzer import LengthPredictor, LengthPredictorConfig

    def fit_children() -> list[str]:
        kids = []
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid() and b"analyzer.refit" in cmd:
                kids.append(entry)
        return kids

    path = tmp_path / "lengths.npz"
    bounds = EngineLengthBounds(None)
    bounds.path = str(path)
    bounds.predictor = LengthPredictor(
        LengthPredictorConfig(n_jobs=1, n_estimators=10, min_history_requests=40)
    )
    try:
        for i in range(40):  # the 40th finished request makes a fit due
            bounds.observe(100 + i, 20 + i % 7, 0, 0, 512)
        assert bounds.refit.fitting
        for i in range(5):  # finish while the child fits
            bounds.observe(300 + i, 30, 0, 0, 512)
        seen_child = False
        deadline = time.monotonic() + 300
        while bounds.refit.fitting and time.monotonic() < deadline:
            seen_child = seen_child or bool(fit_children())
            time.sleep(0.02)
        assert seen_child, "the fit did not run in a child process"
        assert bounds.predictor.trained
        assert bounds.predictor.history_size == 45
        assert path.exists() and LengthPredictor.load(str(path)).trained
        assert bounds.refit._tmp is None  # the fit's scratch files are gone
        # what the fit cost, measured in the child (its start-up included), as the engine's state reports it
        assert bounds.refit.fits_finished == 1 and bounds.refit.fit_cpu_s_total > 0
        ub = bounds.bounds([100], [0], [0], [0], [512])
        assert 1 <= int(ub[0]) < 512  # a learned bound, not max_tokens
    finally:
        bounds.close()


def test_runner_tells_the_policy_each_outcome_by_tenant(tmp_path: Path) -> None:
    """The tenant the router names in `vllm_xargs.tenant` (the API key's owner) is what Algorithm 1's
    fairness term reads, with f from the request's class (`SLOClass.fairnessWeight`, from the pool's
    classes file): each ending counts for its tenant."""
    classes = tmp_path / "classes.json"
    classes.write_text(
        json.dumps({"fair": {"type": "deadline", "deadlineSeconds": 10, "fairnessWeight": 0.3}})
    )
    r = FrameRunner(
        settings(policy="jitserve", analyzer=False, classes_file=str(classes)),
        batch_size=2,
        clock=lambda: 2.0,
    )
    for rid, tenant in (("a", "acme"), ("b", "globex"), ("c", "acme")):
        r.admit(rid, {"slo_class": "fair", "tenant": tenant}, arrival=0.0, input_len=5, max_tokens=8)
    assert r.table.fairness[r.table.slot("b")] == 0.3
    r.end("a", 2.0, "dropped")
    r.end("b", 2.0, "dropped")
    r.end("c", 2.0, "dropped")
    met, ended = r.policy.tenants.counts(2.0)  # type: ignore[attr-defined]
    acme, globex = r.tenants["acme"], r.tenants["globex"]
    assert (ended[acme], ended[globex]) == (2, 1)
    assert met.sum() == 0
