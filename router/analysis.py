"""The router's side of the request analyzer: output-length upper bounds for placement.

The analyzer's QRF (`LengthPredictor`) learns from the requests the router sees finish and bounds a
new request's output length from its prompt size, SLO type, class, model and max_tokens. Until it has
enough history (and whenever a context is new to it) the bound is max_tokens, the only bound that is
never too small. Lookups are a table read. A fit (300 trees) costs seconds of CPU: it runs in a child
process (the predictor travels as the analyzer's own .npz file, no pickle), so it never holds the
router's GIL, and at most once per `min_refit_interval_s`. Requests that finish during a fit are
replayed into the fitted predictor. The bound also travels to the engine (`length_bound`).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from jitserve.scheduler.analyzer.features import MAX_CATEGORY_CODE, slo_type_code
from jitserve.scheduler.analyzer.length import (
    LengthPredictor,
    LengthPredictorConfig,
    fit_saved,
    fit_worker_init,
)
from jitserve.scheduler.slo import SLOType

log = logging.getLogger("jitserve.router.analysis")

Row = tuple[int, int, int, int, int, int]  # prompt, output, slo type, class, model, max_tokens


class LengthBounds:
    def __init__(
        self,
        enabled: bool = True,
        config: LengthPredictorConfig | None = None,
        min_refit_interval_s: float = 60.0,
    ) -> None:
        self.enabled = enabled
        self.predictor = LengthPredictor(config) if enabled else None
        self.min_refit_interval_s = min_refit_interval_s
        self._codes: dict[str, int] = {}
        self._fitting = False
        self._since_fit = 0
        self._last_fit = -float("inf")
        self._during_fit: list[Row] = []
        self._pool: ProcessPoolExecutor | None = None

    def _code(self, name: str) -> int:
        code = self._codes.get(name)
        if code is None:
            code = min(len(self._codes), MAX_CATEGORY_CODE)
            self._codes[name] = code
        return code

    def bound(self, input_len: int, slo_type: SLOType, slo_class: str, model: str, max_tokens: int) -> int:
        if self.predictor is None or not self.predictor.trained:
            return max_tokens
        return self.predictor.upper_bound(
            input_len,
            0,
            slo_type_code(slo_type),
            self._code(slo_class),
            self._code("model:" + model),
            max_tokens,
        )

    def observe(
        self, input_len: int, output_len: int, slo_type: SLOType, slo_class: str, model: str, max_tokens: int
    ) -> None:
        if self.predictor is None or output_len < 1:
            return
        row: Row = (
            input_len, min(output_len, max_tokens), slo_type_code(slo_type), self._code(slo_class),
            self._code("model:" + model), max_tokens,
        )  # fmt: skip
        self.predictor.observe(*row)
        if self._fitting:
            self._during_fit.append(row)
            return
        self._since_fit += 1
        cfg = self.predictor.config
        due = self._since_fit >= (
            cfg.refit_every_requests if self.predictor.trained else cfg.min_history_requests
        )
        if due and time.monotonic() - self._last_fit >= self.min_refit_interval_s:
            self._fitting, self._since_fit, self._last_fit = True, 0, time.monotonic()
            asyncio.get_running_loop().create_task(self._refit())

    async def _refit(self) -> None:
        assert self.predictor is not None
        try:
            with tempfile.TemporaryDirectory(prefix="jitserve-qrf-") as tmp:
                src, dst = str(Path(tmp) / "in.npz"), str(Path(tmp) / "out.npz")
                self.predictor.save(src)
                if self._pool is None:
                    # spawn, not fork: the router has threads (watches, executor) a fork would copy mid-state;
                    # the worker is niced (the fit yields the CPU to the proxy path) and dies with the router
                    self._pool = ProcessPoolExecutor(
                        1,
                        mp_context=multiprocessing.get_context("spawn"),
                        initializer=fit_worker_init,
                        initargs=(os.getpid(),),
                    )
                fitted = await asyncio.get_running_loop().run_in_executor(self._pool, fit_saved, src, dst)
                if fitted:
                    new = LengthPredictor.load(dst)
                    for row in self._during_fit:  # requests that finished while the child was fitting
                        new.observe(*row)
                    self.predictor = new
                    log.info("length bounds refit on %d requests", new.history_size)
        except Exception:  # a failed fit keeps the previous table; never take the router down
            log.exception("length-bound fit failed")
        finally:
            self._during_fit.clear()
            self._fitting = False

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
