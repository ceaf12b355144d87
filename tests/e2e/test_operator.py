"""The operator end to end against the emulated API server: kubectl applies, kopf reconciles.

One operator (kopf, in this process) serves the whole module; each test uses its own pool and
namespace so the tests do not depend on each other's order. Deployments report ready pods through
the emulated Deployment controller (no pods run here).

Why emulated: no Kubernetes API server can run on this machine (no container runtime for kind or k3s,
no network for a cluster); tests/emulated is the API server's one stand-in, kept faithful to
kube-apiserver 1.35 and tested as such in test_emulated_apiserver.py (docs/decisions/emulated-apiserver.md).
Kopf, the kubernetes client, kubectl and the operator are all real.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from jitserve.operator import api, runtime
from jitserve.operator.reconciler import Reconciler
from tests.emulated import EmulatedCluster, EmulatedDeploymentController, Kubectl, wait_for

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]

CHILDREN = [
    ("v1", "ConfigMap", "classes"),
    ("v1", "ServiceAccount", "router"),
    ("rbac.authorization.k8s.io/v1", "Role", "router"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding", "router"),
    ("v1", "Service", "engine"),
    ("v1", "Service", "router"),
    ("apps/v1", "Deployment", "engine"),
    ("apps/v1", "Deployment", "router"),
    ("networking.k8s.io/v1", "NetworkPolicy", "engine"),
]

STUCK: set[str] = set()

ROUTER_REPORT = {
    "classes": {"latency": {"goodput": 812.5, "attainment": 0.97}, "deadline": {"goodput": 90.0}}
}


class _RouterStatusStandIn(http.server.BaseHTTPRequestHandler):
    """Answers GET /<namespace>/<pool>/jitserve/status like a router; 'down' pools get no answer."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if "/down-" in self.path:
            self.send_error(503)
            return
        body = json.dumps(ROUTER_REPORT).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def router_status_url() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RouterStatusStandIn)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/{{namespace}}/{{pool}}/jitserve/status"
    server.shutdown()


class Operator:
    """Start and stop the operator (kopf --standalone, in this process) at will."""

    def __init__(self, kube: Any, router_status_url: str) -> None:
        self.results: list[tuple[str, str, bool, Any]] = []  # every reconcile the operator finished
        reconciler = Reconciler(
            kube, router_status_url=router_status_url, on_result=lambda *r: self.results.append(r)
        )
        runtime.configure(reconciler, resync_seconds=0.3)
        import jitserve.operator.handlers  # noqa: F401 - registers with the configuration above

        self.runner: Any = None

    def start(self) -> None:
        from kopf.testing import KopfRunner

        self.runner = KopfRunner(["run", "--standalone", "-A", "-m", "jitserve.operator.handlers"])
        self.runner.__enter__()

    def stop(self) -> str:
        assert self.runner is not None
        self.runner.__exit__(None, None, None)
        assert self.runner.exception is None, self.runner.output
        return self.runner.output

    def reconciled(self, ns: str, name: str, read_router: bool) -> list[Any]:
        return [r for n, p, rr, r in list(self.results) if (n, p, rr) == (ns, name, read_router)]


@pytest.fixture(scope="module")
def operator(
    emulated_cluster: EmulatedCluster, kube: Any, kubectl: Kubectl, router_status_url: str
) -> Iterator[Operator]:
    kubectl.apply(ROOT / "crds")
    kubectl.apply(ROOT / "docs" / "examples" / "slo-class.yaml")
    op = Operator(kube, router_status_url)
    # Deployments in STUCK namespaces never get ready pods (a rollout that cannot finish).
    with EmulatedDeploymentController(kube, ready=lambda dep: dep["metadata"]["namespace"] not in STUCK):
        op.start()
        yield op
        op.stop()


def namespace(kubectl: Kubectl, name: str) -> str:
    kubectl.apply(f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: {name}}}\n")
    return name


def example_pool(name: str, ns: str, **spec: Any) -> str:
    doc = yaml.safe_load((ROOT / "docs" / "examples" / "servingpool.yaml").read_text())
    doc["metadata"] = {"name": name, "namespace": ns}
    doc["spec"].update(spec)
    return yaml.safe_dump(doc)


