"""A discrete-event model of one vLLM engine replica.

What it models (docs/decisions/sim.md has the why of each choice):
- continuous batching up to `batch_size` sequences (vLLM max_num_seqs);
- chunked prefill with a per-step token budget, decode tokens first (vLLM v1 / Sarathi-Serve), or
  vLLM v0's prefill-first steps of whole prompts that pause every decode (`chunked_prefill=False`);
- KV-cache blocks: a request is admitted only if its whole prompt fits; when decode growth
  exhausts the blocks the engine preempts (recompute) the running request last in the policy's order;
- policy preemption by recompute (KV blocks freed, re-prefill of prompt + generated tokens) or swap (KV
  copied out and back over the host link; the engine stalls for each copy). With prefix caching on (vLLM
  V1's default) a recompute victim's full blocks stay in the cache, as vLLM frees them with their hashes,
  and only the rest is re-prefilled when it is admitted again (`kept_prefix`, what GMAX prices); a KV
  preemption keeps nothing: the cache is full, so the freed blocks are the next ones reused, and every
  other waiting victim's kept blocks are evicted with them;
- the roofline step time of `profiles.BatchTimeModel`, including the input-length heterogeneity
  penalty.

The engine advances in macro steps: runs of identical steps (same sequences, same chunk sizes) that
end at the first completion, prefill completion, frame boundary, KV exhaustion or external event.
Each token gets the exact time of the step that produced it, so per-token goodput is exact under
the model; only the slow growth of contexts inside a macro step is averaged (mid-point contexts).

The policy is the scheduler core's `Policy`, driven by the core's `FrameDriver` (scheduler/frames.py,
the same one the vLLM adapter uses) on simulated time: a plan at frame boundaries (every
`frame_steps` steps) and, to stay work-conserving, whenever a request arrives or finishes while a
batch slot is free. Mid-frame plans only admit, unless the policy sets `preempts_midframe` (just-in-time
GMAX): then the engine re-plans on every event, full batch or not, and carries out the plan's
preemptions at once, so an urgent arrival does not wait for a frame boundary. Policies with
`frame_steps == 1` (vLLM-style baselines) are planned on every event, which is equivalent to planning
every step because their decisions change only on events. The policy is always asked: there is no
shortcut that admits in arrival order when everything fits.

As in vLLM v1's scheduler (`vllm/v1/core/sched/scheduler.py`, `schedule()`):
- admission and the prefill token budget follow the policy's order: requests whose prefill has
  started keep their place (vLLM's running list), those whose prefill has not started take the
  budget in the latest plan's order (vLLM's waiting queue, FCFS or priority);
- when decode growth runs out of KV blocks, the engine preempts and admits nothing new in that step
  (vLLM schedules waiting requests only `if not preempted_reqs`), so a KV preemption is never undone
  at the same instant;
- simulated time always advances: `MAX_STALLED_STEPS` consecutive `step()` calls without the clock
  moving raise `SimulationStalledError` instead of spinning.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from jitserve.scheduler.budget import prompt_chunk_cap, prompt_order
from jitserve.scheduler.fairness import counted_outcome
from jitserve.scheduler.frames import LIGHT, FrameDriver
from jitserve.scheduler.gmax import EngineSpeed, FramePlan, kept_prefix
from jitserve.scheduler.goodput import latency_met, latency_on_time_tokens
from jitserve.scheduler.policy import Policy
from jitserve.scheduler.requests import LATENCY, NewRequest, RequestTable
from jitserve.scheduler.speed import SpeedMeter
from jitserve.sim.profiles import BatchTimeModel, Profile

_IDLE_WAKE_S = 0.05  # an engine with queued but unadmitted work re-checks after this long
_SPEED_STEP = 1.02  # the policies see v_token and the prefill rate rounded to this ratio
# step() calls in a row that may leave the clock where it is (drops, KV preemptions, plans) before the
# engine calls it a livelock: far more than any legitimate chain (one KV preemption per running request)
MAX_STALLED_STEPS = 10_000
_UNRANKED = float(2**62)  # plan rank of a request no plan has ordered yet


class SimulationStalledError(RuntimeError):
    """The engine's clock stopped advancing: a scheduling livelock (a bug, never a result)."""


