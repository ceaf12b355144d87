"""GMAX's defaults are declared once (scheduler/gmax.py `GMAXParams`); every other place reads them.

The engine (runner and `jitserve engine`) and the operator's model import them; the generated CRDs and
the chart's values schema are files, so their defaults are checked here against the same source.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from jitserve.engine import cli as engine_cli
from jitserve.engine.settings import EngineSettings, SchedulerSettings
from jitserve.operator.models import SchedulerSpec
from jitserve.scheduler.gmax import GMAXParams

ROOT = Path(__file__).resolve().parents[3]
G = GMAXParams()
# camelCase (CRD, chart) -> GMAXParams field
CAMEL = {
    "frameSteps": "frame_steps",
    "cutoff": "cutoff",
    "starvationDelta": "starvation_delta",
    "classFairness": "class_fairness",
}


def test_runner_and_operator_model_defaults_are_gmax_params() -> None:
    # the runner takes the engine process's settings as they are: with nothing set, GMAX's defaults
    runner, spec = SchedulerSettings.from_env({}), SchedulerSpec()
    for camel, field in CAMEL.items():
        assert getattr(runner, field) == getattr(G, field), field
        assert getattr(spec, camel) == getattr(G, field), camel
    assert EngineSettings.model_fields["max_num_seqs"].default == G.batch_size  # the runner's batch size


def test_engine_flag_defaults_are_gmax_params() -> None:
    parser = argparse.ArgumentParser()
    engine_cli.add_arguments(parser)
    args = parser.parse_args(["--model", "m"])
    for field in CAMEL.values():
        assert getattr(args, field) == getattr(G, field), field


def _scheduler_schema(doc: dict[str, Any]) -> dict[str, Any]:
    spec = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return spec["properties"]["scheduler"]["properties"]


@pytest.mark.parametrize(
    "path", ["crds/jitserve.dev_servingpools.yaml", "charts/crds/jitserve.dev_servingpools.yaml"]
)
def test_crd_defaults_are_gmax_params(path: str) -> None:
    props = _scheduler_schema(yaml.safe_load((ROOT / path).read_text()))
    for camel, field in CAMEL.items():
        assert props[camel]["default"] == getattr(G, field), (path, camel)


def _find_scheduler(node: Any) -> dict[str, Any] | None:
    if isinstance(node, dict):
        sched = node.get("properties", {}).get("scheduler")
        if isinstance(sched, dict) and "frameSteps" in sched.get("properties", {}):
            return sched["properties"]
        for value in node.values():
            found = _find_scheduler(value)
            if found is not None:
                return found
    elif isinstance(node, list):
        for value in node:
            found = _find_scheduler(value)
            if found is not None:
                return found
    return None


def test_chart_values_schema_defaults_are_gmax_params() -> None:
    props = _find_scheduler(json.loads((ROOT / "charts/values.schema.json").read_text()))
    assert props is not None
    for camel, field in CAMEL.items():
        assert props[camel]["default"] == getattr(G, field), camel


_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def test_engine_flags_and_pool_spec_share_bounds() -> None:
    """A pool spec the API server accepts is one the engine's flags accept (contracts/gmax_params.py)."""
    engine = SchedulerSettings.model_json_schema()["properties"]
    spec = SchedulerSpec.model_json_schema()["properties"]
    for camel, field in CAMEL.items():
        engine_bounds = {k: v for k, v in engine[field].items() if k in _BOUNDS}
        spec_bounds = {k: v for k, v in spec[camel].items() if k in _BOUNDS}
        assert engine_bounds and engine_bounds == spec_bounds, (field, engine_bounds, spec_bounds)


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--frame-steps", "10001"),
        ("--cutoff", "1.5"),
        ("--starvation-delta", "-1"),
        ("--class-fairness", "1.5"),
    ],
)
def test_engine_rejects_what_the_crd_rejects(flag: str, value: str) -> None:
    props = _scheduler_schema(yaml.safe_load((ROOT / "crds/jitserve.dev_servingpools.yaml").read_text()))
    camel = {
        "--frame-steps": "frameSteps",
        "--cutoff": "cutoff",
        "--starvation-delta": "starvationDelta",
        "--class-fairness": "classFairness",
    }[flag]
    bound = props[camel]
    number = float(value)
    assert number > bound.get("maximum", float("inf")) or number < bound.get("minimum", float("-inf"))
    parser = argparse.ArgumentParser()
    engine_cli.add_arguments(parser)
    args = parser.parse_args(["--model", "m", flag, value])
    with pytest.raises(ValueError, match=flag):
        engine_cli.settings_from(args)
