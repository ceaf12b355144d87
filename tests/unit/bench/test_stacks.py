"""bench/stacks.py: the traces, the EDF keys stack (b) sends, the scoring window, and its client's
cutoff, drain and closed loop.

The client tests run against a paced stub server (`_paced_chat_server`) instead of a real engine: what
they check is which call is mid-stream at the cutoff and how many tokens land in a window, which a
real engine's speed on a shared two-core machine would make a matter of luck. The real stacks run in
the benchmark itself. The one use of monkeypatch moves the working directory into tmp_path, so the
relative default --out cannot touch the repository's record; nothing is mocked there. The frame check's
test stands a namespace in for the Fleet (a real one starts engines) and serves a real `EngineState`;
the warm-up and calibration tests stand one in too (it records which stack ran with the others frozen),
in front of the stub server."""

from __future__ import annotations

import asyncio
import json
import time

import prometheus_client
import pytest

from bench import stacks
from jitserve.local import demo


def test_paper_mix_is_the_demo_trace() -> None:
    """With unscaled deadline work, the paper mix is exactly `jitserve demo`'s seeded trace."""
    assert stacks.make_jobs(stacks.MIXES["paper"], 1.3, 60.0, 4) == demo.make_workload(1.3, 60.0, 4)


def test_mixes_follow_their_weights_and_scale_deadline_work() -> None:
    jobs = stacks.make_jobs(stacks.MIXES["chat"], 5.0, 400.0, 0, stacks.Shape(1.0, 0.5, 0.5))
    share = {
        c: sum(j.slo_class == c for j in jobs) / len(jobs) for c in ("latency", "deadline", "best-effort")
    }
    assert share == pytest.approx({"latency": 0.7, "deadline": 0.2, "best-effort": 0.1}, abs=0.02)
    full = stacks.make_jobs(stacks.MIXES["chat"], 5.0, 400.0, 0)
    for a, b in zip(jobs, full, strict=True):
        assert a.arrival == b.arrival and a.slo_class == b.slo_class
        k = 0.5 if a.slo_class == "latency" else 0.25  # lengths x0.5, deadline work x0.5 more
        assert a.calls[0].max_tokens == max(2, round(b.calls[0].max_tokens * k))
        text, full_text = a.calls[0].prompt.split("\n\n")[0], b.calls[0].prompt.split("\n\n")[0]
        assert full_text.startswith(text) and len(text.split()) == max(5, round(len(full_text.split()) / 2))
    assert {j.slo_class for j in stacks.make_jobs(stacks.MIXES["latency"], 5.0, 50.0, 1)} == {"latency"}


def test_slos_take_the_mix_overrides_and_both_scales() -> None:
    chat = stacks.MIXES["chat"]
    lat, fields = stacks.slo_of("latency", 1, chat, stacks.Shape(2.0, 1.0, 0.5))
    assert (lat.ttft, lat.tbt, fields["target_ttft"]) == (2.0, 0.2, 2.0)  # TTFT 1 s x machine factor 2
    ddl, fields = stacks.slo_of("deadline", 1, chat, stacks.Shape(2.0, 0.5, 0.5))
    assert ddl.deadline == fields["deadline"] == 7.5  # 15 s x 2 x 0.5 x 0.5
    prog, fields = stacks.slo_of("compound", 3, stacks.MIXES["paper"], stacks.Shape(1.0, 1.0, 0.5))
    assert prog.deadline == fields["deadline"] == 30.0  # 20 s per stage x 3 stages x 0.5


def test_short_jobs_on_a_slow_machine_keep_the_papers_wall_times() -> None:
    """4x slower steps, jobs 4x shorter: TTFT, waiting_time and deadlines stay in seconds; TBT is 4x."""
    shape = stacks.Shape(4.0, 0.25, 1 / 3)
    lat, fields = stacks.slo_of("latency", 1, stacks.MIXES["paper"], shape)
    assert (lat.ttft, lat.tbt, lat.waiting_time) == pytest.approx((2.0, 0.4, 5.0))
    assert fields == pytest.approx({"target_ttft": 2.0, "target_tbt": 0.4, "waiting_time": 5.0})
    ddl, _ = stacks.slo_of("deadline", 1, stacks.MIXES["paper"], shape)
    assert ddl.deadline == pytest.approx(20 / 3)


def test_edf_keys_order_by_due_time() -> None:
    paper = stacks.MIXES["paper"]
    lat, _ = stacks.slo_of("latency", 1, paper, stacks.Shape())
    ddl, _ = stacks.slo_of("deadline", 1, paper, stacks.Shape())
    prog, _ = stacks.slo_of("compound", 2, paper, stacks.Shape())
    assert stacks.edf_priority(10.0, lat) == 12_000  # first token due at arrival + TTFT
    assert stacks.edf_priority(1.0, ddl) == 21_000
    assert [stacks.edf_priority(3.0, prog, k, 2) for k in (0, 1)] == [23_000, 43_000]  # stage shares of 40 s
    # A latency request arriving later still runs before a deadline request due later.
    assert stacks.edf_priority(15.0, lat) < stacks.edf_priority(1.0, ddl)


def _out(job, *calls: stacks.CallOut) -> stacks.JobOut:
    return stacks.JobOut(job, list(calls))


