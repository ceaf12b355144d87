"""Router overhead benchmark: added latency and throughput at a fixed streaming request rate, and RSS
with thousands of concurrent streams, for `jitserve router` and the Rust `vllm-router` (PyPI) in front
of the same FAST FAKE backend (a raw-asyncio OpenAI-style server that streams canned tokens; no model).

    python bench/router.py latency --rate 200 --duration 20 [--vllm-router /tmp/vr-venv/bin/vllm-router]
    python bench/router.py memory --streams 2000 [--vllm-router ...]
    python bench/router.py all --json docs/benchmarks/router.json

Added latency = percentile via the router - the same percentile sent straight to the backend, measured
by the same client in the same run (client overhead cancels). TTFT = time to the first streamed chunk;
E2E = time to the end of the stream. Each process is its own OS process; everything is killed at exit.
Results are printed as a table and optionally written as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MODEL = "bench-model"
# An idle, very fast engine: placement always finds room, so the benchmark measures the proxy path.
STATE = {
    "pod": "bench-backend", "model": MODEL, "step_time_s": 0.001, "prefill_tokens_per_s": 1e6,
    "batch_size": 4096, "running": 0, "waiting": 0, "committed_bandwidth": 0.0, "residual_capacity": 4096.0,
    "admission_priority": 0.0, "queue_delay_s": 0.0, "kv_usage": 0.0, "cutoff": 0.95, "frames": 1,
    "updated_at": 0.0,
}  # fmt: skip
SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
JSON_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"


# ---------------------------------------------------------------------------------- fake backend
async def _backend(port: int, tokens: int, interval: float) -> None:
    """A minimal HTTP/1.1 keep-alive server: /health, /v1/models, /jitserve/state, completions."""
    event = (
        b'data: {"id":"b","object":"text_completion","created":0,"model":"' + MODEL.encode()
        + b'","choices":[{"index":0,"text":" tok","finish_reason":null}]}\n\n'
    )  # fmt: skip
    last_event = event.replace(b'"finish_reason":null', b'"finish_reason":"length"')  # as vLLM ends streams
    models = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode()

    def chunk(data: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(data), data)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line, _, rest = head.partition(b"\r\n")
                method, path, _ = line.split(b" ", 2)
                length = 0
                for h in rest.split(b"\r\n"):
                    if h[:15].lower() == b"content-length:":
                        length = int(h[15:])
                body = await reader.readexactly(length) if length else b""
                if method == b"POST":
                    stream = b'"stream":true' in body.replace(b" ", b"")
                    if stream:
                        writer.write(SSE_HEAD)
                        for i in range(tokens):
                            writer.write(chunk(last_event if i == tokens - 1 else event))
                            if interval:  # slow streams: one event per interval
                                await writer.drain()
                                await asyncio.sleep(interval)
                        writer.write(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
                    else:
                        usage = {"prompt_tokens": 4, "completion_tokens": tokens, "total_tokens": 4 + tokens}
                        choice = {"index": 0, "text": " tok" * tokens, "finish_reason": "length"}
                        doc = {"id": "b", "object": "text_completion", "model": MODEL, "choices": [choice]}
                        payload = json.dumps({**doc, "usage": usage}).encode()
                        writer.write(JSON_HEAD % len(payload) + payload)
                else:
                    if path.startswith(b"/v1/models"):
                        payload = models
                    elif path.startswith(b"/jitserve/state"):
                        payload = json.dumps({**STATE, "updated_at": time.time()}).encode()
                    else:
                        payload = b"{}"
                    writer.write(JSON_HEAD % len(payload) + payload)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


# ---------------------------------------------------------------------------------- processes
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Proc:
    name: str
    port: int
    popen: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def rss_mb(self) -> float:
        import psutil

        p = psutil.Process(self.popen.pid)
        return sum(c.memory_info().rss for c in [p, *p.children(recursive=True)]) / 2**20

    def cpu_s(self) -> float:
        """User + system CPU seconds of the process and its children so far."""
        import psutil

        p = psutil.Process(self.popen.pid)
        total = 0.0
        for proc in [p, *p.children(recursive=True)]:
            t = proc.cpu_times()
            total += t.user + t.system
        return total

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait()


# `--proxy-cpus`: the CPUs the proxies under test run on (the load client and backends keep the rest)
PROXY_CPUS: set[int] = set()


def spawn(
    name: str, cmd: list[str], port: int, log_dir: Path, health: str, env: dict[str, str] | None = None
) -> Proc:
    import httpx

    log = open(log_dir / f"{name}.log", "wb")  # noqa: SIM115 (the child owns it)
    pin = None
    if PROXY_CPUS and not name.startswith(("backend", "slow-backend")):
        pin = lambda: os.sched_setaffinity(0, PROXY_CPUS)  # noqa: E731 (runs in the child)
    popen = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env, preexec_fn=pin
    )
    p = Proc(name, port, popen)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if p.popen.poll() is not None:
            raise RuntimeError(f"{name} exited; see {log_dir / (name + '.log')}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(p.url + health, timeout=1).status_code == 200:
                return p
        time.sleep(0.2)
    p.stop()
    raise RuntimeError(f"{name} not ready; see {log_dir / (name + '.log')}")


def start_backend(log_dir: Path, tokens: int, interval: float, name: str = "backend") -> Proc:
    port = free_port()
    cmd = [
        sys.executable,
        __file__,
        "backend",
        "--port",
        str(port),
        "--tokens",
        str(tokens),
        "--interval",
        str(interval),
    ]
    return spawn(name, cmd, port, log_dir, "/health")


def start_jitserve(
    backends: list[Proc], log_dir: Path, extra: list[str], checkout: str | None = None
) -> Proc:
    """`jitserve router` from this checkout, or (A/B runs) from another git checkout of the project."""
    port = free_port()
    engines = ",".join(b.url for b in backends)
    cmd = [sys.executable, "-m", "jitserve.main", "router", "--engines", engines, "--port", str(port),
           "--host", "127.0.0.1", "--log-level", "warning", *extra]  # fmt: skip
    env = None
    name = "jitserve-router"
    if checkout is not None:
        # `jitserve` is the checkout's cli/ folder (its __init__ adds the checkout root); a package on
        # PYTHONPATH wins over the venv's editable finder, which maps `jitserve` to this checkout.
        shim = log_dir / "baseline-shim"
        shim.mkdir(parents=True, exist_ok=True)
        link = shim / "jitserve"
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(Path(checkout).resolve() / "cli", target_is_directory=True)
        env = {**os.environ, "PYTHONPATH": str(shim)}
        name = "jitserve-baseline"
    return spawn(name, cmd, port, log_dir, "/readyz", env=env)


def start_floor(mode: str, backends: list[Proc], log_dir: Path) -> Proc:
    """A reference proxy (bench/proxy_floor.py): a Python proxy's floor, or one layer of the router's."""
    port = free_port()
    cmd = [sys.executable, str(Path(__file__).with_name("proxy_floor.py")), "--mode", mode,
           "--engines", ",".join(b.url for b in backends), "--port", str(port)]  # fmt: skip
    return spawn(f"floor-{mode}", cmd, port, log_dir, "/health")


def start_vllm_router(binary: str, backends: list[Proc], log_dir: Path) -> Proc:
    port = free_port()
    cmd = [binary, "--worker-urls", *(b.url for b in backends), "--port", str(port), "--host", "127.0.0.1",
           "--policy", "power_of_two", "--log-level", "warning", "--health-check-endpoint", "/health",
           "--prometheus-port", str(free_port())]  # fmt: skip
    return spawn("vllm-router", cmd, port, log_dir, "/health")


# ---------------------------------------------------------------------------------- load
@dataclass
class Result:
    target: str
    sent: int = 0
    ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    ttft: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    wall_s: float = 0.0

    def pct(self, values: list[float], q: float) -> float:
        import numpy as np

        return float(np.percentile(values, q)) * 1000 if values else float("nan")

    def summary(self) -> dict[str, Any]:
        return {
            "target": self.target, "sent": self.sent, "ok": self.ok, "errors": self.errors,
            "throughput_rps": self.ok / self.wall_s if self.wall_s else 0.0,
            "ttft_p50_ms": self.pct(self.ttft, 50), "ttft_p99_ms": self.pct(self.ttft, 99),
            "e2e_p50_ms": self.pct(self.e2e, 50), "e2e_p99_ms": self.pct(self.e2e, 99),
        }  # fmt: skip


class Conn:
    """One keep-alive HTTP/1.1 connection of the load client (raw asyncio: a Python HTTP library
    would add more per-chunk overhead than the routers being measured)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def stream(self, head: bytes, body: bytes) -> tuple[int, float | None]:
        """Send one request; read the whole (chunked or sized) response. (status, first-chunk time)."""
        self.writer.write(head + body)
        await self.writer.drain()
        r = self.reader
        status_line = await r.readuntil(b"\r\n")
        status = int(status_line.split(b" ", 2)[1])
        headers = (await r.readuntil(b"\r\n\r\n")).lower()
        first = None
        if b"transfer-encoding: chunked" in headers:
            while True:
                size = int((await r.readuntil(b"\r\n")).strip().split(b";")[0], 16)
                if first is None:
                    first = time.perf_counter()
                await r.readexactly(size + 2)
                if size == 0:
                    break
        else:
            length = 0
            for line in headers.split(b"\r\n"):
                if line.startswith(b"content-length:"):
                    length = int(line[15:])
            await r.readexactly(length)
            first = time.perf_counter()
        if b"connection: close" in headers:
            raise ConnectionResetError("server closed the connection")
        return status, first


