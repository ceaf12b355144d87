"""Values that break values.schema.json (or the templates' own checks) stop `helm template`/`install`
with a message naming the offending value and the rule, before anything reaches a cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from chart_helpers import CHART, RELEASE, helm

# (values, substrings the error must contain: where, and what is wrong)
BAD_VALUES: dict[str, tuple[dict[str, Any], list[str]]] = {
    "two operator replicas": ({"operator": {"replicas": 2}}, ["/operator/replicas", "maximum"]),
    "misspelt key": ({"operator": {"watchNamespace": ["a"]}}, ["/operator", "watchNamespace", "not allowed"]),
    "bad namespace name": ({"operator": {"watchNamespaces": ["Team_A"]}}, ["/operator/watchNamespaces/0"]),
    "root operator": (
        {"operator": {"podSecurityContext": {"runAsNonRoot": False}}},
        ["/operator/podSecurityContext/runAsNonRoot"],
    ),
    "privilege escalation": (
        {"operator": {"securityContext": {"allowPrivilegeEscalation": True}}},
        ["/operator/securityContext/allowPrivilegeEscalation"],
    ),
    "bad digest": ({"images": {"operator": {"digest": "sha256:abc"}}}, ["/images/operator/digest", "sha256"]),
    "registry without slash": ({"images": {"registry": "registry.example.com"}}, ["/images/registry"]),
    "bad pull policy": ({"images": {"pullPolicy": "Sometimes"}}, ["/images/pullPolicy"]),
    "bad quantity": (
        {"operator": {"resources": {"requests": {"memory": "lots"}}}},
        ["/operator/resources/requests/memory"],
    ),
    "unknown SLO type": (
        {"sloClasses": {"classes": {"latency": {"type": "fast"}}}},
        ["/sloClasses/classes/latency/type", "must be one of", "best-effort"],
    ),
    "negative TTFT": (
        {"sloClasses": {"classes": {"latency": {"ttftSeconds": -1}}}},
        ["/sloClasses/classes/latency/ttftSeconds", "exclusiveMinimum"],
    ),
    "unknown SLO field": (
        {"sloClasses": {"classes": {"latency": {"ttft": 2}}}},
        ["/sloClasses/classes/latency", "ttft", "not allowed"],
    ),
    "bad class name": ({"sloClasses": {"classes": {"Fast_Lane": {"type": "best-effort"}}}}, ["Fast_Lane"]),
    "pool without model": (
        {"pools": {"chat": {"sloClasses": {"allowed": ["latency"]}}}},
        ["/pools/chat", "model"],
    ),
    "pool with bad backend": (
        {
            "pools": {
                "chat": {
                    "model": {"name": "org/m", "servedName": "m"},
                    "engine": {"backend": "tgi"},
                    "sloClasses": {"allowed": ["latency"]},
                }
            }
        },
        ["/pools/chat/engine/backend", "must be one of", "vllm-cpu"],
    ),
    "bad scrape interval": (
        {"metrics": {"podMonitor": {"enabled": True, "interval": "often"}}},
        ["/metrics/podMonitor/interval"],
    ),
    # Checked by the templates (not expressible in JSON Schema):
    "two default classes": (
        {"sloClasses": {"classes": {"latency": {"default": True}}}},
        ["at most one class may set default: true", "best-effort, latency"],
    ),
    "latest tag": ({"images": {"router": {"tag": "latest"}}}, ["jitserve/router:latest is not a version"]),
    "no service account name": (
        {"serviceAccount": {"create": False}},
        ["serviceAccount.name is required when serviceAccount.create is false"],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_bad_values_fail_with_a_clear_message(case: str, tmp_path: Path) -> None:
    values, expected = BAD_VALUES[case]
    result = helm("template", RELEASE, str(CHART), values=values, tmp=tmp_path)
    assert result.returncode != 0, f"{case}: helm accepted {values}"
    for fragment in expected:
        assert fragment in result.stderr, f"{case}: {fragment!r} not in helm's message:\n{result.stderr}"


@pytest.mark.parametrize("case", ["two operator replicas", "negative TTFT"])
def test_install_refuses_bad_values_too(case: str, tmp_path: Path) -> None:
    values, expected = BAD_VALUES[case]
    result = helm("install", RELEASE, str(CHART), "--dry-run=client", values=values, tmp=tmp_path)
    assert result.returncode != 0
    assert expected[0] in result.stderr


def test_lint_reports_schema_violations(tmp_path: Path) -> None:
    result = helm("lint", str(CHART), values={"operator": {"replicas": 2}}, tmp=tmp_path)
    assert result.returncode != 0
    assert "/operator/replicas" in result.stdout + result.stderr
