"""The demo's workload, SLOs and scoring, and `up`'s status line: pure logic, hand-computed answers.

Scoring goes through jitserve.scheduler.goodput (the one implementation); these tests pin how the
demo turns what the client saw into its records (arrival, token times, drops, programs).

One monkeypatch: the progress-bar test makes captured stderr claim to be a terminal (`isatty`), since
pytest cannot attach a real TTY; the bar code itself runs unchanged.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from jitserve.local.demo import (
    CLASSES,
    Call,
    CallResult,
    Job,
    JobResult,
    client_lag,
    drop_reasons,
    format_table,
    make_workload,
    rejections_by_rule,
    score,
    slo_for,
    slo_scale_for,
    total,
)
from jitserve.local.up import format_status
from jitserve.scheduler.slo import PAPER_CLASSES, resolve_request_slo


def test_workload_is_seeded_and_mixed_one_to_one_to_one() -> None:
    a = make_workload(rate=5.0, duration_s=60.0, seed=3)
    assert a == make_workload(rate=5.0, duration_s=60.0, seed=3)  # both runs replay the same trace
    assert a != make_workload(rate=5.0, duration_s=60.0, seed=4)
    counts = [sum(j.slo_class == c for j in a) for c in CLASSES]
    assert max(counts) - min(counts) <= 1  # classes rotate in shuffled triples
    assert all(0 < j.arrival <= 60.0 for j in a)
    assert [j.arrival for j in a] == sorted(j.arrival for j in a)
    assert all(len(j.calls) in (2, 3) for j in a if j.slo_class == "compound")
    assert all(len(j.calls) == 1 for j in a if j.slo_class != "compound")
    # Poisson at 5/s for 60 s: 300 expected; 4 standard deviations either side.
    assert 230 < len(a) < 370


@pytest.mark.parametrize("slo_class", CLASSES)
@pytest.mark.parametrize("stages", [1, 3])
@pytest.mark.parametrize("scale", [1.0, 2.5])
def test_demo_slo_is_what_the_router_resolves(slo_class: str, stages: int, scale: float) -> None:
    """The SLO the demo scores with equals the router's resolution of the fields the demo sends."""
    slo, fields = slo_for(slo_class, stages, scale)
    name, resolved = resolve_request_slo({"slo_class": slo_class, **fields}, PAPER_CLASSES, None, stages)
    assert name == slo_class
    assert resolved == slo


def test_slo_scale_keeps_the_paper_slos_on_a_fast_machine() -> None:
    assert slo_scale_for(0.03) == 1.0
    assert slo_scale_for(0.2) == pytest.approx(4.0)
    slo, _ = slo_for("deadline", 1, 4.0)
    assert slo.deadline == pytest.approx(80.0)  # the paper's 20 s, scaled
    slo, _ = slo_for("compound", 2, 1.0)
    assert slo.deadline == pytest.approx(40.0)  # 20 s per stage


def _job(cls: str, max_tokens: list[int], prompt: str = "a b c d e f g h i j") -> Job:
    return Job(0, cls, 0.0, tuple(Call(prompt, n) for n in max_tokens))


def test_score_counts_on_time_tokens_deadlines_and_programs() -> None:
    results = [
        # latency, TTFT 2 s / TBT 0.1 s: tokens due at 2.0, 2.1, 2.2, 2.3 -> the first three are on time
        JobResult(_job("latency", [4]), [CallResult(0.0, 10, [1.0, 1.05, 1.3, 5.0], 5.0)]),
        # deadline 20 s: on time earns w_i*L_i + w_o*L_o = 10 + 5; late earns nothing
        JobResult(_job("deadline", [5]), [CallResult(0.0, 10, [1.0] * 4 + [19.0], 19.0)]),
        JobResult(_job("deadline", [5]), [CallResult(0.0, 10, [1.0] * 4 + [21.0], 21.0)]),
        # compound, 2 stages -> 40 s for the program: all calls' tokens when the last ends in time
        JobResult(
            _job("compound", [2, 3]),
            [CallResult(0.0, 4, [5.0, 10.0], 10.0), CallResult(10.0, 6, [20.0, 30.0, 39.0], 39.0)],
        ),
        # compound whose second call was dropped: nothing, and it counts as dropped
        JobResult(
            _job("compound", [2, 3]),
            [CallResult(0.0, 4, [5.0, 10.0], 10.0), CallResult(10.0, dropped=True, reason="dropped")],
        ),
    ]
    s = score(results, scale=1.0)
    assert s["latency"].goodput == 3 and s["latency"].met == 0
    assert s["deadline"].goodput == 15 and s["deadline"].met == 1 and s["deadline"].jobs == 2
    assert s["compound"].goodput == (4 + 2) + (6 + 3) and s["compound"].met == 1
    assert s["compound"].dropped == 1
    t = total(s)
    assert (t.jobs, t.met, t.goodput) == (5, 2, 3 + 15 + 15)
    # The late deadline request meets a twice-as-loose SLO.
    assert score(results, scale=2.0)["deadline"].met == 2


