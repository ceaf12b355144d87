"""Emulated admission of custom resources: what kube-apiserver does with a CRD's schema.

In the order the real server applies them: pruning of unknown fields (or, with
`fieldValidation=Strict` as kubectl sends, rejection), defaulting, OpenAPI validation (bounds,
enums, patterns, required, `x-kubernetes-list-type: set` uniqueness) and the CEL rules of
`x-kubernetes-validations`, evaluated by cel-python, unless the schema found a blocking error
(type, required, enum, maxLength, maxItems, maxProperties), as the real server decides; a rule's
`reason`, `fieldPath` and `messageExpression` are honoured, and transition rules (`oldSelf`) run on
updates where the old object has the node. Not emulated: CEL cost limits, `optionalOldSelf`,
validation ratcheting, the Kubernetes-specific CEL libraries (quantity, url, regex extensions).
Error messages and cause types follow the API server's (Kubernetes 1.35).
"""

from __future__ import annotations

import copy
import decimal
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
    reasons: list[str] = field(default_factory=list)  # each error's cause type (FieldValueInvalid, ...)


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


# The field error types of k8s.io/apimachinery/pkg/util/validation/field (errors.go), as Status causes.
REQUIRED, NOT_SUPPORTED = "FieldValueRequired", "FieldValueNotSupported"
TOO_LONG, TOO_MANY = "FieldValueTooLong", "FieldValueTooMany"
TYPE_INVALID, INVALID, DUPLICATE = "FieldValueTypeInvalid", "FieldValueInvalid", "FieldValueDuplicate"
FORBIDDEN = "FieldValueForbidden"
# What stops the CEL rules from running (apiextensions-apiserver, registry/customresource/strategy.go,
# hasBlockingErr): "OpenAPIv3 type/maxLength/maxItems/MaxProperties/required/enum violation/wrong type
# field validation failures are viewed as blocking err for CEL validation". Any other schema error
# (bounds, pattern, minLength, minItems, a duplicate in a set) leaves every CEL rule running.
BLOCKING = frozenset({NOT_SUPPORTED, REQUIRED, TOO_LONG, TOO_MANY, TYPE_INVALID})
CEL_NOT_CHECKED = (
    "<nil>",
    "Invalid value: null: some validation rules were not checked because the object was invalid; "
    "correct the existing errors to complete validation",
)


def _go_number(value: Any) -> str:
    """A number as Go's %v prints a float64 (strconv 'g', shortest): 0, 0.5, 86400, 1e+06."""
    dec = decimal.Decimal(repr(float(value))).normalize()
    exp = dec.adjusted()
    if -4 <= exp < 6:  # strconv's shortest 'g' switches to an exponent at 1e+06 (eprec = 6)
        return format(dec, "f")
    digits = "".join(map(str, dec.as_tuple().digits)).rstrip("0") or "0"
    mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{mantissa}e{'-' if exp < 0 else '+'}{abs(exp):02d}"