def pool(kube: Any, ns: str, name: str) -> dict[str, Any]:
    obj = kube.get(api.API_VERSION, api.SERVINGPOOL_KIND, ns, name)
    assert obj is not None
    return obj


def condition(obj: dict[str, Any], ctype: str) -> dict[str, Any]:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond["type"] == ctype:
            return cond
    return {}


def children(kube: Any, ns: str, name: str) -> dict[str, dict[str, Any] | None]:
    return {
        f"{kind}/{name}-{suffix}": kube.get(version, kind, ns, f"{name}-{suffix}")
        for version, kind, suffix in CHILDREN
    }


def test_apply_creates_every_child_and_reports_ready(operator: Operator, kube: Any, kubectl: Kubectl) -> None:
    ns = namespace(kubectl, "create")
    kubectl.apply(example_pool("llama", ns))
    kubectl("wait", "--for=condition=Ready", "servingpool/llama", "-n", ns, "--timeout=60s")

    obj = pool(kube, ns, "llama")
    kids = children(kube, ns, "llama")
    assert all(kids.values()), [k for k, v in kids.items() if v is None]
    for child in kids.values():
        assert child is not None
        refs = child["metadata"]["ownerReferences"]
        assert refs == [
            {
                "apiVersion": api.API_VERSION,
                "kind": "ServingPool",
                "name": "llama",
                "uid": obj["metadata"]["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        assert child["metadata"]["labels"]["app.kubernetes.io/instance"] == "llama"
    status = obj["status"]
    assert status["observedGeneration"] == obj["metadata"]["generation"]
    assert status["readyReplicas"] == 2 and status["replicas"] == 2
    assert status["endpoint"] == f"http://llama-router.{ns}.svc.cluster.local:8080/v1"
    assert condition(obj, "Degraded")["status"] == "False"
    # The ConfigMap carries the SLOClasses exactly as applied (defaults filled in by the CRD schema).
    cm = kids["ConfigMap/llama-classes"]
    assert cm is not None
    classes = json.loads(cm["data"]["classes.json"])
    assert sorted(classes) == ["best-effort", "compound", "deadline", "latency"]
    assert classes["latency"]["ttftSeconds"] == 2 and classes["latency"]["tbtSeconds"] == 0.1
    assert cm["data"]["default"] == "best-effort"
    # SLOClass status names the pools that use it.
    wait_for(
        lambda: (
            f"{ns}/llama"
            in ((kube.get(api.API_VERSION, "SLOClass", None, "latency") or {}).get("status") or {}).get(
                "pools", []
            )
        ),
        what="SLOClass status listing the pool",
    )
    # kubectl shows the pool by its short name.
    assert "llama" in kubectl("get", "sp", "-n", ns).stdout


def test_scale_changes_engine_replicas(operator: Operator, kube: Any, kubectl: Kubectl) -> None:
    ns = namespace(kubectl, "scale")
    kubectl.apply(example_pool("pool", ns))
    kubectl("wait", "--for=condition=Ready", "servingpool/pool", "-n", ns, "--timeout=60s")
    router_before = kube.get("apps/v1", "Deployment", ns, "pool-router")["metadata"]["resourceVersion"]

    kubectl("scale", "servingpool/pool", "-n", ns, "--replicas=5")
    wait_for(
        lambda: kube.get("apps/v1", "Deployment", ns, "pool-engine")["spec"]["replicas"] == 5,
        what="scale-out",
    )
    obj = wait_for(
        lambda: ((o := pool(kube, ns, "pool")).get("status") or {}).get("readyReplicas") == 5 and o,
        what="5 ready engines",
    )
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]
    assert condition(obj, "Ready")["status"] == "True"
    # Scaling engines touches nothing else.
    assert (
        kube.get("apps/v1", "Deployment", ns, "pool-router")["metadata"]["resourceVersion"] == router_before
    )


def test_update_propagates_to_children(operator: Operator, kube: Any, kubectl: Kubectl) -> None:
    ns = namespace(kubectl, "update")
    kubectl.apply(example_pool("pool", ns))
    kubectl("wait", "--for=condition=Ready", "servingpool/pool", "-n", ns, "--timeout=60s")
    kubectl.apply(
        example_pool(
            "pool", ns, scheduler={"frameSteps": 25, "cutoff": 0.9}, networkPolicy={"enabled": False}
        )
    )

    def engine() -> dict[str, Any]:
        dep = kube.get("apps/v1", "Deployment", ns, "pool-engine")
        return dep["spec"]["template"]["spec"]["containers"][0]

    container = wait_for(
        lambda: "25" in engine()["args"] and engine(), what="new frame steps in the engine args"
    )
    assert container["args"][container["args"].index("--frame-steps") + 1] == "25"
    assert container["args"][container["args"].index("--cutoff") + 1] == "0.9"
    wait_for(
        lambda: kube.get("networking.k8s.io/v1", "NetworkPolicy", ns, "pool-engine") is None,
        what="policy removed",
    )


def test_edited_slo_class_reaches_configmap_without_restart(
    operator: Operator, kube: Any, kubectl: Kubectl
) -> None:
    ns = namespace(kubectl, "classes")
    kubectl.apply(
        "apiVersion: jitserve.dev/v1alpha1\nkind: SLOClass\nmetadata: {name: chat}\n"
        "spec: {type: latency, ttftSeconds: 1.0, tbtSeconds: 0.05}\n"
    )
    kubectl.apply(
        example_pool("pool", ns, sloClasses={"allowed": ["chat", "best-effort"], "default": "chat"})
    )
    kubectl("wait", "--for=condition=Ready", "servingpool/pool", "-n", ns, "--timeout=60s")
    router = kube.get("apps/v1", "Deployment", ns, "pool-router")
    engine = kube.get("apps/v1", "Deployment", ns, "pool-engine")

    kubectl("patch", "sloclass/chat", "--type=merge", "-p", '{"spec": {"ttftSeconds": 0.5}}')

    def chat_ttft() -> float:
        cm = kube.get("v1", "ConfigMap", ns, "pool-classes")
        return json.loads(cm["data"]["classes.json"])["chat"]["ttftSeconds"]

    wait_for(lambda: chat_ttft() == 0.5, what="the edited class in the pool's ConfigMap")
    # The router reads its ConfigMap live: its Deployment (and so its pods) was not touched.
    after = kube.get("apps/v1", "Deployment", ns, "pool-router")
    assert after["metadata"]["resourceVersion"] == router["metadata"]["resourceVersion"]
    assert after["spec"]["template"] == router["spec"]["template"]
    # Nor were the engines' (they re-read the mounted ConfigMap file).
    after_engine = kube.get("apps/v1", "Deployment", ns, "pool-engine")
    assert after_engine["metadata"]["resourceVersion"] == engine["metadata"]["resourceVersion"]


def test_missing_slo_class_is_reported_and_nothing_is_deployed(
    operator: Operator, kube: Any, kubectl: Kubectl
) -> None:
    ns = namespace(kubectl, "missing")
    kubectl.apply(example_pool("pool", ns, sloClasses={"allowed": ["latency", "gold"]}))
    obj = wait_for(
        lambda: (o := pool(kube, ns, "pool")) and condition(o, "Degraded") and o, what="a Degraded condition"
    )
    degraded = condition(obj, "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "SLOClassNotFound"
    assert "gold" in degraded["message"] and "latency" not in degraded["message"]
    assert condition(obj, "Ready")["status"] == "False"
    assert not any(children(kube, ns, "pool").values()), "nothing may be deployed half-way"

    # Creating the class heals the pool without touching it.
    kubectl.apply(
        "apiVersion: jitserve.dev/v1alpha1\nkind: SLOClass\nmetadata: {name: gold}\n"
        "spec: {type: deadline, deadlineSeconds: 5}\n"
    )
    kubectl("wait", "--for=condition=Ready", "servingpool/pool", "-n", ns, "--timeout=60s")
    assert all(children(kube, ns, "pool").values())


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"replicas": -1}, "spec.replicas"),
        (
            {"sloClasses": {"allowed": ["latency"], "default": "deadline"}},
            "sloClasses.default must be one of sloClasses.allowed",
        ),
        ({"engine": {"backend": "vllm-cpu"}, "resources": {"gpus": 1}}, "vllm-cpu takes no GPUs"),
        ({"model": {"source": "pvc", "servedName": "m"}}, "model.source pvc needs model.pvc.claimName"),
        ({"engine": {"backend": "tpu"}}, "spec.engine.backend"),
        # What a real API server would refuse in the Deployment: refused on the pool itself.
        ({"resources": {"gpus": 1, "cpu": "banana"}}, "spec.resources.cpu"),
        ({"resources": {"gpus": 1, "memory": "48 GB"}}, "spec.resources.memory"),
        ({"nodeSelector": {"disk": "fast ssd"}}, "spec.nodeSelector.disk"),
        ({"router": {"authSecret": "Keys_Prod"}}, "spec.router.authSecret"),
        ({"networkPolicy": {"metricsNamespaces": ["Monitoring"]}}, "spec.networkPolicy.metricsNamespaces[0]"),
        ({"tolerations": [{"key": "gpu", "operator": "Exists", "value": "x"}]}, "spec.tolerations[0].value"),
    ],
)
def test_invalid_pool_is_rejected_with_a_clear_message(
    operator: Operator, kube: Any, kubectl: Kubectl, spec: dict[str, Any], message: str
) -> None:
    result = kubectl.apply(example_pool("bad", "default", **spec), check=False)
    assert result.returncode != 0
    assert 'The ServingPool "bad" is invalid' in result.stderr and message in result.stderr, result.stderr
    assert kube.get(api.API_VERSION, api.SERVINGPOOL_KIND, "default", "bad") is None


