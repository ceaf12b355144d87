"""The scheduler's own time per engine step: JITServe's adapter against stock vLLM's scheduler.

    .venv/bin/python bench/scheduler_step.py [--steps 3000] [--arrivals 0.4,0.6]

No model runs: vLLM's real V1 scheduler classes (the product's `JITServeScheduler`, and stock vLLM's
`Scheduler` as the control) with fake model-runner outputs, as vLLM's own scheduler tests drive them
(tests/unit/engine/vllm_harness.py), B = 8, a mixed stream of latency, deadline and best-effort
requests (40-120 prompt tokens, 8-25 output tokens) arriving with the given probability per step
(0.6 is about 1.2x what the batch serves). What a step costs in Python, which a real engine adds
to its model's step (157 ms for SmolLM2-135M on this machine). Prints mean, p50 and p99 per step
after a warm-up of 500 steps.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLASSES = {
    "latency": {"type": "latency", "ttftSeconds": 2.0, "tbtSeconds": 0.3, "waitingTimeSeconds": 5.0},
    "deadline": {"type": "deadline", "deadlineSeconds": 7.0, "waitingTimeSeconds": 5.0},
    "best-effort": {"type": "best-effort", "deadlineSeconds": 300.0},
}
WARMUP = 500


def measure(which: str, steps: int, arrive: float, seed: int = 0) -> list[float]:
    """Seconds per step (schedule + update_from_output) of one scheduler class."""
    from vllm.v1.core.sched.scheduler import Scheduler

    from jitserve.engine.vllm_adapter import JITServeScheduler
    from tests.fixtures.tiny_model import cached_tiny_llama
    from tests.unit.engine.vllm_harness import make_request, make_scheduler, step

    model = cached_tiny_llama(ROOT / ".cache")
    cls = JITServeScheduler if which == "jitserve" else Scheduler
    s = make_scheduler(cls, model, max_num_seqs=8, num_blocks=4096)
    rng = random.Random(seed)
    times, n = [], 0
    for _ in range(steps):
        if rng.random() < arrive:
            c = rng.choice(["latency", "latency", "deadline", "best-effort"])
            req = make_request(
                f"r{n}", {"slo_class": c}, prompt_len=rng.randint(40, 120), max_tokens=rng.randint(8, 25)
            )
            s.add_request(req)
            n += 1
        t = time.perf_counter()
        step(s)
        times.append(time.perf_counter() - t)
    return times[WARMUP:]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=3000, help="steps per run, the first 500 not counted (3000)")
    p.add_argument("--arrivals", default="0.4,0.6", help="arrival probability per step, comma list (0.4,0.6)")
    args = p.parse_args()
    sys.path.insert(0, str(ROOT))
    tmp = Path(tempfile.mkdtemp(prefix="jitserve-step-"))
    (tmp / "classes.json").write_text(json.dumps(CLASSES))
    # What `jitserve engine` hands the engine-core process (engine/settings.py), for a frame of 16 steps.
    os.environ.update(
        JITSERVE_CLASSES_FILE=str(tmp / "classes.json"),
        JITSERVE_DEFAULT_CLASS="best-effort",
        JITSERVE_RUNTIME_DIR=str(tmp / "run"),
        JITSERVE_FRAME_STEPS="16",
        JITSERVE_POLICY="jitserve",
    )
    print("| scheduler | arrivals per step | mean (ms) | p50 (ms) | p99 (ms) |\n|---|---|---|---|---|")
    for arrive in (float(a) for a in args.arrivals.split(",")):
        for which in ("stock", "jitserve"):
            w = sorted(measure(which, args.steps, arrive))
            mean, p50, p99 = statistics.mean(w), w[len(w) // 2], w[int(len(w) * 0.99)]
            print(f"| {which} | {arrive:g} | {mean * 1e3:.2f} | {p50 * 1e3:.2f} | {p99 * 1e3:.2f} |")
    return 0


if __name__ == "__main__":  # the length predictor's refit process is spawned: it re-imports this module
    raise SystemExit(main())
