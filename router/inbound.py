"""Parsing one OpenAI request: validation, the router's own fields, and the body forwarded on.

Pure functions over bytes, dicts and header mappings, so every rule is testable without a server.
The router reads only what it needs (model, stream, max_tokens, prompt size, SLO and program fields);
everything else goes to the engine untouched, and the engine's own 4xx errors pass back as they are.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from jitserve.router.errors import RouterError, bad_request
from jitserve.scheduler.requests import shortest_reply

Kind = Literal["chat", "completion"]

# Router-only body fields (the OpenAI SDK's `extra_body`) and their headers. They are stripped before
# forwarding; the resolved SLO travels to the engine in `vllm_xargs` instead.
SLO_BODY_FIELDS: tuple[str, ...] = ("slo_class", "deadline", "target_ttft", "target_tbt", "waiting_time")
PROGRAM_BODY_FIELDS: tuple[str, ...] = ("program_id", "program_stages")
ROUTER_BODY_FIELDS: tuple[str, ...] = SLO_BODY_FIELDS + PROGRAM_BODY_FIELDS
HEADER_OF_FIELD: dict[str, str] = {
    "slo_class": "x-slo-class",
    "deadline": "x-slo-deadline",
    "target_ttft": "x-slo-target-ttft",
    "target_tbt": "x-slo-target-tbt",
    "waiting_time": "x-slo-waiting-time",
    "program_id": "x-program-id",
    "program_stages": "x-program-stages",
}
MAX_PROGRAM_ID_LEN = 256
MAX_PROGRAM_STAGES = 1000
# No tokenizer in the router: ~4 characters per token is the usual English average. The estimate
# only shapes placement (prefill time); the engine counts real tokens.
CHARS_PER_TOKEN = 4.0
PREFIX_CHARS = 512  # characters hashed for the prefix-cache locality hint
MAX_TOKENS_LIMIT = 2**31 - 1  # beyond any model's context; keeps the int64 request columns exact
# Deepest JSON nesting accepted (objects and arrays). OpenAI bodies nest a few levels (messages, content
# parts, tool schemas a dozen or two); Python's parser would raise RecursionError near 1,000.
MAX_JSON_DEPTH = 64
# Largest time an SLO field may carry: the SLO model's bound (scheduler/slo.py: PositiveSeconds, 1 day).
MAX_SLO_SECONDS = 86_400.0
SLO_TIME_FIELDS: tuple[str, ...] = ("deadline", "target_ttft", "target_tbt", "waiting_time")


@dataclass(frozen=True, slots=True)
class ReplyFloor:
    """What in the body keeps vLLM from ending the reply early (its extensions to the OpenAI API, forwarded
    untouched): `min_tokens`, and `ignore_eos` unless the request stops on its own strings or token ids.
    `shortest(max_tokens)` is the fewest tokens the reply can have (`requests.shortest_reply`)."""

    min_tokens: int = 0
    ignore_eos: bool = False
    stops: bool = False

    def shortest(self, max_tokens: int) -> int:
        return shortest_reply(max_tokens, self.min_tokens, self.ignore_eos, self.stops)


@dataclass(frozen=True, slots=True)
class Inbound:
    kind: Kind
    body: dict[str, Any]  # the client's body minus router-only fields
    model: str
    stream: bool
    max_tokens: int | None
    input_len: int  # estimated prompt tokens
    slo_fields: dict[str, Any]  # slo_class / deadline / target_ttft / target_tbt / waiting_time
    program_id: str | None
    program_stages: int | None
    prefix_key: str | None  # hash of the prompt's start, for prefix-cache locality
    reply_floor: ReplyFloor = ReplyFloor()  # what keeps the reply from ending early


def _too_deep() -> RouterError:
    return bad_request(f"request body nests JSON deeper than {MAX_JSON_DEPTH} levels", code="json_too_deep")


def json_depth_exceeds(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether `value` nests objects/arrays deeper than `limit` (iterative: no recursion to exhaust)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


def parse_json_object(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        raise bad_request("request body is empty; expected a JSON object", code="invalid_json")
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f"request body is not valid JSON: {exc}", code="invalid_json") from None
    except RecursionError:
        raise _too_deep() from None
    if not isinstance(body, dict):
        raise bad_request(
            f"request body must be a JSON object, got {type(body).__name__}", code="invalid_json"
        )
    # Fewer brackets than the limit cannot nest past it (bytes.count is C-fast); else walk the objects.
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and json_depth_exceeds(body):
        raise _too_deep()
    return body


def check_slo_times(fields: Mapping[str, Any]) -> None:
    """Each explicit SLO time is a positive finite number of seconds up to MAX_SLO_SECONDS: a 400 that
    names the field otherwise (the engine's SLO model rejects the same values; checking here keeps a
    value it would refuse from ever reaching it)."""
    for name in SLO_TIME_FIELDS:
        value = fields.get(name)
        if value is None:
            continue
        seconds = math.nan
        if not isinstance(value, bool) and isinstance(value, int | float | str):
            with contextlib.suppress(ValueError, OverflowError):
                seconds = float(value)
        _require(
            0 < seconds <= MAX_SLO_SECONDS,
            f"{name}: must be a number of seconds in (0, {MAX_SLO_SECONDS:g}], got {value!r:.60}",
            name,
            "invalid_slo",
        )


def _require(cond: bool, message: str, param: str, code: str = "invalid_value") -> None:
    if not cond:
        raise bad_request(message, param=param, code=code)


def _positive_int(body: Mapping[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    _require(
        isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_TOKENS_LIMIT,
        f"{key} must be an integer in [1, {MAX_TOKENS_LIMIT}], got {value!r}",
        key,
    )
    return int(value)


def _text_len(content: Any) -> int:
    """Characters of text in a chat message's content (string or list of parts)."""
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(
            len(p.get("text", "")) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return 0


def _prompt_tokens(prompt: Any) -> tuple[int, str]:
    """(estimated tokens, text used for the prefix key) of a completion prompt; ValueError if malformed."""
    if isinstance(prompt, str):
        return math.ceil(len(prompt) / CHARS_PER_TOKEN), prompt
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return len(prompt), ",".join(map(str, prompt[:PREFIX_CHARS]))
        if all(isinstance(p, str) for p in prompt):
            return math.ceil(sum(map(len, prompt)) / CHARS_PER_TOKEN), prompt[0]
        if all(
            isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p)
            for p in prompt
        ):
            return sum(map(len, prompt)), ",".join(map(str, prompt[0][:PREFIX_CHARS]))
    raise ValueError("prompt must be a string, a list of strings, or token ids")


