"""The fault suite of issue 14: real processes (`jitserve router`, FAKE stream-faithful engines each in its
own process, `jitserve operator` against the emulated API server), real faults (kill -9, SIGSTOP).
The scenarios live in fault_scenarios.py, shared with `bench/reliability.py`, which prints their figures
(docs/benchmarks/reliability.md).

Each asserts: no request is lost silently (every one ends in a completion, an error event or a 4xx/5xx
with a reason), no client waits beyond the documented bound, the router's memory stays bounded, and the
cluster converges with no duplicate children. A child patched by hand is repaired by the operator:
tests/e2e/test_operator.py (drift tests: Deployment replicas, a widened Role), not repeated here.

Timing: nothing here checks speed. The only time assertions are the documented bounds the issue asks
for, each with MARGIN_S on top: this suite runs on a shared 2-core machine (load average ~15 while it
was written), where a process can wait seconds for a core. What the bounds catch is of another order
(a hung engine held a client for the 600 s --read-timeout before issue 14).
"""

from __future__ import annotations

import pytest

from tests.faults import fault_scenarios as fs

MARGIN_S = 10.0  # scheduling delay on a loaded 2-core machine, see above
RSS_GROWTH_BYTES = 64 * 2**20  # a few dozen requests may not leave more than this behind in the router


def assert_nothing_lost(res: fs.ScenarioResult, allowed: tuple[str, ...] = fs.OK_KINDS) -> None:
    bad = [o for o in res.outcomes if o.kind not in allowed]
    assert not bad, (res.name, res.kinds, bad[:5])
    for o in res.outcomes:
        if o.kind in ("error_event", "http_error"):
            assert o.code, o  # an error always says why


def assert_waits_bounded(res: fs.ScenarioResult) -> None:
    assert res.bound_s is not None
    worst = max(res.outcomes, key=lambda o: o.wait_s)
    assert worst.wait_s <= res.bound_s + MARGIN_S, (res.name, res.bound_s, worst)


def assert_memory_bounded(res: fs.ScenarioResult, growth: int = RSS_GROWTH_BYTES) -> None:
    assert res.rss_after - res.rss_before <= growth, (res.rss_before, res.rss_after)
    assert max(res.rss_peak, res.rss_after) <= fs.RSS_GOAL_BYTES, res.rss_peak


def test_kill_9_an_engine_under_load() -> None:
    res = fs.engine_killed()
    assert_nothing_lost(res)
    assert_waits_bounded(res)
    assert_memory_bounded(res)
    # the streams that had tokens from the killed engine end with an error event, the rest complete
    assert res.kinds.get("error_event", 0) >= 1 and res.kinds.get("completed", 0) >= 1, res.kinds
    assert res.figures["router_saw_down"] == "down"
    assert res.figures["after_kill_on_survivor"] == res.figures["after_kill"]  # nothing new to the dead one


def test_sigstop_an_engine_under_load() -> None:
    res = fs.engine_stopped()
    assert_nothing_lost(res)
    assert_waits_bounded(res)  # bound: --poll-interval + --poll-timeout + --unresponsive-timeout
    assert_memory_bounded(res)
    assert res.codes().get("upstream_unresponsive", 0) >= 1, res.codes()  # streams cut, not left hanging
    assert res.figures["router_saw"] == {"health": "down", "unresponsive": True}


def test_kill_the_router_mid_stream_the_engine_aborts_every_request() -> None:
    res = fs.router_killed()
    # the client that left, and the ones whose router died under them (a broken connection: they see it)
    assert_nothing_lost(res, allowed=("left", "broken"))
    assert res.kinds.get("left") == 1
    stats = res.figures["engine_stats"]
    assert stats["aborted"] == stats["requests"] == len(res.outcomes) and stats["open"] == 0, stats
    assert res.figures["new_router_serves"] == "completed"


def test_a_burst_of_2000_streams() -> None:
    res = fs.burst(2000)
    assert len(res.outcomes) == 2000
    # best-effort is queued, not refused: a 429 queue_full would have a reason, but none is expected
    # with 2,000 < --best-effort-queue (2048) and no 503 ever
    assert_nothing_lost(res)
    assert res.kinds == {"completed": 2000}, (res.kinds, res.codes())
    assert_memory_bounded(res)  # design goal: RSS <= 250 MB with 2,000 streams
    assert res.figures["engines"] == {"a": "fresh", "b": "fresh"}  # no engine marked down by the burst


@pytest.mark.e2e
def test_sigkill_the_operator_mid_reconcile_then_it_converges_without_duplicates() -> None:
    res = fs.operator_killed()
    assert 0 < res.figures["children_at_kill"] < res.figures["children_expected"], res.figures
    assert res.figures["duplicates"] == [] and res.figures["missing"] == [], res.figures
