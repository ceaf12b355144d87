"""Pure input guards of the router: JSON depth, SLO time bounds, what best-effort tells the engine, the
rate-limited log. (Through the running router: tests/integration/router/test_router_hardening.py.)"""

from __future__ import annotations

import json
import logging

import pytest

from jitserve.router.dispatch import least_loaded
from jitserve.router.errors import RateLimitedLog, RouterError
from jitserve.router.inbound import (
    MAX_JSON_DEPTH,
    MAX_SLO_SECONDS,
    check_slo_times,
    json_depth_exceeds,
    parse_inbound,
    parse_json_object,
)
from jitserve.scheduler.contracts.xargs import render_xargs
from jitserve.scheduler.placement import ReplicaState
from jitserve.scheduler.slo import SLO


def nested(depth: int) -> bytes:
    return b'{"a": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 1_000, 200_000])
def test_too_deep_json_is_a_400(depth: int) -> None:
    with pytest.raises(RouterError) as err:
        parse_json_object(nested(depth))
    assert err.value.status == 400 and err.value.code == "json_too_deep"


def test_depth_at_the_limit_and_many_shallow_brackets_pass() -> None:
    assert parse_json_object(nested(MAX_JSON_DEPTH))["a"]
    wide = json.dumps({"messages": [{"role": "user", "content": "[{" * 500}] * 300}).encode()
    assert len(parse_json_object(wide)["messages"]) == 300  # brackets in strings, wide lists: fine
    assert not json_depth_exceeds({"a": [[1, 2], {"b": [3]}]}, limit=4)
    assert json_depth_exceeds({"a": [[1, 2], {"b": [3]}]}, limit=3)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"deadline": MAX_SLO_SECONDS + 1}, "deadline"),
        ({"target_ttft": "1e400"}, "target_ttft"),
        ({"target_tbt": 10**400}, "target_tbt"),
        ({"waiting_time": "nan"}, "waiting_time"),
        ({"deadline": 0}, "deadline"),
        ({"deadline": [1]}, "deadline"),
        ({"deadline": False}, "deadline"),
    ],
)
def test_each_slo_time_is_bounded_and_the_400_names_it(fields: dict, param: str) -> None:
    with pytest.raises(RouterError) as err:
        check_slo_times(fields)
    assert err.value.status == 400 and err.value.param == param and err.value.code == "invalid_slo"
    with pytest.raises(RouterError) as via_headers:  # the same rule for header values
        header = {"deadline": "x-slo-deadline", "target_ttft": "x-slo-target-ttft",
                  "target_tbt": "x-slo-target-tbt", "waiting_time": "x-slo-waiting-time"}[param]  # fmt: skip
        parse_inbound("completion", {"model": "m", "prompt": "x"}, {header: str(fields[param])})
    assert via_headers.value.param == param


@pytest.mark.parametrize(
    ("extra", "param", "message"),
    [
        ({"min_tokens": -1}, "min_tokens", "min_tokens must be an integer in [0, "),
        ({"min_tokens": 2.5}, "min_tokens", "min_tokens must be an integer in [0, "),
        ({"min_tokens": True}, "min_tokens", "min_tokens must be an integer in [0, "),
        (
            {"min_tokens": 9, "max_tokens": 8},
            "min_tokens",
            "min_tokens must be at most max_tokens (8), got 9",
        ),
        ({"ignore_eos": "yes"}, "ignore_eos", "ignore_eos must be a boolean, got 'yes'"),
    ],
)
def test_vllms_reply_length_fields_are_checked_before_placement(
    extra: dict, param: str, message: str
) -> None:
    """`min_tokens` and `ignore_eos` (vLLM's extensions, forwarded to the engine) set the shortest reply
    placement judges a request by: a malformed one is a 400 naming it, as vLLM's own would be."""
    with pytest.raises(RouterError) as err:
        parse_inbound("completion", {"model": "m", "prompt": "x", **extra}, {})
    assert err.value.status == 400 and err.value.param == param and message in err.value.message


def test_the_shortest_reply_comes_from_the_body_and_is_forwarded() -> None:
    def shortest(**extra: object) -> int:
        inbound = parse_inbound("completion", {"model": "m", "prompt": "x", **extra}, {})
        assert all(inbound.body[k] == v for k, v in extra.items())  # vLLM still gets them
        return inbound.reply_floor.shortest(inbound.max_tokens or 100)

    assert shortest() == 1
    assert shortest(max_tokens=30, min_tokens=12) == 12
    assert shortest(max_tokens=30, ignore_eos=True) == 30
    assert shortest(max_tokens=30, ignore_eos=True, stop=["\n\n"]) == 1  # its own stop may end it
    assert shortest(max_tokens=30, ignore_eos=True, stop_token_ids=[7], min_tokens=4) == 4


def test_slo_times_within_bounds_pass() -> None:
    check_slo_times({"deadline": MAX_SLO_SECONDS, "target_ttft": "0.5", "waiting_time": 1})


def test_best_effort_tells_the_engine_never_to_drop_it_for_waiting() -> None:
    be = render_xargs("best-effort", SLO.best_effort(waiting_time=5.0), "t")
    assert be["waiting_time"] == MAX_SLO_SECONDS
    dl = render_xargs("deadline", SLO.deadline_slo(20.0, waiting_time=5.0), "t")
    assert dl["waiting_time"] == 5.0


def test_best_effort_goes_to_the_least_loaded_engine() -> None:
    def state(name: str, delay: float, running: int) -> ReplicaState:
        return ReplicaState(
            pod=name, model="m", step_time_s=0.05, prefill_tokens_per_s=1000.0, batch_size=8, running=running,
            waiting=0, committed_bandwidth=0.0, residual_capacity=0.0, admission_priority=0.0,
            queue_delay_s=delay, kv_usage=0.0, cutoff=0.95, frames=1, updated_at=0.0,
        )  # fmt: skip

    assert least_loaded([state("a", 30.0, 8), state("b", 4.0, 8), state("c", 4.0, 2)]) == 2


def test_the_rate_limited_log_keeps_one_line_per_interval(caplog) -> None:
    now = [0.0]
    limited = RateLimitedLog(logging.getLogger("jitserve.test"), interval_s=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="jitserve.test"):
        assert limited(logging.INFO, "bad", "bad request %d", 1)
        for i in range(100):
            assert not limited(logging.INFO, "bad", "bad request %d", i)
        assert limited(logging.INFO, "other", "another kind")  # keys are limited separately
        now[0] = 10.5
        assert limited(logging.INFO, "bad", "bad request %d", 2)
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "bad request 1",
        "another kind",
        "bad request 2 (100 similar left out of the log in the last 10s)",
    ]
