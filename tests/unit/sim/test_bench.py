"""`jitserve bench`'s simulated side: a recorded real run re-simulated, scored like the real one."""

from __future__ import annotations

import pytest

from jitserve.local import demo
from jitserve.sim import bench_cli
from jitserve.sim.calibrate import fit


def _record(rate: float, samples: list) -> dict:
    jobs = demo.make_workload(rate, 40.0, seed=3)
    cal = fit(samples)
    record = {
        "engines": 1,
        "max_num_seqs": 8,
        "rate": rate,
        "slo_scale": 1.0,
        "jobs": [bench_cli._job_to_json(j) for j in jobs],
        "runs": {},
    }
    # "real" results: the simulator's own output on the calibrated profile (no call has run yet, so
    # the prompt lengths are the estimate from the words)
    empty = [demo.JobResult(j) for j in jobs]
    for policy in ("vllm", "jitserve"):
        prof = bench_cli.sim_profile(cal, None, 8)
        sim = bench_cli.simulate_jobs(jobs, [empty], 1.0, policy, prof, 1, policy == "jitserve")
        record["runs"][policy] = {
            "calibration": cal.to_json(),
            "results": [{"calls": [c.__dict__ for c in r.calls]} for r in sim],
        }
    return record


def test_replaying_the_simulators_own_run_gives_no_gap(line: dict) -> None:
    rows = bench_cli.compare(_record(1.5, line["samples"]))
    for policy, row in rows.items():
        for metric in bench_cli.METRICS:
            assert row["sim"][metric] == pytest.approx(row["real"][metric], rel=1e-9), (policy, metric)
        assert row["real"]["goodput"] > 0


def test_overload_makes_the_stack_drop_and_jitserve_beats_fcfs(line: dict) -> None:
    rows = bench_cli.compare(_record(3.0, line["samples"]))
    fcfs, ours = rows["vllm"]["sim"], rows["jitserve"]["sim"]
    # under overload the router's and client's timeouts cancel FCFS's late requests
    assert sum(rows["vllm"]["sim_drops"].values()) > 0
    assert ours["goodput"] > fcfs["goodput"]


def test_kv_capacity_is_read_from_the_engine_log(tmp_path) -> None:
    log = tmp_path / "engine.log"
    log.write_text("INFO [kv_cache_utils.py:2327] CPU KV cache size: 5,760 tokens, Maximum concurrency\n")
    assert bench_cli.kv_capacity_from_log(log) == 5760
    assert bench_cli.kv_capacity_from_log(tmp_path / "missing.log") is None
