"""What the simulated analyzer knows: output-length upper bounds and compound sub-deadlines.

Three sources of length bounds, one interface (`LengthBoundSource.bounds(features, generated)`):
- `QRFBounds`: the scheduler's real analyzer (`jitserve.scheduler.analyzer.length.LengthPredictor`,
  a 300-tree quantile forest), trained on a warm-up slice of the same workload;
- `ConditionalBounds`: the stand-in used when the analyzer is unavailable. The workload draws
  log L = mu + sigma * (rho * z_prompt + sqrt(1 - rho^2) * z), so the best any prompt-feature
  predictor can do is the q-quantile of log-normal(mu + sigma*rho*z_prompt, sigma*sqrt(1-rho^2)),
  conditioned on L > generated as tokens arrive. That is what a well-trained QRF approximates.
- the oracle reads true lengths from the table (GMAXParams.oracle); bounds are irrelevant to it.

Features per call (CallInfo.features): (prior_mu, prior_sigma, input_len, slo_code, app, max_tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
from scipy.special import ndtr, ndtri

FEATURES = ("prior_mu", "prior_sigma", "input_len", "slo_code", "app", "max_tokens")


class LengthBoundSource(Protocol):
    name: str

    def bounds(self, features: np.ndarray, generated: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True, slots=True)
class ConditionalBounds:
    """The q-quantile of the conditional length distribution given the prompt and progress."""

    quantile: float = 0.9
    name: str = "conditional-quantile"

    def bounds(self, features: np.ndarray, generated: np.ndarray) -> np.ndarray:
        mu, sigma, max_tokens = features[:, 0], features[:, 1], features[:, 5]
        g = np.asarray(generated, dtype=np.float64)
        f0 = np.where(g > 0, ndtr((np.log(np.maximum(g, 1.0) + 0.5) - mu) / sigma), 0.0)
        u = np.clip(f0 + self.quantile * (1.0 - f0), 1e-12, 1 - 1e-12)
        ub = np.ceil(np.exp(mu + sigma * ndtri(u)))
        return np.clip(ub, g + 1, max_tokens).astype(np.int64)


class QRFBounds:
    """The analyzer's quantile-forest predictor, trained on finished warm-up calls."""

    name = "qrf"

    def __init__(self, quantile: float = 0.9, seed: int = 0) -> None:
        from jitserve.scheduler.analyzer.length import LengthPredictor, LengthPredictorConfig

        self.predictor = LengthPredictor(LengthPredictorConfig(quantile=quantile, seed=seed))

    def train(self, features: np.ndarray, output_len: np.ndarray) -> None:
        f = features
        self.predictor.observe_many(
            f[:, 2].astype(np.int64),
            np.maximum(output_len, 1).astype(np.int64),
            f[:, 3].astype(np.int64),
            f[:, 4].astype(np.int64),
            np.zeros(f.shape[0], np.int64),
            f[:, 5].astype(np.int64),
        )
        self.predictor.fit()

    def bounds(self, features: np.ndarray, generated: np.ndarray) -> np.ndarray:
        f = features
        return self.predictor.upper_bounds(
            f[:, 2].astype(np.int64),
            np.asarray(generated, dtype=np.int64),
            f[:, 3].astype(np.int64),
            f[:, 4].astype(np.int64),
            0,
            f[:, 5].astype(np.int64),
        )


def qrf_available() -> bool:
    try:
        import quantile_forest  # noqa: F401

        from jitserve.scheduler.analyzer.length import LengthPredictor  # noqa: F401
    except ImportError:
        return False
    return True
