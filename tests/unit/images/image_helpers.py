"""What the images and the wheel test share: the Dockerfile parser and each image's install contract.

`CONTRACTS` is the one place that says, per image, which extras of the wheel it installs and which
command proves the installed wheel works. `test_dockerfiles.py` checks that each Dockerfile installs
the wheel with exactly those extras and runs exactly that command after installing it;
`test_wheel.py` installs the wheel built the way the Dockerfiles build it and runs the same commands.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
IMAGES = REPO / "images"


@dataclass(frozen=True)
class Contract:
    subcommand: str  # ENTRYPOINT ["jitserve", subcommand]
    extras: frozenset[str]  # pip install "<wheel>[extras]" in the final stage
    check: tuple[str, ...]  # run right after the install, in the image build and in test_wheel


CONTRACTS = {
    # vLLM comes with the base image (vllm/vllm-openai); the `gpu` extra would replace its CUDA build.
    "engine": Contract(
        "engine", frozenset(), ("jitserve", "engine", "--dry-run", "--device", "gpu", "--model", "check")
    ),
    "engine-cpu": Contract(
        "engine",
        frozenset({"cpu"}),
        ("jitserve", "engine", "--dry-run", "--device", "cpu", "--model", "check"),
    ),
    "router": Contract("router", frozenset(), ("jitserve", "router", "--help")),
    "operator": Contract("operator", frozenset(), ("jitserve", "operator", "--help")),
}


def package_dirs() -> dict[str, str]:
    """pyproject.toml's [tool.setuptools] package-dir: package name -> folder."""
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]


@dataclass
class Stage:
    base: str
    alias: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, name: str) -> list[str]:
        return [args for instr, args in self.instructions if instr == name]

    def last(self, name: str) -> str | None:
        found = self.all(name)
        return found[-1] if found else None


def parse_dockerfile(text: str) -> list[Stage]:
    """Instructions grouped by stage, with line continuations joined and comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue  # parser directives (# syntax=), comments and hadolint pragmas
        if pending and line.startswith("#"):
            continue  # comments inside a continued instruction are allowed and ignored
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "Dockerfile ends inside a line continuation"
    stages: list[Stage] = []
    for line in logical:
        instr, _, args = line.partition(" ")
        instr, args = instr.upper(), args.strip()
        if instr == "FROM":
            m = re.fullmatch(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", args, re.IGNORECASE)
            assert m, f"unparsable FROM {args!r}"
            stages.append(Stage(base=m[1], alias=m[2]))
        else:
            assert stages, f"{instr} before the first FROM"
            stages[-1].instructions.append((instr, args))
    return stages


def dockerfiles() -> list[str]:
    return sorted(p.parent.name for p in IMAGES.glob("*/Dockerfile"))


def stages(name: str) -> list[Stage]:
    return parse_dockerfile((IMAGES / name / "Dockerfile").read_text())


def copy_sources(stage: Stage) -> list[str]:
    """Build-context paths a stage COPYs (not those copied from another stage), in order."""
    sources: list[str] = []
    for args in stage.all("COPY"):
        if args.startswith("--from="):
            continue
        parts = [p for p in args.split() if not p.startswith("--")]
        sources += [p.rstrip("/") for p in parts[:-1]]
    return sources


def wheel_stage(name: str) -> Stage:
    """The first stage, which builds the wheel from the COPYed sources."""
    first = stages(name)[0]
    assert first.alias == "wheel", f"{name}: the first stage must be `AS wheel`"
    return first
