"""Reconciliation of one ServingPool against the API server: the plan (decisions.py) carried out
through the adapter (kube.py). Called by every kopf handler; safe to call any number of times."""

from __future__ import annotations

import datetime
import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from jitserve.operator import api
from jitserve.operator.children import Images, desired_children, unwanted_children
from jitserve.operator.decisions import (
    PLAN_STATUS_KEYS,
    Failure,
    Observed,
    Plan,
    parse_router_report,
    plan_pool,
    pool_status,
    transition_events,
)
from jitserve.operator.events import NORMAL, WARNING, Event, EventRecorder
from jitserve.operator.kube import ApiError, ChildConflictError, Kube, apply_child, manifest_hash, owned_by

log = logging.getLogger("jitserve.operator")

# Where the per-class goodput is read; {service}, {namespace}, {port}, {pool} are filled in per pool.
# The router's Prometheus /metrics, not /jitserve/status: /metrics answers without an API key and names
# no engine addresses, so a pool with `spec.router.authSecret` keeps its goodput figures and the
# operator holds no key (docs/decisions/operator.md, "Goodput without a key").
DEFAULT_ROUTER_STATUS_URL = "http://{service}.{namespace}.svc.cluster.local:{port}/metrics"


def utcnow() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Result:
    plan: Plan
    # "Kind/name" -> created | updated | repaired | deleted
    changes: dict[str, str] = field(default_factory=dict)
    status: dict[str, Any] | None = None
    status_written: bool = False
    failures: list[Failure] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)


class TransientApiError(Exception):
    """A reconcile that recorded a failure worth retrying soon (kopf retries its handler with a backoff)."""


