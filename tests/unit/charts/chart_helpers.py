"""Running the real helm binary on the chart (shared by the chart tests).

helm comes from `make tools` (.cache/tools/helm/helm, the npm kubectl layer; see the Makefile) or
$HELM. The tests fail, rather than skip, without it: a chart nobody renders is a chart nobody tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts"
TOOLS = REPO / ".cache" / "tools"
NAMESPACE = "jitserve-system"
RELEASE = "jitserve"
# The chart's floor (Chart.yaml kubeVersion, CEL rules GA) and the kubectl it is tested with.
KUBE_VERSIONS = ("1.29.0", "1.35.0")


def tool(name: str) -> str:
    env = os.environ.get(name.upper())
    candidates = [env] if env else []
    candidates += [str(TOOLS / name / name), shutil.which(name) or ""]
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    pytest.fail(f"{name} not found: run `make tools` (installs it into {TOOLS}) or set ${name.upper()}")


def helm(
    *args: str, values: dict[str, Any] | None = None, tmp: Path | None = None
) -> subprocess.CompletedProcess:
    """Run helm; `values` are written to a file and passed with -f (like a user's values file)."""
    argv = [tool("helm"), *args]
    if values is not None:
        assert tmp is not None
        path = tmp / f"values-{abs(hash(yaml.safe_dump(values)))}.yaml"
        path.write_text(yaml.safe_dump(values))
        argv += ["-f", str(path)]
    # HOME/XDG into a scratch dir: helm writes its cache and config there, never into the user's.
    scratch = tmp or Path(os.environ.get("TMPDIR", "/tmp"))
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(scratch / "helm-cache"),
        "HELM_CONFIG_HOME": str(scratch / "helm-config"),
        "HELM_DATA_HOME": str(scratch / "helm-data"),
    }
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)


def render(
    values: dict[str, Any] | None,
    tmp: Path,
    kube_version: str = KUBE_VERSIONS[-1],
    include_crds: bool = False,
) -> list[dict[str, Any]]:
    """`helm template` -> the rendered objects (fails the test with helm's stderr if it errors)."""
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", kube_version]
    if include_crds:
        args.append("--include-crds")
    result = helm(*args, values=values or {}, tmp=tmp)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    found = [d for d in by_kind(docs, kind) if d["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, (
        f"expected one {kind} *{name_suffix}, got {[d['metadata']['name'] for d in found]}"
    )
    return found[0]
