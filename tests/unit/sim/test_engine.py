"""The engine model against hand-computed schedules."""

from __future__ import annotations

import numpy as np
import pytest

from jitserve.scheduler.policy import FCFSPolicy, make_policy
from jitserve.scheduler.requests import LATENCY, NewRequest
from jitserve.scheduler.slo import SLO
from jitserve.sim.engine import CallInfo, Engine, EngineConfig, Finished
from jitserve.sim.profiles import BatchTimeModel, load_profile


def _engine(timing: BatchTimeModel, **cfg: object) -> Engine:
    fields: dict[str, object] = {
        "batch_size": 4,
        "token_budget": 64,
        "chunked_prefill": True,
        "kv_capacity": 10_000,
    }
    fields.update(cfg)
    return Engine(
        "e",
        FCFSPolicy(batch_size=int(fields["batch_size"])),
        EngineConfig(**fields),
        timing,
        load_profile("llama-3.1-8b-a100"),
    )


def _add(e: Engine, rid: str, input_len: int, output_len: int, now: float = 0.0) -> None:
    req = NewRequest(
        rid, SLO.latency(ttft=2.0, tbt=0.1), now, input_len, max_tokens=1000, true_len=output_len
    )
    e.add(req, CallInfo(rid, output_len, payload=rid), now)


def _run(e: Engine, limit: int = 10_000) -> dict[str, Finished]:
    done: dict[str, Finished] = {}
    for _ in range(limit):
        if not e.busy:
            break
        for rec in e.step():
            done[rec.request_id] = rec
    return done


def test_chunked_prefill_then_decode_by_hand(flat_timing: BatchTimeModel) -> None:
    e = _engine(flat_timing)
    _add(e, "a", input_len=100, output_len=3)
    rec = _run(e)["a"]
    # chunk 64 (10 + 64 ms), chunk 36 (10 + 36 ms) samples token 0 at 0.120; two 10 ms decodes
    assert rec.token_times is not None
    np.testing.assert_allclose(rec.token_times, [0.120, 0.130, 0.140])
    assert rec.finish == pytest.approx(0.140)
    assert rec.output_len == 3


def test_decodes_go_first_and_prefill_gets_the_rest_of_the_budget(flat_timing: BatchTimeModel) -> None:
    e = _engine(flat_timing, token_budget=10)
    _add(e, "a", input_len=5, output_len=20)
    e.step()  # prefill of a: 5 tokens -> 15 ms, token 0
    _add(e, "b", input_len=18, output_len=1, now=e.clock)
    done = _run(e)
    # while a decodes (1 token/step), b gets 9 prefill tokens per step: 2 steps of 9 -> b done
    # at 0.015 + 2 * (0.010 + 0.009) = 0.053
    assert done["b"].finish == pytest.approx(0.053)
    times = done["a"].token_times
    assert times is not None and times.size == 20
    np.testing.assert_allclose(np.diff(times)[:2], [0.019, 0.019])


def test_vllm_v0_prefill_steps_pause_decodes(flat_timing: BatchTimeModel) -> None:
    e = _engine(flat_timing, chunked_prefill=False, token_budget=4096)
    _add(e, "a", input_len=10, output_len=5)
    e.step()  # 20 ms prefill
    e.step(t_limit=0.025)  # one 10 ms decode: the macro step ends at the first boundary past 25 ms
    assert e.clock == pytest.approx(0.030)
    _add(e, "b", input_len=100, output_len=1, now=e.clock)
    done = _run(e)
    a = done["a"].token_times
    assert a is not None and a.size == 5
    # b's whole prompt (110 ms step) ran alone: a shows a gap of at least that size
    assert np.diff(a).max() >= 0.110 - 1e-9