def test_scoring_counts_decided_jobs_only() -> None:
    mix = stacks.MIXES["paper"]
    call = demo.Call("a b c", 10)
    lat = demo.Job(0, "latency", 0.0, (call,))  # horizon 2 + 9 x 0.1 = 2.9 s
    ddl = demo.Job(1, "deadline", 1.0, (call,))  # deadline 20 s: decided at 21 s, after the cutoff
    late_ttft = demo.Job(2, "latency", 1.0, (call,))
    rejected = demo.Job(3, "latency", 2.0, (call,))
    on_time = [0.5 + 0.1 * i for i in range(10)]
    outs = [
        _out(lat, stacks.CallOut(0.0, on_time, 10, 5, finished=True)),
        _out(ddl, stacks.CallOut(1.0, [2.0] * 10, 10, 5, finished=True)),
        # first token after TTFT: the 5 tokens still on their timeline count, the SLO is missed
        _out(late_ttft, stacks.CallOut(1.0, [3.5 + 0.1 * i for i in range(5)], None, 0, reason="timeout")),
        _out(rejected, stacks.CallOut(2.0, reason="rejected")),
    ]
    runs = stacks.score_run(outs, mix, stacks.Shape(), cutoff_s=10.0)
    r = runs["latency"]
    assert (r.jobs, r.met, r.rejected, r.timeouts) == (3, 1, 1, 1)
    on_timeline = sum(3.5 + 0.1 * i <= 1.0 + 2.0 + 0.1 * i + 1e-9 for i in range(5))
    assert r.goodput == 10 + on_timeline
    assert r.ttfts == pytest.approx([0.5, 2.5])
    assert runs["deadline"].jobs == 0 and runs["deadline"].tokens == 10  # load only, tokens in throughput
    summary = stacks.run_summary(runs, 10.0)
    assert summary["total"]["throughput"] == pytest.approx((10 + 10 + 5) / 10.0)


def test_a_scored_job_the_client_never_sent_is_unfinished_not_a_crash() -> None:
    """The client's event loop can wake past the cutoff for a job that arrived before it (run 10): the
    job has no calls. It is scored, not met, and counted unfinished, never a rejection or a drop."""
    mix = stacks.MIXES["latency"]
    call = demo.Call("a b c", 10)
    unsent = demo.Job(0, "latency", 1.0, (call,))
    runs = stacks.score_run([stacks.JobOut(unsent)], mix, stacks.Shape(), cutoff_s=10.0)
    r = runs["latency"]
    assert (r.jobs, r.met, r.goodput, r.unfinished, r.rejected, r.dropped) == (1, 0, 0, 1, 0, 0)
    assert r.possible > 0


def test_best_effort_is_met_when_it_finishes_in_the_drain_but_throughput_stops_at_the_cutoff() -> None:
    """Best-effort's SLO is its deadline (300 s), not the run's end: a job the stack deferred behind SLO
    work and finished in the drain is met; only its tokens up to the cutoff count in throughput, and
    `met_by_cutoff` keeps the older measure (finished by the cutoff)."""
    mix = stacks.MIXES["chat"]
    call = demo.Call("a b c", 4)
    early = demo.Job(0, "best-effort", 0.0, (call,))
    deferred = demo.Job(1, "best-effort", 0.0, (call,))
    never = demo.Job(2, "best-effort", 0.0, (call,))
    outs = [
        _out(early, stacks.CallOut(0.0, [1.0, 2.0, 3.0, 4.0], 4, 5, finished=True)),
        _out(deferred, stacks.CallOut(0.0, [9.0, 12.0, 13.0, 14.0], 4, 5, finished=True)),
        _out(never, stacks.CallOut(0.0, [], None, 0, reason="cutoff")),
    ]
    shape = stacks.Shape(deadline_scale=0.1)  # the chat mix's 15 s deadline window -> 1.5 s
    runs = stacks.score_run(outs, mix, shape, cutoff_s=10.0)
    r = runs["best-effort"]
    assert (r.jobs, r.met, r.met_by_cutoff, r.unfinished) == (3, 2, 1, 1)
    assert r.goodput == 2 * (5 + 4)  # input and output tokens of each met job
    assert r.tokens == 4 + 1  # delivered by the cutoff
    assert stacks.run_summary(runs, 10.0)["best-effort"]["met_by_cutoff"] == 1


def test_the_clients_own_lag_is_how_late_it_sent_each_jobs_first_call() -> None:
    """client_lag: first calls only (a program's later calls wait for the earlier ones by design), and
    a job the client never sent is left out, not counted as on time."""
    call = demo.Call("a b c", 4)
    jobs = [demo.Job(i, "compound", float(i), (call, call)) for i in range(4)]
    outs = [stacks.JobOut(j) for j in jobs]
    for o, lag in zip(outs[:3], (0.0, 0.25, 2.0), strict=True):
        o.calls.append(stacks.CallOut(o.job.arrival + lag))
        o.calls.append(stacks.CallOut(o.job.arrival + 30.0))  # the second stage, sent when the first ended
    lag = stacks.client_lag(outs)
    assert lag == {"p50": 0.25, "p99": 2.0}
    rec = {
        "seed": 0,
        "mix": "paper",
        "load": 2.0,
        "stack": "d",
        "jobs": 4,
        "loadavg": 1.0,
        "client_lag_s": lag,
    }
    rec["classes"] = {"total": {"goodput": 1.0, "attainment": 1.0, "jobs": 4, "throughput": 1.0,
                                "rejected": 0, "dropped": 0, "timeouts": 0}}  # fmt: skip
    assert stacks._run_line(rec).endswith("; client lag p99 2.00 s")
    assert stacks.client_lag([]) == {"p50": None, "p99": None}


