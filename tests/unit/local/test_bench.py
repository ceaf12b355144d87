"""`jitserve bench`'s simulated side: a recorded real run re-simulated, scored like the real one."""

from __future__ import annotations

import pytest

from jitserve.local import bench, demo
from jitserve.sim.calibrate import fit


def _record(rate: float, samples: list) -> dict:
    jobs = demo.make_workload(rate, 40.0, seed=3)
    cal = fit(samples)
    record = {
        "engines": 1,
        "max_num_seqs": 8,
        "rate": rate,
        "slo_scale": 1.0,
        "jobs": [bench._job_to_json(j) for j in jobs],
        "runs": {},
    }
    # "real" results: the simulator's own output on the calibrated profile (no call has run yet, so
    # the prompt lengths are the estimate from the words)
    empty = [demo.JobResult(j) for j in jobs]
    for policy in ("vllm", "jitserve"):
        prof = bench.sim_profile(cal, None, 8)
        sim = bench.simulate_jobs(jobs, [empty], 1.0, policy, prof, 1, policy == "jitserve", hop_s=cal.http_s)
        record["runs"][policy] = {
            "calibration": cal.to_json(),
            "results": [{"calls": [c.__dict__ for c in r.calls]} for r in sim],
        }
    return record


def test_replaying_the_simulators_own_run_gives_no_gap(line: dict) -> None:
    rows = bench.compare(_record(1.5, line["samples"]))
    for policy, row in rows.items():
        for metric in bench.METRICS:
            assert row["sim"][metric] == pytest.approx(row["real"][metric], rel=1e-9), (policy, metric)
        assert row["real"]["goodput"] > 0


def test_overload_makes_the_stack_drop_and_jitserve_beats_fcfs(line: dict) -> None:
    """Under overload the router's and client's timeouts cancel FCFS's late requests, and JITServe meets
    more SLOs. Compared by attainment: on this one-engine record JITServe's token goodput is within a few
    percent of FCFS's either way (0.95-1.02x over seeds 0-5 before placement read the engines'
    reservations, 0.86-1.00x since; docs/decisions/core.md, "Admission: where a reserved request
    starts"), while its attainment is ahead on every one of those seeds (0.53-0.72 vs 0.46-0.60 before,
    0.59-0.78 since)."""
    rows = bench.compare(_record(3.0, line["samples"]))
    fcfs, ours = rows["vllm"]["sim"], rows["jitserve"]["sim"]
    assert sum(rows["vllm"]["sim_drops"].values()) > 0
    assert ours["attainment"] > fcfs["attainment"]


def test_kv_capacity_is_read_from_the_engine_log(tmp_path) -> None:
    log = tmp_path / "engine.log"
    log.write_text("INFO [kv_cache_utils.py:2327] CPU KV cache size: 5,760 tokens, Maximum concurrency\n")
    assert bench.kv_capacity_from_log(log) == 5760
    assert bench.kv_capacity_from_log(tmp_path / "missing.log") is None


def test_a_call_served_without_a_token_is_scored_as_a_drop() -> None:
    """Runs 1 and 3: the real JITServe engine's waiting_time drops reached the client as empty,
    successful streams. With ignore_eos a served call has max_tokens tokens, so an empty one is a drop,
    and the calls the client sent after it do not count (it would have stopped there)."""
    dead = demo.Job(0, "deadline", 0.0, (demo.Call("a b c", 20),))
    comp = demo.Job(1, "compound", 0.0, (demo.Call("a b", 10), demo.Call("c d", 10)))
    empty = {
        "arrival": 0.0,
        "input_len": 50,
        "token_times": [],
        "finish": 8.0,
        "dropped": False,
        "reason": "",
    }
    served = {"arrival": 9.0, "input_len": 50, "token_times": [9.5] * 10, "finish": 9.5, "dropped": False}
    d = bench._result_from_json({"calls": [empty]}, dead)
    c = bench._result_from_json({"calls": [empty, served]}, comp)
    assert [(x.dropped, x.reason) for x in d.calls] == [(True, "dropped")]
    assert len(c.calls) == 1 and c.calls[0].dropped
    tot = demo.total(demo.score([d, c]))
    assert (tot.goodput, tot.met, tot.dropped) == (0.0, 0, 2)
    assert demo.drop_reasons([d, c]) == {"dropped": 2}
    # a call with its tokens is untouched
    ok = bench._result_from_json({"calls": [served | {"arrival": 0.0}]}, comp)
    assert not ok.calls[0].dropped and len(ok.calls[0].token_times) == 10


def test_replayed_429s_are_reported_as_rejections(line: dict) -> None:
    record = _record(1.5, line["samples"])
    jobs = record["jobs"]
    k = next(i for i, j in enumerate(jobs) if j["slo_class"] == "latency")
    call = record["runs"]["vllm"]["results"][k]["calls"][0]
    call.update(dropped=True, reason="rejected", token_times=[], finish=None)
    rows = bench.compare(record)
    assert rows["vllm"]["real_drops"].get("rejected") == 1
    assert rows["vllm"]["sim_drops"].get("rejected") == 1


