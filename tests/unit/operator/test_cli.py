"""`jitserve operator` and `jitserve crds` are wired into the CLI, and stay light to import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _run(*code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *code], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_importing_the_operator_cli_does_not_import_kopf_or_kubernetes() -> None:
    code = (
        "import sys, jitserve.operator.cli, jitserve.operator.crdgen; "
        "print(sorted(m for m in ('kopf', 'kubernetes') if m in sys.modules))"
    )
    out = _run("-c", code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_operator_help_and_crds_print() -> None:
    help_text = _run("-m", "jitserve.main", "operator", "--help")
    assert help_text.returncode == 0, help_text.stderr
    for flag in ("--engine-image", "--router-status-url", "--resync-seconds", "--namespace"):
        assert flag in help_text.stdout
    crds = _run("-m", "jitserve.main", "crds")
    assert crds.returncode == 0, crds.stderr
    assert "name: sloclasses.jitserve.dev" in crds.stdout and "name: servingpools.jitserve.dev" in crds.stdout
