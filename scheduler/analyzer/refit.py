"""Refitting the length predictor off the serving path, paced by what the fits cost.

The router (placement's bounds) and the engine (GMAX's bounds) each learn a `LengthPredictor` from the
requests they see finish. A fit (300 trees) costs seconds of CPU, so it never runs in the serving
process: `BackgroundRefit` saves the predictor as its own .npz (no pickle), fits it in a fresh, niced
Python interpreter (`python -m jitserve.scheduler.analyzer.refit PARENT_PID SRC DST`, waited for by one
background thread), replays the requests that finished meanwhile into the fitted copy and swaps it in.
A fresh interpreter, not a `multiprocessing` worker: a spawned worker re-imports its parent's main
module, which in vLLM's engine core is vLLM's API server (about 10 s of CPU and all of torch, once per
engine), and a forked one would copy the parent's threads mid-state.

When a refit may start (`RefitPacing`): once `LengthPredictor.refit_due()` (enough requests finished
since the last fit), and no sooner than the last fit's CPU time (the child's, start-up included)
divided by `cpu_share` after that fit started, nor sooner than `min_interval_s`. Counting requests
alone made the fits' CPU grow with the request rate (docs/decisions/analyzer.md, "A fit runs in a
fresh interpreter, paced by its CPU cost"). The first fit is not paced: until it, every bound is max_tokens.
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass

from jitserve.scheduler.analyzer.length import LengthPredictor

log = logging.getLogger("jitserve.analyzer")

Row = tuple[int, int, int, int, int, int]  # prompt, output, slo type, class, model, max_tokens


@dataclass(frozen=True, slots=True)
class RefitPacing:
    """How often a refit may start: at most `cpu_share` of one core spent fitting, on average, and at
    most one fit per `min_interval_s`."""

    min_interval_s: float = 60.0
    cpu_share: float = 0.01

    def __post_init__(self) -> None:
        if not (math.isfinite(self.min_interval_s) and self.min_interval_s >= 0):
            raise ValueError(f"min_interval_s: must be a finite number >= 0, got {self.min_interval_s!r}")
        if not (0 < self.cpu_share <= 1):
            raise ValueError(f"cpu_share: must be in (0, 1], got {self.cpu_share!r}")

    def wait_s(self, last_fit_cpu_s: float) -> float:
        """Seconds from the start of a fit that took `last_fit_cpu_s` of CPU to the next one."""
        return max(self.min_interval_s, max(last_fit_cpu_s, 0.0) / self.cpu_share)


class BackgroundRefit:
    """A `LengthPredictor` learning from finished requests, refit in a child process.

    `observe` is called from the serving thread (the router's event loop, the engine's step loop); the
    fit's completion runs on the executor's thread, so both take `_lock`. `on_fitted` gets each fitted
    predictor on that thread (the engine saves it). `clock` is monotonic seconds, injectable for tests.
    `fit(src, dst) -> (fitted, cpu_s)` fits the predictor saved at `src` into `dst` on an `executor`
    thread: by default `fit_in_child`, which only waits there for its child interpreter.
    """

    def __init__(
        self,
        predictor: LengthPredictor,
        pacing: RefitPacing | None = None,
        on_fitted: Callable[[LengthPredictor], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        label: str = "length bounds",
        executor: Callable[[], Executor] | None = None,
        fit: Callable[[str, str], tuple[bool, float]] | None = None,
    ) -> None:
        self.predictor = predictor
        self.pacing = pacing or RefitPacing()
        self.on_fitted = on_fitted
        self.clock = clock
        self.label = label
        self._make_executor = executor or _waiting_thread
        self._fit = fit or fit_in_child
        self.fits_started = 0
        self.fits_finished = 0  # fits that returned, fitted or not (their CPU counts either way)
        self.fit_cpu_s_total = 0.0
        self._lock = threading.Lock()
        self._fitting = False
        self._during_fit: list[Row] = []
        self._last_start = -math.inf
        self._last_cpu_s = 0.0
        self._pool: Executor | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    @property
    def fitting(self) -> bool:
        return self._fitting

    @property
    def last_fit_cpu_s(self) -> float:
        """CPU seconds the last finished fit took, measured in the process that ran it."""
        return self._last_cpu_s

    def next_fit_at(self) -> float:
        """The earliest `clock` time a refit may start (once enough requests have finished)."""
        return self._last_start + self.pacing.wait_s(self._last_cpu_s)

    def observe(self, *row: int) -> None:
        """A request finished: `row` is `LengthPredictor.observe`'s arguments. Starts a fit when one is
        due and the pacing allows."""
        with self._lock:
            self.predictor.observe(*row)
            if self._fitting:
                self._during_fit.append(row)  # type: ignore[arg-type]
                return
            if not self.predictor.refit_due():
                return
            now = self.clock()
            if self.predictor.trained and now < self.next_fit_at():
                return
            self._fitting, self._last_start = True, now
            self.fits_started += 1
        try:
            self._start_fit()
        except Exception:  # no child process here: keep the current bounds, try again later
            log.exception("jitserve: %s refit could not start", self.label)
            with self._lock:
                self._fitting = False

    def _start_fit(self) -> None:
        if self._pool is None:
            self._pool = self._make_executor()
        self._tmp = tempfile.TemporaryDirectory(prefix="jitserve-qrf-")  # removed when the fit ends
        src, dst = os.path.join(self._tmp.name, "in.npz"), os.path.join(self._tmp.name, "out.npz")
        self.predictor.save(src)  # on the serving thread, from `observe`: nothing observes or swaps meanwhile
        future = self._pool.submit(self._fit, src, dst)
        future.add_done_callback(lambda f: self._finish_fit(f, dst))

    def _finish_fit(self, future: Future[tuple[bool, float]], dst: str) -> None:
        """On the executor's thread: swap in the fitted predictor with the rows observed meanwhile."""
        try:
            fitted, cpu_s = future.result()
            with self._lock:
                self._last_cpu_s = cpu_s
                self.fits_finished += 1
                self.fit_cpu_s_total += cpu_s
            if fitted:
                new = LengthPredictor.load(dst)
                with self._lock:
                    for row in self._during_fit:
                        new.observe(*row)
                    self.predictor = new
                log.info(
                    "jitserve: %s refit on %d requests (%.1f s of CPU); the next no sooner than %.0f s",
                    self.label,
                    new.history_size,
                    cpu_s,
                    self.pacing.wait_s(cpu_s),
                )
                if self.on_fitted is not None:
                    self.on_fitted(new)
        except Exception:  # a failed fit keeps the old bounds; the server must keep serving
            log.exception("jitserve: %s refit failed", self.label)
        finally:
            if self._tmp is not None:  # this fit's files: the next fit makes its own
                self._tmp.cleanup()
                self._tmp = None
            with self._lock:
                self._during_fit.clear()
                self._fitting = False

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def _waiting_thread() -> Executor:
    """The one thread a `BackgroundRefit` waits for its fits on (a wait holds no GIL)."""
    return ThreadPoolExecutor(1, thread_name_prefix="jitserve-refit-wait")


