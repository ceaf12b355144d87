"""The engine-agnostic frame loop around a `Policy`: what the vLLM adapter drives each step.

The runner owns the `RequestTable`, resolves each arrival's SLO from its xargs, keeps the table in sync
with the engine (progress, running), refreshes length bounds, runs the policy at frame boundaries and
keeps per-class goodput. It never touches vLLM: the adapter reads the engine into it and carries out the
`FramePlan` it returns, so the same runner can be tested with plain Python calls.

When to plan is the core's `FrameDriver` (scheduler/frames.py, the simulator's too), on wall time: a
full frame every `frame_steps` engine steps (order, preemptions, drops, starvation aging, cutoff
tuning). Between frames, arrivals join the tail of vLLM's queue while the plan decides who takes a
freed slot only through its order, so the runner re-plans "lightly" on a step after arrivals: it
applies the order and drops of a fresh plan, and its preemptions only if the policy preempts
mid-frame (just-in-time GMAX); Algorithm 1 keeps preemption at frame granularity as §4.2 prescribes.

The runner's settings are `SchedulerSettings` (engine/settings.py: each one's default and validation
declared there once, GMAX's defaults taken from `GMAXParams`), plus what only the engine knows: its
batch size (vLLM's max_num_seqs) and served model name.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from jitserve.engine.accounting import GoodputWindow
from jitserve.engine.classes import ClassSource
from jitserve.engine.state import (
    ANALYZER_FILE,
    HISTORY_FILE,
    ClassTotalsModel,
    EngineState,
    RequestDebug,
    append_jsonl,
)
from jitserve.scheduler.analyzer.length import LengthPredictor, LengthPredictorConfig
from jitserve.scheduler.analyzer.refit import BackgroundRefit
from jitserve.scheduler.contracts.replica_report import assemble_replica_state
from jitserve.scheduler.contracts.xargs import RequestSLO, parse_xargs
from jitserve.scheduler.fairness import counted_outcome
from jitserve.scheduler.frames import FULL, FrameDriver, PlanKind
from jitserve.scheduler.gmax import FramePlan, GMAXParams, expired
from jitserve.scheduler.goodput import RequestRecord
from jitserve.scheduler.policy import Policy, make_policy
from jitserve.scheduler.requests import LATENCY, SLO_TYPE_CODE, NewRequest, RequestTable
from jitserve.scheduler.speed import SpeedMeter

if TYPE_CHECKING:
    from jitserve.engine.settings import SchedulerSettings

log = logging.getLogger("jitserve.engine")

RECENT = 64  # requests kept in the state's debug list
WINDOW_S = 60.0  # goodput window reported per class
LENGTH_REFRESH_TOKENS = 50  # §4.1: refresh the bound every 50 generated tokens


@dataclass
class _Meta:
    info: RequestSLO
    arrival: float
    input_len: int
    max_tokens: int
    token_times: list[float] = field(default_factory=list)
    debug: RequestDebug | None = None
    bound_at: int = 0  # `generated` when the length bound was last refreshed


class EngineLengthBounds:
    """The analyzer's QRF bound (scheduler/analyzer), trained online from finished requests.

    Absent analyzer or history -> max_tokens, the only safe bound. Fits run as the router's do
    (`BackgroundRefit`: a niced child process, paced by their CPU cost), never in vLLM's engine-core
    process, where a fitting thread took the GIL and the pinned core from engine steps. Each fitted
    predictor is saved to `path`, so a restarted engine starts from what it learned.
    """

    def __init__(self, path: str | None) -> None:
        self.path = path
        predictor = None
        if path is not None and os.path.exists(path):
            try:
                predictor = LengthPredictor.load(path)
            except (OSError, ValueError, KeyError) as exc:
                log.warning("jitserve: ignoring unreadable length history %s: %s", path, exc)
        self.refit = BackgroundRefit(
            predictor or LengthPredictor(LengthPredictorConfig(n_jobs=1)),
            on_fitted=self._save_fitted,
            label="engine length bounds",
        )
        self.class_codes: dict[str, int] = {}

    @property
    def predictor(self) -> LengthPredictor:
        return self.refit.predictor

    @predictor.setter
    def predictor(self, predictor: LengthPredictor) -> None:
        self.refit.predictor = predictor

    def code(self, slo_class: str) -> int:
        return self.class_codes.setdefault(slo_class, len(self.class_codes) % 65_536)

    def bounds(self, prompt_len: Any, generated: Any, slo_type: Any, class_code: Any, max_tokens: Any) -> Any:
        return self.predictor.upper_bounds(prompt_len, generated, slo_type, class_code, 0, max_tokens)

    def observe(
        self, prompt_len: int, output_len: int, slo_type: int, class_code: int, max_tokens: int
    ) -> None:
        if output_len < 1:
            return
        self.refit.observe(prompt_len, output_len, slo_type, class_code, 0, max_tokens)

    def _save_fitted(self, predictor: LengthPredictor) -> None:
        if self.path is not None:
            predictor.save(self.path)

    def save(self) -> None:
        if self.path is not None:
            self.predictor.save(self.path)

    def close(self) -> None:
        self.refit.close()


class FrameRunner:
    """The engine's scheduler state around one policy. `settings`: the scheduler's (JITSERVE_*);
    `batch_size`: vLLM's max_num_seqs; `model`: the served model's name unless the settings give one;
    `clock`: wall time (seconds since the epoch, as vLLM stamps arrivals), injectable for tests;
    `prefix_block_tokens`: the KV block vLLM's prefix cache keeps a preempted request in (0: caching off),
    which prices a recompute preemption's stall."""

    def __init__(
        self,
        settings: SchedulerSettings,
        batch_size: int,
        model: str = "model",
        *,
        policy: Policy | None = None,
        clock: Callable[[], float] = time.time,
        prefix_block_tokens: int = 0,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size: must be >= 1, got {batch_size}")
        self.settings = settings
        self.batch_size = batch_size
        self.model = settings.model_name or model
        self.pod = settings.pod_name or "engine"
        self.runtime_dir = settings.runtime_dir
        self.clock = clock
        policy = policy or make_policy(settings.policy, batch_size, **settings.gmax_overrides())
        self.table = RequestTable(capacity=max(64, 4 * batch_size))
        # frame_steps from the settings, not the policy's: vLLM-style baselines (whose policies say 1)
        # re-plan at GMAX's cadence, and vLLM steps on without asking, so every policy is framed here.
        self.driver = FrameDriver(
            policy, self.table, clock, frame_steps=settings.frame_steps, close_with="frame_plan"
        )
        self.classes = ClassSource(settings.classes_file, settings.default_class)
        # the KV block vLLM's prefix cache keeps a preempted request's tokens in (0: caching off)
        self.meter = SpeedMeter(prefix_block_tokens=prefix_block_tokens)
        self.step_token_budget: int | None = None  # the last step's, when the policy held it below ceiling
        # looked up once: `token_budget` runs every engine step (None: the policy does not pace steps)
        self._pace = getattr(policy, "token_budget", None)
        self.window = GoodputWindow(WINDOW_S)
        self.meta: dict[str, _Meta] = {}
        self.recent: deque[RequestDebug] = deque(maxlen=RECENT)
        self.tenants: dict[str, int] = {"": 0}
        self.dropped_total = 0
        self.preempted_total = 0
        self.invalid_slo_total = 0
        self.started_at = clock()
        self._history: list[dict[str, Any]] = []
        self._next_expiry = float("inf")  # earliest waiting deadline of a never-started request (lower bound)
        self.bounds: EngineLengthBounds | None = None
        if settings.analyzer:
            path = os.path.join(self.runtime_dir, ANALYZER_FILE) if self.runtime_dir else None
            try:
                self.bounds = EngineLengthBounds(path)
            except ImportError:  # analyzer not installed in this image: bounds stay max_tokens
                self.bounds = None

    # --------------------------------------------------------------------------------- frames
    @property
    def policy(self) -> Policy:
        return self.driver.policy

    @property
    def frame_steps(self) -> int:
        return self.driver.frame_steps

    @property
    def frames(self) -> int:
        """Frames begun (boundary plans): the state's `frames`."""
        return self.driver.frames

    @property
    def steps(self) -> int:
        return self.driver.steps

    # --------------------------------------------------------------------------------- requests
    @property
    def drops_expired(self) -> bool:
        """Whether this policy drops requests past waiting_time (GMAX does; vLLM-style baselines not)."""
        return bool(getattr(self.policy, "drop_expired", True))

    def admit(
        self,
        request_id: str,
        xargs: Mapping[str, Any] | None,
        arrival: float,
        input_len: int,
        max_tokens: int,
        min_len: int = 1,
    ) -> RequestSLO:
        self.classes.poll()
        snap = self.classes.snapshot
        info = parse_xargs(xargs, snap.classes, snap.default, arrival)
        if info.error is not None:
            self.invalid_slo_total += 1
            log.warning(
                "jitserve: request %s: bad SLO xargs (%s); using class %s",
                request_id,
                info.error,
                info.slo_class,
            )
        tenant = self.tenants.setdefault(info.tenant, len(self.tenants))
        max_tokens = max(int(max_tokens), 1)
        len_ub = info.length_bound
        if len_ub is None and self.bounds is not None:
            len_ub = int(self._bound_for(info, input_len, 0, max_tokens))
        self.table.add(
            NewRequest(
                request_id=request_id,
                slo=info.slo,
                arrival=arrival,
                input_len=int(input_len),
                max_tokens=max_tokens,
                len_ub=len_ub,
                min_len=min(max(int(min_len), 1), max_tokens),
                deadline_abs=info.deadline_abs,
                program_deadline_abs=info.program_deadline_abs,
                program_goodput=info.program_goodput,
                tenant=tenant,
            )
        )
        slo = info.slo
        debug = RequestDebug(
            request_id=request_id,
            slo_class=info.slo_class,
            slo_type=slo.type.value,
            deadline_s=slo.deadline,
            ttft_s=slo.ttft,
            tbt_s=slo.tbt,
            waiting_time_s=slo.waiting_time,
            stage_deadline_abs=info.deadline_abs,
            program_id=info.program_id,
            tenant=info.tenant,
            max_tokens=max_tokens,
            length_bound=int(self.table.len_ub[self.table.slot(request_id)]),
            error=info.error,
            arrival=arrival,
        )
        self.meta[request_id] = _Meta(info, arrival, int(input_len), max_tokens, debug=debug)
        self._next_expiry = min(self._next_expiry, arrival + info.slo.waiting_time)
        self.recent.append(debug)
        self.driver.mark_dirty()
        return info

    def _bound_for(self, info: RequestSLO, prompt_len: Any, generated: Any, max_tokens: Any) -> Any:
        from jitserve.scheduler.analyzer import slo_type_code

        assert self.bounds is not None
        return self.bounds.bounds(
            prompt_len, generated, slo_type_code(info.slo.type), self.bounds.code(info.slo_class), max_tokens
        )

    def __contains__(self, request_id: object) -> bool:
        return request_id in self.meta

    def tokens(self, request_id: str, n: int, now: float) -> None:
        """`n` new output tokens of a request reached the client at `now` (latency goodput)."""
        m = self.meta.get(request_id)
        if m is not None and n > 0:
            m.token_times.extend([now] * n)

    def is_stream(self, request_id: str) -> bool:
        """Whether the request is a latency stream (its prompt is what its first token waits for)."""
        return request_id in self.table and bool(self.table.slo_type[self.table.slot(request_id)] == LATENCY)

    def started(self, request_id: str) -> None:
        """The engine scheduled the request: waiting_time no longer applies to it."""
        if request_id in self.table:
            slot = self.table.slot(request_id)
            if not self.table.running[slot]:
                self.table.set_running(request_id, True)
        m = self.meta.get(request_id)
        if m is not None and m.debug is not None and m.debug.started_at is None:
            m.debug.started_at = self.clock()  # (a frame's sync may have marked it running already)

    def end(self, request_id: str, now: float, outcome: str) -> float:
        """A request left the engine: `finished`, `dropped` or `aborted`. Returns its token goodput."""
        m = self.meta.pop(request_id, None)
        if m is None:
            return 0.0
        stage_due = program_due = math.inf
        if request_id in self.table:
            slot = self.table.slot(request_id)
            stage_due = float(self.table.deadline_abs[slot])
            program_due = float(self.table.program_deadline[slot])
            self.table.remove(request_id)
        record = RequestRecord(
            slo=m.info.slo,
            arrival=m.arrival,
            input_len=m.input_len,
            token_times=m.token_times,
            finish=now if outcome == "finished" else None,
            dropped=outcome == "dropped",
        )
        outcome_goodput = self.window.record(m.info.slo_class, record, now)
        tokens = outcome_goodput.tokens
        self.driver.record(tokens)
        # every ending counts (a compound program once), as in the goodput window: a call cancelled before
        # its SLO was met missed it
        slo_type = SLO_TYPE_CODE[m.info.slo.type]
        finished_at = now if outcome == "finished" else None
        counted = counted_outcome(slo_type, outcome_goodput.met, finished_at, stage_due, program_due)
        if counted is not None:
            self.driver.outcome(slo_type, counted, self.tenants.get(m.info.tenant, 0))
        if m.debug is not None:
            m.debug.outcome = outcome
            m.debug.finished_at = now
        if outcome == "dropped":
            self.dropped_total += 1
        if outcome == "finished" and m.token_times:
            self._learn(m)
        # No re-plan for a departure: the queue keeps the plan's order, so vLLM fills the freed slot
        # with the plan's next request already; only arrivals (appended at the tail) need one.
        return tokens

    def _learn(self, m: _Meta) -> None:
        out = len(m.token_times)
        row = {
            "prompt_len": m.input_len,
            "output_len": out,
            "max_tokens": m.max_tokens,
            "slo_class": m.info.slo_class,
            "slo_type": m.info.slo.type.value,
        }
        if self.runtime_dir is not None:  # nowhere to write them: keep none (nothing would ever take them)
            self._history.append(row)
        if self.bounds is not None:
            from jitserve.scheduler.analyzer import slo_type_code

            self.bounds.observe(
                m.input_len,
                out,
                slo_type_code(m.info.slo.type),
                self.bounds.code(m.info.slo_class),
                m.max_tokens,
            )

    # ----------------------------------------------------------------------------------- frames
    def sync(self, rows: Iterable[tuple[str, bool, int, int]]) -> None:
        """Engine truth -> table: (request_id, running, generated, computed) per live request."""
        t = self.table
        for rid, running, generated, computed in rows:
            slot = t.slot_of.get(rid)
            if slot is None:
                continue
            if running != bool(t.running[slot]):
                t.set_running(rid, running)
            t.progress(rid, generated, computed)
        self._refresh_bounds()

    def _refresh_bounds(self) -> None:
        """Re-predict bounds of requests that generated `length_refresh_tokens` more since the last one."""
        if self.bounds is None or not self.bounds.predictor.trained:
            return
        t, step = self.table, LENGTH_REFRESH_TOKENS
        due = [
            (rid, m)
            for rid, m in self.meta.items()
            if m.info.length_bound is None and rid in t and int(t.generated[t.slot(rid)]) - m.bound_at >= step
        ]
        if not due:
            return
        slots = np.asarray([t.slot(rid) for rid, _ in due])
        from jitserve.scheduler.analyzer import slo_type_code

        ub = self.bounds.bounds(
            t.input_len[slots],
            t.generated[slots],
            np.asarray([slo_type_code(m.info.slo.type) for _, m in due]),
            np.asarray([self.bounds.code(m.info.slo_class) for _, m in due]),
            t.max_tokens[slots],
        )
        t.set_bounds(slots, ub)
        for (_rid, m), g in zip(due, t.generated[slots].tolist(), strict=True):
            m.bound_at = int(g)

    def step_kind(self) -> PlanKind | None:
        """Called once per engine step: FULL at frame boundaries, LIGHT when arrivals changed the queue.

        Every arrival is answered, full batch or not (`has_room` stays True): vLLM fills a freed slot
        from the head of its waiting queue without asking, so the queue must already be in plan order."""
        self.driver.advance(1)
        return self.driver.due()

    def plan(self, kind: PlanKind) -> FramePlan:
        """The policy's plan (at the clock's now); a FULL one closes the previous frame first."""
        if kind == FULL:
            self.classes.poll()
        return self.driver.plan(kind, self.meter.speed())

    def token_budget(self, ceiling: int) -> int:
        """Tokens the next step may schedule: the policy's pace-bound budget (`GMAXPolicy.token_budget`),
        at most `ceiling`, the engine's configured max_num_batched_tokens; `ceiling` for a policy that
        does not pace steps. Called once per step."""
        if self._pace is None:
            return ceiling
        budget = max(int(self._pace(self.table, self.clock(), self.meter.speed(), ceiling)), 1)
        self.step_token_budget = budget if budget < ceiling else None
        return budget

    def expired_ids(self, now: float) -> list[str]:
        """Waiting requests past waiting_time, checked every step so none is admitted after it."""
        if not self.drops_expired or now < self._next_expiry:
            return []  # the common case costs one comparison
        t = self.table
        ids = t.ids(expired(t, now))
        pending = t.active & ~t.started
        waiting = t.waiting_deadline[pending]
        later = waiting[waiting >= now]
        self._next_expiry = float(later.min()) if later.size else float("inf")
        return ids

    def preempted(self, request_id: str) -> None:
        self.preempted_total += 1
        if request_id in self.table:
            self.table.set_running(request_id, False)
            self.table.mark_preempted(self.table.slot(request_id))

    # ------------------------------------------------------------------------------------ state
    def state(
        self, now: float, running: int, waiting: int, kv_usage: float, vllm_version: str = ""
    ) -> EngineState:
        B = self.batch_size  # noqa: N806 (the paper's name)
        params = getattr(self.policy, "params", None)
        cutoff = float(params.cutoff) if isinstance(params, GMAXParams) else 1.0
        snap = self.classes.snapshot
        totals = {cls: ClassTotalsModel(**vars(t)) for cls, t in self.window.totals.items()}
        diagnostics = dict(
            policy=self.policy.name,
            frame_steps=self.frame_steps,
            steps=self.steps,
            invalid_slo_total=self.invalid_slo_total,
            classes=sorted(snap.classes),
            default_class=snap.default,
            classes_version=snap.version,
            classes_error=self.classes.last_error,
            totals=totals,
            recent=list(self.recent),
            vllm_version=vllm_version,
            started_at=self.started_at,
            step_token_budget=self.step_token_budget,
        )
        if self.bounds is not None:
            diagnostics.update(
                length_fits_total=self.bounds.refit.fits_finished,
                length_fit_cpu_seconds_total=self.bounds.refit.fit_cpu_s_total,
            )
        # validate=False: every field is computed here from validated inputs; validating again would
        # cost more than the rest of the state (it is built several times a second in the step loop).
        return assemble_replica_state(
            self.table,
            now,
            self.meter.speed(),
            pod=self.pod,
            model=self.model,
            batch_size=B,
            cutoff=cutoff,
            running=running,
            waiting=waiting,
            kv_usage=kv_usage,
            frames=self.frames,
            dropped_total=self.dropped_total,
            preempted_total=self.preempted_total,
            goodput=self.window.summary(now),
            reservation=self.driver.last_plan.reservation if self.driver.last_plan is not None else None,
            state_type=EngineState,
            extra=diagnostics,
            validate=False,
        )

    def take_history(self) -> list[dict[str, Any]]:
        """The finished requests' rows since the last call (the analyzer's raw training rows), for the
        engine's `StatePublisher` to append to runtime_dir/history.jsonl off the step loop."""
        rows, self._history = self._history, []
        return rows

    def flush_history(self) -> None:
        """Append the rows not yet taken to runtime_dir/history.jsonl here (at close)."""
        rows = self.take_history()
        if not rows or self.runtime_dir is None:
            return
        try:
            append_jsonl(os.path.join(self.runtime_dir, HISTORY_FILE), rows)
        except OSError as exc:
            log.warning("jitserve: cannot append history: %s", exc)

    def close(self) -> None:
        self.flush_history()
        if self.bounds is not None:
            self.bounds.close()
            try:
                self.bounds.save()
            except OSError as exc:
                log.warning("jitserve: cannot save length predictor: %s", exc)
