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
from typing import Any

from jitserve.operator import api

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
    api.SLOCLASS_KIND: (api.SLOCLASS_PLURAL, False),
    api.SERVINGPOOL_KIND: (api.SERVINGPOOL_PLURAL, True),
}


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


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
        if status >= 400:
            message = ""
            with contextlib.suppress(TypeError, ValueError, AttributeError):
                message = json.loads(data).get("message", "")
            raise ApiError(status, message or str(data)[:500])
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


def apply(kube: Kube, desired: Manifest, owner_uid: str, likely_new: bool = False) -> tuple[str, Manifest]:
    """Create or replace one child; ('unchanged' | 'created' | 'updated', live object).

    The manifest's hash is stored on the child: when it matches, nothing is written at all, so
    re-running (an operator restart, a periodic resync) is free and changes nothing.
    `likely_new` (a pool never reconciled before) tries the create first and saves a read per child.
    """
    md = desired["metadata"]
    digest = manifest_hash(desired)
    body = json.loads(json.dumps(desired))  # a copy we may annotate
    body["metadata"].setdefault("annotations", {})[api.SPEC_HASH_ANNOTATION] = digest
    if likely_new:
        try:
            return "created", kube.create(body)
        except ApiError as exc:
            if exc.status != 409:
                raise
    live = kube.get(desired["apiVersion"], desired["kind"], md.get("namespace"), md["name"])
    if live is None:
        return "created", kube.create(body)
    if not owned_by(live, owner_uid):
        raise ChildConflictError(
            f"{desired['kind']} {md['name']} already exists and is not owned by this ServingPool"
        )
    live_md = live.get("metadata") or {}
    if (live_md.get("annotations") or {}).get(api.SPEC_HASH_ANNOTATION) == digest:
        return "unchanged", live
    body["metadata"]["resourceVersion"] = live_md.get("resourceVersion")
    if desired["kind"] == "Service":
        # clusterIP is allocated by the server and immutable: carry it over into the replacement.
        for key in ("clusterIP", "clusterIPs"):
            if key in (live.get("spec") or {}):
                body["spec"][key] = live["spec"][key]
    return "updated", kube.replace(body)