class Reconciler:
    def __init__(
        self,
        kube: Kube,
        images: Images | None = None,
        router_status_url: str = DEFAULT_ROUTER_STATUS_URL,
        http_get: Callable[[str], Any] | None = None,
        clock: Callable[[], str] = utcnow,
        on_result: Callable[[str, str, bool, Result], None] | None = None,
        class_lookup: Callable[[str], dict[str, Any] | None] | None = None,
        events: EventRecorder | None = None,
    ) -> None:
        self.kube = kube
        self.events = events or EventRecorder(kube, clock)
        self.images = images or Images()
        self.router_status_url = router_status_url
        self.http_get = http_get or _http_get_json
        self.clock = clock
        self.on_result = on_result  # observers (tests, metrics): (namespace, name, read_router, result)
        # SLOClass name -> spec or None; the operator passes its in-memory index (kept current by
        # the watch), saving a read per class per reconcile. Without one: read from the API.
        self.class_lookup = class_lookup or self._get_class
        # (namespace, kind, name) -> (manifest hash, paths the API server rewrites in it): a mutating
        # webhook's changes to our fields are not drift (else every resync would rewrite the child).
        self._rewrites: dict[tuple[str, str, str], tuple[str, frozenset[str]]] = {}
        # One reconcile per pool at a time: kopf may call us from several handlers concurrently.
        self._locks: defaultdict[tuple[str, str], threading.Lock] = defaultdict(threading.Lock)
        self._locks_guard = threading.Lock()

    def _lock(self, namespace: str, name: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks[(namespace, name)]

    # ---- pools ------------------------------------------------------------------------------------

    def reconcile(self, namespace: str, name: str, read_router: bool = False) -> Result | None:
        """Bring one pool's children and status in line with its spec; None if the pool is gone."""
        with self._lock(namespace, name):
            pool_obj = self.kube.get(api.API_VERSION, api.SERVINGPOOL_KIND, namespace, name)
            if pool_obj is None or (pool_obj.get("metadata") or {}).get("deletionTimestamp"):
                names = {api.engine_name(name), api.router_name(name), api.classes_configmap_name(name)}
                for key in [k for k in self._rewrites if k[0] == namespace and k[2] in names]:
                    del self._rewrites[key]
                return None
            result = self._reconcile(pool_obj, read_router)
        if self.on_result is not None:
            self.on_result(namespace, name, read_router, result)
        transient = [f for f in result.failures if f.transient]
        if transient:
            raise TransientApiError("; ".join(f.message for f in transient))
        return result

    def _reconcile(self, pool_obj: dict[str, Any], read_router: bool) -> Result:
        md = pool_obj["metadata"]
        namespace, name, uid = md["namespace"], md["name"], md["uid"]
        spec = pool_obj.get("spec") or {}
        allowed = (spec.get("sloClasses") or {}).get("allowed") or []
        class_specs = {}
        for cname in allowed:
            class_specs[cname] = self.class_lookup(cname)
        plan = plan_pool(name, namespace, uid, spec, class_specs, self.images)
        result = Result(plan)
        applied: dict[tuple[str, str], dict[str, Any]] = {}  # what the API server answered, per child
        if plan.pool is not None:
            self._apply_children(plan, uid, pool_obj, result, applied)
        observed = Observed(
            engine=self._deployment(applied, namespace, api.engine_name(name)),
            router=self._deployment(applied, namespace, api.router_name(name)),
        )
        previous = dict(pool_obj.get("status") or {})
        base = dict(previous)
        if read_router and plan.pool is not None:
            report = self._router_report(plan)
            # Write only when the numbers moved: a steady router costs no API writes at all.
            if report and report["classes"] != previous.get("classes"):
                base.update(report)
        status = pool_status(plan, observed, md.get("generation"), base, self.clock(), result.failures)
        result.status = status
        result.events += _change_events(result.changes)
        result.events += transition_events(previous.get("conditions"), status["conditions"])
        try:
            if _strip_unowned(previous) != status:
                self._patch_status(
                    api.API_VERSION, api.SERVINGPOOL_KIND, namespace, name, _with_nulls(previous, status)
                )
                result.status_written = True
        except ApiError as exc:
            # Nowhere to put a condition: the Event is the only trace left besides the log.
            result.events.append(
                Event(WARNING, exc.reason, f"writing the pool's status failed: {exc.message}")
            )
            raise
        finally:
            for event in result.events:
                self.events.record(pool_obj, event)
        if result.changes:
            log.info(
                "pool %s/%s: %s", namespace, name, ", ".join(f"{k} {v}" for k, v in result.changes.items())
            )
        return result

    def _apply_children(
        self,
        plan: Plan,
        uid: str,
        pool_obj: dict[str, Any],
        result: Result,
        applied: dict[tuple[str, str], dict[str, Any]],
    ) -> None:
        """Apply every child; a refused one is recorded as a failure and the others still go ahead
        (a Forbidden Role must not keep the engines from being deployed)."""
        assert plan.pool is not None
        namespace = plan.pool.namespace
        likely_new = "observedGeneration" not in (pool_obj.get("status") or {})
        for child in desired_children(plan.pool):
            kind, cname = child["kind"], child["metadata"]["name"]
            key, digest = (namespace, kind, cname), manifest_hash(child)
            known = self._rewrites.get(key)
            rewrites = known[1] if known is not None and known[0] == digest else frozenset()
            try:
                done = apply_child(self.kube, child, uid, likely_new, server_rewrites=rewrites)
            except ChildConflictError as exc:
                result.failures.append(Failure("ApplyFailed", str(exc)))
                continue
            except ApiError as exc:
                result.failures.append(_failure(f"applying {kind} {cname}", exc))
                continue
            applied[(kind, cname)] = done.live
            if done.server_rewrites:
                log.debug(
                    "%s %s/%s: the API server rewrites %s", kind, namespace, cname, done.server_rewrites
                )
            self._rewrites[key] = (digest, done.server_rewrites)
            if done.outcome != "unchanged":
                result.changes[f"{kind}/{cname}"] = done.outcome
            if done.drifted:
                result.events.append(
                    Event(WARNING, "DriftRepaired", f"{kind} {cname}: restored {', '.join(done.drifted)}")
                )
        for api_version, kind, cname in unwanted_children(plan.pool):
            try:
                live = self.kube.get(api_version, kind, namespace, cname)
                if live is not None and owned_by(live, uid):
                    self.kube.delete(api_version, kind, namespace, cname)
                    result.changes[f"{kind}/{cname}"] = "deleted"
            except ApiError as exc:
                result.failures.append(_failure(f"deleting {kind} {cname}", exc))

    def _deployment(self, applied: dict[tuple[str, str], dict[str, Any]], namespace: str, name: str) -> Any:
        """A child Deployment as just written or read by apply, else read now (blocked pools)."""
        if ("Deployment", name) in applied:
            return applied[("Deployment", name)]
        try:
            return self.kube.get("apps/v1", "Deployment", namespace, name)
        except ApiError as exc:  # its write failed already and is in the conditions: unknown state
            log.debug("reading Deployment %s/%s failed: %s", namespace, name, exc)
            return None

    def _get_class(self, name: str) -> dict[str, Any] | None:
        obj = self.kube.get(api.API_VERSION, api.SLOCLASS_KIND, None, name)
        return None if obj is None else dict(obj.get("spec") or {})

    def _patch_status(self, api_version: str, kind: str, namespace: str, name: str, status: Any) -> None:
        try:
            self.kube.patch_status(api_version, kind, namespace, name, status)
        except ApiError as exc:
            if exc.status != 404:  # deleted meanwhile: nothing left to report on
                raise

    def _router_report(self, plan: Plan) -> dict[str, Any]:
        """Per-class goodput from the router; {} (keep the old numbers) if it cannot be reached."""
        assert plan.pool is not None
        pool = plan.pool
        url = self.router_status_url.format(
            service=api.router_name(pool.name),
            namespace=pool.namespace,
            port=pool.spec.router.port,
            pool=pool.name,
        )
        try:
            payload = self.http_get(url)
        except Exception as exc:  # noqa: BLE001 - any failure means "no fresh numbers", never an error
            log.debug("router of %s/%s unreachable at %s: %s", pool.namespace, pool.name, url, exc)
            return {}
        classes = parse_router_report(payload)
        return {"classes": classes, "classesUpdated": self.clock()} if classes else {}

    # ---- SLO classes ------------------------------------------------------------------------------

    def pools_using(self, class_name: str, pools: Iterable[tuple[str, str, list[str]]]) -> list[str]:
        return sorted(f"{ns}/{n}" for ns, n, allowed in pools if class_name in allowed)

    def refresh_class_statuses(self, pools: Iterable[tuple[str, str, list[str]]]) -> int:
        """Write each SLOClass's status.pools from (namespace, name, allowed classes) of all pools."""
        pools = list(pools)
        written = 0
        for obj in self.kube.list(api.API_VERSION, api.SLOCLASS_KIND):
            cname = obj["metadata"]["name"]
            using = self.pools_using(cname, pools)
            status = {"pools": using, "poolCount": len(using)}
            if {k: (obj.get("status") or {}).get(k) for k in status} != status:
                self.kube.patch_status(api.API_VERSION, api.SLOCLASS_KIND, None, cname, status)
                written += 1
        return written


def _failure(action: str, exc: ApiError) -> Failure:
    return Failure(exc.reason, f"{action}: {exc.reason}: {exc.message}", exc.transient)


def _change_events(changes: dict[str, str]) -> list[Event]:
    """One Normal Event per kind of change in this reconcile (created, updated, deleted children);
    drift repairs have their own Warning, with the fields."""
    by_outcome: dict[str, list[str]] = defaultdict(list)
    for child, outcome in changes.items():
        by_outcome[outcome].append(child)
    reasons = {"created": "Created", "updated": "Updated", "deleted": "Deleted"}
    return [
        Event(NORMAL, reasons[outcome], f"{outcome} {', '.join(children)}")
        for outcome, children in by_outcome.items()
        if outcome in reasons
    ]


def _strip_unowned(status: dict[str, Any]) -> dict[str, Any]:
    """The part of a live status this operator writes (ignore anything another writer added)."""
    keys = {"observedGeneration", "conditions", *PLAN_STATUS_KEYS, "classes", "classesUpdated"}
    return {k: v for k, v in status.items() if k in keys}


def _with_nulls(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """A merge patch turning `old` into `new` at the top level (null deletes a key)."""
    patch: dict[str, Any] = {k: None for k in _strip_unowned(old) if k not in new}
    patch.update(new)
    return patch


def _http_get_json(url: str) -> Any:
    """JSON when the answer is JSON (a `/jitserve/status` URL), else the text (Prometheus `/metrics`)."""
    import httpx

    resp = httpx.get(url, timeout=2.0)
    resp.raise_for_status()
    if "json" in resp.headers.get("content-type", ""):
        return resp.json()
    return resp.text


__all__ = ["ApiError", "Reconciler", "Result", "TransientApiError"]
