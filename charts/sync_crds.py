"""Keep the chart in step with the top-level CRDs (`crds/`, generated from the operator's models).

Two things are derived from them:
- `charts/crds/*.yaml`: byte-for-byte copies (Helm installs a chart's `crds/` before its templates;
  a copy rather than a symlink because `helm package` and some Git clients do not keep symlinks
  pointing outside the chart);
- `$defs.SLOClassSpec` and `$defs.ServingPoolSpec` in `values.schema.json`: the CRDs' spec schemas
  translated from OpenAPI v3 (Kubernetes' dialect) to JSON Schema, so `sloClasses.classes` and `pools`
  values are checked by `helm install` itself, before anything reaches the API server.

    python charts/sync_crds.py          # rewrite the derived files
    python charts/sync_crds.py --check  # exit 1 and name each stale file (tests/unit/charts runs this)
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parent
REPO = CHART.parent
SOURCE = REPO / "crds"
TARGET = CHART / "crds"
SCHEMA = CHART / "values.schema.json"

# values.schema.json $defs name -> CRD kind whose spec schema it holds.
SPEC_DEFS = {"SLOClassSpec": "SLOClass", "ServingPoolSpec": "ServingPool"}


def openapi_to_jsonschema(node: Any) -> Any:
    """Kubernetes' OpenAPI v3 structural schema -> JSON Schema (draft 2020-12) for Helm's validator.

    Only three constructs differ in meaning: OpenAPI 3.0's boolean exclusiveMinimum/Maximum (JSON
    Schema wants the bound itself), `nullable`, and `x-kubernetes-int-or-string` (no `type` in
    OpenAPI). Other x-kubernetes-* keys (CEL rules, list types) are dropped: a JSON Schema validator
    would ignore them anyway, and CEL is checked by the API server.
    """
    if isinstance(node, list):
        return [openapi_to_jsonschema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key in ("exclusiveMinimum", "exclusiveMaximum", "nullable"):
            continue
        if key in ("properties", "patternProperties"):
            out[key] = {name: openapi_to_jsonschema(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not") and isinstance(value, dict):
            out[key] = openapi_to_jsonschema(value)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [openapi_to_jsonschema(sub) for sub in value]
        else:
            out[key] = copy.deepcopy(value)
    for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if node.get(exclusive) is True and bound in out:
            out[exclusive] = out.pop(bound)
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if (
        "properties" in node
        and "additionalProperties" not in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        # kubectl's strict field validation (the default since Kubernetes 1.27) refuses unknown
        # fields; refuse them in values too, where a typo would otherwise vanish silently.
        out["additionalProperties"] = False
    return out


def _crds() -> dict[str, dict[str, Any]]:
    """Kind -> CRD document, from the top-level crds/."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(SOURCE.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                found[doc["spec"]["names"]["kind"]] = doc
    return found


def _spec_schema(crd: dict[str, Any]) -> dict[str, Any]:
    versions = crd["spec"]["versions"]
    # The storage version is the one users write; the chart renders objects of that version.
    version = next(v for v in versions if v.get("storage"))
    return openapi_to_jsonschema(version["schema"]["openAPIV3Schema"]["properties"]["spec"])


def expected_files() -> dict[Path, str]:
    """Every derived file and the text it should have."""
    files: dict[Path, str] = {TARGET / p.name: p.read_text() for p in sorted(SOURCE.glob("*.yaml"))}
    schema = json.loads(SCHEMA.read_text())
    crds = _crds()
    for name, kind in SPEC_DEFS.items():
        if kind not in crds:
            raise SystemExit(f"{SOURCE} has no CRD of kind {kind}: regenerate it (jitserve crds)")
        schema["$defs"][name] = _spec_schema(crds[kind])
    files[SCHEMA] = json.dumps(schema, indent=2) + "\n"
    return files


def stale_files() -> list[str]:
    """Human-readable problems: derived files that differ from what the CRDs give, or extra copies."""
    problems = []
    expected = expected_files()
    for path, text in expected.items():
        if not path.exists():
            problems.append(f"{path.relative_to(REPO)} is missing")
        elif path.read_text() != text:
            problems.append(f"{path.relative_to(REPO)} differs from what {SOURCE.name}/ gives")
    for path in sorted(TARGET.glob("*")):
        if path not in expected:
            problems.append(f"{path.relative_to(REPO)} has no counterpart in {SOURCE.name}/")
    return problems


def sync() -> None:
    expected = expected_files()
    TARGET.mkdir(exist_ok=True)
    for path in TARGET.glob("*"):
        if path not in expected:
            path.unlink()
    for path, text in expected.items():
        if not path.exists() or path.read_text() != text:
            path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale files (exit 1 if any)")
    args = parser.parse_args(argv)
    if args.check:
        problems = stale_files()
        for problem in problems:
            print(problem, file=sys.stderr)
        if problems:
            print("run: python charts/sync_crds.py", file=sys.stderr)
        return 1 if problems else 0
    sync()
    return 0


if __name__ == "__main__":
    sys.exit(main())
