"""Generate the CRD YAML of SLOClass and ServingPool from the pydantic models.

`jitserve crds` prints them; `jitserve crds --output-dir crds/` writes them; `--check` exits 1 when
the files differ from what the models generate (tests run the same check, so the YAML cannot drift).

Pydantic emits JSON Schema 2020-12; Kubernetes wants a *structural* OpenAPI v3.0 schema. The
conversion inlines $refs, turns `X | None` into an optional X, maps exclusive bounds to the v3.0
form, drops `additionalProperties: false` (Kubernetes prunes unknown fields instead) and adds the
CEL rules, printer columns, short names and subresources that a model cannot express.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from jitserve.operator import api
from jitserve.operator import validation as v
from jitserve.operator.models import ServingPoolSpec, ServingPoolStatus, SLOClassStatus
from jitserve.scheduler.slo import SLOClassSpec

HEADER = "# Generated from the pydantic models by `jitserve crds --output-dir crds/`. Do not edit.\n"

# CEL rules, keyed by the path of the schema node they sit on. Each mirrors a pydantic validator
# (scheduler/slo.py, operator/models.py); written so that absent optional fields never error. `reason`
# (the field error type kubectl prints: Required value, Forbidden, Invalid value) and `fieldPath`
# (relative to the rule's node) point the user at the field to fix.
REQUIRED, FORBIDDEN, INVALID = "FieldValueRequired", "FieldValueForbidden", "FieldValueInvalid"

SLOCLASS_RULES: dict[tuple[str, ...], list[dict[str, str]]] = {
    ("spec",): [
        {
            "rule": "self.type != 'latency' || has(self.ttftSeconds)",
            "message": "a latency class needs ttftSeconds",
            "reason": REQUIRED,
            "fieldPath": ".ttftSeconds",
        },
        {
            "rule": "!has(self.tbtSeconds) || has(self.ttftSeconds)",
            "message": "tbtSeconds needs ttftSeconds: a token timeline starts at the first token",
            "reason": REQUIRED,
            "fieldPath": ".ttftSeconds",
        },
        {
            "rule": "self.type == 'latency' || (!has(self.ttftSeconds) && !has(self.tbtSeconds))",
            "message": "ttftSeconds and tbtSeconds apply to latency classes only",
            "reason": INVALID,
            "fieldPath": ".type",
        },
        {
            "rule": "self.type != 'latency' || !has(self.deadlineSeconds)",
            "message": "deadlineSeconds is not used by a latency class; use type deadline",
            "reason": FORBIDDEN,
            "fieldPath": ".deadlineSeconds",
        },
        {
            "rule": "!(self.type in ['deadline', 'compound']) || has(self.deadlineSeconds)",
            "message": "deadline and compound classes need deadlineSeconds",
            "reason": REQUIRED,
            "fieldPath": ".deadlineSeconds",
        },
        {
            "rule": "!has(self.perStage) || !self.perStage || self.type == 'compound'",
            "message": "perStage applies to compound classes only",
            "reason": FORBIDDEN,
            "fieldPath": ".perStage",
        },
    ],
}

SERVINGPOOL_RULES: dict[tuple[str, ...], list[dict[str, str]]] = {
    (): [
        # No fieldPath on these two: metadata has no properties in a CRD schema to point into.
        {
            "rule": f"self.metadata.name.size() <= {api.MAX_POOL_NAME}",
            "message": f"a ServingPool name has at most {api.MAX_POOL_NAME} characters "
            "(its children's names add a suffix)",
            "reason": INVALID,
        },
        {
            "rule": f"self.metadata.name.matches('{v.DNS1035_LABEL}')",
            "message": "a ServingPool name must be a DNS-1035 label (lower-case letters, digits and '-', "
            "starting with a letter): its Services are named after it",
            "reason": INVALID,
        },
    ],
    ("spec",): [
        {
            "rule": "!has(self.engine) || !has(self.engine.backend) || self.engine.backend != 'vllm-cpu'"
            " || !has(self.resources) || !has(self.resources.gpus) || self.resources.gpus == 0",
            "message": "engine.backend vllm-cpu takes no GPUs: unset resources.gpus or set it to 0",
            "reason": FORBIDDEN,
            "fieldPath": ".resources.gpus",
        },
    ],
    ("spec", "model"): [
        {
            "rule": "(has(self.source) && self.source != 'huggingface') || has(self.name)",
            "message": "model.source huggingface needs model.name (the model id)",
            "reason": REQUIRED,
            "fieldPath": ".name",
        },
        {
            "rule": "!has(self.source) || self.source != 'pvc' || has(self.pvc)",
            "message": "model.source pvc needs model.pvc.claimName",
            "reason": REQUIRED,
            "fieldPath": ".pvc",
        },
        {
            "rule": "!has(self.source) || self.source != 'uri' || has(self.uri)",
            "message": "model.source uri needs model.uri",
            "reason": REQUIRED,
            "fieldPath": ".uri",
        },
    ],
    ("spec", "tolerations", "[]"): [
        {
            "rule": "!has(self.operator) || self.operator != 'Exists' || !has(self.value)"
            " || self.value == ''",
            "message": "a toleration with operator Exists takes no value",
            "reason": FORBIDDEN,
            "fieldPath": ".value",
        },
        {
            "rule": "(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')",
            "message": "a toleration without a key needs operator Exists",
            "reason": INVALID,
            "fieldPath": ".operator",
        },
        {
            "rule": "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            "message": "tolerationSeconds needs effect NoExecute",
            "reason": INVALID,
            "fieldPath": ".effect",
        },
    ],
    ("spec", "sloClasses"): [
        {
            "rule": "!has(self.default) || self.default in self.allowed",
            "message": "sloClasses.default must be one of sloClasses.allowed",
            "reason": INVALID,
            "fieldPath": ".default",
        },
    ],
}

# Lists whose items are unique (Kubernetes checks `set`) or keyed (`map`, for conditions).
LIST_TYPES: dict[tuple[str, ...], dict[str, Any]] = {
    ("spec", "sloClasses", "allowed"): {"x-kubernetes-list-type": "set"},
    ("status", "conditions"): {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    ("status", "classes"): {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
}

_DROP = {"title", "additionalProperties", "$defs"}


def _openapi(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """One JSON-Schema node -> structural OpenAPI v3.0 (recursive)."""
    node = copy.deepcopy(node)
    if "$ref" in node:
        target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
        merged = {**target, **node}  # the field's own description wins over the model's docstring
        return _openapi(merged, defs)
    if "allOf" in node and len(node["allOf"]) == 1:
        inner = node.pop("allOf")[0]
        return _openapi({**inner, **node}, defs)
    if "anyOf" in node:
        branches = [b for b in node.pop("anyOf") if b.get("type") != "null"]
        if node.get("x-kubernetes-int-or-string"):
            node.pop("default", None)
            out = {"x-kubernetes-int-or-string": True}
            # A pattern and length bind strings only, a minimum integers only (as in Kubernetes'
            # own int-or-string quantities).
            for key in ("description", "pattern", "maxLength", "minimum"):
                if key in node:
                    out[key] = node[key]
            return out
        if len(branches) == 1:
            if node.get("default", "absent") is None:
                node.pop("default")
            return _openapi({**branches[0], **node}, defs)
        raise ValueError(f"cannot express a union in a structural schema: {branches}")
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            if key == "additionalProperties" and isinstance(value, dict):
                out["additionalProperties"] = _openapi(value, defs)
            continue
        if key == "properties":
            out["properties"] = {k: _openapi(v, defs) for k, v in value.items()}
        elif key == "items":
            out["items"] = _openapi(value, defs)
        elif key == "exclusiveMinimum":
            out["minimum"], out["exclusiveMinimum"] = value, True
        elif key == "exclusiveMaximum":
            out["maximum"], out["exclusiveMaximum"] = value, True
        elif key == "const":
            out["enum"] = [value]
        elif key == "default" and value is None:
            continue
        else:
            out[key] = value
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    # Readable YAML: type and description first, then the rest in the model's order.
    head = {k: out.pop(k) for k in ("type", "description") if k in out}
    return {**head, **out}


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(mode="validation")
    return _openapi(raw, raw.get("$defs", {}))


def _node(schema: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    for part in path:
        schema = schema["items"] if part == "[]" else schema["properties"][part]
    return schema


def _root_schema(
    spec_model: type[BaseModel],
    status_model: type[BaseModel],
    description: str,
    rules: dict[tuple[str, ...], list[dict[str, str]]],
) -> dict[str, Any]:
    spec = {"type": "object", "description": "desired state (see docs/crds.md)", **model_schema(spec_model)}
    spec["description"] = "desired state (see docs/crds.md)"
    status = {"type": "object", "description": "observed state, written by the operator"}
    status.update({k: v for k, v in model_schema(status_model).items() if k != "description"})
    root: dict[str, Any] = {
        "type": "object",
        "description": description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }
    for path, extra in LIST_TYPES.items():
        try:
            _node(root, path).update(extra)
        except KeyError:
            continue  # this kind has no such list
    for path, node_rules in rules.items():
        _node(root, path)["x-kubernetes-validations"] = node_rules
    return root


def _crd(
    plural: str,
    kind: str,
    short: str,
    scope: str,
    schema: dict[str, Any],
    columns: list[dict[str, Any]],
    subresources: dict[str, Any],
) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{api.GROUP}"},
        "spec": {
            "group": api.GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": [short],
                "categories": ["jitserve"],
            },
            "scope": scope,
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": subresources,
                    "additionalPrinterColumns": columns,
                }
            ],
        },
    }


def sloclass_crd() -> dict[str, Any]:
    schema = _root_schema(
        SLOClassSpec,
        SLOClassStatus,
        "An SLO class (cluster-scoped, like PriorityClass): the latency or deadline promise a request "
        "of this class gets, and what admission does under overload.",
        SLOCLASS_RULES,
    )
    columns = [
        {"name": "Type", "type": "string", "jsonPath": ".spec.type"},
        {"name": "TTFT", "type": "number", "jsonPath": ".spec.ttftSeconds"},
        {"name": "TBT", "type": "number", "jsonPath": ".spec.tbtSeconds"},
        {"name": "Deadline", "type": "number", "jsonPath": ".spec.deadlineSeconds"},
        {"name": "Default", "type": "boolean", "jsonPath": ".spec.default"},
        {"name": "Pools", "type": "integer", "jsonPath": ".status.poolCount"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    return _crd(api.SLOCLASS_PLURAL, api.SLOCLASS_KIND, "slo", "Cluster", schema, columns, {"status": {}})


def servingpool_crd() -> dict[str, Any]:
    schema = _root_schema(
        ServingPoolSpec,
        ServingPoolStatus,
        "A pool of vLLM engines running the JITServe scheduler behind an SLO-aware router that "
        "serves an in-cluster OpenAI-compatible endpoint.",
        SERVINGPOOL_RULES,
    )
    columns = [
        {"name": "Model", "type": "string", "jsonPath": ".spec.model.servedName"},
        {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
        {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
        {"name": "Status", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].reason'},
        {"name": "Endpoint", "type": "string", "jsonPath": ".status.endpoint", "priority": 1},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    subresources = {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    }
    return _crd(
        api.SERVINGPOOL_PLURAL, api.SERVINGPOOL_KIND, "sp", "Namespaced", schema, columns, subresources
    )


def render() -> dict[str, str]:
    """File name -> YAML text of every CRD."""
    out = {}
    for crd in (sloclass_crd(), servingpool_crd()):
        name = f"{crd['spec']['group']}_{crd['spec']['names']['plural']}.yaml"
        out[name] = HEADER + yaml.safe_dump(crd, sort_keys=False, width=100)
    return out


def drift(directory: Path) -> list[str]:
    """Names of CRD files in `directory` that are missing or differ from the generated ones."""
    return [
        name
        for name, text in render().items()
        if not (directory / name).is_file() or (directory / name).read_text() != text
    ]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output-dir", type=Path, help="write one YAML file per CRD into this directory (default: print)"
    )
    parser.add_argument(
        "--docs",
        type=Path,
        help="also rewrite the generated field tables in this Markdown file (docs/crds.md)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="with --output-dir: exit 1 if the files there differ from the models instead of writing",
    )


def update_docs(path: Path) -> bool:
    """Replace the generated section of `path`; True if it changed."""
    text = path.read_text()
    start, end = text.index(REFERENCE_BEGIN), text.index(REFERENCE_END) + len(REFERENCE_END) + 1
    new = text[:start] + reference_markdown() + text[end:]
    path.write_text(new)
    return new != text


def run(args: argparse.Namespace) -> int:
    if getattr(args, "docs", None) is not None:
        update_docs(args.docs)
    files = render()
    if args.output_dir is None:
        sys.stdout.write("---\n".join(files.values()))
        return 0
    if args.check:
        stale = drift(args.output_dir)
        for name in stale:
            print(
                f"{args.output_dir / name} differs from the models: run jitserve crds --output-dir "
                f"{args.output_dir}",
                file=sys.stderr,
            )
        return 1 if stale else 0
    args.output_dir.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (args.output_dir / name).write_text(text)
        print(f"wrote {args.output_dir / name}")
    return 0


# ---- the field tables of docs/crds.md --------------------------------------------------------------

REFERENCE_BEGIN = "<!-- BEGIN GENERATED FIELD TABLES (jitserve.operator.crdgen.reference_markdown) -->"
REFERENCE_END = "<!-- END GENERATED FIELD TABLES -->"


def _constraints(node: dict[str, Any]) -> str:
    parts = []
    if "enum" in node:
        parts.append(" \\| ".join(f"`{v}`" for v in node["enum"]))
    lo, hi = node.get("minimum"), node.get("maximum")
    if lo is not None:
        parts.append(f"{'>' if node.get('exclusiveMinimum') else '>='} {lo}")
    if hi is not None:
        parts.append(f"{'<' if node.get('exclusiveMaximum') else '<='} {hi}")
    for key, label in (("minItems", "items >="), ("maxItems", "items <="), ("maxLength", "length <=")):
        if key in node:
            parts.append(f"{label} {node[key]}")
    if "pattern" in node:
        parts.append(f"pattern `{node['pattern']}`")
    if node.get("x-kubernetes-list-type") == "set":
        parts.append("unique")
    return ", ".join(parts)


def _rows(node: dict[str, Any], prefix: str, required: bool) -> list[str]:
    kind = "quantity" if node.get("x-kubernetes-int-or-string") else node.get("type", "")
    if kind == "array" and isinstance(node.get("items"), dict):
        kind = f"[]{node['items'].get('type', 'object')}"
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        kind = f"map[string]{node['additionalProperties'].get('type', '')}"
    default = f"`{json.dumps(node['default'])}`" if "default" in node else ""
    desc = (node.get("description") or "").replace("\n", " ").replace("|", "\\|")
    req = " (required)" if required else ""
    rows = [f"| `{prefix}` | {kind}{req} | {default} | {_constraints(node)} | {desc} |"]
    children = node.get("properties") or {}
    if kind.startswith("[]") and isinstance(node.get("items"), dict):
        children = node["items"].get("properties") or {}
        prefix += "[]"
        node = node["items"]
    for name, sub in children.items():
        rows += _rows(sub, f"{prefix}.{name}", name in (node.get("required") or []))
    return rows


def reference_markdown() -> str:
    """Field tables and CEL rules of both CRDs, for docs/crds.md (a test keeps the doc in sync)."""
    out = [REFERENCE_BEGIN]
    for crd in (sloclass_crd(), servingpool_crd()):
        kind = crd["spec"]["names"]["kind"]
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for part in ("spec", "status"):
            out += ["", f"### {kind} `.{part}`", "", "| field | type | default | allowed | description |"]
            out += ["|---|---|---|---|---|"]
            node = schema["properties"][part]
            for name, sub in (node.get("properties") or {}).items():
                out += _rows(sub, name, name in (node.get("required") or []))
        rules = []
        for path, node in [("", schema)] + [(f".{p}", n) for p, n in _rule_nodes(schema, "")]:
            rules += [
                f"| `{path or '.'}` | `{_cell(r['rule'])}` | {_cell(r['message'])} | {_reason(r)} |"
                for r in node.get("x-kubernetes-validations") or []
            ]
        out += [
            "",
            f"### {kind} validation rules (CEL)",
            "",
            "| on | rule | message | reported as |",
            "|---|---|---|---|",
            *rules,
        ]
    out.append(REFERENCE_END)
    return "\n".join(out) + "\n"


def _reason(rule: dict[str, str]) -> str:
    """How kubectl shows a failed rule: the field (fieldPath) and its error type (reason)."""
    label = {REQUIRED: "Required value", FORBIDDEN: "Forbidden", INVALID: "Invalid value"}
    where = f"`{rule['fieldPath']}`: " if rule.get("fieldPath") else ""
    return where + label.get(rule.get("reason", INVALID), rule.get("reason", ""))


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _rule_nodes(node: dict[str, Any], prefix: str) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for name, sub in (node.get("properties") or {}).items():
        path = f"{prefix}.{name}" if prefix else name
        found.append((path, sub))
        found += _rule_nodes(sub, path)
    if isinstance(node.get("items"), dict):
        found.append((f"{prefix}[]", node["items"]))
        found += _rule_nodes(node["items"], f"{prefix}[]")
    return found