def _go_value(value: Any) -> str:
    """A bad value as field.Error.ErrorBody renders it: strings quoted, numbers plain, the rest JSON."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _go_number(value)
    if isinstance(value, str):
        return json.dumps(value)
    return json.dumps(value, separators=(",", ":"))


def _json_type(value: Any) -> str:
    """The JSON type kube-openapi names for a decoded value (validate/type.go, schemaInfoForType)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _field_error(err: jsonschema.ValidationError) -> tuple[str, str, str]:
    """One jsonschema error as the field error kube-apiserver reports: (field, message, cause type).

    The mapping of apiextensions-apiserver's kubeOpenAPIResultToFieldErrors (pkg/apiserver/validation/
    validation.go), with kube-openapi's messages (pkg/validation/errors/schema.go, `in body`)."""
    where = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in err.absolute_path)
    where = where.replace(".[", "[")
    name = where or "<nil>"
    keyword, bound, value = err.validator, err.validator_value, err.instance
    if keyword == "required":
        missing = next((k for k in bound if f"{k!r} is a required property" == err.message), None)
        missing = missing or next((k for k in bound if isinstance(value, dict) and k not in value), "")
        return _join(where, missing), "Required value", REQUIRED
    if keyword == "enum":
        allowed = ", ".join(json.dumps(v if isinstance(v, str) else json.dumps(v)) for v in bound)
        return name, f"Unsupported value: {_go_value(value)}: supported values: {allowed}", NOT_SUPPORTED
    if keyword == "maxLength":
        unit = "byte" if bound == 1 else "bytes"
        return name, f"Too long: may not be more than {bound} {unit}", TOO_LONG
    if keyword in ("maxItems", "maxProperties"):
        unit = "item" if bound == 1 else "items"
        return name, f"Too many: {len(value)}: must have at most {bound} {unit}", TOO_MANY
    if keyword == "type":
        expected = bound if isinstance(bound, str) else ",".join(bound)
        actual = _json_type(value)
        detail = f'{name} in body must be of type {expected}: "{actual}"'
        return name, f"Invalid value: {json.dumps(actual)}: {detail}", TYPE_INVALID
    schema = err.schema if isinstance(err.schema, dict) else {}
    if keyword == "minimum":
        strict = "" if schema.get("exclusiveMinimum") else " or equal to"
        detail = f"{name} in body should be greater than{strict} {_go_number(bound)}"
    elif keyword == "maximum":
        strict = "" if schema.get("exclusiveMaximum") else " or equal to"
        detail = f"{name} in body should be less than{strict} {_go_number(bound)}"
    elif keyword == "multipleOf":
        detail = f"{name} in body should be a multiple of {_go_number(bound)}"
    elif keyword == "pattern":
        detail = f"{name} in body should match '{bound}'"
    elif keyword == "minLength":
        detail = f"{name} in body should be at least {bound} chars long"
    elif keyword == "minItems":
        detail = f"{name} in body should have at least {bound} items"
    elif keyword == "minProperties":
        detail = f"{name} in body should have at least {bound} properties"
    else:
        detail = err.message
    return name, f"Invalid value: {_go_value(value)}: {detail}", INVALID


# OpenAPI v3.0 bounds (`exclusiveMinimum: true`) are JSON Schema draft 4's; an integral float (2.0)
# is an integer, as in kube-openapi's type validator (isFloatInt), which draft 4 alone would refuse.
_Validator = jsonschema.validators.extend(
    jsonschema.Draft4Validator,
    type_checker=jsonschema.Draft4Validator.TYPE_CHECKER.redefine(
        "integer",
        lambda _, v: (
            (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer())
        ),
    ),
)


def _openapi_errors(obj: Any, schema: Schema) -> list[tuple[str, str, str]]:
    errors = sorted(_Validator(schema).iter_errors(obj), key=lambda e: [str(p) for p in e.absolute_path])
    return [_field_error(err) for err in errors]


@functools.lru_cache(maxsize=256)
def _program(rule: str) -> Any:
    """Compiled CEL (parsing is the expensive part; each CRD has a handful of rules)."""
    env = celpy.Environment()
    return env.program(env.compile(rule))


def _cel_error(path: str, value: Any, detail: str, reason: str | None) -> tuple[str, str, str]:
    """A failed rule as fieldErrorForReason (apiextensions-apiserver, pkg/apiserver/schema/cel/
    validation.go) reports it; objects and lists are not printed (field.OmitValueType)."""
    shown = "" if isinstance(value, dict | list) else f": {_go_value(value)}"
    if reason == FORBIDDEN:
        return path, f"Forbidden: {detail}", FORBIDDEN
    if reason == REQUIRED:
        return path, f"Required value: {detail}", REQUIRED
    if reason == DUPLICATE:
        return path, f"Duplicate value{shown}", DUPLICATE
    return path, f"Invalid value{shown}: {detail}", INVALID


_MISSING = object()  # no old value to correlate with (a create, or a node the old object lacks)


def _uses_old_self(rule: str) -> bool:
    return "oldSelf" in rule


