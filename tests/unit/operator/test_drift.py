"""Drift against the live object (kube.drift / apply_child) and the Event recorder.

apply_child runs here against an in-memory stand-in of the API server because these tests need
to inject what the emulated server cannot be told to do on cue: a concurrent writer's 409 between
the read and the replace, and a failing Event write. The same code runs against the emulated API
server in tests/e2e/test_operator.py (hand edits repaired, a Forbidden Role reported)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from jitserve.operator import api
from jitserve.operator.children import Images, Pool, desired_children, engine_deployment, router_role
from jitserve.operator.events import WARNING, Event, EventRecorder, event_manifest
from jitserve.operator.kube import ApiError, apply_child, drift, owned_drift
from jitserve.operator.models import ServingPoolSpec
from jitserve.operator.reconciler import Reconciler, TransientApiError
from jitserve.scheduler.slo import PAPER_CLASSES

SPEC = ServingPoolSpec.model_validate(
    {
        "model": {"name": "org/m", "servedName": "m"},
        "replicas": 2,
        "resources": {"cpu": "1", "memory": "16Gi"},
        "sloClasses": {"allowed": ["latency"]},
    }
)
POOL = Pool("p", "ns", "uid-1", SPEC, {"latency": PAPER_CLASSES["latency"]}, "latency", Images())


def served(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest as a real API server returns it: defaults filled in, quantities canonical."""
    live = copy.deepcopy(manifest)
    live["metadata"].update(uid="u", resourceVersion="7", generation=1, creationTimestamp="T")
    if live["kind"] == "Deployment":
        spec = live["spec"]
        spec.update(revisionHistoryLimit=10)
        pod = spec["template"]["spec"]
        pod.update(dnsPolicy="ClusterFirst", restartPolicy="Always", schedulerName="default-scheduler")
        for c in pod["containers"]:
            c.update(imagePullPolicy="IfNotPresent", terminationMessagePath="/dev/termination-log")
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                if probe in c:
                    c[probe]["successThreshold"] = 1
                    c[probe]["httpGet"]["scheme"] = "HTTP"
            res = c.get("resources") or {}
            for part in ("requests", "limits"):
                if "cpu" in res.get(part, {}):
                    res[part]["cpu"] = "1000m" if res[part]["cpu"] == "1" else res[part]["cpu"]
        live["status"] = {"replicas": 2}
    return live


def test_server_defaults_and_canonical_quantities_are_not_drift() -> None:
    for child in desired_children(POOL):
        assert owned_drift(child, served(child)) == [], child["kind"]


def test_hand_edits_to_owned_fields_are_drift() -> None:
    dep = engine_deployment(POOL)
    live = served(dep)
    live["spec"]["replicas"] = 9
    assert owned_drift(dep, live) == ["spec.replicas"]
    live = served(dep)
    live["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "2"
    assert owned_drift(dep, live) == ["spec.template.spec.containers[0].resources.limits.cpu"]
    live = served(dep)
    live["spec"]["template"]["spec"]["containers"][0]["securityContext"]["privileged"] = True
    assert owned_drift(dep, live) == ["spec.template.spec.containers[0].securityContext"]
    live = served(dep)
    live["spec"]["template"]["spec"]["containers"].append({"name": "sidecar", "image": "x"})
    assert owned_drift(dep, live) == ["spec.template.spec.containers"]
    live = served(dep)
    del live["metadata"]["labels"]["app.kubernetes.io/instance"]
    assert owned_drift(dep, live) == ["metadata.labels.app.kubernetes.io/instance"]
    live = served(dep)
    live["metadata"]["labels"]["team"] = "x"  # someone else's label: not ours, not drift
    live["metadata"]["annotations"] = {"deployment.kubernetes.io/revision": "3"}
    assert owned_drift(dep, live) == []


def test_a_widened_role_is_drift() -> None:
    role = router_role(POOL)
    live = served(role)
    live["rules"][0]["verbs"].append("delete")
    assert owned_drift(role, live) == ["rules"]
    live = served(role)
    live["rules"].append({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]})
    assert owned_drift(role, live) == ["rules"]
    live = served(role)
    del live["rules"][2]["resourceNames"]  # every ConfigMap instead of its own
    assert owned_drift(role, live) == ["rules"]


