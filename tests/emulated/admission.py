"""Emulated admission of custom resources: what kube-apiserver does with a CRD's schema.

In the order the real server applies them: pruning of unknown fields (or, with
`fieldValidation=Strict` as kubectl sends, rejection), defaulting, OpenAPI validation (bounds,
enums, patterns, required, `x-kubernetes-list-type: set` uniqueness) and the CEL rules of
`x-kubernetes-validations`, evaluated by cel-python. Not emulated: transition rules (`oldSelf`),
CEL cost limits, the Kubernetes-specific CEL libraries (quantity, url, regex extensions), and
messageExpression. Error messages follow the API server's format.
"""

from __future__ import annotations

import copy
import functools
import json
from dataclasses import dataclass, field
from typing import Any

import celpy
import jsonschema

Schema = dict[str, Any]


@dataclass
class Outcome:
    obj: dict[str, Any]
    unknown: list[str] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)  # (field path, message)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def prune_and_default(value: Any, schema: Schema, path: str, unknown: list[str]) -> Any:
    """Drop fields the schema does not know (recording them) and fill in defaults, recursively."""
    if schema.get("type") == "object" or "properties" in schema:
        if not isinstance(value, dict):
            return value
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            return value
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        out: dict[str, Any] = {}
        if props is not None:
            for key, sub in props.items():
                if key in value:
                    out[key] = prune_and_default(value[key], sub, _join(path, key), unknown)
                elif "default" in sub:
                    out[key] = prune_and_default(
                        copy.deepcopy(sub["default"]), sub, _join(path, key), unknown
                    )
            for key in value:
                if key not in props:
                    unknown.append(_join(path, key))
            return out
        if isinstance(extra, dict):
            return {k: prune_and_default(v, extra, _join(path, k), unknown) for k, v in value.items()}
        return value
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [prune_and_default(v, schema["items"], f"{path}[{i}]", unknown) for i, v in enumerate(value)]
    return value


def _openapi_errors(obj: Any, schema: Schema) -> list[tuple[str, str]]:
    # The CRD schema is OpenAPI v3.0, whose bounds (`exclusiveMinimum: true`) are JSON Schema draft 4.
    validator = jsonschema.Draft4Validator(schema)
    errors = []
    for err in sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path)):
        where = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in err.absolute_path)
        where = where.replace(".[", "[")
        value = err.instance if not isinstance(err.instance, dict | list) else type(err.instance).__name__
        errors.append((where or "<root>", f"Invalid value: {json.dumps(value)}: {err.message}"))
    return errors


@functools.lru_cache(maxsize=256)
def _program(rule: str) -> Any:
    """Compiled CEL (parsing is the expensive part; each CRD has a handful of rules)."""
    env = celpy.Environment()
    return env.program(env.compile(rule))


def _walk_rules(obj: Any, schema: Schema, path: str, errors: list[tuple[str, str]], root: bool) -> None:
    """Evaluate every x-kubernetes-validations rule whose node is present in `obj`."""
    for rule in schema.get("x-kubernetes-validations") or []:
        try:
            ok = _program(rule["rule"]).evaluate({"self": celpy.json_to_cel(obj)})
        except Exception as exc:  # noqa: BLE001 - a rule that cannot evaluate is a failed rule, as in K8s
            ok = False
            rule = {**rule, "message": f"{rule.get('message', rule['rule'])} (evaluation error: {exc})"}
        if not bool(ok):
            message = rule.get("message") or f"failed rule: {rule['rule']}"
            errors.append((path or "<root>", f'Invalid value: "object": {message}'))
    if isinstance(obj, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in obj and not (root and key == "metadata"):
                _walk_rules(obj[key], sub, _join(path, key), errors, False)
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(obj):
            _walk_rules(item, schema["items"], f"{path}[{i}]", errors, False)


def _list_type_errors(obj: Any, schema: Schema, path: str, errors: list[tuple[str, str]]) -> None:
    if isinstance(obj, list):
        if schema.get("x-kubernetes-list-type") == "set":
            seen = []
            for i, item in enumerate(obj):
                if item in seen:
                    errors.append((f"{path}[{i}]", f"Duplicate value: {json.dumps(item)}"))
                seen.append(item)
        if isinstance(schema.get("items"), dict):
            for i, item in enumerate(obj):
                _list_type_errors(item, schema["items"], f"{path}[{i}]", errors)
    elif isinstance(obj, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in obj:
                _list_type_errors(obj[key], sub, _join(path, key), errors)


def admit(obj: dict[str, Any], schema: Schema) -> Outcome:
    """Prune, default and validate one custom resource against its CRD version's openAPIV3Schema."""
    unknown: list[str] = []
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    pruned = prune_and_default(body, schema, "", unknown)
    unknown = [u for u in unknown if u.split(".")[0] not in ("apiVersion", "kind", "metadata")]
    result = {k: obj[k] for k in ("apiVersion", "kind") if obj.get(k) is not None}
    result["metadata"] = obj.get("metadata") or {}
    result.update(pruned)
    errors = _openapi_errors(result, schema)
    _list_type_errors(result, schema, "", errors)
    if not errors:  # as in Kubernetes, CEL rules run only on schema-valid objects
        _walk_rules(result, schema, "", errors, True)
    return Outcome(result, unknown, errors)
