"""Fixtures of the emulated cluster (tests/emulated): an in-memory Kubernetes API server, kubectl
pointed at it, and a client. KUBECONFIG is set here, before anything imports `kubernetes`."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
KUBECONFIG = Path(tempfile.mkdtemp(prefix="emulated-kube-")) / "config"
os.environ["KUBECONFIG"] = str(KUBECONFIG)

from tests.emulated import EmulatedCluster, Kubectl  # noqa: E402

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


@pytest.fixture(scope="session")
def kubectl(emulated_cluster: EmulatedCluster) -> Kubectl:
    assert shutil.which("kubectl") is not None, "kubectl is not on PATH (this machine kind has it)"
    return Kubectl(emulated_cluster.kubeconfig)
