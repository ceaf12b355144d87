"""Names of the operator's Kubernetes API: group, version, kinds, labels, child names.

One place for every string the CRDs, the children and the tests agree on.
"""

from __future__ import annotations

GROUP = "jitserve.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

SLOCLASS_KIND = "SLOClass"
SLOCLASS_PLURAL = "sloclasses"
SERVINGPOOL_KIND = "ServingPool"
SERVINGPOOL_PLURAL = "servingpools"

# The engine's port is fixed by the engine contract (`jitserve engine --port 8000`).
ENGINE_PORT = 8000
DEFAULT_ROUTER_PORT = 8080

# Default images; the operator's flags (or a pool's spec) override them.
DEFAULT_ENGINE_IMAGE = "jitserve/engine:0.1.0"
DEFAULT_ENGINE_CPU_IMAGE = "jitserve/engine-cpu:0.1.0"
DEFAULT_ROUTER_IMAGE = "jitserve/router:0.1.0"

MANAGED_BY = "jitserve-operator"
PART_OF = "jitserve"

# Annotation on every child: a hash of the manifest the operator last wrote. Equal hash -> no write,
# which is what makes reconciliation idempotent and an operator restart a no-op.
SPEC_HASH_ANNOTATION = f"{GROUP}/spec-hash"

# Longest pool name such that "<pool>-router" etc. stay valid DNS-1035 labels (63 characters).
MAX_POOL_NAME = 56


def engine_name(pool: str) -> str:
    return f"{pool}-engine"


def router_name(pool: str) -> str:
    return f"{pool}-router"


def classes_configmap_name(pool: str) -> str:
    return f"{pool}-classes"


def pool_labels(pool: str, component: str) -> dict[str, str]:
    """The recommended app.kubernetes.io labels of one component of one pool."""
    return {
        "app.kubernetes.io/name": "jitserve",
        "app.kubernetes.io/instance": pool,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": PART_OF,
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }


def selector_labels(pool: str, component: str) -> dict[str, str]:
    """The stable subset used in selectors (Deployment selectors are immutable: never add to this)."""
    return {
        "app.kubernetes.io/name": "jitserve",
        "app.kubernetes.io/instance": pool,
        "app.kubernetes.io/component": component,
    }


def selector_string(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
