"""The fault scenarios of issue 14, shared by the fault suite (tests/faults/test_faults.py, which asserts)
and `bench/reliability.py` (which prints the figures). Real processes throughout: the router is
`jitserve router`, the engines are FAKE but stream-faithful (tests/faults/fake_engine.py, each in a
process of its own, so kill -9 and SIGSTOP are real), the operator is `jitserve operator` against the
emulated API server (tests/emulated).

Every client request ends in one of these `Outcome.kind`s:
  completed    200, a finish_reason and `data: [DONE]`
  error_event  200, then an SSE error event (it has a `code`) and `data: [DONE]`
  http_error   4xx/5xx with a JSON error that has a `code`
  broken       the connection to the router broke (only when the router itself is killed)
  lost         anything else: a stream that ends without [DONE] or error, an error without a reason,
               a client timeout. Must be 0 everywhere.
`Outcome.wait_s` is the longest a client waited for anything: from sending to the response headers,
between two bytes, or from the last byte to the end. It is what a documented bound bounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import psutil

from tests.faults.fake_engine import TrackingEngineProcess, free_port

ROOT = Path(__file__).resolve().parents[2]
MODEL = "fake-model"

# The router's documented bound for a client on a hung engine with the default flags (docs/api.md,
# docs/decisions/router.md): --poll-interval + --poll-timeout + --unresponsive-timeout.
HUNG_ENGINE_BOUND_S = 0.25 + 1.0 + 10.0
# A killed engine refuses connections and resets its streams: the router sees it at once (docs: "a
# killed pod gets no more requests"); its documented ceiling is still the hung-engine one above.
KILLED_ENGINE_BOUND_S = HUNG_ENGINE_BOUND_S
# Design goal (docs/benchmarks/router.md): router RSS <= 250 MB with 2,000 streams.
RSS_GOAL_BYTES = 250 * 2**20

OK_KINDS = ("completed", "error_event", "http_error")


# -- clients ------------------------------------------------------------------------------------------------
@dataclass
class Outcome:
    kind: str
    status: int = 0
    code: str | None = None
    wait_s: float = 0.0
    total_s: float = 0.0
    tokens: int = 0
    pod: str | None = None


def classify(status: int, raw: bytes, broke: bool) -> tuple[str, str | None, int]:
    """(kind, error code, tokens) of a response whose body is `raw`; `broke`: the connection broke."""
    if status != 200:
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            err = json.loads(raw)["error"]
            if err.get("code") and err.get("message"):
                return "http_error", str(err["code"]), 0
        return ("broken" if broke else "lost"), None, 0
    tokens, finished, done, code = 0, False, False, None
    for line in raw.decode(errors="replace").splitlines():
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            done = True
            continue
        with contextlib.suppress(ValueError):
            event = json.loads(data)
            if "error" in event:
                code = str((event["error"] or {}).get("code") or "") or None
                continue
            for choice in event.get("choices") or []:
                if choice.get("text") or (choice.get("delta") or {}).get("content"):
                    tokens += 1
                finished = finished or choice.get("finish_reason") is not None
    if code is not None and done:
        return "error_event", code, tokens
    if finished and done and not broke:
        return "completed", None, tokens
    return ("broken" if broke else "lost"), code, tokens


async def stream_one(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    on_first_byte: Callable[[], None] | None = None,
    leave_after_bytes: int = 0,
) -> Outcome:
    """POST a streamed completion and read it to the end; `leave_after_bytes`: disconnect after that
    many bytes (a client that leaves)."""
    start = last = time.monotonic()
    wait = 0.0
    raw = bytearray()
    status, pod, broke = 0, None, False
    try:
        async with session.post(url + "/v1/completions", json=body) as resp:
            status, pod = resp.status, resp.headers.get("x-jitserve-pod")
            now = time.monotonic()
            wait, last = now - start, now
            async for chunk in resp.content.iter_any():
                now = time.monotonic()
                wait, last = max(wait, now - last), now
                if not raw and on_first_byte is not None:
                    on_first_byte()
                raw += chunk
                if leave_after_bytes and len(raw) >= leave_after_bytes:
                    return Outcome("left", status, None, wait, now - start, 0, pod)
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError):
        broke = True
    except TimeoutError:
        pass  # lost (the client timeout is far above every bound)
    end = time.monotonic()
    wait = max(wait, end - last)
    kind, code, tokens = classify(status, bytes(raw), broke)
    if status == 0 and not broke:
        kind = "lost"
    return Outcome(kind, status, code, wait, end - start, tokens, pod)


def session(connections: int = 0, timeout_s: float = 300.0) -> aiohttp.ClientSession:
    """A client session; the timeout only ends a hang (every bound asserted is far below it)."""
    connector = aiohttp.TCPConnector(limit=connections, force_close=True)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s))


def body(i: int, tokens: int, slo: bool = False) -> dict[str, Any]:
    b: dict[str, Any] = {"model": MODEL, "prompt": f"p{i}", "max_tokens": tokens, "stream": True}
    if slo:
        b["slo_class"] = "deadline"  # built-in class: deadline SLO, rejected (429) if unattainable
    return b


# -- processes ----------------------------------------------------------------------------------------------
@dataclass
class RouterProcess:
    """`jitserve router` in a process of its own, in front of `engines`."""

    engines: list[str]
    args: list[str] = field(default_factory=list)
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    _log: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, ready: int = 1, timeout: float = 90.0) -> RouterProcess:
        return self.launch().wait_ready(ready, timeout)

    def launch(self) -> RouterProcess:
        """Start the process and return at once (it polls its engines until they answer)."""
        cmd = [
            sys.executable,
            "-m",
            "jitserve.main",
            "router",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        cmd += ["--engines", ",".join(self.engines), "--log-level", "warning", *self.args]
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT)
        return self

    def wait_ready(self, ready: int = 1, timeout: float = 90.0) -> RouterProcess:
        """Until `ready` engines are usable (the router has polled them)."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                counts = httpx.get(self.url + "/readyz", timeout=2).json()["replicas"]
                if counts["fresh"] + counts["stateless"] >= ready:
                    return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(f"router did not get ready:\n{self.output()}")

    def output(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-4000:]

    def rss(self) -> int:
        assert self.proc is not None
        return int(psutil.Process(self.proc.pid).memory_info().rss)

    def status(self) -> dict[str, Any]:
        return httpx.get(self.url + "/jitserve/status", timeout=10).json()

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        if self._log is not None:
            self._log.close()
            self._log = None


