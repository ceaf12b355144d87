"""The engine body is serialised once per request; each attempt splices in its own vllm_xargs."""

from __future__ import annotations

import json

from jitserve.router.outbound import EngineBody, forward_body


def reference(body: dict, xargs: dict) -> dict:
    """What the engine must receive: the body, with vllm_xargs = client's minus scheduling keys + ours."""
    client = body.get("vllm_xargs")
    merged = (
        {k: v for k, v in client.items() if k not in {"deadline", "tenant", "slo_class"}} if client else {}
    )
    return {**body, "vllm_xargs": {**merged, **xargs}}


def test_the_body_matches_the_reference_for_every_shape() -> None:
    bodies = [
        {},
        {"model": "m", "prompt": 'x }{ " ,', "stream": True},
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "vllm_xargs": {"mine": 1, "deadline": 0.1},
        },
        {"model": "m", "vllm_xargs": "not a dict"},
    ]
    ours = {"deadline": 2.5, "tenant": "t"}
    for body in bodies:
        expected = reference(body if isinstance(body.get("vllm_xargs", {}), dict) else
                             {k: v for k, v in body.items() if k != "vllm_xargs"}, ours)  # fmt: skip
        assert json.loads(EngineBody(body).with_xargs(ours)) == expected
        assert json.loads(forward_body(body, ours)) == expected


def test_a_client_cannot_override_scheduling_keys_and_retries_differ_only_in_xargs() -> None:
    body = EngineBody(
        {"model": "m", "prompt": "p", "vllm_xargs": {"tenant": "me", "deadline": 0.001, "x": 1}}
    )
    first = json.loads(body.with_xargs({"tenant": "t", "deadline": 3.0}))
    retry = json.loads(body.with_xargs({"tenant": "t", "deadline": 2.0}))  # later: less time left
    assert first["vllm_xargs"] == {"x": 1, "tenant": "t", "deadline": 3.0}
    assert retry["vllm_xargs"]["deadline"] == 2.0
    assert {k: v for k, v in first.items() if k != "vllm_xargs"} == {"model": "m", "prompt": "p"}
