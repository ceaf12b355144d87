"""The workload suite (sim/workloads/, sim/suite.py) and what `jitserve sim` shows a user.

One monkeypatch: the progress-bar test makes captured stderr claim to be a terminal (`isatty`), since
pytest cannot attach a real TTY; the bar code itself runs unchanged."""

from __future__ import annotations

import argparse
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from jitserve.scheduler.slo import SLOType
from jitserve.sim import cli, suite
from jitserve.sim.runner import RunConfig, compare
from jitserve.sim.workload import arrival_times, generate, load_workload

NAMES = [w.name for w in suite.SUITE]


def test_the_suite_has_the_paper_mix_and_four_workloads_unlike_it() -> None:
    assert NAMES[0] == "paper-mix" and len(NAMES) >= 4
    specs = {n: load_workload(n) for n in NAMES}
    chat = specs["chat-heavy"]
    assert chat.mix[SLOType.LATENCY] / sum(chat.mix.values()) >= 0.6
    progs = generate(specs["agentic"], rate=2.0, replicas=1, duration_s=600.0)
    calls = [c for p in progs for c in p.calls]
    assert np.median([c.input_len for c in calls]) > 10 * np.median([c.output_len for c in calls])
    assert any(len(p.stages) >= 3 for p in progs)  # multi-stage programs
    bursty = [s for s in specs.values() if s.arrivals.process == "gamma" and s.arrivals.cv >= 3]
    assert bursty
    gaps = np.diff(arrival_times(bursty[0], 5.0, np.random.default_rng(0)))
    assert gaps.std() / gaps.mean() == pytest.approx(bursty[0].arrivals.cv, rel=0.25)
    assert max(s.replicas for s in specs.values()) >= 4


@pytest.mark.parametrize("name", NAMES)
def test_a_run_with_no_flags_is_loaded(name: str) -> None:
    """The default rate is 1.5x the measured saturation rate of vLLM FCFS, not a light load where every
    policy ties."""
    spec = load_workload(name)
    sat = spec.arrivals.saturation_per_replica
    assert sat is not None
    assert spec.arrivals.rate_per_replica == pytest.approx(1.5 * sat, rel=0.08)


def test_load_flags_are_multiples_of_saturation() -> None:
    spec = load_workload("chat-heavy")
    sat = spec.arrivals.saturation_per_replica
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert cli._rates(parser.parse_args(["--loads", "0.5,2"]), spec) == pytest.approx([0.5 * sat, 2 * sat])
    assert cli._rates(parser.parse_args(["--load", "1.5"]), spec) == pytest.approx([1.5 * sat])
    assert cli._rates(parser.parse_args([]), spec) == [spec.arrivals.rate_per_replica]


