"""bench/sim.py's command line: an option that does not apply to the chosen mode is refused with a
message that names it, never silently ignored (the suite once ran every policy while its command read
`--policies jitserve,jitserve-oracle`)."""

from __future__ import annotations

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
        bench_sim.main(["--suite-variants", "half-bound,quarter-bound"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--suite-variants: unknown quarter-bound" in err and "half-bound" in err.split("known:")[1]


def test_suite_variants_refuse_windows_other_than_the_stored_runs(capsys: pytest.CaptureFixture[str]) -> None:
    # the variants are judged against the stored run's baselines, which ran at the suite's own windows
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
