"""The import contracts (pyproject.toml [tool.importlinter]) hold, and they catch what they forbid.

Each run is a real `lint-imports` over a `jitserve` view of the folders (tests/import_contracts.py);
the breaking cases copy the sources into tmp_path and inject one import there.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.import_contracts import REPO, package_dir

SCRIPT = REPO / "tests" / "import_contracts.py"


def _run(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(root)], capture_output=True, text=True, timeout=300
    )


def _copy_sources(dest: Path) -> Path:
    shutil.copy(REPO / "pyproject.toml", dest / "pyproject.toml")
    for folder in set(package_dir(REPO).values()):
        shutil.copytree(REPO / folder, dest / folder, ignore=shutil.ignore_patterns("__pycache__", ".*"))
    return dest


def _inject(path: Path, line: str) -> None:
    """`line` as a module-level import right after the module's docstring and __future__ import."""
    lines = path.read_text().splitlines(keepends=True)
    at = next(i for i, text in enumerate(lines) if text.startswith("from __future__ import"))
    lines.insert(at + 1, line + "\n")
    path.write_text("".join(lines))


def test_the_contracts_hold() -> None:
    out = _run(REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Contracts: 5 kept, 0 broken." in out.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract", "edge"),
    [
        (
            "scheduler/goodput.py",
            "import vllm",
            "Core is pure (jitserve.scheduler)",
            "jitserve.scheduler.goodput -> vllm",
        ),
        (
            "scheduler/gmax.py",
            "from jitserve.engine import runner",
            "Core is pure (jitserve.scheduler)",
            "jitserve.scheduler.gmax -> jitserve.engine.runner",
        ),
        (
            "sim/simulator.py",
            "from jitserve.local import up",
            "Simulator drives the core only (jitserve.sim)",
            "jitserve.sim.simulator -> jitserve.local.up",
        ),
    ],
    ids=["core-imports-vllm", "core-imports-engine", "sim-imports-local"],
)
def test_a_forbidden_import_breaks_its_contract(
    tmp_path: Path, module: str, line: str, contract: str, edge: str
) -> None:
    root = _copy_sources(tmp_path)
    _inject(root / module, line)
    out = _run(root)
    assert out.returncode != 0, out.stdout
    assert f"{contract} BROKEN" in out.stdout
    # (Other contracts may break with it: the router reaches vllm through the core's module now.)
    assert edge in out.stdout


def _reads_environment_or_starts_threads(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            name = f"{node.value.id}.{node.attr}"
            if name in ("os.environ", "os.getenv", "os.putenv", "threading.Thread", "threading.Timer"):
                found.append(f"{name} (line {node.lineno})")
        if isinstance(node, ast.ImportFrom) and node.module in ("os", "threading"):
            names = {a.name for a in node.names} & {"environ", "getenv", "putenv", "Thread", "Timer"}
            found += [f"from {node.module} import {n} (line {node.lineno})" for n in sorted(names)]
    return found


def test_the_core_reads_no_environment_and_starts_no_thread() -> None:
    """What import-linter cannot see: the core takes its settings as arguments and runs on the caller's
    thread (the engine adapter reads JITSERVE_* and starts the analyzer's refit thread)."""
    found = {
        str(path.relative_to(REPO)): hits
        for path in sorted((REPO / "scheduler").rglob("*.py"))
        if (hits := _reads_environment_or_starts_threads(ast.parse(path.read_text())))
    }
    assert found == {}
