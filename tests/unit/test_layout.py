"""The source layout never shadows the standard library, and every component imports as jitserve.*."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_operator_folder_is_not_a_regular_package():
    # A regular package here would shadow the stdlib `operator` for anything run from the repo root.
    assert not (ROOT / "operator" / "__init__.py").exists()


def test_stdlib_operator_wins_from_the_repo_root():
    out = subprocess.run(
        [sys.executable, "-c", "import operator, jitserve.operator.crdgen; print(operator.__file__)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip().endswith("operator.py")
    assert not out.strip().startswith(str(ROOT))


def test_cli_help_lists_every_component():
    out = subprocess.run(
        [sys.executable, "-m", "jitserve.main", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for command in ("engine", "router", "operator", "sim", "up", "demo"):
        assert command in out


def test_no_script_folder_shadows_the_standard_library():
    """`python bench/sim.py` puts bench/ first on sys.path: a bench/operator.py there replaced the stdlib
    `operator` (argparse imports it) and every benchmark script died at import."""
    stdlib = set(sys.stdlib_module_names)
    clashes = sorted(p.name for p in (ROOT / "bench").glob("*.py") if p.stem in stdlib)
    assert not clashes, f"bench/ shadows the standard library when its scripts run: {clashes}"
