"""GMAX (JITServe §4.2, Algorithm 1): grouped margin goodput maximization, vectorized.

Per request r (only over the table's active slots):
    t_gen(r)  = len_rem(r) * v_token + remaining prefill / prefill rate   (upper-bound work)
    t_rem(r)  = time left to r's deadline (latency: to the last token's due time; a compound stage
                behind its sub-deadline: its share of what is left of the program's deadline)
    bw(r)     = t_gen / t_rem                                             (minimum serving bandwidth)
    priority  = (goodput(r) + delta * frames_waited) / t_gen               (margin goodput density)
Infeasible requests (t_rem < t_gen: they cannot earn goodput any more) leave the candidate set.
Candidates are those with priority >= cutoff * (B-th highest priority); sorted by input length, the
window of B consecutive candidates with the largest summed priority is the batch. Scheduling changes
only at frame boundaries (Delta steps), and a running request is preempted only when the admitted
request's gain over the next frame beats the stall the preemption costs (on an engine that recomputes,
only while the bandwidth committed to feasible work fits the batch).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from jitserve.scheduler.requests import BEST_EFFORT, LATENCY, RequestTable, has_later_stages

_EPS = 1e-9
RANKINGS = ("jit", "paper")
_HUGE_TBT = 1e9  # stands in for "no TBT": only the first token has a due time


@dataclass(frozen=True, slots=True)
class EngineSpeed:
    """How fast an engine runs now; the engine measures it, the simulator models it.

    Fields may be arrays with one value per analyzed slot (power-of-K dummies on different replicas).
    """

    step_time: float = 0.05  # seconds per decode step (v_token: per-token time of one request)
    prefill_tokens_per_s: float = 4000.0  # prompt tokens computed per second
    swap_bytes_per_s: float = 16e9  # host<->device KV copy rate (swap preemption)
    kv_bytes_per_token: float = 131072.0  # KV cache bytes per token (model dependent)
    decode_step_time: float | None = None  # a step with no prompt work (None: not measured, step_time)
    # KV block size of a prefix cache that keeps a preempted request's full blocks (0: none kept)
    prefix_block_tokens: int = 0

    def __post_init__(self) -> None:
        for name in ("step_time", "prefill_tokens_per_s", "swap_bytes_per_s", "kv_bytes_per_token"):
            value = getattr(self, name)
            # plain numbers skip numpy: placement builds one EngineSpeed per routed request
            ok = value > 0 if isinstance(value, float | int) else (np.asarray(value) > 0).all()
            if not ok:
                raise ValueError(f"{name}: must be > 0, got {value}")
        if self.decode_step_time is not None and not self.decode_step_time > 0:
            raise ValueError(f"decode_step_time: must be > 0, got {self.decode_step_time}")
        if self.prefix_block_tokens < 0:
            raise ValueError(f"prefix_block_tokens: must be >= 0, got {self.prefix_block_tokens}")

    def decode_step_s(self) -> float:
        """Seconds of a step without prompt work: the measured one, never above v_token (a stale
        measurement from a lighter batch must not claim decodes are slower than every step is)."""
        step = float(self.step_time)
        return step if self.decode_step_time is None else min(float(self.decode_step_time), step)


@dataclass(frozen=True, slots=True)
class GMAXParams:
    batch_size: int = 8  # B: sequences one batch holds
    cutoff: float = 0.95  # p in (0, 1]
    starvation_delta: float = 8.0  # goodput tokens added per frame spent waiting (delta)
    frame_steps: int = 50  # Delta: decode steps per scheduling frame
    # f of the SLO-type attainment term in the just-in-time reservation (scheduler/fairness.py); 0 ranks
    # by goodput saved per slot-second alone; why 0.5: docs/decisions/core.md, "f = 0.5 again"
    class_fairness: float = 0.5
    preemption: str = "recompute"  # recompute | swap | auto (cheaper of the two) | never
    oracle: bool = False  # use true lengths instead of upper bounds (oracle JITServe)
    # jit: reserve what each request needs to stay on schedule, then fill by priority (plan_frame);
    # paper: Algorithm 1's ranking alone, preemption only at frame boundaries (the ablation)
    ranking: str = "jit"

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size: must be >= 1, got {self.batch_size}")
        if not 0 < self.cutoff <= 1:
            raise ValueError(f"cutoff: must be in (0, 1], got {self.cutoff}")
        if self.starvation_delta < 0:
            raise ValueError(f"starvation_delta: must be >= 0, got {self.starvation_delta}")
        if self.frame_steps < 1:
            raise ValueError(f"frame_steps: must be >= 1, got {self.frame_steps}")
        if not 0 <= self.class_fairness <= 1:
            raise ValueError(f"class_fairness: must be in [0, 1], got {self.class_fairness}")
        if self.preemption not in ("recompute", "swap", "auto", "never"):
            raise ValueError(f"preemption: must be recompute, swap, auto or never, got {self.preemption!r}")
        if self.ranking not in RANKINGS:
            raise ValueError(f"ranking: must be one of {', '.join(RANKINGS)}, got {self.ranking!r}")


@dataclass(frozen=True, slots=True)
class Analysis:
    """Per-slot quantities for `slots` (same order)."""

    slots: np.ndarray
    t_gen: np.ndarray
    t_rem: np.ndarray
    bw: np.ndarray
    goodput: np.ndarray  # goodput still achievable if served at full speed from now
    priority: np.ndarray
    feasible: np.ndarray


@dataclass(frozen=True, slots=True)
class _Work:
    """The part of analyze that does not depend on when service starts, one row per analyzed slot.

    The just-in-time ranking prices delays (margin_goodput) for slots it has already analyzed: it
    keeps this and re-runs only `_timed` at each start time, instead of a whole analyze per delay.
    `lat_*` fields hold one value per latency row, in the order of `lat`.
    """

    t_gen: np.ndarray
    goodput: np.ndarray  # base goodput w_in * L_in + w_out * L_out (+ program); latency rows: see _timed
    deadline: np.ndarray
    # compound stages: the program's deadline D, and the share of what was left of D when the stage
    # arrived that its D_s gave it (0 for other rows)
    program_deadline: np.ndarray
    stage_share: np.ndarray
    has_stages: bool  # any row with a stage share: `_timed` skips the late-stage test without one
    is_latency: np.ndarray
    exempt: np.ndarray  # latency or best-effort: no t_rem >= t_gen feasibility test
    lat: np.ndarray  # positions of the latency rows
    lat_prefill: np.ndarray  # remaining prefill time
    lat_lag: np.ndarray  # (1 - generated) * v
    lat_arrival: np.ndarray
    lat_ttft: np.ndarray
    lat_slope: np.ndarray  # tbt - v: how much each token served at full speed gains on its due time
    lat_rising: bool  # every slope > 0 (tbt > v, the common case): a shorter formula
    lat_generated: np.ndarray  # float
    lat_total: np.ndarray  # float: upper bound (or true) total output length
    lat_last: np.ndarray  # total - 1: the last token's index
    lat_due_last: np.ndarray  # when the last token is due (a stream's t_rem is this minus the start)
    lat_w_out: np.ndarray

    def late_stages(self, start: float | np.ndarray) -> np.ndarray | None:
        """Compound stages that, served from `start`, can no longer meet their sub-deadline D_s; None
        when no row is a stage (most analyses: every placement of a non-compound request)."""
        if not self.has_stages:
            return None
        return (self.stage_share > 0) & (self.deadline - start < self.t_gen)

    def take(self, pos: np.ndarray) -> _Work:
        """The rows at `pos` (as if analyze had been given only those slots)."""
        lat = self.is_latency[pos].nonzero()[0]
        rows = np.searchsorted(self.lat, pos[lat])  # `self.lat` is ascending: the rows among latency rows
        slope = self.lat_slope[rows]
        return _Work(
            t_gen=self.t_gen[pos],
            goodput=self.goodput[pos],
            deadline=self.deadline[pos],
            program_deadline=self.program_deadline[pos],
            stage_share=self.stage_share[pos],
            has_stages=self.has_stages and bool(self.stage_share[pos].any()),
            is_latency=self.is_latency[pos],
            exempt=self.exempt[pos],
            lat=lat,
            lat_prefill=self.lat_prefill[rows],
            lat_lag=self.lat_lag[rows],
            lat_arrival=self.lat_arrival[rows],
            lat_ttft=self.lat_ttft[rows],
            lat_slope=slope,
            lat_rising=self.lat_rising or bool((slope > 0).all()),
            lat_generated=self.lat_generated[rows],
            lat_total=self.lat_total[rows],
            lat_last=self.lat_last[rows],
            lat_due_last=self.lat_due_last[rows],
            lat_w_out=self.lat_w_out[rows],
        )


def _work(
    table: RequestTable,
    speed: EngineSpeed,
    params: GMAXParams,
    slots: np.ndarray,
    computed: np.ndarray | None = None,
) -> _Work:
    v = speed.step_time
    generated = table.generated[slots]
    total = table.planned_len(slots, params.oracle)
    len_rem = (total - generated).astype(np.float64)
    input_len = table.input_len[slots]
    prefill_time = table.prefill_left(slots, computed) / speed.prefill_tokens_per_s
    t_gen = len_rem * v + prefill_time + _EPS

    slo_type = table.slo_type[slots]
    is_latency = slo_type == LATENCY
    w_out = table.w_out[slots]
    # Deadline, compound, best-effort: all-or-nothing on the (sub-)deadline.
    goodput = table.w_in[slots] * input_len.astype(np.float64) + w_out * total + table.program_goodput[slots]

    # Latency: token j (0-based) is due at arrival + ttft + j * tbt. Served at full speed from a
    # start time, token j (j >= generated) finishes at start + prefill + (j - generated + 1) * v.
    lat = is_latency.nonzero()[0]
    lat_slots = slots[lat]
    a, ttft = table.arrival[lat_slots], table.ttft[lat_slots]
    tbt = np.minimum(table.tbt[lat_slots], _HUGE_TBT)
    g = generated[lat].astype(np.float64)
    n = total[lat].astype(np.float64)
    v_lat = v[lat] if np.ndim(v) else v  # per-row speed (placement's K dummies) down to the latency rows
    slope = tbt - v_lat
    last = n - 1
    deadline = table.deadline_abs[slots]
    program_deadline = table.program_deadline[slots]
    staged = has_later_stages(deadline, program_deadline)
    has_stages = bool(staged.any())
    share = np.zeros(slots.size)
    if has_stages:  # most analyses (every placement of a non-compound request) have no stage
        arrival = table.arrival[slots]
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.clip(
                np.where(staged, (deadline - arrival) / (program_deadline - arrival), 0.0), 0.0, 1.0
            )
    return _Work(
        t_gen=t_gen,
        goodput=goodput,
        deadline=deadline,
        program_deadline=program_deadline,
        stage_share=share,
        has_stages=has_stages,
        is_latency=is_latency,
        exempt=is_latency | (slo_type == BEST_EFFORT),
        lat=lat,
        lat_prefill=prefill_time[lat],
        lat_lag=(1.0 - g) * v_lat,
        lat_arrival=a,
        lat_ttft=ttft,
        lat_slope=slope,
        lat_rising=bool((slope > 0).all()),
        lat_generated=g,
        lat_total=n,
        lat_last=last,
        lat_due_last=a + ttft + last * np.minimum(tbt, 1e6),
        lat_w_out=w_out[lat],
    )


def _timed(
    work: _Work, start: float | np.ndarray, stream_t_rem: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """t_rem, goodput and feasibility of `work`'s rows if service starts at `start` (one per row or
    one for all). `stream_t_rem=False` skips latency rows' t_rem (margins need only goodput and
    feasibility, which does not test a stream's t_rem)."""
    t_rem = work.deadline - start
    late_stage = work.late_stages(start)
    if late_stage is not None and late_stage.any():
        # A stage behind its sub-deadline D_s can still finish its program: it keeps the share of what
        # is left of D that D_s gave it when it arrived (docs/decisions/core.md, "A late stage keeps its
        # share of what is left"). Other rows' D is inf: leave them out of the product.
        left = np.where(late_stage, work.program_deadline, start) - start
        t_rem = np.where(late_stage, np.maximum(t_rem, work.stage_share * left), t_rem)
    goodput = work.goodput
    lat = work.lat
    if lat.size:
        start_lat = start[lat] if np.ndim(start) else start
        g, last = work.lat_generated, work.lat_last
        x = start_lat + work.lat_prefill + work.lat_lag - work.lat_arrival - work.lat_ttft
        slope = work.lat_slope
        # token j is on time iff j * slope >= x
        if work.lat_rising:
            # each token gains on its due time: all tokens from the first on-time one on are on time
            lo = np.maximum(g, np.ceil(x / slope - 1e-12))
            hi = last
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                bound = x / slope
            j_min = np.where(slope > 0, np.ceil(bound - 1e-12), 0.0)
            j_max = np.where(slope > 0, last, np.floor(bound + 1e-12))
            # slope <= 0: the stream falls further behind each token, so only an early prefix is on time
            j_min = np.where((slope <= 0) & (x > 0), work.lat_total, j_min)
            lo = np.maximum(g, j_min)
            hi = np.minimum(last, j_max)
        goodput = goodput.copy()  # `work.goodput` stays the base for other start times
        goodput[lat] = work.lat_w_out * np.maximum(hi - lo + 1.0, 0.0)
        if stream_t_rem:
            t_rem[lat] = work.lat_due_last - start_lat
    # Best-effort work never becomes infeasible: its default deadline only sets its pace.
    feasible = (goodput > 0) & ((t_rem >= work.t_gen) | work.exempt)
    return t_rem, goodput, feasible


