"""docs/configuration.md is generated (python -m jitserve.local.docgen configuration) and up to date."""

from __future__ import annotations

from pathlib import Path

from jitserve.engine.settings import EngineSettings
from jitserve.local import docgen
from jitserve.router.settings import RouterSettings
from jitserve.settings import options

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_configuration_md_is_regenerated() -> None:
    regenerate = "python -m jitserve.local.docgen configuration > docs/configuration.md"
    assert DOC.read_text() == docgen.configuration(), f"docs/configuration.md is stale: {regenerate}"


def test_every_settings_field_is_documented_with_its_variable() -> None:
    text = docgen.configuration()
    for cls in (EngineSettings, RouterSettings):
        for opt in options(cls):
            row = next((line for line in text.splitlines() if line.startswith(f"| `{opt.flag}`")), None)
            assert row is not None, opt.flag
            assert all(f"`{env}`" in text for env in opt.env), opt.flag
    # the engine-core process's variables (internal) are listed too
    assert "JITSERVE_FRAME_STEPS" in text and "JITSERVE_MODEL_NAME" in text
