"""Our log lines in an engine's log, where vLLM writes its own and in its format.

vLLM configures only its `vllm` logger (a handler on stdout, `VLLM_LOGGING_LEVEL`, no propagation) and
leaves the root logger bare, so in its processes a `jitserve.*` record below WARNING reached no handler
at all: the scheduler's start-up line, its drops and its length refits were never in the engine log.
`log_like_vllm` gives the `jitserve` logger vLLM's handlers and level, once per process. A deployment
that configures logging itself (a `jitserve` handler, or vLLM's logging turned off with
`VLLM_CONFIGURE_LOGGING=0`) is left as it is.
"""

from __future__ import annotations

import logging

OURS = "jitserve"
VLLMS = "vllm"


def log_like_vllm() -> bool:
    """Route `jitserve.*` records to the `vllm` logger's handlers, at its level. Returns whether it did:
    not when the `jitserve` logger has a handler already, or vLLM's has none."""
    ours = logging.getLogger(OURS)
    theirs = logging.getLogger(VLLMS)
    if ours.handlers or not theirs.handlers:
        return False
    for handler in theirs.handlers:
        ours.addHandler(handler)
    ours.setLevel(theirs.level)
    ours.propagate = False  # as vLLM's: a root handler configured later would print each line twice
    return True