async def _paced_chat_server(
    tokens: int,
    interval: float,
    bodies: list[dict] | None = None,
    reject_rule: str | None = None,
    then_error: bytes | None = None,
) -> asyncio.AbstractServer:
    """An OpenAI-shaped streaming chat endpoint: `tokens` content chunks, one per `interval`, then usage;
    each request's JSON body is appended to `bodies`. With `reject_rule`, every request gets our router's
    admission 429 instead (OpenAI error body, Retry-After, X-JITServe-Rejection: the rule). With
    `then_error`, that SSE event and [DONE] follow the content chunks instead of a finish and usage."""

    def event(doc: dict) -> bytes:
        return b"data: " + json.dumps(doc).encode() + b"\n\n"

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()  # a pooled connection closed without a request
            return
        fields = (h.split(b":") for h in head.split(b"\r\n"))
        length = next(int(v[0]) for k, *v in fields if k.lower() == b"content-length")
        body = await reader.readexactly(length)
        if bodies is not None:
            bodies.append(json.loads(body))
        if reject_rule is not None:
            err = {"message": "no engine replica can meet this request's SLO", "type": "rate_limit_error"}
            doc = json.dumps({"error": {**err, "param": None, "code": "slo_unattainable"}}).encode()
            writer.write(
                b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
                b"x-should-retry: false\r\nx-jitserve-rejection: " + reject_rule.encode()
                + b"\r\nconnection: close\r\ncontent-length: " + str(len(doc)).encode() + b"\r\n\r\n" + doc
            )  # fmt: skip
            await writer.drain()
            writer.close()
            return
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
        base = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
        try:
            for i in range(tokens):
                finish = "length" if i == tokens - 1 and then_error is None else None
                delta = {"index": 0, "delta": {"content": " t"}, "finish_reason": finish}
                writer.write(event({**base, "choices": [delta]}))
                await writer.drain()
                await asyncio.sleep(interval)
            usage = {"prompt_tokens": 3, "completion_tokens": tokens, "total_tokens": 3 + tokens}
            last = then_error if then_error is not None else event({**base, "choices": [], "usage": usage})
            writer.write(last + b"data: [DONE]\n\n")
            await writer.drain()
        except ConnectionError:
            pass  # the client cancelled the stream
        finally:
            writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


@pytest.mark.parametrize("drain_s", [0.0, 60.0])
def test_the_cutoff_cancels_everything_but_scored_best_effort_which_drains(drain_s: float) -> None:
    """run_trace against a paced stub server (what is under test is the client's cutoff and drain; a
    real engine's speed would make which call is mid-stream at the cutoff a matter of luck): at the
    cutoff the chat is cancelled; the scored best-effort job streams on to its end within the drain, or
    is cancelled with the rest when there is none. The run waits for the drained jobs, not the drain."""
    mix = stacks.MIXES["chat"]
    shape = stacks.Shape(deadline_scale=0.01)  # best-effort scored if it arrived 0.15 s before the cutoff
    call = demo.Call("a b c", 8)
    jobs = [demo.Job(0, "latency", 0.0, (call,)), demo.Job(1, "best-effort", 0.0, (call,))]

    async def main() -> tuple[list[stacks.JobOut], float]:
        server = await _paced_chat_server(tokens=8, interval=0.15)
        port = server.sockets[0].getsockname()[1]
        async with server:
            t = time.monotonic()
            outs = await stacks.run_trace(
                f"http://127.0.0.1:{port}", "m", jobs, stacks.StackSpec("x", "x", "vllm", "round_robin"), mix,
                shape, 0.5, "t", None, drain_s,
            )  # fmt: skip
            return outs, time.monotonic() - t

    outs, wall = asyncio.run(main())
    chat, best_effort = (o.calls[0] for o in outs)
    assert chat.reason == "cutoff" and not chat.finished and len(chat.token_times) < 8
    if drain_s:
        assert best_effort.finished and len(best_effort.token_times) == 8
        assert best_effort.token_times[-1] > 0.5  # it finished in the drain
        assert wall < drain_s  # the run ended when the drained job did
        runs = stacks.score_run(outs, mix, shape, cutoff_s=0.5)
        assert (runs["best-effort"].met, runs["best-effort"].met_by_cutoff) == (1, 0)
    else:
        assert best_effort.reason == "cutoff" and not best_effort.finished


def test_closed_loop_counts_the_tokens_in_its_window_and_sends_each_class_its_slo() -> None:
    """measure_closed against the paced stub server: every client sends its next call when one ends;
    only tokens inside the window count; each call carries its class and SLO fields, compound stages as
    the deadline class (the closed loop has no programs)."""
    mix = stacks.MIXES["paper"]
    shape = stacks.Shape()
    call = demo.Call("a b c", 4)
    jobs = [demo.Job(0, "latency", 0.0, (call,)), demo.Job(1, "compound", 0.0, (call, call))]
    bodies: list[dict] = []

    async def main() -> tuple[float, int]:
        server = await _paced_chat_server(tokens=4, interval=0.05, bodies=bodies)
        port = server.sockets[0].getsockname()[1]
        async with server:
            spec = stacks.StackSpec("x", "x", "vllm", "round_robin")
            url = f"http://127.0.0.1:{port}"
            mark = lambda: edges.append(time.monotonic())  # noqa: E731
            return await stacks.measure_closed(url, "m", jobs, mix, shape, spec, 2, 0.3, 1.0, mark)

    edges: list[float] = []
    rate, turned_away = asyncio.run(main())
    # 4 clients, each at most 4 tokens per 0.2 s call: at most 80 tokens/s. Some tokens land in the
    # window, however slow the machine (how many is its speed, not the client's logic: a floor of one
    # call's worth, 4 tokens, failed once on a loaded two-core machine)
    assert 0 < rate <= 80 and turned_away == 0
    # both edges of the window read, the second no earlier than the 1.0 s window after the first (a slow
    # machine may only make it later)
    assert len(edges) == 2 and edges[1] - edges[0] >= 0.9
    classes = {b["slo_class"] for b in bodies}
    assert classes == {"latency", "deadline"}
    assert all(("target_ttft" in b) == (b["slo_class"] == "latency") for b in bodies)
    assert all(b["deadline"] > 0 for b in bodies if b["slo_class"] == "deadline")


