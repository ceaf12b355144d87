"""The contracts between processes (scheduler/contracts): what one side writes, the other side reads."""

from __future__ import annotations

import json

import pytest

from jitserve.scheduler.contracts.classes_configmap import (
    ClassSnapshot,
    builtin_snapshot,
    mounted_default_path,
    parse_classes,
    render_classes,
    snapshot_from_data,
    snapshot_from_text,
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
    assert snapshot_from_data(data, "cm") == ClassSnapshot(PAPER_CLASSES, "best-effort", "cm")


def test_a_classes_file_in_each_shape_gives_the_same_snapshot() -> None:
    data = render_classes(PAPER_CLASSES, "latency")
    raw = json.loads(data["classes.json"])
    shapes = [
        json.dumps(data),  # the ConfigMap's data as one file: classes.json is JSON text
        json.dumps({"classes.json": raw, "default": "latency"}),  # ... or the map itself
        json.dumps(raw),  # a bare map (names no default: here the mounted file does)
    ]
    for text in shapes:
        snap = snapshot_from_text(text, "f.json", mounted_default="latency\n", version=3)
        assert snap == ClassSnapshot(PAPER_CLASSES, "latency", "f.json", 3)
    with pytest.raises(ValueError, match=r"^f\.json: not JSON"):
        snapshot_from_text("{", "f.json")
    with pytest.raises(ValueError, match=r"^f\.json: class 'a': Value error, deadline SLO needs"):
        snapshot_from_text('{"a": {"type": "deadline"}}', "f.json")
    assert mounted_default_path("/etc/jitserve/classes/classes.json") == "/etc/jitserve/classes/default"


# Classes for the precedence table: "m" is marked `default: true`, "a", "b", "c" are not.
MARKED = {
    "a": {"type": "best-effort"},
    "b": {"type": "best-effort"},
    "c": {"type": "best-effort"},
    "m": {"type": "best-effort", "default": True},
}


@pytest.mark.parametrize(
    ("in_data", "mounted", "flag", "expected"),
    [
        ("a", "b", "c", "a"),  # the data's own default first
        (None, "b", "c", "b"),  # then the mounted `default` beside the file
        (None, " \n", "c", "c"),  # a blank mounted default names none: the flag
        (None, None, "c", "c"),  # then the flag
        ("a", None, "gold", "a"),  # a flag is not consulted (nor checked) when the data names a default
        (None, None, None, "m"),  # then the class marked default
    ],
)
def test_the_default_class_precedence(in_data: str | None, mounted: str | None, flag: str | None,
                                      expected: str) -> None:  # fmt: skip
    data = {"classes.json": json.dumps(MARKED), **({"default": in_data} if in_data else {})}
    assert snapshot_from_text(json.dumps(data), "f", flag, mounted_default=mounted).default == expected
    if mounted is None:  # the API's ConfigMap has no file beside it: the same answer without one
        assert snapshot_from_data(data, "cm", flag).default == expected


def test_no_default_at_all_and_defaults_that_name_no_class() -> None:
    unmarked = {"a": {"type": "best-effort"}}
    assert snapshot_from_text(json.dumps(unmarked), "f").default is None  # requests run best-effort
    with pytest.raises(ValueError, match="f: default class 'gold' is not among"):
        snapshot_from_text(json.dumps(unmarked), "f", "gold")  # a consulted flag must name a class
    with pytest.raises(ValueError, match="f: default class 'gold' is not among"):
        snapshot_from_text(json.dumps(unmarked), "f", "a", mounted_default="gold")
    # The built-in classes follow the same rules: the flag, else the paper's marked best-effort.
    assert builtin_snapshot() == ClassSnapshot(PAPER_CLASSES, "best-effort")
    assert builtin_snapshot("latency").default == "latency"
    with pytest.raises(ValueError, match="default class 'gold'"):
        builtin_snapshot("gold")


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
