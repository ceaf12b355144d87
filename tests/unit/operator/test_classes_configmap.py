"""The ConfigMap format shared with the router: render, then parse, round-trips."""

from __future__ import annotations

import json

import pytest

from jitserve.operator.classes_configmap import parse, render_data
from jitserve.scheduler.slo import PAPER_CLASSES


def test_round_trip_and_stable_bytes() -> None:
    data = render_data(PAPER_CLASSES, "best-effort")
    assert set(data) == {"classes.json", "default"}
    classes, default = parse(data)
    assert classes == PAPER_CLASSES and default == "best-effort"
    assert render_data(dict(reversed(list(PAPER_CLASSES.items()))), "best-effort") == data
    raw = json.loads(data["classes.json"])
    assert raw["latency"]["ttftSeconds"] == 2.0 and raw["latency"]["type"] == "latency"  # camelCase specs


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"default": "a"}, "malformed"),
        ({"classes.json": "{", "default": "a"}, "malformed"),
        ({"classes.json": "{}", "default": "a"}, "not among its classes"),
    ],
)
def test_malformed_data_is_rejected(data: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse(data)