@contextlib.contextmanager
def engines(*specs: tuple[str, int, float]) -> Iterator[list[TrackingEngineProcess]]:
    """Start FAKE engine processes (name, tokens, token delay) side by side; always stopped (SIGCONT
    first) at the end."""
    started = [
        TrackingEngineProcess(name, tokens=tokens, token_delay_s=delay) for name, tokens, delay in specs
    ]
    try:
        for e in started:
            e.launch()
        for e in started:
            e.wait_started()
        yield started
    finally:
        for e in started:
            e.stop()


@contextlib.contextmanager
def router(engine_urls: list[str], *args: str, ready: int = 1) -> Iterator[RouterProcess]:
    r = RouterProcess(engine_urls, list(args))
    try:
        yield r.start(ready=ready)
    finally:
        r.stop()


@contextlib.contextmanager
def stack(
    specs: list[tuple[str, int, float]], *args: str
) -> Iterator[tuple[RouterProcess, list[TrackingEngineProcess]]]:
    """Engines and a router in front of all of them, their processes started side by side (on a loaded
    machine each takes seconds just to import), the router ready with every engine usable."""
    started = [
        TrackingEngineProcess(name, tokens=tokens, token_delay_s=delay) for name, tokens, delay in specs
    ]
    r = RouterProcess([e.url for e in started], list(args))
    try:
        for e in started:
            e.launch()
        r.launch()
        for e in started:
            e.wait_started()
        yield r.wait_ready(len(started)), started
    finally:
        r.stop()
        for e in started:
            e.stop()


class RssSampler:
    """The router's peak RSS, sampled every `interval` s in a thread while the block runs."""

    def __init__(self, r: RouterProcess, interval: float = 0.1) -> None:
        self.router, self.interval, self.peak = r, interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(psutil.Error):
                self.peak = max(self.peak, self.router.rss())
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(5)


def wait_until(fn: Callable[[], bool], what: str, timeout: float = 60.0) -> float:
    """Seconds until `fn()` holds (fails after `timeout`: a hang, never a speed check)."""
    start = time.monotonic()
    while not fn():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"gave up waiting: {what}")
        time.sleep(0.02)
    return time.monotonic() - start