def test_table_shows_the_ratio_per_class() -> None:
    base = score([JobResult(_job("deadline", [5]), [CallResult(0.0, 10, [1.0] * 5, 1.0)])])
    ours = score(
        [
            JobResult(_job("deadline", [5]), [CallResult(0.0, 10, [1.0] * 5, 1.0)]),
            JobResult(_job("deadline", [5]), [CallResult(0.0, 10, [1.0] * 5, 1.0)]),
        ]
    )
    table = format_table(("vllm", "jitserve"), (base, ours))
    deadline_row = next(line for line in table.splitlines() if line.startswith("deadline"))
    assert "2.00x" in deadline_row
    latency_row = next(line for line in table.splitlines() if line.startswith("latency"))
    assert latency_row.split()[4] == "-"  # class, jobs, base, ours, ratio: no goodput, no ratio


def test_status_line_sums_the_router_classes_and_shows_each_pod() -> None:
    router = {
        "inflight": 4,
        "classes": {
            "latency": {
                "finished_total": 6,
                "dropped_total": 1,
                "goodput_tokens_total": 300.0,
                "attainment_total": 0.5,
                "goodput": 2.0,
            },
            "deadline": {
                "finished_total": 4,
                "dropped_total": 2,
                "goodput_tokens_total": 1200.0,
                "attainment_total": 0.75,
                "goodput": 10.0,
            },
        },
    }
    engines = [{"running": 3, "waiting": 1, "kv_usage": 0.5}, None]
    line = format_status(router, engines)
    assert "requests 10 done, 4 open" in line
    assert "goodput 1,500 tok (12.0/s)" in line
    assert "SLO met 6/10" in line
    assert "drops 3" in line
    assert "e0 3r/1w kv50%" in line and "e1 -" in line
    assert format_status(None, []).startswith("router: no status")


def test_drop_reasons_count_each_job_once() -> None:
    dropped = CallResult(0.0, dropped=True, reason="rejected")
    results = [
        JobResult(_job("latency", [4]), [dropped]),
        JobResult(_job("compound", [2, 3]), [CallResult(0.0, 4, [1.0, 2.0], 2.0), dropped]),
        JobResult(_job("deadline", [5]), [CallResult(0.0, dropped=True, reason="timeout")]),
        JobResult(_job("deadline", [5]), [CallResult(0.0, 10, [1.0] * 5, 1.0)]),
    ]
    assert drop_reasons(results) == {"rejected": 2, "timeout": 1}


def test_the_client_lag_is_how_late_each_jobs_first_call_was_sent() -> None:
    """Sent minus the job's arrival in the trace, first calls only (a later stage waits for the one
    before it, by design), nearest-rank percentiles; a job never sent has no lag to report."""
    jobs = [Job(i, "latency", float(i), (Call("a b", 2), Call("c d", 2))) for i in range(100)]
    results = [
        JobResult(j, [CallResult(j.arrival + 0.001 * j.index), CallResult(j.arrival + 50.0)]) for j in jobs
    ]
    results.append(JobResult(Job(100, "deadline", 3.0, (Call("e f", 2),)), []))
    lag = client_lag(results)
    assert lag["p50"] == pytest.approx(0.049)  # the 50th of 0.000 .. 0.099
    assert lag["p99"] == pytest.approx(0.098)
    assert client_lag([]) == {"p50": None, "p99": None}


def test_rejections_are_counted_by_rule_and_later_stages_apart() -> None:
    """A program rejected at its second call threw away its first: the summary says so apart."""

    def rejected(rule: str) -> CallResult:
        return CallResult(0.0, dropped=True, reason="rejected", rejection=rule)

    results = [
        JobResult(_job("latency", [4]), [rejected("no_time")]),
        JobResult(
            _job("compound", [2, 3]), [CallResult(0.0, 4, [1.0, 2.0], 2.0), rejected("busy_short_reply")]
        ),
        JobResult(_job("deadline", [5]), [rejected("busy_short_reply")]),
        JobResult(_job("deadline", [5]), [rejected("")]),  # a 429 without the header (not our router)
        JobResult(_job("deadline", [5]), [CallResult(0.0, dropped=True, reason="timeout")]),
    ]
    assert rejections_by_rule(results) == {
        "no_time": 1,
        "busy_short_reply": 1,
        "busy_short_reply (later stage)": 1,
        "unknown": 1,
    }


