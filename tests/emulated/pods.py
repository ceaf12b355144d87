"""The emulated kubelet, Deployment controller and kube-proxy: run each Deployment's pods as local
processes, each on its own loopback address 127.0.0.N, so an end-to-end test can go from
`kubectl apply` to a completion served by real engines without a cluster.

    with EmulatedPodRunner(cluster.url, cluster.kubeconfig, workdir) as pods:
        ...  # Deployments in the emulated API server now get Pods, processes and status
        base_url = pods.resolve(pool["status"]["endpoint"])  # the Service, via an emulated ClusterIP

What it does, per loop (every `interval` seconds):
- Deployments: keeps `spec.replicas` pods of the current template (a template change replaces the
  pods: old ones stop first, then new ones start, like `maxSurge: 0`); scales up and down (newest
  pods go first); stops every pod of a Deployment that is gone; writes the Deployment's status
  (replicas, updatedReplicas, readyReplicas, availableReplicas, observedGeneration, conditions).
- Pods: creates a Pod object per pod (template labels + pod-template-hash, ownerReference to the
  Deployment, status.podIP, phase, the Ready condition, containerStatuses); a Pod deleted through the
  API has its process stopped and is replaced, as the ReplicaSet controller would.
- Readiness: the container's real readinessProbe (httpGet or tcpSocket) against the pod's address;
  Ready follows the last probe. No probe: ready once the process runs.
- Restarts: a container that exits is restarted (restartPolicy Always) with exponential backoff;
  its status shows restartCount and lastState.terminated.exitCode.
- Services: each ClusterIP Service with a selector gets an emulated cluster IP (127.0.1.N) where a
  TCP forwarder spreads connections round-robin over the Service's ready pods (`resolve()` maps a
  cluster DNS URL to it). The API objects are not changed.

How a container becomes a local process (every rewrite is listed here, nothing else is changed):
1. argv follows Kubernetes' rules: `command` replaces the image's ENTRYPOINT, `args` its CMD. Images
   named `jitserve/<dir>` take ENTRYPOINT/CMD from `images/<dir>/Dockerfile`, the real image recipe.
2. A leading `jitserve` (the console script inside the images) runs as `<this python> -m jitserve.main`,
   i.e. this checkout, which is what the images install.
3. Servers bind the pod's address: `0.0.0.0` in any argument (e.g. kopf's --liveness URL) becomes
   the pod IP, and `jitserve engine|router` get `--host <pod IP>` right after the subcommand (they
   default to 0.0.0.0). In a pod, 0.0.0.0 is the pod's own network namespace; here all pods share
   one, so each binds its own address and the same port can serve every pod.
4. Volumes become per-pod directories: emptyDir (empty), configMap and secret (their keys as files,
   refreshed when the object changes, as the kubelet does), hostPath (the path itself). Every arg
   and env value naming a path under a mountPath is rewritten to the local directory, and a volume
   at /tmp sets TMPDIR. persistentVolumeClaim volumes are not emulated (the pod stays Pending with
   reason EmulatedUnsupportedVolume).
5. Environment: the container's `env` (value; valueFrom fieldRef metadata.name/namespace/uid,
   status.podIP, spec.nodeName, spec.serviceAccountName; configMapKeyRef; secretKeyRef), HOSTNAME =
   the pod name, on top of the runner's environment (PATH, the virtualenv). The projected service
   account token is emulated by KUBECONFIG pointing at the emulated API server (unless the pod sets
   automountServiceAccountToken: false); KUBERNETES_SERVICE_HOST is removed so in-cluster config
   loading falls back to it.
Not emulated: resources/limits, securityContext, node selection, init and sidecar containers,
liveness/startup probes (readiness only), exec probes (treated as passing).

Every process runs in its own process group and is killed (SIGTERM, then SIGKILL after the grace
period, capped by `max_grace`) when its pod goes; `stop()` kills them all.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import hashlib
import itertools
import json
import logging
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

log = logging.getLogger("tests.emulated.pods")

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "images"
NODE_NAME = "emulated-node"
POD_TEMPLATE_HASH = "pod-template-hash"
# Loopback ranges: pods get 127.0.0.2.., Services 127.0.1.1.. (Linux routes all of 127/8 to lo).
# Never reused within a runner, so a stopped pod's lingering socket cannot answer for a new pod.
POD_IP_RANGE = [f"127.0.{a}.{b}" for a in (0, 2, 3) for b in range(2, 255)]
SERVICE_IP_RANGE = [f"127.0.1.{b}" for b in range(1, 255)]
JITSERVE_SERVERS = ("engine", "router")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def template_hash(template: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


def _dockerfile_entrypoint(directory: str) -> tuple[list[str], list[str]] | None:
    """(ENTRYPOINT, CMD) in exec form from images/<directory>/Dockerfile, or None if no such image."""
    path = IMAGES / directory / "Dockerfile"
    if not path.is_file():
        return None
    entrypoint: list[str] = []
    cmd: list[str] = []
    text = re.sub(r"\\\n", " ", path.read_text())
    for line in text.splitlines():
        instr, _, rest = line.strip().partition(" ")
        if instr.upper() == "FROM":
            entrypoint, cmd = [], []  # a new stage resets both
        elif instr.upper() == "ENTRYPOINT":
            entrypoint = json.loads(rest)
        elif instr.upper() == "CMD":
            cmd = json.loads(rest)
    return entrypoint, cmd


def container_argv(container: dict[str, Any]) -> list[str]:
    """The argv Kubernetes would run (rewrite 1): command/args over the image's ENTRYPOINT/CMD."""
    image = container.get("image", "")
    repo = image.split("@")[0]
    if ":" in repo.rsplit("/", 1)[-1]:
        repo = repo.rsplit(":", 1)[0]  # drop the tag (a ':' before the last '/' is a registry port)
    name = repo.rsplit("/", 1)[-1]
    image_entry = _dockerfile_entrypoint(name) if repo.endswith(f"jitserve/{name}") else None
    entrypoint, image_cmd = image_entry or ([], [])
    if "command" in container:
        return [*container["command"], *container.get("args", [])]
    args = container.get("args", image_cmd)
    argv = [*entrypoint, *args]
    if not argv:
        raise ValueError(
            f"container {container.get('name')}: no command, and image {image} is not one of images/"
        )
    return argv