def test_drift_of_plain_values() -> None:
    assert drift({"a": {"b": 1}}, {"a": {"b": 1, "c": 2}}) == []
    assert drift({"a": {"b": 1}}, {"a": {}}) == ["a.b"]
    assert drift({"a": []}, {}) == []  # empty lists and maps may be omitted by the server
    assert drift({"x": {"requests": {"memory": "1Gi"}}}, {"x": {"requests": {"memory": "1024Mi"}}}) == []
    assert drift({"x": {"requests": {"memory": "1Gi"}}}, {"x": {"requests": {"memory": "1G"}}}) != []
    assert drift({"name": "1Gi"}, {"name": "1024Mi"}) == ["name"]  # quantities only where they are


class FakeKube:
    """An in-memory API server: objects by (kind, name); optional failures injected per verb."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.writes: list[tuple[str, str]] = []
        self.rv = 0
        self.before_replace: list[Any] = []  # callables run before the next replaces (races)
        self.fail: dict[tuple[str, str], ApiError] = {}  # (verb, kind) -> error
        self.mutate: Any = None  # a mutating admission webhook: called on every object written

    def _stamp(self, obj: dict[str, Any]) -> dict[str, Any]:
        if self.mutate is not None:
            self.mutate(obj)
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.objects[(obj["kind"], obj["metadata"]["name"])] = copy.deepcopy(obj)
        return copy.deepcopy(obj)

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        obj = self.objects.get((kind, name))
        return copy.deepcopy(obj) if obj else None

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        if ("create", body["kind"]) in self.fail:
            raise self.fail[("create", body["kind"])]
        if (body["kind"], body["metadata"]["name"]) in self.objects:
            raise ApiError(409, "already exists", "AlreadyExists")
        self.writes.append(("create", body["metadata"]["name"]))
        return self._stamp(copy.deepcopy(body))

    def replace(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.before_replace:
            self.before_replace.pop(0)()
        live = self.objects[(body["kind"], body["metadata"]["name"])]
        if body["metadata"]["resourceVersion"] != live["metadata"]["resourceVersion"]:
            raise ApiError(409, "the object has been modified", "Conflict")
        self.writes.append(("replace", body["metadata"]["name"]))
        return self._stamp(copy.deepcopy(body))

    def patch_status(
        self, api_version: str, kind: str, namespace: str | None, name: str, status: Any
    ) -> None:
        obj = self.objects[(kind, name)]
        merged = {**(obj.get("status") or {}), **status}
        obj["status"] = {k: v for k, v in merged.items() if v is not None}

    def list(self, api_version: str, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        return [copy.deepcopy(o) for (k, _), o in self.objects.items() if k == kind]

    def patch(self, api_version: str, kind: str, namespace: str | None, name: str, body: Any) -> Any:
        self.writes.append(("patch", name))
        self.objects[(kind, name)].update(body)
        return self.objects[(kind, name)]


def test_apply_child_repairs_drift_and_writes_nothing_when_in_sync() -> None:
    kube = FakeKube()
    dep = engine_deployment(POOL)
    assert apply_child(kube, dep, "uid-1").outcome == "created"
    assert apply_child(kube, dep, "uid-1").outcome == "unchanged" and len(kube.writes) == 1
    kube.objects[("Deployment", "p-engine")]["spec"]["replicas"] = 9  # kubectl scale by hand
    done = apply_child(kube, dep, "uid-1")
    assert (done.outcome, done.drifted) == ("repaired", ["spec.replicas"])
    assert done.live["spec"]["replicas"] == 2 and kube.writes[-1] == ("replace", "p-engine")
    # The spec-hash annotation matched all along: the hash alone would have written nothing.
    assert api.SPEC_HASH_ANNOTATION in done.live["metadata"]["annotations"]
    assert apply_child(kube, dep, "uid-1").outcome == "unchanged"


def test_apply_child_keeps_others_annotations_and_retries_a_race() -> None:
    kube = FakeKube()
    dep = engine_deployment(POOL)
    apply_child(kube, dep, "uid-1")
    live = kube.objects[("Deployment", "p-engine")]
    live["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = "4"
    live["spec"]["replicas"] = 9

    def someone_writes() -> None:
        kube.objects[("Deployment", "p-engine")]["metadata"]["resourceVersion"] = "race"

    kube.before_replace.append(someone_writes)
    done = apply_child(kube, dep, "uid-1")
    assert done.outcome == "repaired" and done.live["spec"]["replicas"] == 2
    assert done.live["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "4"


def test_events_are_aggregated_and_never_fail_a_reconcile() -> None:
    kube = FakeKube()
    pool = {
        "apiVersion": api.API_VERSION,
        "kind": "ServingPool",
        "metadata": {"name": "p", "namespace": "ns", "uid": "uid-1", "resourceVersion": "5"},
    }
    recorder = EventRecorder(kube, lambda: "T1", instance="operator-0")  # type: ignore[arg-type]
    event = Event(WARNING, "Forbidden", "applying Role p-router: Forbidden: no")
    recorder.record(pool, event)
    recorder.record(pool, event)
    (stored,) = [o for (kind, _), o in kube.objects.items() if kind == "Event"]
    assert stored["count"] == 2 and stored["type"] == "Warning" and stored["reason"] == "Forbidden"
    assert stored["involvedObject"] == {
        "apiVersion": api.API_VERSION,
        "kind": "ServingPool",
        "name": "p",
        "namespace": "ns",
        "uid": "uid-1",
        "resourceVersion": "5",
    }
    assert stored["metadata"]["namespace"] == "ns" and stored["reportingComponent"] == "jitserve-operator"
    kube.fail[("create", "Event")] = ApiError(403, "events is forbidden")
    recorder.record(pool, Event(WARNING, "Other", "x"))  # logged, not raised
    long = event_manifest(pool, Event(WARNING, "Long", "x" * 5000), "T", "i")
    assert len(long["message"]) == 1024


def test_fields_a_webhook_rewrites_are_not_drift_forever() -> None:
    """A mutating webhook that adds to our securityContext: written once, then left alone."""
    kube = FakeKube()

    def harden(obj: dict[str, Any]) -> None:
        if obj["kind"] == "Deployment":
            for c in obj["spec"]["template"]["spec"]["containers"]:
                c["securityContext"]["readOnlyRootFilesystem"] = True

    kube.mutate = harden
    dep = engine_deployment(POOL)
    first = apply_child(kube, dep, "uid-1")
    path = "spec.template.spec.containers[0].securityContext"
    assert first.outcome == "created" and first.server_rewrites == {path}
    again = apply_child(kube, dep, "uid-1", server_rewrites=first.server_rewrites)
    assert again.outcome == "unchanged" and len(kube.writes) == 1
    # Without the memory it would be "repaired" on every resync, and report nothing repaired.
    blind = apply_child(kube, dep, "uid-1")
    assert blind.outcome == "repaired" and blind.drifted == [] and blind.server_rewrites == {path}
    # Real drift elsewhere is still repaired.
    kube.objects[("Deployment", "p-engine")]["spec"]["replicas"] = 5
    fixed = apply_child(kube, dep, "uid-1", server_rewrites=first.server_rewrites)
    assert fixed.outcome == "repaired" and fixed.drifted == ["spec.replicas"]


def _pool_kube() -> FakeKube:
    kube = FakeKube()
    kube.objects[("ServingPool", "p")] = {
        "apiVersion": api.API_VERSION,
        "kind": "ServingPool",
        "metadata": {"name": "p", "namespace": "ns", "uid": "uid-1", "generation": 1, "resourceVersion": "1"},
        "spec": SPEC.model_dump(mode="json", exclude_none=True),
    }
    return kube


def _reconciler(kube: FakeKube) -> Reconciler:
    classes = {"latency": PAPER_CLASSES["latency"].model_dump(mode="json")}
    return Reconciler(kube, clock=lambda: "2026-01-01T00:00:00Z", class_lookup=classes.get)  # type: ignore[arg-type]


def test_a_refused_child_is_a_condition_and_the_others_are_still_applied() -> None:
    kube = _pool_kube()
    kube.fail[("create", "Role")] = ApiError(403, 'roles "p-router" is forbidden', "Forbidden")
    result = _reconciler(kube).reconcile("ns", "p")
    assert result is not None and [f.reason for f in result.failures] == ["Forbidden"]
    status = kube.objects[("ServingPool", "p")]["status"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "Forbidden")
    assert degraded["message"] == 'applying Role p-router: Forbidden: roles "p-router" is forbidden'
    assert ("Deployment", "p-engine") in kube.objects and ("Role", "p-router") not in kube.objects
    warnings = [o for (k, _), o in kube.objects.items() if k == "Event" and o["type"] == "Warning"]
    assert [e["reason"] for e in warnings] == ["Forbidden"]


def test_a_transient_failure_is_recorded_then_raised_for_a_retry() -> None:
    kube = _pool_kube()
    kube.fail[("create", "Service")] = ApiError(503, "etcd leader changed", "ServiceUnavailable")
    with pytest.raises(TransientApiError, match="etcd leader changed"):
        _reconciler(kube).reconcile("ns", "p")
    status = kube.objects[("ServingPool", "p")]["status"]
    assert {c["type"]: c["reason"] for c in status["conditions"]}["Degraded"] == "ServiceUnavailable"
    del kube.fail[("create", "Service")]
    result = _reconciler(kube).reconcile("ns", "p")
    assert result is not None and not result.failures
    status = kube.objects[("ServingPool", "p")]["status"]
    assert {c["type"]: c["status"] for c in status["conditions"]}["Degraded"] == "False"


def test_a_child_the_api_server_rejects_is_invalid_with_its_message() -> None:
    kube = _pool_kube()
    message = 'Deployment.apps "p-engine" is invalid: spec.template.spec.containers[0].image: Required value'
    kube.fail[("create", "Deployment")] = ApiError(422, message, "Invalid")
    result = _reconciler(kube).reconcile("ns", "p")
    assert result is not None and {f.reason for f in result.failures} == {"Invalid"}
    status = kube.objects[("ServingPool", "p")]["status"]
    conds = {c["type"]: c for c in status["conditions"]}
    assert (conds["Degraded"]["status"], conds["Degraded"]["reason"]) == ("True", "Invalid")
    assert "applying Deployment p-engine: Invalid: " + message in conds["Degraded"]["message"]
    assert conds["Ready"]["status"] == "False" and status["replicas"] == 0


def test_an_api_server_that_does_not_answer_is_a_transient_api_error() -> None:
    """A real client against a closed port: no answer is ServerUnreachable, retried, never a crash."""
    import kubernetes

    from jitserve.operator.kube import Kube

    cfg = kubernetes.client.Configuration()
    cfg.host = "http://127.0.0.1:9"  # discard port: nothing listens
    cfg.retries = 0
    kube = Kube(kubernetes.client.ApiClient(cfg))
    with pytest.raises(ApiError) as info:
        kube.get("v1", "ConfigMap", "ns", "x")
    assert (info.value.status, info.value.reason, info.value.transient) == (0, "ServerUnreachable", True)
    assert not ApiError(403, "no").transient and ApiError(403, "no").reason == "Forbidden"
    assert ApiError(422, "bad").reason == "Invalid" and ApiError(503, "busy").transient