def _walk_rules(
    obj: Any, schema: Schema, path: str, errors: list[tuple[str, str, str]], root: bool, old: Any = _MISSING
) -> None:
    """Evaluate every x-kubernetes-validations rule whose node is present in `obj`.

    Transition rules (those using oldSelf) run only where the old object has a correlated value
    (apiextensions-apiserver, pkg/apiserver/schema/cel/validation.go: "transition rules are evaluated
    only if there is a comparable existing value"): properties by name, items of `list-type: map`
    lists by their keys; other list items are not correlated."""
    for rule in schema.get("x-kubernetes-validations") or []:
        text = (rule.get("message") or "").strip() or rule["rule"].strip()
        activation = {"self": celpy.json_to_cel(obj)}
        if _uses_old_self(rule["rule"]):
            if old is _MISSING:
                continue
            activation["oldSelf"] = celpy.json_to_cel(old)
        try:
            ok = _program(rule["rule"]).evaluate(activation)
        except Exception as exc:  # noqa: BLE001 - a rule that cannot evaluate reports why, as in K8s
            ok = exc
        if isinstance(ok, Exception):  # cel-python returns some evaluation errors (CELEvalError)
            kind = json.dumps(schema.get("type") or _json_type(obj))
            errors.append((path or "<nil>", f"Invalid value: {kind}: {ok} evaluating rule: {text}", INVALID))
            continue
        if bool(ok):
            continue
        detail = rule["message"].strip() if rule.get("message") else f"failed rule: {rule['rule'].strip()}"
        if rule.get("messageExpression"):
            try:
                computed = _program(rule["messageExpression"]).evaluate(activation)
                if isinstance(computed, str) and computed.strip():
                    detail = str(computed)
            except Exception:  # noqa: BLE001, S110 - a failing messageExpression falls back to the message
                pass
        where = path
        if rule.get("fieldPath"):  # relative to the rule's node, as NormalizedRuleFieldPath
            where = _join(path, rule["fieldPath"].lstrip("."))
        errors.append(_cel_error(where or "<nil>", obj, detail, rule.get("reason")))
    if isinstance(obj, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in obj and not (root and key == "metadata"):
                old_value = old.get(key, _MISSING) if isinstance(old, dict) else _MISSING
                _walk_rules(obj[key], sub, _join(path, key), errors, False, old_value)
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        keys = schema.get("x-kubernetes-list-map-keys") or []
        olds: dict[Any, Any] = {}
        if schema.get("x-kubernetes-list-type") == "map" and keys and isinstance(old, list):
            olds = {json.dumps([o.get(k) for k in keys]): o for o in old if isinstance(o, dict)}
        for i, item in enumerate(obj):
            key = json.dumps([item.get(k) for k in keys]) if isinstance(item, dict) and olds else None
            _walk_rules(item, schema["items"], f"{path}[{i}]", errors, False, olds.get(key, _MISSING))


def _list_type_errors(obj: Any, schema: Schema, path: str, errors: list[tuple[str, str, str]]) -> None:
    if isinstance(obj, list):
        if schema.get("x-kubernetes-list-type") == "set":
            seen = []
            for i, item in enumerate(obj):
                if item in seen:
                    errors.append((f"{path}[{i}]", f"Duplicate value: {_go_value(item)}", DUPLICATE))
                seen.append(item)
        if isinstance(schema.get("items"), dict):
            for i, item in enumerate(obj):
                _list_type_errors(item, schema["items"], f"{path}[{i}]", errors)
    elif isinstance(obj, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in obj:
                _list_type_errors(obj[key], sub, _join(path, key), errors)


def admit(obj: dict[str, Any], schema: Schema, old: dict[str, Any] | None = None) -> Outcome:
    """Prune, default and validate one custom resource against its CRD version's openAPIV3Schema.

    The checks run as customResourceStrategy.Validate runs them: the OpenAPI schema, the list types,
    then the CEL rules unless a blocking error (BLOCKING) was found, in which case one more error
    says the rules were not checked. Other schema errors and the CEL errors are reported together.
    `old` (an update's stored object) is what transition rules compare with.
    """
    unknown: list[str] = []
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    pruned = prune_and_default(body, schema, "", unknown)
    unknown = [u for u in unknown if u.split(".")[0] not in ("apiVersion", "kind", "metadata")]
    result = {k: obj[k] for k in ("apiVersion", "kind") if obj.get(k) is not None}
    result["metadata"] = obj.get("metadata") or {}
    result.update(pruned)
    errors = _openapi_errors(result, schema)
    _list_type_errors(result, schema, "", errors)
    if any(reason in BLOCKING for _, _, reason in errors):
        errors.append((*CEL_NOT_CHECKED, INVALID))
    else:
        _walk_rules(result, schema, "", errors, True, _MISSING if old is None else old)
    return Outcome(result, unknown, [(w, m) for w, m, _ in errors], [r for _, _, r in errors])