def test_invalid_slo_class_is_rejected_with_a_clear_message(
    operator: Operator, kube: Any, kubectl: Kubectl
) -> None:
    result = kubectl.apply(
        "apiVersion: jitserve.dev/v1alpha1\nkind: SLOClass\nmetadata: {name: broken}\n"
        "spec: {type: latency, tbtSeconds: 0.1}\n",
        check=False,
    )
    assert result.returncode != 0
    assert "a latency class needs ttftSeconds" in result.stderr
    assert "tbtSeconds needs ttftSeconds" in result.stderr
    assert kube.get(api.API_VERSION, "SLOClass", None, "broken") is None


def test_router_goodput_reaches_status_and_an_unreachable_router_is_tolerated(
    operator: Operator, kube: Any, kubectl: Kubectl
) -> None:
    ns = namespace(kubectl, "goodput")
    kubectl.apply(example_pool("up-pool", ns))
    kubectl.apply(example_pool("down-pool", ns))
    obj = wait_for(
        lambda: ((o := pool(kube, ns, "up-pool")).get("status") or {}).get("classes") and o,
        what="router report",
    )
    assert obj["status"]["classes"] == [
        {"name": "deadline", "goodput": 90.0},
        {"name": "latency", "goodput": 812.5, "attainment": 0.97},
    ]
    assert obj["status"]["classesUpdated"]
    kubectl("wait", "--for=condition=Ready", "servingpool/down-pool", "-n", ns, "--timeout=60s")
    down = pool(kube, ns, "down-pool")
    assert "classes" not in down["status"] and condition(down, "Degraded")["status"] == "False"


