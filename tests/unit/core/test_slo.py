"""SLO model: the paper's defaults and validation that names the field it rejects."""

import pytest
from pydantic import ValidationError

from jitserve.scheduler.slo import (
    PAPER_CLASSES,
    SLO,
    SLOClassSpec,
    SLOError,
    SLOType,
    resolve_request_slo,
)


def test_paper_defaults():
    lat = SLO.latency()
    assert (lat.ttft, lat.tbt, lat.waiting_time) == (2.0, 0.1, 5.0)
    assert SLO.deadline_slo().deadline == 20.0
    assert SLO.compound(stages=3).deadline == 60.0
    assert SLO.best_effort().deadline > 0


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"type": "latency", "ttft": -1.0}, "ttft"),
        ({"type": "latency", "ttft": 0.0}, "ttft"),
        ({"type": "latency", "tbt": 0.1}, "needs ttft"),
        ({"type": "deadline"}, "needs deadline"),
        ({"type": "deadline", "deadline": 5.0, "tbt": 0.1}, "tbt needs ttft"),
        ({"type": "warp-speed", "deadline": 1.0}, "type"),
        ({"type": "deadline", "deadline": 5.0, "waiting_time": -2}, "waiting_time"),
        ({"type": "deadline", "deadline": 5.0, "colour": "red"}, "colour"),
    ],
)
def test_nonsense_is_rejected_naming_the_field(fields, needle):
    with pytest.raises(ValidationError) as err:
        SLO(**fields)
    assert needle in str(err.value)


def test_class_spec_rules():
    with pytest.raises(ValidationError, match="perStage applies to compound"):
        SLOClassSpec(type=SLOType.DEADLINE, deadlineSeconds=3, perStage=True)
    with pytest.raises(ValidationError, match="needs deadline"):
        SLOClassSpec(type=SLOType.DEADLINE)
    with pytest.raises(ValidationError, match="lengthQuantile"):
        SLOClassSpec(type=SLOType.DEADLINE, deadlineSeconds=3, lengthQuantile=1.5)
    compound = PAPER_CLASSES["compound"]
    assert compound.to_slo(stages=4).deadline == 80.0
    with pytest.raises(ValidationError, match="fairnessWeight"):
        SLOClassSpec(type=SLOType.DEADLINE, deadlineSeconds=3, fairnessWeight=1.5)


def test_a_class_fairness_weight_reaches_each_request_slo():
    """`fairnessWeight` is the f GMAX mixes each request's tenant attainment in with (scheduler/gmax.py)."""
    gold = SLOClassSpec(type=SLOType.DEADLINE, deadlineSeconds=3, fairnessWeight=0.4)
    assert gold.to_slo().fairness == 0.4
    _, slo = resolve_request_slo({"slo_class": "gold"}, {"gold": gold}, None)
    assert slo.fairness == 0.4
    assert PAPER_CLASSES["latency"].to_slo().fairness == 0.0


def test_resolve_by_class_explicit_and_default():
    classes = dict(PAPER_CLASSES)
    name, slo = resolve_request_slo({"slo_class": "latency"}, classes, "best-effort")
    assert name == "latency" and slo.type is SLOType.LATENCY
    name, slo = resolve_request_slo({"deadline": 3}, classes, "best-effort")
    assert (name, slo.type, slo.deadline) == ("custom", SLOType.DEADLINE, 3.0)
    name, slo = resolve_request_slo({"target_ttft": "0.5", "target_tbt": 0.05}, classes, None)
    assert (slo.ttft, slo.tbt) == (0.5, 0.05)
    name, slo = resolve_request_slo({}, classes, "deadline")
    assert name == "deadline"
    # explicit fields override the class
    _, slo = resolve_request_slo({"slo_class": "deadline", "deadline": 7, "waiting_time": 1}, classes, None)
    assert (slo.deadline, slo.waiting_time) == (7.0, 1.0)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"slo_class": "gold"}, "slo_class"),
        ({"deadline": -1}, "deadline"),
        ({"deadline": "soon"}, "deadline"),
        ({"target_tbt": 0.1}, "target_tbt"),
        ({"waiting_time": 0}, "waiting_time"),
        ({"deadline": True}, "deadline"),
        ({"deadline": float("inf")}, "deadline"),
        ({"deadline": 3, "target_ttft": 1}, "deadline"),
    ],
)
def test_resolve_errors_name_the_field(fields, field):
    with pytest.raises(SLOError) as err:
        resolve_request_slo(fields, dict(PAPER_CLASSES), "best-effort")
    assert err.value.field == field
    assert field in str(err.value)