def _prefix_key(text: str) -> str | None:
    if len(text) < 64:  # too short for a shared prefix to matter
        return None
    return hashlib.blake2b(text[:PREFIX_CHARS].encode("utf-8", "replace"), digest_size=8).hexdigest()


def router_fields(body: Mapping[str, Any], headers: Mapping[str, str]) -> dict[str, Any]:
    """The router's fields from body and headers; the body wins where both are given."""
    out: dict[str, Any] = {}
    for name, header in HEADER_OF_FIELD.items():
        if body.get(name) is not None:
            out[name] = body[name]
        elif header in headers:
            out[name] = headers[header].strip()
    return out


def parse_inbound(kind: Kind, body: dict[str, Any], headers: Mapping[str, str]) -> Inbound:
    """Validate what the router relies on and split router fields from the engine's body.

    `headers` must have lower-case keys (Starlette's Headers are case-insensitive already).
    """
    model = body.get("model")
    _require(
        isinstance(model, str) and model != "", "model is required and must be a non-empty string", "model"
    )
    stream = body.get("stream", False)
    _require(
        stream is None or isinstance(stream, bool), f"stream must be a boolean, got {stream!r}", "stream"
    )
    max_tokens = _positive_int(body, "max_tokens")
    if kind == "chat":
        mct = _positive_int(body, "max_completion_tokens")
        max_tokens = mct if mct is not None else max_tokens
        messages = body.get("messages")
        _require(
            isinstance(messages, list) and len(messages) > 0 and all(isinstance(m, dict) for m in messages),
            "messages is required and must be a non-empty array of message objects",
            "messages",
        )
        text = "".join(m.get("content") if isinstance(m.get("content"), str) else "" for m in messages)
        input_len = math.ceil(sum(_text_len(m.get("content")) for m in messages) / CHARS_PER_TOKEN)
        input_len += 4 * len(messages)  # chat template tokens per message, roughly
    else:
        _require("prompt" in body, "prompt is required", "prompt")
        try:
            input_len, text = _prompt_tokens(body["prompt"])
        except ValueError as exc:
            raise bad_request(str(exc), param="prompt", code="invalid_value") from None
    floor = _reply_floor(body, max_tokens)
    fields = router_fields(body, headers)
    program_id = fields.get("program_id")
    if program_id is not None:
        _require(
            isinstance(program_id, str | int)
            and not isinstance(program_id, bool)
            and 0 < len(str(program_id)) <= MAX_PROGRAM_ID_LEN,
            f"program_id must be a non-empty string of at most {MAX_PROGRAM_ID_LEN} characters",
            "program_id",
        )
        program_id = str(program_id)
    check_slo_times(fields)
    stages = fields.get("program_stages")
    if stages is not None:
        try:
            stages_ok = not isinstance(stages, bool) and float(stages) == int(float(stages))
            stages = int(float(stages)) if stages_ok else None
        except (TypeError, ValueError, OverflowError):
            stages = None
        _require(
            stages is not None and 1 <= stages <= MAX_PROGRAM_STAGES,
            f"program_stages must be an integer in [1, {MAX_PROGRAM_STAGES}], "
            f"got {fields['program_stages']!r}",
            "program_stages",
        )
    forwarded = {k: v for k, v in body.items() if k not in ROUTER_BODY_FIELDS}
    xargs = forwarded.get("vllm_xargs")
    _require(xargs is None or isinstance(xargs, dict), "vllm_xargs must be an object", "vllm_xargs")
    return Inbound(
        kind=kind,
        body=forwarded,
        model=str(model),
        stream=bool(stream),
        max_tokens=max_tokens,
        input_len=max(1, input_len),
        slo_fields={k: fields[k] for k in SLO_BODY_FIELDS if k in fields},
        program_id=program_id,
        program_stages=stages,
        prefix_key=_prefix_key(text),
        reply_floor=floor,
    )


