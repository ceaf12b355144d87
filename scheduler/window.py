"""Per-key sums over a sliding time window, in time buckets: the one windowing behind the engine's
per-class goodput (engine/accounting.py) and GMAX's per-type attainment (scheduler/fairness.py).

The window's oldest edge moves one bucket at a time. A read costs one copy per key: running totals are
kept as events are added and buckets leave the window (the engine reads them in its step loop, for every
state it publishes). Time is the caller's.
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
        self._total: dict[K, np.ndarray] = {}  # the buckets' sums per key
        self._live: dict[K, int] = {}  # buckets holding the key: 0 drops it from the totals

    def add(self, key: K, values: Sequence[float], now: float) -> None:
        """Add `values` (`width` numbers) to `key`'s sums at time `now`."""
        index = int(now // self.bucket_s)
        if not self._buckets or self._buckets[-1][0] != index:
            self._buckets.append((index, {}))
        rows = self._buckets[-1][1]
        row = rows.get(key)
        if row is None:
            row = rows[key] = np.zeros(self.width)
            self._live[key] = self._live.get(key, 0) + 1
            if key not in self._total:
                self._total[key] = np.zeros(self.width)
        row += values
        self._total[key] += values

    def sums(self, now: float) -> dict[K, np.ndarray]:
        """Each key's sums over the window ending at `now` (keys with no event in it are absent)."""
        oldest = int((now - self.window_s) // self.bucket_s)
        while self._buckets and self._buckets[0][0] <= oldest:
            for key, row in self._buckets.popleft()[1].items():
                self._live[key] -= 1
                if self._live[key]:
                    self._total[key] -= row
                else:  # its last bucket left: exactly absent, no rounding residue kept
                    del self._live[key], self._total[key]
        return {key: total.copy() for key, total in self._total.items()}