def analyze(
    table: RequestTable,
    now: float,
    speed: EngineSpeed,
    params: GMAXParams,
    slots: np.ndarray | None = None,
    tenant_fair: np.ndarray | None = None,
    queue_delay: float | np.ndarray = 0.0,
    computed: np.ndarray | None = None,
) -> Analysis:
    """Lines 2-8 of Algorithm 1 for every slot at once.

    `queue_delay` shifts the start of service (the router uses it for a replica's expected wait);
    `tenant_fair[t]` in [0, 1] is Fair(r) for tenant t (higher = more deserving; tenants beyond it: 0),
    mixed into each request's priority with its class's f (the table's `fairness`). `computed` (one value
    per slot) replaces the table's prefill progress: placement analyzes one request row once per
    replica (`slots` repeats that row), each with that replica's cached prefix.
    """
    if slots is None:
        slots = table.active_slots()
    return _analyze(table, now, speed, params, slots, tenant_fair, queue_delay, computed)[0]


def _analyze(
    table: RequestTable,
    now: float,
    speed: EngineSpeed,
    params: GMAXParams,
    slots: np.ndarray,
    tenant_fair: np.ndarray | None = None,
    queue_delay: float | np.ndarray = 0.0,
    computed: np.ndarray | None = None,
) -> tuple[Analysis, _Work]:
    """analyze, also returning its start-independent part (to price other start times)."""
    work = _work(table, speed, params, slots, computed)
    t_rem, goodput, feasible = _timed(work, now + queue_delay)
    t_gen = work.t_gen
    bw = t_gen / np.maximum(t_rem, t_gen)

    waited = table.frames_waited[slots].astype(np.float64)
    priority = (goodput + params.starvation_delta * waited) / t_gen
    f = table.fairness[slots]
    if tenant_fair is not None and priority.size and (f > 0).any():
        # Priority and Fair(r) live on different scales: mix the normalized priority.
        scale = float(priority.max()) or 1.0
        tenant = table.tenant[slots]
        known = tenant < tenant_fair.size
        fair = np.where(known, tenant_fair[np.where(known, tenant, 0)], 0.0) if tenant_fair.size else 0.0
        priority = (1 - f) * (priority / scale) + f * fair
    return Analysis(slots, t_gen, t_rem, bw, goodput, priority, feasible), work