def local_argv(argv: list[str], pod_ip: str) -> list[str]:
    """Rewrites 2 and 3: `jitserve` -> this checkout's module; servers bind the pod's address."""
    # "All interfaces" of a pod's own network namespace is, here, the pod's loopback address.
    argv = [a.replace("0.0.0.0", pod_ip) for a in argv]
    if not argv or argv[0] != "jitserve":
        return argv
    out = [sys.executable, "-m", "jitserve.main", *argv[1:]]
    if len(argv) > 1 and argv[1] in JITSERVE_SERVERS:
        out[4:4] = ["--host", pod_ip]  # right after the subcommand: later words may be vLLM's (after --)
    return out


def rewrite_paths(value: str, mounts: list[tuple[str, Path]]) -> str:
    """Rewrite 4: a path under a mountPath (as a whole word or after '=') -> the local directory."""
    if not mounts:
        return value
    # One pass over all mountPaths (longest first in the alternation): a path already rewritten to a
    # local directory (itself under /tmp) must not be rewritten again by a `/tmp` mount.
    local_of = {mount_path.rstrip("/"): str(local) for mount_path, local in mounts}
    alternation = "|".join(re.escape(mp) for mp in sorted(local_of, key=len, reverse=True))
    pattern = re.compile(rf"(^|=|:)({alternation})(?=/|$|:)")
    # This checkout and its interpreter may themselves live under /tmp (CI clones anywhere): a path
    # there that the test put in a spec (a model directory, say) is this machine's, not the mount's.
    host_paths = (str(IMAGES.parent), sys.prefix)

    def swap(m: re.Match[str]) -> str:
        if value.startswith(host_paths, m.start(2)):
            return m.group(0)
        return m.group(1) + local_of[m.group(2)]

    return pattern.sub(swap, value)


def _port_number(port: int | str, container: dict[str, Any]) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for p in container.get("ports", []):
        if p.get("name") == port:
            return int(p["containerPort"])
    raise ValueError(f"container {container.get('name')} has no port named {port!r}")


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and selector.items() <= labels.items()


