"""The router's classes: read by the core's rules (scheduler/contracts/classes_configmap.py), as the
engine reads them, and swapped whole at run time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jitserve.engine.classes import ClassSource
from jitserve.router.classes import ClassRegistry, snapshot_from_file
from jitserve.router.cli import build
from jitserve.router.settings import RouterSettings
from jitserve.scheduler.contracts.classes_configmap import BUILT_IN, builtin_snapshot, snapshot_from_data
from jitserve.scheduler.slo import PAPER_CLASSES

CLASSES = {
    "chat": {"type": "latency", "ttftSeconds": 1.0, "tbtSeconds": 0.2},
    "jobs": {"type": "deadline", "deadlineSeconds": 60.0},
    "bulk": {"type": "best-effort", "default": True},
}


def mounted_configmap(tmp_path: Path, default: str | None) -> Path:
    """The operator's ConfigMap as the kubelet mounts it: one file per key."""
    (tmp_path / "classes.json").write_text(json.dumps(CLASSES))
    if default is not None:
        (tmp_path / "default").write_text(default + "\n")
    return tmp_path / "classes.json"


@pytest.mark.parametrize(
    ("mounted", "flag", "expected"),
    [("jobs", "chat", "jobs"), (None, "chat", "chat"), (None, None, "bulk")],
)
def test_router_and_engine_read_a_classes_file_the_same(
    tmp_path: Path, mounted: str | None, flag: str | None, expected: str
) -> None:
    path = mounted_configmap(tmp_path, mounted)
    router = snapshot_from_file(str(path), flag)
    engine = ClassSource(str(path), flag).snapshot
    assert router.classes == engine.classes and set(router.classes) == set(CLASSES)
    assert router.default == engine.default == expected
    assert router.source == engine.source == str(path)


def test_the_registry_swaps_whole_snapshots_and_numbers_them() -> None:
    registry = ClassRegistry()
    assert registry.table == builtin_snapshot() and registry.table.source == BUILT_IN
    edited = snapshot_from_data({"classes.json": json.dumps(CLASSES), "default": "chat"}, "cm")
    registry.last_error, registry.awaiting = "an earlier bad edit", "cm"
    registry.replace(edited)
    assert (registry.table.default, registry.table.source, registry.table.version) == ("chat", "cm", 1)
    assert registry.last_error is None and registry.awaiting is None
    registry.replace(edited)
    assert registry.table.version == 2  # each swap counts, as the engine counts reloads


def test_the_cli_applies_the_same_rules(tmp_path: Path) -> None:
    path = mounted_configmap(tmp_path, None)
    _, router = build(
        RouterSettings(engines="http://127.0.0.1:9", classes_file=str(path), default_class="jobs")
    )
    assert router.classes.table.default == "jobs"
    _, router = build(RouterSettings(engines="http://127.0.0.1:9"))
    assert router.classes.table.classes == PAPER_CLASSES and router.classes.table.default == "best-effort"
    with pytest.raises(SystemExit, match="default class 'gold' is not among"):
        build(RouterSettings(engines="http://127.0.0.1:9", default_class="gold"))
    # A ConfigMap to come may define the flag's class: the router waits for it instead of exiting.
    settings = RouterSettings(
        engines="http://127.0.0.1:9", default_class="gold", classes_configmap="pool-classes"
    )
    _, router = build(settings)
    assert (router.classes.awaiting or "").endswith("/pool-classes")