def select_group(priority: np.ndarray, input_len: np.ndarray, batch_size: int, cutoff: float) -> np.ndarray:
    """Lines 16-26 of Algorithm 1: positions (into the given arrays) of the best length window.

    Candidates: priority >= cutoff * (B-th highest priority). Among candidates sorted by input
    length, the window of B consecutive ones with the largest summed priority wins. Returns all
    positions when there are at most B requests.
    """
    n = priority.size
    if n <= batch_size:
        return np.argsort(-priority, kind="stable")
    bp = np.partition(priority, n - batch_size)[n - batch_size]  # B-th highest
    candidates = (priority >= bp * cutoff).nonzero()[0]
    order = candidates[np.argsort(input_len[candidates], kind="stable")]
    sums = np.convolve(priority[order], np.ones(batch_size), mode="valid")
    best = int(np.argmax(sums))  # first maximum: ties go to shorter inputs
    group = order[best : best + batch_size]
    return group[np.argsort(-priority[group], kind="stable")]


def stall_seconds(table: RequestTable, slots: np.ndarray, speed: EngineSpeed, mode: str) -> np.ndarray:
    """Stall a preemption of `slots` costs: recompute = re-prefill what the prefix cache did not keep of
    its sequence; swap = KV out and in."""
    seq = (table.input_len[slots] + table.generated[slots]).astype(np.float64)
    recompute = (seq - kept_prefix(seq, speed.prefix_block_tokens)) / speed.prefill_tokens_per_s
    if mode not in ("swap", "auto"):
        return recompute
    swap = 2.0 * seq * speed.kv_bytes_per_token / speed.swap_bytes_per_s
    return swap if mode == "swap" else np.minimum(recompute, swap)


