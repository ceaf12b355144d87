"""Per-class goodput of finished requests, over a sliding window and as running totals.

Every number goes through `jitserve.scheduler.goodput` (the one implementation), so the engine, the
router and the simulator agree on what "goodput" means.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from jitserve.scheduler.goodput import RequestRecord, request_goodput
from jitserve.scheduler.placement import ClassGoodput


@dataclass
class ClassTotals:
    finished: int = 0  # requests that ended (including dropped and aborted)
    met: int = 0  # requests that met their SLO
    dropped: int = 0  # dropped past waiting_time
    goodput_tokens: float = 0.0


class GoodputWindow:
    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self._events: deque[tuple[float, str, float, bool]] = deque()  # (finish, class, tokens, met)
        self.totals: dict[str, ClassTotals] = {}

    def record(self, slo_class: str, record: RequestRecord, now: float) -> float:
        """Account one ended request; returns its token goodput."""
        g = request_goodput(record)
        totals = self.totals.setdefault(slo_class, ClassTotals())
        totals.finished += 1
        totals.met += int(g.met)
        totals.dropped += int(record.dropped)
        totals.goodput_tokens += g.tokens
        self._events.append((now, slo_class, g.tokens, g.met))
        return g.tokens

    def _trim(self, now: float) -> None:
        while self._events and self._events[0][0] < now - self.window_s:
            self._events.popleft()

    def summary(self, now: float) -> dict[str, ClassGoodput]:
        """Goodput per second, attainment and count per class over the last `window_s` seconds."""
        self._trim(now)
        tokens: dict[str, float] = {}
        met: dict[str, int] = {}
        count: dict[str, int] = {}
        for _t, cls, tok, ok in self._events:
            tokens[cls] = tokens.get(cls, 0.0) + tok
            met[cls] = met.get(cls, 0) + int(ok)
            count[cls] = count.get(cls, 0) + 1
        out = {name: ClassGoodput() for name in self.totals}
        for cls, n in count.items():
            out[cls] = ClassGoodput(
                goodput_tokens_per_s=tokens[cls] / self.window_s, attainment=met[cls] / n, finished=n
            )
        return out
