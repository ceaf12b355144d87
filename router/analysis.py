"""The router's side of the request analyzer: output-length upper bounds for placement.

The analyzer's QRF (`LengthPredictor`) learns from the requests the router sees finish and bounds a
new request's output length from its prompt size, SLO type, class, model and max_tokens. Until it has
enough history (and whenever a context is new to it) the bound is max_tokens, the only bound that is
never too small. Lookups are a table read. Fits run as the engine's do (`BackgroundRefit`: a niced
child process, so a fit never holds the router's GIL, paced by its CPU cost and at most once per
`min_refit_interval_s`). The bound also travels to the engine (`length_bound`).
"""

from __future__ import annotations

from jitserve.scheduler.analyzer.features import MAX_CATEGORY_CODE, slo_type_code
from jitserve.scheduler.analyzer.length import LengthPredictor, LengthPredictorConfig
from jitserve.scheduler.analyzer.refit import BackgroundRefit, RefitPacing
from jitserve.scheduler.slo import SLOType


class LengthBounds:
    def __init__(
        self,
        enabled: bool = True,
        config: LengthPredictorConfig | None = None,
        min_refit_interval_s: float = 60.0,
    ) -> None:
        self.enabled = enabled
        self.refit = (
            BackgroundRefit(
                LengthPredictor(config),
                RefitPacing(min_interval_s=min_refit_interval_s),
                label="router length bounds",
            )
            if enabled
            else None
        )
        self._codes: dict[str, int] = {}

    @property
    def predictor(self) -> LengthPredictor | None:
        return self.refit.predictor if self.refit is not None else None

    @property
    def fitting(self) -> bool:
        return self.refit is not None and self.refit.fitting

    def _code(self, name: str) -> int:
        code = self._codes.get(name)
        if code is None:
            code = min(len(self._codes), MAX_CATEGORY_CODE)
            self._codes[name] = code
        return code

    def bound(self, input_len: int, slo_type: SLOType, slo_class: str, model: str, max_tokens: int) -> int:
        predictor = self.predictor
        if predictor is None or not predictor.trained:
            return max_tokens
        return predictor.upper_bound(
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
        if self.refit is None or output_len < 1:
            return
        self.refit.observe(
            input_len, min(output_len, max_tokens), slo_type_code(slo_type), self._code(slo_class),
            self._code("model:" + model), max_tokens,
        )  # fmt: skip

    def close(self) -> None:
        if self.refit is not None:
            self.refit.close()
