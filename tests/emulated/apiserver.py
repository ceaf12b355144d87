"""The emulated Kubernetes API server: kmock's KubernetesEmulator (pinned, kmock==0.8) extended with
what kubectl and kopf need and what an operator's correctness depends on.

Added on top of kmock (see design.md, "What is real in tests here", and docs/decisions/
emulated-apiserver.md for what follows the real server's source and where):
- CRDs become served resources when created (names, short names, scope, subresources), and their
  objects are admitted against the CRD schema (admission.py: pruning, defaulting, OpenAPI, CEL; the
  CEL rules run unless a blocking schema error was found, as in the real server);
- metadata.uid / creationTimestamp / resourceVersion / generation stamped as the real server does:
  one resourceVersion counter (etcd's revision), a new version for every write that changes an
  object (the status subresource's too), none for a write that changes nothing;
  generation moves only when something besides metadata and status changes;
- optimistic concurrency: a write carrying a stale resourceVersion gets 409 Conflict;
- PUT (replace), the status subresource (main writes ignore .status, /status writes touch only it),
  and the scale subresource of custom resources (GET/PUT/PATCH .../scale);
- the garbage collector: objects whose owner (ownerReferences uid) is gone are deleted, cascading;
- watch that subscribes before replaying, resumes from ?resourceVersion=R, answers in JSON, and
  serves watch-lists (sendInitialEvents=true: the objects, then the "k8s.io/initial-events-end"
  bookmark), as kubectl 1.35 and client-go 1.35 informers ask; ListOptions validated (422);
- discovery computed from the registered kinds only and cached until a CRD registers (kmock's
  scanned every stored object per request); a resource nobody registered is 404;
- list kinds/apiVersion, label and field selectors; the 'default' namespace; kmock path fixes.
Not emulated: protobuf bodies (415: use `kubectl apply -f`), server-side apply, the OpenAPI
endpoint (`kubectl --validate=false`), aggregated discovery (clients fall back to the documents
above), Table output, watch timeouts and periodic bookmarks, and every built-in controller (no
Pods: tests use an emulated Deployment controller, controllers.py).
"""

from __future__ import annotations

import asyncio
import collections
import copy
import datetime
import json
import time
import uuid
from typing import Any

import aiohttp.web
import jsonpatch
import kmock
from kmock._internal import aiobus, enums, parsing

from .admission import admit
from .selectors import matcher

VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]

# kmock 0.8 parses /api/v1/namespaces[/NAME] as a namespace prefix; route them as the resource.
_kmock_parse_path = parsing.parse_path


def _parse_path(path: str) -> parsing.ParsedPath:
    parts = path.strip("/").split("/")
    if parts[:3] == ["api", "v1", "namespaces"] and (
        len(parts) <= 4 or (len(parts) == 5 and parts[4] in ("status", "finalize"))
    ):
        name = parts[3] if len(parts) >= 4 else None
        sub = parts[4] if len(parts) == 5 else None
        return parsing.ParsedPath("", "v1", "namespaces", None, name, sub)
    return _kmock_parse_path(path)


