"""Emulated built-in controllers: the emulated API server has none, so a test that needs Deployments
to report ready pods runs this one. It writes the status the real Deployment controller would once
every pod is ready; no pods are started (running them as local processes is the e2e pod runner's job).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

from jitserve.operator.kube import Kube


class EmulatedDeploymentController:
    """Marks every Deployment's replicas ready, or none of them while `ready(deployment)` says False."""

    def __init__(
        self, kube: Kube, interval: float = 0.05, ready: Callable[[dict[str, Any]], bool] | None = None
    ) -> None:
        self.kube = kube
        self.ready = ready or (lambda dep: True)
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="emulated-deployment-controller", daemon=True)

    def __enter__(self) -> EmulatedDeploymentController:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(5)

    def desired_status(self, dep: dict[str, Any]) -> dict[str, Any]:
        replicas = int((dep.get("spec") or {}).get("replicas") or 0)
        ready = replicas if self.ready(dep) else 0
        return {
            "observedGeneration": dep["metadata"].get("generation"),
            "replicas": replicas,
            "updatedReplicas": replicas,
            "readyReplicas": ready,
            "availableReplicas": ready,
        }

    def sync_once(self) -> int:
        """One pass over all Deployments; returns how many statuses it wrote."""
        written = 0
        for dep in self.kube.list("apps/v1", "Deployment"):
            want = self.desired_status(dep)
            have = {k: (dep.get("status") or {}).get(k) for k in want}
            if have != want:
                md = dep["metadata"]
                self.kube.patch_status("apps/v1", "Deployment", md["namespace"], md["name"], want)
                written += 1
        return written

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):  # the server may be stopping: try again next round
                self.sync_once()
            self._stop.wait(self._interval)