class Api:
    """Plain REST against the emulated API server (JSON in, JSON out; 404 -> None)."""

    def __init__(self, url: str) -> None:
        self.http = httpx.Client(base_url=url, timeout=10.0, headers={"Authorization": "Bearer emulated"})

    def get(self, path: str, **params: str) -> dict[str, Any] | None:
        resp = self.http.get(path, params=params)
        if resp.status_code == 404:
            return None
        resp.raise_for_status()
        return resp.json()

    def items(self, path: str, **params: str) -> list[dict[str, Any]]:
        return (self.get(path, **params) or {}).get("items") or []

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        resp = self.http.post(path, json=body)
        resp.raise_for_status()
        return resp.json()

    def patch_status(self, path: str, status: dict[str, Any]) -> None:
        resp = self.http.patch(
            path + "/status",
            json={"status": status},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        if resp.status_code != 404:  # gone meanwhile: nothing to report on
            resp.raise_for_status()

    def delete(self, path: str) -> None:
        resp = self.http.delete(path)
        if resp.status_code != 404:
            resp.raise_for_status()

    def close(self) -> None:
        self.http.close()


@dataclass
class Container:
    spec: dict[str, Any]
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    started_at: str | None = None
    restarts: int = 0
    last_exit: int | None = None
    restart_after: float = 0.0  # monotonic time of the next restart (backoff)
    ready: bool = False
    stopped: set[int] = field(default_factory=set)  # pids this runner stopped (not crashes)

    def start(self, cwd: Path) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            out.write(f"\n=== emulated start: {shlex.join(self.argv)}\n".encode())
            out.flush()
            # Own process group: stopping the pod also stops children (vLLM's engine-core process).
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        self.started_at = _now()
        self.ready = False

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace: float) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        self.stopped.add(proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
        # The group may outlive its leader (vLLM's engine core and workers): make sure all of it is gone.
        _kill_group(proc)

    def log_tail(self, lines: int = 30) -> str:
        return _tail(self.log_path, lines)


def _tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@dataclass
class EmulatedPod:
    name: str
    namespace: str
    deployment: str
    template_hash: str
    ip: str
    obj: dict[str, Any]
    dir: Path
    containers: list[Container] = field(default_factory=list)
    seq: int = 0  # creation order (scale-down removes the newest first)
    unsupported: str | None = None  # why it cannot run here (stays Pending)
    config_sources: dict[str, tuple[str, str, Path, str]] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return bool(self.containers) and all(c.running() and c.ready for c in self.containers)


class ServiceForwarders:
    """Emulated kube-proxy: an asyncio TCP forwarder per (cluster IP, port) in its own thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="emulated-kube-proxy", daemon=True)
        self.servers: dict[tuple[str, int], asyncio.AbstractServer] = {}
        self.endpoints: dict[tuple[str, int], list[tuple[str, int]]] = {}
        self.events: list[str] = []  # refused or failed connections, to explain a client's error
        self._rr = itertools.count()

    def start(self) -> None:
        self.thread.start()

    def set(self, ip: str, port: int, endpoints: list[tuple[str, int]]) -> None:
        self.endpoints[(ip, port)] = endpoints
        if (ip, port) not in self.servers:
            fut = asyncio.run_coroutine_threadsafe(
                asyncio.start_server(lambda r, w, key=(ip, port): self._forward(key, r, w), ip, port),
                self.loop,
            )
            self.servers[(ip, port)] = fut.result(10)

    def remove(self, ip: str, port: int) -> None:
        self.endpoints.pop((ip, port), None)
        server = self.servers.pop((ip, port), None)
        if server is not None:
            self.loop.call_soon_threadsafe(server.close)

    async def _forward(
        self, key: tuple[str, int], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        endpoints = self.endpoints.get(key) or []
        if not endpoints:
            self.events.append(f"{key[0]}:{key[1]}: no ready endpoint, connection refused")
            writer.close()  # no ready endpoint: the connection is refused, as with kube-proxy
            return
        host, port = endpoints[next(self._rr) % len(endpoints)]
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError as exc:
            self.events.append(f"{key[0]}:{key[1]} -> {host}:{port}: {exc!r}")
            writer.close()
            return

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                with contextlib.suppress(Exception):
                    dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def stop(self) -> None:
        for key in list(self.servers):
            self.remove(*key)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


class EmulatedPodRunner:
    """See the module docstring. Thread-safe to query (`pods()`, `resolve()`) while it runs."""

    def __init__(
        self,
        api_url: str,
        kubeconfig: Path | str,
        workdir: Path | str,
        interval: float = 0.2,
        max_grace: float = 15.0,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.api = Api(api_url)
        self.kubeconfig = str(kubeconfig)
        self.workdir = Path(workdir)
        self.interval = interval
        self.max_grace = max_grace
        self.extra_env = dict(extra_env or {})
        self._pods: dict[tuple[str, str], EmulatedPod] = {}  # (namespace, pod name)
        self._services: dict[tuple[str, str], str] = {}  # (namespace, service) -> emulated cluster IP
        self._service_ports: dict[tuple[str, str], set[int]] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="emulated-pod-runner", daemon=True)
        self._proxy = ServiceForwarders()
        self._pod_ips = iter(POD_IP_RANGE)
        self._service_ips = iter(SERVICE_IP_RANGE)
        self._seq = itertools.count()
        # Every process ever started, with its container (pids and logs of gone pods, crashes).
        self._started: list[tuple[str, Container, subprocess.Popen[bytes]]] = []
        self.errors: list[str] = []  # loop failures, for a test to show when something never converges

    # ---- lifecycle -----------------------------------------------------------------------------------

    def __enter__(self) -> EmulatedPodRunner:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._proxy.start()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        with self._lock:
            pods = list(self._pods.values())
            self._pods.clear()
        for pod in pods:
            for c in pod.containers:
                c.stop(grace=min(self.max_grace, 5.0))
        for _, _, proc in self._started:  # belt and braces: no process group may outlive the runner
            _kill_group(proc)
        self._proxy.stop()
        self.api.close()

    # ---- queries -------------------------------------------------------------------------------------

    def pods(self, namespace: str | None = None, deployment: str | None = None) -> list[EmulatedPod]:
        with self._lock:
            return [
                p
                for p in self._pods.values()
                if (namespace is None or p.namespace == namespace)
                and (deployment is None or p.deployment == deployment)
            ]

    @property
    def started_pids(self) -> list[int]:
        """Every process this runner ever started (restarts included), running or not."""
        with self._lock:
            return [proc.pid for _, _, proc in self._started]

    def logs_all(self, lines: int = 25) -> str:
        """The log tail of every container ever started here (to explain a failed wait)."""
        with self._lock:
            containers = list(dict.fromkeys(c.log_path for _, c, _ in self._started))
        return "\n".join(f"--- {path}\n{_tail(path, lines)}" for path in containers)

    def resolve(self, url: str) -> str:
        """http://<svc>.<ns>.svc[.cluster.local]:<port>/path -> the Service's emulated cluster IP."""
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        labels = host.removesuffix(".cluster.local").removesuffix(".svc").split(".")
        name, namespace = labels[0], labels[1] if len(labels) > 1 else "default"
        with self._lock:
            ip = self._services.get((namespace, name))
        if ip is None:
            raise LookupError(f"no emulated Service {namespace}/{name} (from {url})")
        netloc = f"{ip}:{parts.port}" if parts.port else ip
        return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))

    def service_events(self) -> list[str]:
        """Connections the emulated kube-proxy refused or could not forward, and its endpoint table."""
        table = [f"{ip}:{port} -> {eps}" for (ip, port), eps in sorted(self._proxy.endpoints.items())]
        return list(self._proxy.events) + table + [f"runner error: {e}" for e in self.errors]

    def crashes(self, namespace: str | None = None) -> list[str]:
        """Processes that exited without this runner stopping them (none should, in a healthy test)."""
        with self._lock:
            started = list(self._started)
        return [
            f"{c.log_path} exited {proc.returncode}:\n{c.log_tail()}"
            for ns, c, proc in started
            if proc.poll() is not None and proc.pid not in c.stopped and namespace in (None, ns)
        ]

    def logs(self, namespace: str, deployment: str, lines: int = 30) -> str:
        return "\n".join(
            f"--- {p.name}/{c.spec['name']} (restarts {c.restarts})\n{c.log_tail(lines)}"
            for p in self.pods(namespace, deployment)
            for c in p.containers
        )

    # ---- the loop ------------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync_once()
            except Exception as exc:  # the API server may be restarting: report, try again next round
                self.errors.append(f"{exc!r}\n{traceback.format_exc(limit=4)}")
                del self.errors[:-20]
                log.debug("emulated pod runner: %r", exc)
            self._stop.wait(self.interval)

    def sync_once(self) -> None:
        # Pods first, then Deployments: a Deployment in the second list is at least as fresh as the
        # pods, so a cascade deletion (the garbage collector removes both) never reads as "its pods
        # are missing, start new ones".
        live_pods = {
            (p["metadata"]["namespace"], p["metadata"]["name"]): p for p in self.api.items("/api/v1/pods")
        }
        deployments = self.api.items("/apis/apps/v1/deployments")
        wanted = {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in deployments}
        with self._lock:
            # Pods deleted through the API, or whose Deployment is gone: stop them.
            for key, pod in list(self._pods.items()):
                if key not in live_pods or (pod.namespace, pod.deployment) not in wanted:
                    self._delete_pod(pod, api_delete=key in live_pods)
        for (ns, name), dep in wanted.items():
            self._sync_deployment(ns, name, dep)
        with self._lock:
            pods = list(self._pods.values())
        for pod in pods:
            self._sync_pod(pod)
        for (ns, name), dep in wanted.items():
            self._write_deployment_status(ns, name, dep)
        self._sync_services()

    # ---- Deployments ---------------------------------------------------------------------------------

    def _sync_deployment(self, ns: str, name: str, dep: dict[str, Any]) -> None:
        spec = dep.get("spec") or {}
        replicas = int(spec.get("replicas", 1))
        template = spec.get("template") or {}
        current = template_hash(template)
        with self._lock:
            mine = sorted(self.pods(ns, name), key=lambda p: p.seq)
        old = [p for p in mine if p.template_hash != current]
        new = [p for p in mine if p.template_hash == current]
        for pod in old:  # a new template replaces every pod; the old ones stop first (maxSurge 0)
            self._delete_pod(pod)
        for pod in reversed(new[replicas:]):  # scale down: newest first
            self._delete_pod(pod)
        for _ in range(replicas - len(new)):
            self._create_pod(ns, name, dep, template, current)

    def _write_deployment_status(self, ns: str, name: str, dep: dict[str, Any]) -> None:
        spec = dep.get("spec") or {}
        pods = self.pods(ns, name)
        current = template_hash(spec.get("template") or {})
        ready = sum(1 for p in pods if p.ready)
        replicas = int(spec.get("replicas", 1))
        available = ready >= replicas
        status = {
            "observedGeneration": dep["metadata"].get("generation"),
            "replicas": len(pods),
            "updatedReplicas": sum(1 for p in pods if p.template_hash == current),
            "readyReplicas": ready,
            "availableReplicas": ready,
            "unavailableReplicas": max(0, replicas - ready),
        }
        old = dep.get("status") or {}
        if {k: old.get(k) for k in status} == status:
            return
        status["conditions"] = [
            {
                "type": "Available",
                "status": "True" if available else "False",
                "reason": "MinimumReplicasAvailable" if available else "MinimumReplicasUnavailable",
                "message": f"{ready}/{replicas} emulated pods ready",
                "lastUpdateTime": _now(),
                "lastTransitionTime": _now(),
            }
        ]
        self.api.patch_status(f"/apis/apps/v1/namespaces/{ns}/deployments/{name}", status)

    # ---- Pods ----------------------------------------------------------------------------------------

    def _create_pod(
        self, ns: str, dep_name: str, dep: dict[str, Any], template: dict[str, Any], thash: str
    ) -> None:
        pod_name = f"{dep_name}-{thash}-{uuid.uuid4().hex[:5]}"
        ip = next(self._pod_ips)
        labels = {**((template.get("metadata") or {}).get("labels") or {}), POD_TEMPLATE_HASH: thash}
        pod_spec = copy.deepcopy(template.get("spec") or {})
        pod_spec["nodeName"] = NODE_NAME
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "namespace": ns,
                "labels": labels,
                "annotations": dict((template.get("metadata") or {}).get("annotations") or {}),
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "name": dep_name,
                        "uid": dep["metadata"]["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": pod_spec,
        }
        obj = self.api.create(f"/api/v1/namespaces/{ns}/pods", body)
        seq = next(self._seq)
        # A short directory: vLLM puts Unix sockets under TMPDIR, and their paths may not exceed 107 bytes.
        pod = EmulatedPod(pod_name, ns, dep_name, thash, ip, obj, self.workdir / f"p{seq}", seq=seq)
        with self._lock:
            self._pods[(ns, pod_name)] = pod
        try:
            self._prepare(pod, pod_spec)
        except (_UnsupportedError, ValueError, KeyError) as exc:
            pod.unsupported = str(exc)
            pod.containers.clear()
        for c in pod.containers:
            self._start(c, pod)
        self._write_pod_status(pod)

    def _start(self, c: Container, pod: EmulatedPod) -> None:
        c.start(pod.dir)
        assert c.proc is not None
        with self._lock:
            # A restart replaces c.proc: keep the record of every process (for started_pids, crashes).
            self._started.append((pod.namespace, c, c.proc))

    def _prepare(self, pod: EmulatedPod, spec: dict[str, Any]) -> None:
        """Volumes, env and argv of every container (rewrites 1-5 of the module docstring)."""
        volumes: dict[str, Path] = {}
        for vol in spec.get("volumes") or []:
            local = pod.dir / "v" / vol["name"]
            if "emptyDir" in vol:
                local.mkdir(parents=True, exist_ok=True)
            elif "configMap" in vol or "secret" in vol:
                kind = "configmaps" if "configMap" in vol else "secrets"
                src = vol.get("configMap") or vol.get("secret") or {}
                obj_name = src.get("name") or src.get("secretName") or ""
                pod.config_sources[vol["name"]] = (kind, obj_name, local, "")
                self._materialize(pod, vol["name"])
            elif "hostPath" in vol:
                local = Path(vol["hostPath"]["path"])
            else:
                raise _UnsupportedError(
                    f"volume {vol['name']}: only emptyDir, configMap, secret, hostPath are emulated"
                )
            volumes[vol["name"]] = local
        base_env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
        base_env.update(self.extra_env)
        if spec.get("automountServiceAccountToken", True) is not False:
            base_env["KUBECONFIG"] = self.kubeconfig  # the emulated service account (rewrite 5)
        else:
            base_env.pop("KUBECONFIG", None)
        for spec_c in spec.get("containers") or []:
            mounts = sorted(
                ((m["mountPath"], volumes[m["name"]]) for m in spec_c.get("volumeMounts") or []),
                key=lambda m: -len(m[0]),
            )
            env = dict(base_env)
            env["HOSTNAME"] = pod.name
            for mount_path, local in mounts:
                if mount_path.rstrip("/") == "/tmp":
                    env["TMPDIR"] = str(local)
            for var in spec_c.get("env") or []:
                value = self._env_value(pod, spec, var)
                if value is not None:
                    env[var["name"]] = rewrite_paths(value, mounts)
            # Rewrite the container's own paths before local_argv adds this machine's interpreter:
            # a checkout under /tmp must not be mistaken for a path on the pod's /tmp mount.
            argv = local_argv([rewrite_paths(a, mounts) for a in container_argv(spec_c)], pod.ip)
            log_path = pod.dir / "logs" / f"{pod.namespace}.{pod.name}.{spec_c['name']}.log"
            pod.containers.append(Container(spec_c, argv, env, log_path))

    def _env_value(self, pod: EmulatedPod, spec: dict[str, Any], var: dict[str, Any]) -> str | None:
        if "value" in var:
            return str(var["value"])
        source = var.get("valueFrom") or {}
        if "fieldRef" in source:
            fields = {
                "metadata.name": pod.name,
                "metadata.namespace": pod.namespace,
                "metadata.uid": pod.obj["metadata"].get("uid", ""),
                "status.podIP": pod.ip,
                "spec.nodeName": NODE_NAME,
                "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
            }
            return fields[source["fieldRef"]["fieldPath"]]
        for key, plural in (("configMapKeyRef", "configmaps"), ("secretKeyRef", "secrets")):
            if key in source:
                ref = source[key]
                obj = self.api.get(f"/api/v1/namespaces/{pod.namespace}/{plural}/{ref['name']}") or {}
                value = (obj.get("data") or {}).get(ref["key"])
                if value is None:
                    if ref.get("optional"):
                        return None
                    raise _UnsupportedError(
                        f"env {var['name']}: {plural} {ref['name']} has no key {ref['key']}"
                    )
                return base64.b64decode(value).decode() if plural == "secrets" else value
        return None

    def _materialize(self, pod: EmulatedPod, volume: str) -> None:
        """Write a configMap/secret volume's keys as files; rewrite only when the object changed."""
        kind, name, local, seen = pod.config_sources[volume]
        obj = self.api.get(f"/api/v1/namespaces/{pod.namespace}/{kind}/{name}") or {}
        data = obj.get("data") or {}
        digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
        if digest == seen:
            return
        local.mkdir(parents=True, exist_ok=True)
        for key, value in data.items():
            content = base64.b64decode(value) if kind == "secrets" else value.encode()
            tmp = local / f".{key}.tmp"
            tmp.write_bytes(content)
            tmp.replace(local / key)  # atomic, as the kubelet's symlink swap
        pod.config_sources[volume] = (kind, name, local, digest)

    def _sync_pod(self, pod: EmulatedPod) -> None:
        if pod.unsupported is None:
            for volume in pod.config_sources:
                self._materialize(pod, volume)
            now = time.monotonic()
            for c in pod.containers:
                if c.running():
                    c.ready = self._probe(pod, c)
                    continue
                if c.proc is not None and c.restart_after == 0.0:  # just exited: schedule a restart
                    c.last_exit = c.proc.returncode
                    c.ready = False
                    c.restart_after = now + min(30.0, 1.0 * 2**c.restarts)
                    log.warning(
                        "emulated pod %s/%s exited %s:\n%s",
                        pod.name,
                        c.spec["name"],
                        c.last_exit,
                        c.log_tail(),
                    )
                elif c.restart_after and now >= c.restart_after:
                    c.restarts += 1
                    c.restart_after = 0.0
                    self._start(c, pod)
        self._write_pod_status(pod)

    def _probe(self, pod: EmulatedPod, c: Container) -> bool:
        probe = c.spec.get("readinessProbe")
        if not probe:
            return True
        timeout = float(min(probe.get("timeoutSeconds", 1), 2))
        try:
            if "httpGet" in probe:
                get = probe["httpGet"]
                port = _port_number(get["port"], c.spec)
                url = f"http://{pod.ip}:{port}{get.get('path', '/')}"
                status = httpx.get(url, timeout=timeout).status_code
                return 200 <= status < 400
            if "tcpSocket" in probe:
                port = _port_number(probe["tcpSocket"]["port"], c.spec)
                with socket.create_connection((pod.ip, port), timeout=timeout):
                    return True
        except (httpx.HTTPError, OSError):
            return False
        return True  # exec probes are not emulated

    def _write_pod_status(self, pod: EmulatedPod) -> None:
        if pod.unsupported is not None:
            status: dict[str, Any] = {
                "phase": "Pending",
                "conditions": [
                    {"type": "PodScheduled", "status": "False", "reason": "EmulatedUnsupportedVolume",
                     "message": pod.unsupported}
                ],
            }  # fmt: skip
        else:
            statuses = []
            for c in pod.containers:
                state: dict[str, Any]
                if c.running():
                    state = {"running": {"startedAt": c.started_at}}
                else:
                    state = {
                        "waiting": {"reason": "CrashLoopBackOff" if c.restart_after else "ContainerCreating"}
                    }
                entry: dict[str, Any] = {
                    "name": c.spec["name"],
                    "image": c.spec.get("image", ""),
                    # Required by clients' typed models (the kubernetes client rejects a status without it).
                    "imageID": f"emulated://{c.spec.get('image', '')}",
                    "containerID": f"emulated://{c.proc.pid if c.proc is not None else 0}",
                    "ready": c.running() and c.ready,
                    "started": c.running(),
                    "restartCount": c.restarts,
                    "state": state,
                }
                if c.last_exit is not None:
                    entry["lastState"] = {"terminated": {"exitCode": c.last_exit}}
                statuses.append(entry)
            ready = "True" if pod.ready else "False"
            status = {
                "phase": "Running" if any(c.running() for c in pod.containers) else "Pending",
                "podIP": pod.ip,
                "podIPs": [{"ip": pod.ip}],
                "hostIP": "127.0.0.1",
                "conditions": [
                    {"type": "PodScheduled", "status": "True"},
                    {"type": "Initialized", "status": "True"},
                    {"type": "ContainersReady", "status": ready},
                    {"type": "Ready", "status": ready},
                ],
                "containerStatuses": statuses,
            }
        if pod.obj.get("status") == status:
            return
        pod.obj["status"] = status
        self.api.patch_status(f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}", status)

    def _delete_pod(self, pod: EmulatedPod, api_delete: bool = True) -> None:
        with self._lock:
            self._pods.pop((pod.namespace, pod.name), None)
        grace = float(((pod.obj.get("spec") or {}).get("terminationGracePeriodSeconds")) or 30)
        for c in pod.containers:
            c.stop(grace=min(grace, self.max_grace))
        if api_delete:
            self.api.delete(f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}")

    # ---- Services (emulated kube-proxy) ------------------------------------------------------------

    def _sync_services(self) -> None:
        services = self.api.items("/api/v1/services")
        seen: set[tuple[str, str]] = set()
        for svc in services:
            ns, name = svc["metadata"]["namespace"], svc["metadata"]["name"]
            spec = svc.get("spec") or {}
            selector = spec.get("selector") or {}
            if not selector or spec.get("type", "ClusterIP") not in ("ClusterIP", "NodePort", "LoadBalancer"):
                continue
            seen.add((ns, name))
            with self._lock:
                if (ns, name) not in self._services:  # allocate once (setdefault would draw every loop)
                    self._services[(ns, name)] = next(self._service_ips)
                ip = self._services[(ns, name)]
                ready = [p for p in self._pods.values() if p.namespace == ns and p.ready]
            ports: set[int] = set()
            for port in spec.get("ports") or []:
                target = port.get("targetPort", port["port"])
                endpoints = []
                for pod in ready:
                    if not _selects(selector, pod.obj["metadata"].get("labels") or {}):
                        continue
                    for c in pod.containers:
                        with contextlib.suppress(ValueError):
                            endpoints.append((pod.ip, _port_number(target, c.spec)))
                            break
                self._proxy.set(ip, int(port["port"]), endpoints)
                ports.add(int(port["port"]))
            for stale in self._service_ports.get((ns, name), set()) - ports:
                self._proxy.remove(ip, stale)
            self._service_ports[(ns, name)] = ports
        for key in set(self._services) - seen:
            with self._lock:
                ip = self._services.pop(key)
            for port in self._service_ports.pop(key, set()):
                self._proxy.remove(ip, port)


