"""Run import-linter's contracts (pyproject.toml [tool.importlinter]) over the source folders.

Why a view: pyproject.toml maps each top-level folder into `jitserve` (package-dir: cli/ -> jitserve,
scheduler/ -> jitserve.scheduler, ...) and the editable install resolves those through an import hook.
import-linter's graph builder (grimp) finds `jitserve` and walks its directory, so it would see cli/
only. This copies the mapped folders' .py files into a `jitserve/` tree in a temp dir (adding an
`__init__.py` where a package directory has none: operator/ has none on purpose, test_layout.py says
why) and runs `lint-imports` with that tree first on PYTHONPATH. The view holds no other files and is
removed afterwards.

    .venv/bin/python tests/import_contracts.py [--root DIR]   # exit status: lint-imports'
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SKIPPED_DIRS = {"__pycache__"}


def package_dir(root: Path) -> dict[str, str]:
    with open(root / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]["package-dir"]


def build_view(root: Path, dest: Path) -> Path:
    """A `jitserve` package tree of `root`'s mapped folders under `dest`; returns `dest`."""
    folders = {name: (root / folder).resolve() for name, folder in package_dir(root).items() if name}
    for name, folder in folders.items():
        target = dest.joinpath(*name.split("."))
        nested = {f for n, f in folders.items() if n != name and f != folder and f.is_relative_to(folder)}
        for dirpath, dirnames, filenames in os.walk(folder):
            here = Path(dirpath)
            dirnames[:] = [
                d
                for d in dirnames
                if d not in SKIPPED_DIRS and not d.startswith(".") and here / d not in nested
            ]
            sources = [f for f in filenames if f.endswith(".py")]
            if not sources and here != folder:
                continue
            out = target / here.relative_to(folder)
            out.mkdir(parents=True, exist_ok=True)
            for f in sources:
                shutil.copyfile(here / f, out / f)
    # Every directory on the way to a module is a regular package in the view.
    for directory in [d for d in dest.rglob("*") if d.is_dir()]:
        (directory / "__init__.py").touch(exist_ok=True)
    return dest


def lint_imports(root: Path = REPO) -> subprocess.CompletedProcess[str]:
    """lint-imports over `root`'s sources with `root`'s pyproject.toml; output captured."""
    lint = Path(sys.executable).with_name("lint-imports")
    with tempfile.TemporaryDirectory(prefix="jitserve-imports-") as tmp:
        view = build_view(root, Path(tmp) / "view")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(view), os.environ.get("PYTHONPATH", "")])}
        # cwd: lint-imports puts its cwd on sys.path; the temp dir holds nothing importable but the view.
        return subprocess.run(
            [str(lint), "--config", str(root / "pyproject.toml"), "--no-cache"],
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--root", type=Path, default=REPO, help="repository root (default: this one)")
    args = parser.parse_args(argv)
    out = lint_imports(args.root.resolve())
    sys.stdout.write(out.stdout)
    sys.stderr.write(out.stderr)
    return out.returncode


if __name__ == "__main__":
    sys.exit(main())
