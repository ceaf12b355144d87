"""The CRD YAML under crds/ is exactly what the pydantic models generate, and is a structural schema."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from jitserve.operator import crdgen

ROOT = Path(__file__).resolve().parents[3]


def _walk(node: Any, path: str = ""):  # noqa: ANN202
    yield path, node
    if isinstance(node, dict):
        for key in ("properties",):
            for name, sub in (node.get(key) or {}).items():
                yield from _walk(sub, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            yield from _walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            yield from _walk(node["additionalProperties"], f"{path}{{}}")


def test_crds_on_disk_match_the_models() -> None:
    assert crdgen.drift(ROOT / "crds") == [], "run: jitserve crds --output-dir crds"


def test_check_flag_fails_on_drift(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    crdgen.add_arguments(parser)
    assert crdgen.run(parser.parse_args(["--output-dir", str(tmp_path)])) == 0
    assert crdgen.run(parser.parse_args(["--output-dir", str(tmp_path), "--check"])) == 0
    stale = tmp_path / "jitserve.dev_sloclasses.yaml"
    stale.write_text(stale.read_text().replace("ttftSeconds", "ttft"))
    assert crdgen.run(parser.parse_args(["--output-dir", str(tmp_path), "--check"])) == 1


def test_names_scope_and_subresources() -> None:
    slo, pool = crdgen.sloclass_crd(), crdgen.servingpool_crd()
    assert slo["spec"]["scope"] == "Cluster" and slo["spec"]["names"]["shortNames"] == ["slo"]
    assert pool["spec"]["scope"] == "Namespaced" and pool["spec"]["names"]["shortNames"] == ["sp"]
    assert slo["metadata"]["name"] == "sloclasses.jitserve.dev"
    pool_version = pool["spec"]["versions"][0]
    assert pool_version["name"] == "v1alpha1" and pool_version["storage"] is True
    assert set(pool_version["subresources"]) == {"status", "scale"}
    assert pool_version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"
    columns = {c["name"]: c["jsonPath"] for c in pool_version["additionalPrinterColumns"]}
    assert columns["Ready"] == ".status.readyReplicas" and "Endpoint" in columns


def test_schemas_are_structural() -> None:
    """What kube-apiserver requires of a CRD schema (a non-structural one is rejected on apply)."""
    for crd in (crdgen.sloclass_crd(), crdgen.servingpool_crd()):
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for path, node in _walk(schema):
            assert "$ref" not in node and "anyOf" not in node and "oneOf" not in node, path
            assert "title" not in node and "const" not in node, path
            assert node.get("additionalProperties") is not False, path
            assert "type" in node or node.get("x-kubernetes-int-or-string"), path
            assert not ("properties" in node and "additionalProperties" in node), path
            if (
                node.get("type") == "object"
                and "properties" not in node
                and "additionalProperties" not in node
            ):
                assert node.get("x-kubernetes-preserve-unknown-fields") or path == ".metadata", path
            if "exclusiveMinimum" in node:
                assert node["exclusiveMinimum"] is True and "minimum" in node, path  # OpenAPI v3.0 form


def test_slo_class_schema_follows_the_slo_model() -> None:
    spec = crdgen.sloclass_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    props = spec["properties"]
    assert props["type"]["enum"] == ["latency", "deadline", "compound", "best-effort"]
    assert props["overload"]["enum"] == ["reject", "downgrade"]
    assert props["ttftSeconds"] == {
        "type": "number",
        "description": "latency: time to first token target",
        "minimum": 0,
        "exclusiveMinimum": True,
        "maximum": 86400,
    }
    assert spec["required"] == ["type"]
    assert len(spec["x-kubernetes-validations"]) == len(crdgen.SLOCLASS_RULES[("spec",)])


def test_yaml_is_loadable_and_has_the_header() -> None:
    for name, text in crdgen.render().items():
        assert text.startswith("# Generated")
        assert yaml.safe_load(text)["kind"] == "CustomResourceDefinition", name


def test_docs_field_tables_match_the_models(tmp_path: Path) -> None:
    doc = (ROOT / "docs" / "crds.md").read_text()
    assert crdgen.reference_markdown() in doc, "run: jitserve crds --output-dir crds --docs docs/crds.md"
    copy = tmp_path / "crds.md"
    copy.write_text(doc)
    assert crdgen.update_docs(copy) is False  # regenerating changes nothing
