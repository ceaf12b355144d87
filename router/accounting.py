"""Per-class goodput and SLO attainment as the router observes them (client-side timings).

Goodput is computed by scheduler/goodput.py (the one implementation); this module only aggregates it:
lifetime totals, and a sliding window of one-second buckets (bounded memory at any request rate) for
`GET /jitserve/status`, which the operator copies into the ServingPool's status.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from jitserve.scheduler.goodput import Goodput, RequestRecord, max_goodput, request_goodput


@dataclass(slots=True)
class _Bucket:
    second: int = -1
    goodput: float = 0.0
    met: int = 0
    finished: int = 0


@dataclass(slots=True)
class ClassStats:
    window_s: int
    goodput_total: float = 0.0
    possible_total: float = 0.0
    met_total: int = 0
    finished_total: int = 0
    dropped_total: int = 0
    buckets: list[_Bucket] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.buckets = [_Bucket() for _ in range(self.window_s)]

    def add(self, g: Goodput, possible: float, now: float, dropped: bool) -> None:
        self.goodput_total += g.tokens
        self.possible_total += possible
        self.met_total += g.requests
        self.finished_total += 1
        self.dropped_total += int(dropped)
        sec = int(math.floor(now))
        b = self.buckets[sec % self.window_s]
        if b.second != sec:
            b.second, b.goodput, b.met, b.finished = sec, 0.0, 0, 0
        b.goodput += g.tokens
        b.met += g.requests
        b.finished += 1

    def window(self, now: float) -> tuple[float, int, int]:
        lo = int(math.floor(now)) - self.window_s + 1
        live = [b for b in self.buckets if b.second >= lo]
        return sum(b.goodput for b in live), sum(b.met for b in live), sum(b.finished for b in live)


class Accounting:
    def __init__(self, window_s: int = 60) -> None:
        self.window_s = window_s
        self.classes: dict[str, ClassStats] = {}

    def _stats(self, slo_class: str) -> ClassStats:
        stats = self.classes.get(slo_class)
        if stats is None:
            stats = self.classes[slo_class] = ClassStats(self.window_s)
        return stats

    def record(self, slo_class: str, record: RequestRecord, now: float) -> Goodput:
        """Account one finished (or dropped) request; returns its goodput."""
        g = request_goodput(record)
        possible = max_goodput(record.slo, record.input_len, max(record.output_len, 1))
        self._stats(slo_class).add(g, possible, now, record.dropped)
        return g

    def record_program(self, slo_class: str, g: Goodput, possible: float, now: float, dropped: bool) -> None:
        self._stats(slo_class).add(g, possible, now, dropped)

    def status(self, now: float) -> dict[str, dict[str, float | int | None]]:
        out: dict[str, dict[str, float | int | None]] = {}
        for name, s in sorted(self.classes.items()):
            goodput, met, finished = s.window(now)
            # "goodput" and "attainment" are the keys the operator copies into ServingPool status.
            out[name] = {
                "goodput": goodput / self.window_s,
                "attainment": (met / finished) if finished else None,
                "finished": finished,
                "goodput_tokens_total": s.goodput_total,
                "attainment_total": (s.met_total / s.finished_total) if s.finished_total else None,
                "finished_total": s.finished_total,
                "dropped_total": s.dropped_total,
            }
        return out