class Client:
    def __init__(self, url: str) -> None:
        host, port = url.split("://", 1)[1].split(":")
        self.host, self.port = host, int(port)
        self.idle: list[Conn] = []

    async def request(self, path: str, body: bytes) -> tuple[int, float | None]:
        conn = self.idle.pop() if self.idle else Conn(*await asyncio.open_connection(self.host, self.port))
        head = (
            f"POST {path} HTTP/1.1\r\nhost: {self.host}:{self.port}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        ).encode()
        try:
            result = await conn.stream(head, body)
        except BaseException:
            conn.writer.close()
            raise
        self.idle.append(conn)
        return result

    def close(self) -> None:
        for c in self.idle:
            c.writer.close()


async def _one(client: Client, res: Result, body: bytes) -> None:
    t0 = time.perf_counter()
    try:
        status, first = await client.request("/v1/completions", body)
        end = time.perf_counter()
    except Exception as exc:  # counted, never fatal: a benchmark reports failures
        res.errors[type(exc).__name__] = res.errors.get(type(exc).__name__, 0) + 1
        return
    if status != 200:
        res.errors[str(status)] = res.errors.get(str(status), 0) + 1
        return
    res.ok += 1
    res.ttft.append((first or end) - t0)
    res.e2e.append(end - t0)


async def constant_rate(target: str, url: str, rate: float, duration: float, tokens: int) -> Result:
    payload = {
        "model": MODEL,
        "prompt": "hello",
        "max_tokens": tokens,
        "stream": True,
        "slo_class": "best-effort",
    }
    body = json.dumps(payload).encode()
    res = Result(target)
    client = Client(url)
    # warm-up: open connections and warm code paths, not measured
    await asyncio.gather(*(_one(client, Result("warm"), body) for _ in range(50)))
    tasks = []
    start = time.perf_counter()
    n = int(rate * duration)
    for i in range(n):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        res.sent += 1
        tasks.append(asyncio.create_task(_one(client, res, body)))
    await asyncio.gather(*tasks)
    res.wall_s = time.perf_counter() - start
    client.close()
    return res


async def hold_streams(url: str, streams: int, proc: Proc, ramp_s: float) -> dict[str, Any]:
    """Open `streams` concurrent slow streams through `url`; sample the router's RSS at the peak."""
    import httpx

    body = json.dumps({"model": MODEL, "prompt": "hello", "max_tokens": 10_000, "stream": True}).encode()
    opened = 0
    failed: dict[str, int] = {}
    peak_rss = proc.rss_mb()
    base_rss = peak_rss
    limits = httpx.Limits(max_connections=streams + 16, max_keepalive_connections=streams + 16)

    async def hold(client: httpx.AsyncClient, stop: asyncio.Event) -> None:
        nonlocal opened
        try:
            async with client.stream("POST", url + "/v1/completions", content=body,
                                     headers={"content-type": "application/json"}) as resp:  # fmt: skip
                if resp.status_code != 200:
                    failed[str(resp.status_code)] = failed.get(str(resp.status_code), 0) + 1
                    return
                opened += 1
                async for _ in resp.aiter_raw():
                    if stop.is_set():
                        return
        except Exception as exc:
            failed[type(exc).__name__] = failed.get(type(exc).__name__, 0) + 1

    stop = asyncio.Event()
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        tasks = []
        for _ in range(streams):
            tasks.append(asyncio.create_task(hold(client, stop)))
            await asyncio.sleep(ramp_s / streams)
        t_end = time.monotonic() + 5
        while time.monotonic() < t_end:  # all open: sample for a few seconds
            peak_rss = max(peak_rss, proc.rss_mb())
            await asyncio.sleep(0.25)
        held = opened
        stop.set()
        await asyncio.gather(*tasks)
    return {"target": proc.name, "streams_requested": streams, "streams_open": held, "failed": failed,
            "rss_idle_mb": round(base_rss, 1), "rss_peak_mb": round(peak_rss, 1)}  # fmt: skip


# ---------------------------------------------------------------------------------- commands
def run_latency(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    # Two backends: both routers choose between two workers (vllm-router's power_of_two needs two).
    backends = [start_backend(log_dir, args.tokens, 0.0, f"backend-{i}") for i in range(2)]
    procs = list(backends)
    try:
        targets = [("direct", backends[0].url)]
        jit = start_jitserve(backends, log_dir, args.router_arg or [])
        procs.append(jit)
        targets.append((jit.name, jit.url))
        if args.baseline:
            base = start_jitserve(backends, log_dir, args.router_arg or [], checkout=args.baseline)
            procs.append(base)
            targets.append((base.name, base.url))
        for mode in args.floor or []:
            ref = start_floor(mode, backends, log_dir)
            procs.append(ref)
            targets.append((ref.name, ref.url))
        if args.vllm_router:
            vr = start_vllm_router(args.vllm_router, backends, log_dir)
            procs.append(vr)
            targets.append((vr.name, vr.url))
        by_name = {p.name: p for p in procs}
        rounds = []
        for i in range(args.rounds):
            # Rounds alternate the targets, so a slow spell of a shared machine hits all of them alike.
            results = {}
            for name, url in targets:
                proc = by_name.get(name)
                cpu0 = proc.cpu_s() if proc else 0.0
                res = asyncio.run(constant_rate(name, url, args.rate, args.duration, args.tokens))
                results[name] = res.summary()
                results[name]["loadavg_1m"] = os.getloadavg()[0]
                if proc is not None and res.sent:
                    # CPU per request is robust to a busy machine, unlike latency under CPU contention
                    cpu_ms = (proc.cpu_s() - cpu0) * 1000 / (res.sent + 50)
                    results[name]["router_cpu_ms_per_request"] = cpu_ms
            direct = results["direct"]
            for name, r in results.items():
                if name != "direct":
                    for m in ("ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99"):
                        r[f"added_{m}_ms"] = r[f"{m}_ms"] - direct[f"{m}_ms"]
            rounds.append(results)
            if args.rounds > 1:
                print_latency({"rate": args.rate, "duration_s": args.duration, "tokens": args.tokens,
                               "results": results}, title=f"round {i + 1}/{args.rounds}")  # fmt: skip
        out = {"rate": args.rate, "duration_s": args.duration, "tokens": args.tokens, "results": rounds[-1]}
        if args.rounds > 1:
            out["rounds"] = rounds
        return out
    finally:
        for p in reversed(procs):
            p.stop()


def run_memory(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    # slow streams (one token per second) so every stream stays open while RSS is sampled
    backends = [start_backend(log_dir, 10_000, 1.0, f"slow-backend-{i}") for i in range(2)]
    out = []
    try:
        jit = start_jitserve(
            backends, log_dir, ["--max-inflight", str(args.streams + 100), *(args.router_arg or [])]
        )
        try:
            out.append(asyncio.run(hold_streams(jit.url, args.streams, jit, args.ramp)))
        finally:
            jit.stop()
        if args.vllm_router:
            vr = start_vllm_router(args.vllm_router, backends, log_dir)
            try:
                out.append(asyncio.run(hold_streams(vr.url, args.streams, vr, args.ramp)))
            finally:
                vr.stop()
    finally:
        for b in backends:
            b.stop()
    return {"streams": args.streams, "results": out}


def print_latency(res: dict[str, Any], title: str = "") -> None:
    print(f"\n{title + ': ' if title else ''}streaming completions at {res['rate']} req/s for "
          f"{res['duration_s']} s, {res['tokens']} chunks")  # fmt: skip
    print(f"{'target':18} {'ok/sent':>11} {'rps':>7} {'TTFT p50':>9} {'p99':>8} {'E2E p50':>8} {'p99':>8}"
          f" {'added TTFT p50':>15} {'p99':>7}")  # fmt: skip
    for name, r in res["results"].items():
        added = f"{r['added_ttft_p50_ms']:15.2f} {r['added_ttft_p99_ms']:7.2f}" if name != "direct" else ""
        print(f"{name:18} {r['ok']:>5}/{r['sent']:<5} {r['throughput_rps']:7.1f} {r['ttft_p50_ms']:9.2f}"
              f" {r['ttft_p99_ms']:8.2f} {r['e2e_p50_ms']:8.2f} {r['e2e_p99_ms']:8.2f} {added}"
              + (f"  cpu/req={r.get('router_cpu_ms_per_request', 0):.2f} ms" if name != "direct" else "")
              + (f"  errors={r['errors']}" if r["errors"] else ""))  # fmt: skip


def print_rounds(rounds: list[dict[str, Any]]) -> None:
    """Medians over the rounds of each target's per-round numbers."""
    import statistics

    print(f"\nmedian of {len(rounds)} rounds (ms)")
    print(f"{'target':18} {'added TTFT p50':>15} {'p99':>8} {'added E2E p50':>14} {'cpu/req':>8}"
          "  added TTFT p50 per round")  # fmt: skip
    for name in rounds[0]:
        if name == "direct":
            continue
        rs = [r[name] for r in rounds]

        def med(key: str, rs: list[dict[str, Any]] = rs) -> float:
            return statistics.median(r[key] for r in rs)

        each = " ".join(f"{r['added_ttft_p50_ms']:.2f}" for r in rs)
        print(f"{name:18} {med('added_ttft_p50_ms'):15.2f} {med('added_ttft_p99_ms'):8.2f}"
              f" {med('added_e2e_p50_ms'):14.2f} {med('router_cpu_ms_per_request'):8.2f}"
              f"  {each}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("backend", help="(internal) run the fake backend")
    b.add_argument("--port", type=int, required=True)
    b.add_argument("--tokens", type=int, default=16)
    b.add_argument("--interval", type=float, default=0.0)
    for name in ("latency", "memory", "all"):
        p = sub.add_parser(name)
        p.add_argument("--rate", type=float, default=200.0, help="streaming requests per second")
        p.add_argument("--duration", type=float, default=20.0, help="seconds of load per target")
        p.add_argument("--tokens", type=int, default=16, help="chunks per streamed response")
        p.add_argument("--streams", type=int, default=2000, help="concurrent streams for the memory test")
        p.add_argument("--ramp", type=float, default=10.0, help="seconds to open all streams")
        p.add_argument(
            "--vllm-router", default=None, help="path of the vllm-router binary (pip install vllm-router)"
        )
        p.add_argument(
            "--router-arg", action="append", help="extra argument for jitserve router (repeatable)"
        )
        p.add_argument("--json", default=None, help="write results here")
        p.add_argument(
            "--baseline",
            default=None,
            help="A/B: also run `jitserve router` from this git checkout (e.g. a `git worktree` of an "
            "older commit) as target jitserve-baseline",
        )
        p.add_argument(
            "--floor",
            action="append",
            choices=("raw", "decide", "asgi", "aiohttp"),
            help="latency: also run a reference proxy of bench/proxy_floor.py (repeatable): raw = a Python "
            "proxy's floor; decide = raw + the router's GMAX decision; asgi = uvicorn in front of raw; "
            "aiohttp = uvicorn + aiohttp's client",
        )
        p.add_argument(
            "--proxy-cpus",
            default=None,
            help="pin the routers and reference proxies to these CPUs (e.g. 1 or 2,3) and the load client "
            "and backends to the others, so the proxy under test shares its cores with nothing the run "
            "loads (targets run one at a time; Linux)",
        )
        p.add_argument("--rounds", type=int, default=1, help="latency: repeat all targets, alternating")
        p.add_argument("--log-dir", default="/tmp/bench-router-logs")
    args = parser.parse_args(argv)
    with contextlib.suppress(ImportError):  # the same fast event loop for backend and load client
        import uvloop

        uvloop.install()
    if args.cmd == "backend":
        asyncio.run(_backend(args.port, args.tokens, args.interval))
        return 0
    if args.proxy_cpus:
        usable = os.sched_getaffinity(0)
        try:
            PROXY_CPUS.update(int(c) for c in args.proxy_cpus.split(","))
        except ValueError:
            parser.error(f"--proxy-cpus: comma-separated CPU numbers, got {args.proxy_cpus!r}")
        if PROXY_CPUS - usable:
            parser.error(
                f"--proxy-cpus: CPUs {sorted(PROXY_CPUS - usable)} are not usable here ({sorted(usable)})"
            )
        rest = usable - PROXY_CPUS
        if not rest:
            parser.error("--proxy-cpus: leave at least one CPU for the load client and the backends")
        os.sched_setaffinity(0, rest)  # the load client; the backends inherit it
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"cpus": os.cpu_count(), "loadavg_before": os.getloadavg()}
    if args.cmd in ("latency", "all"):
        out["latency"] = run_latency(args, log_dir)
        if "rounds" in out["latency"]:
            print_rounds(out["latency"]["rounds"])
        else:
            print_latency(out["latency"])
    if args.cmd in ("memory", "all"):
        out["memory"] = run_memory(args, log_dir)
        for r in out["memory"]["results"]:
            print(
                f"{r['target']:18} streams open {r['streams_open']}/{r['streams_requested']}"
                f"  RSS idle {r['rss_idle_mb']} MB, peak {r['rss_peak_mb']} MB  failed={r['failed']}"
            )
    out["loadavg_after"] = os.getloadavg()
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
