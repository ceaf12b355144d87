"""The cluster: engines behind the router, programs unfolding stage by stage, and the event loop.

Event loop: external events (a call released: a program's arrival, or its next stage after a tool
call) sit in a heap; each busy engine is an event source at its own clock. The earliest goes next;
an engine runs one macro step bounded so it ends at the first step boundary after the next external
event, so no request waits for a step that started before it arrived by more than one step.
Completions happen at macro-step ends, so the stages they release are never in the past.
"""

from __future__ import annotations

import collections
import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from jitserve.scheduler.admission import decide
from jitserve.scheduler.analyzer.patterns import guard_late_stage
from jitserve.scheduler.contracts.replica_report import assemble_replica_state
from jitserve.scheduler.gmax import GMAXParams
from jitserve.scheduler.goodput import RequestRecord, stage_stake
from jitserve.scheduler.placement import ReplicaState, place, stage_slot_wait
from jitserve.scheduler.requests import SLO_TYPE_CODE, NewRequest
from jitserve.scheduler.slo import SLOType
from jitserve.sim.engine import CallInfo, Engine, EngineConfig, Finished
from jitserve.sim.policies import PolicySetup, SimContext, build_policy
from jitserve.sim.predictor import LengthBoundSource
from jitserve.sim.profiles import BatchTimeModel, Profile
from jitserve.sim.workload import Call, Program

PLACEMENTS = ("power-of-k", "round-robin", "least-load", "power-of-two")


@dataclass(slots=True)
class ProgramState:
    program: Program
    stage: int = 0
    pending: int = 0  # calls of the current stage still running
    records: list[RequestRecord] = field(default_factory=list)
    finish: float | None = None
    dropped: bool = False
    rejected: bool = False  # by router admission
    first_token: float | None = None
    done_goodput: float = 0.0  # weighted tokens of finished calls (compound)
    stage_released: float = 0.0  # when the current stage's calls were sent (their arrival)


@dataclass(slots=True)
class SimOutcome:
    """Everything a report needs; metrics.py turns it into numbers."""

    policy: str
    label: str
    programs: list[ProgramState]
    engines: list[Engine]
    horizon: float
    end_time: float
    wall_s: float = 0.0
    rejections: dict[str, int] = field(default_factory=dict)  # Cluster.rejections


def stage_times(program: Program, v_token: float, prefill_rate: float) -> np.ndarray:
    """Estimated seconds of each LLM stage plus the tool call before it (pattern-graph node times)."""
    out = []
    for s, stage in enumerate(program.stages):
        llm = max(c.input_len / prefill_rate + c.output_len * v_token for c in stage.calls)
        tool = program.stages[s - 1].tool_time_s if s > 0 else 0.0
        out.append(llm + tool)
    return np.asarray(out)


def sub_deadline(program: Program, stage: int, mode: str, v_token: float, prefill_rate: float) -> float:
    """Absolute deadline of `stage`: D_s = phi(s) * D (JITServe §4.1) or the program's deadline."""
    if program.slo.deadline is None:  # latency: no deadline to amortize
        return math.inf
    d = program.slo.deadline
    if program.slo_type is not SLOType.COMPOUND or mode == "program":
        return program.arrival + d
    if mode == "oracle":
        times = stage_times(program, v_token, prefill_rate)
        phi = float(times[: stage + 1].sum() / max(times.sum(), 1e-9))
    else:
        # Stand-in for pattern-graph matching: a typical program of this application has
        # `expected_stages` stages of equal time; past them the whole deadline applies.
        phi = min(1.0, (stage + 1) / max(program.expected_stages, 1.0))
    return program.arrival + phi * d


def router_stage_guard(
    deadline: float, program: Program, stage: int, now: float, slot_wait_s: float = 0.0
) -> float:
    """The router's guard on a stage's sub-deadline (`guard_late_stage`, as `router/programs.py` calls
    it), over the program's expected stage count, with the replicas' expected wait for a slot."""
    end = program.arrival + float(program.slo.deadline or 0.0)
    return guard_late_stage(deadline, end, now, math.ceil(program.expected_stages) - stage, slot_wait_s)


