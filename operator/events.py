"""Kubernetes Events about pools: what changed and what went wrong, where `kubectl describe sp` and
`kubectl get events` show it.

core/v1 Events (what `kubectl describe` reads), written through the same adapter as everything else
(kopf's own poster works only inside its handlers, not in our resync thread). One name per
(object, type, reason, message): a repeat of the same event raises its `count` and `lastTimestamp`
instead of creating another object, the way client-go's event correlator aggregates. Recording is
best effort: a failure to write an Event is logged and never fails a reconcile.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from jitserve.operator.kube import ApiError, Kube

log = logging.getLogger("jitserve.operator")

NORMAL, WARNING = "Normal", "Warning"
COMPONENT = "jitserve-operator"
MAX_MESSAGE = 1024  # the API server refuses longer Event messages


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str  # CamelCase, short: what happened (Created, Forbidden, DriftRepaired, ...)
    message: str


def event_name(obj: Mapping[str, Any], event: Event) -> str:
    md = obj.get("metadata") or {}
    key = "\0".join([md.get("uid", ""), event.type, event.reason, event.message])
    return f"{md.get('name', 'object')}.{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def event_manifest(obj: Mapping[str, Any], event: Event, now: str, instance: str) -> dict[str, Any]:
    """A core/v1 Event about `obj` (a pool or a class; cluster-scoped objects' Events go to default)."""
    md = obj.get("metadata") or {}
    namespace = md.get("namespace") or "default"
    involved = {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "name": md.get("name"),
        "uid": md.get("uid"),
    }
    if md.get("namespace"):
        involved["namespace"] = md["namespace"]
    if md.get("resourceVersion"):
        involved["resourceVersion"] = md["resourceVersion"]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": event_name(obj, event), "namespace": namespace},
        "involvedObject": involved,
        "type": event.type,
        "reason": event.reason,
        "message": event.message[:MAX_MESSAGE],
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": instance[:128],
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


class EventRecorder:
    """Writes Events through the adapter; `record` never raises."""

    def __init__(self, kube: Kube, clock: Callable[[], str], instance: str | None = None) -> None:
        self.kube = kube
        self.clock = clock
        self.instance = instance or os.environ.get("POD_NAME") or socket.gethostname()
        # Event name -> count written, like client-go's EventCorrelator cache (in memory: after a
        # restart a repeat counts from 2). No read of Events is needed, so no `get` permission.
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def record(self, obj: Mapping[str, Any], event: Event) -> None:
        body = event_manifest(obj, event, self.clock(), self.instance)
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        level = logging.WARNING if event.type == WARNING else logging.INFO
        log.log(level, "%s %s/%s: %s: %s", event.type, ns, obj.get("metadata", {}).get("name"), event.reason,
                event.message)  # fmt: skip
        try:
            try:
                self.kube.create(body)
                with self._lock:
                    self._counts[name] = 1
            except ApiError as exc:
                if exc.status != 409:
                    raise
                # The same event again: count it on the existing object.
                with self._lock:
                    count = self._counts[name] = self._counts.get(name, 1) + 1
                    if len(self._counts) > 4096:  # bounded, like the correlator's LRU
                        self._counts.pop(next(iter(self._counts)))
                patch = {"count": count, "lastTimestamp": body["lastTimestamp"]}
                self.kube.patch("v1", "Event", ns, name, patch)
        except ApiError as exc:
            log.warning("could not record event %s on %s/%s: %s", event.reason, ns, name, exc)
