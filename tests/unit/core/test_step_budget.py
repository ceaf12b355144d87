"""A step no longer than the tightest running pace (docs/decisions/core.md): `paced_token_budget` and the
policy hook the simulated engine and the vLLM adapter call every step."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import deadline_request

from jitserve.scheduler.budget import MIN_PROMPT_TOKENS, paced_token_budget, prompt_chunk_cap, prompt_order
from jitserve.scheduler.gmax import EngineSpeed, GMAXParams
from jitserve.scheduler.policy import GMAXPolicy, paper_policy
from jitserve.scheduler.requests import NewRequest, RequestTable
from jitserve.scheduler.slo import SLO

# decode-only step 20 ms; 10,000 prompt tokens per second: 10 prompt tokens per extra millisecond
SPEED = EngineSpeed(step_time=0.03, prefill_tokens_per_s=10_000.0, decode_step_time=0.02)
CEILING = 2048


def _decoding(table: RequestTable, req: NewRequest, generated: int = 1) -> None:
    table.add(req)
    table.set_running(req.request_id, True)
    table.progress(req.request_id, generated=generated, computed=req.input_len + generated)


def test_no_decoding_request_leaves_the_configured_budget():
    table = RequestTable()
    assert paced_token_budget(table, 0.0, SPEED, CEILING) == CEILING
    table.add(deadline_request("waiting", deadline=5.0, ub=400))  # not running: it sets no pace
    assert paced_token_budget(table, 0.0, SPEED, CEILING) == CEILING


def test_a_deadline_request_holds_the_step_to_its_pace():
    """400 tokens left in 16 s: one every 40 ms. A decode-only step takes 20 ms, so the step may carry
    20 ms of prompt work, 200 tokens, besides the one decode."""
    table = RequestTable()
    _decoding(table, deadline_request("d", deadline=16.0, ub=401))
    assert paced_token_budget(table, 0.0, SPEED, CEILING) == 1 + 200
    # later, with less time per token left, the step shrinks; the tightest of two requests decides
    _decoding(table, deadline_request("loose", deadline=600.0, ub=100))
    assert paced_token_budget(table, 4.0, SPEED, CEILING) == 2 + 100  # 12 s for 400 tokens: 30 ms


def test_a_stream_on_its_timeline_holds_the_step_to_its_tbt():
    """TTFT 1 s, TBT 50 ms, one token out: the next is due at 1.05 s. At 1.0 s (the first token came on
    the dot) the step may last one TBT: 30 ms of prompt work. Behind its timeline (1.2 s) it keeps the TBT
    too, so it falls no further behind than before."""
    table = RequestTable()
    chat = NewRequest("c", SLO.latency(ttft=1.0, tbt=0.05), arrival=0.0, input_len=50, max_tokens=200)
    _decoding(table, chat)
    assert paced_token_budget(table, 1.0, SPEED, CEILING) == 1 + 300
    assert paced_token_budget(table, 1.2, SPEED, CEILING) == 1 + 300


def test_a_stream_ahead_of_its_timeline_may_wait_for_its_lead():
    """Its tokens are scored on the timeline arrival + TTFT + i x TBT, so a stream whose first token came
    early, or that decoded faster than its TBT, can wait until its next token is due: at 0.99 s the next
    token (due 1.05 s) leaves 60 ms, 40 ms of prompt work. With a second token out by 1.0 s, the next is
    due at 1.1 s. The tightest stream still decides."""
    table = RequestTable()
    chat = NewRequest("c", SLO.latency(ttft=1.0, tbt=0.05), arrival=0.0, input_len=50, max_tokens=200)
    _decoding(table, chat)
    assert paced_token_budget(table, 0.99, SPEED, CEILING) == 1 + 400
    table.progress("c", generated=2, computed=52)
    assert paced_token_budget(table, 1.0, SPEED, CEILING) == 1 + 800
    on_time = NewRequest("o", SLO.latency(ttft=0.5, tbt=0.05), arrival=0.5, input_len=50, max_tokens=200)
    _decoding(table, on_time)  # first token due at 1.0 s, the next at 1.05 s: 50 ms from 1.0 s
    assert paced_token_budget(table, 1.0, SPEED, CEILING) == 2 + 300


def test_paces_no_step_can_keep_and_best_effort_work_set_none():
    """A request already needing a token faster than a decode-only step is late whatever the step carries:
    holding prompts back for it would only delay everyone else. Best-effort work has no pace."""
    table = RequestTable()
    _decoding(table, deadline_request("doomed", deadline=1.0, ub=101))  # 10 ms per token
    _decoding(table, NewRequest("be", SLO.best_effort(), arrival=0.0, input_len=50, max_tokens=10))
    assert paced_token_budget(table, 0.0, SPEED, CEILING) == CEILING


def test_the_budget_stays_within_the_ceiling_and_above_the_floor():
    table = RequestTable()
    _decoding(table, deadline_request("slack", deadline=600.0, ub=101))  # 6 s per token
    assert paced_token_budget(table, 0.0, SPEED, CEILING) == CEILING
    tight = RequestTable()
    _decoding(tight, deadline_request("t", deadline=2.3, ub=101))  # 23 ms per token: 30 tokens of prompt
    assert paced_token_budget(tight, 0.0, SPEED, CEILING) == 1 + MIN_PROMPT_TOKENS


def test_an_unmeasured_decode_step_is_taken_as_v_token():
    """Before the engine has timed a step without prompt work, v_token (which includes prompt work) is
    the decode step: the step is held tighter, never looser, than measured."""
    table = RequestTable()
    _decoding(table, deadline_request("d", deadline=16.0, ub=401))  # 40 ms per token
    unmeasured = EngineSpeed(step_time=0.03, prefill_tokens_per_s=10_000.0)
    assert paced_token_budget(table, 0.0, unmeasured, CEILING) == 1 + 100
    stale = EngineSpeed(step_time=0.03, prefill_tokens_per_s=10_000.0, decode_step_time=0.035)
    assert paced_token_budget(table, 0.0, stale, CEILING) == 1 + 100
    with pytest.raises(ValueError, match="decode_step_time"):
        EngineSpeed(decode_step_time=0.0)


def test_the_oracle_paces_a_deadline_request_by_its_true_length():
    """The oracle ablation plans with true lengths (GMAX's analysis); its steps are paced by them too, so
    the ablation differs from JITServe in the lengths alone. 401 tokens by the bound, 161 in truth, in
    16 s: 40 ms per token by the bound (200 prompt tokens per step), 100 ms in truth (800)."""
    table = RequestTable()
    _decoding(table, dataclasses.replace(deadline_request("d", deadline=16.0, ub=401), true_len=161))
    assert paced_token_budget(table, 0.0, SPEED, CEILING) == 1 + 200
    assert paced_token_budget(table, 0.0, SPEED, CEILING, oracle=True) == 1 + 800
    oracle = GMAXPolicy(params=GMAXParams(batch_size=4, oracle=True))
    assert oracle.token_budget(table, 0.0, SPEED, CEILING) == 1 + 800
    # without a known true length the oracle, like its analysis, plans with the bound
    unknown = RequestTable()
    _decoding(unknown, deadline_request("d", deadline=16.0, ub=401))
    assert paced_token_budget(unknown, 0.0, SPEED, CEILING, oracle=True) == 1 + 200


def test_just_in_time_gmax_paces_steps_and_algorithm_1_alone_does_not():
    table = RequestTable()
    _decoding(table, deadline_request("d", deadline=16.0, ub=401))
    assert GMAXPolicy(params=GMAXParams(batch_size=4)).token_budget(table, 0.0, SPEED, CEILING) == 201
    assert paper_policy(GMAXParams(batch_size=4)).token_budget(table, 0.0, SPEED, CEILING) == CEILING
    # so does the step's prompt order: the engine composes steps as vLLM does for the ablation
    assert GMAXPolicy(GMAXParams(batch_size=4)).orders_prompts
    assert not paper_policy(GMAXParams(batch_size=4)).orders_prompts


def test_started_streams_prompts_go_first_then_started_prompts_in_place_then_the_queue_by_rank():
    """Rows: a started best-effort prompt (rank 5), a started stream (rank 3), a started deadline prompt
    (rank 1), a stream not started (rank 2), a deadline request not started (rank 0), a started stream
    (rank 0). Started streams by rank; other started prompts keep their (admission) order whatever their
    rank; then the waiting queue by rank, streams or not."""
    started = [True, True, True, False, False, True]
    stream = [False, True, False, True, False, True]
    rank = [5, 3, 1, 2, 0, 0]
    assert prompt_order(started, stream, rank).tolist() == [5, 1, 0, 2, 4, 3]
    assert prompt_order([], [], []).tolist() == []


def test_a_waiting_streams_prompt_caps_every_chunk():
    """200 prompt tokens a step. No stream waits: no cap. A 40-token stream waits: a started prompt may
    take 160 and leave it its whole prompt. Streams wanting more than the budget: every chunk takes the
    floor until they have started (the cap binds them too, as vLLM's one threshold does)."""
    assert prompt_chunk_cap(200, np.array([], np.int64)) is None
    assert prompt_chunk_cap(200, np.array([40])) == 160
    assert prompt_chunk_cap(200, np.array([40, 60])) == 100
    assert prompt_chunk_cap(200, np.array([300])) == MIN_PROMPT_TOKENS
