"""The router's side of the request analyzer: output-length upper bounds for placement.

The analyzer's QRF (`LengthPredictor`) learns from the requests the router sees finish and bounds a
new request's output length from its prompt size, SLO type, class, model and max_tokens. Until it has
enough history (and whenever a context is new to it) the bound is max_tokens, the only bound that is
never too small. Fits take seconds, so they run in a worker thread, one at a time; lookups are a
table read. The bound also travels to the engine (`length_bound`) so both sides plan with it.
"""

from __future__ import annotations

import asyncio
import logging
import time

from jitserve.scheduler.analyzer.features import MAX_CATEGORY_CODE, slo_type_code
from jitserve.scheduler.analyzer.length import LengthPredictor, LengthPredictorConfig
from jitserve.scheduler.slo import SLOType

log = logging.getLogger("jitserve.router.analysis")


class LengthBounds:
    def __init__(
        self,
        enabled: bool = True,
        config: LengthPredictorConfig | None = None,
        min_refit_interval_s: float = 60.0,
    ) -> None:
        self.enabled = enabled
        # A 300-tree fit costs seconds of CPU; at hundreds of requests a second "every 500 requests"
        # would mean a fit every few seconds, so fits are also spaced in time.
        self.min_refit_interval_s = min_refit_interval_s
        self._last_fit = -float("inf")
        self.predictor = LengthPredictor(config) if enabled else None
        self._codes: dict[str, int] = {}
        self._fitting = False
        self._since_fit = 0

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
        self.predictor.observe(
            input_len,
            min(output_len, max_tokens),
            slo_type_code(slo_type),
            self._code(slo_class),
            self._code("model:" + model),
            max_tokens,
        )
        self._since_fit += 1
        cfg = self.predictor.config
        due = self._since_fit >= (
            cfg.refit_every_requests if self.predictor.trained else cfg.min_history_requests
        )
        if due and not self._fitting and time.monotonic() - self._last_fit >= self.min_refit_interval_s:
            self._fitting, self._since_fit, self._last_fit = True, 0, time.monotonic()
            asyncio.get_running_loop().run_in_executor(None, self._refit)

    def _refit(self) -> None:
        try:
            if self.predictor is not None and self.predictor.maybe_refit():
                log.info("length bounds refit on %d requests", self.predictor.history_size)
        except Exception:  # a failed fit keeps the previous table; never take the router down
            log.exception("length-bound fit failed")
        finally:
            self._fitting = False
