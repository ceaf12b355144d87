"""The operator's run-time configuration, set before handlers.py is imported (its decorators read it)."""

from __future__ import annotations

from dataclasses import dataclass

from jitserve.operator.reconciler import Reconciler


@dataclass
class Config:
    reconciler: Reconciler | None = None
    resync_seconds: float = 30.0
    workers: int = 16
    retry_seconds: float = 10.0  # kopf's retry of a pool whose reconcile hit a transient API failure


CONFIG = Config()


def configure(reconciler: Reconciler, resync_seconds: float = 30.0, workers: int = 16) -> None:
    CONFIG.reconciler, CONFIG.resync_seconds, CONFIG.workers = reconciler, resync_seconds, workers
