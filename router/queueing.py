"""The best-effort queue: requests without an SLO wait here for room at the engines, in arrival order.

Best-effort work has no SLO to miss, so it is never dropped for waiting (not by the router, not by the
engine: the router sends it the longest waiting_time the SLO model allows). What bounds it is room:
at most `slots()` best-effort requests are open at the engines at once (default: twice each usable
engine's batch size), at most `capacity` more wait here, and the next one gets a fast 429 with a
Retry-After estimated from how fast best-effort requests have been finishing. No locks: everything
runs on the router's event loop. The waiting is the caller's (service.py); this class only keeps
the order and the counts, so it is testable without a server.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import deque
from collections.abc import Callable

MAX_RETRY_AFTER_S = 60.0


class QueueFullError(Exception):
    def __init__(self, retry_after_s: float) -> None:
        super().__init__(f"best-effort queue full; retry after {retry_after_s:g}s")
        self.retry_after_s = retry_after_s


class BestEffortQueue:
    def __init__(self, capacity: int, slots: Callable[[], int], initial_service_s: float = 1.0) -> None:
        self.capacity = capacity
        self.slots = slots  # best-effort requests the usable engines may hold at once (changes with them)
        self.active = 0  # best-effort requests holding a slot (at an engine, or about to be sent)
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._service_s = initial_service_s  # EWMA of how long a best-effort request holds its slot

    @property
    def queued(self) -> int:
        return len(self._waiters)

    def join(self) -> asyncio.Future[None] | None:
        """None: a slot is taken now. A future: queued, resolved when a slot is this request's (then
        call `leave` when done, or `cancel(fut)` to give up). QueueFullError when the queue is full."""
        if not self._waiters and self.active < self.slots():
            self.active += 1
            return None
        if len(self._waiters) >= self.capacity:
            raise QueueFullError(self.retry_after())
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        return fut

    def cancel(self, fut: asyncio.Future[None]) -> None:
        """A queued request gives up (its client left, or no engine came back in time)."""
        if fut.done() and not fut.cancelled():
            self.leave()  # it had been given a slot already: pass it on
            return
        fut.cancel()
        with contextlib.suppress(ValueError):
            self._waiters.remove(fut)

    def leave(self, held_s: float | None = None) -> None:
        """A request gives its slot back (after `held_s` seconds holding it, if it was served)."""
        self.active = max(self.active - 1, 0)
        if held_s is not None and held_s >= 0:
            self._service_s = 0.9 * self._service_s + 0.1 * held_s
        self.kick()

    def kick(self) -> None:
        """Hand free slots to the head of the queue (after a release, or when engines came up)."""
        if not self._waiters:
            return
        free = self.slots() - self.active
        while free > 0 and self._waiters:
            fut = self._waiters.popleft()
            if fut.done():
                continue
            self.active += 1
            free -= 1
            fut.set_result(None)

    def retry_after(self) -> float:
        """Seconds until the queue has likely drained: queued x service time / parallel slots."""
        slots = max(self.slots(), 1)
        estimate = math.ceil(self._service_s * max(len(self._waiters), 1) / slots)
        return float(min(max(estimate, 1), MAX_RETRY_AFTER_S))