def test_engine_counters_read_vllms_counters_and_histogram_summed_over_labels() -> None:
    """The exposition prometheus-client writes for counters and a histogram named as vLLM names them
    (vllm/v1/metrics/loggers.py); two label sets of one counter add up."""
    reg = prometheus_client.CollectorRegistry()
    gen = prometheus_client.Counter("vllm:generation_tokens", "", ["model_name", "engine"], registry=reg)
    gen.labels("m", "0").inc(30)
    gen.labels("m", "1").inc(12)
    prometheus_client.Counter("vllm:num_preemptions", "", ["model_name"], registry=reg).labels("m").inc(2)
    steps = prometheus_client.Histogram("vllm:iteration_tokens_total", "", buckets=(8, 64, 512), registry=reg)
    for tokens in (8, 8, 200):
        steps.observe(tokens)
    got = stacks.parse_metrics(prometheus_client.generate_latest(reg).decode(), stacks.ENGINE_COUNTERS)
    assert got["generation_tokens"] == 42 and got["preemptions"] == 2
    assert got["steps"] == 3 and got["step_tokens"] == 216 and got["prompt_tokens"] == 0
    delta = stacks.counters_delta({"u": {**got, "steps": 1, "step_tokens": 16}}, {"u": got})
    assert delta["u"]["steps"] == 2 and delta["u"]["tokens_per_step"] == 100.0


def test_engine_counters_read_a_jitserve_engines_length_fits_from_its_own_metrics() -> None:
    """The fit counters as a JITServe engine exports them (`engine.state.prometheus_text`, appended to
    vLLM's /metrics), and the closed-loop line that reports them; a stock engine has none (0)."""
    from jitserve.engine.state import EngineState, prometheus_text

    state = EngineState(
        pod="p", model="m", step_time_s=0.05, prefill_tokens_per_s=1000, batch_size=4, running=0, waiting=0,
        committed_bandwidth=0, residual_capacity=4, admission_priority=0, queue_delay_s=0, kv_usage=0,
        cutoff=0.9, frames=1, updated_at=0.0, policy="jitserve", frame_steps=50,
        length_fits_total=2, length_fit_cpu_seconds_total=3.5,
    )  # fmt: skip
    before = stacks.parse_metrics(prometheus_text(state, 0.0).decode(), stacks.ENGINE_COUNTERS)
    after_state = state.model_copy(update={"length_fits_total": 3, "length_fit_cpu_seconds_total": 5.75})
    after = stacks.parse_metrics(prometheus_text(after_state, 0.0).decode(), stacks.ENGINE_COUNTERS)
    delta = stacks.counters_delta({"jit": before, "stock": {}}, {"jit": after, "stock": {}})
    assert delta["jit"]["length_fits"] == 1 and delta["jit"]["length_fit_cpu_s"] == 2.2  # rounded to 0.1
    line = stacks._engines_line(delta)
    assert "fits 1 (2.2 s CPU)" in line and line.count("fits") == 1


def test_throughput_table_takes_each_round_against_the_stock_stack_of_that_round() -> None:
    rows = [
        {"round": 0, "mix": "paper", "stack": "a-rr", "tokens_per_s": 100.0, "turned_away": 0},
        {"round": 0, "mix": "paper", "stack": "d", "tokens_per_s": 90.0, "turned_away": 3},
        {"round": 1, "mix": "paper", "stack": "a-rr", "tokens_per_s": 50.0, "turned_away": 0},
        {"round": 1, "mix": "paper", "stack": "d", "tokens_per_s": 50.0, "turned_away": 1},
    ]
    md = stacks.throughput_table({"throughput": rows})
    d_row = next(line for line in md.splitlines() if line.startswith("| paper | d |"))
    # per-round ratios 0.9 and 1.0 (median 0.95), not the ratio of the medians (70 / 75)
    assert "| 0.950 (0.900-1.000) |" in d_row and "70.0 (50.0-90.0)" in d_row


def test_throughput_table_shows_each_stacks_processed_tokens_against_the_stock_stack() -> None:
    """Engine counters summed over a round's engines: processed tokens/s (step tokens over the window)
    and its per-round ratio to (a-rr), prompt per output token, tokens per step."""

    def row(rnd: int, stack: str, steps: float, step_tokens: float, out: float) -> dict:
        half = {"steps": steps / 2, "step_tokens": step_tokens / 2, "generation_tokens": out / 2,
                "prompt_tokens": (step_tokens - out) / 2, "preemptions": 1.0}  # fmt: skip
        return {"round": rnd, "mix": "paper", "stack": stack, "tokens_per_s": out / 10, "turned_away": 0,
                "window_s": 10.0, "engines": {"e0": half, "e1": dict(half)}}  # fmt: skip

    rows = [row(0, "a-rr", 100, 5000, 500), row(0, "d", 80, 4800, 480), row(1, "a-rr", 100, 4000, 400)]
    rows.append(row(1, "d", 100, 4400, 440))
    md = stacks.throughput_table({"throughput": rows})
    steps_table = md[md.index("Where the steps went") :]
    d_row = next(line for line in steps_table.splitlines() if line.startswith("| paper | d |"))
    # 480 and 440 processed tokens/s; ratios 0.96 and 1.10; 9 prompt tokens per output; 60 and 44 per step
    assert d_row.startswith("| paper | d | 460 (440-480) | 1.030 (0.960-1.100) | 9.00 | 52.0 (44.0-60.0) |")
    assert d_row.endswith("| 2 |")  # one preemption on each engine
    assert stacks.engine_work({"round": 0, "window_s": 10.0, "engines": {}}) is None


def test_checks_pass_and_fail_per_cell() -> None:
    def run(stack: str, seed: int, lat: float, met: int) -> dict:
        cls = {"jobs": 2, "met": met, "goodput": lat, "throughput": 10.0}
        return {"mix": "latency", "load": 2.0, "stack": stack, "seed": seed,
                "classes": {"latency": cls, "total": cls}}  # fmt: skip

    data = {
        "mixes": ["latency"],
        "runs": [run("d", 0, 150, 2), run("a-rr", 0, 100, 1), run("c", 0, 140, 2), run("b", 0, 130, 2)],
    }
    _, rows = stacks.checks(data)
    by = {r["base"]: r for r in rows}
    assert by["a-rr"]["total"] == pytest.approx(1.5) and by["a-rr"]["throughput"] == pytest.approx(1.0)
    assert by["b"]["classes"]["latency"] == {"goodput": pytest.approx(150 / 130), "attainment": 1.0}
    assert by["c"]["total"] == pytest.approx(150 / 140)  # below the 1.2x goal: reported as FAIL
    text, _ = stacks.checks(data)
    assert "**FAIL**" in text and "PASS" in text


