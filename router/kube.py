"""Kubernetes adapter: watch the pool's engine pods, the classes ConfigMap and the auth Secret.

The official `kubernetes` client is synchronous, so each watch runs in a daemon thread (list, then
watch from the list's resourceVersion; relist on expiry or error, with backoff) and hands snapshots to
the event loop with `call_soon_threadsafe`. Callbacks therefore run on the loop, like everything else
in the router. Configuration: in-cluster service account, else KUBECONFIG / ~/.kube/config.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("jitserve.router.kube")


def load_api(kubeconfig: str | None = None) -> Any:
    """CoreV1Api: in-cluster service account, else the kubeconfig (given, or KUBECONFIG / ~/.kube/config).

    The path is read here, not at import: the client library freezes its default path when imported."""
    from kubernetes import client, config

    if kubeconfig:
        return client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None)
    return client.CoreV1Api()


def pod_targets(pods: dict[str, Any], port: int) -> dict[str, str]:
    """Ready, running, not-terminating pods with an IP -> base URL."""
    out: dict[str, str] = {}
    for name, pod in pods.items():
        md, status = pod.metadata, pod.status
        if md.deletion_timestamp is not None or status is None or not status.pod_ip:
            continue
        if status.phase != "Running":
            continue
        ready = any(c.type == "Ready" and c.status == "True" for c in (status.conditions or []))
        if ready:
            out[name] = f"http://{status.pod_ip}:{port}"
    return out


def decode_secret(data: dict[str, str] | None) -> dict[str, str]:
    return {k: base64.b64decode(v).decode("utf-8", "replace") for k, v in (data or {}).items()}


class Watch(threading.Thread):
    """List + watch one kind in one namespace, calling `on_change(objects by name)` on the loop."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        list_fn: Callable[..., Any],
        namespace: str,
        on_change: Callable[[dict[str, Any]], None],
        label_selector: str | None = None,
        field_selector: str | None = None,
        what: str = "objects",
    ) -> None:
        super().__init__(daemon=True, name=f"watch-{what}")
        self.loop, self.list_fn, self.namespace = loop, list_fn, namespace
        self.on_change = on_change
        self.kwargs: dict[str, Any] = {}
        if label_selector:
            self.kwargs["label_selector"] = label_selector
        if field_selector:
            self.kwargs["field_selector"] = field_selector
        self.what = what
        self.stopped = threading.Event()

    def _emit(self, objects: dict[str, Any]) -> None:
        snapshot = dict(objects)
        self.loop.call_soon_threadsafe(self.on_change, snapshot)

    def run(self) -> None:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        backoff = 0.5
        while not self.stopped.is_set():
            try:
                listed = self.list_fn(self.namespace, **self.kwargs)
                objects = {o.metadata.name: o for o in listed.items}
                self._emit(objects)
                rv = listed.metadata.resource_version
                backoff = 0.5
                while not self.stopped.is_set():
                    w = watch.Watch()
                    for ev in w.stream(
                        self.list_fn, self.namespace, resource_version=rv, timeout_seconds=60, **self.kwargs
                    ):
                        obj = ev["object"]
                        rv = obj.metadata.resource_version
                        if ev["type"] == "DELETED":
                            objects.pop(obj.metadata.name, None)
                        elif ev["type"] in ("ADDED", "MODIFIED"):
                            objects[obj.metadata.name] = obj
                        else:
                            continue
                        self._emit(objects)
                        if self.stopped.is_set():
                            return
            except ApiException as exc:
                if exc.status != 410:  # 410 Gone: resourceVersion too old, relist at once
                    log.warning("watching %s failed: %s; retrying in %.1fs", self.what, exc.reason, backoff)
                    time.sleep(backoff)
                    backoff = min(backoff * 2, 30)
            except Exception as exc:  # the thread must survive API hiccups of any kind
                log.warning("watching %s failed: %r; retrying in %.1fs", self.what, exc, backoff)
                time.sleep(backoff)
                backoff = min(backoff * 2, 30)
