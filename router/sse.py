"""Reading vLLM's server-sent events without parsing them: finishes, drops, token events, usage.

Pure functions of bytes (byte searches, no JSON per chunk: the relay calls these on every chunk). vLLM
writes one `data: {...}` event per engine step and ends a finished stream with a chunk whose choice has
a `finish_reason`, then `data: [DONE]`. The JITServe engine aborts only requests past their
waiting_time, so a drop is a finish reason from `--drop-finish-reason` (`abort`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

ROLE_ONLY = b'"delta":{"role":"assistant","content":""}'  # vLLM's opening chunk of a chat stream
DONE = b"data: [DONE]"
_FINISH = (b'"finish_reason":"', b'"finish_reason": "')
_STOP_REASON = re.compile(rb'"stop_reason":\s*"([^"]{0,300})"')


def has_finish(chunk: bytes) -> bool:
    """Whether a choice in `chunk` carries a finish_reason (vLLM ends every finished stream so)."""
    return _FINISH[0] in chunk or _FINISH[1] in chunk


def ended_unfinished(chunk: bytes) -> bool:
    """The stream ends ([DONE]) and no choice in `chunk` finished: vLLM's stream of a request its
    engine aborted before generating a token (it skips empty outputs, the abort's included)."""
    return DONE in chunk and not has_finish(chunk)


def role_only(chunk: bytes) -> bool:
    """Whether `chunk` is a chat stream's opening role event and nothing else. vLLM writes that event and
    the first token's in the same iteration, so they usually arrive as one read; alone, more follows."""
    return ROLE_ONLY in chunk and chunk.count(b"data: ") == 1


def token_events(chunk: bytes) -> int:
    """SSE events in `chunk` that carry output (one per engine step), [DONE] not counted."""
    return chunk.count(b"data: ") - chunk.count(DONE)


def usages(chunk: bytes) -> list[dict]:
    """The `usage` objects of the events in `chunk`, in order (vLLM sends one with the last event when
    the client asks for `stream_options.include_usage`)."""
    if b'"usage":{' not in chunk:
        return []
    out = []
    for line in chunk.split(b"\n"):
        if line.startswith(b"data: {") and b'"usage":{' in line:
            try:
                u = json.loads(line[6:]).get("usage")
            except ValueError:
                continue
            if isinstance(u, dict):
                out.append(u)
    return out


def stop_reason(chunk: bytes) -> str | None:
    """The engine's stop_reason text (the JITServe engine explains its drops there)."""
    found = _STOP_REASON.search(chunk)
    return found.group(1).decode("utf-8", "replace") if found else None


class DropDetector:
    """Which chunks carry the engine's drop, for a set of drop finish reasons (patterns built once)."""

    __slots__ = ("_patterns",)

    def __init__(self, reasons: Iterable[str]) -> None:
        self._patterns = tuple(
            p
            for r in sorted(reasons)
            for p in (f'"finish_reason":"{r}"'.encode(), f'"finish_reason": "{r}"'.encode())
        )

    def is_drop(self, chunk: bytes) -> bool:
        if not has_finish(chunk):
            return False
        return any(p in chunk for p in self._patterns)

    def events_before_drop(self, chunk: bytes) -> bytes:
        """The SSE events of `chunk` other than the drop (abort) event and [DONE]."""
        kept = [e for e in chunk.split(b"\n\n") if e.strip() and not self.is_drop(e) and b"[DONE]" not in e]
        return b"\n\n".join(kept) + b"\n\n" if kept else b""