def _sim(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return cli.run(parser.parse_args(argv))


ARGS = ["--workload", "chat-heavy", "--duration", "20", "--replicas", "1", "--policies", "vllm"]
ARGS += ["--predictor", "conditional"]


def test_no_progress_bar_unless_stderr_is_a_terminal(capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    assert _sim(ARGS) == 0
    out = capsys.readouterr()
    assert "sim-s" not in out.err  # captured stderr is not a terminal: nothing written
    assert "tok goodput/s" in out.out
    # the same run on a terminal draws its bar (stderr's isatty is what tqdm is told to check). Patched:
    # no terminal can be attached to a pytest run, and `isatty` is all the CLI asks of stderr
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert _sim(ARGS) == 0
    assert "sim-s" in capsys.readouterr().err


def test_a_preemption_storm_is_reported() -> None:
    from jitserve.sim.metrics import PREEMPTION_STORM_PER_REPLICA_S

    calm = SimpleNamespace(preemption_storm=False)
    storm = SimpleNamespace(
        preemption_storm=True,
        preemptions_per_replica_s=3 * PREEMPTION_STORM_PER_REPLICA_S,
        kv_preemptions=2,
        preemptions=900,
    )
    lines = cli.storm_warnings({"a": calm, "b": storm}, 2.0)
    assert len(lines) == 1 and "preemption storm: b" in lines[0]


def test_reports_carry_per_class_goodput_and_preemption_rate() -> None:
    spec = load_workload("chat-heavy")
    cfg = RunConfig(rate_per_replica=6.0, replicas=1, duration_s=30.0, predictor="conditional", drain_s=300.0)
    for rep in compare(spec, ["jitserve", "edf"], cfg).values():
        assert set(rep.token_goodput_by_type) == set(rep.attainment) == {"best-effort", "deadline", "latency"}
        assert sum(rep.token_goodput_by_type.values()) == pytest.approx(rep.token_goodput)
        assert sum(rep.requests_by_type.values()) == rep.requests
        span = rep.preemptions / max(rep.preemptions_per_replica_s, 1e-12)
        assert rep.preemptions == 0 or span >= 30.0  # over the run: arrival window and drain
        assert not rep.preemption_storm


def _runs(ours: float, best: float, fcfs_latency: float, oracle: float) -> dict:
    def rep(tok: float, lat: float) -> dict:
        return {
            "token_goodput": tok,
            "token_goodput_by_type": {"latency": lat, "deadline": tok - lat},
            "attainment": {"latency": lat / 100, "deadline": 0.5},
        }

    seed = {
        "jitserve": rep(ours, 50.0),
        "jitserve-oracle": rep(oracle, 50.0),
        "vllm": rep(100.0, fcfs_latency),
        "edf": rep(best, 50.0),
    }
    return {"0": seed, "1": seed}


POLICIES = ["jitserve", "jitserve-oracle", "vllm", "edf"]


def test_verdicts_flag_every_failed_goal() -> None:
    ok = suite.cell_verdicts(_runs(ours=300, best=250, fcfs_latency=40, oracle=310), POLICIES)
    assert ok["fails"] == [] and ok["best_baseline"] == "edf" and ok["vs_best"] == pytest.approx(1.2)
    bad = suite.cell_verdicts(_runs(ours=200, best=250, fcfs_latency=60, oracle=150), POLICIES)
    assert bad["fails"] == ["total < edf", "latency < FCFS", "oracle < JITServe"]


def test_suite_writes_per_workload_load_class_numbers_and_the_goals_table(tmp_path) -> None:  # type: ignore[no-untyped-def]
    doc = suite.run_suite(
        workloads=(suite.SuiteWorkload("chat-heavy", 20.0, replicas=1),),
        loads=(1.0,),
        seeds=(0,),
        policies=("jitserve", "jitserve-oracle", "vllm", "edf"),
    )
    runs = doc["workloads"]["chat-heavy"]["by_load"]["1"]["0"]
    assert set(runs) == {"jitserve", "jitserve-oracle", "vllm", "edf"}
    for r in runs.values():
        assert (
            set(r["token_goodput_by_type"]) == set(r["attainment"]) == {"best-effort", "deadline", "latency"}
        )
    suite.write(doc, tmp_path)
    table = (tmp_path / "suite.md").read_text()
    assert "| chat-heavy | 1 |" in table and "cells meet every goal" in table
    assert (tmp_path / "suite.json").stat().st_size > 0


def test_runs_over_disjoint_seeds_merge_into_one_document() -> None:
    def doc(seed: str) -> dict:
        runs = {seed: _runs(ours=300, best=250, fcfs_latency=40, oracle=310)["0"]}
        return {
            "policies": POLICIES,
            "loads": [1.0],
            "seeds": [int(seed)],
            "cpu_s": 10.0,
            "workloads": {"w": {"saturation_per_replica": 1.0, "by_load": {"1": runs}}},
        }

    merged = suite.merge([doc("0"), doc("1")])
    assert merged["seeds"] == [0, 1] and merged["cpu_s"] == 20.0
    assert sorted(merged["workloads"]["w"]["by_load"]["1"]) == ["0", "1"]
    with pytest.raises(ValueError, match="different"):
        suite.merge([doc("0"), {**doc("1"), "loads": [2.0]}])