def test_at_stock_saturation_only_the_class_and_throughput_goals_are_judged() -> None:
    def run(stack: str, goodput: float, throughput: float) -> dict:
        cls = {"jobs": 2, "met": 1, "goodput": goodput, "throughput": throughput}
        return {"mix": "latency", "load": 1.0, "stack": stack, "seed": 0,
                "classes": {"latency": cls, "total": cls}}  # fmt: skip

    data = {"mixes": ["latency"], "runs": [run("d", 100, 9.0), run("a-rr", 100, 10.0)]}
    text, rows = stacks.checks(data)
    (row,) = rows
    assert (row["load"], row["base"], row["total_goal"]) == (1.0, "a-rr", None)
    assert row["total"] == pytest.approx(1.0) and row["throughput"] == pytest.approx(0.9)
    line = text.splitlines()[-1]
    assert "(no goal)" in line and line.rstrip(" |").endswith("**FAIL**")  # 0.90x < 0.98x throughput


def test_compare_sums_one_stack_over_the_seeds_every_run_has() -> None:
    def run(stack: str, seed: int, goodput: float, met: int, dropped: int = 0) -> dict:
        cls = {"jobs": 4, "met": met, "goodput": goodput, "rejected": 1, "dropped": dropped, "timeouts": 0}
        return {"mix": "paper", "load": 2.0, "stack": stack, "seed": seed,
                "classes": {"latency": cls, "total": cls}}  # fmt: skip

    after = {"runs": [run("d", 0, 100, 3), run("d", 1, 50, 1, dropped=2), run("a-rr", 0, 999, 4)]}
    before = {"runs": [run("d", 0, 80, 2), run("d", 1, 40, 1), run("d", 2, 1000, 4)]}  # seed 2: only here
    text = stacks.compare([("after", after), ("before", before)], "d")
    rows = [line for line in text.splitlines() if line.startswith("| paper")]
    assert rows[0] == (
        "| paper | 2x | latency | 150, 4/8 met (rej 2, drop 2, t/o 0) | 120, 3/8 met (rej 2, drop 0, t/o 0) |"
    )
    assert len(rows) == 2 and "999" not in text and "1,000" not in text  # other stacks, other seeds left out


def _window(head: str, *runs: tuple[str, int, float]) -> dict:
    """A stacks JSON of one window: (stack, seed, latency goodput) per run, one job met of two."""
    same = {k: 1 for k in stacks.POOL_SAME} | {
        "saturation": {"tokens_per_s": 78.2},
        "rates": {"latency": {"2.0": 1.0}},
    }
    return {**same, "git": {"head": head, "uncommitted_scheduler": []}, "mixes": ["latency"], "loads": [2.0],
            "stacks": {"d": "(d)", "a-rr": "(a)"},
            "runs": [{"mix": "latency", "load": 2.0, "stack": st, "seed": seed,
                      "classes": {c: {**_CLASS, "goodput": g} for c in ("latency", "total")}}
                     for st, seed, g in runs]}  # fmt: skip


# One class of one run as `bench/stacks.py` records it: two jobs, one met.
_CLASS = {"jobs": 2, "met": 1, "goodput": 0.0, "possible": 10.0, "attainment": 0.5, "ttft_p50": 0.5,
          "ttft_p99": 0.9, "started": 2, "rejected": 0, "rejected_by": {}, "dropped": 0, "timeouts": 0,
          "unfinished": 0, "met_by_cutoff": 1, "throughput": 10.0}  # fmt: skip


def _repo(tmp_path) -> tuple[object, str, str, str]:
    """A git repository of three commits: the first two differ in docs/ only, the third in scheduler/.
    Real git, so `pool_windows` runs the same `git diff` it runs on this project's history."""
    import subprocess

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=tmp_path, capture_output=True, text=True, check=True)
        return done.stdout.strip()

    git("init", "-q")
    heads = []
    for path, text in (("scheduler/gmax.py", "a"), ("docs/x.md", "b"), ("scheduler/gmax.py", "c")):
        (tmp_path / path).parent.mkdir(exist_ok=True)
        (tmp_path / path).write_text(text)
        git("add", "-A")
        git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", path)
        heads.append(git("rev-parse", "HEAD"))
    return tmp_path, *heads


def test_pooled_windows_are_samples_of_their_own_not_sums_per_seed(tmp_path) -> None:
    """Two windows of one product tree (commits differing in docs/ only): each (window, seed) is paired
    with the baseline of the same window, so the per-sample spread shows 1.5x and 3.0x, where pairing
    by seed alone would divide one window's goodput by the other's (7.5x)."""
    repo, first_head, docs_head, _ = _repo(tmp_path)
    first = _window(first_head, ("d", 0, 150.0), ("a-rr", 0, 100.0))
    second = _window(docs_head, ("d", 0, 60.0), ("a-rr", 0, 20.0))
    data = stacks.pool_windows([("w1", first), ("w2", second)], repo)
    assert [(r["window"], r["seed"]) for r in data["runs"]] == [(0, 0), (0, 0), (1, 0), (1, 0)]
    text, rows = stacks.checks(data)
    (row,) = rows
    assert row["total"] == pytest.approx(210 / 120)  # pooled: summed over every sample
    assert "[1.50-3.00]" in text
    assert "2 windows x seeds" in stacks.report(data, None, None)
    with pytest.raises(ValueError, match="w12 is pooled already"):  # its windows would be merged into one
        stacks.pool_windows([("w12", data), ("w1", first)], repo)