def kept_prefix(seq: np.ndarray, block: int) -> np.ndarray:
    """Tokens of a preempted sequence the prefix cache serves back: its full blocks, short of the last
    token, which is always recomputed (vLLM's prefix-cache lookup stops one token short)."""
    if block <= 0:
        return np.zeros_like(seq)
    return np.floor(np.maximum(seq - 1, 0) / block) * block


def stall_tokens(
    table: RequestTable, slots: np.ndarray, stall: np.ndarray, speed: EngineSpeed, params: GMAXParams
) -> np.ndarray:
    """§4.2's goodput_loss of restoring `slots` after `stall` seconds each: stall x token generation
    speed (a batch of B at v_token each), every stalled token worth about the victim's output weight."""
    return stall * (params.batch_size / speed.step_time) * table.w_out[slots]


@dataclass(frozen=True, slots=True)
class Reservation:
    """What a just-in-time plan reserved, as the replica report carries it to placement: a newcomer that
    cannot wait a frame is reserved too, behind the `waiting` reserved requests still without a slot,
    and takes the slot of one of the `yieldable` running requests that can wait (or the next to free)."""

    waiting: int  # reserved (urgent) requests outside the batch
    yieldable: int  # requests in the batch that are not reserved and not streams (slack or best-effort work)


@dataclass(frozen=True, slots=True)
class FramePlan:
    """One frame's decision. All arrays hold table slots."""

    order: np.ndarray  # every active, unfinished slot, best first: the engine's queue order
    batch: np.ndarray  # the slots that should run this frame (running ones kept + admitted)
    preempt: np.ndarray  # running slots to preempt now
    drop: np.ndarray  # waiting slots past their waiting_time
    analysis: Analysis | None = field(default=None, compare=False)
    reservation: Reservation | None = None  # None: the policy reserves nothing (it ranks alone)


def expired(table: RequestTable, now: float, slots: np.ndarray | None = None) -> np.ndarray:
    """Slots never scheduled whose waiting_time has passed (JITServe §5's admission control).

    Best-effort work has no SLO to miss: dropping it after a wait turns "slow" into "failed", so it is
    never dropped here (it waits for capacity no SLO needs; docs/decisions/core.md).
    """
    if slots is None:
        slots = table.active_slots()
    mask = (
        ~table.started[slots] & (table.waiting_deadline[slots] < now) & (table.slo_type[slots] != BEST_EFFORT)
    )
    return slots[mask]


def plan_frame(
    table: RequestTable,
    now: float,
    speed: EngineSpeed,
    params: GMAXParams,
    tenant_fair: np.ndarray | None = None,
    drop_expired: bool = True,
    type_fair: np.ndarray | None = None,
) -> FramePlan:
    """GMAX for one frame: analyze, rank (`params.ranking`), decide preemptions against their cost.
    `type_fair[t]` in [0, 1] is Fair(r) of SLO type t for the just-in-time reservation
    (`TypeAttainment.fair`; None: the reservation by margin density alone)."""
    slots = table.active_slots()
    drop = expired(table, now, slots) if drop_expired else slots[:0]
    if drop.size:
        slots = np.setdiff1d(slots, drop, assume_unique=True)
    if slots.size == 0:
        empty = slots[:0]
        nothing = Reservation(0, 0) if params.ranking == "jit" else None
        return FramePlan(empty, empty, empty, drop, reservation=nothing)
    an, work = _analyze(table, now, speed, params, slots, tenant_fair)
    if params.ranking == "jit":
        return _plan_jit(table, now, speed, params, slots, an, work, drop, type_fair)
    return _plan_paper(table, slots, an, speed, params, drop)


