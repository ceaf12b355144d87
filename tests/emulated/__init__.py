"""The emulated Kubernetes cluster of the tests: kmock extended into an API server (apiserver.py),
CRD admission with OpenAPI and CEL (admission.py), a thread runner with a kubeconfig (cluster.py)
and emulated built-in controllers (controllers.py). Reused by the e2e tests and bench/operator_apply.py.
"""

from .apiserver import EmulatedApiServer
from .cluster import EmulatedCluster, kubeconfig_env
from .controllers import EmulatedDeploymentController
from .kubectl import Kubectl, wait_for

__all__ = [
    "EmulatedApiServer",
    "EmulatedCluster",
    "EmulatedDeploymentController",
    "Kubectl",
    "kubeconfig_env",
    "wait_for",
]