def _kill_group(proc: subprocess.Popen[bytes], bound: float = 30.0) -> None:
    """SIGKILL a process group and return once none of it is left (the leader reaped, members gone)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=bound)
    deadline = time.monotonic() + bound  # members are reaped by init: wait for that, with a bound
    while time.monotonic() < deadline and list(iter_process_groups([proc.pid])):
        time.sleep(0.05)


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL it if the runner's thread dies (a test killed mid-run must
    not leave engines behind). Linux only; elsewhere the process-group cleanup in stop() remains."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


class _UnsupportedError(Exception):
    """Something in the pod spec this emulation does not run (reported on the Pod, never hidden)."""


def _live_groups() -> set[int] | None:
    """Process groups with at least one non-zombie member, from /proc (None where there is no /proc).
    Zombies do not count: their parent may be a PID 1 that never reaps them, yet they run nothing."""
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    groups: set[int] = set()
    for stat in proc.glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # the process ended while we looked
        fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp ...
        if fields[0] != "Z":
            groups.add(int(fields[2]))
    return groups


def iter_process_groups(pids: list[int]) -> Iterator[int]:
    """The pids whose process group still has a live (non-zombie) member, for a "nothing left
    behind" check."""
    live = _live_groups()
    for pid in pids:
        if live is not None:
            if pid in live:
                yield pid
            continue
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            continue
        except PermissionError:
            pass
        yield pid
