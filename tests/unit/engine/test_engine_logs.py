"""`log_like_vllm`: our records reach vLLM's handlers in its processes, and a deployment's own logging
configuration is left alone. Real `logging` objects throughout; each test restores the two loggers."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from jitserve.engine.logs import OURS, VLLMS, log_like_vllm


@pytest.fixture
def loggers() -> Iterator[tuple[logging.Logger, logging.Logger]]:
    ours, theirs = logging.getLogger(OURS), logging.getLogger(VLLMS)
    saved = [(lg, list(lg.handlers), lg.level, lg.propagate) for lg in (ours, theirs)]
    for lg in (ours, theirs):
        lg.handlers.clear()
    yield ours, theirs
    for lg, handlers, level, propagate in saved:
        lg.handlers[:] = handlers
        lg.setLevel(level)
        lg.propagate = propagate


def vllm_like_handler(theirs: logging.Logger, level: int) -> io.StringIO:
    """What vLLM's DEFAULT_LOGGING_CONFIG sets up: one stream handler, the logger's level, no propagation."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s [%(name)s] %(message)s"))
    theirs.addHandler(handler)
    theirs.setLevel(level)
    theirs.propagate = False
    return out


def test_an_info_line_of_ours_is_written_where_vllm_writes_its_own(loggers) -> None:
    ours, theirs = loggers
    out = vllm_like_handler(theirs, logging.INFO)
    logging.getLogger("jitserve.engine").info("before")  # the bare default: below WARNING, lost
    assert out.getvalue() == ""
    assert log_like_vllm() is True
    logging.getLogger("jitserve.engine").info("jitserve: dropped %d request(s)", 2)
    logging.getLogger("jitserve.analyzer").debug("not at vLLM's level")
    assert out.getvalue() == "INFO [jitserve.engine] jitserve: dropped 2 request(s)\n"
    assert log_like_vllm() is False  # once per process: a second call adds no second handler
    logging.getLogger("jitserve.engine").warning("once")
    assert out.getvalue().count("once") == 1


def test_vllms_level_is_ours(loggers) -> None:
    ours, theirs = loggers
    out = vllm_like_handler(theirs, logging.DEBUG)
    log_like_vllm()
    logging.getLogger("jitserve.analyzer").debug("refit")
    assert "DEBUG [jitserve.analyzer] refit" in out.getvalue()


def test_a_deployments_own_configuration_is_left_as_it_is(loggers) -> None:
    ours, theirs = loggers
    out = vllm_like_handler(theirs, logging.INFO)
    own = io.StringIO()
    ours.addHandler(logging.StreamHandler(own))
    assert log_like_vllm() is False
    logging.getLogger("jitserve.engine").warning("mine")
    assert own.getvalue() == "mine\n" and out.getvalue() == ""


def test_with_vllms_logging_turned_off_nothing_is_added(loggers) -> None:
    ours, _ = loggers  # VLLM_CONFIGURE_LOGGING=0: vLLM's logger has no handler
    assert log_like_vllm() is False
    assert ours.handlers == [] and ours.propagate is True
