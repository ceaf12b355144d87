"""Per-key sums over a sliding time window, in time buckets: the one windowing behind the engine's
per-class goodput (engine/accounting.py) and GMAX's per-type attainment (scheduler/fairness.py).

A read sums at most `buckets` rows per key instead of rescanning every event in the window (thousands
at high rates); the window's oldest edge moves one bucket at a time. Time is the caller's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence
from typing import Generic, TypeVar

import numpy as np

K = TypeVar("K", bound=Hashable)


class SlidingSums(Generic[K]):
    """Sums of `width` numbers per key over the last `window_s` seconds, in `buckets` buckets."""

    def __init__(self, width: int, window_s: float = 60.0, buckets: int = 60) -> None:
        if width < 1:
            raise ValueError(f"width: must be >= 1, got {width}")
        if window_s <= 0:
            raise ValueError(f"window_s: must be > 0, got {window_s}")
        if buckets < 1:
            raise ValueError(f"buckets: must be >= 1, got {buckets}")
        self.width = width
        self.window_s = window_s
        self.bucket_s = window_s / buckets
        self._buckets: deque[tuple[int, dict[K, np.ndarray]]] = deque()  # (bucket index, key -> sums)

    def add(self, key: K, values: Sequence[float], now: float) -> None:
        """Add `values` (`width` numbers) to `key`'s sums at time `now`."""
        index = int(now // self.bucket_s)
        if not self._buckets or self._buckets[-1][0] != index:
            self._buckets.append((index, {}))
        rows = self._buckets[-1][1]
        row = rows.get(key)
        if row is None:
            row = rows[key] = np.zeros(self.width)
        row += values

    def sums(self, now: float) -> dict[K, np.ndarray]:
        """Each key's sums over the window ending at `now` (keys with no event in it are absent)."""
        oldest = int((now - self.window_s) // self.bucket_s)
        while self._buckets and self._buckets[0][0] <= oldest:
            self._buckets.popleft()
        out: dict[K, np.ndarray] = {}
        for _index, rows in self._buckets:
            for key, row in rows.items():
                acc = out.get(key)
                if acc is None:
                    out[key] = row.copy()
                else:
                    acc += row
        return out