def _plan_paper(
    table: RequestTable,
    slots: np.ndarray,
    an: Analysis,
    speed: EngineSpeed,
    params: GMAXParams,
    drop: np.ndarray,
) -> FramePlan:
    """Algorithm 1 as written: the length window of the highest priorities, kept until done."""
    batch = params.batch_size
    feasible_pos = np.flatnonzero(an.feasible)
    group_pos = feasible_pos[
        select_group(an.priority[feasible_pos], table.input_len[slots][feasible_pos], batch, params.cutoff)
    ]
    # Queue order: the group first, then the other feasible ones, then the infeasible, each by priority.
    in_group = np.zeros(slots.size, dtype=bool)
    in_group[group_pos] = True
    rest = np.flatnonzero(~in_group)
    rest = rest[np.lexsort((-an.priority[rest], ~an.feasible[rest]))]
    order_pos = np.concatenate([group_pos, rest])
    # Work conservation: free batch slots go to the next best requests, infeasible ones last.
    target_pos = order_pos[:batch]

    running_mask = table.running[slots]
    in_target = np.zeros(slots.size, dtype=bool)
    in_target[target_pos] = True
    admit_pos = target_pos[~running_mask[target_pos]]  # best first
    evict_pos = np.flatnonzero(running_mask & ~in_target)
    free = max(batch - int(running_mask.sum()), 0)
    preempt_pos = evict_pos[:0]
    if params.preemption != "never" and admit_pos.size > free and evict_pos.size:
        preempt_pos = _worthwhile_preemptions(table, slots, an, speed, params, admit_pos[free:], evict_pos)
    return _frame_plan(slots, running_mask, preempt_pos, admit_pos, order_pos, batch, drop, an)


def _worthwhile_preemptions(
    table: RequestTable,
    slots: np.ndarray,
    an: Analysis,
    speed: EngineSpeed,
    params: GMAXParams,
    incoming: np.ndarray,
    evictable: np.ndarray,
) -> np.ndarray:
    """Pair the most valuable incoming requests with the least valuable running ones; preempt while
    the gain over the next frame beats the goodput the stall costs (stall x token speed)."""
    frame_s = params.frame_steps * speed.step_time
    rate = np.where(an.feasible, an.goodput / np.maximum(an.t_rem, an.t_gen), 0.0)  # goodput per second
    incoming = incoming[np.argsort(-rate[incoming], kind="stable")]
    victims = evictable[np.argsort(rate[evictable], kind="stable")]
    pairs = min(incoming.size, victims.size)
    incoming, victims = incoming[:pairs], victims[:pairs]
    gain = (rate[incoming] - rate[victims]) * frame_s
    # The whole batch stalls while a victim is restored; each stalled token is worth about the
    # victim's output weight. An infeasible victim earns nothing and may never resume: free to evict.
    stall = stall_seconds(table, slots[victims], speed, params.preemption)
    loss = np.where(an.feasible[victims], stall_tokens(table, slots[victims], stall, speed, params), 0.0)
    worth = gain > loss
    # victims are sorted by value: once a pair does not pay, later pairs gain less and cost no less
    count = pairs if worth.all() else int(np.argmin(worth))
    return victims[:count]


def _frame_plan(
    slots: np.ndarray,
    running: np.ndarray,
    preempt_pos: np.ndarray,
    admit_pos: np.ndarray,
    order_pos: np.ndarray,
    batch_size: int,
    drop: np.ndarray,
    an: Analysis,
) -> FramePlan:
    """The plan both rankings end with: the running requests not preempted keep their slots, the free
    ones go to `admit_pos` (waiting positions, best first). Positions index `slots`."""
    kept = running.copy()
    kept[preempt_pos] = False
    kept_pos = kept.nonzero()[0]
    batch_pos = np.concatenate([kept_pos, admit_pos[: max(batch_size - kept_pos.size, 0)]])
    return FramePlan(
        order=slots[order_pos],
        batch=slots[batch_pos],
        preempt=slots[preempt_pos],
        drop=drop,
        analysis=an,
    )


def margin_goodput(
    table: RequestTable,
    now: float,
    speed: EngineSpeed,
    params: GMAXParams,
    slots: np.ndarray,
    value_now: np.ndarray,
    delay: float | np.ndarray,
) -> np.ndarray:
    """Goodput each slot loses if its service starts `delay` seconds later than now.

    Zero for work with slack (a deadline still met after the delay, best-effort work); the late
    tokens of a stream; all of it for a deadline the delay makes infeasible, or for a request the
    delay pushes past its waiting_time (it would be dropped). `value_now` is the goodput achievable
    now (0 where infeasible), aligned with `slots`.
    """
    droppable = ~table.started[slots] & (table.slo_type[slots] != BEST_EFFORT)
    work = _work(table, speed, params, slots)
    return _margin(work, now, now + delay, value_now, droppable, table.waiting_deadline[slots])


def _first_token_lateness(work: _Work, now: float) -> np.ndarray:
    """Per latency row: how late its first token would be if served from `now` (negative: early);
    -inf for a stream that already has one (no first token left to miss)."""
    x = now + work.lat_prefill + work.lat_lag - work.lat_arrival - work.lat_ttft
    return np.where(work.lat_generated == 0, x, -np.inf)


