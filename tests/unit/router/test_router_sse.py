"""Reading vLLM's SSE stream by bytes (router/sse.py): finishes, drops, token events, usage."""

from __future__ import annotations

import json

from jitserve.router import sse


def event(text: str = " tok", finish: str | None = None, **extra: object) -> bytes:
    choice = {"index": 0, "text": text, "finish_reason": finish}
    return (
        b"data: " + json.dumps({"choices": [choice], **extra}, separators=(",", ":")).encode() + b"\n\n"
    )  # as vLLM


DONE = b"data: [DONE]\n\n"
DROPS = sse.DropDetector({"abort"})


def test_token_events_count_data_events_but_not_done() -> None:
    assert sse.token_events(event() + event() + DONE) == 2
    assert sse.token_events(DONE) == 0


def test_finish_and_drop_are_told_apart() -> None:
    assert sse.has_finish(event(finish="length")) and not sse.has_finish(event())
    assert DROPS.is_drop(event("", "abort")) and not DROPS.is_drop(event(finish="length"))
    assert DROPS.is_drop(b'data: {"finish_reason": "abort"}\n\n')  # either spacing vLLM may write
    assert not sse.DropDetector({"cancelled"}).is_drop(event("", "abort"))


def test_events_before_a_drop_are_kept_and_the_drop_and_done_are_not() -> None:
    chunk = event("a") + event("b") + event("", "abort", stop_reason="jitserve: waiting_time 2s") + DONE
    assert DROPS.events_before_drop(chunk) == event("a") + event("b")
    assert DROPS.events_before_drop(event("", "abort") + DONE) == b""
    assert sse.stop_reason(chunk) == "jitserve: waiting_time 2s"


def test_a_stream_that_ends_without_a_finish_is_an_unfinished_end() -> None:
    assert sse.ended_unfinished(b'data: {"delta":{"role":"assistant","content":""}}\n\n' + DONE)
    assert not sse.ended_unfinished(event(finish="stop") + DONE)
    assert not sse.ended_unfinished(event())


def test_usage_objects_come_in_order() -> None:
    chunk = event() + event("", None, usage={"prompt_tokens": 3, "completion_tokens": 7})
    assert sse.usages(chunk) == [{"prompt_tokens": 3, "completion_tokens": 7}]
    assert sse.usages(event()) == []
    assert sse.usages(b'data: {"usage":{ broken\n\n') == []


def test_only_a_read_holding_the_role_event_alone_is_role_only() -> None:
    role = b"data: {" + sse.ROLE_ONLY.join([b'"choices":[{"index":0,', b',"finish_reason":null}]}\n\n'])
    token = b'data: {"choices":[{"index":0,"delta":{"content":" tok"},"finish_reason":null}]}\n\n'
    assert sse.role_only(role)
    assert not sse.role_only(role + token)  # vLLM's first iteration, read at once: relay it as it is
    assert not sse.role_only(role + DONE)  # a drop before the first token
    assert not sse.role_only(token)
