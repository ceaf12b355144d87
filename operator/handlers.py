"""kopf wiring: which events reconcile which pools. All decisions live in reconciler.py/reconcile.py.

Loaded by `jitserve operator` (cli.py) after `runtime.configure()`; importing this module registers handlers.
Every handler is level-based: it re-reads the pool and converges, so duplicated, reordered or
missed events (and operator restarts) cannot leave anything half-done.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from jitserve.operator import api
from jitserve.operator.reconciler import Reconciler
from jitserve.operator.runtime import CONFIG

log = logging.getLogger("jitserve.operator")


def _rec() -> Reconciler:
    if CONFIG.reconciler is None:  # run by `kopf run` directly: build the default one
        from jitserve.operator.kube import Kube

        CONFIG.reconciler = Reconciler(Kube())
    return CONFIG.reconciler


@kopf.on.startup()
def _startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    # Keep kopf's bookkeeping in annotations of our own prefix: the status schema has no `kopf` field
    # (the API server would prune it) and the status belongs to the users.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=api.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=api.GROUP, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{api.GROUP}/finalizer"
    settings.execution.max_workers = CONFIG.workers
    settings.posting.level = logging.WARNING  # Kubernetes Events only for problems
    settings.watching.server_timeout = 300


@kopf.index(api.SERVINGPOOL_PLURAL)
def pool_classes(namespace: str, name: str, spec: kopf.Spec, **_: Any) -> dict[str, Any]:
    """In-memory index: (namespace, name) -> allowed classes, to find the pools an SLOClass feeds."""
    return {(namespace, name): list((spec.get("sloClasses") or {}).get("allowed") or [])}


def _pools(index: kopf.Index) -> list[tuple[str, str, list[str]]]:
    return [(ns, name, allowed) for (ns, name), store in index.items() for allowed in store]


@kopf.on.resume(api.SERVINGPOOL_PLURAL)
@kopf.on.create(api.SERVINGPOOL_PLURAL)
@kopf.on.update(api.SERVINGPOOL_PLURAL)
def pool_changed(namespace: str, name: str, **_: Any) -> None:
    _rec().reconcile(namespace, name)


@kopf.on.event(api.SERVINGPOOL_PLURAL)
def pool_event(pool_classes: kopf.Index, **_: Any) -> None:
    """Any pool event (including deletion) may change which pools use which class."""
    _rec().refresh_class_statuses(_pools(pool_classes))


@kopf.timer(api.SERVINGPOOL_PLURAL, interval=CONFIG.resync_seconds, initial_delay=CONFIG.resync_seconds / 2)
def pool_resync(namespace: str, name: str, **_: Any) -> None:
    """Periodic resync: router-reported goodput into status, and repair of anything missed."""
    _rec().reconcile(namespace, name, read_router=True)


@kopf.on.event(api.SLOCLASS_PLURAL)
def class_event(name: str, type: str | None, pool_classes: kopf.Index, **_: Any) -> None:  # noqa: A002
    """An SLOClass appeared, changed or went: every pool that names it re-plans (ConfigMap, status)."""
    pools = _pools(pool_classes)
    for ns, pool, allowed in pools:
        if name in allowed:
            _rec().reconcile(ns, pool)
    if type != "DELETED":
        _rec().refresh_class_statuses(pools)


@kopf.on.event("apps", "v1", "deployments", labels={"app.kubernetes.io/managed-by": api.MANAGED_BY})
def child_event(namespace: str, body: kopf.Body, **_: Any) -> None:
    """A child Deployment's status moved (pods became ready, ...): refresh its pool's status."""
    for ref in body.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("kind") == api.SERVINGPOOL_KIND and ref.get("apiVersion", "").startswith(api.GROUP + "/"):
            _rec().reconcile(namespace, ref["name"])
