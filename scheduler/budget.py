"""How many tokens an engine step may carry: no more prompt work than the running requests' pace allows.

Just-in-time bandwidth (§4.2) applied to the step itself. A chunked-prefill engine spends each step's
token budget on the running requests' next tokens and then on prompt chunks; every prompt token makes
the step, and so every running request's next token, later. A stream needs its next token by its due
time on its timeline (arrival + TTFT + i x TBT), and no sooner than one TBT from now; a deadline request
with `left` tokens to go and `t` seconds left needs one every t / left seconds. The step may take as long
as the tightest of those paces and no longer, so its prompt work is what fits in the time between a
decode-only step and that pace (docs/decisions/core.md, "A step no longer than the tightest pace" and
"A stream's pace is its timeline"). A pace no step can keep (already shorter than a decode-only step) is
left out: that request is late whatever the step carries, and holding prompts back for it would cost
everyone waiting for one.
"""

from __future__ import annotations

import math

import numpy as np

from jitserve.scheduler.gmax import EngineSpeed
from jitserve.scheduler.requests import BEST_EFFORT, LATENCY, RequestTable

# Prompt tokens a step always may carry, whatever the pace: a prompt still advances (vLLM's smallest
# useful chunk is a KV block or a few), so new requests are never starved outright.
MIN_PROMPT_TOKENS = 64
# A pace counts only if a decode-only step is this much shorter: nearer, nothing could be prefilled.
_KEEPABLE = 1.1


def paced_token_budget(
    table: RequestTable, now: float, speed: EngineSpeed, ceiling: int, oracle: bool = False
) -> int:
    """Tokens the next step may schedule (decodes count one each), at most `ceiling` (the engine's
    configured budget). `speed` gives the decode-only step and the prefill rate the step is timed with;
    a deadline request's pace spreads its time left over the length GMAX plans it for (`oracle`: its
    true length, as the oracle ablation's analysis does)."""
    slots = table.active_slots()
    run = slots[table.running[slots] & (table.generated[slots] > 0)]  # decoding: their pace is set
    if run.size == 0:
        return ceiling
    kind = table.slo_type[run]
    left = table.planned_len(run, oracle) - table.generated[run]  # >= 1
    pace = np.where(kind == LATENCY, stream_pace(table, run, now), (table.deadline_abs[run] - now) / left)
    pace = np.where(kind == BEST_EFFORT, np.inf, pace)
    decode_step = speed.decode_step_s()
    rate = float(speed.prefill_tokens_per_s)
    keepable = pace[pace > _KEEPABLE * decode_step]
    if keepable.size == 0 or not np.isfinite(keepable.min()):
        return ceiling
    # whole tokens (the nanosecond spares a pace that is exactly a whole number of tokens from rounding)
    prompt = math.floor((float(keepable.min()) - decode_step) * rate + 1e-9)
    prompt = max(prompt, MIN_PROMPT_TOKENS)
    return int(min(run.size + prompt, ceiling))


def stream_pace(table: RequestTable, rows: np.ndarray, now: float) -> np.ndarray:
    """How long the next step may take for each decoding stream at `rows`: until its next token's due
    time on its timeline (arrival + TTFT + i x TBT, the SLO its tokens are scored by), and never less
    than one TBT. A stream that decoded faster than its TBT, or got its first token early, is ahead of
    its timeline and can wait for that lead; one behind it keeps the TBT (it catches up no slower than
    before). inf without a TBT."""
    return np.maximum(table.tbt[rows], table.token_due(rows) - now)


def prompt_order(started: np.ndarray, latency: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """The order in which prompts take what a step's budget leaves after the decodes (a permutation of
    the arguments' rows): started prompts of latency streams by `rank` (the plan's order, lower first),
    then other started prompts in the order given (vLLM's running list: admission order), then prompts
    not started by `rank` (vLLM's waiting queue). A stream's prompt is what its first token waits for;
    a deadline request's prompt has the rest of its deadline to finish in."""
    started = np.asarray(started, dtype=bool)
    latency = np.asarray(latency, dtype=bool)
    rank = np.asarray(rank, dtype=np.float64)
    by_rank = np.where(~started | latency, rank, 0.0)  # others started: a stable tie keeps their order
    return np.lexsort((by_rank, started & ~latency, ~started))


def prompt_chunk_cap(prompt_budget: int, waiting_stream_prompts: np.ndarray) -> int | None:
    """The most prompt tokens one request may take in a step (vLLM's `long_prefill_token_threshold`)
    while streams wait with prompts of `waiting_stream_prompts` tokens (one entry each, not started);
    None for no cap. Prompts already started take the budget first, so a long one would keep every new
    stream from its first token; capped, it leaves the streams their prompts, keeping MIN_PROMPT_TOKENS.
    The cap binds the streams' own chunks too (vLLM has one threshold), so streams wanting more than the
    budget leaves them advance by the floor, as does everyone, until they have started."""
    waiting = np.asarray(waiting_stream_prompts, dtype=np.int64)
    if waiting.size == 0:
        return None
    return int(max(prompt_budget - int(waiting.sum()), MIN_PROMPT_TOKENS))
