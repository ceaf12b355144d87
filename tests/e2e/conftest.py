"""Fixtures of the emulated cluster (tests/emulated): an in-memory Kubernetes API server, kubectl
pointed at it, and a client. KUBECONFIG is set here, before anything imports `kubernetes`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
KUBECONFIG = Path(tempfile.mkdtemp(prefix="emulated-kube-")) / "config"
os.environ["KUBECONFIG"] = str(KUBECONFIG)

from emulated import EmulatedCluster  # noqa: E402

T = TypeVar("T")


@pytest.fixture(scope="session")
def emulated_cluster() -> Iterator[EmulatedCluster]:
    with EmulatedCluster(KUBECONFIG) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def kube(emulated_cluster: EmulatedCluster) -> Any:
    import kubernetes

    from jitserve.operator.kube import Kube

    return Kube(kubernetes.config.new_client_from_config(config_file=str(emulated_cluster.kubeconfig)))


class Kubectl:
    """The real kubectl against the emulated API server (no OpenAPI there: --validate=false)."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig

    def __call__(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess:  # noqa: A002
        cmd = ["kubectl", f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=60)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stderr}")
        return result

    def apply(self, manifest: str | Path, check: bool = True) -> subprocess.CompletedProcess:
        if isinstance(manifest, Path):
            return self("apply", "--validate=false", "-f", str(manifest), check=check)
        return self("apply", "--validate=false", "-f", "-", input=manifest, check=check)


@pytest.fixture(scope="session")
def kubectl(emulated_cluster: EmulatedCluster) -> Kubectl:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    return Kubectl(emulated_cluster.kubeconfig)


def wait_for(fn: Callable[[], T], timeout: float = 30.0, what: str = "condition") -> T:
    """Poll until fn() is truthy; the timeout only bounds a hang, it is not what a test asserts."""
    deadline = time.monotonic() + timeout
    value = fn()
    while not value:
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}; last value: {value!r}")
        time.sleep(0.05)
        value = fn()
    return value