def test_kv_exhaustion_preempts_and_everything_still_finishes(flat_timing: BatchTimeModel) -> None:
    e = _engine(flat_timing, kv_capacity=256, block_size=16, token_budget=512)
    for i in range(3):
        _add(e, f"r{i}", input_len=40, output_len=60)
    done = _run(e)
    assert sorted(done) == ["r0", "r1", "r2"]
    assert all(r.output_len == 60 and not r.dropped for r in done.values())
    assert e.stats.kv_preemptions > 0
    assert e.kv_used == 0


def test_prompt_bigger_than_the_cache_is_rejected(flat_timing: BatchTimeModel) -> None:
    e = _engine(flat_timing, kv_capacity=64)
    _add(e, "huge", input_len=500, output_len=2)
    rec = _run(e)["huge"]
    assert rec.dropped


def test_batch_size_limits_concurrency(flat_timing: BatchTimeModel) -> None:
    e = _engine(flat_timing, batch_size=2)
    for i in range(4):
        _add(e, f"r{i}", input_len=8, output_len=10)
    e.step()
    assert e.running_count == 2 and e.waiting_count == 2
    done = _run(e)
    # FCFS: the last two start only when the first two finish
    assert done["r2"].first_token > done["r0"].finish - 1e-9


def test_router_and_client_timeouts_cancel_calls_by_hand(flat_timing: BatchTimeModel) -> None:
    e = _engine(flat_timing, batch_size=1, token_budget=100)
    _add(e, "a", input_len=10, output_len=50)  # prefill 20 ms, then 49 decodes of 10 ms: done 0.510
    # b waits behind a; the router gives up on its first token at 0.1 s
    req = NewRequest("b", SLO.latency(ttft=2.0, tbt=0.1), 0.0, 10, max_tokens=1000, true_len=5)
    e.add(req, CallInfo("b", 5, payload="b", first_token_by=0.1), 0.0)
    # c's client stops reading at 0.75 s: started at 0.51 (prefill to 0.53), 30 decodes would end at 0.82
    req = NewRequest("c", SLO.latency(ttft=2.0, tbt=0.1), 0.0, 10, max_tokens=1000, true_len=30)
    e.add(req, CallInfo("c", 30, payload="c", abort_at=0.75), 0.0)
    done = _run(e)
    assert not done["a"].dropped and done["a"].finish == pytest.approx(0.510)
    assert done["b"].dropped and done["b"].output_len == 0
    assert done["b"].finish == pytest.approx(0.1, abs=0.011)  # at the first step boundary after 0.1
    assert done["c"].dropped and done["c"].finish == pytest.approx(0.75, abs=0.011)
    assert 0 < done["c"].output_len < 30
    assert e.stats.aborts == 2
    # without timeouts nothing is cancelled
    e2 = _engine(flat_timing, batch_size=1, token_budget=100)
    _add(e2, "a", 10, 50)
    _add(e2, "b", 10, 5)
    assert not any(r.dropped for r in _run(e2).values())


def test_the_policy_is_told_each_outcome_as_the_engine_sees_it(flat_timing: BatchTimeModel) -> None:
    """The simulated engine reports outcomes through the frame driver as the real one does: a chat
    whose first token beats its TTFT is met; one whose TTFT is shorter than its own prefill is not."""
    policy = make_policy("jitserve", 4)
    config = EngineConfig(batch_size=4, token_budget=64, chunked_prefill=True, kv_capacity=10_000)
    e = Engine("e", policy, config, flat_timing, load_profile("llama-3.1-8b-a100"))
    for rid, ttft in (("on-time", 2.0), ("late", 0.01)):
        req = NewRequest(rid, SLO.latency(ttft=ttft, tbt=0.1), 0.0, 100, max_tokens=1000, true_len=3)
        e.add(req, CallInfo(rid, 3, payload=rid), 0.0)
    done = _run(e)
    assert set(done) == {"on-time", "late"}
    met, ended = policy.attainment.counts(e.clock)  # type: ignore[attr-defined]
    assert (met[LATENCY], ended[LATENCY]) == (1, 2)