parsing.parse_path = _parse_path


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _merge_diff(old: Any, new: Any) -> Any:
    """The JSON merge patch that turns `old` into `new` (how a computed object is handed to kmock)."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    patch: dict[str, Any] = {k: None for k in old if k not in new}
    for key, value in new.items():
        if key not in old or old[key] != value:
            patch[key] = _merge_diff(old.get(key), value) if isinstance(value, dict) else value
    return patch


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (strategic merge patches of built-ins are treated the same way)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge_patch(out.get(key), value)
    return out


def _not_found(resource: Any, name: str | None) -> kmock.KubernetesError:
    group = f".{resource.group}" if resource.group else ""
    return _status_error(404, "NotFound", f'{resource.plural}{group} "{name}" not found')


def _body_of(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def _status_error(
    status: int, reason: str, message: str, details: dict[str, Any] | None = None
) -> kmock.KubernetesError:
    return kmock.KubernetesError(status=status, reason=reason, message=message, details=details or {})


def _validate_list_options(params: Any, watch: bool, watch_list: bool = True) -> None:
    """ListOptions as the real server checks them before a list or a watch (k8s.io/apimachinery,
    pkg/apis/meta/internalversion/validation/validation.go, ValidateListOptions; WatchList is on, as
    in Kubernetes 1.34+). A client that gets this 422 for a watch-list falls back to list + watch."""
    match = params.get("resourceVersionMatch") or ""
    initial = params.get("sendInitialEvents")
    causes: list[tuple[str, str, str]] = []  # (field, message, reason)
    forbidden, not_supported = "FieldValueForbidden", "FieldValueNotSupported"
    if watch:
        if initial is not None and match != "NotOlderThan":
            message = "Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"
            causes.append(("resourceVersionMatch", message, forbidden))
        if initial is not None and not watch_list:
            message = "Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate "
            message += "is enabled"
            causes.append(("sendInitialEvents", message, forbidden))
        if match:
            if initial is None:
                message = "Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents "
                message += "is provided"
                causes.append(("resourceVersionMatch", message, forbidden))
            if match != "NotOlderThan":
                message = f'Unsupported value: "{match}": supported values: "NotOlderThan"'
                causes.append(("resourceVersionMatch", message, not_supported))
            if params.get("continue"):
                message = "Forbidden: resourceVersionMatch is forbidden when continue is provided"
                causes.append(("resourceVersionMatch", message, forbidden))
    else:
        if match:
            if not params.get("resourceVersion"):
                message = "Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided"
                causes.append(("resourceVersionMatch", message, forbidden))
            if params.get("continue"):
                message = "Forbidden: resourceVersionMatch is forbidden when continue is provided"
                causes.append(("resourceVersionMatch", message, forbidden))
            if match not in ("Exact", "NotOlderThan"):
                message = f'Unsupported value: "{match}": supported values: "Exact", "NotOlderThan", ""'
                causes.append(("resourceVersionMatch", message, not_supported))
            if match == "Exact" and params.get("resourceVersion") == "0":
                message = 'Forbidden: resourceVersionMatch "exact" is forbidden for resourceVersion "0"'
                causes.append(("resourceVersionMatch", message, forbidden))
        if initial is not None:
            message = "Forbidden: sendInitialEvents is forbidden for list"
            causes.append(("sendInitialEvents", message, forbidden))
    if causes:
        texts = [f"{field}: {message}" for field, message, _ in causes]
        joined = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
        details = {
            "group": "meta.k8s.io",
            "kind": "ListOptions",
            "causes": [{"reason": r, "field": f, "message": m} for f, m, r in causes],
        }
        raise _status_error(422, "Invalid", f'ListOptions.meta.k8s.io "" is invalid: {joined}', details)


class _RecordingBus(aiobus.Bus):
    """kmock's per-resource event bus; every event is also kept in the server's history (for resume)."""

    owner: EmulatedApiServer | None = None

    async def put(self, item: Any) -> None:
        assert self.owner is not None
        self.owner._record(self, item)
        await super().put(item)


class EmulatedApiServer(kmock.KubernetesEmulator):
    """An in-memory Kubernetes API server for tests (see the module docstring for what it emulates)."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._rv_now = 0  # the newest resourceVersion handed out (a list's, a bookmark's)
        self._history: list[tuple[int, Any, dict[str, Any]]] = []
        self._seq_by_id: dict[int, int] = {}
        self._last_seq = 0  # the resourceVersion of the newest recorded event
        # The WatchList feature gate (on by default since Kubernetes 1.34); off, a watch-list is
        # refused with 422 and client-go falls back to list + watch.
        self.watch_list = True
        self._watchers: collections.Counter[str] = collections.Counter()  # plural -> open watches
        self._buses = collections.defaultdict(self._new_bus)
        self._write_lock = asyncio.Lock()
        self._crds: dict[Any, dict[str, Any]] = {}  # resource -> served CRD version (schema, subresources)
        self._info_cache: dict[tuple[Any, Any, Any], Any] = {}  # (group, version, plural) -> ResourceInfo
        self._resources_cache: list[Any] | None = None  # the served resources (see _get_resources)
        self._discovery: dict[str, bytes] = {}  # discovery path -> its JSON document (_serve_discovery)
        self._alive: dict[str, Any] = {}  # uid -> key of every live object (for the garbage collector)
        self._dependents: collections.defaultdict[str, set[Any]] = collections.defaultdict(
            set
        )  # owner uid -> keys
        # (plural, namespace, name) -> time.monotonic() of its creation, for benchmarks.
        self.created_at: dict[tuple[str, str | None, str], float] = {}
        # kmock streams watches as octet-stream, which kubectl rejects; serve our own watch, in JSON.
        (self.fallback**1)[enums.action.WATCH] << {"Content-Type": "application/json"} << self._serve_watch
        self.resources.load_bundled()  # K3s's built-in resources, bundled with kmock
        self.objects["v1/namespaces", None, "default"] = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": "default", "uid": str(uuid.uuid4()), "resourceVersion": self._bump()},
        }
        self._last_seq = self._rv_now

    # ---- events and history ------------------------------------------------------------------------

    def _new_bus(self) -> _RecordingBus:
        bus = _RecordingBus()
        bus.owner = self
        return bus

    def _bump(self) -> str:
        """The next resourceVersion (etcd's revision: one counter for every object of every kind)."""
        self._rv_now += 1
        return str(self._rv_now)

    def _record(self, bus: Any, event: dict[str, Any]) -> None:
        rv = str((event.get("object", {}).get("metadata") or {}).get("resourceVersion") or "")
        if event.get("type") == "DELETED" or not rv.isdigit():
            # The real server bumps the resourceVersion on deletion too.
            rv = self._bump()
            obj = dict(event["object"])
            obj["metadata"] = dict(obj.get("metadata") or {}, resourceVersion=rv)
            event["object"] = obj
        seq = int(rv)  # an event is the write that made its object's resourceVersion: one number
        self._history.append((seq, bus, event))
        self._seq_by_id[id(event)] = seq
        self._last_seq = max(self._last_seq, seq)

    def _initial_events_end(self, resource: Any, rv: int) -> dict[str, Any]:
        """The bookmark that ends a watch-list's initial events: an empty object of the kind with
        only its resourceVersion and the annotation (k8s.io/apiserver, pkg/storage/util.go,
        AnnotateInitialEventsEndBookmark)."""
        info = self._info(resource)
        return {
            "type": "BOOKMARK",
            "object": {
                "kind": info.kind if info is not None and info.kind else "",
                "apiVersion": f"{resource.group}/{resource.version}" if resource.group else resource.version,
                "metadata": {
                    "resourceVersion": str(rv),
                    "annotations": {"k8s.io/initial-events-end": "true"},
                },
            },
        }

    # ---- lookups --------------------------------------------------------------------------------------

    def _info(self, resource: Any) -> Any:
        key = (resource.group, resource.version, resource.plural)
        if key not in self._info_cache:
            self._info_cache[key] = next((self.resources[r] for r in self.resources if r == resource), None)
        return self._info_cache[key]

    def _live(self, resource: Any, namespace: str | None, name: str) -> dict[str, Any] | None:
        key = (resource, namespace, name)
        if key in self.objects and not self.objects[key].deleted:
            return copy.deepcopy(self.objects[key].raw)
        return None

    def watching(self, plural: str) -> int:
        """How many watches of this resource are open (for tests that must act after a watch began)."""
        return self._watchers[plural]

    def live_objects(self) -> list[tuple[Any, str | None, str, dict[str, Any]]]:
        return [(r, ns, n, obj.raw) for (r, ns, n), obj in self.objects.items() if not obj.deleted]

    # ---- CRDs ----------------------------------------------------------------------------------------

    def _register_crd(self, crd: dict[str, Any]) -> None:
        spec = crd.get("spec", {})
        names = spec.get("names", {})
        for ver in spec.get("versions", []):
            if not ver.get("served", True):
                continue
            key = f"{spec['group']}/{ver['name']}/{names['plural']}"
            self.resources[key] = kmock.ResourceInfo(
                kind=names.get("kind"),
                singular=names.get("singular") or names.get("kind", "").lower(),
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                verbs=set(VERBS),
                shortnames=names.get("shortNames", []),
                categories=names.get("categories", []),
                subresources=set((ver.get("subresources") or {}).keys()),
            )
            self._info_cache.clear()
            self._resources_cache = None
            self._discovery.clear()
            for res in self.resources:
                if f"{res.group}/{res.version}/{res.plural}" == key:
                    self._crds[res] = {"kind": names.get("kind"), "group": spec["group"], **ver}

    # ---- admission of one write ------------------------------------------------------------------

    def _admit(
        self, resource: Any, obj: dict[str, Any], strict: bool, old: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        crd = self._crds.get(resource)
        if crd is None:
            return obj
        schema = ((crd.get("schema") or {}).get("openAPIV3Schema")) or {}
        outcome = admit(obj, schema, old)
        name = (obj.get("metadata") or {}).get("name", "")
        kind = f"{crd['kind']}.{crd['group']}"
        if strict and outcome.unknown:
            fields = ", ".join(f'unknown field "{u}"' for u in outcome.unknown)
            raise _status_error(
                400, "BadRequest", f"{kind} {name!r} is invalid: strict decoding error: {fields}"
            )
        if outcome.errors:
            texts = [f"{where}: {message}" for where, message in outcome.errors]
            joined = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
            causes = [
                {"reason": r, "field": w, "message": m}
                for (w, m), r in zip(outcome.errors, outcome.reasons, strict=True)
            ]
            details = {"name": name, "group": crd["group"], "kind": crd["kind"], "causes": causes}
            raise _status_error(422, "Invalid", f'{kind} "{name}" is invalid: {joined}', details)
        return outcome.obj

    def _has_status(self, resource: Any) -> bool:
        info = self._info(resource)
        return info is not None and "status" in (info.subresources or set())

    def _prepare_create(self, request: Any) -> None:
        obj = copy.deepcopy(request.data)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        info = self._info(request.resource)
        if request.namespace and (info is None or info.namespaced):
            meta["namespace"] = request.namespace
        if self._live(
            request.resource, meta.get("namespace") if request.namespace else None, meta.get("name", "")
        ):
            raise _status_error(
                409, "AlreadyExists", f'{request.resource.plural} "{meta.get("name")}" already exists'
            )
        if self._has_status(request.resource):
            obj.pop("status", None)
        obj = self._admit(request.resource, obj, request.params.get("fieldValidation") == "Strict")
        meta = obj["metadata"]
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now()
        meta["resourceVersion"] = self._bump()
        meta["generation"] = 1
        if request.resource.plural == "customresourcedefinitions":
            self._register_crd(obj)
        request.data.clear()
        request.data.update(obj)

    def _prepare_update(self, request: Any, method: str) -> bool:
        """Compute the whole new object for PUT/PATCH (main or /status), then hand kmock the diff.

        Returns False for a write that changes nothing: etcd3's GuaranteedUpdate (k8s.io/apiserver,
        pkg/storage/etcd3/store.go) skips a write whose encoding equals the stored one, so such a
        write keeps the resourceVersion and sends no watch event."""
        old = self._live(request.resource, request.namespace, request.name)
        if old is None:
            raise _not_found(request.resource, request.name)
        data = request.data
        ctype = request.headers.get("Content-Type", "")
        if method == "PUT":
            new = copy.deepcopy(data)
        elif isinstance(data, list) or "json-patch" in ctype:
            try:
                new = jsonpatch.apply_patch(old, data)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                raise _status_error(422, "Invalid", f"the JSON patch failed: {exc}") from None
        else:
            new = _merge_patch(old, data)
        new = copy.deepcopy(new)  # no aliasing with `old`: the diff below must see every change
        want_rv = (
            (new.get("metadata") or {}).get("resourceVersion")
            if method == "PUT"
            else ((data.get("metadata") or {}).get("resourceVersion") if isinstance(data, dict) else None)
        )
        if want_rv and want_rv != old["metadata"].get("resourceVersion"):
            raise _status_error(
                409, "Conflict",
                f'Operation cannot be fulfilled on {request.resource.plural} "{request.name}": the object '
                "has been modified; please apply your changes to the latest version and try again",
            )  # fmt: skip
        meta = new.setdefault("metadata", {})
        # Server-owned metadata survives any write.
        for key in ("uid", "creationTimestamp", "generation", "namespace", "name", "deletionTimestamp"):
            if key in old["metadata"]:
                meta[key] = old["metadata"][key]
        if request.subresource == "status":
            # The status strategy (apiextensions-apiserver, registry/customresource/status_strategy.go,
            # PrepareForUpdate) copies the old object and takes only .status from the request. A copy:
            # sharing `old`'s metadata would hide the new resourceVersion from the diff below.
            new = copy.deepcopy(dict(old, status=new.get("status")))
            if new["status"] is None:
                new.pop("status")
        elif self._has_status(request.resource):
            if "status" in old:
                new["status"] = old["status"]
            else:
                new.pop("status", None)
        if request.subresource != "status" or self._crds.get(request.resource):
            new = self._admit(request.resource, new, request.params.get("fieldValidation") == "Strict", old)
        meta = new["metadata"]
        if _body_of(new) != _body_of(old):
            meta["generation"] = int(old["metadata"].get("generation") or 1) + 1
        meta["resourceVersion"] = old["metadata"].get("resourceVersion")
        if new == old:
            return False
        meta["resourceVersion"] = self._bump()
        diff = _merge_diff(old, new)
        object.__setattr__(request, "data", diff)
        object.__setattr__(request, "method", enums.method.PATCH)
        object.__setattr__(request, "action", enums.action.UPDATE)
        return True

    # ---- the scale subresource of custom resources ----------------------------------------------

    async def _serve_scale(self, request: Any) -> aiohttp.web.StreamResponse:
        crd = self._crds.get(request.resource) or {}
        scale = (crd.get("subresources") or {}).get("scale")
        obj = self._live(request.resource, request.namespace, request.name)
        if scale is None or obj is None:
            raise _not_found(request.resource, request.name)
        spec_path = scale["specReplicasPath"].lstrip(".").split(".")
        if request.method in (enums.method.PUT, enums.method.PATCH):
            data = request.data if isinstance(request.data, dict) else {}
            replicas = (data.get("spec") or {}).get("replicas")
            if not isinstance(replicas, int) or replicas < 0:
                raise _status_error(422, "Invalid", f"spec.replicas: Invalid value: {replicas!r}")
            patch: dict[str, Any] = {}
            node = patch
            for part in spec_path[:-1]:
                node = node.setdefault(part, {})
            node[spec_path[-1]] = replicas
            object.__setattr__(request, "data", patch)
            object.__setattr__(request, "subresource", None)
            if self._prepare_update(request, "PATCH"):
                await self._store(request, "update")
            obj = self._live(request.resource, request.namespace, request.name) or obj
        value: Any = obj
        for part in spec_path:
            value = (value or {}).get(part)
        status: Any = obj
        for part in scale.get("statusReplicasPath", ".status.replicas").lstrip(".").split("."):
            status = (status or {}).get(part)
        selector: Any = obj
        for part in (scale.get("labelSelectorPath") or ".status.selector").lstrip(".").split("."):
            selector = (selector or {}).get(part)
        return aiohttp.web.json_response(
            {
                "apiVersion": "autoscaling/v1",
                "kind": "Scale",
                "metadata": {
                    k: obj["metadata"].get(k) for k in ("name", "namespace", "uid", "resourceVersion")
                },
                "spec": {"replicas": value or 0},
                "status": {"replicas": status or 0, "selector": selector or ""},
            }
        )

    # ---- garbage collection -----------------------------------------------------------------------

    def _index_created(self, key: Any, raw: dict[str, Any]) -> None:
        meta = raw.get("metadata") or {}
        self._alive[meta.get("uid")] = key
        for ref in meta.get("ownerReferences") or []:
            self._dependents[ref.get("uid")].add(key)

    async def _collect_garbage(self, suspects: set[Any]) -> None:
        """The garbage collector: delete (cascading) each suspect whose owners are all gone."""
        while suspects:
            key = suspects.pop()
            if key not in self.objects or self.objects[key].deleted:
                continue
            obj = self.objects[key]
            meta = obj.raw.get("metadata") or {}
            refs = meta.get("ownerReferences") or []
            if not refs or any(ref.get("uid") in self._alive for ref in refs):
                continue
            async with self._lock:
                if meta.get("finalizers"):
                    if not meta.get("deletionTimestamp"):
                        obj.patch(
                            {
                                "metadata": {
                                    "deletionTimestamp": _now(),
                                    "resourceVersion": self._bump(),
                                }
                            }
                        )
                        await self._buses[key[0]].put({"type": "MODIFIED", "object": obj.raw})
                    continue
                raw = obj.raw
                obj.delete()
                self._alive.pop(meta.get("uid"), None)
                await self._buses[key[0]].put({"type": "DELETED", "object": raw})
            suspects |= self._dependents.pop(meta.get("uid"), set())

    # ---- request entry point ------------------------------------------------------------------------

    async def _handle(self, request: Any) -> aiohttp.web.StreamResponse:
        if "protobuf" in request.headers.get("Content-Type", ""):
            raise _status_error(
                415, "UnsupportedMediaType", "the emulated API server only accepts JSON bodies"
            )
        if request.url.path == "/emulated/created-at":  # not Kubernetes: creation times, for benchmarks
            rows = [[*key, t] for key, t in self.created_at.items()]
            return aiohttp.web.json_response(rows)
        res = request.resource
        method = str(request.method.value).upper()
        if method == "GET" and (res is None or res.plural is None):
            body = await self._serve_discovery(request)
            if body is not None:
                return aiohttp.web.Response(body=body, content_type="application/json")
        served = res is not None and res.plural is not None and self._info(res) is not None
        if res is not None and res.plural is not None and not served:
            raise _status_error(404, "NotFound", "the server could not find the requested resource")
        if served and method == "GET" and request.name is None:
            _validate_list_options(request.params, request.action == enums.action.WATCH, self.watch_list)
        if not served or request.action == enums.action.WATCH:
            return await super()._handle(request)  # watch streams (and whatever else kmock serves)
        # Everything else is served directly: kmock's reaction matching costs ~50 ms a request.
        if request.subresource == "scale":
            if method == "GET":
                return await self._serve_scale(request)
            async with self._write_lock:
                return await self._serve_scale(request)
        if method == "GET":
            payload = await (
                self._serve_list(request) if request.name is None else self._serve_fetch(request)
            )
            return aiohttp.web.json_response(payload)
        async with self._write_lock:  # one write at a time: read-compute-store must not interleave
            if method == "POST" and request.name is None and isinstance(request.data, dict):
                self._prepare_create(request)
                payload = await self._store(request, "create")
            elif method in ("PUT", "PATCH") and request.name is not None and request.data is not None:
                if self._prepare_update(request, method):
                    payload = await self._store(request, "update")
                else:  # nothing changed: no write, no event, the same resourceVersion
                    payload = self._live(res, request.namespace, request.name) or {}
            elif method == "DELETE" and request.name is not None:
                payload = await self._store(request, "delete")
            else:
                raise _status_error(
                    405, "MethodNotAllowed", f"{method} is not supported on {request.url.path}"
                )
            meta = payload.get("metadata") or {}
            key = (res, request.namespace or meta.get("namespace"), meta.get("name"))
            if self._live(*key) is None:
                # Gone now (deleted, or its last finalizer removed): its dependents follow.
                self._alive.pop(meta.get("uid"), None)
                await self._collect_garbage(set(self._dependents.pop(meta.get("uid"), set())))
            elif method == "POST" and meta.get("ownerReferences"):
                # Created for an owner that is already gone (a controller racing a deletion): the
                # real garbage collector deletes it, and so does this one.
                await self._collect_garbage({key})
            return aiohttp.web.json_response(payload, status=201 if method == "POST" else 200)

    async def _store(self, request: Any, verb: str) -> dict[str, Any]:
        """kmock's object store, written the way KubernetesEmulator._handle does it (plus responses)."""
        res = request.resource
        bus = self._buses[res]
        async with self._lock:
            if verb == "create":
                meta = request.data.get("metadata", {})
                key = (res, request.namespace or meta.get("namespace"), meta.get("name"))
                if key not in self.objects:
                    self.objects[key] = request.data
                else:
                    self.objects[key].create(request.data)
                raw = self.objects[key].last.raw
                self.created_at[(res.plural, key[1], key[2])] = time.monotonic()
                self._index_created(key, raw)
                await bus.put({"type": "ADDED", "object": raw})
                return raw
            key = (res, request.namespace, request.name)
            if key not in self.objects or self.objects[key].deleted:
                raise _not_found(request.resource, request.name)
            obj = self.objects[key]
            if verb == "delete":
                meta = obj.raw.get("metadata") or {}
                if meta.get("deletionTimestamp"):
                    return obj.raw
                if meta.get("finalizers"):
                    obj.patch({"metadata": {"deletionTimestamp": _now(), "resourceVersion": self._bump()}})
                    await bus.put({"type": "MODIFIED", "object": obj.raw})
                    return obj.raw
                raw = obj.raw
                obj.delete()
                await bus.put({"type": "DELETED", "object": raw})
                return raw
            obj.patch(request.data)
            raw = obj.raw
            await bus.put({"type": "MODIFIED", "object": raw})
            meta = raw.get("metadata") or {}
            if meta.get("deletionTimestamp") and not meta.get("finalizers"):
                obj.delete()  # the last finalizer went: the object is gone now
                await bus.put({"type": "DELETED", "object": raw})
            return raw

    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        if isinstance(exc, kmock.KubernetesError):  # no traceback in Status details (kmock adds one)
            return aiohttp.web.json_response(
                {
                    "apiVersion": "v1",
                    "kind": "Status",
                    "metadata": {},
                    "status": "Failure",
                    "code": exc.status,
                    "reason": exc.reason or type(exc).__name__,
                    "message": exc.message or repr(exc),
                    "details": exc.details or {},
                },
                status=exc.status,
            )
        return await super()._render_error(exc)

    # ---- discovery, list and watch --------------------------------------------------------------------

    def _get_resources(self) -> list[Any]:
        """The served resources: the registered kinds only. kmock's version adds the kind of every
        stored object (a scan of the whole store on each discovery request) and its reactions' kinds."""
        if self._resources_cache is None:
            self._resources_cache = list(self.resources)
        return self._resources_cache

    async def _serve_discovery(self, request: Any) -> bytes | None:
        """/, /version, /api, /apis, /api/v1, /apis/G and /apis/G/V from a cache that only CRD
        registration invalidates: discovery never reads objects, so its cost does not grow with them.
        kubectl asks for aggregated discovery first and falls back to these documents."""
        path = "/" + request.url.path.strip("/")
        if path in self._discovery:
            return self._discovery[path]
        parts = path.strip("/").split("/")
        if path == "/":
            payload = await self._serve_root(request)
        elif path == "/version":
            payload = await self._serve_server_version(request)
        elif path == "/api":
            payload = await self._serve_api(request)
        elif path == "/apis":
            payload = await self._serve_apis(request)
        elif parts == ["api", "v1"] or (parts[0] == "apis" and len(parts) == 3):
            payload = await self._serve_version(request)
        elif parts[0] == "apis" and len(parts) == 2:
            payload = await self._serve_group(request)
        else:
            return None
        self._discovery[path] = json.dumps(payload).encode()
        return self._discovery[path]

    async def _serve_version(self, request: Any) -> Any:
        # kmock renders the core group as "/v1" and repeats short names on subresources (kubectl warns).
        payload = await super()._serve_version(request)
        payload["groupVersion"] = payload["groupVersion"].lstrip("/")
        for res in payload["resources"]:
            if "/" in res["name"]:
                res["shortNames"], res["categories"], res["verbs"] = [], [], ["get", "patch", "update"]
        return payload

    async def _serve_list(self, request: Any) -> Any:
        match = matcher(request.params)
        res = request.resource
        items = [
            obj.raw
            for (r, ns, _), obj in self.objects.items()
            if r == res and (request.namespace is None or ns == request.namespace) and not obj.deleted
        ]
        info = self._info(res)
        return {
            "kind": f"{info.kind}List" if info is not None and info.kind else "List",
            "apiVersion": f"{res.group}/{res.version}" if res.group else res.version,
            "metadata": {"resourceVersion": str(self._last_seq)},  # what these items reflect
            "items": [item for item in items if match(item)],
        }

    async def _serve_watch(self, request: Any) -> Any:
        """A watch, as the real server's watch cache serves it (k8s.io/apiserver, pkg/storage/cacher):

        - ?resourceVersion=R (R > 0): the recorded events after R, then live events;
        - ?sendInitialEvents=true (a watch-list, KEP-3157; kubectl 1.35 `wait` and every client-go
          1.35 informer ask for it): an ADDED event per object, then, with allowWatchBookmarks=true,
          a BOOKMARK at the current resourceVersion annotated "k8s.io/initial-events-end": "true"
          (cacher.go setInitialEventsEndBookmarkIfRequested, cache_watcher.go convertToWatchEvent),
          then live events; the client-go reflector waits for that bookmark before it is synced;
        - ?sendInitialEvents=false with no resourceVersion (or "0"): live events only;
        - neither (the legacy watch): an ADDED event per object, then live events.
        Subscribes before it replays (kmock 0.8 replays first and loses events in between)."""
        yield b""
        params = request.params
        match = matcher(params)
        check = self._KubernetesEmulator__check
        bus = self._buses[request.resource]
        marker = await bus.mark()
        self._watchers[request.resource.plural] += 1
        try:
            rv = params.get("resourceVersion") or ""
            initial = params.get("sendInitialEvents")
            bookmark: dict[str, Any] | None = None
            async with self._lock:
                last = self._last_seq  # every event up to here is in the objects below
                current = [
                    {"type": "ADDED", "object": obj.raw}
                    for (res, _, _), obj in self.objects.items()
                    if res == request.resource and not obj.deleted
                ]
                if initial == "true":
                    replay = current
                    if params.get("allowWatchBookmarks") == "true":
                        bookmark = self._initial_events_end(request.resource, last)
                elif rv.isdigit() and int(rv) > 0:
                    replay = [ev for seq, b, ev in self._history if b is bus and seq > int(rv)]
                    last = max(last, int(rv))
                elif initial == "false":
                    replay = []
                else:
                    replay = current
            for ev in replay:
                md = ev.get("object", {}).get("metadata", {})
                visible = check(request, request.resource, md.get("namespace"), md.get("name"), strict=False)
                if visible and match(ev["object"]):
                    yield ev
            if bookmark is not None:
                yield bookmark
            async for ev in bus.stream(since=marker):
                if self._seq_by_id.get(id(ev), 1 << 62) <= last:
                    continue  # already replayed
                md = ev.get("object", {}).get("metadata", {})
                visible = check(request, request.resource, md.get("namespace"), md.get("name"), strict=False)
                if visible and match(ev["object"]):
                    yield ev
        finally:
            self._watchers[request.resource.plural] -= 1
            await bus.unmark(marker)
