"""Benchmark of the scheduling core: GMAX decision time for 1,000 and 10,000 requests.

Prints medians over repeated decisions on a synthetic mixed-SLO queue (1:1:1 latency, deadline,
compound; Table-2-like lengths). Not a test: numbers go to docs/benchmarks.md.

    .venv/bin/python bench/core.py [--repeats 200]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from jitserve.scheduler.gmax import EngineSpeed, GMAXParams, plan_frame
from jitserve.scheduler.placement import ReplicaState, place
from jitserve.scheduler.requests import NewRequest, RequestTable
from jitserve.scheduler.slo import SLO


def build_queue(n: int, batch_size: int, seed: int = 0) -> RequestTable:
    rng = np.random.default_rng(seed)
    table = RequestTable(capacity=n)
    slos = [
        SLO.latency(waiting_time=1e4),
        SLO.deadline_slo(waiting_time=1e4),
        SLO.compound(3, waiting_time=1e4),
    ]
    for i in range(n):
        max_tokens = 2048
        table.add(
            NewRequest(
                request_id=str(i),
                slo=slos[i % 3],
                arrival=float(rng.uniform(0, 10)),
                input_len=int(rng.lognormal(6.5, 0.8)),
                max_tokens=max_tokens,
                len_ub=int(min(max_tokens, rng.lognormal(5.5, 0.9) + 1)),
            )
        )
    running = rng.choice(n, size=min(batch_size, n), replace=False)
    table.running[running] = True
    table.started[running] = True
    table.generated[running] = rng.integers(0, 50, size=running.size)
    return table


def median_ms(fn, repeats: int, gap_s: float = 0.0) -> float:
    """Median wall time of `fn`; with `gap_s`, the process sleeps that long before each call, as a
    router does between requests (its code leaves the caches meanwhile: docs/benchmarks/router.md)."""
    fn()  # warm-up
    samples = []
    for _ in range(repeats):
        if gap_s:
            time.sleep(gap_s)
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=200, help="decisions timed per size")
    parser.add_argument("--batch-size", type=int, default=256, help="B, sequences per batch")
    args = parser.parse_args()
    speed = EngineSpeed()
    print(f"{'what':<52} {'median':>10}  goal")
    goals = {1000: 0.5, 10000: 5.0}
    for n in (1000, 10000):
        table = build_queue(n, args.batch_size)
        # the default (just-in-time) ranking and Algorithm 1's, timed alternately on the same queue
        for ranking in ("jit", "paper"):
            params = GMAXParams(batch_size=args.batch_size, ranking=ranking)
            ms = median_ms(lambda t=table, p=params: plan_frame(t, 10.0, speed, p), args.repeats)
            what = f"GMAX plan_frame [{ranking}], {n:,} requests (B={args.batch_size})"
            print(f"{what:<52} {ms:>8.3f} ms  <= {goals[n]} ms")
    replicas = [
        ReplicaState(
            pod=f"p{i}",
            model="m",
            step_time_s=0.03 + 0.01 * i,
            prefill_tokens_per_s=8000,
            batch_size=64,
            running=32,
            waiting=i,
            committed_bandwidth=20,
            residual_capacity=44,
            admission_priority=0.0,
            queue_delay_s=0.1 * i,
            kv_usage=0.4,
            cutoff=0.95,
            frames=10,
            updated_at=0.0,
        )
        for i in range(8)
    ]
    req = NewRequest("x", SLO.latency(), arrival=0.0, input_len=500, max_tokens=512)
    ms = median_ms(lambda: place(req, replicas, now=0.0), args.repeats)
    print(f"{'power-of-K placement, K = M = 8 replicas':<52} {ms:>8.3f} ms  (router budget 1 ms)")
    # What the router pays: one placement per request, other work in between (5 ms: 200 requests/s).
    ms = median_ms(lambda: place(req, replicas, now=0.0), args.repeats, gap_s=0.005)
    print(f"{'  the same, one call every 5 ms (as a router)':<52} {ms:>8.3f} ms")


if __name__ == "__main__":
    main()