def test_restart_changes_nothing(
    operator: Operator, emulated_cluster: EmulatedCluster, kube: Any, kubectl: Kubectl
) -> None:
    ns = namespace(kubectl, "restart")
    kubectl.apply(example_pool("pool", ns))
    kubectl("wait", "--for=condition=Ready", "servingpool/pool", "-n", ns, "--timeout=60s")
    wait_for(
        lambda: (pool(kube, ns, "pool").get("status") or {}).get("classes"), what="the first router report"
    )
    operator.stop()
    before = {
        (o["kind"], o["metadata"]["name"]): o["metadata"]["resourceVersion"]
        for o in emulated_cluster.objects(namespace=ns)
    }

    operator.results.clear()
    operator.start()
    # Wait until the restarted operator has resumed the pool and resynced it (router read included).
    wait_for(lambda: operator.reconciled(ns, "pool", read_router=False), what="the resume of the pool")
    wait_for(lambda: operator.reconciled(ns, "pool", read_router=True), what="a resync of the pool")
    after = {
        (o["kind"], o["metadata"]["name"]): o["metadata"]["resourceVersion"]
        for o in emulated_cluster.objects(namespace=ns)
    }
    assert after == before  # not one object written, the pool and its status included
    assert all(not r.changes and not r.status_written for _, _, _, r in operator.results if r is not None)