@dataclass(frozen=True, slots=True)
class EngineConfig:
    batch_size: int
    token_budget: int  # tokens per step (decode tokens count one each)
    chunked_prefill: bool
    kv_capacity: int  # tokens (whole blocks)
    block_size: int = 16
    preemption: str = "recompute"  # how policy-requested preemptions are done: recompute|swap|auto
    prefix_caching: bool = True  # vLLM V1's default: a recompute victim's full KV blocks are kept
    watermark: float = 0.01  # share of KV blocks kept free at admission (vLLM's watermark)
    macro_cap: int = 64  # most identical steps simulated at once (context growth averaging)
    refresh_tokens: int = 50  # length-bound refresh granularity (JITServe §4.1)

    @classmethod
    def from_profile(cls, profile: Profile, **overrides: object) -> EngineConfig:
        fields: dict[str, object] = {
            "batch_size": profile.max_num_seqs,
            "token_budget": 8192,
            "chunked_prefill": True,
            "kv_capacity": profile.kv_capacity,
            "block_size": profile.block_size,
        }
        fields.update(overrides)
        return cls(**fields)  # type: ignore[arg-type]


@dataclass(slots=True)
class CallInfo:
    """What the engine needs of one LLM call beyond the request table."""

    request_id: str
    true_len: int
    features: tuple[float, ...] = ()  # whatever the bound function needs (see predictor.py)
    payload: object = None  # the simulator's handle, returned on completion
    # Aborts from outside the engine (a real stack's router and client): the call is cancelled if it
    # has no first token by `first_token_by` (the router's first-token timeout) or is not done by
    # `abort_at` (the client's timeout). Infinite by default: the paper's setup has neither.
    first_token_by: float = math.inf
    abort_at: float = math.inf


@dataclass(slots=True)
class Finished:
    payload: object
    request_id: str
    finish: float
    output_len: int
    token_times: np.ndarray | None  # latency requests only
    dropped: bool = False
    first_token: float | None = None


@dataclass(slots=True)
class EngineStats:
    steps: int = 0
    busy_s: float = 0.0
    stall_s: float = 0.0
    decode_tokens: int = 0
    prefill_tokens: int = 0
    preemptions: int = 0
    kv_preemptions: int = 0
    prefix_hit_tokens: int = 0  # re-prefill a recompute victim was spared by its kept blocks
    drops: int = 0
    aborts: int = 0  # cancelled by the router's or client's timeout (CallInfo.first_token_by/abort_at)
    plans: int = 0
    frames: int = 0
    midframe_preemptions: int = 0  # policy preemptions carried out between frame boundaries
    instant_readmissions: int = 0  # preempted and admitted again at the same simulated instant


