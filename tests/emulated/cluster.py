"""Run the emulated API server in a background thread and point a kubeconfig at it.

    with EmulatedCluster(kubeconfig_path) as cluster:
        subprocess.run(["kubectl", "--kubeconfig", cluster.kubeconfig, "apply", "--validate=false", ...])

The kubernetes client library freezes its default kubeconfig path when first imported, and kopf
logs in through it: set KUBECONFIG (see `kubeconfig_env`) before anything imports `kubernetes`.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import kmock

from .apiserver import EmulatedApiServer

T = TypeVar("T")

KUBECONFIG_TEMPLATE = """apiVersion: v1
kind: Config
clusters:
- name: emulated
  cluster: {{server: "{url}"}}
users:
- name: emulated
  user: {{token: emulated-token}}
contexts:
- name: emulated
  context: {{cluster: emulated, user: emulated, namespace: default}}
current-context: emulated
"""


@contextmanager
def kubeconfig_env() -> Iterator[Path]:
    """A fresh KUBECONFIG path in the environment (call before `kubernetes` is imported)."""
    path = Path(tempfile.mkdtemp(prefix="emulated-kube-")) / "config"
    old = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = str(path)
    try:
        yield path
    finally:
        if old is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = old


class EmulatedCluster:
    """The emulated API server on 127.0.0.1 (a free port), in its own thread and event loop."""

    def __init__(self, kubeconfig: Path | str | None = None) -> None:
        self.kubeconfig = Path(
            kubeconfig or os.environ.get("KUBECONFIG") or Path(tempfile.mkdtemp()) / "config"
        )
        self.url = ""
        self.server: EmulatedApiServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    async def _main(self) -> None:
        try:
            async with EmulatedApiServer() as server, kmock.Server(server) as http:
                self.server = server
                self.url = str(http.url).rstrip("/")
                self._loop = asyncio.get_running_loop()
                self._stop = asyncio.Event()
                self._ready.set()
                await self._stop.wait()
        except BaseException as exc:  # surfaced by start()
            self._error = exc
            self._ready.set()

    def start(self) -> EmulatedCluster:
        self._thread = threading.Thread(
            target=asyncio.run, args=(self._main(),), name="emulated-apiserver", daemon=True
        )
        self._thread.start()
        if not self._ready.wait(30) or self._error is not None:
            raise RuntimeError(f"the emulated API server did not start: {self._error!r}")
        self.kubeconfig.parent.mkdir(parents=True, exist_ok=True)
        self.kubeconfig.write_text(KUBECONFIG_TEMPLATE.format(url=self.url))
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> EmulatedCluster:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def call(self, fn: Callable[[EmulatedApiServer], T]) -> T:
        """Run `fn(server)` on the server's loop (to inspect its objects safely from a test)."""
        assert self._loop is not None and self.server is not None
        server = self.server

        async def run() -> T:
            return fn(server)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(30)

    def objects(self, plural: str | None = None, namespace: str | None = None) -> list[dict[str, Any]]:
        """Snapshot of the live objects, optionally of one resource plural and namespace."""

        def snapshot(server: EmulatedApiServer) -> list[dict[str, Any]]:
            return [
                obj
                for res, ns, _, obj in server.live_objects()
                if (plural is None or res.plural == plural) and (namespace is None or ns == namespace)
            ]

        return self.call(snapshot)
