"""The just-in-time ranking against a plain reference: plan_frame must decide exactly as `_reference`.

plan_frame reuses one analysis for every margin it prices (speed: docs/benchmarks.md). The reference
below is the straightforward version: one public `analyze` of just the slots concerned per delay, no
shortcuts. An optimization that changes any decision (queue order, batch, preemptions, drops) on these
random queues fails here.
"""

from __future__ import annotations

import numpy as np
import pytest

from jitserve.scheduler.gmax import (
    EngineSpeed,
    GMAXParams,
    analyze,
    expired,
    plan_frame,
    select_group,
    stall_seconds,
)
from jitserve.scheduler.requests import BEST_EFFORT, LATENCY, NewRequest, RequestTable
from jitserve.scheduler.slo import SLO, GoodputWeights

_EPS = 1e-9
_MAX_PAIRS = 16


def _first_token_due_missed(table, speed, slots, start):
    """A stream with no token yet whose first token, served from `start`, finishes after arrival + TTFT."""
    prefill = np.maximum(table.input_len[slots] - table.computed[slots], 0) / speed.prefill_tokens_per_s
    first_token = start + prefill + speed.step_time
    due = table.arrival[slots] + table.ttft[slots]
    return (table.slo_type[slots] == LATENCY) & (table.generated[slots] == 0) & (first_token > due + _EPS)


def _margin(table, now, speed, params, slots, value_now, delay):
    late = analyze(table, now, speed, params, slots, queue_delay=delay)
    value_late = np.where(late.feasible, late.goodput, 0.0)
    dropped = (
        ~table.started[slots]
        & (table.waiting_deadline[slots] < now + delay)
        & (table.slo_type[slots] != BEST_EFFORT)
    )
    # a stream whose first token the delay makes late loses all of it (docs/decisions/core.md)
    ttft_missed = _first_token_due_missed(table, speed, slots, now + delay) & ~_first_token_due_missed(
        table, speed, slots, now
    )
    return np.maximum(value_now - np.where(dropped | ttft_missed, 0.0, value_late), 0.0)


def _by(values, pos, descending=True):
    return pos[np.argsort(-values[pos] if descending else values[pos], kind="stable")]