def test_delete_removes_everything(
    operator: Operator, emulated_cluster: EmulatedCluster, kube: Any, kubectl: Kubectl
) -> None:
    ns = namespace(kubectl, "delete")
    kubectl.apply(example_pool("pool", ns))
    kubectl("wait", "--for=condition=Ready", "servingpool/pool", "-n", ns, "--timeout=60s")

    def not_events() -> list[dict[str, Any]]:  # Events are not owned: they expire by their TTL
        return [o for o in emulated_cluster.objects(namespace=ns) if o["kind"] != "Event"]

    assert len(not_events()) == 1 + len(CHILDREN)

    kubectl("delete", "servingpool/pool", "-n", ns, "--timeout=60s")
    wait_for(lambda: not_events() == [], what="the garbage collector")
    # No finalizer was needed: the pool never carried one.
    assert not any(
        "finalizers" in o["metadata"] for o in emulated_cluster.objects(plural=api.SERVINGPOOL_PLURAL)
    )
    wait_for(
        lambda: (
            f"{ns}/pool"
            not in ((kube.get(api.API_VERSION, "SLOClass", None, "latency") or {}).get("status") or {}).get(
                "pools", []
            )
        ),
        what="the SLOClass status forgetting the pool",
    )


def events_of(kube: Any, ns: str, name: str) -> list[dict[str, Any]]:
    return [
        e
        for e in kube.list("v1", "Event", ns)
        if e["involvedObject"].get("kind") == api.SERVINGPOOL_KIND and e["involvedObject"]["name"] == name
    ]


def test_hand_edits_of_children_are_repaired(operator: Operator, kube: Any, kubectl: Kubectl) -> None:
    ns = namespace(kubectl, "drift")
    kubectl.apply(example_pool("pool", ns))
    kubectl("wait", "--for=condition=Ready", "servingpool/pool", "-n", ns, "--timeout=60s")
    role_before = kube.get("rbac.authorization.k8s.io/v1", "Role", ns, "pool-router")["rules"]

    # What the issue did by hand: scale the engines behind the pool's back, widen the router's Role.
    kubectl("patch", "deployment/pool-engine", "-n", ns, "--type=merge", "-p", '{"spec": {"replicas": 9}}')
    kubectl(
        "patch", "role/pool-router", "-n", ns, "--type=json",
        "-p", '[{"op": "add", "path": "/rules/-", "value": {"apiGroups": [""], "resources": ["secrets"], '
        '"verbs": ["get", "list"]}}]',
    )  # fmt: skip
    wait_for(
        lambda: kube.get("apps/v1", "Deployment", ns, "pool-engine")["spec"]["replicas"] == 2,
        what="the engine Deployment back at the pool's 2 replicas",
    )
    wait_for(
        lambda: kube.get("rbac.authorization.k8s.io/v1", "Role", ns, "pool-router")["rules"] == role_before,
        what="the router's Role back to its own rules",
    )
    repaired = wait_for(
        lambda: (
            {e["message"] for e in events_of(kube, ns, "pool") if e["reason"] == "DriftRepaired"}
            if len([e for e in events_of(kube, ns, "pool") if e["reason"] == "DriftRepaired"]) >= 2
            else None
        ),
        what="a DriftRepaired event for each child",
    )
    assert any("Deployment pool-engine" in m and "spec.replicas" in m for m in repaired), repaired
    assert any("Role pool-router" in m and "rules" in m for m in repaired), repaired
    assert all(e["type"] == "Warning" for e in events_of(kube, ns, "pool") if e["reason"] == "DriftRepaired")
    obj = pool(kube, ns, "pool")
    assert condition(obj, "Degraded")["status"] == "False" and condition(obj, "Ready")["status"] == "True"


