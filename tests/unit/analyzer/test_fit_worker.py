"""The QRF fit's child process (router and engine): niced, and gone when its parent dies.

Real processes, no mocks: a parent process starts the pool router and engine fit in
(`refit.niced_fit_pool`, `BackgroundRefit`'s default), the test SIGKILLs that parent (what the OOM
killer or `kubectl delete --force` does), and the idle worker must not outlive it. Before
`fit_worker_init`, such workers stayed behind for good, each holding the ~150 MB of an imported
analyzer.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

_PARENT = """
import os, time
from jitserve.scheduler.analyzer.refit import niced_fit_pool

if __name__ == "__main__":
    pool = niced_fit_pool()
    print(pool.submit(os.getpid).result(), flush=True)
    time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def test_fit_worker_is_niced_and_dies_with_its_parent() -> None:
    parent = subprocess.Popen([sys.executable, "-c", _PARENT], stdout=subprocess.PIPE, text=True)
    worker = 0
    try:
        assert parent.stdout is not None
        worker = int(parent.stdout.readline())
        assert worker != parent.pid and _alive(worker)
        assert os.getpriority(os.PRIO_PROCESS, worker) >= 19
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 30  # an exit, not a timing: the signal is delivered at once
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(worker), "the fit worker outlived its SIGKILLed parent"
    finally:
        parent.kill()
        if worker and _alive(worker):
            os.kill(worker, signal.SIGKILL)
