"""The contracts between processes (scheduler/contracts): what one side writes, the other side reads."""

from __future__ import annotations

import json

import pytest

from jitserve.scheduler.contracts.classes_configmap import (
    parse_classes,
    parse_classes_document,
    render_classes,
)
from jitserve.scheduler.contracts.xargs import XARGS_KEYS, parse_xargs, render_xargs
from jitserve.scheduler.slo import PAPER_CLASSES, SLO, SLOType


def test_classes_round_trip_and_stable_bytes() -> None:
    data = render_classes(PAPER_CLASSES, "best-effort")
    assert set(data) == {"classes.json", "default"}
    classes, default = parse_classes(data, "cm")
    assert classes == PAPER_CLASSES and default == "best-effort"
    assert render_classes(dict(reversed(list(PAPER_CLASSES.items()))), "best-effort") == data
    raw = json.loads(data["classes.json"])
    assert raw["latency"]["ttftSeconds"] == 2.0 and raw["latency"]["type"] == "latency"  # camelCase specs
    # A file of the data's shape may hold the map itself; a bare map names no default.
    assert parse_classes_document({"classes.json": raw}, "f") == (PAPER_CLASSES, None)
    assert parse_classes_document(raw, "f") == (PAPER_CLASSES, None)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"default": "a"}, "missing key 'classes.json'"),
        ({"classes.json": "{", "default": "a"}, "classes.json is not JSON"),
        ({"classes.json": "{}", "default": "a"}, "non-empty object"),
        ({"classes.json": '{"a": {"type": "deadline"}}', "default": "a"}, "class 'a'"),
        ({"classes.json": '{"a": {"type": "best-effort"}}', "default": "b"}, "default class 'b'"),
    ],
)
def test_malformed_classes_are_rejected_naming_the_problem(data: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_classes(data, "cm")


def test_xargs_the_router_renders_are_what_the_engine_parses() -> None:
    slo = SLO.deadline_slo(20.0, waiting_time=5.0)
    x = render_xargs("deadline", slo, "t", program_id="p", stage_deadline_rel=4.0, length_bound=64)
    assert set(x) <= set(XARGS_KEYS)
    info = parse_xargs(x, PAPER_CLASSES, "best-effort", arrival=100.0)
    assert info.error is None and info.slo_class == "deadline" and info.slo.type is SLOType.DEADLINE
    assert info.slo.deadline == 20.0 and info.deadline_abs == 104.0
    assert (info.program_id, info.tenant, info.length_bound) == ("p", "t", 64)
