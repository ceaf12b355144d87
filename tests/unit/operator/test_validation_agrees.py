"""The CRDs' OpenAPI + CEL validation (as the emulated API server applies it) accepts exactly what
the pydantic models accept: the API server rejects early what the operator would reject later."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from jitserve.operator import crdgen
from jitserve.operator.models import ServingPoolSpec
from jitserve.scheduler.slo import SLOClassSpec
from tests.emulated.admission import admit

SLO_SCHEMA = crdgen.sloclass_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
POOL_SCHEMA = crdgen.servingpool_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]

seconds = st.one_of(st.none(), st.sampled_from([-1.0, 0.0, 0.05, 2.0, 20.0, 100_000.0]))


@st.composite
def slo_specs(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {"type": draw(st.sampled_from(["latency", "deadline", "compound", "best-effort"]))}
    for key in ("ttftSeconds", "tbtSeconds", "deadlineSeconds"):
        value = draw(seconds)
        if value is not None:
            spec[key] = value
    for key, values in {
        "perStage": [True, False],
        "lengthQuantile": [0.3, 0.9, 1.0],
        "fairnessWeight": [0.0, 0.5, 2.0],
        "overload": ["reject", "downgrade", "queue"],
    }.items():
        if draw(st.booleans()):
            spec[key] = draw(st.sampled_from(values))
    return spec


def _crd_accepts(schema: dict[str, Any], spec: dict[str, Any], name: str = "x") -> tuple[bool, list[Any]]:
    outcome = admit({"apiVersion": "jitserve.dev/v1alpha1", "metadata": {"name": name}, "spec": spec}, schema)
    return not outcome.errors, outcome.errors


def _model_accepts(model: Any, spec: dict[str, Any]) -> bool:
    try:
        model.model_validate(spec)
    except ValidationError:
        return False
    return True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(slo_specs())
def test_slo_class_crd_and_model_agree(spec: dict[str, Any]) -> None:
    crd_ok, errors = _crd_accepts(SLO_SCHEMA, spec)
    assert crd_ok == _model_accepts(SLOClassSpec, spec), (spec, errors)


@st.composite
def pool_specs(draw: st.DrawFn) -> dict[str, Any]:
    source = draw(st.sampled_from(["huggingface", "pvc", "uri", None]))
    model: dict[str, Any] = {"servedName": "m"}
    if source:
        model["source"] = source
    if draw(st.booleans()):
        model["name"] = "org/model"
    if draw(st.booleans()):
        model["pvc"] = {"claimName": "weights"}
    if draw(st.booleans()):
        model["uri"] = "s3://bucket/model"
    allowed = draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=0, max_size=3))
    classes: dict[str, Any] = {"allowed": allowed}
    default = draw(st.sampled_from([None, "a", "z"]))
    if default:
        classes["default"] = default
    spec: dict[str, Any] = {"model": model, "sloClasses": classes}
    backend = draw(st.sampled_from([None, "vllm", "vllm-cpu"]))
    if backend:
        spec["engine"] = {"backend": backend}
    gpus = draw(st.sampled_from([None, 0, 1, 4, 17]))
    if gpus is not None:
        spec["resources"] = {"gpus": gpus}
    replicas = draw(st.sampled_from([None, 0, 3, -1]))
    if replicas is not None:
        spec["replicas"] = replicas
    return spec


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pool_specs())
def test_servingpool_crd_and_model_agree(spec: dict[str, Any]) -> None:
    crd_ok, errors = _crd_accepts(POOL_SCHEMA, spec)
    assert crd_ok == _model_accepts(ServingPoolSpec, spec), (spec, errors)


def test_every_cel_rule_can_fail_with_its_message() -> None:
    """Each rule is reachable: a wrong rule (always true) would not be caught by agreement alone."""
    cases = [
        (SLO_SCHEMA, {"type": "latency"}, "a latency class needs ttftSeconds"),
        (
            SLO_SCHEMA,
            {"type": "deadline", "deadlineSeconds": 1, "tbtSeconds": 1},
            "tbtSeconds needs ttftSeconds",
        ),
        (
            SLO_SCHEMA,
            {"type": "deadline", "deadlineSeconds": 1, "ttftSeconds": 1},
            "apply to latency classes only",
        ),
        (
            SLO_SCHEMA,
            {"type": "latency", "ttftSeconds": 1, "deadlineSeconds": 1},
            "not used by a latency class",
        ),
        (SLO_SCHEMA, {"type": "compound"}, "need deadlineSeconds"),
        (SLO_SCHEMA, {"type": "deadline", "deadlineSeconds": 1, "perStage": True}, "compound classes only"),
        (POOL_SCHEMA, {"model": {"servedName": "m"}, "sloClasses": {"allowed": ["a"]}}, "needs model.name"),
        (
            POOL_SCHEMA,
            {**BASE, "tolerations": [{"key": "g", "operator": "Exists", "value": "v"}]},
            "no value",
        ),
        (POOL_SCHEMA, {**BASE, "tolerations": [{"value": "v"}]}, "without a key needs operator Exists"),
        (POOL_SCHEMA, {**BASE, "tolerations": [{"key": "g", "tolerationSeconds": 1}]}, "effect NoExecute"),
        (
            POOL_SCHEMA,
            {"model": {"servedName": "m", "source": "uri"}, "sloClasses": {"allowed": ["a"]}},
            "needs model.uri",
        ),
        (
            POOL_SCHEMA,
            {"model": {"servedName": "m", "name": "x"}, "sloClasses": {"allowed": ["a"], "default": "b"}},
            "sloClasses.default must be one of sloClasses.allowed",
        ),
    ]
    for schema, spec, message in cases:
        ok, errors = _crd_accepts(schema, spec)
        assert not ok and any(message in m for _, m in errors), (spec, errors)


@pytest.mark.parametrize(("name", "ok"), [("a" * 56, True), ("a" * 57, False)])
def test_pool_name_length_rule(name: str, ok: bool) -> None:
    spec = {"model": {"servedName": "m", "name": "x"}, "sloClasses": {"allowed": ["a"]}}
    assert _crd_accepts(POOL_SCHEMA, spec, name=name)[0] is ok


def test_defaults_are_applied_and_unknown_fields_pruned() -> None:
    outcome = admit(
        {"metadata": {"name": "x"}, "spec": {"type": "deadline", "deadlineSeconds": 3, "bogus": 1}},
        SLO_SCHEMA,
    )
    assert outcome.unknown == ["spec.bogus"]
    assert outcome.obj["spec"]["waitingTimeSeconds"] == 5.0 and outcome.obj["spec"]["overload"] == "reject"
    assert "bogus" not in outcome.obj["spec"]


# ---- Kubernetes value grammars (quantities, label values, names): CRD and model agree --------------

QUANTITIES = ["4", "500m", "16Gi", "48Gi", "1e9", "0.5", ".5", "+1", 8, 0, "banana", "48 GB", "-1", -2,
              "1.5.2", "16gi", "", "1Ki ", "12E", "3e-3"]  # fmt: skip
LABEL_VALUES = ["true", "a.b_c-d", "", "-x", "x-", "has space", "a" * 63, "a" * 64, "ünï"]
OBJECT_NAMES = ["hf-token", "a.b", "Upper", "-x", "x_y", "a" * 253, "a" * 254, "tok.en-1"]
NAMESPACES = ["monitoring", "a.b", "Mon", "a" * 63, "a" * 64]
BASE: dict[str, Any] = {"model": {"servedName": "m", "name": "org/m"}, "sloClasses": {"allowed": ["a"]}}


def _with(path: str, value: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {k: dict(v) if isinstance(v, dict) else v for k, v in BASE.items()}
    node = spec
    parts = path.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return spec


@st.composite
def grammar_specs(draw: st.DrawFn) -> dict[str, Any]:
    path, values = draw(
        st.sampled_from(
            [
                ("resources.cpu", QUANTITIES),
                ("resources.memory", QUANTITIES),
                ("nodeSelector", [{"nvidia.com/gpu.present": v} for v in LABEL_VALUES]),
                ("model.hfTokenSecret", OBJECT_NAMES),
                ("router.authSecret", OBJECT_NAMES),
                ("networkPolicy.metricsNamespaces", [[n] for n in NAMESPACES]),
                ("sloClasses.allowed", [[n] for n in OBJECT_NAMES]),
                ("engine.image", ["reg.io/x:1", "x y", " x", "x"]),
                (
                    "tolerations",
                    [
                        [t]
                        for t in (
                            {"key": "gpu", "operator": "Exists"},
                            {"key": "gpu", "operator": "Exists", "value": "x"},
                            {"operator": "Exists"},
                            {"value": "x"},
                            {"key": "gpu", "value": "bad value"},
                            {"key": "bad key!", "value": "x"},
                            {"key": "gpu", "effect": "NoExecute", "tolerationSeconds": 30},
                            {"key": "gpu", "effect": "NoSchedule", "tolerationSeconds": 30},
                        )
                    ],
                ),
            ]
        )
    )
    return _with(path, draw(st.sampled_from(values)))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(grammar_specs())
def test_value_grammars_agree(spec: dict[str, Any]) -> None:
    crd_ok, errors = _crd_accepts(POOL_SCHEMA, spec)
    assert crd_ok == _model_accepts(ServingPoolSpec, spec), (spec, errors)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("resources.cpu", "banana"),
        ("resources.memory", "48 GB"),
        ("resources.memory", -1),
        ("nodeSelector", {"disk": "fast ssd"}),
        ("model.hfTokenSecret", "HF_Token"),
        ("router.authSecret", "keys/prod"),
        ("networkPolicy.metricsNamespaces", ["Monitoring"]),
    ],
)
def test_what_the_api_server_would_refuse_in_a_child_is_refused_by_both(path: str, value: Any) -> None:
    """The issue's examples: each used to pass both checks and go Ready on the emulated cluster."""
    spec = _with(path, value)
    ok, errors = _crd_accepts(POOL_SCHEMA, spec)
    assert not ok and any(path.split(".")[-1] in where for where, _ in errors), errors
    assert not _model_accepts(ServingPoolSpec, spec)