class Cluster:
    """Replicas of one policy behind the router."""

    def __init__(
        self,
        policy_name: str,
        profile: Profile,
        replicas: int,
        bounds: LengthBoundSource,
        tightest_tbt: float,
        placement: str | None = None,
        seed: int = 0,
        engine_overrides: dict[str, object] | None = None,
        subdeadlines: Callable[[Program, int, str, float, float], float] | None = None,
        router_admission: bool | None = None,
    ) -> None:
        self.profile = profile
        self.timing = BatchTimeModel.from_profile(profile)
        self.ctx = SimContext(profile, self.timing, tightest_tbt, seed)
        self.setups: list[PolicySetup] = [build_policy(policy_name, self.ctx) for _ in range(replicas)]
        first = self.setups[0]
        self.admission = first.router_admission if router_admission is None else router_admission
        self.policy_name = policy_name
        self.label = first.label or policy_name
        self.placement = placement or first.placement
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement: unknown {self.placement!r} (known: {', '.join(PLACEMENTS)})")
        self.bounds = bounds
        self._subdeadline = subdeadlines or sub_deadline
        self.rng = np.random.default_rng(seed + 7919)
        self._rr = 0
        self._states: dict[int, tuple[tuple[int, int, int], ReplicaState]] = {}
        # admission's rejections, keyed "<SLO type>: <rule>" (`Rejection`), as the router counts them
        self.rejections: collections.Counter[str] = collections.Counter()
        self.engines: list[Engine] = []
        for i, setup in enumerate(self.setups):
            overrides = dict(setup.engine)
            overrides.update(engine_overrides or {})
            cfg = EngineConfig.from_profile(profile, **overrides)
            self.engines.append(
                Engine(
                    name=f"{policy_name}-{i}",
                    policy=setup.policy,
                    config=cfg,
                    timing=self.timing,
                    profile=profile,
                    bound_fn=bounds.bounds,
                )
            )
        self.v_token = self.timing.decode_step_time(max(profile.max_num_seqs // 4, 1), 1024.0)
        self.prefill_rate = self.timing.prefill_tokens_per_s(2048)

    # ------------------------------------------------------------------------------- routing
    def route(self, req: NewRequest, now: float) -> tuple[int | None, NewRequest]:
        """(replica, the request as admitted) or (None, request) when the router rejects it. With
        admission, the router's own decision (`scheduler.admission.decide`: `place()`, then the
        overload action, which may hand the engine a best-effort version of the request)."""
        n = len(self.engines)
        if n == 1 and not self.admission:
            return 0, req
        if self.placement == "power-of-k":
            states = [self._state(i, now) for i in range(n)]
            setup = self.setups[0]
            params = setup.placement_params or getattr(
                setup.policy, "params", GMAXParams(batch_size=self.ctx.batch_size)
            )
            if self.admission:
                d = decide(
                    req, req.slo.type.value, setup.overload, {}, states, now, params=params,
                    short_reply=setup.short_reply,
                )  # fmt: skip
                if d.rejection is not None:
                    self.rejections[f"{req.slo.type.value}: {d.rejection.value}"] += 1
                return d.replica, d.request
            p = place(req, states, now, params=params, short_reply=setup.short_reply)
            return (p.replica if p.replica is not None else self._least_load()), req
        if self.placement == "round-robin":
            self._rr = (self._rr + 1) % n
            return self._rr, req
        if self.placement == "power-of-two":
            a, b = self.rng.choice(n, size=2, replace=False) if n > 1 else (0, 0)
            return (int(a) if _load(self.engines[a]) <= _load(self.engines[b]) else int(b)), req
        return self._least_load(), req

    def _state(self, i: int, now: float) -> ReplicaState:
        """A replica's report, refreshed when it plans (a pod reports once per frame)."""
        e = self.engines[i]
        key = (e.stats.plans, e.running_count, e.waiting_count)
        cached = self._states.get(i)
        if cached is None or cached[0] != key:
            cached = (key, replica_state(e, now))
            self._states[i] = cached
        return cached[1]

    def stage_slot_wait(self, now: float) -> float:
        """What the router budgets for a later stage's wait for a slot (`stage_slot_wait`), from the
        replicas' reports; 0.0 without power-of-K placement, whose reports the router would not read."""
        if self.placement != "power-of-k":
            return 0.0
        return stage_slot_wait(self._state(i, now) for i in range(len(self.engines)))

    def _least_load(self) -> int:
        loads = [_load(e) for e in self.engines]
        return int(np.argmin(loads))


def _load(e: Engine) -> float:
    return len(e.table) + e.kv_used / max(e.config.kv_capacity, 1)


def replica_state(engine: Engine, now: float) -> ReplicaState:
    """What the engine pod would report: speed, occupancy, and its queue as a real pod computes it
    (`assemble_replica_state`, the same function)."""
    # B is the batch the policy runs (GMAX's B, below max_num_seqs), as a real engine pod reports it.
    return assemble_replica_state(
        engine.table,
        now,
        engine.speed(),
        pod=engine.name,
        model=engine.profile.model.name,
        batch_size=engine._policy_batch,
        cutoff=float(getattr(getattr(engine.policy, "params", None), "cutoff", 1.0)),
        running=engine.running_count,
        waiting=engine.waiting_count,
        kv_usage=engine.kv_used / max(engine.config.kv_capacity, 1),
        frames=engine.stats.frames,
        reservation=engine.driver.last_plan.reservation if engine.driver.last_plan is not None else None,
    )


def call_features(call: Call, program: Program) -> tuple[float, ...]:
    return (
        call.prior_mu,
        call.prior_sigma,
        float(call.input_len),
        float(SLO_TYPE_CODE[program.slo_type]),
        float(program.app),
        float(program.max_tokens),
    )


def simulate(
    programs: list[Program],
    policy_name: str,
    profile: Profile,
    replicas: int,
    bounds: LengthBoundSource,
    horizon: float,
    placement: str | None = None,
    seed: int = 0,
    drain_s: float = 600.0,
    progress: Callable[[float], None] | None = None,
    engine_overrides: dict[str, object] | None = None,
    subdeadlines: Callable[[Program, int, str, float, float], float] | None = None,
    aborts: Callable[[Program, int, Call, float], tuple[float, float]] | None = None,
    router_admission: bool | None = None,
) -> SimOutcome:
    """Run one policy over the programs; returns the raw outcome.

    `aborts(program, stage, call, now)` gives a released call's (first_token_by, abort_at): when a
    real stack's router and client give up on it (see `CallInfo`); None: never. `router_admission`
    overrides the policy's own setting."""
    import time as _time

    wall0 = _time.perf_counter()
    tbts = [p.slo.tbt for p in programs if p.slo.tbt is not None]
    cluster = Cluster(
        policy_name,
        profile,
        replicas,
        bounds,
        min(tbts) if tbts else 0.1,
        placement,
        seed,
        engine_overrides,
        subdeadlines,
        router_admission,
    )
    deadline_mode = cluster.setups[0].deadlines
    states = [ProgramState(p) for p in programs]
    heap: list[tuple[float, int, int, int]] = []  # (time, seq, program index, stage)
    seq = 0
    for i, p in enumerate(programs):
        heap.append((p.arrival, seq, i, 0))
        seq += 1
    heapq.heapify(heap)
    engines = cluster.engines
    end_limit = horizon + drain_s
    last_report = 0.0

    def release(i: int, stage_idx: int, now: float) -> None:
        st = states[i]
        prog = st.program
        stage = prog.stages[stage_idx]
        st.stage = stage_idx
        st.stage_released = now
        st.pending = len(stage.calls)
        deadline = cluster._subdeadline(prog, stage_idx, deadline_mode, cluster.v_token, cluster.prefill_rate)
        if prog.slo_type is SLOType.COMPOUND and prog.slo.deadline is not None:
            deadline = router_stage_guard(deadline, prog, stage_idx, now, cluster.stage_slot_wait(now))
        compound = prog.slo_type is SLOType.COMPOUND
        left = math.ceil(prog.expected_stages) - stage_idx  # the router's count, as its guard above
        for j, call in enumerate(stage.calls):
            # As the router prices a call (`ProgramTracker.begin_stage`): each call of a stage carries the
            # program's whole stake, its own prompt standing for a stage's tokens, since losing any one of
            # them loses the program. A single call (latency, deadline) carries none, as in the router.
            stake = (
                stage_stake(st.done_goodput, stage_idx, left, prog.slo.weights.input * call.input_len)
                if compound
                else 0.0
            )
            feats = call_features(call, prog)
            ub = int(bounds.bounds(np.asarray([feats]), np.zeros(1, np.int64))[0])
            req = NewRequest(
                request_id=f"{prog.pid}.{stage_idx}.{j}",
                slo=prog.slo,
                arrival=now,
                input_len=call.input_len,
                max_tokens=prog.max_tokens,
                len_ub=ub,
                true_len=call.output_len,
                deadline_abs=deadline if prog.slo_type is not SLOType.LATENCY else None,
                program_deadline_abs=prog.arrival + float(prog.slo.deadline)
                if compound and prog.slo.deadline is not None
                else None,
                program_goodput=stake,
            )
            first_by, abort_at = aborts(prog, stage_idx, call, now) if aborts else (math.inf, math.inf)
            # cancelled on arrival (a replayed 429) or rejected by admission: the engine never sees it
            target, req = (None, req) if abort_at <= now else cluster.route(req, now)
            if target is None:
                st.rejected = True
                st.dropped = True
                st.records.append(RequestRecord(prog.slo, now, call.input_len, dropped=True))
                st.pending -= 1
                continue
            info = CallInfo(req.request_id, call.output_len, feats, (i, stage_idx, j), first_by, abort_at)
            engines[target].add(req, info, now)
        if st.pending == 0 and st.dropped:
            st.finish = None

    def on_finished(rec: Finished) -> None:
        i, stage_idx, _j = rec.payload  # type: ignore[misc]
        st = states[i]
        prog = st.program
        call = prog.stages[stage_idx].calls[_j]
        times = rec.token_times
        if times is None:
            # per-token times are kept for latency requests only; the others get their first token and
            # every later one at the finish (what deadline scoring reads, and TTFT)
            times = np.full(rec.output_len, np.float64(rec.finish))
            if rec.first_token is not None and times.size:
                times[0] = rec.first_token
        record = RequestRecord(
            prog.slo,
            st.stage_released,  # the call's own arrival: a later stage's is its release, not the program's
            call.input_len,
            token_times=times,
            finish=None if rec.dropped else rec.finish,
            dropped=rec.dropped,
        )
        st.records.append(record)
        if rec.first_token is not None and st.first_token is None:
            st.first_token = rec.first_token
        st.pending -= 1
        if rec.dropped:
            st.dropped = True
        else:
            st.done_goodput += (
                prog.slo.weights.input * call.input_len + prog.slo.weights.output * rec.output_len
            )
        if st.pending > 0:
            return
        if st.dropped:
            return
        if stage_idx + 1 < len(prog.stages):
            nonlocal seq
            t_next = rec.finish + prog.stages[stage_idx].tool_time_s
            heapq.heappush(heap, (t_next, seq, i, stage_idx + 1))
            seq += 1
        else:
            st.finish = rec.finish

    while True:
        t_ext = heap[0][0] if heap else math.inf
        busy = [e for e in engines if e.busy]
        eng = min(busy, key=lambda e: e.clock) if busy else None
        if eng is None and not heap:
            break
        if eng is not None and eng.clock < t_ext:
            if eng.clock > end_limit:
                break
            for rec in eng.step(t_ext):
                on_finished(rec)
            if progress is not None and eng.clock - last_report > 30.0:
                progress(min(eng.clock, horizon))
                last_report = eng.clock
        else:
            t, _s, i, stage_idx = heapq.heappop(heap)
            if t > end_limit:
                break
            release(i, stage_idx, t)
    end_time = max([e.clock for e in engines] + [horizon])
    if progress is not None:
        progress(horizon)
    return SimOutcome(
        policy=policy_name,
        label=cluster.label,
        programs=states,
        engines=engines,
        horizon=horizon,
        end_time=end_time,
        wall_s=_time.perf_counter() - wall0,
        rejections=dict(sorted(cluster.rejections.items())),
    )
