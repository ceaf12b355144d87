"""docs/configuration.md and docs/metrics.md are generated from the code; the generator must see it all."""

from __future__ import annotations

from jitserve.local import docgen, up
from jitserve.settings import options


def test_configuration_lists_every_component_and_every_up_flag() -> None:
    text = docgen.configuration()
    for name, _ in docgen.COMPONENTS:
        assert f"## `jitserve {name}`" in text
    recorded = options(up.SETTINGS)
    assert recorded
    for option in recorded:
        for flag in option.flag.split(", "):
            assert f"`{flag}`" in text, flag


def test_metrics_lists_router_and_engine_families_with_labels() -> None:
    text = docgen.metrics()
    # A counter is documented under its exposed name (with _total), with its labels.
    assert "| `jitserve_router_goodput_tokens_total` | counter | slo_class |" in text
    assert "| `jitserve_engine_goodput_tokens_total` | counter | slo_class |" in text
    assert "| `jitserve_engine_up` | gauge |" in text