def fit_in_child(src: str, dst: str, timeout_s: float = 1800.0) -> tuple[bool, float]:
    """Fit the predictor saved at `src` into `dst` in a fresh, niced Python interpreter (this module's
    `__main__`): whether a table was built, and the CPU seconds the child took, its start-up included.
    Raises when the child fails (its stderr's last line in the message) or outlives `timeout_s`."""
    cmd = [sys.executable, "-m", "jitserve.scheduler.analyzer.refit", str(os.getpid()), src, dst]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"length fit child exited with {done.returncode}: {tail}")
    lines = done.stdout.strip().splitlines()
    if not lines:  # it found its parent gone (`fit_worker_init`): nobody to answer
        raise RuntimeError("length fit child printed no answer")
    answer = json.loads(lines[-1])
    return bool(answer["fitted"]), float(answer["cpu_s"])


def fit_worker_init(parent_pid: int) -> None:
    """Set up a fitting child process (what `fit_in_child`'s interpreter does first, given its parent's
    pid).

    Niced: on a small node the fit yields the CPU to the engine's steps and the router's proxy path.
    Killed with its parent (Linux `PR_SET_PDEATHSIG`): a parent that dies mid-fit (SIGKILL, the OOM
    killer) would otherwise leave a fit of seconds to minutes running for nobody. The signal follows the
    thread that started the child: the refit's waiting thread, alive as long as its process.
    """
    os.nice(19)
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        pr_set_pdeathsig = 1  # <linux/prctl.h>
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        os._exit(0)


def fit_saved(src: str, dst: str) -> bool:
    """Load a predictor saved at `src`, fit it, save it to `dst`; whether a table was built. What
    `fit_in_child`'s interpreter runs: the predictor travels as its own .npz, no pickle."""
    predictor = LengthPredictor.load(src)
    fitted = predictor.fit()
    predictor.save(dst)
    return fitted


def _main(argv: list[str]) -> int:
    """`python -m jitserve.scheduler.analyzer.refit PARENT_PID SRC DST`: one fit; prints its answer as
    one JSON line."""
    if len(argv) != 3:
        print("usage: python -m jitserve.scheduler.analyzer.refit PARENT_PID SRC DST", file=sys.stderr)
        return 2
    fit_worker_init(int(argv[0]))
    fitted = fit_saved(argv[1], argv[2])
    # this interpreter's whole CPU: its imports cost as much as a small fit, and the pacing counts both
    print(json.dumps({"fitted": fitted, "cpu_s": time.process_time()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
