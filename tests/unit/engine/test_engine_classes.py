"""The engine's classes without a file, and a mounted ConfigMap's two files (engine/classes.py).

Reloads on change: test_engine_parts.py; the precedence itself: tests/unit/core/test_contracts.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jitserve.engine.classes import ClassSource
from jitserve.scheduler.slo import PAPER_CLASSES


def test_without_a_file_the_paper_classes_and_the_same_default_rules() -> None:
    src = ClassSource(None)
    assert src.snapshot.classes == PAPER_CLASSES and src.snapshot.default == "best-effort"  # the marked one
    assert src.poll() is False and src.snapshot.version == 0
    assert ClassSource(None, "latency").snapshot.default == "latency"
    with pytest.raises(ValueError, match="default class 'gold' is not among"):
        ClassSource(None, "gold")  # as the router refuses it: a typo must not pass unnoticed


def test_a_flag_the_file_lacks_fails_at_start_only_when_it_is_consulted(tmp_path: Path) -> None:
    path = tmp_path / "classes.json"
    path.write_text(json.dumps({"gold": {"type": "deadline", "deadlineSeconds": 9}}))
    assert ClassSource(str(path), "gold").snapshot.default == "gold"  # not a paper class: the file's
    with pytest.raises(ValueError, match=f"{path}: default class 'latency' is not among"):
        ClassSource(str(path), "latency")
    (tmp_path / "default").write_text("gold\n")  # the mounted ConfigMap names one: the flag is not asked
    assert ClassSource(str(path), "latency").snapshot.default == "gold"
