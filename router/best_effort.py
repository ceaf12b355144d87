"""Best-effort admission: the bounded FIFO in front of the engines (`queueing.BestEffortQueue`) as the
request path uses it: join or 429 queue_full, wait for a slot while the client stays, hold the slot
until the response (or stream) ends."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from jitserve.router.config import RouterConfig
from jitserve.router.errors import RouterError, rate_limited, unavailable
from jitserve.router.metrics import RouterMetrics
from jitserve.router.pool import Pool
from jitserve.router.queueing import BestEffortQueue, QueueFullError
from jitserve.router.relay import RelayResponse


class BestEffortGate:
    def __init__(self, config: RouterConfig, pool: Pool, metrics: RouterMetrics) -> None:
        self.config = config
        self.pool = pool
        self.metrics = metrics
        self.clock = pool.clock
        self.queue = BestEffortQueue(config.best_effort_queue, self.slots)

    def slots(self) -> int:
        """Best-effort requests the usable engines may hold at once (--best-effort-slots per engine, or
        twice each engine's batch size)."""
        per = self.config.best_effort_slots
        total = 0
        for r in self.pool.usable():
            if per > 0:
                total += per
            else:
                batch = r.state.batch_size if r.state is not None else self.pool.defaults.batch_size
                total += 2 * max(batch, 1)
        return total

    async def run(
        self, slo_class: str, model: str, request: Request, dispatch: Callable[[], Awaitable[Response]]
    ) -> Response:
        """Wait in the bounded FIFO for room at the engines (429 queue_full when it is full), then
        `dispatch`; the slot is held until the response (or stream) ends."""
        queue, metrics = self.queue, self.metrics
        try:
            fut = queue.join()
        except QueueFullError as full:
            metrics.child(metrics.drops, slo_class, "queue_full").inc()
            raise rate_limited(
                f"the router's best-effort queue is full ({queue.capacity} waiting); retry later",
                "queue_full",
                full.retry_after_s,
            ) from None
        if fut is not None:
            metrics.best_effort_queued.set(queue.queued)
            try:
                await self._await_slot(fut, model, request)
            except BaseException:
                queue.cancel(fut)
                raise
            finally:
                metrics.best_effort_queued.set(queue.queued)
        metrics.best_effort_active.set(queue.active)
        held_from = self.clock()

        def leave() -> None:
            queue.leave(self.clock() - held_from)
            metrics.best_effort_active.set(queue.active)
            metrics.best_effort_queued.set(queue.queued)

        try:
            response = await dispatch()
        except BaseException:
            leave()
            raise
        if isinstance(response, RelayResponse):
            response.also_on_close(leave)
        else:
            leave()
        return response

    async def _await_slot(self, fut: asyncio.Future[None], model: str, request: Request) -> None:
        """Wait for a best-effort slot. While some engine is usable there is no time limit (best-effort
        is never dropped for waiting); with none usable for --best-effort-max-wait, a 503 no_replica.
        A client that leaves while queued gives its place up (no ghost requests after a burst whose
        clients timed out)."""
        check_s = min(5.0, self.config.best_effort_max_wait_s)  # thousands may wait: look up rarely
        waited_without_engine = 0.0
        # The body is read: the next ASGI message can only be the disconnect.
        gone = asyncio.get_running_loop().create_task(request.receive())
        try:
            while True:
                done, _ = await asyncio.wait(
                    (fut, gone), timeout=check_s, return_when=asyncio.FIRST_COMPLETED
                )
                if fut in done:
                    return
                if gone in done:
                    self.metrics.child(self.metrics.drops, "best-effort", "client_disconnect").inc()
                    raise RouterError(
                        499, "client closed the request while it was queued", code="client_gone"
                    )
                if self.pool.serving(model):
                    waited_without_engine = 0.0
                    continue
                waited_without_engine += check_s
                if waited_without_engine >= self.config.best_effort_max_wait_s:
                    self.metrics.child(self.metrics.drops, "best-effort", "no_replica").inc()
                    raise unavailable(
                        f"no engine replica is available for model {model!r} within "
                        f"{self.config.best_effort_max_wait_s:g}s",
                        "no_replica",
                    )
        finally:
            gone.cancel()
