"""One admitted request while it runs (`Flight`), and what happens when it ends (`Outcomes`): token
times, TTFT/TBT/E2E metrics, goodput windows, finished lengths for the QRF, program calls."""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from jitserve.router import sse
from jitserve.router.accounting import Accounting
from jitserve.router.analysis import LengthBounds
from jitserve.router.errors import RouterError, unavailable
from jitserve.router.metrics import RouterMetrics
from jitserve.router.programs import Program, ProgramTracker
from jitserve.scheduler.goodput import Goodput, RequestRecord
from jitserve.scheduler.slo import SLO


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
    token_times: array = field(default_factory=lambda: array("d"))  # 8 bytes per token
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    dropped: bool = False
    finish: float | None = None

    def drop_error(self, chunk: bytes = b"") -> RouterError:
        """What the client learns when the engine (or the router's backstop) dropped the request."""
        reason = sse.stop_reason(chunk)
        detail = f"; engine: {reason}" if reason else ""
        wait = self.slo.unstarted_wait  # deadline work waits for its deadline, not its waiting_time
        deadline = self.slo.unstarted_limit == "deadline"
        what = f"its deadline ({wait:g}s)" if deadline else f"its waiting_time of {wait:g}s"
        return unavailable(
            f"request dropped: not started within {what} (SLO class {self.slo_class!r}){detail}",
            "waiting_time_exceeded",
            retry_after=None,
        )


class Outcomes:
    """Records what flights do: token times as they stream, then the finished (or dropped) request."""

    def __init__(
        self,
        metrics: RouterMetrics,
        accounting: Accounting,
        lengths: LengthBounds,
        programs: ProgramTracker,
        clock: Callable[[], float],
    ) -> None:
        self.metrics = metrics
        self.accounting = accounting
        self.lengths = lengths
        self.programs = programs
        self.clock = clock

    def tokens(self, flight: Flight, chunk: bytes) -> None:
        """One SSE event per generated token (vLLM streams one per step): record its time."""
        events = sse.token_events(chunk)
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
        for u in sse.usages(chunk):
            flight.prompt_tokens = u.get("prompt_tokens", flight.prompt_tokens)
            flight.completion_tokens = u.get("completion_tokens", flight.completion_tokens)

    def finish(self, flight: Flight, now: float, drop_reason: str | None) -> None:
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
        self.count(flight.slo_class, g)

    def count(self, slo_class: str, g: Goodput) -> None:
        self.metrics.child(self.metrics.finished, slo_class).inc()
        self.metrics.child(self.metrics.goodput, slo_class).inc(g.tokens)
        if g.met:
            self.metrics.child(self.metrics.slo_met, slo_class).inc()

    def program_done(self, prog: Program, g: Goodput) -> None:
        records = [c.record for c in prog.calls]
        possible = sum(
            r.slo.weights.input * r.input_len + r.slo.weights.output * r.output_len for r in records
        )
        self.accounting.record_program(prog.slo_class, g, possible, self.clock(), prog.dropped)
        self.count(prog.slo_class, g)
