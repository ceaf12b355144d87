"""bench/sim.py's command line: an option that does not apply to the chosen mode is refused with a
message that names it, never silently ignored (the suite once ran every policy while its command read
`--policies jitserve,jitserve-oracle`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import sim as bench_sim


def test_the_suite_refuses_a_policy_subset_instead_of_ignoring_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench_sim.main(["--suite", "--policies", "jitserve", "--seeds", "0", "--out", "/nonexistent"])
    assert exit_info.value.code == 2
    assert "--policies: --suite runs every policy of sim/suite.py" in capsys.readouterr().err


def test_suite_variants_refuse_an_unknown_variant(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench_sim.main(["--suite-variants", "occupancy,quarter-bound"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--suite-variants: unknown quarter-bound" in err and "occupancy" in err.split("known:")[1]
    # the deployed rule is the `deployed` row, not a variant of itself
    assert "half-bound" not in err.split("known:")[1]


def test_suite_variants_refuse_windows_other_than_the_stored_runs(capsys: pytest.CaptureFixture[str]) -> None:
    # the variants are judged against the stored run's baselines, so they run at the stored run's windows
    with pytest.raises(SystemExit) as exit_info:
        bench_sim.main(["--suite-variants", "one-token", "--duration-scale", "0.5"])
    assert exit_info.value.code == 2
    assert "--duration-scale" in capsys.readouterr().err


def test_suite_variants_name_the_cells_the_stored_run_lacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stored = tmp_path / "suite.json"
    stored.write_text('{"policies": [], "workloads": {"paper-mix": {"by_load": {"1": {"0": {}}}}}}')
    code = bench_sim.main(
        [
            "--suite-variants",
            "one-token",
            "--stored",
            str(stored),
            "--workloads",
            "paper-mix",
            "--loads",
            "1,2",
        ]
    )
    assert code == 2
    assert "has no run of paper-mix load 2 seed 0" in capsys.readouterr().err


def test_suite_variants_refuse_a_stored_run_with_uneven_windows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The variants run at the stored run's windows, read from its workloads' `duration_s` against the
    suite's own: a record whose workloads were scaled differently has no one scale to run at."""
    from jitserve.sim import suite

    own = {w.name: w.duration_s for w in suite.SUITE}
    cell = {"by_load": {"1": {"0": {}}}}
    stored = tmp_path / "suite.json"
    stored.write_text(
        json.dumps(
            {
                "policies": [],
                "workloads": {
                    "paper-mix": {**cell, "duration_s": own["paper-mix"] * 4},
                    "bursty": {**cell, "duration_s": own["bursty"]},
                },
            }
        )
    )
    argv = ["--suite-variants", "one-token", "--stored", str(stored), "--loads", "1"]
    code = bench_sim.main([*argv, "--workloads", "paper-mix,bursty"])
    assert code == 2
    assert "scales its workloads' windows unevenly: [1.0, 4.0]" in capsys.readouterr().err


def test_every_replica_of_every_run_gets_the_mechanism_variant() -> None:
    """The simulator builds a policy once per replica of every run. A variant that took its settings
    away on its first build made only the first replica of the first seed the variant, and the table
    then printed the deployed JITServe's numbers under "no-preemption"."""
    from jitserve.scheduler.placement import ShortReplyRule
    from jitserve.sim.policies import SimContext
    from jitserve.sim.profiles import BatchTimeModel, load_profile

    profile = load_profile("llama-3.1-8b-a100")
    ctx = SimContext(profile, BatchTimeModel.from_profile(profile), tightest_tbt=0.1)
    variants = bench_sim.mechanism_variants()
    for _ in range(3):
        assert variants["m:no-preemption"](ctx).policy.params.preemption == "never"
        assert not variants["m:no-midframe-preemption"](ctx).policy.preempts_midframe
        assert variants["m:bound admission"](ctx).short_reply is ShortReplyRule.BOUND
        assert variants["m:B=max_num_seqs"](ctx).policy.params.batch_size == ctx.batch_size
