"""kopf wiring: which events reconcile which pools. All decisions live in decisions.py (pure) and are
carried out by reconciler.py.

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
from jitserve.operator.reconciler import Reconciler, TransientApiError
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


@kopf.index(api.SLOCLASS_PLURAL)
def class_specs(name: str, spec: kopf.Spec, **_: Any) -> dict[str, Any]:
    """In-memory index: SLOClass name -> spec (the reconciler reads classes from here, not the API)."""
    return {name: dict(spec)}


_INDEXES: dict[str, kopf.Index] = {}  # kopf's live index objects, captured from handler kwargs


def _remember(class_specs: kopf.Index | None = None, pool_classes: kopf.Index | None = None) -> None:
    if class_specs is not None:
        _INDEXES["classes"] = class_specs
    if pool_classes is not None:
        BACKGROUND.index = pool_classes


def _lookup_class(name: str) -> dict[str, Any] | None:
    """SLOClass spec from the in-memory index (complete before any handler runs, per kopf)."""
    index = _INDEXES.get("classes")
    if index is None:
        return _rec()._get_class(name)  # noqa: SLF001 - no index yet: ask the API server
    for spec in index.get(name, ()):
        return spec
    return None


@kopf.index(api.SERVINGPOOL_PLURAL)
def pool_classes(namespace: str, name: str, spec: kopf.Spec, **_: Any) -> dict[str, Any]:
    """In-memory index: (namespace, name) -> allowed classes, to find the pools an SLOClass feeds."""
    return {(namespace, name): list((spec.get("sloClasses") or {}).get("allowed") or [])}


def _pools(index: kopf.Index) -> list[tuple[str, str, list[str]]]:
    return [(ns, name, allowed) for (ns, name), store in index.items() for allowed in store]


@kopf.on.resume(api.SERVINGPOOL_PLURAL)
@kopf.on.create(api.SERVINGPOOL_PLURAL)
@kopf.on.update(api.SERVINGPOOL_PLURAL)
def pool_changed(
    namespace: str, name: str, class_specs: kopf.Index, pool_classes: kopf.Index, **_: Any
) -> None:
    _remember(class_specs, pool_classes)
    try:
        _rec().reconcile(namespace, name)
    except TransientApiError as exc:
        # Recorded in the pool's conditions already; try again soon. Permanent failures (Forbidden,
        # Invalid) are not retried here: the resync repairs them once fixed, every resync_seconds.
        raise kopf.TemporaryError(str(exc), delay=CONFIG.retry_seconds) from None


@kopf.on.event(api.SERVINGPOOL_PLURAL)
def pool_event(class_specs: kopf.Index, pool_classes: kopf.Index, **_: Any) -> None:
    """Any pool event (including deletion) may change which pools use which class: mark the classes'
    status stale. The background thread rewrites them, coalescing a burst of pool events into one pass."""
    _remember(class_specs, pool_classes)
    BACKGROUND.classes_stale.set()


class _Background:
    """Work in a thread of our own, not in kopf timers (kopf puts a finalizer on every object with a
    timer, and owner references already make deletion complete without one):
    - every `resync_seconds`: router-reported goodput into each pool's status, and repair of
      anything an event missed;
    - whenever pools changed: SLOClass status (which pools use each class), at most twice a second.
    """

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.classes_stale = threading.Event()
        self.index: kopf.Index | None = None
        self.threads: list[threading.Thread] = []

    def pools(self) -> list[tuple[str, str, list[str]]]:
        return _pools(self.index) if self.index is not None else []

    def resync(self) -> None:
        while not self.stop.wait(CONFIG.resync_seconds):
            for ns, name, _ in self.pools():
                if self.stop.is_set():
                    return
                try:
                    _rec().reconcile(ns, name, read_router=True)
                except TransientApiError as exc:  # in the pool's conditions already; next resync retries
                    log.warning("resync of pool %s/%s: %s", ns, name, exc)
                except Exception:  # noqa: BLE001 - one pool's failure must not stop the others
                    log.exception("resync of pool %s/%s failed", ns, name)

    def class_statuses(self) -> None:
        while not self.stop.is_set():
            if not self.classes_stale.wait(0.5):
                continue
            self.stop.wait(0.5)  # let a burst of pool events settle into one pass
            self.classes_stale.clear()
            try:
                _rec().refresh_class_statuses(self.pools())
            except Exception:  # noqa: BLE001 - retried on the next pool event or resync
                log.exception("refreshing SLOClass statuses failed")
                self.classes_stale.set()


BACKGROUND = _Background()


@kopf.on.startup()
def _start_background(**_: Any) -> None:
    _rec().class_lookup = _lookup_class
    BACKGROUND.stop.clear()
    BACKGROUND.threads = [
        threading.Thread(target=BACKGROUND.resync, name="jitserve-resync", daemon=True),
        threading.Thread(target=BACKGROUND.class_statuses, name="jitserve-class-status", daemon=True),
    ]
    for thread in BACKGROUND.threads:
        thread.start()


@kopf.on.cleanup()
def _stop_background(**_: Any) -> None:
    BACKGROUND.stop.set()


# Last seen spec of each SLOClass and readiness of each child Deployment: events that change neither
# (our own status writes, kopf's annotations, the initial listing) cost nothing.
_CLASS_SPECS: dict[str, Any] = {}
_DEPLOYMENT_STATE: dict[tuple[str, str], tuple[Any, ...]] = {}
_SEEN_LOCK = threading.Lock()


@kopf.on.event(api.SLOCLASS_PLURAL)
def class_event(  # noqa: A002 - kopf's argument names
    name: str, type: str | None, spec: kopf.Spec, class_specs: kopf.Index, pool_classes: kopf.Index, **_: Any
) -> None:
    """An SLOClass appeared, changed or went: every pool that names it re-plans (ConfigMap, status)."""
    _remember(class_specs, pool_classes)
    with _SEEN_LOCK:
        current = None if type == "DELETED" else dict(spec)
        changed = _CLASS_SPECS.get(name) != current
        _CLASS_SPECS[name] = current
    if type is None or not changed:
        return  # the initial listing (pools resume by themselves) or a status-only change
    for ns, pool, allowed in _pools(pool_classes):
        if name in allowed:
            _reconcile_from_event(ns, pool)
    BACKGROUND.classes_stale.set()


@kopf.on.event("apps", "v1", "deployments", labels={"app.kubernetes.io/managed-by": api.MANAGED_BY})
def child_event(namespace: str, name: str, type: str | None, body: kopf.Body, **_: Any) -> None:  # noqa: A002
    """A child Deployment's rollout moved (pods became ready, ...) or its spec was edited: reconcile its
    pool (status refreshed, a hand edit repaired)."""
    status = body.get("status") or {}
    progressing = [
        (c.get("status"), c.get("reason"))
        for c in status.get("conditions") or []
        if c.get("type") == "Progressing"
    ]
    state = (
        type == "DELETED",
        body.get("metadata", {}).get("generation"),  # moves on a hand edit of the spec: repaired at once
        status.get("observedGeneration"),
        status.get("replicas"),
        status.get("readyReplicas"),
        status.get("updatedReplicas"),
        tuple(progressing),  # ProgressDeadlineExceeded reported (not its timestamps: they move often)
    )
    with _SEEN_LOCK:
        changed = _DEPLOYMENT_STATE.get((namespace, name)) != state
        _DEPLOYMENT_STATE[(namespace, name)] = state
    if not changed or type in (None, "ADDED"):
        return  # the initial listing, or our own create (its pool is reconciling right now)
    for ref in body.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("kind") == api.SERVINGPOOL_KIND and ref.get("apiVersion", "").startswith(api.GROUP + "/"):
            _reconcile_from_event(namespace, ref["name"])


def _reconcile_from_event(namespace: str, name: str) -> None:
    """Reconcile for an event of another object (kopf does not retry event handlers): a transient
    failure is in the pool's conditions already and the resync retries it."""
    try:
        _rec().reconcile(namespace, name)
    except TransientApiError as exc:
        log.warning("reconcile of pool %s/%s: %s", namespace, name, exc)
