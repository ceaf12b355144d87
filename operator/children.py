"""A ServingPool's children as pure functions of its spec (no API calls, no clock).

Every function returns a plain manifest dict; `desired_children` returns them all, in the order the
operator creates them (the ConfigMap and RBAC before the pods that read them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jitserve.operator import api
from jitserve.operator.commands import CLASSES_MOUNT, MODELS_MOUNT, engine_args, router_args
from jitserve.operator.models import EngineBackend, ModelSource, ServingPoolSpec
from jitserve.scheduler.contracts.classes_configmap import render_classes
from jitserve.scheduler.slo import SLOClassSpec

Manifest = dict[str, Any]

GPU_RESOURCE = "nvidia.com/gpu"
CACHE_MOUNT = "/cache"


@dataclass(frozen=True)
class Images:
    """The operator's default images (flags of `jitserve operator`); a pool's spec may override."""

    engine: str = api.DEFAULT_ENGINE_IMAGE
    engine_cpu: str = api.DEFAULT_ENGINE_CPU_IMAGE
    router: str = api.DEFAULT_ROUTER_IMAGE


@dataclass(frozen=True)
class Pool:
    """Everything the children depend on: the pool's identity, its spec and its resolved classes."""

    name: str
    namespace: str
    uid: str
    spec: ServingPoolSpec
    classes: dict[str, SLOClassSpec]
    default_class: str
    images: Images = field(default_factory=Images)

    @property
    def endpoint(self) -> str:
        svc = api.router_name(self.name)
        return f"http://{svc}.{self.namespace}.svc.cluster.local:{self.spec.router.port}/v1"


def _meta(pool: Pool, name: str, component: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": pool.namespace,
        "labels": api.pool_labels(pool.name, component),
        # controller=True: `kubectl get` shows the pool as the owner; the garbage collector deletes
        # children with the pool, so deletion needs no finalizer.
        "ownerReferences": [
            {
                "apiVersion": api.API_VERSION,
                "kind": api.SERVINGPOOL_KIND,
                "name": pool.name,
                "uid": pool.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }


def _restricted_container_security() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
    }


def _pod_security() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "fsGroup": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _http_probe(path: str, period: int, failures: int, timeout: int = 5) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": timeout,
    }


def _engine_resources(spec: ServingPoolSpec) -> dict[str, Any]:
    amounts: dict[str, Any] = {}
    if spec.resources.cpu is not None:
        amounts["cpu"] = str(spec.resources.cpu)
    if spec.resources.memory is not None:
        amounts["memory"] = str(spec.resources.memory)
    if spec.engine.backend is EngineBackend.VLLM and spec.gpus > 0:
        amounts[GPU_RESOURCE] = str(spec.gpus)
    # requests == limits: an engine sized for its KV cache should neither be throttled nor evicted first.
    return {"requests": dict(amounts), "limits": dict(amounts)} if amounts else {}


def engine_image(pool: Pool) -> str:
    if pool.spec.engine.image:
        return pool.spec.engine.image
    cpu = pool.spec.engine.backend is EngineBackend.VLLM_CPU
    return pool.images.engine_cpu if cpu else pool.images.engine


def engine_deployment(pool: Pool) -> Manifest:
    spec = pool.spec
    env: list[dict[str, Any]] = [
        {"name": "HF_HOME", "value": f"{CACHE_MOUNT}/huggingface"},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ]
    if spec.model.hfTokenSecret:
        env.append(
            {
                "name": "HF_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": spec.model.hfTokenSecret, "key": "token"}},
            }
        )
    volumes: list[dict[str, Any]] = [
        {"name": "cache", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
        # Mounted by name: an edited class reaches the file without changing the pod template.
        {"name": "classes", "configMap": {"name": api.classes_configmap_name(pool.name)}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "cache", "mountPath": CACHE_MOUNT},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "classes", "mountPath": CLASSES_MOUNT, "readOnly": True},
    ]
    if spec.engine.backend is EngineBackend.VLLM:
        # NCCL and vLLM's workers share tensors through /dev/shm; the container default (64 MiB) is too small.
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    if spec.model.source is ModelSource.PVC and spec.model.pvc is not None:
        volumes.append(
            {
                "name": "models",
                "persistentVolumeClaim": {"claimName": spec.model.pvc.claimName, "readOnly": True},
            }
        )
        mounts.append({"name": "models", "mountPath": MODELS_MOUNT, "readOnly": True})
    container: dict[str, Any] = {
        "name": "engine",
        "image": engine_image(pool),
        "command": ["jitserve"],
        "args": engine_args(spec, pool.default_class),
        "ports": [{"name": "http", "containerPort": api.ENGINE_PORT, "protocol": "TCP"}],
        "env": env,
        "resources": _engine_resources(spec),
        # Loading weights can take many minutes: the startup probe allows 30, then liveness takes over.
        "startupProbe": _http_probe("/health", period=10, failures=180),
        "readinessProbe": _http_probe("/health", period=5, failures=3),
        "livenessProbe": _http_probe("/health", period=15, failures=4),
        "volumeMounts": mounts,
        "securityContext": _restricted_container_security(),
    }
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,  # engines never call the API server
        "securityContext": _pod_security(),
        "terminationGracePeriodSeconds": 60,
        "containers": [container],
        "volumes": volumes,
    }
    if spec.nodeSelector:
        pod_spec["nodeSelector"] = dict(spec.nodeSelector)
    if spec.tolerations:
        pod_spec["tolerations"] = [t.model_dump(exclude_none=True) for t in spec.tolerations]
    labels = api.pool_labels(pool.name, "engine")
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(pool, api.engine_name(pool.name), "engine"),
        "spec": {
            "replicas": spec.replicas,
            # Longer than the startup probe's 30 minutes: loading weights is progress too.
            "progressDeadlineSeconds": spec.progressDeadlineSeconds,
            "selector": {"matchLabels": api.selector_labels(pool.name, "engine")},
            # No surge: a GPU pool rarely has a spare GPU for an extra pod during a rollout.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def engine_service(pool: Pool) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(pool, api.engine_name(pool.name), "engine"),
        "spec": {
            "type": "ClusterIP",
            "selector": api.selector_labels(pool.name, "engine"),
            "ports": [{"name": "http", "port": api.ENGINE_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def classes_configmap(pool: Pool) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(pool, api.classes_configmap_name(pool.name), "router"),
        "data": render_classes(pool.classes, pool.default_class),
    }


def router_service_account(pool: Pool) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(pool, api.router_name(pool.name), "router"),
    }


def router_role(pool: Pool) -> Manifest:
    """Least privilege: discover this namespace's engine pods, read only its own ConfigMap and Secret."""
    rules: list[dict[str, Any]] = [
        {"apiGroups": [""], "resources": ["pods", "endpoints"], "verbs": ["get", "list", "watch"]},
        {
            "apiGroups": ["discovery.k8s.io"],
            "resources": ["endpointslices"],
            "verbs": ["get", "list", "watch"],
        },
        # list/watch with resourceNames need a metadata.name field selector on the router's side.
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [api.classes_configmap_name(pool.name)],
            "verbs": ["get", "list", "watch"],
        },
    ]
    if pool.spec.router.authSecret:
        rules.append(
            {
                "apiGroups": [""],
                "resources": ["secrets"],
                "resourceNames": [pool.spec.router.authSecret],
                "verbs": ["get", "list", "watch"],
            }
        )
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(pool, api.router_name(pool.name), "router"),
        "rules": rules,
    }


