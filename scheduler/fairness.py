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

from collections import deque

import numpy as np

from jitserve.scheduler.requests import SLO_TYPE_CODE

TYPES = len(SLO_TYPE_CODE)


class TypeAttainment:
    """Met / ended per SLO type over the last `window_s` seconds, in `buckets` time buckets (the window's
    oldest edge moves one bucket at a time; a plan reads at most `buckets` rows)."""

    def __init__(self, window_s: float = 60.0, buckets: int = 12) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s: must be > 0, got {window_s}")
        if buckets < 1:
            raise ValueError(f"buckets: must be >= 1, got {buckets}")
        self.window_s = window_s
        self.bucket_s = window_s / buckets
        # (bucket index, [met per type], [ended per type]), oldest first
        self._buckets: deque[tuple[int, np.ndarray, np.ndarray]] = deque()

    def record(self, slo_type: int, met: bool, now: float) -> None:
        """One request of `slo_type` (its table code) ended at `now`; `met`: it met its SLO."""
        if not 0 <= slo_type < TYPES:
            raise ValueError(f"slo_type: must be a type code in [0, {TYPES}), got {slo_type}")
        index = int(now // self.bucket_s)
        if not self._buckets or self._buckets[-1][0] != index:
            self._buckets.append((index, np.zeros(TYPES), np.zeros(TYPES)))
        _, met_row, ended_row = self._buckets[-1]
        met_row[slo_type] += bool(met)
        ended_row[slo_type] += 1

    def counts(self, now: float) -> tuple[np.ndarray, np.ndarray]:
        """(met, ended) per type over the window ending at `now`."""
        oldest = int((now - self.window_s) // self.bucket_s)
        while self._buckets and self._buckets[0][0] <= oldest:
            self._buckets.popleft()
        met, ended = np.zeros(TYPES), np.zeros(TYPES)
        for _, m, e in self._buckets:
            met += m
            ended += e
        return met, ended

    def fair(self, now: float) -> np.ndarray:
        """Fair(r) per type: 1 - recent attainment; 0 for a type with no outcome in the window (no
        evidence that it is being failed)."""
        met, ended = self.counts(now)
        return np.where(ended > 0, 1.0 - met / np.maximum(ended, 1.0), 0.0)