def test_windows_of_other_traces_or_other_code_are_not_pooled(tmp_path) -> None:
    repo, head, _, changed = _repo(tmp_path)
    one = _window(head, ("d", 0, 1.0))
    other_rates = {**_window(head, ("d", 0, 1.0)), "rates": {"latency": {"2.0": 9.9}}}
    with pytest.raises(ValueError, match="rates differs between a and b"):
        stacks.pool_windows([("a", one), ("b", other_rates)], repo)
    dirty = _window(head, ("d", 0, 1.0))
    dirty["git"]["uncommitted_scheduler"] = ["1 file changed"]
    with pytest.raises(ValueError, match="b ran uncommitted code in scheduler, router, engine"):
        stacks.pool_windows([("a", one), ("b", dirty)], repo)
    with pytest.raises(ValueError, match="engine code of a .* and b .* differ"):
        stacks.pool_windows([("a", one), ("b", _window(changed, ("d", 0, 1.0)))], repo)
    with pytest.raises(ValueError, match="cannot be compared"):
        stacks.pool_windows([("a", one), ("b", _window("0" * 40, ("d", 0, 1.0)))], repo)
    with pytest.raises(ValueError, match="at least two"):
        stacks.pool_windows([("a", one)], repo)


def test_pool_windows_will_not_overwrite_the_latest_run_record() -> None:
    with pytest.raises(SystemExit, match="give --out"):
        stacks.main(["--pool-windows", "a.json,b.json"])


def test_re_rendering_a_record_prints_and_leaves_the_latest_run_record_alone(tmp_path, monkeypatch, capsys):
    """`--report-only OLD.json` once overwrote docs/benchmarks/stacks.json (the default --out) with the old
    record. It now writes files only to an --out given explicitly. (monkeypatch only moves the working
    directory, where the relative default --out points, into tmp_path.)"""
    record = tmp_path / "old.json"
    record.write_text(json.dumps({"rates": {"latency": {"1.0": 2.5}}, "runs": []}))
    monkeypatch.chdir(tmp_path)
    assert stacks.main(["--report-only", str(record)]) == 0
    assert "1.0x = latency 2.50 jobs/s" in capsys.readouterr().out
    assert not stacks.DEFAULT_OUT.with_suffix(".json").exists()
    assert stacks.main(["--report-only", str(record), "--out", str(tmp_path / "again")]) == 0
    assert json.loads((tmp_path / "again.json").read_text())["rates"] == {"latency": {"1.0": 2.5}}


def test_the_frame_is_shortened_like_the_jobs():
    # 254 ms per step: the jobs are cut to 1 / 5.08 of their tokens, and a 50-step frame to 10 steps,
    # so the frame lasts the 2.5 s it lasts at 50 ms per step instead of outlasting every SLO (12.7 s)
    assert stacks.Shape(5.08, 1 / 5.08, 1 / 3).frame_steps() == 10
    assert stacks.Shape().frame_steps() == 50
    assert stacks.Shape(200.0, 1 / 200.0).frame_steps() == 1


def test_idle_engine_sets_are_frozen_with_their_routers_and_thawed_for_their_turn(tmp_path) -> None:
    """Real child processes (`sleep`, each in its own process group with a child of its own, as an
    engine's API server has its engine core): the sets not under test and the routers in front of
    them stop; the set under test and its router keep running; thawing resumes every process."""
    import types

    import psutil

    from jitserve.local import up

    def comp(name: str) -> up.Component:
        c = up.Component(name, ["sh", "-c", "sleep 60 & sleep 60; wait"], tmp_path / f"{name}.log")
        c.start()
        return c

    specs = stacks.stack_specs("round_robin")
    fleet = stacks.Fleet.__new__(stacks.Fleet)
    fleet.up, fleet.specs = up, [specs["a-rr"], specs["d"]]
    stock, jit, vr = comp("stock-engine"), comp("jit-engine"), comp("vllm-router-a-rr")
    fleet.sets = {
        "vllm": types.SimpleNamespace(components=[stock]),
        "jitserve": types.SimpleNamespace(components=[jit]),
    }
    fleet.routers = {"a-rr": vr}
    fleet.frozen = set()

    def procs(c: up.Component) -> list[psutil.Process]:
        leader = psutil.Process(c.popen.pid)
        return [leader, *leader.children(recursive=True)]

    def states(c: up.Component, want: set[str] | None = None) -> set[str]:
        """The statuses of a component's processes, once they are `want` (signals land asynchronously)
        or after 5 s of polling."""
        for _ in range(100):
            got = {p.status() for p in procs(c)}
            if want is None or got == want:
                break
            time.sleep(0.05)
        return got

    for c in (stock, jit, vr):  # the shell and both its children exist before any signal
        for _ in range(100):
            if len(procs(c)) == 3:
                break
            time.sleep(0.05)
        assert len(procs(c)) == 3

    def frozen(c: up.Component) -> bool:
        """Every process stopped, or with SIGSTOP pending: one caught in an uninterruptible wait
        ("disk-sleep", seen here about one run in eight) stops as soon as it leaves it."""
        for _ in range(100):
            if all(p.status() == psutil.STATUS_STOPPED or _stop_pending(p.pid) for p in procs(c)):
                return True
            time.sleep(0.05)
        return False

    try:
        fleet.freeze_others(specs["d"])
        assert frozen(stock) and frozen(vr)
        assert psutil.STATUS_STOPPED not in states(jit)
        assert set(fleet.cpu_seconds()) == {"vllm", "jitserve"}
        assert fleet.thaw_all() == {"vllm"}
        assert all(psutil.STATUS_STOPPED not in states(c, {psutil.STATUS_SLEEPING}) for c in (stock, jit, vr))
    finally:
        fleet.stop()
    assert not any(c.alive() for c in (stock, jit, vr))