def test_the_client_keeps_the_rule_of_a_429() -> None:
    """The demo's client (the official openai SDK) against an HTTP server that answers every completion
    with the 429 our router's admission sends, rendered by the router's own `rate_limited` (body, Retry-After,
    X-JITServe-Rejection). A stand-in for the router: making the real one reject needs loaded engines."""
    import asyncio
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import openai

    from jitserve.local.demo import _one_call
    from jitserve.router.errors import REJECTION_HEADER, rate_limited

    error = rate_limited(
        "every replica is busy", "slo_unmet", 2.0, headers={REJECTION_HEADER: "busy_short_reply"}
    )

    class Admission(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            body = error.json_bytes()
            self.send_response(error.status)
            for name, value in {**error.headers(), "Content-Type": "application/json"}.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Admission)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{server.server_address[1]}/v1", api_key="unused", max_retries=0
        )
        res = asyncio.run(_one_call(client, "m", Call("hello", 4), "interactive", 0.0, {}, 10.0))
    finally:
        server.shutdown()
    assert (res.dropped, res.reason, res.rejection) == (True, "rejected", "busy_short_reply")


def test_a_classes_file_reaches_every_engine_and_the_router(tmp_path: Path) -> None:
    """`--classes-file` (up, demo, bench): the engines and the router get the same file, in flags their
    own parsers accept, and the shipped example loads as the router loads it."""
    import argparse

    from jitserve.engine import cli as engine_cli
    from jitserve.local import up
    from jitserve.router import cli as router_cli
    from jitserve.router.classes import snapshot_from_file

    example = Path(__file__).resolve().parents[3] / "docs" / "examples" / "classes-chat-first.json"
    table = snapshot_from_file(str(example), None)
    assert table.classes["latency"].goodputWeights.output == 4.0
    assert {"latency", "deadline", "compound", "best-effort"} <= set(table.classes)

    config = up.StackConfig(model="m", served_name="m", engines=2, log_dir=tmp_path, classes_file=example)
    stack = up.Stack(config)
    stack.engine_urls = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    engine_parser, router_parser = argparse.ArgumentParser(), argparse.ArgumentParser()
    engine_cli.add_arguments(engine_parser)
    router_cli.add_arguments(router_parser)
    for i in range(2):
        argv = stack.engine_command(i, 9000 + i)
        args, _ = engine_parser.parse_known_args(argv[argv.index("engine") + 1 :])
        assert args.classes_file == str(example)
    argv = stack.router_command()
    assert router_parser.parse_args(argv[argv.index("router") + 1 :]).classes_file == str(example)
    # without the flag neither gets one (the paper's classes)
    plain = up.Stack(up.StackConfig(model="m", served_name="m", log_dir=tmp_path))
    plain.engine_urls = ["http://127.0.0.1:1"]
    assert "--classes-file" not in plain.engine_command(0, 9000) + plain.router_command()
    # `jitserve engine`'s own flags (bench/stacks.py's shaped frame) reach its parser, not vLLM's
    framed = up.Stack(
        up.StackConfig(model="m", served_name="m", log_dir=tmp_path, engine_flags=["--frame-steps", "10"])
    )
    argv = framed.engine_command(0, 9000)
    args, _ = engine_parser.parse_known_args(argv[argv.index("engine") + 1 :])
    assert args.frame_steps == 10 and argv.index("--frame-steps") < argv.index("--")


def test_no_progress_bar_unless_stderr_is_a_terminal(capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`make demo > log`: the replay's bars would write a redraw per job into the log. An empty trace
    makes no request (nothing listens at the URL), so only the bar could write to stderr. Patched, not
    real: pytest captures stderr, and no terminal can be attached to a test run, so the terminal case
    sets `isatty` (the one thing the demo asks of stderr) on the real stream."""
    import asyncio
    import sys

    from jitserve.local.demo import run_trace

    def replay() -> str:
        asyncio.run(run_trace("http://127.0.0.1:9", "m", [], tag="t", desc="jitserve"))
        return capsys.readouterr().err

    assert "jitserve" not in replay()  # captured stderr is not a terminal
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert "jitserve" in replay()
