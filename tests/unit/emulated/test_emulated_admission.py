"""The emulated admission of custom resources runs the CEL rules when, and only when, the real API
server does, and reports schema and CEL errors together as it does.

Kubernetes 1.35 (k8s.io/apiextensions-apiserver v0.35):
- pkg/registry/customresource/strategy.go, `Validate` / `ValidateUpdate`: the OpenAPI schema and the
  list types are checked first; the CEL rules (x-kubernetes-validations) then run unless
  `hasBlockingErr` finds a type, maxLength, maxItems, maxProperties, required or enum error, in which
  case one error is added: `field.Invalid(nil, nil, "some validation rules were not checked because
  the object was invalid; correct the existing errors to complete validation")`. Every other schema
  error (bounds, pattern, minLength, minItems, duplicates) is reported beside the CEL errors.
- pkg/apiserver/validation/validation.go, `kubeOpenAPIResultToFieldErrors`: which field error type
  each OpenAPI failure becomes (Required, NotSupported, TooLong, TooMany, TypeInvalid, else Invalid).
- pkg/apiserver/schema/cel/validation.go, `fieldErrorForReason`: a failed rule's `reason` and
  `fieldPath`; objects and lists are not printed (field.OmitValueType).
- k8s.io/apimachinery pkg/util/validation/field/errors.go: `ErrorBody` renders the messages;
  k8s.io/kube-openapi pkg/validation/errors/schema.go: the "<field> in body should ..." details.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.emulated.admission import admit

NOT_CHECKED = (
    "<nil>",
    "Invalid value: null: some validation rules were not checked because the object was invalid; "
    "correct the existing errors to complete validation",
)
RULE = "size and mode agree"

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "required": ["mode"],
            "properties": {
                "mode": {"type": "string", "enum": ["small", "large"]},
                "size": {"type": "integer", "minimum": 1, "maximum": 100},
                "name": {"type": "string", "maxLength": 5, "minLength": 2, "pattern": "^[a-z]+$"},
                "tags": {
                    "type": "array",
                    "maxItems": 3,
                    "minItems": 1,
                    "items": {"type": "string"},
                    "x-kubernetes-list-type": "set",
                },
                "labels": {"type": "object", "maxProperties": 1, "additionalProperties": {"type": "string"}},
                "ratio": {"type": "number", "exclusiveMinimum": True, "minimum": 0},
            },
            # Fails for every object below that has mode "small": the rule's message must appear
            # exactly when the real server would evaluate it.
            "x-kubernetes-validations": [
                {"rule": "self.mode != 'small' || self.size <= 10", "message": RULE}
            ],
        }
    },
}


def errors_of(spec: dict[str, Any]) -> list[tuple[str, str]]:
    return admit(
        {"apiVersion": "t.dev/v1", "kind": "T", "metadata": {"name": "x"}, "spec": spec}, SCHEMA
    ).errors


def reasons_of(spec: dict[str, Any]) -> list[str]:
    return admit({"metadata": {"name": "x"}, "spec": spec}, SCHEMA).reasons


CEL_FAILS = {"mode": "small", "size": 50}


@pytest.mark.parametrize(
    ("change", "schema_error"),
    [
        (
            {"size": "fifty"},
            ("spec.size", 'Invalid value: "string": spec.size in body must be of type integer: "string"'),
        ),
        ({"mode": None}, ("spec.mode", "Required value")),
        ({"name": "abcdefg"}, ("spec.name", "Too long: may not be more than 5 bytes")),
        ({"tags": ["a", "b", "c", "d"]}, ("spec.tags", "Too many: 4: must have at most 3 items")),
        ({"labels": {"a": "1", "b": "2"}}, ("spec.labels", "Too many: 2: must have at most 1 item")),
    ],
)
def test_blocking_schema_errors_stop_the_cel_rules(
    change: dict[str, Any], schema_error: tuple[str, str]
) -> None:
    """type, required, maxLength, maxItems, maxProperties: hasBlockingErr is true, no rule runs (the
    rule that would fail is absent) and the "not checked" error follows the schema errors."""
    spec = {k: v for k, v in {**CEL_FAILS, **change}.items() if v is not None}
    errors = errors_of(spec)
    assert schema_error in errors
    assert errors[-1] == NOT_CHECKED and errors.count(NOT_CHECKED) == 1
    assert not any(RULE in message for _, message in errors)


def test_an_enum_error_blocks_the_rules_too() -> None:
    """enum -> field.NotSupported, with the supported values quoted (strconv.Quote)."""
    errors = errors_of({"mode": "tiny", "size": 50})
    assert errors == [
        ("spec.mode", 'Unsupported value: "tiny": supported values: "small", "large"'),
        NOT_CHECKED,
    ]
    assert reasons_of({"mode": "tiny", "size": 50}) == ["FieldValueNotSupported", "FieldValueInvalid"]


@pytest.mark.parametrize(
    ("change", "schema_error"),
    [
        (
            {"size": 101},
            ("spec.size", "Invalid value: 101: spec.size in body should be less than or equal to 100"),
        ),
        (
            {"name": "a"},
            ("spec.name", 'Invalid value: "a": spec.name in body should be at least 2 chars long'),
        ),
        ({"name": "AB"}, ("spec.name", "Invalid value: \"AB\": spec.name in body should match '^[a-z]+$'")),
        ({"tags": []}, ("spec.tags", "Invalid value: []: spec.tags in body should have at least 1 items")),
        ({"tags": ["a", "a"]}, ("spec.tags[1]", 'Duplicate value: "a"')),
        ({"ratio": 0}, ("spec.ratio", "Invalid value: 0: spec.ratio in body should be greater than 0")),
    ],
)
def test_other_schema_errors_are_reported_with_the_cel_errors(
    change: dict[str, Any], schema_error: tuple[str, str]
) -> None:
    """maximum, minLength, pattern, minItems, exclusiveMinimum and set duplicates are not blocking:
    the rule still runs and its error is reported beside the schema error (the emulator used to skip
    every rule after any schema error)."""
    errors = errors_of({**CEL_FAILS, **change})
    assert errors == [schema_error, ("spec", f"Invalid value: {RULE}")]
    assert reasons_of({**CEL_FAILS, **change})[-1] == "FieldValueInvalid"


def test_a_non_blocking_error_alone_when_the_rules_pass() -> None:
    errors = errors_of({"mode": "small", "size": 0})
    assert errors == [
        ("spec.size", "Invalid value: 0: spec.size in body should be greater than or equal to 1")
    ]


def test_the_rules_run_on_a_schema_valid_object() -> None:
    assert errors_of(CEL_FAILS) == [("spec", f"Invalid value: {RULE}")]
    assert errors_of({"mode": "small", "size": 5}) == []


def test_reason_and_field_path_of_a_rule() -> None:
    """fieldErrorForReason: reason FieldValueForbidden -> "Forbidden: <message>", at fieldPath
    relative to the rule's node; the cause carries the reason."""
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "x-kubernetes-validations": [
                    {"rule": "!has(self.b) || has(self.a)", "message": "b needs a",
                     "reason": "FieldValueForbidden", "fieldPath": ".b"},
                    {"rule": "!has(self.a) || self.a < 5", "message": "a is small"},
                ],
            }
        },
    }  # fmt: skip
    outcome = admit({"metadata": {"name": "x"}, "spec": {"b": 1}}, schema)
    assert outcome.errors == [("spec.b", "Forbidden: b needs a")]
    assert outcome.reasons == ["FieldValueForbidden"]
    outcome = admit({"metadata": {"name": "x"}, "spec": {"a": 7}}, schema)
    assert outcome.errors == [("spec", "Invalid value: a is small")] and outcome.reasons == [
        "FieldValueInvalid"
    ]


def test_integral_floats_are_integers() -> None:
    """kube-openapi validate/type.go (isFloatInt): 2.0 passes `type: integer`."""
    assert errors_of({"mode": "large", "size": 2.0}) == []


def test_transition_rules_run_only_against_an_old_value() -> None:
    """pkg/apiserver/schema/cel/validation.go: "transition rules are evaluated only if there is a
    comparable existing value" (UsesOldSelf and no old object: skipped). On an update the rule
    compares with the stored object's node."""
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "other": {"type": "string"}},
                "x-kubernetes-validations": [
                    {"rule": "self.name == oldSelf.name", "message": "name is immutable"}
                ],
            }
        },
    }
    new = {"metadata": {"name": "x"}, "spec": {"name": "b"}}
    assert admit(new, schema).errors == []  # a create: no old value
    old = {"metadata": {"name": "x"}, "spec": {"name": "a"}}
    assert admit(new, schema, old).errors == [("spec", "Invalid value: name is immutable")]
    assert admit({"metadata": {"name": "x"}, "spec": {"name": "a", "other": "z"}}, schema, old).errors == []
