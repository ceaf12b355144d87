"""Admission, placement and retries for one request: sample K replicas, decide, send, and try another
replica when one fails before the first token.

Placement itself is the core's (`scheduler/admission.py: decide`, which calls `place()`); this module
feeds it the K sampled replicas' states (pool.candidates) and sends the request with aiohttp. The
engine body is serialised once per request (`EngineBody`); a retry only re-encodes its `vllm_xargs`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import numpy as np
from starlette.responses import Response

from jitserve.router.classes import ClassRegistry
from jitserve.router.config import RouterConfig
from jitserve.router.errors import REJECTION_HEADER, RateLimitedLog, rate_limited, unavailable
from jitserve.router.flight import Flight
from jitserve.router.inbound import Inbound
from jitserve.router.locality import PrefixIndex
from jitserve.router.metrics import RouterMetrics
from jitserve.router.outbound import EngineBody
from jitserve.router.pool import Pool
from jitserve.router.programs import StageDeadline
from jitserve.router.relay import Relay
from jitserve.router.replicas import Replica
from jitserve.router.upstream import PATHS, RETRYABLE, Attempt
from jitserve.scheduler.admission import Action, Decision, decide
from jitserve.scheduler.contracts.xargs import render_xargs
from jitserve.scheduler.placement import Rejection
from jitserve.scheduler.requests import NewRequest
from jitserve.scheduler.slo import OverloadAction, SLOType


def least_loaded(states: list[Any]) -> int:
    """Index of the replica with the shortest expected queue, then the fewest requests per batch slot."""
    return min(
        range(len(states)),
        key=lambda i: (
            states[i].queue_delay_s,
            (states[i].running + states[i].waiting) / max(states[i].batch_size, 1),
        ),
    )


class Dispatcher:
    def __init__(
        self,
        config: RouterConfig,
        pool: Pool,
        classes: ClassRegistry,
        prefixes: PrefixIndex,
        metrics: RouterMetrics,
        relay: Relay,
        session: Callable[[], aiohttp.ClientSession],
        log_limited: RateLimitedLog,
    ) -> None:
        self.config = config
        self.pool = pool
        self.classes = classes
        self.prefixes = prefixes
        self.metrics = metrics
        self.relay = relay
        self.session = session
        self.log_limited = log_limited
        self.clock = pool.clock
        self.rng = np.random.default_rng(config.seed)

    async def dispatch(
        self,
        inbound: Inbound,
        new: NewRequest,
        slo_class: str,
        overload: OverloadAction,
        tenant: str,
        plan: StageDeadline | None,
    ) -> Response:
        tried: set[str] = set()
        attempts = 0
        body = EngineBody(inbound.body)  # serialised once; attempts splice in their own vllm_xargs
        while True:
            reps, states = await self._candidates(inbound, new, tried)
            t0 = time.perf_counter()
            decision = decide(
                new,
                slo_class,
                overload,
                self.classes.table.classes,
                states,
                self.clock(),
                k=None,  # pool.candidates sampled the K already (the same draw place() would make)
                cached_tokens=self.prefixes.cached_tokens(
                    inbound.prefix_key, [r.name for r in reps], new.input_len
                ),
                rng=self.rng,
            )
            if decision.action is Action.REJECT and new.slo.type is SLOType.BEST_EFFORT:
                # No SLO to miss: best-effort waits at the engine with the least work ahead of it (the
                # best-effort queue already bounds how many wait there) rather than being turned away.
                decision = Decision(
                    Action.ADMIT, least_loaded(states), new, slo_class, "best-effort: least-loaded engine"
                )
            self.metrics.placement.observe(time.perf_counter() - t0)
            if attempts == 0:
                self.metrics.child(self.metrics.admissions, slo_class, decision.action.value).inc()
            if decision.action is Action.REJECT:
                # decide() names the rule of every REJECT; the fallback only narrows the type
                rule = (decision.rejection or Rejection.NO_TIME).value
                self.metrics.child(self.metrics.rejections, slo_class, rule).inc()  # one per 429 sent
                raise rate_limited(
                    f"no engine replica can meet this request's SLO (class {slo_class!r}): {decision.reason}",
                    "slo_unattainable",
                    decision.retry_after_s or 1.0,
                    headers={REJECTION_HEADER: rule},
                )
            assert decision.replica is not None
            replica = reps[decision.replica]
            result = await self._try_replica(inbound, body, decision, replica, tenant, plan)
            if isinstance(result, Response):
                return result
            tried.add(replica.name)
            attempts += 1
            self.metrics.child(self.metrics.retries, result).inc()
            if attempts > self.config.max_retries:
                self.metrics.child(self.metrics.drops, slo_class, "upstream_error").inc()
                raise unavailable(
                    f"engine pods failed before the first token ({attempts} tried; last: {result})",
                    "upstream_unavailable",
                )

    async def _candidates(
        self, inbound: Inbound, new: NewRequest, tried: set[str]
    ) -> tuple[list[Replica], list[Any]]:
        """K sampled usable replicas for the model; waits while there are none: up to the request's
        waiting_time, or for best-effort (never dropped for waiting) up to --best-effort-max-wait."""
        best_effort = new.slo.type is SLOType.BEST_EFFORT
        patience = self.config.best_effort_max_wait_s if best_effort else new.slo.waiting_time
        # best-effort may have waited in its queue already (engines busy, not gone): its patience for
        # a usable engine starts now
        deadline = (self.clock() if best_effort else new.arrival) + patience
        exclude = frozenset(tried)
        k, rng = self.config.k, self.rng
        while True:
            reps, states = self.pool.candidates(inbound.model, exclude, k, rng)
            if reps:
                return reps, states
            if tried:
                # Every untried pod is gone; pods that failed for this request but are still usable (a
                # timeout that their probe did not confirm) may take the retry.
                reps, states = self.pool.candidates(inbound.model, frozenset(), k, rng)
                if reps:
                    return reps, states
            left = deadline - self.clock()
            if left <= 0 or tried:
                self.metrics.child(
                    self.metrics.drops, "unknown" if not tried else "retry", "no_replica"
                ).inc()
                raise unavailable(
                    "no engine replica is available for model "
                    f"{inbound.model!r}"
                    + (" (all tried pods failed)" if tried else f" within {patience:g}s"),
                    "no_replica",
                )
            self.pool.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.pool.changed.wait(), timeout=min(left, self.pool.poll_interval_s))

    def _first_token_timeout(self, flight: Flight, replica: Replica) -> float | None:
        """Streams with an SLO: no token within the longest it may wait unstarted (waiting_time; deadline
        work: its deadline if later) + prefill estimate + grace is a drop (the engine should have dropped
        it). Best-effort has no such bound (it is never dropped for waiting; a hung engine is caught by
        the health probe instead)."""
        if flight.slo.type is SLOType.BEST_EFFORT:
            return None
        prefill = (
            replica.state.prefill_tokens_per_s if replica.state else self.pool.defaults.prefill_tokens_per_s
        )
        return flight.slo.unstarted_wait + self.config.first_token_grace_s + flight.input_len / prefill

    async def _try_replica(
        self,
        inbound: Inbound,
        body: EngineBody,
        decision: Decision,
        replica: Replica,
        tenant: str,
        plan: StageDeadline | None,
    ) -> Response | str:
        """Send to one replica: the response, or a retry reason if it failed before the first token."""
        new = decision.request
        now = self.clock()
        staged = plan is not None and decision.action is Action.ADMIT
        xargs = render_xargs(
            decision.slo_class,
            new.slo,
            tenant,
            send_class=decision.slo_class in self.classes.table.classes,
            deadline_rel=plan.program_deadline_abs - now if staged and plan else None,
            stage_deadline_rel=new.deadline_abs - now if staged and new.deadline_abs is not None else None,
            program_id=inbound.program_id if staged else None,
            program_goodput=new.program_goodput,
            length_bound=new.len_ub if new.len_ub is not None and new.len_ub < new.max_tokens else None,
        )
        headers = {
            "content-type": "application/json",
            "accept-encoding": "identity",
            "x-request-id": new.request_id,
        }
        self.pool.dispatched(replica, new.input_len)
        flight = Flight(
            new.request_id,
            decision.slo_class,
            new.slo,
            new.arrival,
            new.input_len,
            inbound.program_id if plan is not None else None,
            inbound.model,
            new.max_tokens,
        )
        attempt = Attempt()
        replica.attempts.add(attempt)  # the health probe ends it if the pod stops answering
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                replica.attempts.discard(attempt)
                self.pool.released(replica)

        # Deadlines, on the loop's clock. Streams: response headers within --header-timeout (vLLM sends
        # them before the request is scheduled) and, with an SLO, the first token within its bound,
        # counted from now (so the wait for the headers is part of it). Unary responses carry their
        # headers with the whole answer: only the health probe bounds them.
        loop = asyncio.get_running_loop()
        started = loop.time()
        first_timeout = self._first_token_timeout(flight, replica) if inbound.stream else None
        first_deadline = None if first_timeout is None else started + first_timeout
        header_deadline = started + self.config.header_timeout_s if inbound.stream else None
        phase_deadline = min((d for d in (first_deadline, header_deadline) if d is not None), default=None)
        try:
            async with asyncio.timeout_at(phase_deadline) as scope:
                attempt.enter(scope)
                upstream = await self.session().post(
                    replica.url + PATHS[inbound.kind], data=body.with_xargs(xargs), headers=headers
                )
        except RETRYABLE as exc:  # refused, reset, aiohttp's own connect timeout
            attempt.scope = None
            release()
            if attempt.aborted:
                return "unresponsive"
            self.pool.connect_failed(replica, exc)
            self.log_limited(
                logging.WARNING, f"connect:{replica.name}", "pod %s failed before the first token: %r",
                replica.name, exc,
            )  # fmt: skip
            return type(exc).__name__
        except TimeoutError:
            attempt.scope = None
            release()
            if attempt.aborted:
                return "unresponsive"
            if first_deadline is not None and first_deadline == phase_deadline:
                # not even headers within its first-token bound: as a stream drop
                return self.relay.dropped(flight)
            self.pool.suspect(replica)  # no headers in time: probe the pod; try the request elsewhere
            return "header_timeout"
        attempt.scope = None
        attempt.upstream = upstream
        replica.last_byte = self.clock()  # it answered: alive (for unary, the whole answer is here)
        if upstream.status >= 500:
            upstream.close()
            release()
            return f"http_{upstream.status}"
        out_headers = {
            "x-jitserve-pod": replica.name,
            "x-jitserve-slo-class": decision.slo_class,
            "x-jitserve-admission": decision.action.value,
            "x-request-id": new.request_id,
        }
        if upstream.status != 200:
            # The engine's own 4xx (its validation): pass it back as it is.
            try:
                content = await upstream.read()
            except RETRYABLE as exc:
                release()
                return "unresponsive" if attempt.aborted else type(exc).__name__
            finally:
                upstream.release()
            release()
            return Response(content, upstream.status, out_headers, upstream.headers.get("content-type"))
        self.metrics.child(self.metrics.pod_choice, replica.name).inc()
        self.prefixes.served(inbound.prefix_key, replica.name)
        if not inbound.stream:
            return await self.relay.unary(upstream, flight, out_headers, release, attempt)
        return await self.relay.stream(
            upstream, flight, out_headers, release, replica, attempt, first_deadline
        )