def router_role_binding(pool: Pool) -> Manifest:
    name = api.router_name(pool.name)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(pool, name, "router"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": pool.namespace}],
    }


def router_deployment(pool: Pool) -> Manifest:
    spec = pool.spec
    container: dict[str, Any] = {
        "name": "router",
        "image": spec.router.image or pool.images.router,
        "command": ["jitserve"],
        "args": router_args(pool.name, pool.namespace, spec, pool.default_class),
        "ports": [{"name": "http", "containerPort": spec.router.port, "protocol": "TCP"}],
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "readinessProbe": _http_probe("/readyz", period=5, failures=3),
        "livenessProbe": _http_probe("/healthz", period=10, failures=3),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        "securityContext": {**_restricted_container_security(), "readOnlyRootFilesystem": True},
    }
    labels = api.pool_labels(pool.name, "router")
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(pool, api.router_name(pool.name), "router"),
        "spec": {
            "replicas": spec.router.replicas,
            # The router is ready once an engine is (/readyz): it waits as long as the engines do.
            "progressDeadlineSeconds": spec.progressDeadlineSeconds,
            "selector": {"matchLabels": api.selector_labels(pool.name, "router")},
            "template": {
                # No hash of the classes here on purpose: the router watches its ConfigMap, so an
                # edited SLOClass takes effect without restarting any pod.
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": api.router_name(pool.name),
                    "securityContext": _pod_security(),
                    "containers": [container],
                    "volumes": [{"name": "tmp", "emptyDir": {}}],
                },
            },
        },
    }


def router_service(pool: Pool) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(pool, api.router_name(pool.name), "router"),
        "spec": {
            "type": "ClusterIP",
            "selector": api.selector_labels(pool.name, "router"),
            "ports": [
                {"name": "http", "port": pool.spec.router.port, "targetPort": "http", "protocol": "TCP"}
            ],
        },
    }


def engine_network_policy(pool: Pool) -> Manifest:
    peers: list[dict[str, Any]] = [{"podSelector": {"matchLabels": api.selector_labels(pool.name, "router")}}]
    if pool.spec.networkPolicy.metricsNamespaces:
        peers.append(
            {
                "namespaceSelector": {
                    "matchExpressions": [
                        {
                            "key": "kubernetes.io/metadata.name",
                            "operator": "In",
                            "values": list(pool.spec.networkPolicy.metricsNamespaces),
                        }
                    ]
                }
            }
        )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(pool, api.engine_name(pool.name), "engine"),
        "spec": {
            "podSelector": {"matchLabels": api.selector_labels(pool.name, "engine")},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": peers, "ports": [{"port": api.ENGINE_PORT, "protocol": "TCP"}]}],
        },
    }


# Every kind of child, in creation order; `optional` children may be absent from a pool.
CHILD_KINDS: list[tuple[str, str]] = [
    ("v1", "ConfigMap"),
    ("v1", "ServiceAccount"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("v1", "Service"),
    ("apps/v1", "Deployment"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
]


def desired_children(pool: Pool) -> list[Manifest]:
    """All children of the pool, in creation order."""
    children = [
        classes_configmap(pool),
        router_service_account(pool),
        router_role(pool),
        router_role_binding(pool),
        engine_service(pool),
        router_service(pool),
        engine_deployment(pool),
        router_deployment(pool),
    ]
    if pool.spec.networkPolicy.enabled:
        children.append(engine_network_policy(pool))
    return children


def unwanted_children(pool: Pool) -> list[tuple[str, str, str]]:
    """(apiVersion, kind, name) of children a previous spec may have created but this one does not."""
    if pool.spec.networkPolicy.enabled:
        return []
    return [("networking.k8s.io/v1", "NetworkPolicy", api.engine_name(pool.name))]
