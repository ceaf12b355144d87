"""The QRF fit's child interpreter (router and engine, `refit.fit_in_child`): niced, a fresh interpreter
that never imports its parent's main module, and gone when its parent dies.

Real processes, no mocks: a parent process (its main module a stand-in for vLLM's API server: importing
it leaves a mark) starts a fit the way `BackgroundRefit` does, on a history big enough to keep the child
fitting for a while; the test finds the child, checks it, SIGKILLs the parent (what the OOM killer or
`kubectl delete --force` does), and the child must not outlive it. A `multiprocessing` worker spawned
from vLLM's engine core re-imported vLLM's API server as its main module: about 10 s of CPU per engine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

_PARENT = """
import os, sys, threading, time
import numpy as np
from jitserve.scheduler.analyzer.length import LengthPredictor, LengthPredictorConfig
from jitserve.scheduler.analyzer.refit import fit_in_child

if os.environ.get("FIT_PARENT_STARTED"):  # this main module, imported again in a child (as __mp_main__)
    open(os.environ["FIT_MARKER"], "w").close()

if __name__ == "__main__":
    marker = os.environ["FIT_MARKER"]
    os.environ["FIT_PARENT_STARTED"] = "1"
    rng = np.random.default_rng(0)
    p = LengthPredictor(LengthPredictorConfig(n_estimators=300, min_samples_leaf=5))
    for _ in range(5000):
        p.observe(int(rng.integers(10, 4000)), int(rng.integers(50, 2000)), 0, 0, 0, 2048)
    src = marker + ".in.npz"
    p.save(src)
    threading.Thread(target=fit_in_child, args=(src, marker + ".out.npz"), daemon=True).start()
    print("started", flush=True)
    time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def _fit_child_of(parent: int) -> int | None:
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if ppid == parent and b"jitserve.scheduler.analyzer.refit" in cmd:
            return int(entry)
    return None


def test_fit_child_is_niced_fresh_and_dies_with_its_parent(tmp_path: Path) -> None:
    marker = tmp_path / "main-imported"
    script = tmp_path / "parent_main.py"
    script.write_text(_PARENT)
    env = {**os.environ, "FIT_MARKER": str(marker)}
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    child = None
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "started"
        deadline = time.monotonic() + 60  # not a timing: the child starts at once and fits for seconds
        while child is None and time.monotonic() < deadline:
            child = _fit_child_of(parent.pid)
            time.sleep(0.02)
        assert child is not None, "no fit child started"
        while os.getpriority(os.PRIO_PROCESS, child) < 19 and time.monotonic() < deadline:
            time.sleep(0.02)  # it nices itself first thing
        assert os.getpriority(os.PRIO_PROCESS, child) >= 19
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 30  # an exit, not a timing: the signal is delivered at once
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "the fit child outlived its SIGKILLed parent"
        assert not marker.exists(), "the fit child imported its parent's main module"
    finally:
        parent.kill()
        if child and _alive(child):
            os.kill(child, signal.SIGKILL)