def _reference(table, now, speed, params, tenant_fair=None):
    """(order, batch, preempt, drop) of the jit ranking, as docs/decisions/core.md describes it."""
    slots = table.active_slots()
    drop = expired(table, now, slots)
    slots = np.setdiff1d(slots, drop, assume_unique=True)
    if slots.size == 0:
        return slots, slots, slots, drop
    an = analyze(table, now, speed, params, slots, tenant_fair)
    B, horizon = params.batch_size, params.frame_steps * speed.step_time  # noqa: N806
    value_now = np.where(an.feasible, an.goodput, 0.0)
    slo = table.slo_type[slots]
    is_be = slo == BEST_EFFORT
    unstarted, wd = ~table.started[slots], table.waiting_deadline[slots]
    maybe = (
        an.feasible
        & ~is_be
        & ((slo == LATENCY) | (an.t_rem - an.t_gen < horizon) | (unstarted & (wd < now + horizon)))
    )
    margin = np.zeros(slots.size)
    pos = np.flatnonzero(maybe)
    if pos.size:
        margin[pos] = _margin(table, now, speed, params, slots[pos], value_now[pos], horizon)
    # a compound stage with stages after it (its sub-deadline before its program's) has its whole value at
    # stake from its arrival
    program_deadline, sub_deadline = table.program_deadline[slots], table.deadline_abs[slots]
    staged = np.isfinite(program_deadline) & (program_deadline > sub_deadline) & an.feasible
    margin = np.where(staged, np.maximum(margin, value_now), margin)
    # streams with no token yet: on time for the first, they lead the B densest reserved requests in due
    # order; unstarted and already late for it, they come after all feasible SLO work (docs/decisions/core.md)
    new_stream = (slo == LATENCY) & (table.generated[slots] == 0)
    missed_now = _first_token_due_missed(table, speed, slots, now)
    new_on_time = new_stream & ~missed_now
    new_missed = new_stream & missed_now & unstarted
    urgent = an.feasible & (margin > _EPS) & ~is_be & ~new_missed
    be_due = is_be & (table.deadline_abs[slots] - now < an.t_gen + horizon)
    slack = an.feasible & ~urgent & (~is_be | be_due) & ~new_missed
    spare = an.feasible & is_be & ~be_due

    urgent_pos = np.flatnonzero(urgent)
    urgent_pos = _by(margin / np.minimum(an.t_gen, horizon), urgent_pos)
    due = table.arrival[slots] + table.ttft[slots]
    densest, rest = list(urgent_pos[:B]), list(urgent_pos[B:])
    head = sorted((p for p in densest if new_on_time[p]), key=lambda p: due[p])
    urgent_pos = np.array(head + [p for p in densest if not new_on_time[p]] + rest, dtype=np.int64)
    slack_pos = np.flatnonzero(slack)
    room = max(B - urgent_pos.size, 0)
    group = slack_pos[:0]
    if room and slack_pos.size:
        pick = select_group(an.priority[slack_pos], table.input_len[slots][slack_pos], room, params.cutoff)
        group = slack_pos[pick][:room]
    rest = np.setdiff1d(slack_pos, group)
    order_pos = np.concatenate(
        [
            urgent_pos,
            group,
            _by(an.priority, rest),
            _by(an.priority, np.flatnonzero(new_missed & an.feasible)),
            _by(an.priority, np.flatnonzero(spare)),
            _by(an.priority, np.flatnonzero(~an.feasible)),
        ]
    )

    running = table.running[slots]
    running_pos = np.flatnonzero(running)
    reserved = urgent_pos[:B]
    free = max(B - running_pos.size, 0)
    incoming = reserved[~running[reserved]]
    victims = incoming[:0]
    # streams keep their slots unless the engine swaps: otherwise only deadline-type work can yield
    swaps = params.preemption in ("swap", "auto")
    can_yield = running_pos if swaps else running_pos[slo[running_pos] != LATENCY]
    yielders = np.setdiff1d(can_yield, reserved)
    # a recompute engine preempts only while the bandwidth committed to feasible work fits the batch
    fits = swaps or an.bw[an.feasible].sum() <= B
    if params.preemption != "never" and fits and incoming.size > free and yielders.size:
        incoming = incoming[free:]
        pairs = min(incoming.size, yielders.size, _MAX_PAIRS)
        incoming = incoming[:pairs]
        wait = np.minimum(np.sort(an.t_gen[running_pos])[:pairs], horizon)
        wait = np.concatenate([wait, np.full(pairs - wait.size, horizon)])
        stake = np.sort(_margin(table, now, speed, params, slots[incoming], value_now[incoming], wait))[::-1]
        stall = stall_seconds(table, slots[yielders], speed, params.preemption)
        own = _margin(table, now, speed, params, slots[yielders], value_now[yielders], horizon + stall)
        few = np.lexsort((stall, own))[:pairs]
        yielders, stall, own = yielders[few], stall[few], own[few]
        longest = float(stall.max())
        exposed = running_pos[
            ~np.isin(running_pos, yielders) & ((margin[running_pos] > 0) | (longest > horizon))
        ]
        batch = _margin(table, now, speed, params, slots[exposed], value_now[exposed], longest).sum()
        # the stall also costs the tokens the batch would have made in it (stall x B / v, at the
        # victim's output weight); the larger of that and the running requests' margins counts
        made = stall * (B / speed.step_time) * table.w_out[slots[yielders]]
        cost = own + np.maximum(float(batch), made)
        cheapest = np.lexsort((stall, cost))
        count = 0
        while count < pairs and stake[count] > cost[cheapest][count]:
            count += 1
        victims = yielders[cheapest][:count]

    kept = np.setdiff1d(running_pos, victims)
    waiting = order_pos[~running[order_pos]]
    batch_pos = np.concatenate([kept, waiting[: max(B - kept.size, 0)]])
    return slots[order_pos], slots[batch_pos], slots[victims], drop