def _margin(
    work: _Work,
    now: float,
    start: float | np.ndarray,
    value_now: np.ndarray,
    droppable: np.ndarray,
    waiting_deadline: np.ndarray,
) -> np.ndarray:
    """margin_goodput of `work`'s rows if service starts at `start` (one per row or one for all)
    instead of `now`; `droppable`: not started and not best-effort (same rows as `work`).

    A stream whose first token is on time now but late at `start` has all of it at stake: a missed
    TTFT fails the chat as its user sees it, though a fast decoder wins back most later tokens
    (docs/decisions/core.md, "A stream's first token").
    """
    _, goodput_late, feasible_late = _timed(work, start, stream_t_rem=False)
    lost_whole = droppable & (waiting_deadline < start)  # dropped past its waiting_time by then
    if work.lat.size:
        lateness = _first_token_lateness(work, now)
        delay = (start[work.lat] if np.ndim(start) else start) - now
        misses_ttft = (lateness <= _EPS) & (lateness + delay > _EPS)
        lost_whole[work.lat[misses_ttft]] = True
    value_late = np.where(feasible_late & ~lost_whole, goodput_late, 0.0)
    return np.maximum(value_now - value_late, 0.0)


def _plan_jit(
    table: RequestTable,
    now: float,
    speed: EngineSpeed,
    params: GMAXParams,
    slots: np.ndarray,
    an: Analysis,
    work: _Work,
    drop: np.ndarray,
    type_fair: np.ndarray | None = None,
) -> FramePlan:
    """Just-in-time GMAX (docs/decisions/core.md, "Just-in-time bandwidth").

    1. Reserve: a request whose service cannot wait one frame without losing goodput (its margin over
       the frame is > 0; a compound stage with stages after it: all of its goodput) gets a slot.
       Most goodput saved per slot-second first; with `type_fair` and f = `params.class_fairness` > 0,
       that density (scaled to the largest) is mixed with its SLO type's Fair(r) as §4.2's fairness
       extension mixes priority: (1 - f) x density + f x Fair(r). Among the first B of that order, the
       streams still on time for their first token go first, earliest due first.
    2. Fill: requests with slack by Algorithm 1 (priority, cutoff, length window) in the slots left.
       Unstarted streams already past their first token's due time come after all of it.
    3. Best-effort work takes what no SLO needs; it joins step 2 only as its default deadline nears.
    Only a reserved request may preempt, and only a running one that can wait (not reserved) and is not
    a stream unless the engine swaps, when the goodput it saves beats what the victim and the stalled
    batch lose.
    """
    B = params.batch_size  # noqa: N806 (the paper's name)
    horizon = params.frame_steps * speed.step_time
    value_now = np.where(an.feasible, an.goodput, 0.0)
    is_be = table.slo_type[slots] == BEST_EFFORT
    unstarted = ~table.started[slots]
    waiting_deadline = table.waiting_deadline[slots]
    droppable = unstarted & ~is_be

    def lost(pos: np.ndarray, delay: float | np.ndarray) -> np.ndarray:
        """margin_goodput of the slots at `pos` (positions into `slots`) for `delay` (one per position
        or one for all), from the analysis already made."""
        return _margin(
            work.take(pos), now, now + delay, value_now[pos], droppable[pos], waiting_deadline[pos]
        )

    # Exactly zero without a second pass: best-effort work (never reserved), infeasible work, and
    # deadline work with a frame of slack that no drop can catch within the frame.
    maybe = (
        an.feasible
        & ~is_be
        & (
            work.is_latency
            | (an.t_rem - an.t_gen < horizon)
            | (unstarted & (waiting_deadline < now + horizon))
        )
    )
    margin = np.zeros(slots.size)
    if maybe.any():
        # most rows are priced: all of them at once costs fewer numpy calls than gathering them first
        lost_in_frame = _margin(work, now, now + horizon, value_now, droppable, waiting_deadline)
        margin = np.where(maybe, lost_in_frame, 0.0)
    if work.has_stages:
        # A compound stage with stages after it (a share of its program's deadline D below 1) has no
        # slack of its own: whatever it waits comes out of the stages after it, whose lengths and waits
        # are not known when it runs. Its whole value is at stake from its arrival, as it always was
        # once behind its sub-deadline D_s; Fair(r) keeps it from taking every slot (docs/decisions/
        # core.md, "A program's earlier stages are reserved on arrival"). `value_now` is 0 where
        # infeasible and bounds every margin.
        margin = np.where(work.stage_share > 0, value_now, margin)
    # Streams with no token yet: on time for their first token, they go first; already past it and
    # unstarted, they wait behind all feasible SLO work (docs/decisions/core.md, "First tokens first").
    first_on_time, first_missed = _first_token_groups(work, now, slots.size, unstarted)
    urgent = an.feasible & (margin > _EPS) & ~is_be & ~first_missed
    be_due = is_be & (work.deadline - now < an.t_gen + horizon)
    slack = an.feasible & ~urgent & (~is_be | be_due) & ~first_missed
    spare = an.feasible & is_be & ~be_due

    urgent_pos = urgent.nonzero()[0]
    density = margin[urgent_pos] / np.minimum(an.t_gen[urgent_pos], horizon)
    f = params.class_fairness
    if type_fair is not None and f > 0 and urgent_pos.size > 1:
        # Density and Fair(r) live on different scales: mix the density scaled to the largest.
        fair = type_fair[table.slo_type[slots[urgent_pos]]]
        density = (1 - f) * density / max(float(density.max()), _EPS) + f * fair
    urgent_pos = urgent_pos[np.argsort(-density, kind="stable")]
    urgent_pos = _first_tokens_first(urgent_pos, first_on_time, table, slots, B)
    slack_pos = slack.nonzero()[0]
    room = max(B - urgent_pos.size, 0)
    if room and slack_pos.size:
        group = slack_pos[
            select_group(an.priority[slack_pos], table.input_len[slots][slack_pos], room, params.cutoff)
        ]
        group = group[:room]
    else:
        group = slack_pos[:0]
    if group.size:
        in_group = np.zeros(slots.size, dtype=bool)
        in_group[group] = True
        slack_rest = (slack & ~in_group).nonzero()[0]
    else:
        slack_rest = slack_pos
    by_priority = lambda mask_pos: mask_pos[np.argsort(-an.priority[mask_pos], kind="stable")]  # noqa: E731
    order_pos = np.concatenate(
        [
            urgent_pos,
            group,
            by_priority(slack_rest),
            by_priority((first_missed & an.feasible).nonzero()[0]),
            by_priority(spare.nonzero()[0]),
            by_priority((~an.feasible).nonzero()[0]),
        ]
    )

    running = table.running[slots]
    reserved = urgent_pos[:B]
    free = max(B - np.count_nonzero(running), 0)
    incoming = reserved[~running[reserved]]
    preempt_pos = incoming[:0]
    swaps = params.preemption in ("swap", "auto")
    # On a recompute engine a preemption adds a re-prefill: worth it only while the bandwidth committed
    # to feasible work fits the batch (docs/decisions/core.md, "Preempt only what the batch can repay").
    fits = swaps or float(an.bw[an.feasible].sum()) <= B
    if params.preemption != "never" and incoming.size > free and fits:
        in_reserved = np.zeros(slots.size, dtype=bool)
        in_reserved[reserved] = True
        # Where preemption recomputes (vLLM V1), a running stream never yields: it would re-prefill
        # everything and fall off its timeline (docs/decisions/core.md, "Streams keep their slots");
        # and a request yields at most once: preempted again, it re-prefills again, and under overload
        # victims became urgent and preempted each other in turn ("One recompute per request").
        can_yield = swaps | (~work.is_latency & ~table.preempted[slots])
        yielders = (running & ~in_reserved & can_yield).nonzero()[0]
        if yielders.size:
            preempt_pos = _jit_preemptions(
                table, now, speed, params, slots, an, running, lost, margin, incoming[free:], yielders
            )
    waiting_order = order_pos[~running[order_pos]]  # the preempted wait for the next frame
    plan = _frame_plan(slots, running, preempt_pos, waiting_order, order_pos, B, drop, an)
    in_batch = np.isin(slots, plan.batch, assume_unique=True)
    # A running stream is not counted as yieldable: pausing it costs its place on its token timeline and a
    # re-prefill, which the preemption test rarely finds worth a newcomer's stake.
    # An engine that would not preempt now has nothing yieldable: a newcomer waits for a slot to free.
    can_preempt = params.preemption != "never" and fits
    reservation = Reservation(
        waiting=int(np.count_nonzero(urgent & ~in_batch)),
        yieldable=int(np.count_nonzero(in_batch & ~urgent & ~work.is_latency)) if can_preempt else 0,
    )
    return replace(plan, reservation=reservation)


