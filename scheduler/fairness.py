"""Recent SLO attainment per SLO type, and the fairness term GMAX's reservation mixes in (§4.2).

JITServe §4.2, "Extending to Other Objectives": priority'(r) = (1 - f) x priority(r) + f x Fair(r), "as
f -> 1, requests with lower fairness attainment gain higher priority". Here Fair(r) is 1 minus the
recent attainment (requests that met their SLO / requests that ended, drops included) of r's SLO type,
so a type the engine has been failing is served ahead of one it has been serving well
(docs/decisions/core.md, "Every class: attainment fairness").

Pure bookkeeping over outcomes the adapters report through the frame driver: the engine (real
outcomes) and the simulator (modelled ones) feed the same tracker, and the time is theirs.
"""

from __future__ import annotations

import numpy as np

from jitserve.scheduler.requests import SLO_TYPE_CODE
from jitserve.scheduler.window import SlidingSums

TYPES = len(SLO_TYPE_CODE)


class TypeAttainment:
    """Met / ended per SLO type over the last `window_s` seconds, in `buckets` time buckets."""

    def __init__(self, window_s: float = 60.0, buckets: int = 12) -> None:
        self._sums: SlidingSums[int] = SlidingSums(2, window_s, buckets)  # (met, ended) per type code

    def record(self, slo_type: int, met: bool, now: float) -> None:
        """One request of `slo_type` (its table code) ended at `now`; `met`: it met its SLO."""
        if not 0 <= slo_type < TYPES:
            raise ValueError(f"slo_type: must be a type code in [0, {TYPES}), got {slo_type}")
        self._sums.add(slo_type, (float(met), 1.0), now)

    def counts(self, now: float) -> tuple[np.ndarray, np.ndarray]:
        """(met, ended) per type over the window ending at `now`."""
        met, ended = np.zeros(TYPES), np.zeros(TYPES)
        for code, (m, e) in self._sums.sums(now).items():
            met[code], ended[code] = m, e
        return met, ended

    def fair(self, now: float) -> np.ndarray:
        """Fair(r) per type: 1 - recent attainment; 0 for a type with no outcome in the window (no
        evidence that it is being failed)."""
        met, ended = self.counts(now)
        return np.where(ended > 0, 1.0 - met / np.maximum(ended, 1.0), 0.0)
