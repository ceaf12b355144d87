"""docs/configuration.md and docs/metrics.md are generated (`python -m jitserve.local.docgen
configuration|metrics`) and up to date."""

from __future__ import annotations

import importlib
from pathlib import Path

from jitserve.local import docgen
from jitserve.main import SUBCOMMANDS
from jitserve.settings import options

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_configuration_md_is_regenerated() -> None:
    regenerate = "python -m jitserve.local.docgen configuration > docs/configuration.md"
    assert DOC.read_text() == docgen.configuration(), f"docs/configuration.md is stale: {regenerate}"


def _sections(text: str) -> dict[str, str]:
    """`## jitserve <command>` heading -> the text up to the next heading."""
    parts = text.split("\n## ")
    return {p.split("\n", 1)[0]: p for p in parts[1:]}


def test_each_commands_options_are_in_its_own_section_with_their_variables() -> None:
    sections = _sections(docgen.configuration())
    documented = {name for name, _ in docgen.COMPONENTS}
    for name, (module, _) in SUBCOMMANDS.items():
        cls = getattr(importlib.import_module(module), "SETTINGS", None)
        if cls is None:
            continue
        assert name in documented, f"jitserve {name} has settings but no section"
        section = sections[f"`jitserve {name}`"]
        rows = [line for line in section.splitlines() if line.startswith("| `")]
        assert len(rows) == len(options(cls)), name  # one row per option, no other command's
        for opt, row in zip(options(cls), rows, strict=True):
            assert row.startswith("| " + ", ".join(f"`{f}`" for f in opt.flags)), (name, opt.flag)
            assert all(f"`{env}`" in row for env in opt.env), (name, opt.flag)
    # the engine-core process's variables (internal) are listed too
    text = docgen.configuration()
    assert "JITSERVE_FRAME_STEPS" in text and "JITSERVE_MODEL_NAME" in text


def test_metrics_md_is_regenerated() -> None:
    regenerate = "python -m jitserve.local.docgen metrics > docs/metrics.md"
    metrics_doc = DOC.with_name("metrics.md")
    assert metrics_doc.read_text() == docgen.metrics(), f"docs/metrics.md is stale: {regenerate}"
