"""The best-effort queue's order and bounds (router/queueing.py), pure: futures on a private event loop."""

from __future__ import annotations

import asyncio

import pytest

from jitserve.router.queueing import MAX_RETRY_AFTER_S, BestEffortQueue, QueueFullError


def run(coro):
    return asyncio.run(coro)


def test_slots_first_then_a_fifo_then_queue_full() -> None:
    async def go() -> None:
        q = BestEffortQueue(capacity=2, slots=lambda: 2)
        assert q.join() is None and q.join() is None  # two slots taken at once
        first, second = q.join(), q.join()
        assert first is not None and second is not None and q.queued == 2
        with pytest.raises(QueueFullError) as full:
            q.join()
        assert 1 <= full.value.retry_after_s <= MAX_RETRY_AFTER_S
        q.leave(0.5)  # a slot frees: the head of the queue gets it, not the second
        assert first.done() and not second.done() and q.active == 2
        q.leave(0.5)
        assert second.done() and q.queued == 0 and q.active == 2
        # once the queue is empty a new request takes a freed slot directly
        q.leave()
        assert q.join() is None

    run(go())


def test_a_request_that_gives_up_leaves_no_hole() -> None:
    async def go() -> None:
        q = BestEffortQueue(capacity=4, slots=lambda: 1)
        assert q.join() is None
        a, b = q.join(), q.join()
        q.cancel(a)  # its client left while queued
        assert q.queued == 1
        q.leave()
        assert b.done() and q.active == 1
        q.cancel(b)  # granted, then given up (e.g. cancelled before dispatch): the slot passes on
        assert q.active == 0
        assert q.join() is None

    run(go())


def test_more_engine_slots_drain_the_queue_on_a_kick() -> None:
    async def go() -> None:
        slots = [0]  # no usable engine yet
        q = BestEffortQueue(capacity=10, slots=lambda: slots[0])
        waiting = [q.join() for _ in range(3)]
        assert all(f is not None for f in waiting)
        q.kick()
        assert not any(f.done() for f in waiting)
        slots[0] = 2  # an engine came up with room for two
        q.kick()
        assert [f.done() for f in waiting] == [True, True, False] and q.active == 2

    run(go())


def test_retry_after_follows_queue_length_and_service_time() -> None:
    async def go() -> None:
        q = BestEffortQueue(capacity=100, slots=lambda: 2, initial_service_s=1.0)
        q.join(), q.join()
        for _ in range(20):
            q.join()
        short = q.retry_after()
        for _ in range(50):  # requests have been holding their slot ~10 s each
            q.active += 1
            q.leave(10.0)
        assert q.retry_after() > short
        assert q.retry_after() == MAX_RETRY_AFTER_S  # capped: a client should come back within a minute

    run(go())
