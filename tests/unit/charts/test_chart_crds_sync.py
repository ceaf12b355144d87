"""The chart's CRDs are the top-level crds/ (generated from the operator's models), byte for byte, and
the values schema's SLOClass/ServingPool definitions are derived from them (charts/sync_crds.py).

Monkeypatched, not mocked: the drift test points the real sync script's paths at a scratch copy of the
chart, so it can make the copy drift without touching the repository."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from chart_helpers import CHART, REPO


@pytest.fixture()
def sync_crds() -> Iterator[ModuleType]:
    sys.path.insert(0, str(CHART))
    try:
        import sync_crds as module
    finally:
        sys.path.remove(str(CHART))
    yield module


def test_chart_crds_are_identical_to_the_top_level_crds() -> None:
    top = {p.name: p.read_bytes() for p in (REPO / "crds").glob("*.yaml")}
    chart = {p.name: p.read_bytes() for p in (CHART / "crds").glob("*")}
    assert top, "no CRDs in crds/"
    assert chart == top, "charts/crds drifted from crds/: run `python charts/sync_crds.py`"


def test_nothing_is_stale(sync_crds: ModuleType) -> None:
    assert sync_crds.stale_files() == []


@pytest.fixture()
def scratch_chart(sync_crds: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of crds/ and the chart's derived files that the sync script is pointed at."""
    source = tmp_path / "crds"
    shutil.copytree(REPO / "crds", source)
    target = tmp_path / "chart" / "crds"
    shutil.copytree(CHART / "crds", target)
    schema = tmp_path / "chart" / "values.schema.json"
    shutil.copy(CHART / "values.schema.json", schema)
    # not a mock: the real sync script, pointed at a scratch copy so the test can make it drift
    monkeypatch.setattr(sync_crds, "REPO", tmp_path)
    monkeypatch.setattr(sync_crds, "SOURCE", source)
    monkeypatch.setattr(sync_crds, "TARGET", target)
    monkeypatch.setattr(sync_crds, "SCHEMA", schema)
    # Start in sync whatever the real chart's state (its drift is test_nothing_is_stale's business).
    sync_crds.sync()
    assert sync_crds.stale_files() == []
    return tmp_path


def test_check_catches_an_edited_crd_and_sync_repairs_it(sync_crds: ModuleType, scratch_chart: Path) -> None:
    crd = scratch_chart / "crds" / "jitserve.dev_sloclasses.yaml"
    crd.write_text(crd.read_text().replace("maximum: 86400", "maximum: 3600"))
    problems = sync_crds.stale_files()
    assert "chart/crds/jitserve.dev_sloclasses.yaml differs from what crds/ gives" in problems
    assert "chart/values.schema.json differs from what crds/ gives" in problems  # the derived $defs too
    assert sync_crds.main(["--check"]) == 1
    sync_crds.sync()
    assert sync_crds.stale_files() == []
    schema = json.loads((scratch_chart / "chart" / "values.schema.json").read_text())
    assert schema["$defs"]["SLOClassSpec"]["properties"]["ttftSeconds"]["maximum"] == 3600


def test_check_catches_a_removed_and_an_extra_crd(sync_crds: ModuleType, scratch_chart: Path) -> None:
    (scratch_chart / "chart" / "crds" / "jitserve.dev_servingpools.yaml").unlink()
    (scratch_chart / "chart" / "crds" / "old.yaml").write_text("kind: CustomResourceDefinition\n")
    problems = sync_crds.stale_files()
    assert "chart/crds/jitserve.dev_servingpools.yaml is missing" in problems
    assert "chart/crds/old.yaml has no counterpart in crds/" in problems
    sync_crds.sync()
    assert sync_crds.stale_files() == []


def test_openapi_translation() -> None:
    sys.path.insert(0, str(CHART))
    try:
        from sync_crds import openapi_to_jsonschema
    finally:
        sys.path.remove(str(CHART))
    node = {
        "type": "object",
        "properties": {
            "a": {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 1},
            "q": {"x-kubernetes-int-or-string": True},
            "n": {"type": "string", "nullable": True},
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True, "properties": {"k": {}}},
        },
        "x-kubernetes-validations": [{"rule": "self.a > 0"}],
    }
    assert openapi_to_jsonschema(node) == {
        "type": "object",
        "properties": {
            "a": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
            "q": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
            "n": {"type": ["string", "null"]},
            "free": {"type": "object", "properties": {"k": {}}},
        },
        "additionalProperties": False,
    }
