"""One request through the router: parse, authenticate, resolve the SLO, admit, place, proxy, account.

The decisions are the pure functions of inbound.py, admission.py, programs.py and outbound.py; this
module is the adapter that runs them on the event loop and moves bytes with aiohttp (a tenth of httpx's
CPU per proxied stream here, docs/decisions/router.md; the state polls use aiohttp too). Streams are
relayed chunk by chunk (never buffered whole); the first chunk is read before the response is committed, so a
pod that fails before the first token is retried on another pod and a drop becomes a real HTTP error.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import math
import re
import secrets
import time
from array import array
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from jitserve.router.accounting import Accounting
from jitserve.router.analysis import LengthBounds
from jitserve.router.auth import Keyring
from jitserve.router.classes import ClassRegistry
from jitserve.router.config import RouterConfig
from jitserve.router.errors import RateLimitedLog, RouterError, bad_request, rate_limited, unavailable
from jitserve.router.inbound import Inbound, Kind, body_too_large, parse_inbound, parse_json_object
from jitserve.router.locality import PrefixIndex
from jitserve.router.metrics import RouterMetrics
from jitserve.router.outbound import engine_xargs, forward_body
from jitserve.router.pool import Pool
from jitserve.router.programs import Program, ProgramTracker, StagePlan
from jitserve.router.queueing import BestEffortQueue, QueueFullError
from jitserve.router.replicas import Replica
from jitserve.scheduler.admission import Action, Decision, decide
from jitserve.scheduler.analyzer.patterns import PatternStore
from jitserve.scheduler.goodput import Goodput, RequestRecord
from jitserve.scheduler.requests import NewRequest
from jitserve.scheduler.slo import SLO, OverloadAction, SLOError, SLOType, resolve_request_slo

log = logging.getLogger("jitserve.router")

PATHS: dict[Kind, str] = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}
# Failures of the engine connection: before the first token they mean "try another pod".
_RETRYABLE = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError)
_ROLE_ONLY = b'"delta":{"role":"assistant","content":""}'  # vLLM's opening chunk of a chat stream
_STOP_REASON = re.compile(rb'"stop_reason":\s*"([^"]{0,300})"')
_NO_RETRY = {"x-should-retry": "false"}  # tells the OpenAI SDK not to retry (the SLO is already lost)
# The SLO model's field names -> the request field a client sent (400s name what the client wrote)
_SLO_PARAM = {
    "ttft": "target_ttft",
    "ttftSeconds": "target_ttft",
    "tbt": "target_tbt",
    "tbtSeconds": "target_tbt",
    "deadlineSeconds": "deadline",
    "waitingTimeSeconds": "waiting_time",
}


Resolved = tuple[str, SLO, OverloadAction, float | None]  # class name, SLO, overload action, per-stage D


class Attempt:
    """One request in flight on one engine, registered with its replica so the health probe can end it
    when the engine stops answering: before the response headers, by expiring the phase's timeout
    scope; after, by failing the response body's reader (the relay then sends an error event, or the
    request is retried elsewhere while the client has nothing yet)."""

    __slots__ = ("scope", "upstream", "aborted")

    def __init__(self) -> None:
        self.scope: asyncio.Timeout | None = None
        self.upstream: aiohttp.ClientResponse | None = None
        self.aborted = False

    def enter(self, scope: asyncio.Timeout) -> None:
        self.scope = scope
        if self.aborted:
            scope.reschedule(0)  # aborted between phases: expire at once

    def abort(self) -> None:
        if self.aborted:
            return
        self.aborted = True
        if self.scope is not None:
            with contextlib.suppress(RuntimeError):  # already expiring or left
                self.scope.reschedule(0)
        if self.upstream is not None:
            self.upstream.content.set_exception(aiohttp.ClientPayloadError("engine pod stopped responding"))
            self.upstream.close()


def least_loaded(states: list[Any]) -> int:
    """Index of the replica with the shortest expected queue, then the fewest requests per batch slot."""
    return min(
        range(len(states)),
        key=lambda i: (
            states[i].queue_delay_s,
            (states[i].running + states[i].waiting) / max(states[i].batch_size, 1),
        ),
    )


@dataclass(slots=True)
class Flight:
    """Bookkeeping of one admitted request while it runs."""

    request_id: str
    slo_class: str
    slo: SLO
    arrival: float
    input_len: int
    program_id: str | None
    model: str
    max_tokens: int
    token_times: array = field(default_factory=lambda: array("d"))
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    dropped: bool = False
    finish: float | None = None


class Router:
    def __init__(
        self,
        config: RouterConfig,
        pool: Pool,
        classes: ClassRegistry,
        keyring: Keyring,
    ) -> None:
        self.config = config
        self.pool = pool
        self.classes = classes
        self.keyring = keyring
        self.metrics = RouterMetrics()
        self.accounting = Accounting(config.status_window_s)
        self.programs = ProgramTracker(
            config.max_programs,
            config.program_idle_timeout_s,
            store=PatternStore() if config.pattern_graphs else None,
            on_finish=self._program_done,
        )
        self.lengths = LengthBounds(
            config.length_predictor, min_refit_interval_s=config.length_refit_interval_s
        )
        self.prefixes = PrefixIndex(config.prefix_cache_entries)
        self.rng = np.random.default_rng(config.seed)
        self._session: aiohttp.ClientSession | None = None  # the data path
        self._poll_session: aiohttp.ClientSession | None = None  # state polls (own connections)
        self.inflight = 0
        self.tenants: dict[str, int] = {}
        # SLO resolution of requests that name at most a class, per class table (SLOs are immutable)
        self._resolved: dict[tuple[str | None, int | None], Resolved] = {}
        self._resolved_table: Any = None
        self._ids = itertools.count()
        self._id_prefix = f"jr-{secrets.token_hex(6)}-"  # unique per router process; a counter follows
        self.clock = pool.clock
        self.log_limited = RateLimitedLog(log)  # one line per kind of event per 10 s, never a traceback
        self.be_queue = BestEffortQueue(config.best_effort_queue, self.best_effort_slots)
        pool.on_poll = self.be_queue.kick  # engines that came up (or grew their batch) take queued work
        pool.on_unresponsive = self.metrics.unresponsive.inc

    # -- entry point ---------------------------------------------------------------------------------
    async def handle(self, kind: Kind, request: Request) -> Response:
        if self.inflight >= self.config.max_inflight:
            self.metrics.child(self.metrics.drops, "unknown", "router_overloaded").inc()
            return error_response(
                rate_limited(
                    f"router is at its limit of {self.config.max_inflight} open requests; retry later",
                    "router_overloaded",
                    1.0,
                )
            )
        self.inflight += 1
        self.metrics.inflight.inc()
        handed_off = False
        try:
            response = await self._handle(kind, request)
            handed_off = isinstance(response, RelayResponse)
            return response
        except RouterError as err:
            if err.status in (400, 401, 404, 413):
                self.metrics.child(self.metrics.bad_requests, err.code or "invalid").inc()
                self.log_limited(
                    logging.INFO, f"bad:{err.code}", "rejected request: %d %s (param %s): %.200s",
                    err.status, err.code, err.param, err.message,
                )  # fmt: skip
            return error_response(err)
        finally:
            if not handed_off:  # a stream releases its slot when it ends
                self._release_slot()

    def session(self) -> aiohttp.ClientSession:
        """The engine connection pool, created on first use (aiohttp needs the running loop)."""
        if self._session is None:
            self._session = make_session(self.config)
        return self._session

    def poll_session(self) -> aiohttp.ClientSession:
        """Connections for the state polls, apart from the data path's (created on first use)."""
        if self._poll_session is None:
            self._poll_session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30),
                cookie_jar=aiohttp.DummyCookieJar(),
                skip_auto_headers=("User-Agent",),
            )
        return self._poll_session

    async def aclose(self) -> None:
        self.lengths.close()
        for session in (self._session, self._poll_session):
            if session is not None:
                await session.close()

    def _release_slot(self) -> None:
        self.inflight -= 1
        self.metrics.inflight.dec()

    async def _handle(self, kind: Kind, request: Request) -> Response:
        arrival = self.clock()
        raw = await read_body(request, self.config.max_body_bytes)
        tenant = self.keyring.tenant(request.headers.get("authorization"))
        inbound = parse_inbound(kind, parse_json_object(raw), request.headers)
        self._check_model(inbound.model)
        slo_class, slo, overload, per_stage = self._resolve(inbound)
        self.metrics.child(self.metrics.requests, kind, slo_class).inc()
        plan = self._stage(inbound, slo_class, slo, arrival, per_stage)
        max_tokens = inbound.max_tokens or self.config.default_max_tokens
        request_id = request.headers.get("x-request-id") or f"{self._id_prefix}{next(self._ids):x}"
        new = NewRequest(
            request_id=request_id,
            slo=slo,
            arrival=arrival,
            input_len=inbound.input_len,
            max_tokens=max_tokens,
            len_ub=self.lengths.bound(inbound.input_len, slo.type, slo_class, inbound.model, max_tokens),
            deadline_abs=plan.deadline_abs if plan else None,
            program_goodput=plan.program_goodput if plan else 0.0,
            tenant=self._tenant_id(tenant),
        )
        try:
            if slo.type is SLOType.BEST_EFFORT:
                return await self._best_effort(inbound, new, slo_class, overload, tenant, plan, request)
            return await self._dispatch(inbound, new, slo_class, overload, tenant, plan)
        except RouterError as err:
            if inbound.program_id is not None and plan is not None:
                record = RequestRecord(slo, arrival, inbound.input_len, dropped=True)
                self.programs.end_call(inbound.program_id, record, inbound.model, arrival)
            raise err

    async def _best_effort(
        self,
        inbound: Inbound,
        new: NewRequest,
        slo_class: str,
        overload: OverloadAction,
        tenant: str,
        plan: StagePlan | None,
        request: Request,
    ) -> Response:
        """Best-effort: wait in the bounded FIFO for room at the engines (429 queue_full when it is
        full), then dispatch; the slot is held until the response (or stream) ends."""
        try:
            fut = self.be_queue.join()
        except QueueFullError as full:
            self.metrics.child(self.metrics.drops, slo_class, "queue_full").inc()
            raise rate_limited(
                f"the router's best-effort queue is full ({self.be_queue.capacity} waiting); retry later",
                "queue_full",
                full.retry_after_s,
            ) from None
        if fut is not None:
            self.metrics.best_effort_queued.set(self.be_queue.queued)
            try:
                await self._await_slot(fut, inbound.model, request)
            except BaseException:
                self.be_queue.cancel(fut)
                raise
            finally:
                self.metrics.best_effort_queued.set(self.be_queue.queued)
        self.metrics.best_effort_active.set(self.be_queue.active)
        held_from = self.clock()

        def leave() -> None:
            self.be_queue.leave(self.clock() - held_from)
            self.metrics.best_effort_active.set(self.be_queue.active)
            self.metrics.best_effort_queued.set(self.be_queue.queued)

        try:
            response = await self._dispatch(inbound, new, slo_class, overload, tenant, plan)
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
                if any(r.serves(model) for r in self.pool.usable()):
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

    def best_effort_slots(self) -> int:
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

    # -- resolution ----------------------------------------------------------------------------------
    def _check_model(self, model: str) -> None:
        known = self.pool.models() | self.config.served_models
        if known and model not in known:
            raise RouterError(
                404,
                f"model {model!r} is not served here (available: {', '.join(sorted(known))})",
                "invalid_request_error",
                "model",
                "model_not_found",
            )

    def _resolve(self, inbound: Inbound) -> Resolved:
        table = self.classes.table
        fields = dict(inbound.slo_fields)
        if inbound.program_id is not None and not fields.keys() - {"waiting_time"}:
            # A program id without an SLO: the pool's compound class, so the program gets one deadline.
            compound = sorted(n for n, s in table.classes.items() if s.type is SLOType.COMPOUND)
            if compound:
                fields["slo_class"] = "compound" if "compound" in compound else compound[0]
        key = None
        if fields.keys() <= {"slo_class"} and isinstance(fields.get("slo_class", ""), str):
            # Only a class name (or nothing): the answer depends on the class table alone.
            if table is not self._resolved_table:
                self._resolved.clear()
                self._resolved_table = table
            key = (fields.get("slo_class"), inbound.program_stages)
            found = self._resolved.get(key)
            if found is not None:
                return found
        result = self._resolve_fields(fields, table, inbound.program_stages)
        if key is not None and len(self._resolved) < 4096:  # program_stages comes from clients: bounded
            self._resolved[key] = result
        return result

    @staticmethod
    def _resolve_fields(fields: dict[str, Any], table: Any, program_stages: int | None) -> Resolved:
        try:
            name, slo = resolve_request_slo(fields, table.classes, table.default_class(), program_stages or 1)
        except SLOError as exc:
            code = "unknown_slo_class" if exc.field == "slo_class" else "invalid_slo"
            raise bad_request(str(exc), param=_SLO_PARAM.get(exc.field, exc.field), code=code) from None
        except ValidationError as exc:  # a bound the SLO model checks and inbound.py did not: still a 400
            err = exc.errors()[0] if exc.errors() else {"loc": (), "msg": str(exc)}
            loc = ".".join(map(str, err.get("loc", ()))) or "slo"
            param = _SLO_PARAM.get(loc, loc)
            raise bad_request(f"{param}: {err.get('msg')}", param=param, code="invalid_slo") from None
        spec = table.classes.get(name)
        overload = spec.overload if spec is not None else OverloadAction.REJECT
        per_stage = None
        if spec is not None and spec.perStage and program_stages is None and "deadline" not in fields:
            per_stage = spec.deadlineSeconds
        return name, slo, overload, per_stage

    def _stage(
        self, inbound: Inbound, slo_class: str, slo: SLO, now: float, per_stage: float | None
    ) -> StagePlan | None:
        if inbound.program_id is None or slo.type is not SLOType.COMPOUND:
            return None
        return self.programs.begin_stage(
            inbound.program_id,
            slo_class,
            slo,
            now,
            inbound.program_stages,
            per_stage,
            model=inbound.model,
            input_len=inbound.input_len,
        )

    def _tenant_id(self, tenant: str) -> int:
        tid = self.tenants.get(tenant)
        if tid is None:
            tid = self.tenants[tenant] = len(self.tenants)
        return tid

    # -- admission, placement, proxying --------------------------------------------------------------
    async def _dispatch(
        self,
        inbound: Inbound,
        new: NewRequest,
        slo_class: str,
        overload: OverloadAction,
        tenant: str,
        plan: StagePlan | None,
    ) -> Response:
        tried: set[str] = set()
        attempts = 0
        while True:
            reps, states = await self._candidates(inbound, new, tried)
            t0 = time.perf_counter()
            names = [r.name for r in reps]
            decision = decide(
                new,
                slo_class,
                overload,
                self.classes.table.classes,
                states,
                self.clock(),
                k=self.config.k,
                cached_tokens=self.prefixes.cached_tokens(inbound.prefix_key, names, new.input_len),
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
                raise rate_limited(
                    f"no engine replica can meet this request's SLO (class {slo_class!r}): {decision.reason}",
                    "slo_unattainable",
                    decision.retry_after_s or 1.0,
                )
            assert decision.replica is not None
            replica = reps[decision.replica]
            result = await self._try_replica(inbound, decision, replica, tenant, plan)
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
        """Usable replicas for the model; waits while there are none: up to the request's waiting_time,
        or for best-effort (never dropped for waiting) up to --best-effort-max-wait."""
        best_effort = new.slo.type is SLOType.BEST_EFFORT
        patience = self.config.best_effort_max_wait_s if best_effort else new.slo.waiting_time
        # best-effort may have waited in its queue already (engines busy, not gone): its patience for
        # a usable engine starts now
        deadline = (self.clock() if best_effort else new.arrival) + patience
        exclude = frozenset(tried)
        while True:
            reps, states = self.pool.candidates(inbound.model, exclude)
            if reps:
                return reps, states
            if tried:
                # Every untried pod is gone; pods that failed for this request but are still usable (a
                # timeout that their probe did not confirm) may take the retry.
                reps, states = self.pool.candidates(inbound.model)
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
        """Streams with an SLO: no token within waiting_time + prefill estimate + grace is a drop (the
        engine should have dropped it). Best-effort has no such bound (it is never dropped for waiting;
        a hung engine is caught by the health probe instead)."""
        if flight.slo.type is SLOType.BEST_EFFORT:
            return None
        prefill = (
            replica.state.prefill_tokens_per_s if replica.state else self.pool.defaults.prefill_tokens_per_s
        )
        return flight.slo.waiting_time + self.config.first_token_grace_s + flight.input_len / prefill

    async def _try_replica(
        self, inbound: Inbound, decision: Decision, replica: Replica, tenant: str, plan: StagePlan | None
    ) -> Response | str:
        """Send to one replica: the response, or a retry reason if it failed before the first token."""
        new = decision.request
        now = self.clock()
        staged = plan is not None and decision.action is Action.ADMIT
        xargs = engine_xargs(
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
        body = forward_body(inbound.body, xargs)
        headers = {
            "content-type": "application/json",
            "accept-encoding": "identity",
            "x-request-id": new.request_id,
        }
        self.pool.dispatched(replica)
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
                    replica.url + PATHS[inbound.kind], data=body, headers=headers
                )
        except _RETRYABLE as exc:  # refused, reset, aiohttp's own connect timeout
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
                flight.dropped = True  # not even headers within its first-token bound: as a stream drop
                self._finish(flight, self.clock(), "waiting_time")
                return error_response(self._drop_error(flight), extra=_NO_RETRY)
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
            except _RETRYABLE as exc:
                release()
                return "unresponsive" if attempt.aborted else type(exc).__name__
            finally:
                upstream.release()
            release()
            return Response(content, upstream.status, out_headers, upstream.headers.get("content-type"))
        self.metrics.child(self.metrics.pod_choice, replica.name).inc()
        self.prefixes.served(inbound.prefix_key, replica.name)
        if not inbound.stream:
            return await self._unary(upstream, flight, out_headers, release, attempt)
        return await self._stream(upstream, flight, out_headers, release, replica, attempt, first_deadline)

    async def _unary(
        self,
        upstream: aiohttp.ClientResponse,
        flight: Flight,
        headers: dict[str, str],
        release: Any,
        attempt: Attempt,
    ) -> Response | str:
        try:
            content = await upstream.read()
        except _RETRYABLE as exc:
            upstream.close()
            release()
            return "unresponsive" if attempt.aborted else type(exc).__name__
        upstream.release()
        release()
        now = self.clock()
        finish_reason = None
        try:
            doc = json.loads(content)
            usage = doc.get("usage") or {}
            flight.prompt_tokens = usage.get("prompt_tokens")
            flight.completion_tokens = usage.get("completion_tokens")
            choices = doc.get("choices") or []
            finish_reason = choices[0].get("finish_reason") if choices else None
        except (ValueError, AttributeError, TypeError, RecursionError):
            pass
        n = flight.completion_tokens if isinstance(flight.completion_tokens, int) else 0
        flight.token_times.extend([now] * max(min(n, 1 << 24), 0))
        if finish_reason in self.config.drop_finish_reasons:
            flight.dropped = True
            self._finish(flight, now, "waiting_time")
            return error_response(self._drop_error(flight, content), extra=_NO_RETRY)
        flight.finish = now
        self._finish(flight, now, None)
        return Response(content, 200, headers, "application/json")

    async def _stream(
        self,
        upstream: aiohttp.ClientResponse,
        flight: Flight,
        headers: dict[str, str],
        release: Any,
        replica: Replica,
        attempt: Attempt,
        first_deadline: float | None,
    ) -> Response | str:
        chunks = upstream.content.iter_any()
        try:
            async with asyncio.timeout_at(first_deadline):
                first = await anext(chunks)
                if _ROLE_ONLY in first and not self._has_finish(first) and b"data: [DONE]" not in first:
                    # A chat stream opens with its role chunk, written with the first engine output in
                    # the same iteration: read on, so a drop (role chunk, then [DONE]) is still an
                    # HTTP error rather than an error event in a committed 200 stream.
                    first += await anext(chunks)
        except (StopAsyncIteration, *_RETRYABLE) as exc:
            upstream.close()
            release()
            return "unresponsive" if attempt.aborted else type(exc).__name__
        except TimeoutError:
            # Not started within waiting_time (plus prefill and grace): closing the stream aborts it in
            # the engine, and the client learns why.
            upstream.close()
            release()
            flight.dropped = True
            self._finish(flight, self.clock(), "waiting_time")
            return error_response(self._drop_error(flight), extra=_NO_RETRY)
        replica.last_byte = self.clock()
        dropped_at_once = self._is_drop(first) and not self._events_before_drop(first)
        if dropped_at_once or self._ended_unfinished(first):
            upstream.close()
            release()
            flight.dropped = True
            self._finish(flight, self.clock(), "waiting_time")
            return error_response(self._drop_error(flight, first), extra=_NO_RETRY)
        state = {"reason": "client_disconnect", "closed": False, "last": False, "finished": False}

        async def close() -> None:
            # Idempotent; runs from the relay's finally, or from RelayResponse if the relay never started.
            if state["closed"]:
                return
            state["closed"] = True
            # A finished stream returns its connection to the pool; any other end closes it, which
            # makes the engine abort the request (no work for a client that is gone).
            if state["reason"] is None:
                upstream.release()
            else:
                upstream.close()
            release()
            if state["reason"] == "client_disconnect":
                flight.dropped = True
            self._finish(flight, self.clock(), state["reason"])
            self._release_slot()

        return RelayResponse(
            self._relay(first, chunks, flight, state, close, upstream.content.at_eof, replica, attempt),
            close,
            lambda: state["last"],
            status_code=200,
            headers=headers,
            media_type=upstream.headers.get("content-type", "text/event-stream"),
        )

    async def _relay(
        self,
        first: bytes,
        chunks: AsyncIterator[bytes],
        flight: Flight,
        state: dict[str, Any],
        close: Any,
        at_eof: Any,
        replica: Replica,
        attempt: Attempt,
    ) -> AsyncIterator[bytes]:
        try:
            chunk: bytes | None = first
            while chunk is not None:
                if self._is_drop(chunk):
                    flight.dropped = True
                    state["reason"] = "waiting_time"
                    # Events before the drop are the client's; the abort event and [DONE] become the error.
                    kept = self._events_before_drop(chunk)
                    if kept:
                        self._tokens(flight, kept)
                        yield kept
                    yield self._drop_error(flight, chunk).sse_event() + b"data: [DONE]\n\n"
                    return
                state["finished"] = state["finished"] or self._has_finish(chunk)
                if not state["finished"] and self._ended_unfinished(chunk):
                    # Dropped before its first token: vLLM writes no finish chunk then (only the chat
                    # role chunk was relayed), so without this the client would see an empty success.
                    flight.dropped = True
                    state["reason"] = "waiting_time"
                    kept = self._events_before_drop(chunk)
                    if kept:
                        yield kept
                    yield self._drop_error(flight, chunk).sse_event() + b"data: [DONE]\n\n"
                    return
                self._tokens(flight, chunk)
                # The engine's stream already ended (its terminating chunk is read): nothing can follow.
                state["last"] = at_eof()
                yield chunk
                chunk = await anext(chunks, None)
                replica.last_byte = self.clock()  # alive: its probe must not call it hung
            flight.finish = self.clock()
            state["reason"] = None
        except (*_RETRYABLE, TimeoutError) as exc:
            flight.dropped = True
            if attempt.aborted:
                state["reason"] = "upstream_unresponsive"
                err = RouterError(
                    502,
                    f"engine pod {replica.name} stopped responding (no answer to its health check within "
                    f"{self.pool.unresponsive_timeout_s:g}s); the stream ends here",
                    "api_error",
                    None,
                    "upstream_unresponsive",
                )
            else:
                state["reason"] = "upstream_error"
                err = RouterError(
                    502,
                    f"engine pod failed mid-stream: {type(exc).__name__}",
                    "api_error",
                    None,
                    "upstream_failed",
                )
            yield err.sse_event() + b"data: [DONE]\n\n"
        finally:
            await close()

    # -- stream inspection ---------------------------------------------------------------------------
    def _events_before_drop(self, chunk: bytes) -> bytes:
        """The SSE events of `chunk` other than the drop (abort) event and [DONE]."""
        kept = [e for e in chunk.split(b"\n\n") if e.strip() and not self._is_drop(e) and b"[DONE]" not in e]
        return b"\n\n".join(kept) + b"\n\n" if kept else b""

    @staticmethod
    def _has_finish(chunk: bytes) -> bool:
        """Whether a choice in `chunk` carries a finish_reason (vLLM ends every finished stream so)."""
        return b'"finish_reason":"' in chunk or b'"finish_reason": "' in chunk

    def _ended_unfinished(self, chunk: bytes) -> bool:
        """The stream ends ([DONE]) and no choice in `chunk` finished: vLLM's stream of a request its
        engine aborted before generating a token (it skips empty outputs, the abort's included). The
        JITServe engine aborts only requests past their waiting_time, so this is that drop."""
        return b"data: [DONE]" in chunk and not self._has_finish(chunk)

    def _is_drop(self, chunk: bytes) -> bool:
        if b'"finish_reason":"' not in chunk and b'"finish_reason": "' not in chunk:
            return False
        return any(
            (f'"finish_reason":"{r}"'.encode() in chunk) or (f'"finish_reason": "{r}"'.encode() in chunk)
            for r in self.config.drop_finish_reasons
        )

    def _tokens(self, flight: Flight, chunk: bytes) -> None:
        """One SSE event per generated token (vLLM streams one per step): record its time."""
        events = chunk.count(b"data: ") - chunk.count(b"data: [DONE]")
        if events <= 0:
            return
        now = self.clock()
        times = flight.token_times
        tbt = self.metrics.tbt
        if times:
            tbt.observe(flight.slo_class, now - times[-1])
        else:
            self.metrics.child(self.metrics.ttft, flight.slo_class).observe(now - flight.arrival)
        # Events that arrived in one read came together: their gaps are zero (one TBT per token).
        if events > 1:
            tbt.observe(flight.slo_class, 0.0, events - 1)
        times.extend(itertools.repeat(now, events))
        if b'"usage":{' in chunk:
            self._usage_from_sse(flight, chunk)

    @staticmethod
    def _usage_from_sse(flight: Flight, chunk: bytes) -> None:
        for line in chunk.split(b"\n"):
            if line.startswith(b"data: {") and b'"usage":{' in line:
                try:
                    usage = json.loads(line[6:]).get("usage") or {}
                except ValueError:
                    continue
                flight.prompt_tokens = usage.get("prompt_tokens", flight.prompt_tokens)
                flight.completion_tokens = usage.get("completion_tokens", flight.completion_tokens)

    def _drop_error(self, flight: Flight, chunk: bytes = b"") -> RouterError:
        found = _STOP_REASON.search(chunk)
        detail = f"; engine: {found.group(1).decode('utf-8', 'replace')}" if found else ""
        return unavailable(
            f"request dropped: not started within its waiting_time of {flight.slo.waiting_time:g}s "
            f"(SLO class {flight.slo_class!r}){detail}",
            "waiting_time_exceeded",
            retry_after=None,
        )

    # -- accounting ----------------------------------------------------------------------------------
    def _finish(self, flight: Flight, now: float, drop_reason: str | None) -> None:
        if drop_reason is not None:
            self.metrics.child(self.metrics.drops, flight.slo_class, drop_reason).inc()
        input_len = flight.prompt_tokens if isinstance(flight.prompt_tokens, int) else flight.input_len
        record = RequestRecord(
            slo=flight.slo,
            arrival=flight.arrival,
            input_len=input_len,
            token_times=np.frombuffer(flight.token_times),
            finish=flight.finish,
            dropped=flight.dropped,
        )
        if flight.finish is not None:
            self.metrics.child(self.metrics.e2el, flight.slo_class).observe(flight.finish - flight.arrival)
        if not flight.dropped:
            out_len = (
                flight.completion_tokens if isinstance(flight.completion_tokens, int) else record.output_len
            )
            self.lengths.observe(
                input_len, out_len, flight.slo.type, flight.slo_class, flight.model, flight.max_tokens
            )
        if flight.program_id is not None:
            self.programs.end_call(flight.program_id, record, flight.model, flight.arrival)
            self.programs.expire(now)
            return  # counted once, as a program, when the program ends
        g = self.accounting.record(flight.slo_class, record, now)
        self._count(flight.slo_class, g)

    def _count(self, slo_class: str, g: Goodput) -> None:
        self.metrics.child(self.metrics.finished, slo_class).inc()
        self.metrics.child(self.metrics.goodput, slo_class).inc(g.tokens)
        if g.met:
            self.metrics.child(self.metrics.slo_met, slo_class).inc()

    def _program_done(self, prog: Program, g: Goodput) -> None:
        records = [c.record for c in prog.calls]
        possible = sum(
            r.slo.weights.input * r.input_len + r.slo.weights.output * r.output_len for r in records
        )
        self.accounting.record_program(prog.slo_class, g, possible, self.clock(), prog.dropped)
        self._count(prog.slo_class, g)

    def status(self) -> dict[str, Any]:
        now = self.clock()
        self.programs.expire(now, force=True)
        return {
            "classes": self.accounting.status(now),
            "window_seconds": self.config.status_window_s,
            "inflight": self.inflight,
            "best_effort": {
                "queued": self.be_queue.queued,
                "active": self.be_queue.active,
                "slots": self.best_effort_slots(),
                "capacity": self.be_queue.capacity,
            },
            "programs": len(self.programs),
            "replicas": {
                r.name: {
                    "url": r.url,
                    "health": r.health(now, self.pool.defaults.stale_after_s).value,
                    "unresponsive": r.unresponsive,
                    "inflight": r.inflight,
                    "chosen_total": r.chosen_total,
                    "models": sorted(r.models),
                    # the pod's last report, as placement sees it before its own adjustments
                    "state": None
                    if r.state is None
                    else {
                        "running": r.state.running,
                        "waiting": r.state.waiting,
                        "queue_delay_s": r.state.queue_delay_s,
                        "age_s": round(now - r.state_at, 3),
                    },
                }
                for r in self.pool.replicas.values()
            },
            "class_source": self.classes.table.source,
            "class_error": self.classes.last_error,
        }


class RelayResponse(StreamingResponse):
    """A relayed stream. Leaner than Starlette's StreamingResponse (one watcher task instead of an anyio
    task group per response: CPU per stream matters at hundreds of streams a second), and its cleanup
    runs however it ends: finished, client gone (the watcher cancels the relay, which closes the engine
    connection so the engine aborts the request), or never started."""

    def __init__(
        self, content: AsyncIterator[bytes], on_close: Any, is_last: Callable[[], bool], **kw: Any
    ) -> None:
        super().__init__(content, **kw)
        self._on_close = on_close
        self._is_last = is_last  # true when the chunk just yielded ends the stream
        self._also: list[Callable[[], None]] = []

    def also_on_close(self, fn: Callable[[], None]) -> None:
        """Run `fn` too when the stream ends (however it ends), after the relay's own cleanup."""
        self._also.append(fn)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        relay = asyncio.current_task()
        assert relay is not None
        gone = False

        async def watch() -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass  # the body was read already; only the disconnect remains to arrive
            gone = True
            relay.cancel()

        watcher = asyncio.get_running_loop().create_task(watch())
        body = self.body_iterator
        try:
            await send(
                {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            )
            ended = False
            async for chunk in body:
                if ended:
                    continue  # nothing follows the engine's end of stream; never send after the end
                if self._is_last():
                    # The last chunk ends the response in the same write. The response is complete
                    # then, which the watcher would read as a disconnect: stop it first.
                    ended = True
                    watcher.cancel()
                await send({"type": "http.response.body", "body": chunk, "more_body": not ended})
            if not ended:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not gone:
                raise
            relay.uncancel()  # the client left: a normal end for us, not a cancelled server
        finally:
            watcher.cancel()
            try:
                await body.aclose()  # type: ignore[attr-defined]
                await self._on_close()
            finally:
                for fn in self._also:
                    fn()


class BoundedConnector(aiohttp.TCPConnector):
    """At most `max_connecting` new engine connections being set up at once; the rest wait their turn
    *before* the connect timeout starts. A burst of 2,000 streams otherwise opens 2,000 connects at
    once: the engines' accept queues overflow, connects time out, and healthy engines look down."""

    def __init__(self, *args: Any, max_connecting: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._connecting = asyncio.Semaphore(max(max_connecting, 1))

    async def _create_connection(self, req: Any, traces: Any, timeout: Any) -> Any:
        async with self._connecting:
            return await super()._create_connection(req, traces, timeout)


def make_session(config: RouterConfig) -> aiohttp.ClientSession:
    connector = BoundedConnector(
        limit=config.max_inflight + 64,
        limit_per_host=0,
        keepalive_timeout=30,
        max_connecting=config.max_connecting,
    )
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=config.connect_timeout_s, sock_read=config.read_timeout_s
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        auto_decompress=False,
        skip_auto_headers=("User-Agent",),
        # no cookies: one session serves every client, so an engine's Set-Cookie must not be replayed
        # on other clients' requests (and the jar lookup costs time per request)
        cookie_jar=aiohttp.DummyCookieJar(),
    )


async def read_body(request: Request, limit: int) -> bytes:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise body_too_large(limit)
    buf = bytearray()
    async for chunk in request.stream():
        buf += chunk
        if len(buf) > limit:
            raise body_too_large(limit)
    return bytes(buf)


def error_response(err: RouterError, extra: Mapping[str, str] | None = None) -> Response:
    headers = err.headers()
    if extra:
        headers.update(extra)
    return Response(err.json_bytes(), err.status, headers, "application/json")


def seconds_header(value: float) -> str:
    return str(max(1, math.ceil(value)))