def _lockstep_calls(prof: object, slowdown: float) -> list[demo.CallResult]:
    """Four streams decoding in lockstep, each step `slowdown` times the profile's step time."""
    import numpy as np

    from jitserve.sim.profiles import BatchTimeModel

    timing = BatchTimeModel.from_profile(prof)
    calls = []
    for s in range(4):
        t, times = 1.0, []
        for i in range(40):
            ctx = 100 + i
            t += slowdown * timing.step_time(np.full(4, float(ctx)), np.zeros(0, np.int64), np.zeros(0))
            times.append(t + 0.001 * s)  # streams of one step arrive within a millisecond
        calls.append(demo.CallResult(0.0, 100, times, times[-1]))
    return calls


def test_trace_step_ratio_reads_the_real_steps_off_the_token_times(line: dict) -> None:
    prof = bench.sim_profile(fit(line["samples"]), None, 8)
    ratio, steps = bench.trace_step_ratio(_lockstep_calls(prof, 2.0), prof)
    assert steps == 39
    assert ratio == pytest.approx(2.0, rel=0.02)


def test_the_calibration_trace_sets_the_simulated_speed(line: dict) -> None:
    """A recorded calibration trace whose steps ran 1.5x the probes' time slows the simulated engine by
    1.5x (fewer tokens on time under load); `--speed probes` ignores it."""
    from dataclasses import asdict

    record = _record(2.0, line["samples"])
    prof = bench.sim_profile(fit(line["samples"]), None, 8)
    calls = [asdict(c) for c in _lockstep_calls(prof, 1.5)]
    for run in record["runs"].values():
        run["speed_trace"] = {"seconds": 30.0, "calls": calls}
    traced = bench.compare(record)
    probes = bench.compare(record, speed="probes")
    for policy in ("vllm", "jitserve"):
        assert traced[policy]["trace_stretch"] == pytest.approx(1.5, rel=0.02)
        assert "calibration trace" in traced[policy]["speed_from"]
        assert probes[policy]["trace_stretch"] is None
        assert probes[policy]["speed_from"] == "the step probes"
        # the "real" side is the probes' own simulation: only the stretched simulation moves
        assert probes[policy]["sim"]["goodput"] == pytest.approx(probes[policy]["real"]["goodput"])
        assert traced[policy]["sim"]["goodput"] < probes[policy]["sim"]["goodput"]


def test_the_real_runs_are_shown_per_class_as_the_demo_scores_them(line: dict) -> None:
    record = _record(2.0, line["samples"])
    _jobs, real = bench.real_runs(record)
    table = bench.real_class_table(real, record["slo_scale"])
    assert table is not None
    rows = {r.split()[0]: r for r in table.splitlines()[2:]}
    assert set(rows) == {"latency", "deadline", "compound", "total"}
    jobs = [bench._job_from_json(d) for d in record["jobs"]]
    assert int(rows["total"].split()[1]) == len(jobs)
    # the goodput columns are demo.score's totals for each run, baseline first
    for col, policy in ((2, "vllm"), (3, "jitserve")):
        recorded = record["runs"][policy]["results"]
        results = [bench._result_from_json(d, j) for d, j in zip(recorded, jobs, strict=True)]
        want = demo.total(demo.score(results, record["slo_scale"])).goodput
        assert float(rows["total"].split()[col].replace(",", "")) == pytest.approx(want, abs=0.5)
    del real["vllm"]
    assert bench.real_class_table(real, record["slo_scale"]) is None


def test_the_replay_keeps_the_kv_blocks_each_real_engine_runs_with(line: dict) -> None:
    """A simulated recompute victim keeps its full blocks, as vLLM's prefix cache does, so the replay must
    run each policy at the block size its real engine had: 32 tokens for the JITServe scheduler on a CPU
    build (`jitserve engine` adds it), vLLM's CPU default of 128 for stock engines (no flag given)."""
    from jitserve.engine import cli as engine_cli

    prof = bench.sim_profile(fit(line["samples"]), None, 8)
    for policy, given in (("jitserve", "32"), ("vllm", None)):
        out = bench._simulate([], policy, prof, 1, 1.0, None, policy == "jitserve")
        assert out.engines[0].speed().prefix_block_tokens == bench.cpu_block_size(policy)
        cmd, _ = engine_cli.build_command(
            engine_cli.EngineSettings(model="m", policy=policy, device="cpu"), []
        )
        flag = cmd[cmd.index("--block-size") + 1] if "--block-size" in cmd else None
        assert flag == given
    assert bench.cpu_block_size("jitserve") == 32 and bench.cpu_block_size("vllm") == 128