# -- results ------------------------------------------------------------------------------------------------
@dataclass
class ScenarioResult:
    name: str
    bound_s: float | None  # the documented bound on Outcome.wait_s, None where the docs give none
    outcomes: list[Outcome] = field(default_factory=list)
    rss_before: int = 0
    rss_peak: int = 0
    rss_after: int = 0
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def kinds(self) -> dict[str, int]:
        return dict(Counter(o.kind for o in self.outcomes))

    @property
    def lost(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.kind == "lost"]

    @property
    def max_wait_s(self) -> float:
        return max((o.wait_s for o in self.outcomes), default=0.0)

    def codes(self) -> dict[str, int]:
        return dict(Counter(o.code for o in self.outcomes if o.code))


async def _gather_streams(
    url: str, bodies: list[dict[str, Any]], spread_s: float = 0.0, connections: int = 0
) -> list[Outcome]:
    async with session(connections) as s:

        async def one(i: int, b: dict[str, Any]) -> Outcome:
            if spread_s:
                await asyncio.sleep(spread_s * i / max(1, len(bodies)))
            return await stream_one(s, url, b)

        return await asyncio.gather(*(one(i, b) for i, b in enumerate(bodies)))


def _run_load_with_fault(
    r: RouterProcess,
    bodies: list[dict[str, Any]],
    spread_s: float,
    fault_at: Callable[[], bool],
    fault: Callable[[], None],
) -> tuple[list[Outcome], float]:
    """Stream `bodies` (spread over `spread_s`) through the router; call `fault()` once `fault_at()` holds
    (checked from a thread). Returns the outcomes and the monotonic time of the fault."""
    faulted: list[float] = []

    def trigger() -> None:
        wait_until(fault_at, "the load to reach the engine before the fault")
        fault()
        faulted.append(time.monotonic())

    thread = threading.Thread(target=trigger, daemon=True)
    thread.start()
    outcomes = asyncio.run(_gather_streams(r.url, bodies, spread_s))
    thread.join(60)
    assert faulted, "the fault never happened"
    return outcomes, faulted[0]


