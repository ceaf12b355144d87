"""Power-of-K placement across replicas (JITServe §4.3) and the state each replica reports.

The request gets K dummy copies, one per sampled replica, each analyzed with that replica's speed,
expected start (its queue delay, and no earlier than the prompts its batch has yet to prefill) and
prefix-cache hit: the same `analyze` GMAX runs inside every engine. The
request goes to a replica where its replica-specific priority clears that replica's admission bar:
the one where its priority is highest when every sampled replica is scored at the slowest reported
step time and prefill rate (a pool's replicas are the same hardware, so a faster report is a lighter
load or an older measurement; start times and cache hits still tell them apart), the least loaded among
near-ties.
If no replica can still meet the SLO even with the shortest reply the request allows (one token, unless
vLLM's min_tokens or ignore_eos hold it back: `NewRequest.min_len`), there is no placement: admission
rejects it. A request that is on time with half its conservative length bound (its q0.9 bound halved:
about its median reply; never below that shortest reply) goes to any replica where it is; one on time
only with a still shorter reply goes only to a replica that is not busy (fewer than a quarter of its
batch running or waiting), and if every sampled replica that could serve it is busy, admission rejects it.
(`ShortReplyRule` keeps the alternatives measured against this rule for the ablation.)
A request below every replica's admission bar queues only where the expected queue delay is shorter
than its waiting_time; where it is not, the engine would drop it after the wait, so admission
rejects it at once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from jitserve.scheduler.gmax import Analysis, EngineSpeed, GMAXParams, analyze
from jitserve.scheduler.requests import NewRequest, RequestTable, has_later_stages

_TIE_TOLERANCE = 0.02  # priorities within 2% are a tie: the speed estimates are not that precise


class ShortReplyRule(StrEnum):
    """Where `place()` admits a request that is on time only with a reply shorter than its length bound
    (docs/decisions/core.md, "Admission"; the alternatives are kept for bench/sim.py --mechanisms)."""

    HALF_BOUND = "half-bound"  # deployed: anywhere if on time with half its bound; OCCUPANCY below that
    OCCUPANCY = "occupancy"  # only on a replica less than a quarter full (running + waiting)
    NO_QUEUE = "no-queue"  # only on a replica with a free slot and no queue delay
    ONE_TOKEN = "one-token"  # anywhere a one-token reply would be on time
    BOUND = "bound"  # nowhere: admission by the length bound alone
    # measured and not kept (docs/decisions/core.md, "The busy-replica rule, refined"):
    # OCCUPANCY, but a call carrying program goodput goes anywhere: named when that was the earlier calls'
    # alone; since a stake counts the later stages' expected too (`stage_stake`), every stage of a
    # multi-stage program carries some, its first included
    LATER_STAGES = "later-stages"


class Rejection(StrEnum):
    """Which rule turned a request away: a stable code beside `Placement.reason`'s sentence, for the router's
    `jitserve_router_rejections_total{rule}`, its 429's `X-JITServe-Rejection` header and the simulator's
    report (docs/decisions/core.md, "Why a request was rejected")."""

    NO_REPLICA = "no_replica"  # no replica is ready
    NO_TIME = "no_time"  # late everywhere, even with the shortest reply the request allows (one token)
    BUSY_SHORT_REPLY = "busy_short_reply"  # on time only with a reply under its bound; every replica busy
    QUEUE_TOO_LONG = "queue_too_long"  # below every bar; the queue outlasts how long it may wait unstarted


# The rule admission runs (router, simulator): chosen on sustained windows of the real engines and the
# simulated suite (docs/decisions/core.md, "Half-bound admission over sustained overload")
DEPLOYED_SHORT_REPLY = ShortReplyRule.HALF_BOUND

# ShortReplyRule.OCCUPANCY's share of the batch: set on the paper mix, then measured against the other
# rules on every workload of the suite (docs/decisions/core.md, "Admission")
OCCUPANCY_SHARE = 0.25


class ClassGoodput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    goodput_tokens_per_s: float = Field(0.0, ge=0, description="token goodput over the recent window")
    attainment: float = Field(1.0, ge=0, le=1, description="share of finished requests that met the SLO")
    finished: int = Field(0, ge=0, description="requests finished in the window")


class ReplicaState(BaseModel):
    """What an engine pod reports at `/jitserve/state` (and as Prometheus gauges), every frame."""

    model_config = ConfigDict(extra="ignore")

    pod: str = Field(description="pod (or local engine) name")
    model: str = Field(description="served model name")
    step_time_s: float = Field(gt=0, description="seconds per decode step: v_token")
    prefill_tokens_per_s: float = Field(gt=0, description="prompt tokens computed per second")
    batch_size: int = Field(ge=1, description="B: sequences per batch (max_num_seqs)")
    running: int = Field(ge=0)
    waiting: int = Field(ge=0)
    committed_bandwidth: float = Field(ge=0, description="sum of bw = t_gen/t_rem over queued requests")
    residual_capacity: float = Field(description="batch_size - committed_bandwidth (may be negative)")
    admission_priority: float = Field(
        ge=0, description="cutoff x B-th highest priority in the queue; 0 when a batch slot is free"
    )
    queue_delay_s: float = Field(ge=0, description="expected wait before a new request starts")
    pending_prefill_tokens: int = Field(
        0,
        ge=0,
        description="prompt tokens the requests in the batch have yet to compute: a chunked-prefill engine "
        "computes them before a newcomer's prompt",
    )
    reserved_waiting: int | None = Field(
        None,
        ge=0,
        description="just-in-time GMAX: reserved requests (they cannot wait a frame) still without a batch "
        "slot; null when the engine's policy reserves nothing",
    )
    yieldable: int | None = Field(
        None,
        ge=0,
        description="just-in-time GMAX: requests in the batch that can wait, streams aside (they yield to "
        "reserved ones)",
    )
    kv_usage: float = Field(ge=0, le=1, description="fraction of KV cache blocks in use")
    cutoff: float = Field(gt=0, le=1)
    frames: int = Field(ge=0, description="frames planned so far (liveness)")
    dropped_total: int = Field(0, ge=0, description="requests dropped past waiting_time")
    preempted_total: int = Field(0, ge=0)
    goodput: dict[str, ClassGoodput] = Field(default_factory=dict, description="per SLO class")
    updated_at: float = Field(description="unix time of this report")

    def reserved_delay_s(self) -> float:
        """When a request this replica would reserve (one that cannot wait behind the queue) starts:
        behind the reserved requests still waiting, in a slot a yieldable request gives up at once or
        the next to free after that, a slot turn apart. The whole queue delay when the report carries no
        reservation."""
        if self.reserved_waiting is None or self.yieldable is None:
            return self.queue_delay_s
        turns = self.reserved_waiting + 1 - self.yieldable
        turn = self.slot_turn_s()
        if turns <= 0 or turn is None:
            return 0.0 if turns <= 0 else self.queue_delay_s
        return min(turns * turn, self.queue_delay_s)

    def prefill_wait_s(self) -> float:
        """Seconds until the prompts already on this replica are computed: a newcomer's prefill starts
        after them (vLLM keeps started prefills in its running list, ahead of new requests)."""
        return self.pending_prefill_tokens / self.prefill_tokens_per_s

    def slot_turn_s(self) -> float | None:
        """Seconds between batch slots freeing, as this report's queue delay implies (its own mix of
        lengths): the delay spread over the requests it counts. None when the report counts no queue."""
        ahead = requests_ahead(self.running, self.waiting, self.batch_size)
        return self.queue_delay_s / ahead if ahead and self.queue_delay_s > 0 else None


def stage_slot_wait(states: Iterable[ReplicaState]) -> float:
    """How long a compound program's later stage is expected to wait for a slot once it is at stake: the
    mean reserved delay of the replicas that reserve (just-in-time engines). The mean, not the shortest:
    which replica a later stage lands on is decided when it arrives, and the stages at stake on arrival
    waited longer than the shortest report (docs/decisions/core.md, "Later stages' waits come out of the
    plan"). 0.0 when none reserves: an engine that serves in arrival order starts each stage as soon as
    it can, and its sub-deadlines need no room for a wait (`guard_late_stage`)."""
    waits = [s.reserved_delay_s() for s in states if s.reserved_waiting is not None]
    return sum(waits) / len(waits) if waits else 0.0


def requests_ahead(running: int, waiting: int, batch_size: int) -> int:
    """Requests a newcomer waits behind for a slot: those beyond the batch, plus the one whose slot it
    takes. 0 while a slot is free. `replica_load`'s queue delay is this many slot turns."""
    return max(running + waiting - batch_size + 1, 0)


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    """The queue-dependent part of a replica's report (`ReplicaState`)."""

    committed_bandwidth: float  # sum of bw over the feasible queued requests
    admission_priority: float  # cutoff x the B-th highest feasible priority; 0 while a slot is free
    queue_delay_s: float  # queued work ahead of a newcomer, spread over B slots
    pending_prefill_tokens: int  # prompt tokens the batch's (running) requests have yet to compute


def replica_load(
    table: RequestTable,
    now: float,
    speed: EngineSpeed,
    batch_size: int,
    cutoff: float,
    running: int,
    waiting: int,
) -> ReplicaLoad:
    """What a replica reports of its queue: the engine pod and the simulated replica both call this,
    so the router's placement sees the same numbers from either."""
    committed, admission, delay, pending = 0.0, 0.0, 0.0, 0
    slots = table.active_slots()
    if slots.size:
        # prompt work of the batch (vLLM's running list, prefills in admission order); a waiting request
        # is counted by the queue delay, and GMAX may start a newcomer ahead of it
        run = slots[table.running[slots]]
        pending = int(table.prefill_left(run).sum())
        an = analyze(table, now, speed, GMAXParams(batch_size=batch_size), slots)
        committed = float(an.bw[an.feasible].sum())
        if running + waiting >= batch_size:
            pri = np.sort(an.priority[an.feasible])[::-1]
            if pri.size >= batch_size:
                admission = cutoff * float(pri[batch_size - 1])
            # Queued work ahead of a newcomer, spread over B slots: its expected wait.
            delay = requests_ahead(running, waiting, batch_size) * float(an.t_gen.mean()) / batch_size
    return ReplicaLoad(committed, max(admission, 0.0), delay, pending)


@dataclass(frozen=True, slots=True)
class Placement:
    replica: int | None  # index into the replicas given; None: no replica can meet the SLO
    priorities: np.ndarray  # replica-specific priority per sampled replica (0 where infeasible)
    sampled: np.ndarray  # indices of the sampled replicas
    reason: str
    rejection: Rejection | None = None  # which rule, when `replica` is None


def place(
    request: NewRequest,
    replicas: list[ReplicaState],
    now: float,
    k: int | None = None,
    cached_tokens: list[int] | None = None,
    rng: np.random.Generator | None = None,
    params: GMAXParams = GMAXParams(),
    short_reply: ShortReplyRule = DEPLOYED_SHORT_REPLY,
) -> Placement:
    """Power-of-K over replica-specific priorities. `k=None` samples every replica (K = M)."""
    m = len(replicas)
    if m == 0:
        empty = np.zeros(0, dtype=np.int64)
        return Placement(None, np.zeros(0), empty, "no ready replica", Rejection.NO_REPLICA)
    if k is None or k >= m:
        sampled = np.arange(m)
    else:
        rng = rng or np.random.default_rng()
        sampled = np.sort(rng.choice(m, size=max(k, 1), replace=False))
    n = sampled.size
    # One pass over the sampled states: a column per field (floats; the integer counts stay exact). A
    # newcomer starts no earlier than the prompts already in the batch are prefilled (docs/decisions/core.md,
    # "Placement counts the prompts ahead"), wherever else it would start.
    step, prefill, delay, bar, occupied, batch, reserved_delay, reserves, prefill_wait = np.array(
        [
            (s.step_time_s, s.prefill_tokens_per_s, s.queue_delay_s, s.admission_priority,
             s.running + s.waiting, s.batch_size, s.reserved_delay_s(), s.reserved_waiting is not None,
             s.prefill_wait_s())
            for s in (replicas[j] for j in sampled)
        ],
        dtype=np.float64,
    ).T  # fmt: skip
    delay, reserved_delay = np.maximum(delay, prefill_wait), np.maximum(reserved_delay, prefill_wait)
    reserves = reserves.astype(bool)
    computed = None
    if cached_tokens is not None:
        cached = np.array([cached_tokens[j] for j in sampled], dtype=np.int64)
        computed = np.minimum(cached, request.input_len)
    # A pool's replicas are the same hardware: their reported step times differ by load and by
    # measurement lag, not by speed. Ranked at
    # its own report, a replica measured before a burst looks fastest and takes all of it
    # (docs/benchmarks/sim.md, "Where JITServe loses"); a prefill rate measured on a lighter load draws
    # every long prompt the same way. Feasibility keeps each replica's own speed; the ranking compares
    # them at the slowest step and prefill rate, so load and queue decide.
    # Where a sampled replica reports a reservation, it is also analyzed where a request it would reserve
    # starts (`reserved_delay`: just-in-time GMAX serves work that cannot wait ahead of work that can;
    # docs/decisions/core.md, "Admission: where a reserved request starts"). All in one `analyze`: blocks
    # of n rows, own speed at `delay` (then at `reserved_delay`), then the same again at the slowest step
    # and prefill rate when the reports differ.
    ranked_apart = bool(step.min() < step.max() or prefill.min() < prefill.max())
    any_reserves = bool(reserves.any())
    starts = [delay, reserved_delay] if any_reserves else [delay]
    k = len(starts)  # blocks per speed
    blocks = 2 * k if ranked_apart else k
    steps = np.concatenate([step] * k + [np.full(k * n, step.max())]) if ranked_apart else _repeat(step, k)
    prefills = (
        np.concatenate([prefill] * k + [np.full(k * n, prefill.min())])
        if ranked_apart
        else _repeat(prefill, k)
    )
    speed = EngineSpeed(
        step_time=steps,  # type: ignore[arg-type]
        prefill_tokens_per_s=prefills,  # type: ignore[arg-type]
    )
    delay_rows = _repeat(np.concatenate(starts) if k > 1 else delay, blocks // k)
    if computed is not None:
        computed = _repeat(computed, blocks)
    # One row holds the request; `slots` names it once per analyzed row, so `analyze` sees the paper's
    # K dummies (here at two start times) without building a table per request.
    table = _scratch_table()

    def judged(an: Analysis) -> tuple[np.ndarray, np.ndarray]:
        """Per sampled replica: reserved (late behind the queue, on time where the replica's reserved
        work starts), and feasible where it would start."""
        behind = an.feasible[:n]
        if not any_reserves:
            return np.zeros(n, dtype=bool), behind
        ahead = reserves & an.feasible[n : 2 * n] & ~behind
        return ahead, ahead | behind

    try:
        slots = np.full(blocks * n, table.add(request))
        bound = int(table.len_ub[slots[0]])
        # the shortest reply the request allows (`shortest_reply`): one token unless its body holds vLLM
        # back from stopping sooner (min_tokens, ignore_eos); no fallback below goes under it (the table
        # holds the bound at or above it)
        shortest = request.min_len
        both = analyze(table, now, speed, params, slots, queue_delay=delay_rows, computed=computed)
        ahead, an_feasible = judged(both)
        needs_short_reply = shorter_than_bound = False
        half = max(bound // 2, shortest)
        if not an_feasible.any() and short_reply is ShortReplyRule.HALF_BOUND and half < bound:
            table.len_ub[slots[0]] = half
            both = analyze(table, now, speed, params, slots, queue_delay=delay_rows, computed=computed)
            ahead, an_feasible = judged(both)
            shorter_than_bound = bool(an_feasible.any())
        if not an_feasible.any() and shortest < int(table.len_ub[slots[0]]):
            # The conservative bound sizes bandwidth; it must not reject a request that a shorter (yet
            # possible) reply would serve on time. Reject only when even its shortest reply would be late.
            table.len_ub[slots[0]] = shortest
            both = analyze(table, now, speed, params, slots, queue_delay=delay_rows, computed=computed)
            ahead, an_feasible = judged(both)
            needs_short_reply = shorter_than_bound = True
        program_deadline = float(table.program_deadline[slots[0]])
        behind_share = False
        if not an_feasible.any() and has_later_stages(request.due(), program_deadline):
            # A compound stage late for its sub-deadline even with a one-token reply. Only the program's
            # deadline is scored, and rejecting the stage loses the program's earlier stages too: if its
            # whole bound (the oracle: its true length) still fits the program's deadline, it is admitted
            # there like any on-time request (docs/decisions/core.md, "A stage late for its share is judged
            # by its program").
            table.len_ub[slots[0]] = bound
            table.deadline_abs[slots[0]] = program_deadline
            both = analyze(table, now, speed, params, slots, queue_delay=delay_rows, computed=computed)
            ahead, an_feasible = judged(both)
            behind_share = bool(an_feasible.any())
            if behind_share:  # on time with its whole bound: no shorter reply is needed
                needs_short_reply = shorter_than_bound = False
    finally:
        if request.request_id in table:  # empty again for the next call, whatever happened
            table.remove(request.request_id)
    feasible_q = both.feasible[:n]
    pri = both.priority
    an_priority = np.where(ahead, pri[n : 2 * n], pri[:n]) if any_reserves else pri[:n]
    rank = an_priority
    if ranked_apart:  # the same blocks at the slowest step start at k * n
        slow = pri[k * n :]
        rank = np.where(ahead, slow[n : 2 * n], slow[:n]) if any_reserves else slow[:n]
    priority = np.where(an_feasible, an_priority, 0.0)
    if not an_feasible.any():
        reply = "a one-token reply" if shortest <= 1 else f"the shortest reply it allows ({shortest} tokens)"
        reason = f"no replica can meet the SLO, even with {reply}"
        return Placement(None, priority, sampled, reason, Rejection.NO_TIME)
    feasible = an_feasible
    if needs_short_reply:
        # On time only with a reply shorter than the rule tried (half the bound under HALF_BOUND, the
        # whole bound under the others): take it only where it costs no one else.
        # Doomed long replies admitted onto a loaded replica hold batch slots that later arrivals would
        # have used (docs/decisions/core.md, "Admission").
        feasible = feasible & _short_reply_room(short_reply, occupied, batch, delay, request)
        if not feasible.any():
            return Placement(
                None,
                priority,
                sampled,
                "rejected: replica busy and the SLO needs a reply shorter than the length bound",
                Rejection.BUSY_SHORT_REPLY,
            )
    has_room = occupied < batch
    # a reserved request is served ahead of the bar's work: the bar cuts the fill, not the reservation
    eligible = feasible & (has_room | (priority >= bar) | ahead)
    if eligible.any():
        score = np.where(eligible, rank, -np.inf)
        reason = "admitted by replica-specific priority"
        if behind_share:
            reason = "admitted: late for its share of the program's deadline, on time for the program"
        elif shorter_than_bound:
            reason = "admitted: on time only if the reply is shorter than its length bound"
        elif not (eligible & feasible_q).any():
            reason = (
                "admitted ahead of the queue: reserved, it starts in time behind the replica's reserved work"
            )
    else:
        # Below every replica's bar it starts only behind the work queued ahead of it, which is what
        # the replica's queue delay estimates. If that outlasts how long the engine lets it wait
        # unstarted (`drop_at`), the engine would drop it after the wait anyway: answer now, with the
        # reason, instead.
        # (no request here is reserved: a reserved one is eligible, so `feasible` is behind the queue)
        patience = request.drop_at() - now
        feasible = feasible & (delay < patience)
        if not feasible.any():
            return Placement(
                None,
                priority,
                sampled,
                "rejected: below every replica's admission bar, and the queue ahead is longer than it may "
                f"wait unstarted ({patience:.3g} s)",
                Rejection.QUEUE_TOO_LONG,
            )
        # Feasible only after a wait: queue where it ranks best against the bar.
        score = np.where(feasible, priority / np.maximum(bar, 1e-12), -np.inf)
        reason = "queued: below every replica's admission bar"
    # Near-ties (replicas with the same speed and no queue give the same priority) go to the least
    # loaded replica; without this every request would pile onto the first replica until it filled.
    top = score.max()
    best = np.flatnonzero(score >= top - _TIE_TOLERANCE * abs(top))
    if best.size > 1:
        load = occupied / batch
        best = best[np.lexsort((delay[best], load[best]))]
    return Placement(int(sampled[best[0]]), priority, sampled, reason)


def _repeat(column: np.ndarray, times: int) -> np.ndarray:
    """`column` `times` over, end to end (np.tile costs more at these sizes; once is the column itself)."""
    return column if times == 1 else np.concatenate([column] * times)


def _short_reply_room(
    rule: ShortReplyRule,
    occupied: np.ndarray,
    batch: np.ndarray,
    delay: np.ndarray,
    request: NewRequest,
) -> np.ndarray:
    """Which sampled replicas may take a request that is on time only with a shorter-than-bound reply."""
    if rule is ShortReplyRule.NO_QUEUE:
        return (occupied < batch) & (delay <= 0)
    if rule is ShortReplyRule.LATER_STAGES and request.program_goodput > 0:
        return np.full(occupied.shape, True)
    if rule in (ShortReplyRule.OCCUPANCY, ShortReplyRule.LATER_STAGES, ShortReplyRule.HALF_BOUND):
        return occupied < OCCUPANCY_SHARE * batch
    return np.full(occupied.shape, rule is ShortReplyRule.ONE_TOKEN)


_scratch = threading.local()


def _scratch_table() -> RequestTable:
    """An empty one-row table, reused by every `place` call on this thread (no allocation per request)."""
    table = getattr(_scratch, "table", None)
    if table is None:
        table = _scratch.table = RequestTable(capacity=1)
    return table