def _reply_floor(body: Mapping[str, Any], max_tokens: int | None) -> ReplyFloor:
    """vLLM's `min_tokens` and `ignore_eos`, checked as vLLM checks them (a 400 naming the field here, not
    a 400 from the engine after placement)."""
    min_tokens = body.get("min_tokens")
    if min_tokens is None:
        min_tokens = 0
    _require(
        isinstance(min_tokens, int)
        and not isinstance(min_tokens, bool)
        and 0 <= min_tokens <= MAX_TOKENS_LIMIT,
        f"min_tokens must be an integer in [0, {MAX_TOKENS_LIMIT}], got {min_tokens!r}",
        "min_tokens",
    )
    _require(
        max_tokens is None or min_tokens <= max_tokens,
        f"min_tokens must be at most max_tokens ({max_tokens}), got {min_tokens}",
        "min_tokens",
    )
    ignore_eos = body.get("ignore_eos")
    _require(
        ignore_eos is None or isinstance(ignore_eos, bool),
        f"ignore_eos must be a boolean, got {ignore_eos!r}",
        "ignore_eos",
    )
    stops = bool(body.get("stop") or body.get("stop_token_ids"))
    return ReplyFloor(int(min_tokens), bool(ignore_eos), stops)


def body_too_large(limit: int) -> RouterError:
    return RouterError(
        413, f"request body exceeds the router's limit of {limit} bytes", param=None, code="body_too_large"
    )
