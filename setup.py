"""Package discovery that follows the folders: nothing to list by hand, nothing a wheel can drop.

pyproject.toml's [tool.setuptools] package-dir maps each top-level folder into the `jitserve`
namespace (cli/ -> jitserve, scheduler/ -> jitserve.scheduler, ...). Everything else comes from the
folders themselves:

- every directory under a mapped folder that holds a .py file is a package (with or without
  __init__.py: operator/ has none on purpose, tests/unit/test_layout.py says why);
- every other file (sim/workloads/*.yaml, sim/profiles/*.yaml, ...) is package data of the nearest
  package above it.

So a new subpackage or data file ships without an edit here; tests/unit/images/test_wheel.py checks
that the wheel holds exactly the files of the mapped folders and that each of its modules imports.
"""

from __future__ import annotations

import glob
import os
import tomllib
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
SKIPPED_DIRS = {"__pycache__"}
SKIPPED_SUFFIXES = {".pyc", ".pyo"}


def discover(package_dir: dict[str, str]) -> tuple[list[str], dict[str, list[str]]]:
    """(packages, package_data) for every folder of `package_dir`, relative to ROOT."""
    folders = {name: (ROOT / folder).resolve() for name, folder in package_dir.items() if name}
    packages: list[str] = []
    package_data: dict[str, list[str]] = {}
    for name, folder in folders.items():
        # A mapped folder nested in another one is that other package's business, not this walk's.
        nested = {f for n, f in folders.items() if n != name and f != folder and f.is_relative_to(folder)}
        package_of: dict[Path, str] = {}  # package directory -> package name
        for dirpath, dirnames, filenames in os.walk(folder):
            here = Path(dirpath)
            dirnames[:] = sorted(
                d
                for d in dirnames
                if d not in SKIPPED_DIRS and not d.startswith(".") and here / d not in nested
            )
            files = sorted(
                f for f in filenames if not f.startswith(".") and Path(f).suffix not in SKIPPED_SUFFIXES
            )
            if here == folder or any(f.endswith(".py") for f in files):
                rel = here.relative_to(folder)
                package_of[here] = ".".join([name, *rel.parts])
                packages.append(package_of[here])
            owner = next(d for d in (here, *here.parents) if d in package_of)
            # package_data entries are glob patterns: escape names with [ ] * ?
            data = [
                glob.escape((here / f).relative_to(owner).as_posix()) for f in files if not f.endswith(".py")
            ]
            if data:
                package_data.setdefault(package_of[owner], []).extend(data)
    return packages, package_data


def _package_dir() -> dict[str, str]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]["package-dir"]


packages, package_data = discover(_package_dir())
setup(packages=packages, package_data=package_data)