def test_node_selector_keys_are_checked_by_the_model() -> None:
    """Map keys have no CRD check (see models.py); the operator refuses them (InvalidSpec)."""
    assert _model_accepts(ServingPoolSpec, _with("nodeSelector", {"nvidia.com/gpu.present": "true"}))
    assert not _model_accepts(ServingPoolSpec, _with("nodeSelector", {"bad key": "true"}))
    assert not _model_accepts(ServingPoolSpec, _with("nodeSelector", {"a/b/c": "true"}))


@pytest.mark.parametrize(
    ("name", "ok"),
    [("llama", True), ("llama-2", True), ("2llama", False), ("my.pool", False), ("Big", False)],
)
def test_pool_name_must_be_a_dns1035_label(name: str, ok: bool) -> None:
    assert _crd_accepts(POOL_SCHEMA, BASE, name=name)[0] is ok


def test_cel_rules_carry_reason_and_field_path() -> None:
    """kubectl shows `spec.<field>: Required value: ...` rather than `spec: Invalid value: "object"`."""
    ok, errors = _crd_accepts(SLO_SCHEMA, {"type": "latency"})
    assert not ok and ("spec.ttftSeconds", "Required value: a latency class needs ttftSeconds") in errors
    ok, errors = _crd_accepts(
        POOL_SCHEMA, {**BASE, "engine": {"backend": "vllm-cpu"}, "resources": {"gpus": 1}}
    )
    assert any(w == "spec.resources.gpus" and m.startswith("Forbidden: ") for w, m in errors), errors
    for crd in (crdgen.sloclass_crd(), crdgen.servingpool_crd()):
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for path, node in [("", schema), *crdgen._rule_nodes(schema, "")]:  # noqa: SLF001
            for rule in node.get("x-kubernetes-validations") or []:
                assert rule["reason"] in {crdgen.REQUIRED, crdgen.FORBIDDEN, crdgen.INVALID}, rule
                if "fieldPath" in rule:  # a field the schema has, below the rule's node
                    target = node
                    for part in rule["fieldPath"].lstrip(".").split("."):
                        target = target["properties"][part]
                    assert target, (path, rule)
