"""A thin Kubernetes adapter: get/create/replace/delete of plain manifest dicts, and applying a
pool's children idempotently.

It speaks REST through the official client's ApiClient (auth, TLS, kubeconfig or in-cluster), so the
manifests stay plain dicts end to end and one code path serves every kind.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from jitserve.operator import api
from jitserve.operator.validation import same_quantity

Manifest = dict[str, Any]

# kind -> (plural, namespaced); every kind the operator reads or writes.
PLURALS: dict[str, tuple[str, bool]] = {
    "ConfigMap": ("configmaps", True),
    "Secret": ("secrets", True),
    "ServiceAccount": ("serviceaccounts", True),
    "Service": ("services", True),
    "Role": ("roles", True),
    "RoleBinding": ("rolebindings", True),
    "Deployment": ("deployments", True),
    "NetworkPolicy": ("networkpolicies", True),
    "Event": ("events", True),
    api.SLOCLASS_KIND: (api.SLOCLASS_PLURAL, False),
    api.SERVINGPOOL_KIND: (api.SERVINGPOOL_PLURAL, True),
}


# metav1.StatusReason of each HTTP status the API server uses (k8s.io/apimachinery/pkg/apis/meta/v1/
# types.go), for answers whose body carries none; 0 is ours: the server could not be reached.
_REASONS = {
    0: "ServerUnreachable",
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class ApiError(Exception):
    """An API request that failed: HTTP status, the Status reason (Forbidden, Invalid, ...) and message."""

    def __init__(self, status: int, message: str, reason: str | None = None) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.reason = reason or _REASONS.get(status, "InternalError" if status >= 500 else "BadRequest")

    @property
    def transient(self) -> bool:
        """Worth retrying soon as it is (a race, overload, an outage), unlike 403, 422, ..."""
        return self.status in (0, 409, 429) or self.status >= 500


def path(api_version: str, kind: str, namespace: str | None = None, name: str | None = None) -> str:
    plural, namespaced = PLURALS[kind]
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    if namespaced and namespace:
        base += f"/namespaces/{namespace}"
    base += f"/{plural}"
    return f"{base}/{name}" if name else base


class Kube:
    """Synchronous REST calls (kopf runs sync handlers in worker threads)."""

    def __init__(self, api_client: Any | None = None) -> None:
        if api_client is None:
            import kubernetes  # imported late: the CLI must stay light

            api_client = kubernetes.client.ApiClient()
        self._client = api_client

    @property
    def api_client(self) -> Any:
        return self._client

    def _call(
        self,
        method: str,
        url: str,
        body: Any = None,
        content_type: str = "application/json",
        query: list[tuple[str, str]] | None = None,
    ) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError as TransportError

        headers = {"Content-Type": content_type, "Accept": "application/json"}
        try:
            if hasattr(self._client, "param_serialize"):  # kubernetes >= 35 (the new generator)
                request = self._client.param_serialize(
                    method, url, query_params=query or [], header_params=headers, body=body,
                    auth_settings=["BearerToken"],
                )  # fmt: skip
                resp = self._client.call_api(*request, _request_timeout=30)
                status, data = resp.status, resp.read()
            else:
                resp = self._client.call_api(
                    url, method, query_params=query or [], body=body, header_params=headers,
                    auth_settings=["BearerToken"], _preload_content=False, _request_timeout=30,
                )  # fmt: skip
                status, data = resp[0].status, resp[0].data
        except ApiException as exc:
            status, data = int(exc.status or 0), exc.body
            if not data:
                raise ApiError(status, exc.reason or "") from None
        except (TransportError, OSError) as exc:  # no answer at all: refused, reset, timed out
            raise ApiError(0, f"{method} {url}: {exc}") from None
        if status >= 400:
            message, reason = "", None
            with contextlib.suppress(TypeError, ValueError, AttributeError):
                body = json.loads(data)
                message, reason = body.get("message", ""), body.get("reason") or None
            raise ApiError(status, message or str(data)[:500], reason)
        return json.loads(data) if data else None

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> Manifest | None:
        try:
            return self._call("GET", path(api_version, kind, namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def list(self, api_version: str, kind: str, namespace: str | None = None) -> list[Manifest]:
        return (self._call("GET", path(api_version, kind, namespace)) or {}).get("items") or []

    def create(self, manifest: Manifest) -> Manifest:
        md = manifest["metadata"]
        url = path(manifest["apiVersion"], manifest["kind"], md.get("namespace"))
        return self._call("POST", url, manifest)

    def replace(self, manifest: Manifest) -> Manifest:
        md = manifest["metadata"]
        return self._call(
            "PUT", path(manifest["apiVersion"], manifest["kind"], md.get("namespace"), md["name"]), manifest
        )

    def patch(self, api_version: str, kind: str, namespace: str | None, name: str, body: Any) -> Manifest:
        """A JSON merge patch of the main resource."""
        url = path(api_version, kind, namespace, name)
        return self._call("PATCH", url, body, content_type="application/merge-patch+json")

    def delete(self, api_version: str, kind: str, namespace: str | None, name: str) -> None:
        try:
            self._call("DELETE", path(api_version, kind, namespace, name))
        except ApiError as exc:
            if exc.status != 404:
                raise

    def patch_status(
        self, api_version: str, kind: str, namespace: str | None, name: str, status: Any
    ) -> None:
        url = path(api_version, kind, namespace, name) + "/status"
        self._call("PATCH", url, {"status": status}, content_type="application/merge-patch+json")


def manifest_hash(manifest: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:16]


def owned_by(obj: Mapping[str, Any], owner_uid: str) -> bool:
    return any(
        ref.get("uid") == owner_uid for ref in (obj.get("metadata") or {}).get("ownerReferences") or []
    )


class ChildConflictError(Exception):
    """A child's name is taken by an object this pool does not own; the operator never overwrites it."""


