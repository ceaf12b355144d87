"""Every child of a ServingPool, a pure function of the spec, valid against Kubernetes' own schemas
and wired to its siblings (selectors, names, ports, RBAC) the way the cluster needs."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from jitserve.operator import api, children
from jitserve.operator.children import Images, Pool
from jitserve.operator.commands import engine_args, router_args
from jitserve.operator.models import ServingPoolSpec
from jitserve.scheduler.contracts.classes_configmap import parse_classes
from jitserve.scheduler.slo import PAPER_CLASSES

K8S_VERSION = "1.30.0"

GPU_POOL: dict[str, Any] = {
    "model": {"source": "huggingface", "name": "org/model", "servedName": "m", "hfTokenSecret": "hf"},
    "replicas": 3,
    "engine": {"backend": "vllm", "extraArgs": ["--max-model-len", "4096"]},
    "resources": {"gpus": 2, "cpu": "8", "memory": "48Gi"},
    "nodeSelector": {"gpu": "a100"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "scheduler": {
        "frameSteps": 25,
        "cutoff": 0.9,
        "starvationDelta": 0.5,
        "classFairness": 0.25,
        "preemption": "recompute",
        "k": 2,
        "maxNumSeqs": 64,
    },
    "sloClasses": {"allowed": ["latency", "best-effort"], "default": "latency"},
    "router": {"replicas": 2, "port": 9000, "authSecret": "keys"},
}
CPU_POOL: dict[str, Any] = {
    "model": {"source": "pvc", "pvc": {"claimName": "weights", "path": "smollm2"}, "servedName": "smol"},
    "engine": {"backend": "vllm-cpu"},
    "sloClasses": {"allowed": ["deadline"]},
    "networkPolicy": {"enabled": False},
}


def make_pool(raw: dict[str, Any], name: str = "pool", namespace: str = "ns") -> Pool:
    spec = ServingPoolSpec.model_validate(raw)
    classes = {c: PAPER_CLASSES[c] for c in spec.sloClasses.allowed}
    default = spec.sloClasses.default or spec.sloClasses.allowed[0]
    return Pool(name, namespace, "uid-1", spec, classes, default, Images())


def by_kind(pool: Pool) -> dict[tuple[str, str], dict[str, Any]]:
    return {(c["kind"], c["metadata"]["name"]): c for c in children.desired_children(pool)}


@pytest.mark.parametrize("raw", [GPU_POOL, CPU_POOL], ids=["gpu", "cpu"])
def test_every_child_is_valid_for_kubernetes(raw: dict[str, Any]) -> None:
    for child in children.desired_children(make_pool(raw)):
        kubernetes_validate.validate(child, K8S_VERSION, strict=True)


@pytest.mark.parametrize("raw", [GPU_POOL, CPU_POOL], ids=["gpu", "cpu"])
def test_children_are_owned_and_labelled(raw: dict[str, Any]) -> None:
    for child in children.desired_children(make_pool(raw)):
        md = child["metadata"]
        assert md["namespace"] == "ns"
        assert md["ownerReferences"] == [
            {
                "apiVersion": "jitserve.dev/v1alpha1",
                "kind": "ServingPool",
                "name": "pool",
                "uid": "uid-1",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        assert md["labels"]["app.kubernetes.io/instance"] == "pool"
        assert md["labels"]["app.kubernetes.io/managed-by"] == api.MANAGED_BY


def test_children_are_pure_functions_of_the_spec() -> None:
    assert children.desired_children(make_pool(GPU_POOL)) == children.desired_children(make_pool(GPU_POOL))


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_selectors_and_services_reach_the_right_pods() -> None:
    kids = by_kind(make_pool(GPU_POOL))
    engine, router = kids[("Deployment", "pool-engine")], kids[("Deployment", "pool-router")]
    engine_labels = engine["spec"]["template"]["metadata"]["labels"]
    router_labels = router["spec"]["template"]["metadata"]["labels"]
    assert _matches(engine["spec"]["selector"]["matchLabels"], engine_labels)
    assert not _matches(engine["spec"]["selector"]["matchLabels"], router_labels)
    assert _matches(kids[("Service", "pool-engine")]["spec"]["selector"], engine_labels)
    assert _matches(kids[("Service", "pool-router")]["spec"]["selector"], router_labels)
    assert not _matches(kids[("Service", "pool-router")]["spec"]["selector"], engine_labels)
    # The Services' named target port exists on the containers.
    assert engine["spec"]["template"]["spec"]["containers"][0]["ports"][0] == {
        "name": "http",
        "containerPort": 8000,
        "protocol": "TCP",
    }
    assert kids[("Service", "pool-router")]["spec"]["ports"][0]["port"] == 9000
    assert router["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] == 9000


def test_network_policy_admits_only_the_pools_router() -> None:
    kids = by_kind(make_pool(GPU_POOL))
    policy = kids[("NetworkPolicy", "pool-engine")]["spec"]
    engine_labels = kids[("Deployment", "pool-engine")]["spec"]["template"]["metadata"]["labels"]
    router_labels = kids[("Deployment", "pool-router")]["spec"]["template"]["metadata"]["labels"]
    other_pool_router = dict(router_labels, **{"app.kubernetes.io/instance": "other"})
    assert _matches(policy["podSelector"]["matchLabels"], engine_labels)
    assert policy["policyTypes"] == ["Ingress"]
    (rule,) = policy["ingress"]
    (peer,) = rule["from"]
    assert _matches(peer["podSelector"]["matchLabels"], router_labels)
    assert not _matches(peer["podSelector"]["matchLabels"], other_pool_router)
    assert not _matches(peer["podSelector"]["matchLabels"], engine_labels)
    assert rule["ports"] == [{"port": 8000, "protocol": "TCP"}]
    assert ("NetworkPolicy", "pool-engine") not in by_kind(make_pool(CPU_POOL))
    assert children.unwanted_children(make_pool(CPU_POOL)) == [
        ("networking.k8s.io/v1", "NetworkPolicy", "pool-engine")
    ]


def test_metrics_namespaces_are_allowed_into_the_engines() -> None:
    pool = make_pool({**GPU_POOL, "networkPolicy": {"metricsNamespaces": ["monitoring"]}})
    peers = children.engine_network_policy(pool)["spec"]["ingress"][0]["from"]
    assert peers[1]["namespaceSelector"]["matchExpressions"][0]["values"] == ["monitoring"]


def test_gpu_engine_command_resources_and_placement() -> None:
    pool = make_pool(GPU_POOL)
    pod = children.engine_deployment(pool)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["jitserve"]
    assert container["args"] == [
        "engine",
        "--model", "org/model",
        "--port", "8000",
        "--served-model-name", "m",
        "--policy", "jitserve",
        "--frame-steps", "25",
        "--cutoff", "0.9",
        "--starvation-delta", "0.5",
        "--class-fairness", "0.25",
        "--preemption", "recompute",
        "--classes-file", "/etc/jitserve/classes/classes.json",
        "--default-class", "latency",
        "--max-num-seqs", "64",
        "--",
        "--tensor-parallel-size", "2",
        "--max-model-len", "4096",
    ]  # fmt: skip
    assert {"name": "classes", "mountPath": "/etc/jitserve/classes", "readOnly": True} in container[
        "volumeMounts"
    ]
    assert {"name": "classes", "configMap": {"name": "pool-classes"}} in pod["volumes"]
    assert container["resources"]["limits"] == {"cpu": "8", "memory": "48Gi", "nvidia.com/gpu": "2"}
    assert container["resources"]["requests"] == container["resources"]["limits"]
    assert container["image"] == api.DEFAULT_ENGINE_IMAGE
    assert pod["nodeSelector"] == {"gpu": "a100"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}} in container[
        "env"
    ]
    assert any(v.get("emptyDir", {}).get("medium") == "Memory" for v in pod["volumes"])  # /dev/shm for NCCL
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}
    assert pod["automountServiceAccountToken"] is False
    assert children.engine_deployment(pool)["spec"]["replicas"] == 3


def test_cpu_engine_has_no_gpu_and_mounts_its_claim() -> None:
    pool = make_pool(CPU_POOL)
    pod = children.engine_deployment(pool)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert "nvidia.com/gpu" not in str(container["resources"])
    assert container["image"] == api.DEFAULT_ENGINE_CPU_IMAGE
    assert container["args"][container["args"].index("--model") + 1] == "/models/smollm2"
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in container["volumeMounts"]
    assert {"name": "models", "persistentVolumeClaim": {"claimName": "weights", "readOnly": True}} in pod[
        "volumes"
    ]
    assert "--" not in container["args"]  # no vLLM arguments to pass


def test_router_is_wired_to_engines_classes_and_its_secret() -> None:
    pool = make_pool(GPU_POOL)
    kids = by_kind(pool)
    router = kids[("Deployment", "pool-router")]["spec"]["template"]["spec"]
    (container,) = router["containers"]
    args = container["args"]
    assert args[0] == "router"
    selector = dict(kv.split("=") for kv in args[args.index("--engine-selector") + 1].split(","))
    engine_labels = kids[("Deployment", "pool-engine")]["spec"]["template"]["metadata"]["labels"]
    assert _matches(selector, engine_labels)
    assert args[args.index("--namespace") + 1] == "ns"
    assert args[args.index("--classes-configmap") + 1] == "pool-classes"
    assert args[args.index("--default-class") + 1] == "latency"
    assert args[args.index("--auth-secret") + 1] == "keys"
    assert args[args.index("--k") + 1] == "2"
    assert args[args.index("--port") + 1] == "9000"
    assert router["serviceAccountName"] == "pool-router"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # The ConfigMap it names exists and holds the pool's classes.
    classes, default = parse_classes(kids[("ConfigMap", "pool-classes")]["data"], "pool-classes")
    assert sorted(classes) == ["best-effort", "latency"] and default == "latency"
    assert classes["latency"] == PAPER_CLASSES["latency"]


def test_router_rbac_is_least_privilege() -> None:
    kids = by_kind(make_pool(GPU_POOL))
    rules = kids[("Role", "pool-router")]["rules"]
    granted = {
        (r["apiGroups"][0], res, verb, tuple(r.get("resourceNames", [])))
        for r in rules
        for res in r["resources"]
        for verb in r["verbs"]
    }
    assert ("", "pods", "watch", ()) in granted
    assert ("", "configmaps", "get", ("pool-classes",)) in granted
    assert ("", "secrets", "get", ("keys",)) in granted
    assert not any(verb in ("create", "update", "patch", "delete") for _, _, verb, _ in granted)
    assert not any(res == "secrets" and not names for _, res, _, names in granted)
    binding = kids[("RoleBinding", "pool-router")]
    assert binding["roleRef"]["name"] == "pool-router"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "pool-router", "namespace": "ns"}]
    no_auth = by_kind(make_pool({**GPU_POOL, "router": {"replicas": 1}}))
    assert all("secrets" not in r["resources"] for r in no_auth[("Role", "pool-router")]["rules"])


def test_pods_do_not_restart_when_classes_change() -> None:
    """Router and engines read the ConfigMap live: a class edit must leave both Deployments identical."""
    pool = make_pool(GPU_POOL)
    edited = dict(pool.classes, latency=PAPER_CLASSES["latency"].model_copy(update={"ttftSeconds": 0.5}))
    changed = Pool(pool.name, pool.namespace, pool.uid, pool.spec, edited, pool.default_class, pool.images)
    assert children.router_deployment(changed) == children.router_deployment(pool)
    assert children.engine_deployment(changed) == children.engine_deployment(pool)
    assert children.classes_configmap(changed) != children.classes_configmap(pool)


def test_images_follow_operator_defaults_and_spec_overrides() -> None:
    images = Images(engine="reg/e:1", engine_cpu="reg/ecpu:1", router="reg/r:1")
    spec = ServingPoolSpec.model_validate(GPU_POOL)
    pool = Pool(
        "p", "ns", "u", spec, {c: PAPER_CLASSES[c] for c in ("latency", "best-effort")}, "latency", images
    )
    assert children.engine_image(pool) == "reg/e:1"
    assert children.router_deployment(pool)["spec"]["template"]["spec"]["containers"][0]["image"] == "reg/r:1"
    custom = ServingPoolSpec.model_validate(
        {**GPU_POOL, "engine": {"image": "mine:2"}, "router": {"image": "r:2"}}
    )
    pool = Pool("p", "ns", "u", custom, pool.classes, "latency", images)
    assert children.engine_image(pool) == "mine:2"
    assert children.router_deployment(pool)["spec"]["template"]["spec"]["containers"][0]["image"] == "r:2"


def test_tensor_parallel_flag_is_not_duplicated() -> None:
    spec = ServingPoolSpec.model_validate(
        {**GPU_POOL, "engine": {"extraArgs": ["--tensor-parallel-size", "1"]}}
    )
    assert engine_args(spec, "latency").count("--tensor-parallel-size") == 1


def test_router_args_without_optional_flags() -> None:
    spec = ServingPoolSpec.model_validate(CPU_POOL)
    args = router_args("p", "ns", spec, "deadline")
    assert "--auth-secret" not in args and "--k" not in args


def test_the_schema_check_itself_rejects_a_broken_child() -> None:
    broken = children.engine_deployment(make_pool(GPU_POOL))
    broken["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "http"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_engine_args_are_accepted_by_the_engine_cli() -> None:
    """The pool's scheduler settings must reach the engine's GMAX, not just the pod spec: parse the
    operator's args with `jitserve engine`'s own parser and follow them into the engine's settings."""
    import argparse

    from jitserve.engine.cli import add_arguments, build_command
    from jitserve.engine.settings import SchedulerSettings

    args = engine_args(ServingPoolSpec.model_validate(GPU_POOL), "latency")
    split = args.index("--")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    parsed = parser.parse_args([*args[1:split], "--device", "gpu"])
    _, env = build_command(parsed, args[split:])
    config = SchedulerSettings.from_env(env)  # what the engine process hands its runner
    assert (config.frame_steps, config.cutoff, config.starvation_delta, config.preemption) == (
        25, 0.9, 0.5, "recompute",
    )  # fmt: skip
    assert config.class_fairness == 0.25
    assert parsed.max_num_seqs == 64 and config.default_class == "latency"