def _first_token_groups(
    work: _Work, now: float, size: int, unstarted: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Masks over the analyzed slots: streams with no token yet whose first token is on time if served
    now, and unstarted streams whose first token is already late."""
    on_time = np.zeros(size, dtype=bool)
    missed = np.zeros(size, dtype=bool)
    if work.lat.size:
        lateness = _first_token_lateness(work, now)  # -inf once a stream has its first token
        on_time[work.lat] = np.isfinite(lateness) & (lateness <= _EPS)
        missed[work.lat] = lateness > _EPS
        missed &= unstarted
    return on_time, missed


def _first_tokens_first(
    urgent_pos: np.ndarray, first_on_time: np.ndarray, table: RequestTable, slots: np.ndarray, batch: int
) -> np.ndarray:
    """The order `urgent_pos` with the streams still on time for their first token among its first
    `batch` moved to its head, earliest due first (arrival + TTFT); the rest keep their order (density,
    mixed with Fair(r)). A first token ranked below a batch's worth of denser work waits as its density
    says (docs/decisions/core.md, "First tokens lead the batch").

    A first token is a one-off deadline: missed, the chat fails as its user sees it whatever follows,
    while a deadline request's slack spans its whole deadline (docs/decisions/core.md, "First tokens
    first").
    """
    head = first_on_time[urgent_pos]  # a copy: fancy indexing
    head[batch:] = False
    if not head.any():
        return urgent_pos
    members = urgent_pos[head]
    due = table.token_due(slots[members])  # no token yet: arrival + TTFT
    return np.concatenate([members[np.argsort(due, kind="stable")], urgent_pos[~head]])


_MAX_PAIRS = 16  # preemptions weighed per plan: bounds the cost of a plan at large B


def _jit_preemptions(
    table: RequestTable,
    now: float,
    speed: EngineSpeed,
    params: GMAXParams,
    slots: np.ndarray,
    an: Analysis,
    running: np.ndarray,
    lost: Callable[[np.ndarray, float | np.ndarray], np.ndarray],
    margin: np.ndarray,
    incoming: np.ndarray,
    yielders: np.ndarray,
) -> np.ndarray:
    """Pair reserved arrivals (most at stake first) with running requests that can yield (cheapest
    first); preempt while what the arrival saves beats what the victim and the batch lose.

    An arrival's stake is its margin over the time until a slot frees by itself (the j-th earliest
    running finish, at most a frame). A victim loses its margin over a frame plus its restore stall.
    The stall costs the larger of what the requests left running lose over it (their margins) and the
    tokens the batch would have made in it (§4.2: stall x token generation speed, each token worth the
    victim's output weight). `lost(pos, delay)` is the margin of the slots at `pos` over `delay`
    (positions here index the analyzed slots).
    """
    pairs = min(incoming.size, yielders.size, _MAX_PAIRS)
    if pairs == 0:
        return yielders[:0]
    horizon = params.frame_steps * speed.step_time
    incoming = incoming[:pairs]  # the most urgent first (reservation order): at most `pairs` pair up
    running_pos = running.nonzero()[0]
    t_gen_running = np.sort(an.t_gen[running_pos])
    natural_wait = np.minimum(t_gen_running[: incoming.size], horizon)
    if natural_wait.size < incoming.size:
        natural_wait = np.concatenate([natural_wait, np.full(incoming.size - natural_wait.size, horizon)])
    stall = stall_seconds(table, slots[yielders], speed, params.preemption)
    # the arrivals' stakes and the victims' own losses in one pass (rows are priced independently)
    losses = lost(np.concatenate([incoming, yielders]), np.concatenate([natural_wait, horizon + stall]))
    stake, victim_loss = losses[: incoming.size], losses[incoming.size :]
    incoming, stake = incoming[np.argsort(-stake, kind="stable")], np.sort(stake)[::-1]

    # Only the cheapest few victims (own loss, then restore time) are priced against the batch.
    few = np.lexsort((stall, victim_loss))[:pairs]
    yielders, stall, victim_loss = yielders[few], stall[few], victim_loss[few]
    # Costs are at least the victims' own losses: when the largest stake cannot beat the smallest,
    # no pair is worth it, whatever the batch loses.
    if stake[0] <= victim_loss.min():
        return yielders[:0]
    # The batch that keeps running waits out a victim's restore (a re-prefill or a swap back in).
    # Margins grow with the delay, so the batch's margin over the longest of these stalls bounds what
    # any one of them costs (conservative: a preemption is never cheaper than it looks). A request
    # that loses nothing over a frame loses nothing over a shorter stall: only the others are priced.
    longest = float(stall.max())
    exposed_mask = (margin > 0) | (longest > horizon)
    exposed_mask[yielders] = False  # a victim's own loss is victim_loss
    exposed = running_pos[exposed_mask[running_pos]]
    batch_loss = float(lost(exposed, longest).sum()) if exposed.size else 0.0
    # A re-prefill is engine time the whole batch waits out. A preemption is weighed only when the batch
    # is full and a request waits for it, so the tokens the batch would have made in that time are lost
    # to whoever waits, slack or not: §4.2's goodput_loss = stall x token generation speed (docs/
    # decisions/core.md, "A re-prefill costs the tokens the batch would have made"). The margins above
    # price the same seconds by the running requests' SLOs: the larger of the two counts, not the sum.
    cost = victim_loss + np.maximum(batch_loss, stall_tokens(table, slots[yielders], stall, speed, params))
    cheapest = np.lexsort((stall, cost))  # equal losses: the cheaper restore yields
    victims, cost = yielders[cheapest][:pairs], cost[cheapest][:pairs]
    worth = stake[:pairs] > cost
    count = pairs if worth.all() else int(worth.argmin())
    return victims[:count]


def end_frame(table: RequestTable, plan: FramePlan) -> None:
    """Starvation bookkeeping: candidates left waiting this frame age by one frame."""
    waiting = plan.order[~table.running[plan.order]]
    if waiting.size:
        table.frames_waited[waiting] += 1


class CutoffTuner:
    """Online tuning of the cutoff p (§4.2): epsilon-greedy over a few arms, rewarded by goodput.

    Each epoch runs one arm; its reward is the goodput per second observed during the epoch. The
    running mean per arm is an exponential average so the choice follows workload shifts.
    """

    def __init__(
        self,
        arms: tuple[float, ...] = (0.8, 0.85, 0.9, 0.95, 1.0),
        initial: float = 0.95,
        epsilon: float = 0.1,
        smoothing: float = 0.3,
        seed: int = 0,
    ) -> None:
        if initial not in arms:
            raise ValueError(f"initial: {initial} is not one of the arms {arms}")
        self.arms = arms
        self.epsilon = epsilon
        self.smoothing = smoothing
        self.value = np.full(len(arms), np.nan)
        self._rng = np.random.default_rng(seed)
        self._current = arms.index(initial)

    @property
    def cutoff(self) -> float:
        return self.arms[self._current]

    def record(self, goodput_per_s: float) -> float:
        """Close an epoch with its reward; returns the cutoff for the next epoch."""
        i = self._current
        old = self.value[i]
        self.value[i] = (
            goodput_per_s if np.isnan(old) else (1 - self.smoothing) * old + self.smoothing * (goodput_per_s)
        )
        untried = np.flatnonzero(np.isnan(self.value))
        if untried.size:
            self._current = int(untried[0])
        elif self._rng.random() < self.epsilon:
            self._current = int(self._rng.integers(len(self.arms)))
        else:
            self._current = int(np.nanargmax(self.value))
        return self.cutoff
