"""The router: one request end to end, wiring the pieces that each do one job.

    parse + authenticate (inbound.py, auth.py) -> resolve the SLO (resolution.py) -> best-effort FIFO
    (best_effort.py) -> admit, place, send, retry (dispatch.py) -> relay (relay.py, sse.py) -> account
    (flight.py) ; status (status.py)

The decisions are pure functions (inbound.py, scheduler/admission.py, programs.py, outbound.py); the
adapters move bytes with aiohttp (a tenth of httpx's CPU per proxied stream here,
docs/decisions/router.md).
"""

from __future__ import annotations

import itertools
import logging
import secrets
from typing import Any

import aiohttp
from starlette.requests import Request
from starlette.responses import Response

from jitserve.router.accounting import Accounting
from jitserve.router.analysis import LengthBounds
from jitserve.router.auth import Keyring
from jitserve.router.best_effort import BestEffortGate
from jitserve.router.classes import ClassRegistry
from jitserve.router.config import RouterConfig
from jitserve.router.dispatch import Dispatcher
from jitserve.router.errors import RateLimitedLog, RouterError, rate_limited
from jitserve.router.flight import Outcomes
from jitserve.router.http import error_response, read_body
from jitserve.router.inbound import Kind, parse_inbound, parse_json_object
from jitserve.router.locality import PrefixIndex
from jitserve.router.metrics import RouterMetrics
from jitserve.router.pool import Pool
from jitserve.router.programs import ProgramTracker
from jitserve.router.relay import Relay, RelayResponse
from jitserve.router.resolution import Resolver, check_model, stage_plan
from jitserve.router.sse import DropDetector
from jitserve.router.status import status
from jitserve.router.upstream import make_poll_session, make_session
from jitserve.scheduler.analyzer.patterns import PatternStore
from jitserve.scheduler.goodput import RequestRecord
from jitserve.scheduler.placement import stage_slot_wait
from jitserve.scheduler.requests import NewRequest
from jitserve.scheduler.slo import SLOType

log = logging.getLogger("jitserve.router")


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
        self.clock = pool.clock
        self.metrics = RouterMetrics()
        self.accounting = Accounting(config.status_window_s)
        self.lengths = LengthBounds(
            config.length_predictor, min_refit_interval_s=config.length_refit_interval_s
        )
        self.programs = ProgramTracker(
            config.max_programs,
            config.program_idle_timeout_s,
            store=PatternStore() if config.pattern_graphs else None,
            on_finish=lambda prog, g: self.outcomes.program_done(prog, g),
        )
        self.outcomes = Outcomes(self.metrics, self.accounting, self.lengths, self.programs, self.clock)
        self.prefixes = PrefixIndex(config.prefix_cache_entries)
        self.resolver = Resolver(classes)
        self.log_limited = RateLimitedLog(log)  # one line per kind of event per 10 s, never a traceback
        self.relay = Relay(
            self.outcomes,
            DropDetector(config.drop_finish_reasons),
            config.drop_finish_reasons,
            self.clock,
            pool.unresponsive_timeout_s,
            self._release_slot,
        )
        self.dispatcher = Dispatcher(
            config, pool, classes, self.prefixes, self.metrics, self.relay, self.session, self.log_limited
        )
        self.best_effort = BestEffortGate(config, pool, self.metrics)
        self._session: aiohttp.ClientSession | None = None  # the data path
        self._poll_session: aiohttp.ClientSession | None = None  # state polls (own connections)
        self.inflight = 0
        self.tenants: dict[str, int] = {}
        self._ids = itertools.count()
        self._id_prefix = f"jr-{secrets.token_hex(6)}-"  # unique per router process; a counter follows
        pool.on_poll = self.best_effort.queue.kick  # engines that came up (or grew) take queued work
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
            self._poll_session = make_poll_session()
        return self._poll_session

    async def aclose(self) -> None:
        self.lengths.close()
        for session in (self._session, self._poll_session):
            if session is not None:
                await session.close()

    def status(self) -> dict[str, Any]:
        return status(self)

    def _release_slot(self) -> None:
        self.inflight -= 1
        self.metrics.inflight.dec()

    async def _handle(self, kind: Kind, request: Request) -> Response:
        arrival = self.clock()
        raw = await read_body(request, self.config.max_body_bytes)
        tenant = self.keyring.tenant(request.headers.get("authorization"))
        inbound = parse_inbound(kind, parse_json_object(raw), request.headers)
        check_model(inbound.model, self.pool.models() | self.config.served_models)
        slo_class, slo, overload, per_stage = self.resolver.resolve(inbound)
        self.metrics.child(self.metrics.requests, kind, slo_class).inc()
        plan = stage_plan(
            self.programs, inbound, slo_class, slo, arrival, per_stage,
            slot_wait=lambda model: stage_slot_wait(self.pool.states(model)),
        )  # fmt: skip
        max_tokens = inbound.max_tokens or self.config.default_max_tokens
        request_id = request.headers.get("x-request-id") or f"{self._id_prefix}{next(self._ids):x}"
        new = NewRequest(
            request_id=request_id,
            slo=slo,
            arrival=arrival,
            input_len=inbound.input_len,
            max_tokens=max_tokens,
            len_ub=self.lengths.bound(inbound.input_len, slo.type, slo_class, inbound.model, max_tokens),
            min_len=inbound.reply_floor.shortest(max_tokens),
            deadline_abs=plan.deadline_abs if plan else None,
            program_deadline_abs=plan.program_deadline_abs if plan else None,
            program_goodput=plan.program_goodput if plan else 0.0,
            tenant=self._tenant_id(tenant),
        )

        def dispatch() -> Any:
            return self.dispatcher.dispatch(inbound, new, slo_class, overload, tenant, plan)

        try:
            if slo.type is SLOType.BEST_EFFORT:
                return await self.best_effort.run(slo_class, inbound.model, request, dispatch)
            return await dispatch()
        except RouterError as err:
            if inbound.program_id is not None and plan is not None:
                record = RequestRecord(slo, arrival, inbound.input_len, dropped=True)
                self.programs.end_call(inbound.program_id, record, inbound.model, arrival)
            raise err

    def _tenant_id(self, tenant: str) -> int:
        tid = self.tenants.get(tenant)
        if tid is None:
            tid = self.tenants[tenant] = len(self.tenants)
        return tid