# Subtrees compared whole: nothing defaults inside them, and an addition there is the drift that
# matters (a verb or resource added to the router's Role, a subject added to its binding, a key added to
# the classes ConfigMap, a privilege added to a securityContext).
EXACT_KEYS = frozenset({"rules", "subjects", "roleRef", "data", "securityContext"})
# Keys whose values are quantities: the API server may rewrite them canonically ("1000m" -> "1").
QUANTITY_PARENTS = frozenset({"requests", "limits"})


def drift(desired: Any, live: Any, where: str = "") -> list[str]:
    """Paths of the fields we own that the live object does not have as we wrote them.

    We own every field of the desired manifest: each must be present with our value. Fields only the
    live object has are left alone (server defaults, status, other controllers' annotations), except
    inside EXACT_KEYS; lists must have our length and each item what we wrote (items are matched by
    position: our lists are written whole). Empty values we write may be absent on the server.
    """
    if isinstance(desired, dict):
        if not isinstance(live, dict):
            return [where or "."]
        found = []
        for key, value in desired.items():
            sub = f"{where}.{key}" if where else key
            if key not in live:
                if value not in ({}, [], "", None):
                    found.append(sub)
            elif key in EXACT_KEYS:
                if not _same(value, live[key]):
                    found.append(sub)
            else:
                found += drift(value, live[key], sub)
        return found
    if isinstance(desired, list):
        if not isinstance(live, list) or len(live) != len(desired):
            return [where]
        found = []
        for i, (want, have) in enumerate(zip(desired, live, strict=True)):
            found += drift(want, have, f"{where}[{i}]")
        return found
    if desired == live:
        return []
    parent = where.rsplit(".", 2)[-2] if where.count(".") >= 1 else ""
    if parent in QUANTITY_PARENTS and same_quantity(desired, live):
        return []
    return [where]


def _same(desired: Any, live: Any) -> bool:
    return desired == live or (desired in ({}, []) and live in ({}, [], None))


def owned_drift(desired: Manifest, live: Manifest) -> list[str]:
    """drift() over what the operator owns: the body and our labels and owner references."""
    body = {k: v for k, v in desired.items() if k not in ("apiVersion", "kind", "metadata", "status")}
    md = desired.get("metadata") or {}
    owned_md = {k: md[k] for k in ("labels", "ownerReferences") if k in md}
    live_md = live.get("metadata") or {}
    found = drift(
        owned_md, {k: live_md[k] for k in ("labels", "ownerReferences") if k in live_md}, "metadata"
    )
    return found + drift(body, {k: v for k, v in live.items() if k not in ("metadata", "status")})