# -- engine faults under load -------------------------------------------------------------------------------
def engine_killed(streams: int = 40, tokens: int = 60, delay: float = 0.05) -> ScenarioResult:
    """kill -9 one of two engines while `streams` streams (half best-effort, half deadline SLO) run on
    both; then `streams // 4` more requests. Streams that had sent tokens end with an error event,
    the others are retried on the survivor."""
    res = ScenarioResult("engine kill -9 under load", KILLED_ENGINE_BOUND_S)
    with stack([("a", tokens, delay), ("b", tokens, delay)]) as (r, (a, b)):
        res.rss_before = r.rss()
        bodies = [body(i, tokens, slo=i % 2 == 1) for i in range(streams)]
        with RssSampler(r) as rss:
            outcomes, _ = _run_load_with_fault(
                r, bodies, 1.0, lambda: a.stats()["open"] >= 3 and b.stats()["open"] >= 3, a.kill
            )
            after = asyncio.run(_gather_streams(r.url, [body(i, 4) for i in range(streams // 4)]))
        res.outcomes = outcomes + after
        res.rss_peak, res.rss_after = rss.peak, r.rss()
        res.figures["after_kill_on_survivor"] = sum(o.pod == b.url.split("://")[1] for o in after)
        res.figures["after_kill"] = len(after)
        res.figures["router_saw_down"] = r.status()["replicas"][a.url.split("://")[1]]["health"]
    return res


def engine_stopped(streams: int = 30, tokens: int = 80, delay: float = 0.05) -> ScenarioResult:
    """SIGSTOP one of two engines while streams run on both (default router flags: the documented
    bound applies); requests keep arriving across the stop for 2 s."""
    res = ScenarioResult("engine SIGSTOP under load", HUNG_ENGINE_BOUND_S)
    with stack([("a", tokens, delay), ("b", tokens, delay)]) as (r, (a, b)):
        res.rss_before = r.rss()
        bodies = [body(i, tokens, slo=i % 2 == 1) for i in range(streams)]
        stopped: list[float] = []

        def stop() -> None:
            a.pause()
            stopped.append(time.monotonic())

        with RssSampler(r) as rss:
            outcomes, _ = _run_load_with_fault(
                r, bodies, 4.0, lambda: a.stats()["open"] >= 3 and b.stats()["open"] >= 3, stop
            )
        res.outcomes = outcomes
        res.rss_peak, res.rss_after = rss.peak, r.rss()
        replica = r.status()["replicas"][a.url.split("://")[1]]
        res.figures["router_saw"] = {"health": replica["health"], "unresponsive": replica.get("unresponsive")}
        a.resume()
        res.figures["back_after_sigcont_s"] = wait_until(
            lambda: r.status()["replicas"][a.url.split("://")[1]]["health"] == "fresh", "SIGCONT: back"
        )
    return res


# -- the router killed mid-stream ---------------------------------------------------------------------------
def router_killed(streams: int = 6) -> ScenarioResult:
    """`streams` long streams on one engine; one client leaves mid-stream (the router must cut the
    engine's stream), then the router is killed (-9) mid-stream: the engine must see every stream's
    client go (it stops generating: vLLM aborts such a request). A new router then serves again."""
    res = ScenarioResult("router kill -9 mid-stream", None)
    with engines(("a", 100_000, 0.05)) as (a,):
        # the router that takes over afterwards starts beside the first (a process start takes seconds here)
        r, r2 = RouterProcess([a.url]).launch(), RouterProcess([a.url]).launch()
        try:
            r.wait_ready()
            res.rss_before = r.rss()

            async def go() -> list[Outcome]:
                async with session() as s:
                    leaver = asyncio.create_task(
                        stream_one(s, r.url, body(0, 100_000), leave_after_bytes=2000)
                    )
                    tasks = [
                        asyncio.create_task(stream_one(s, r.url, body(i, 100_000))) for i in range(1, streams)
                    ]
                    left = await leaver
                    t0 = time.monotonic()
                    await asyncio.to_thread(
                        wait_until, lambda: a.stats()["aborted"] >= 1, "the engine to see the client leave"
                    )
                    res.figures["engine_abort_after_client_left_s"] = time.monotonic() - t0
                    await asyncio.to_thread(
                        wait_until, lambda: a.stats()["open"] == streams - 1, "the other streams running"
                    )
                    res.rss_after = r.rss()
                    r.kill()
                    t1 = time.monotonic()
                    await asyncio.to_thread(
                        wait_until,
                        lambda: a.stats()["aborted"] == streams,
                        "the engine to abort every stream",
                    )
                    res.figures["engine_abort_after_router_kill_s"] = time.monotonic() - t1
                    return [left, *await asyncio.gather(*tasks)]

            res.outcomes = asyncio.run(go())
            res.figures["engine_stats"] = a.stats()
            again = asyncio.run(_gather_streams(r2.wait_ready().url, [body(0, 4)]))
            res.figures["new_router_serves"] = again[0].kind
        finally:
            r.stop()
            r2.stop()
    return res


# -- a burst ------------------------------------------------------------------------------------------------
def burst(streams: int = 2000, tokens: int = 2) -> ScenarioResult:
    """`streams` plain (best-effort) streams at once against two engines: all queue in the router's
    best-effort queue (2048) and are served, none is refused or marked failed, no engine goes down."""
    res = ScenarioResult(f"burst of {streams} streams", None)
    with stack([("a", tokens, 0.0), ("b", tokens, 0.0)]) as (r, (a, b)):
        res.rss_before = r.rss()
        t0 = time.monotonic()
        with RssSampler(r) as rss:
            res.outcomes = asyncio.run(
                _gather_streams(r.url, [body(i, tokens) for i in range(streams)], connections=streams)
            )
        res.figures["burst_s"] = time.monotonic() - t0
        res.rss_peak = rss.peak
        time.sleep(1.0)  # let the finished requests' state go
        res.rss_after = r.rss()
        res.figures["engines"] = {
            e.name: r.status()["replicas"][e.url.split("://")[1]]["health"] for e in (a, b)
        }
    return res


# -- the operator killed mid-reconcile ----------------------------------------------------------------------
CHILDREN = [  # (api version, kind, name suffix): one of each per pool
    ("v1", "ConfigMap", "classes"),
    ("v1", "ServiceAccount", "router"),
    ("rbac.authorization.k8s.io/v1", "Role", "router"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding", "router"),
    ("v1", "Service", "engine"),
    ("v1", "Service", "router"),
    ("apps/v1", "Deployment", "engine"),
    ("apps/v1", "Deployment", "router"),
    ("networking.k8s.io/v1", "NetworkPolicy", "engine"),
]


@dataclass
class OperatorProcess:
    kubeconfig: Path
    proc: subprocess.Popen | None = None
    _log: Any = None

    def start(self) -> OperatorProcess:
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig))
        cmd = [sys.executable, "-m", "jitserve.main", "operator", "-A", "--resync-seconds", "2"]
        # no router runs: its status URL refuses at once instead of waiting on cluster DNS
        cmd += ["--router-status-url", "http://127.0.0.1:9/{namespace}/{pool}"]
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT)
        return self

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def output(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


def operator_killed(pools: int = 8) -> ScenarioResult:
    """Apply `pools` ServingPools, SIGKILL the operator as soon as the first child exists (mid-reconcile:
    the rest is not created yet), start it again: every pool converges (all children, Ready, status of
    its generation) with exactly one of each child, none duplicated or orphaned."""
    import kubernetes
    import yaml

    from jitserve.operator import api
    from jitserve.operator.kube import Kube
    from tests.emulated import EmulatedCluster, EmulatedDeploymentController

    res = ScenarioResult("operator SIGKILL mid-reconcile", None)
    kubeconfig = Path(tempfile.mkdtemp(prefix="faults-kube-")) / "config"
    with EmulatedCluster(kubeconfig) as cluster:
        kube = Kube(kubernetes.config.new_client_from_config(config_file=str(kubeconfig)))
        for crd in sorted((ROOT / "crds").glob("*.yaml")):
            kube._call(
                "POST",
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                yaml.safe_load(crd.read_text()),
            )  # noqa: SLF001
        for doc in yaml.safe_load_all((ROOT / "docs" / "examples" / "slo-class.yaml").read_text()):
            kube.create(doc)
        ns = "faults"
        kube._call(
            "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
        )  # noqa: SLF001
        names = [f"pool-{i}" for i in range(pools)]
        template = yaml.safe_load((ROOT / "docs" / "examples" / "servingpool.yaml").read_text())

        def count_children() -> int:
            """Objects in the namespace owned by a ServingPool (the server's own view, no client cache)."""
            return sum(
                any(ref.get("kind") == "ServingPool" for ref in obj["metadata"].get("ownerReferences") or [])
                for obj in cluster.objects(namespace=ns)
            )

        op = OperatorProcess(kubeconfig).start()
        with EmulatedDeploymentController(kube):
            try:
                for name in names:
                    kube.create({**template, "metadata": {"name": name, "namespace": ns}})
                wait_until(lambda: count_children() > 0, "the operator's first child", timeout=120)
                op.kill()
                res.figures["children_at_kill"] = count_children()
                res.figures["children_expected"] = pools * len(CHILDREN)
                t0 = time.monotonic()
                op = OperatorProcess(kubeconfig).start()

                def converged() -> bool:
                    for name in names:
                        obj = kube.get(api.API_VERSION, api.SERVINGPOOL_KIND, ns, name) or {}
                        status = obj.get("status") or {}
                        ready = [c for c in status.get("conditions") or [] if c["type"] == "Ready"]
                        if not ready or ready[0]["status"] != "True":
                            return False
                        if status.get("observedGeneration") != obj["metadata"]["generation"]:
                            return False
                    return True

                wait_until(converged, "every pool Ready after the restart", timeout=180)
                res.figures["convergence_s"] = time.monotonic() - t0
                res.figures["duplicates"], res.figures["missing"] = duplicates_and_missing(kube, ns, names)
            except BaseException:
                print(op.output(), file=sys.stderr)
                raise
            finally:
                op.stop()
    return res


def duplicates_and_missing(kube: Any, ns: str, names: list[str]) -> tuple[list[str], list[str]]:
    """Children beyond one of each per pool (whatever their names, found by owner), orphans, missing ones."""
    from jitserve.operator import api

    uids = {kube.get(api.API_VERSION, api.SERVINGPOOL_KIND, ns, n)["metadata"]["uid"]: n for n in names}
    kinds: dict[tuple[str, str], list[str]] = {}
    for version, kind, suffix in CHILDREN:
        kinds.setdefault((version, kind), []).append(suffix)
    dups, missing = [], []
    for (version, kind), suffixes in kinds.items():
        seen: set[str] = set()
        for obj in kube.list(version, kind, ns):
            name, refs = obj["metadata"]["name"], obj["metadata"].get("ownerReferences") or []
            owners = [uids[ref["uid"]] for ref in refs if ref.get("uid") in uids]
            if not refs and not name.startswith("pool-"):
                continue  # not the operator's (none exist in the emulated cluster, but a real one has some)
            if len(refs) != 1 or not owners:
                dups.append(f"{kind}/{name}: owners {refs}")
            elif name not in {f"{owners[0]}-{s}" for s in suffixes}:
                dups.append(f"{kind}/{name}: an extra child of {owners[0]}")
            else:
                seen.add(name)
        missing += [f"{kind}/{n}-{s}" for n in names for s in suffixes if f"{n}-{s}" not in seen]
    return dups, missing
