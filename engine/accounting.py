"""Per-class goodput of finished requests, over a sliding window and as running totals.

Every number goes through `jitserve.scheduler.goodput` (the one implementation), so the engine, the
router and the simulator agree on what "goodput" means.
"""

from __future__ import annotations

from dataclasses import dataclass

from jitserve.scheduler.goodput import Goodput, RequestRecord, request_goodput
from jitserve.scheduler.placement import ClassGoodput
from jitserve.scheduler.window import SlidingSums


@dataclass
class ClassTotals:
    finished: int = 0  # requests that ended (including dropped and aborted)
    met: int = 0  # requests that met their SLO
    dropped: int = 0  # dropped past waiting_time
    goodput_tokens: float = 0.0


class GoodputWindow:
    """Per-class goodput over the last `window_s` seconds, in `buckets` time buckets (the core's
    `SlidingSums`: a state publish sums at most `buckets` rows per class)."""

    def __init__(self, window_s: float = 60.0, buckets: int = 60) -> None:
        self.window_s = window_s
        self._sums: SlidingSums[str] = SlidingSums(3, window_s, buckets)  # (tokens, met, count) per class
        self.totals: dict[str, ClassTotals] = {}

    def record(self, slo_class: str, record: RequestRecord, now: float) -> Goodput:
        """Account one ended request; returns its goodput (token goodput and whether it met its SLO)."""
        g = request_goodput(record)
        totals = self.totals.setdefault(slo_class, ClassTotals())
        totals.finished += 1
        totals.met += int(g.met)
        totals.dropped += int(record.dropped)
        totals.goodput_tokens += g.tokens
        self._sums.add(slo_class, (g.tokens, float(g.met), 1.0), now)
        return g

    def summary(self, now: float) -> dict[str, ClassGoodput]:
        """Goodput per second, attainment and count per class over the last `window_s` seconds."""
        sums = self._sums.sums(now)
        out: dict[str, ClassGoodput] = {}
        for cls in self.totals:  # every class recorded; the window may hold none of it
            if cls not in sums:
                out[cls] = ClassGoodput()
                continue
            tok, met, n = sums[cls]
            out[cls] = ClassGoodput(
                goodput_tokens_per_s=float(tok) / self.window_s, attainment=float(met / n), finished=int(n)
            )
        return out