@dataclass
class Applied:
    """What apply_child did: created | updated (our manifest changed) | repaired (the live object
    drifted from it) | unchanged; the live object; the drifted paths (repaired only); the paths the
    API server itself rewrote in the object we just wrote (a mutating admission webhook, say)."""

    outcome: str
    live: Manifest
    drifted: list[str] = field(default_factory=list)
    server_rewrites: frozenset[str] = frozenset()


SERVICE_ALLOCATED = ("clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy")


def apply_child(
    kube: Kube,
    desired: Manifest,
    owner_uid: str,
    likely_new: bool = False,
    attempts: int = 3,
    server_rewrites: frozenset[str] = frozenset(),
) -> Applied:
    """Create or replace one child so that the live object carries every field we own.

    Writes nothing when the live object has our manifest's hash and no owned field drifted: re-running
    (an operator restart, a periodic resync) is free. Otherwise the object is replaced (PUT with the
    live resourceVersion; a concurrent writer's 409 means: read again and retry, `attempts` times).
    `likely_new` (a pool never reconciled before) tries the create first and saves a read per child.
    `server_rewrites`: paths the server was seen to rewrite in this very manifest (returned by an
    earlier call); they are not drift, so a mutating webhook cannot make us rewrite the object forever.
    """
    md = desired["metadata"]
    digest = manifest_hash(desired)
    body = json.loads(json.dumps(desired))  # a copy we may annotate
    body["metadata"].setdefault("annotations", {})[api.SPEC_HASH_ANNOTATION] = digest
    if likely_new:
        try:
            created = kube.create(body)
            return Applied("created", created, server_rewrites=frozenset(owned_drift(desired, created)))
        except ApiError as exc:
            if exc.status != 409:
                raise
    for attempt in range(attempts):
        live = kube.get(desired["apiVersion"], desired["kind"], md.get("namespace"), md["name"])
        if live is None:
            created = kube.create(body)
            return Applied("created", created, server_rewrites=frozenset(owned_drift(desired, created)))
        if not owned_by(live, owner_uid):
            raise ChildConflictError(
                f"{desired['kind']} {md['name']} already exists and is not owned by this ServingPool"
            )
        live_md = live.get("metadata") or {}
        same_hash = (live_md.get("annotations") or {}).get(api.SPEC_HASH_ANNOTATION) == digest
        drifted = [p for p in owned_drift(desired, live) if p not in server_rewrites]
        if same_hash and not drifted:
            return Applied("unchanged", live, server_rewrites=server_rewrites)
        replacement = json.loads(json.dumps(body))
        new_md = replacement["metadata"]
        new_md["resourceVersion"] = live_md.get("resourceVersion")
        # Labels and annotations others added stay (ours win): we own only our keys.
        new_md["labels"] = {**(live_md.get("labels") or {}), **(new_md.get("labels") or {})}
        new_md["annotations"] = {**(live_md.get("annotations") or {}), **new_md["annotations"]}
        if desired["kind"] == "Service":
            # Allocated by the server and immutable: carry them over into the replacement.
            for key in SERVICE_ALLOCATED:
                if key in (live.get("spec") or {}):
                    replacement["spec"][key] = live["spec"][key]
        try:
            written = kube.replace(replacement)
        except ApiError as exc:
            if exc.status == 409 and attempt + 1 < attempts:
                continue  # written meanwhile by someone else: compare against the new object
            raise
        rewrites = frozenset(owned_drift(desired, written))
        if same_hash:
            return Applied("repaired", written, [p for p in drifted if p not in rewrites], rewrites)
        return Applied("updated", written, [], rewrites)
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


def apply(kube: Kube, desired: Manifest, owner_uid: str, likely_new: bool = False) -> tuple[str, Manifest]:
    """apply_child as (outcome, live object)."""
    result = apply_child(kube, desired, owner_uid, likely_new)
    return result.outcome, result.live