_SLOS = [
    SLO.latency(waiting_time=1e4),
    SLO.latency(ttft=0.5, tbt=0.05, waiting_time=3.0),
    SLO.latency(ttft=1.0, tbt=None, waiting_time=5.0),
    SLO.latency(ttft=2.0, tbt=0.02, waiting_time=20.0),  # TBT below the step time: streams fall behind
    SLO.deadline_slo(waiting_time=1e4),
    SLO.deadline_slo(deadline=5.0, waiting_time=2.0),
    SLO.deadline_slo(deadline=60.0, waiting_time=8.0, weights=GoodputWeights(input=0.0, output=2.0)),
    SLO.compound(3, waiting_time=1e4),
    SLO.compound(1, per_stage=8.0, waiting_time=4.0),
    SLO.best_effort(),
    SLO.best_effort(deadline=15.0),
]


def _random_queue(rng: np.random.Generator, n: int, batch_size: int) -> tuple[RequestTable, float]:
    table = RequestTable(capacity=8)
    now = float(rng.uniform(0, 30))
    mix = rng.dirichlet(np.full(len(_SLOS), 0.7))
    for i, kind in enumerate(rng.choice(len(_SLOS), size=n, p=mix)):
        max_tokens = int(rng.integers(1, 3000))
        arrival = float(rng.uniform(max(0.0, now - 40), now + 1))
        stage: dict[str, float] = {}
        if _SLOS[kind].type == "compound" and rng.random() < 0.5:  # a stage paced by D_s within D
            sub = arrival + float(rng.uniform(1, 20))
            stage = {"deadline_abs": sub, "program_deadline_abs": sub + float(rng.uniform(0, 40))}
        table.add(
            NewRequest(
                request_id=str(i),
                slo=_SLOS[kind],
                arrival=arrival,
                **stage,
                input_len=int(rng.lognormal(6.0, 1.2)),
                max_tokens=max_tokens,
                len_ub=int(min(max_tokens, rng.lognormal(5.0, 1.0) + 1)),
                true_len=int(rng.integers(1, max_tokens + 1)),
                program_goodput=float(rng.uniform(0, 500)) if rng.random() < 0.1 else 0.0,
            )
        )
    for rid in rng.choice(n, size=n // 6, replace=False):  # holes in the slots
        table.remove(str(rid))
    active = table.active_slots()
    size = min(active.size, int(batch_size * rng.choice([0.5, 1.0, 1.5])))
    run = rng.choice(active, size=size, replace=False)
    table.running[run] = table.started[run] = True
    table.generated[run] = rng.integers(0, 400, size=run.size)
    full = table.input_len[run] + table.generated[run]
    table.computed[run] = np.where(rng.random(run.size) < 0.7, full, full // 2)
    table.len_ub[run] = np.maximum(table.len_ub[run], table.generated[run] + 1)
    table.frames_waited[active] = rng.integers(0, 20, size=active.size)
    return table, now


@pytest.mark.parametrize("seed", range(40))
def test_jit_plan_frame_decides_as_the_reference(seed):
    rng = np.random.default_rng(seed)
    batch_size = int(rng.choice([1, 2, 4, 8, 32, 128]))
    table, now = _random_queue(rng, int(rng.choice([1, 3, 10, 40, 150, 600])), batch_size)
    step_time, prefill_rate = float(rng.choice([0.02, 0.05, 0.1])), float(rng.choice([1e3, 4e3, 1e4]))
    speed = EngineSpeed(step_time=step_time, prefill_tokens_per_s=prefill_rate)
    for preemption in ("recompute", "swap", "auto", "never"):
        params = GMAXParams(
            batch_size=batch_size,
            frame_steps=int(rng.choice([1, 10, 50])),
            starvation_delta=float(rng.choice([0.0, 8.0])),
            preemption=preemption,
            oracle=bool(rng.random() < 0.2),
        )
        plan = plan_frame(table, now, speed, params)
        order, batch, preempt, drop = _reference(table, now, speed, params)
        assert np.array_equal(plan.order, order)
        assert np.array_equal(plan.batch, batch)
        assert np.array_equal(plan.preempt, preempt)
        assert np.array_equal(plan.drop, drop)