def _stop_pending(pid: int) -> bool:
    """SIGSTOP among the process's pending signals (/proc/<pid>/status SigPnd or ShdPnd bit masks)."""
    import signal
    from pathlib import Path

    bit = 1 << (signal.SIGSTOP - 1)
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("SigPnd:", "ShdPnd:")) and int(line.split()[1], 16) & bit:
            return True
    return False


def test_a_rejection_is_counted_under_the_rule_our_router_names() -> None:
    """run_trace against the stub answering as our router's admission does (a 429 naming its rule in
    X-JITServe-Rejection): the call records the rule, scoring counts the rejected job under it, and the
    report's table lists it per stack and class."""
    mix = stacks.MIXES["paper"]
    jobs = [demo.Job(0, "latency", 0.0, (demo.Call("a b c", 4),))]

    async def main() -> list[stacks.JobOut]:
        server = await _paced_chat_server(tokens=4, interval=0.01, reject_rule="busy_short_reply")
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await stacks.run_trace(
                f"http://127.0.0.1:{port}", "m", jobs, stacks.StackSpec("d", "d", "jitserve", "jitserve"),
                mix, stacks.Shape(), 5.0, "t", None, 0.0,
            )  # fmt: skip

    (out,) = asyncio.run(main())
    call = out.calls[0]
    assert (call.reason, call.rule) == ("rejected", "busy_short_reply")
    runs = stacks.score_run([out], mix, stacks.Shape(), cutoff_s=10.0)
    assert runs["latency"].rejected == 1 and runs["latency"].rejected_by == {"busy_short_reply": 1}
    summary = stacks.run_summary(runs, 10.0)
    assert summary["total"]["rejected_by"] == {"busy_short_reply": 1}
    data = {"runs": [{"mix": "paper", "load": 2.0, "stack": "d", "seed": 0, "classes": summary}]}
    assert "| paper | 2x | d | latency | busy_short_reply 1 |" in stacks.rejections_table(data)
    # a 429 without the header (or a run before it) is "other"; nothing rejected: no table
    out.calls[0].rule = ""
    assert stacks.score_run([out], mix, stacks.Shape(), cutoff_s=10.0)["latency"].rejected_by == {"other": 1}
    data["runs"][0]["classes"] = stacks.run_summary(stacks.score_run([], mix, stacks.Shape(), 10.0), 10.0)
    assert stacks.rejections_table(data) == ""


def test_an_error_event_inside_the_stream_is_a_drop_with_its_message() -> None:
    """run_trace against the stub streaming two tokens and then our router's own drop event (the real
    `RouterError` the router's relay sends when an engine drops a request): the call is a drop that
    keeps its tokens and the router's message; a finished stream next to it is not."""
    from jitserve.router.errors import unavailable

    drop = unavailable("request dropped: not started within its waiting_time of 5s", "waiting_time_exceeded")
    mix = stacks.MIXES["paper"]
    jobs = [demo.Job(0, "latency", 0.0, (demo.Call("a b c", 4),))]

    async def main(then_error: bytes | None) -> stacks.JobOut:
        server = await _paced_chat_server(tokens=2, interval=0.01, then_error=then_error)
        port = server.sockets[0].getsockname()[1]
        async with server:
            (out,) = await stacks.run_trace(
                f"http://127.0.0.1:{port}", "m", jobs, stacks.StackSpec("d", "d", "jitserve", "jitserve"),
                mix, stacks.Shape(), 5.0, "t", None, 0.0,
            )  # fmt: skip
            return out

    dropped = asyncio.run(main(drop.sse_event())).calls[0]
    assert (dropped.reason, dropped.finished, len(dropped.token_times)) == ("dropped", False, 2)
    assert dropped.detail == "request dropped: not started within its waiting_time of 5s"
    finished = asyncio.run(main(None)).calls[0]
    assert (finished.reason, finished.finished, finished.tokens) == ("", True, 2)


@pytest.mark.parametrize("given", [[], ["--saturation", "57.6"], ["--slo-scale", "3.9"]])
def test_the_jitserve_stack_alone_needs_the_calibration_given(given, capsys) -> None:
    """Calibration measures stock engines, and GMAX's frame is shaped from it before the JITServe engines
    start. Run alone, (d) used to start first and keep the 50-step frame (12-30 s here, longer than
    every SLO: every request looked urgent). Without both numbers it now stops before any engine starts
    (the missing model directory would fail later, so a tree without the check fails this test)."""
    argv = ["--stacks", "d", "--model", "/nonexistent/model", *given]
    assert stacks.main(argv) == 2
    assert "give --slo-scale and" in capsys.readouterr().err


def test_a_run_stops_when_an_engine_plans_another_frame_than_it_records() -> None:
    """`Fleet.check_frames` reads each JITServe engine's `/jitserve/state` over HTTP (here a one-route
    server answering with a state built from the engine's own contract, `EngineState`; the fleet around it
    is a namespace holding only the set's URLs, since a real Fleet starts engines)."""
    import http.server
    import threading
    from types import SimpleNamespace

    from jitserve.engine.state import EngineState

    state = EngineState(
        pod="engine-0", model="m", step_time_s=0.2, prefill_tokens_per_s=400.0, batch_size=8, running=0,
        waiting=0, committed_bandwidth=0.0, residual_capacity=8.0, admission_priority=0.0, queue_delay_s=0.0,
        kv_usage=0.0, cutoff=0.8, frames=1, updated_at=0.0, policy="jitserve", frame_steps=50,
    )  # fmt: skip

    class State(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            body = state.model_dump_json().encode()
            self.send_response(200 if self.path == "/jitserve/state" else 404)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), State)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        fleet = SimpleNamespace(
            sets={"jitserve": SimpleNamespace(engine_urls=[url])}, up=SimpleNamespace(StackError=RuntimeError)
        )
        stacks.Fleet.check_frames(fleet, 50)  # the frame it records: nothing to say
        with pytest.raises(RuntimeError, match="plans 50-step frames, the run's shape says 13"):
            stacks.Fleet.check_frames(fleet, 13)
        stacks.Fleet.check_frames(SimpleNamespace(sets={}, up=fleet.up), 13)  # no JITServe set: no check
    finally:
        server.shutdown()


