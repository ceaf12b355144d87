"""kopf wiring: which events reconcile which pools. All decisions live in reconciler.py/reconcile.py.

Loaded by `jitserve operator` (cli.py) after `runtime.configure()`; importing this module registers handlers.
Every handler is level-based: it re-reads the pool and converges, so duplicated, reordered or
missed events (and operator restarts) cannot leave anything half-done.
"""

from __future__ import annotations

import logging
import threading
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
    # kopf adds this finalizer only for handlers that need one; ours do not (owner references clean up).
    settings.persistence.finalizer = f"{api.GROUP}/finalizer"
    settings.execution.max_workers = CONFIG.workers
    settings.posting.level = logging.WARNING  # Kubernetes Events only for problems
    settings.watching.server_timeout = 300


@kopf.on.login()
def _login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """Log kopf in with the same client configuration the reconciler uses (one source of truth)."""
    if CONFIG.reconciler is None:
        return kopf.login_via_client(**kwargs)
    cfg = CONFIG.reconciler.kube.api_client.configuration
    if getattr(cfg, "refresh_api_key_hook", None) is not None:
        cfg.refresh_api_key_hook(cfg)  # in-cluster tokens rotate
    token = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
    if token and token.lower().startswith("bearer "):
        token = token[len("bearer ") :]
    return kopf.ConnectionInfo(
        server=cfg.host,
        token=token,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
    )


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
    RESYNC.index = pool_classes
    _rec().refresh_class_statuses(_pools(pool_classes))


class _Resync:
    """Periodic resync in a thread of our own: router-reported goodput into each pool's status, and
    repair of anything an event missed. Not a kopf timer: kopf puts a finalizer on every object
    with a timer, and owner references already make deletion complete without one."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.index: kopf.Index | None = None

    def run(self) -> None:
        while not self.stop.wait(CONFIG.resync_seconds):
            for ns, name, _ in _pools(self.index) if self.index is not None else []:
                if self.stop.is_set():
                    return
                try:
                    _rec().reconcile(ns, name, read_router=True)
                except Exception:  # noqa: BLE001 - one pool's failure must not stop the others
                    log.exception("resync of pool %s/%s failed", ns, name)


RESYNC = _Resync()


@kopf.on.startup()
def _start_resync(**_: Any) -> None:
    RESYNC.stop.clear()
    RESYNC.thread = threading.Thread(target=RESYNC.run, name="jitserve-resync", daemon=True)
    RESYNC.thread.start()


@kopf.on.cleanup()
def _stop_resync(**_: Any) -> None:
    RESYNC.stop.set()


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
