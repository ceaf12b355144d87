"""SlidingSums: the window every per-class goodput and attainment read goes through."""

from __future__ import annotations

import random

import numpy as np
import pytest

from jitserve.scheduler.window import SlidingSums


def test_sums_match_a_rescan_of_the_events_in_the_window_and_a_key_leaves_with_its_last_bucket() -> None:
    """Running totals against a brute-force rescan of every event still in the window, over thousands of
    adds and reads with keys coming and going; values are fractional so rounding would show."""
    rng = random.Random(3)
    w: SlidingSums[str] = SlidingSums(2, window_s=10.0, buckets=10)
    events: list[tuple[float, str, tuple[float, float]]] = []
    now = 0.0
    for i in range(4000):
        now += rng.expovariate(30.0 if i < 3000 else 3.0)  # the last stretch thins out: keys leave
        key = rng.choice(["a", "b", "c"]) if i < 3500 else "a"
        values = (rng.random() * 100, 1.0)
        w.add(key, values, now)
        events.append((now, key, values))
        if rng.random() < 0.05:
            read_at = now + rng.random() * 3
            got = w.sums(read_at)
            edge = (int((read_at - 10.0) // 1.0) + 1) * 1.0  # the oldest bucket still in the window
            for key in "abc":
                live = [v for t, k, v in events if k == key and t >= edge]
                if not live:
                    assert key not in got  # absent, not a zero or a rounding residue
                    continue
                assert got[key] == pytest.approx(np.sum(live, axis=0), rel=1e-9)
            now = max(now, read_at)
    assert set(w.sums(now + 11.0)) == set()


def test_a_read_returns_copies() -> None:
    w: SlidingSums[str] = SlidingSums(1)
    w.add("a", (2.0,), 0.5)
    w.sums(0.5)["a"] += 5
    assert w.sums(0.6)["a"][0] == 2.0