def _alone_fleet(urls: dict[str, str], alone: list[str]) -> object:
    """A namespace with what `_alone` uses of a Fleet; `alone` collects the stacks run with the others
    frozen."""
    from types import SimpleNamespace

    return SimpleNamespace(
        urls=urls,
        all_engine_urls=lambda: [],
        thaw_all=set,
        freeze_others=lambda spec: alone.append(spec.key),
        cpu_seconds=dict,
    )


def test_each_engine_set_is_warmed_once_through_its_first_stack_before_anything_is_measured() -> None:
    """warm_sets against paced stub servers (one per stack, standing in for a stack's router; a namespace
    stands in for the Fleet, which would start engines): each engine set gets full load through the first
    of its stacks only, alone, for the seconds given, and the rate it read is kept per set; 0 s warms
    nothing."""
    import threading

    specs = [
        stacks.StackSpec("a-rr", "x", "vllm", "round_robin"),
        stacks.StackSpec("a-ca", "x", "vllm", "cache_aware"),
        stacks.StackSpec("d", "x", "jitserve", "jitserve"),
    ]
    bodies: dict[str, list[dict]] = {s.key: [] for s in specs}
    alone: list[str] = []

    async def main(seconds: float) -> dict[str, float]:
        servers = [await _paced_chat_server(tokens=4, interval=0.05, bodies=bodies[s.key]) for s in specs]
        ports = [srv.sockets[0].getsockname()[1] for srv in servers]
        urls = {s.key: f"http://127.0.0.1:{port}" for s, port in zip(specs, ports, strict=True)}
        fleet = _alone_fleet(urls, alone)
        try:
            # warm_sets runs its own event loops (as main does): off this one's thread
            warm = (specs, "m", 2, seconds, True, threading.Event())
            return await asyncio.to_thread(stacks.warm_sets, fleet, *warm)
        finally:
            for srv in servers:
                srv.close()

    t = time.monotonic()
    rates = asyncio.run(main(0.6))
    assert time.monotonic() - t >= 0.6  # the load lasted the seconds given
    assert set(rates) == {"vllm", "jitserve"} and all(r > 0 for r in rates.values())
    assert bodies["a-rr"] and bodies["d"] and not bodies["a-ca"]  # a-ca shares a-rr's engines
    assert alone == ["a-rr", "d"]  # each set served its warm-up with the others frozen
    assert all(b["slo_class"] == "best-effort" for b in bodies["a-rr"])  # never dropped while warming
    bodies["a-rr"].clear()
    assert asyncio.run(main(0.0)) == {} and not bodies["a-rr"]


def test_no_engine_set_started_warms_nothing_and_says_nothing(capsys) -> None:
    """With `--saturation` and only JITServe's stacks, the first call starts no set: no summary line
    with an empty list of rates (it printed "output tokens/s while warming: " with nothing after it)."""
    import threading

    assert stacks.warm_sets(None, [], "m", 2, 25.0, True, threading.Event()) == {}  # type: ignore[arg-type]
    assert "warmed" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [("--calibration-rounds", "0", "must be >= 1, got 0"), ("--warm-up-s", "-1", "must be >= 0, got -1")],
)
def test_calibration_flags_out_of_range_name_the_flag_and_the_rule(flag, value, message, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        stacks.parse_args([flag, value])
    assert exit_info.value.code == 2 and f"{flag}: {message}" in capsys.readouterr().err


def test_saturation_is_the_median_of_its_windows_with_a_batch_waiting_behind_every_slot() -> None:
    """calibrate against a paced stub server (standing in for a-rr's router; a namespace for the Fleet):
    it keeps twice the slots' calls open (plus the closed loop's few spare clients), measures
    --calibration-rounds windows, each with the other sets frozen, and takes their median as the
    saturation, recording each window."""
    import threading
    from types import SimpleNamespace

    class Stamped(list):
        def append(self, body: dict) -> None:
            super().append(time.monotonic())

    received = Stamped()
    alone: list[str] = []
    spec = stacks.StackSpec("a-rr", "x", "vllm", "round_robin")
    args = SimpleNamespace(
        engines=2, max_num_seqs=2, slo_scale=1.0, saturation=None, length_scale=None, deadline_scale=1 / 3,
        calibration_rounds=3, calibration_s=0.5, freeze_idle=True,
    )  # fmt: skip

    async def main() -> dict:
        server = await _paced_chat_server(tokens=20, interval=0.05, bodies=received)  # 1 s per call
        fleet = _alone_fleet({"a-rr": f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"}, alone)
        async with server:
            return await asyncio.to_thread(
                stacks.calibrate, args, fleet, [spec], "m", ["paper"], [1.5], threading.Event()
            )

    cal = asyncio.run(main())
    sat = cal["saturation"]
    assert len(sat["windows_tokens_per_s"]) == 3 and sat["calls_open"] == 8  # 2 engines x 2 slots x 2
    assert alone == ["a-rr"] * 3  # every window measured with the other sets frozen
    assert sat["tokens_per_s"] == sorted(sat["windows_tokens_per_s"])[1]
    # the first window's clients all start at once, each call lasting a second: 8 open + 2 spare
    assert sum(t - received[0] < 0.5 for t in received) == 10
    per_job = stacks.mean_job_tokens(stacks.MIXES["paper"], stacks.Shape(**cal["shape"]))
    assert cal["rates"]["paper"]["1.5"] == pytest.approx(1.5 * sat["tokens_per_s"] / per_job)
