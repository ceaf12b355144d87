"""Per-class goodput of finished requests, over a sliding window and as running totals.

Every number goes through `jitserve.scheduler.goodput` (the one implementation), so the engine, the
router and the simulator agree on what "goodput" means.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from jitserve.scheduler.goodput import Goodput, RequestRecord, request_goodput
from jitserve.scheduler.placement import ClassGoodput


@dataclass
class ClassTotals:
    finished: int = 0  # requests that ended (including dropped and aborted)
    met: int = 0  # requests that met their SLO
    dropped: int = 0  # dropped past waiting_time
    goodput_tokens: float = 0.0


class GoodputWindow:
    """Per-class goodput over the last `window_s` seconds, in `buckets` time buckets: a state publish
    sums at most `buckets` rows per class instead of rescanning every request that finished in the
    window (thousands at high rates). The window's oldest edge moves a bucket at a time."""

    def __init__(self, window_s: float = 60.0, buckets: int = 60) -> None:
        self.window_s = window_s
        self.bucket_s = window_s / buckets
        # (bucket index, class) -> [tokens, met, count]; buckets in arrival order
        self._buckets: deque[tuple[int, dict[str, list[float]]]] = deque()
        self.totals: dict[str, ClassTotals] = {}

    def record(self, slo_class: str, record: RequestRecord, now: float) -> Goodput:
        """Account one ended request; returns its goodput (token goodput and whether it met its SLO)."""
        g = request_goodput(record)
        totals = self.totals.setdefault(slo_class, ClassTotals())
        totals.finished += 1
        totals.met += int(g.met)
        totals.dropped += int(record.dropped)
        totals.goodput_tokens += g.tokens
        index = int(now // self.bucket_s)
        if not self._buckets or self._buckets[-1][0] != index:
            self._buckets.append((index, {}))
        row = self._buckets[-1][1].setdefault(slo_class, [0.0, 0.0, 0.0])
        row[0] += g.tokens
        row[1] += int(g.met)
        row[2] += 1
        return g

    def _trim(self, now: float) -> None:
        oldest = int((now - self.window_s) // self.bucket_s)
        while self._buckets and self._buckets[0][0] <= oldest:
            self._buckets.popleft()

    def summary(self, now: float) -> dict[str, ClassGoodput]:
        """Goodput per second, attainment and count per class over the last `window_s` seconds."""
        self._trim(now)
        sums: dict[str, list[float]] = {}
        for _index, rows in self._buckets:
            for cls, (tok, met, n) in rows.items():
                acc = sums.setdefault(cls, [0.0, 0.0, 0.0])
                acc[0] += tok
                acc[1] += met
                acc[2] += n
        out = {name: ClassGoodput() for name in self.totals}
        for cls, (tok, met, n) in sums.items():
            out[cls] = ClassGoodput(
                goodput_tokens_per_s=tok / self.window_s, attainment=met / n, finished=int(n)
            )
        return out
