"""bench/sim.py's command line: an option that does not apply to the chosen mode is refused with a
message that names it, never silently ignored (the suite once ran every policy while its command read
`--policies jitserve,jitserve-oracle`)."""

from __future__ import annotations

import pytest

from bench import sim as bench_sim


def test_the_suite_refuses_a_policy_subset_instead_of_ignoring_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench_sim.main(["--suite", "--policies", "jitserve", "--seeds", "0", "--out", "/nonexistent"])
    assert exit_info.value.code == 2
    assert "--policies: --suite runs every policy of sim/suite.py" in capsys.readouterr().err