# (features [n, f] from CallInfo.features, generated [n]) -> total output-length upper bounds [n]
BoundFn = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass
class Engine:
    """One replica. The simulator adds requests, calls `step` and collects `Finished` records."""

    name: str
    policy: Policy
    config: EngineConfig
    timing: BatchTimeModel
    profile: Profile
    bound_fn: BoundFn | None = None  # refreshes len_ub every `refresh_tokens`; None keeps it fixed
    clock: float = 0.0
    table: RequestTable = field(default_factory=lambda: RequestTable(capacity=512))
    stats: EngineStats = field(default_factory=EngineStats)
    # engine-side per-slot state, grown with the table
    _info: dict[int, CallInfo] = field(default_factory=dict)
    _target: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # prefill target
    _swapped: np.ndarray = field(default_factory=lambda: np.zeros(0, np.bool_))
    # tokens a waiting recompute victim finds in the prefix cache when admitted again (vLLM sets
    # num_computed_tokens from the cache hit at that moment, not before)
    _kept: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    _refreshed: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # generated at refresh
    _first_token: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))
    _true: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # true output length
    # Token times of latency requests: each decoding run is a range of global step indices; the
    # engine keeps every step's end time (and whether decodes ran in it: vLLM v0 prefill steps).
    _seg_open: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    _segs: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    _step_end: np.ndarray = field(default_factory=lambda: np.zeros(4096, np.float64))
    _step_decoded: np.ndarray = field(default_factory=lambda: np.zeros(4096, np.bool_))
    _nsteps: int = 0
    _running: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # slots, admission order
    meter: SpeedMeter = field(default_factory=SpeedMeter)  # what the policy plans with, as the engine's
    _speed: EngineSpeed | None = None
    _kv_cache: int = -1  # KV tokens in use; -1 = recompute
    _feats: np.ndarray = field(default_factory=lambda: np.zeros((0, 6), np.float64))
    _first_by: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))
    _abort_at: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))
    _aborts: bool = False  # some call has a finite abort time
    _rank: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))  # position in the last plan
    _kv_preempted: bool = False  # a KV preemption since the last step ran: admit nothing (vLLM)
    _stalled: int = 0  # step() calls in a row without the clock advancing
    _preempted_at: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))

    def __post_init__(self) -> None:
        self._sync_capacity()
        self._prefill_rate = self.timing.prefill_tokens_per_s(min(self.config.token_budget, 2048))
        self._kept_block = self.config.block_size if self.config.prefix_caching else 0
        # The engine's own meter, primed as a calibrated engine starts; then fed every simulated step
        # as the vLLM adapter feeds it every real one (v_token over every step that decodes).
        prior = self.timing.decode_step_time(max(self.config.batch_size // 4, 1), 1024.0)
        self.meter.step_time = self.meter.decode_step_time = prior
        self.meter.prefill_tokens_per_s = self._prefill_rate
        # The core's frame driver on simulated time. Policies with frame_steps == 1 are unframed here
        # (planned on events only), and frames close with the latest plan: see scheduler/frames.py.
        self.driver = FrameDriver(
            self.policy,
            self.table,
            lambda: self.clock,
            framed=self.policy.frame_steps > 1,
            close_with="last_plan",
        )
        # The policy may run fewer sequences than the engine allows (GMAX's B < max_num_seqs).
        params = getattr(self.policy, "params", None)
        policy_batch = getattr(params, "batch_size", None) or getattr(self.policy, "batch_size", None)
        self._policy_batch = min(int(policy_batch or self.config.batch_size), self.config.batch_size)
        # the vLLM adapter's step composition for policies that order prompts (scheduler.budget)
        self._orders_prompts = bool(getattr(self.policy, "orders_prompts", False))
        budget_fn = getattr(self.policy, "token_budget", None)
        self._budget_fn: Callable[[RequestTable, float, EngineSpeed, int], int] | None = (
            budget_fn if callable(budget_fn) else None
        )

    # ------------------------------------------------------------------------------- interface
    @property
    def busy(self) -> bool:
        return len(self.table) > 0

    @property
    def running_count(self) -> int:
        return int(self._running.size)

    @property
    def waiting_count(self) -> int:
        return len(self.table) - self.running_count

    @property
    def kv_used(self) -> int:
        if self._kv_cache < 0:
            self._kv_cache = self._kv_used(self._running)
        return self._kv_cache

    def speed(self) -> EngineSpeed:
        # The meter's estimates in 2% steps: EngineSpeed validates on construction, so it is rebuilt
        # only when they change, and the speed never depends on how often it is read (the router model
        # reads it at every arrival; a replay does not).
        step = _SPEED_STEP ** round(math.log(self.meter.step_time) / math.log(_SPEED_STEP))
        rate = _SPEED_STEP ** round(math.log(self.meter.prefill_tokens_per_s) / math.log(_SPEED_STEP))
        # (the meter starts primed with the calibrated decode step, so it always has one)
        decode = _SPEED_STEP ** round(math.log(self.meter.decode_step_time) / math.log(_SPEED_STEP))
        cached = self._speed
        if (
            cached is None
            or float(cached.step_time) != step
            or float(cached.prefill_tokens_per_s) != rate
            or cached.decode_step_time != decode
        ):
            cached = EngineSpeed(
                step_time=step,
                prefill_tokens_per_s=rate,
                decode_step_time=decode,
                swap_bytes_per_s=self.profile.swap_bytes_per_s,
                kv_bytes_per_token=self.profile.model.kv_bytes_per_token,
                prefix_block_tokens=self._kept_block,
            )
            self._speed = cached
        return cached

    def add(self, req: NewRequest, info: CallInfo, now: float) -> None:
        if not self.busy:
            self.clock = max(self.clock, now)
        slot = self.table.add(req)
        self._sync_capacity()
        self._info[slot] = info
        self._target[slot] = req.input_len
        self._swapped[slot] = False
        self._kept[slot] = 0
        self._refreshed[slot] = 0
        self._first_token[slot] = np.nan
        self._true[slot] = info.true_len
        if info.features:
            self._feats[slot] = info.features
        self._first_by[slot] = info.first_token_by
        self._abort_at[slot] = info.abort_at
        self._aborts = self._aborts or math.isfinite(info.first_token_by) or math.isfinite(info.abort_at)
        self._seg_open[slot] = -1
        self._rank[slot] = _UNRANKED
        self._preempted_at[slot] = -math.inf
        if self.table.slo_type[slot] == LATENCY:
            self._segs[slot] = []
        self.driver.mark_dirty()

    def step(self, t_limit: float = math.inf) -> list[Finished]:
        """Plan if due, then run one macro step (or idle briefly). Returns finished/dropped calls."""
        out: list[Finished] = []
        clock0 = self.clock
        if self._aborts:
            self._expire(out)
        self._maybe_plan(out)
        if self._running.size == 0:
            if self.busy:  # queued work the policy holds back (or KV-blocked): look again soon
                self.clock = max(self.clock + _IDLE_WAKE_S, min(t_limit, self.clock + 1.0))
                self.driver.mark_dirty()
                self._kv_preempted = False
        else:
            self._run_macro_step(t_limit, out)
        self._check_progress(clock0)
        return out

    def _check_progress(self, clock0: float) -> None:
        if self.clock > clock0 or not self.busy:
            self._stalled = 0
            return
        self._stalled += 1
        if self._stalled >= MAX_STALLED_STEPS:
            raise SimulationStalledError(
                f"{self.name}: {self._stalled} engine steps without the clock advancing "
                f"at t={self.clock:.6f} s "
                f"({self.running_count} running, {self.waiting_count} waiting, policy {self.policy.name}, "
                f"{self.stats.preemptions} preemptions): a scheduling livelock"
            )

    def _next_abort(self) -> float:
        slots = self.table.active_slots()
        if slots.size == 0:
            return math.inf
        first = np.where(np.isnan(self._first_token[slots]), self._first_by[slots], math.inf)
        return float(np.minimum(first, self._abort_at[slots]).min())

    def _expire(self, out: list[Finished]) -> None:
        """Cancel the calls whose router or client gave up (at the first step boundary after)."""
        slots = self.table.active_slots()
        if slots.size == 0:
            return
        late_first = np.isnan(self._first_token[slots]) & (self._first_by[slots] <= self.clock)
        gone = slots[late_first | (self._abort_at[slots] <= self.clock)]
        for slot in gone.tolist():
            out.append(self._finish(slot, dropped=True))
            self.stats.aborts += 1
        if gone.size:
            self.driver.mark_dirty()

    # ------------------------------------------------------------------------------ planning
    def _maybe_plan(self, out: list[Finished]) -> None:
        # A framed policy re-plans on an event only while a batch slot is free, unless it preempts
        # mid-frame (an urgent arrival may take a slot at once): the driver's `has_room`.
        kind = self.driver.due(has_room=self._running.size < self._policy_batch)
        if kind is None:
            return
        plan = self.driver.plan(kind, self.speed())
        self.stats.plans, self.stats.frames = self.driver.plans, self.driver.frames_closed
        if kind == LIGHT and plan.preempt.size:  # (kept by the driver only if the policy preempts mid-frame)
            self.stats.midframe_preemptions += int(self.table.running[plan.preempt].sum())
        self._apply(plan, out=out)

    def _reacts_to_arrivals(self) -> bool:
        """Whether a request arriving mid-macro-step could change the next step: if a batch slot is
        free, the policy preempts mid-frame, or it re-plans (and may preempt) on every event. Any
        other framed policy with a full batch looks at arrivals only at its next frame boundary."""
        if self._running.size < self._policy_batch or self.driver.preempts_midframe:
            return True
        return not self.driver.framed and bool(getattr(self.policy, "preemptive", False))

    def _apply(self, plan: FramePlan, out: list[Finished]) -> None:
        """Carry out a plan: drops, preemptions (a light plan has none unless the policy preempts
        mid-frame: the frame driver removed them), then admissions in the plan's batch order."""
        if plan.order.size:  # the budget's order for prefills not yet started (vLLM's waiting queue)
            self._rank[plan.order] = np.arange(plan.order.size, dtype=np.float64)
        for slot in plan.drop.tolist():
            if self.table.started[slot]:
                continue  # started requests are never dropped
            out.append(self._finish(slot, dropped=True))
            self.stats.drops += 1
        if plan.preempt.size:
            for slot in plan.preempt.tolist():
                if self.table.active[slot] and self.table.running[slot]:
                    self._preempt(slot, self.config.preemption)
                    self.table.mark_preempted(slot)  # the policy's, as the engine runner marks it
        if self._kv_preempted:
            return  # vLLM: no waiting request is scheduled in a step that preempted for KV blocks
        running = set(self._running.tolist())
        admitted: list[int] = []
        kv_free = self.config.kv_capacity * (1 - self.config.watermark) - self.kv_used
        # never past the policy's own batch: a mid-frame plan whose preemptions the engine does not carry
        # out must not admit their replacements on top of the batch (the next frame would then preempt
        # the excess, and so on: a preemption storm)
        room = self._policy_batch - len(running)
        for slot in plan.batch.tolist():
            if room <= 0:
                break
            if slot in running or not self.table.active[slot]:
                continue
            need = self._blocks(max(int(self._target[slot]), int(self.table.computed[slot])) + 1)
            if need > kv_free:
                if need > self.config.kv_capacity:  # can never fit: reject it
                    out.append(self._finish(slot, dropped=True))
                    continue
                break  # head-of-line: wait for blocks (vLLM does not skip ahead)
            kv_free -= need
            admitted.append(slot)
            room -= 1
        for slot in admitted:
            if self._preempted_at[slot] == self.clock:
                self.stats.instant_readmissions += 1
            self.table.running[slot] = True  # `started` when its first tokens are scheduled, as in vLLM
            self.table.frames_waited[slot] = 0
            if self._swapped[slot]:
                self._stall(self._swap_seconds(slot))
                self._swapped[slot] = False
                self._seg_open[slot] = self._nsteps  # decoding resumes with the next step
            elif self._kept[slot]:  # the prefix cache serves the victim's kept blocks back
                self.table.computed[slot] = self._kept[slot]
                self.stats.prefix_hit_tokens += int(self._kept[slot])
                self._kept[slot] = 0
        if admitted:
            self._running = np.concatenate([self._running, np.asarray(admitted, dtype=np.int64)])
            self._kv_cache = -1

    # ------------------------------------------------------------------------------ execution
    def _run_macro_step(self, t_limit: float, out: list[Finished]) -> None:
        cfg = self.config
        run = self._running
        computed = self.table.computed[run]
        target = self._target[run]
        prefilling = computed < target
        dec = run[~prefilling]
        pre = run[prefilling]
        if pre.size > 1:
            # started prefills keep their place (admission order: vLLM's running list); the rest take
            # the budget in the policy's latest order (vLLM's waiting queue order). A policy that orders
            # prompts puts started streams' prompts first, as the vLLM adapter orders the running list.
            unstarted = self.table.computed[pre] == 0
            if self._orders_prompts:
                pre = pre[prompt_order(~unstarted, self.table.slo_type[pre] == LATENCY, self._rank[pre])]
            else:
                pre = pre[np.lexsort((np.where(unstarted, self._rank[pre], 0.0), unstarted))]
        budget = cfg.token_budget
        if self._budget_fn is not None:
            budget = max(int(self._budget_fn(self.table, self.clock, self.speed(), budget)), 1)
        # Step composition
        if pre.size and not cfg.chunked_prefill:
            rem = (self._target[pre] - self.table.computed[pre]).astype(np.int64)
            take = np.cumsum(rem) <= max(budget, int(rem[0]))
            take[0] = True
            pre, chunks = pre[take], rem[take]
            dec = dec[:0]  # vLLM v0: a prefill step pauses every decode
        elif pre.size:
            left = max(budget - dec.size, 0)
            rem = (self._target[pre] - self.table.computed[pre]).astype(np.int64)
            if self._orders_prompts and pre.size > 1:
                rem = self._cap_prompts(pre, rem, left)
            give = np.minimum(rem, np.maximum(left - np.concatenate([[0], np.cumsum(rem)[:-1]]), 0))
            keep = give > 0
            pre, chunks, rem = pre[keep], give[keep], rem[keep]
        else:
            chunks = np.zeros(0, np.int64)
        if dec.size == 0 and pre.size == 0:  # a zero prefill budget with nothing decoding
            pre = run[prefilling][:1]
            chunks = np.ones(1, np.int64)
        # KV: make room for one step's growth, preempting from the back of the policy's order
        growth = int(dec.size + chunks.sum())
        if self.kv_used + growth > cfg.kv_capacity and self._running.size > 1:
            victim = self._kv_victim()
            self._preempt(victim, "recompute")
            # the cache is full: the victim's freed blocks and every earlier victim's kept ones (cached
            # blocks go first from vLLM's free queue) are the next ones reused, so nothing stays kept
            self._kept[:] = 0
            self.stats.kv_preemptions += 1
            self._kv_preempted = True  # nothing is admitted until a step has run
            self.driver.mark_dirty()
            return  # recompose next call
        # How many identical steps
        k = cfg.macro_cap
        gen = self.table.generated
        if dec.size:
            k = min(k, int((self._true[dec] - gen[dec]).min()))
        if pre.size:
            rem_pre = (self._target[pre] - self.table.computed[pre]).astype(np.int64)
            if not cfg.chunked_prefill:
                k = 1
            else:
                k = min(k, int(np.maximum(rem_pre // np.maximum(chunks, 1), 1).min()))
        to_frame = self.driver.steps_left()
        if to_frame is not None:
            k = min(k, to_frame)
        dec_ctx0 = (self.table.computed[dec]).astype(np.float64)
        pre_off0 = self.table.computed[pre].astype(np.float64)
        dt0 = self.timing.step_time(dec_ctx0, chunks, pre_off0)
        if math.isfinite(t_limit) and t_limit > self.clock and self._reacts_to_arrivals():
            k = min(k, max(int(math.ceil((t_limit - self.clock) / max(dt0, 1e-9))), 1))
        if self._aborts:  # end at the first step boundary after the next cancellation
            t_abort = self._next_abort()
            if math.isfinite(t_abort):
                k = min(k, max(int(math.ceil((t_abort - self.clock) / max(dt0, 1e-9))), 1))
        per_step_growth = max(dec.size + int(chunks.sum()), 1)
        k = min(k, max(int((cfg.kv_capacity - self.kv_used) // per_step_growth), 1))
        k = max(k, 1)
        half = (k - 1) / 2.0
        dt = self.timing.step_time(dec_ctx0 + half, chunks, pre_off0 + chunks * half) if k > 1 else dt0
        start = self.clock
        end = start + k * dt
        first_step = self._record_steps(start, dt, k, decoded=dec.size > 0)
        # Advance decodes
        if dec.size:
            gen[dec] += k
            self.table.computed[dec] += k
            self.stats.decode_tokens += int(dec.size) * k
        # Advance prefills; a completed prefill samples the next token in its last step
        done_pre = pre[:0]
        if pre.size:
            self.table.computed[pre] += chunks * k
            self.table.started[pre] = True
            self.stats.prefill_tokens += int(chunks.sum()) * k
            done_pre = pre[self.table.computed[pre] >= self._target[pre]]
            if done_pre.size:
                self.table.computed[done_pre] = self._target[done_pre] + 1
                gen[done_pre] += 1
                fresh = done_pre[np.isnan(self._first_token[done_pre])]
                self._first_token[fresh] = end
                # the decoding run starts at this step; decodes then produce one token per step
                self._seg_open[done_pre] = first_step + k - 1
        self.clock = end
        self._kv_preempted = False
        self._kv_cache = -1
        self.stats.steps += k
        self.stats.busy_s += k * dt
        self.driver.advance(k)
        self.meter.observe(dt, int(dec.size), int(chunks.sum()), k)
        # Completions
        run = self._running
        finished = run[gen[run] >= self._true[run]]
        for slot in finished.tolist():
            out.append(self._finish(slot, dropped=False))
        if finished.size or done_pre.size:
            self.driver.mark_dirty()
        self._refresh_bounds()

    def _refresh_bounds(self) -> None:
        run = self._running
        if self.bound_fn is None or run.size == 0:
            return
        gen = self.table.generated[run]
        due = gen // self.config.refresh_tokens > self._refreshed[run] // self.config.refresh_tokens
        if not due.any():
            return
        slots = run[due]
        g = gen[due]
        ub = np.asarray(self.bound_fn(self._feats[slots], g), dtype=np.int64)
        self.table.set_bounds(slots, ub)
        self._refreshed[slots] = g

    # ------------------------------------------------------------------------------ helpers
    def _record_steps(self, start: float, dt: float, k: int, decoded: bool) -> int:
        """Append k steps' end times to the timeline; returns the first one's index."""
        n = self._nsteps
        if n + k > self._step_end.size:
            size = max(2 * self._step_end.size, n + k)
            self._step_end = np.resize(self._step_end, size)
            self._step_decoded = np.resize(self._step_decoded, size)
        self._step_end[n : n + k] = start + dt * np.arange(1, k + 1)
        self._step_decoded[n : n + k] = decoded
        self._nsteps = n + k
        return n

    def _close_segment(self, slot: int) -> None:
        a = int(self._seg_open[slot])
        if a >= 0:
            segs = self._segs.get(slot)
            if segs is not None:
                segs.append((a, self._nsteps - 1))
            self._seg_open[slot] = -1

    def _token_times(self, slot: int) -> np.ndarray:
        segs = self._segs.get(slot, [])
        parts = []
        for a, b in segs:
            # the first step of a run is the prefill's own step; later ones only if decodes ran
            idx = np.arange(a, b + 1)
            keep = self._step_decoded[idx]
            keep[0] = True
            parts.append(self._step_end[idx[keep]])
        return np.concatenate(parts) if parts else np.zeros(0)

    def _blocks(self, tokens: int) -> int:
        bs = self.config.block_size
        return -(-tokens // bs) * bs

    def _kv_used(self, slots: np.ndarray) -> int:
        if slots.size == 0:
            return 0
        bs = self.config.block_size
        tokens = self.table.computed[slots] + 1
        return int(((tokens + bs - 1) // bs * bs).sum())

    def _cap_prompts(self, pre: np.ndarray, rem: np.ndarray, prompt_budget: int) -> np.ndarray:
        """Started prompts leave unstarted streams their prompts (`prompt_chunk_cap`, the adapter's
        `long_prefill_token_threshold`): the cap binds every prompt, as vLLM's does."""
        unstarted = self.table.computed[pre] == 0
        streams = unstarted & (self.table.slo_type[pre] == LATENCY)
        if not streams.any() or unstarted.all():
            return rem
        cap = prompt_chunk_cap(prompt_budget, rem[streams])
        return rem if cap is None else np.minimum(rem, cap)

    def _kv_victim(self) -> int:
        """vLLM preempts the last of its running list. The adapter sorts that list by the plan's order, or,
        for a policy that orders prompts, decodes first and the started prompts after them."""
        if self._orders_prompts:
            run = self._running
            computed = self.table.computed[run]
            prompts = run[(computed > 0) & (computed < self._target[run])]
            if prompts.size:
                streams = self.table.slo_type[prompts] == LATENCY
                order = prompt_order(np.ones(prompts.size, bool), streams, self._rank[prompts])
                return int(prompts[order[-1]])
        last = self.driver.last_plan
        order = last.order if last is not None else self._running
        running = set(self._running.tolist())
        for s in order[::-1].tolist():
            if s in running:
                return s
        return int(self._running[-1])

    def _swap_seconds(self, slot: int) -> float:
        seq = float(self.table.computed[slot])
        return seq * self.profile.model.kv_bytes_per_token / self.profile.swap_bytes_per_s

    def _stall(self, seconds: float) -> None:
        self.clock += seconds
        self.stats.stall_s += seconds

    def _preempt(self, slot: int, mode: str) -> None:
        seq = int(self.table.input_len[slot] + self.table.generated[slot])
        kept = int(kept_prefix(np.asarray(seq), self._kept_block))  # its full blocks, if a cache keeps them
        if mode == "auto":
            recompute_s = (seq - kept) / self._prefill_rate
            mode = "swap" if 2 * self._swap_seconds(slot) < recompute_s else "recompute"
        computed = int(self.table.computed[slot])
        self._kv_cache = -1
        self._close_segment(slot)
        self.table.running[slot] = False
        self._running = self._running[self._running != slot]
        self.stats.preemptions += 1
        self._preempted_at[slot] = self.clock
        if mode == "swap":
            self._stall(self._swap_seconds(slot))
            self._swapped[slot] = True
            self.table.computed[slot] = computed
        else:
            self.table.computed[slot] = 0
            self._kept[slot] = kept
            self._target[slot] = seq

    def _finish(self, slot: int, dropped: bool) -> Finished:
        info = self._info.pop(slot)
        self._close_segment(slot)
        segs = self._segs.pop(slot, None)
        times = None
        if segs is not None and not dropped:
            self._segs[slot] = segs
            times = self._token_times(slot)
            del self._segs[slot]
        gen = int(self.table.generated[slot])
        first = float(self._first_token[slot])
        rec = Finished(
            payload=info.payload,
            request_id=info.request_id,
            finish=self.clock,
            output_len=gen,
            token_times=times,
            dropped=dropped,
            first_token=None if math.isnan(first) else first,
        )
        t = self.table
        met = False
        if not dropped:
            # goodput the engine saw this frame (the cutoff tuner's reward): tokens on time
            slo_ok = self.clock <= t.deadline_abs[slot] + 1e-9
            if t.slo_type[slot] == LATENCY or slo_ok:
                self.driver.record(float(t.w_in[slot] * t.input_len[slot] + gen))
            if t.slo_type[slot] == LATENCY:
                tbt = min(float(t.tbt[slot]), 1e18)  # inf: no TBT, only the first token is due
                on_time = (
                    latency_on_time_tokens(times, t.arrival[slot], t.ttft[slot], tbt)
                    if times is not None
                    else 0
                )
                met = latency_met(on_time, gen, finished=True)
            else:
                met = bool(slo_ok)
        slo_type = int(t.slo_type[slot])
        finished_at = None if dropped else self.clock
        counted = counted_outcome(
            slo_type, met, finished_at, float(t.deadline_abs[slot]), float(t.program_deadline[slot])
        )
        if counted is not None:
            self.driver.outcome(slo_type, counted, int(t.tenant[slot]))
        if self.table.running[slot]:
            self._running = self._running[self._running != slot]
            self._kv_cache = -1
        self.table.remove(info.request_id)
        return rec

    def _sync_capacity(self) -> None:
        cap = self.table.capacity
        if self._target.size == cap:
            return
        grow = cap - self._target.size
        self._target = np.concatenate([self._target, np.zeros(grow, np.int64)])
        self._swapped = np.concatenate([self._swapped, np.zeros(grow, np.bool_)])
        self._kept = np.concatenate([self._kept, np.zeros(grow, np.int64)])
        self._refreshed = np.concatenate([self._refreshed, np.zeros(grow, np.int64)])
        self._first_token = np.concatenate([self._first_token, np.full(grow, np.nan)])
        self._true = np.concatenate([self._true, np.zeros(grow, np.int64)])
        self._seg_open = np.concatenate([self._seg_open, np.full(grow, -1, np.int64)])
        self._feats = np.concatenate([self._feats, np.zeros((grow, 6), np.float64)])
        self._first_by = np.concatenate([self._first_by, np.full(grow, math.inf)])
        self._abort_at = np.concatenate([self._abort_at, np.full(grow, math.inf)])
        self._rank = np.concatenate([self._rank, np.full(grow, _UNRANKED)])
        self._preempted_at = np.concatenate([self._preempted_at, np.full(grow, -math.inf)])