def test_a_forbidden_child_is_degraded_with_the_reason_and_a_warning_event(
    operator: Operator, emulated_cluster: EmulatedCluster, kube: Any, kubectl: Kubectl
) -> None:
    """A Role the operator may not create (RBAC escalation check). The emulated API server has no
    authorization, so its create of Roles in this namespace is made to answer 403 as kube-apiserver
    does (a Status with reason Forbidden and the escalation message); the rest is the real path."""
    import kmock

    ns = namespace(kubectl, "forbidden")
    message = (
        'roles.rbac.authorization.k8s.io "pool-router" is forbidden: user "system:serviceaccount:'
        'jitserve-system:jitserve-operator" is attempting to grant RBAC permissions not currently held'
    )
    server = emulated_cluster.server
    assert server is not None
    original = server._prepare_create  # noqa: SLF001 - the emulator has no RBAC to configure instead

    def forbid_roles(request: Any) -> None:
        if request.resource.plural == "roles" and request.namespace == ns:
            raise kmock.KubernetesError(status=403, reason="Forbidden", message=message, details={})
        original(request)

    server._prepare_create = forbid_roles  # noqa: SLF001
    try:
        kubectl.apply(example_pool("pool", ns))
        obj = wait_for(
            lambda: (o := pool(kube, ns, "pool")) and condition(o, "Degraded").get("status") == "True" and o,
            what="Degraded=True",
        )
        degraded = condition(obj, "Degraded")
        assert degraded["reason"] == "Forbidden"
        assert (
            "applying Role pool-router" in degraded["message"] and "not currently held" in degraded["message"]
        )
        assert condition(obj, "Ready")["status"] == "False"
        # The other children went ahead: a refused Role does not hold back the engines.
        assert kube.get("apps/v1", "Deployment", ns, "pool-engine") is not None
        warnings = wait_for(
            lambda: [e for e in events_of(kube, ns, "pool") if e["type"] == "Warning"], what="a Warning event"
        )
        assert [e["reason"] for e in warnings] == ["Forbidden"]
        assert "not currently held" in warnings[0]["message"]
        assert warnings[0]["involvedObject"]["uid"] == obj["metadata"]["uid"]
    finally:
        server._prepare_create = original  # noqa: SLF001
    # Permissions granted: the resync creates the Role and the pool recovers by itself.
    kubectl("wait", "--for=condition=Ready", "servingpool/pool", "-n", ns, "--timeout=60s")
    obj = wait_for(
        lambda: (o := pool(kube, ns, "pool")) and condition(o, "Degraded").get("status") == "False" and o,
        what="Degraded=False",
    )
    assert kube.get("rbac.authorization.k8s.io/v1", "Role", ns, "pool-router") is not None
    wait_for(
        lambda: [
            e for e in events_of(kube, ns, "pool") if e["reason"] == "Recovered" and e["type"] == "Normal"
        ],
        what="a Normal Recovered event",
    )


def test_a_rollout_past_its_deadline_stops_reading_rolling_out(
    operator: Operator, kube: Any, kubectl: Kubectl
) -> None:
    ns = namespace(kubectl, "stuck")
    STUCK.add(ns)
    kubectl.apply(example_pool("pool", ns))
    # status.replicas: the pods the Deployment reports (2 exist, none ready), whatever the spec says.
    obj = wait_for(
        lambda: (
            (o := pool(kube, ns, "pool"))
            and condition(o, "Progressing").get("reason") == "RollingOut"
            and (o["status"].get("replicas"), o["status"].get("readyReplicas")) == (2, 0)
            and o
        ),
        what="a rollout under way with 2 pods, none ready",
    )
    assert condition(obj, "Ready")["reason"] == "EnginesNotReady"
    # What the Deployment controller writes once progressDeadlineSeconds pass without progress.
    exceeded = {
        "type": "Progressing",
        "status": "False",
        "reason": "ProgressDeadlineExceeded",
        "message": 'ReplicaSet "pool-engine-7d9f" has timed out progressing.',
    }
    kube.patch_status("apps/v1", "Deployment", ns, "pool-engine", {"conditions": [exceeded]})
    obj = wait_for(
        lambda: (o := pool(kube, ns, "pool")) and condition(o, "Progressing").get("status") == "False" and o,
        what="Progressing=False",
    )
    assert condition(obj, "Progressing")["reason"] == "ProgressDeadlineExceeded"
    assert "timed out progressing" in condition(obj, "Progressing")["message"]
    assert condition(obj, "Degraded")["reason"] == "ProgressDeadlineExceeded"
    wait_for(
        lambda: [e for e in events_of(kube, ns, "pool") if e["reason"] == "ProgressDeadlineExceeded"],
        what="a ProgressDeadlineExceeded event",
    )
    dep = kube.get("apps/v1", "Deployment", ns, "pool-engine")
    assert dep["spec"]["progressDeadlineSeconds"] == 2400
