"""The emulated API server (tests/emulated) behaves as the real one where the operator, kopf and
kubectl depend on it: resourceVersions of status writes, watch-lists (kubectl 1.35 `wait`),
discovery that never reads objects, and admission that reports schema and CEL errors together.

Each test cites the Kubernetes source (release 1.35: k8s.io/apiserver, k8s.io/apiextensions-apiserver,
k8s.io/apimachinery and k8s.io/client-go at v0.35) or documentation page whose behaviour it checks.
The server is this module's own (not the session's), so nothing else writes to it meanwhile.
Why an emulator at all: no Kubernetes API server can run on this machine (no container runtime, no
network); this module is what keeps the stand-in honest.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kmock
import pytest
import requests
import yaml
from kmock._internal import k8s_views

from tests.emulated import EmulatedCluster, Kubectl, wait_for
from tests.emulated.kubectl import TOOLS_KUBECTL

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
GROUP = "emulated.test"
WIDGETS = f"/apis/{GROUP}/v1/namespaces/default/widgets"
RULE = "small widgets stay under 10"

WIDGET_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"widgets.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "properties": {
                                    "mode": {"type": "string", "enum": ["small", "large"]},
                                    "size": {"type": "integer", "minimum": 1, "maximum": 100},
                                },
                                "x-kubernetes-validations": [
                                    {"rule": "self.mode != 'small' || self.size <= 10", "message": RULE}
                                ],
                            },
                            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                        },
                    }
                },
            }
        ],
    },
}


def _crd(group: str) -> dict[str, Any]:
    crd = json.loads(json.dumps(WIDGET_CRD).replace(GROUP, group))
    return crd


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatedCluster]:
    with EmulatedCluster(tmp_path_factory.mktemp("emulated-apiserver") / "config") as cluster:
        response = requests.post(
            cluster.url + "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            json=WIDGET_CRD,
            timeout=30,
        )
        assert response.status_code == 201, response.text
        yield cluster


@pytest.fixture(scope="module")
def api(cluster: EmulatedCluster) -> Iterator[Api]:
    with requests.Session() as session:
        yield Api(cluster.url, session)


@pytest.fixture(scope="module")
def kubectl(cluster: EmulatedCluster) -> Kubectl:
    if not TOOLS_KUBECTL.exists():
        pytest.fail(f"kubectl 1.35 not found at {TOOLS_KUBECTL}: run `make tools`")
    kubectl = Kubectl(cluster.kubeconfig, binary=TOOLS_KUBECTL)
    assert "v1.35" in kubectl("version", "--client").stdout
    return kubectl


class Api:
    """Plain HTTP to the emulated server (what any client sends), with bounded reads."""

    def __init__(self, url: str, session: requests.Session) -> None:
        self.url, self.session = url, session

    def call(
        self, method: str, path: str, body: Any = None, ctype: str = "application/json", **params: Any
    ) -> Any:
        data = None if body is None else json.dumps(body)
        response = self.session.request(
            method, self.url + path, data=data, params=params, headers={"Content-Type": ctype}, timeout=30
        )
        return response.status_code, response.json()

    def ok(self, method: str, path: str, body: Any = None, **kw: Any) -> dict[str, Any]:
        status, payload = self.call(method, path, body, **kw)
        assert status in (200, 201), (status, payload)
        return payload

    def patch_status(self, name: str, status: dict[str, Any]) -> dict[str, Any]:
        return self.ok(
            "PATCH", f"{WIDGETS}/{name}/status", {"status": status}, ctype="application/merge-patch+json"
        )

    def watch(self, path: str, **params: Any) -> Watch:
        response = self.session.get(
            self.url + path, params={"watch": "true", **params}, stream=True, timeout=(10, 60)
        )
        return Watch(response)


class Watch:
    """A watch stream read event by event (the read timeout only bounds a hang)."""

    def __init__(self, response: requests.Response) -> None:
        self.response = response
        self.status = response.status_code
        self._lines = response.iter_lines()

    def next(self) -> dict[str, Any]:
        for line in self._lines:
            if line.strip():
                return json.loads(line)
        raise AssertionError("the watch ended")

    def close(self) -> None:
        self.response.close()


def widget(name: str, mode: str = "large", size: int = 50) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Widget",
        "metadata": {"name": name},
        "spec": {"mode": mode, "size": size},
    }


def rv(obj: dict[str, Any]) -> int:
    return int(obj["metadata"]["resourceVersion"])


# ---- status writes and resourceVersions --------------------------------------------------------------


def test_status_writes_get_their_own_resource_version(api: Api) -> None:
    """Every write that changes an object gives it a new resourceVersion, the status subresource's
    too, and the watch event carries that version; a write that changes nothing keeps it and is not
    an event.

    - docs: https://kubernetes.io/docs/reference/using-api/api-concepts/#resource-versions ("the
      version of the object ... changes every time the object is modified").
    - k8s.io/apiextensions-apiserver pkg/registry/customresource/status_strategy.go, PrepareForUpdate:
      a /status write is the old object with the new .status; it then goes through the same
      storage update as any write.
    - k8s.io/apiserver pkg/storage/etcd3/store.go, GuaranteedUpdate: the new resourceVersion is the
      etcd revision of the write; when the encoded object equals the stored one ("if we don't have to
      update, return the current object") nothing is written, so neither version nor event.
    """
    created = api.ok("POST", WIDGETS, widget("rv"))
    watch = api.watch(WIDGETS, resourceVersion=created["metadata"]["resourceVersion"])
    try:
        first = api.patch_status("rv", {"phase": "one"})
        second = api.patch_status("rv", {"phase": "two"})
        same = api.patch_status("rv", {"phase": "two"})  # no change
        spec = api.ok("PATCH", f"{WIDGETS}/rv", {"spec": {"size": 60}}, ctype="application/merge-patch+json")
        assert rv(created) < rv(first) < rv(second) < rv(spec)
        assert rv(same) == rv(second) and same == second
        assert (
            api.ok("GET", f"{WIDGETS}/rv")["metadata"]["resourceVersion"]
            == spec["metadata"]["resourceVersion"]
        )
        # a status write is not a spec change: generation stays; the spec patch moves it
        assert first["metadata"]["generation"] == second["metadata"]["generation"] == 1
        assert spec["metadata"]["generation"] == 2
        events = [watch.next() for _ in range(3)]
    finally:
        watch.close()
    assert [e["type"] for e in events] == ["MODIFIED"] * 3
    assert [rv(e["object"]) for e in events] == [rv(first), rv(second), rv(spec)]
    assert [e["object"]["status"]["phase"] for e in events] == ["one", "two", "two"]

    # Resuming from a version replays only what came after it (no event twice).
    resumed = api.watch(WIDGETS, resourceVersion=first["metadata"]["resourceVersion"])
    try:
        assert rv(resumed.next()["object"]) == rv(second)
    finally:
        resumed.close()


def test_a_list_is_at_the_version_of_its_newest_write(api: Api) -> None:
    """A list's resourceVersion is the store's current version, which a watch can resume from
    (docs: api-concepts, "Efficient detection of changes"): no write in between, no event."""
    obj = api.ok("POST", WIDGETS, widget("listed"))
    listing = api.ok("GET", WIDGETS)
    assert int(listing["metadata"]["resourceVersion"]) == rv(obj)
    watch = api.watch(WIDGETS, resourceVersion=listing["metadata"]["resourceVersion"])
    try:
        changed = api.patch_status("listed", {"phase": "after"})
        assert rv(watch.next()["object"]) == rv(changed)
    finally:
        watch.close()


# ---- watch-list (sendInitialEvents) ----------------------------------------------------------------


def test_watch_list_streams_the_state_then_the_initial_events_end_bookmark(api: Api) -> None:
    """KEP-3157 watch-list, as the watch cache serves it with the WatchList feature on (the default
    since Kubernetes 1.34: k8s.io/apiserver pkg/features/kube_features.go):

    - pkg/storage/cacher/watch_cache.go, getAllEventsSinceLocked: with sendInitialEvents=true the
      interval starts from the store: one ADDED event per object;
    - pkg/storage/cacher/cacher.go, setInitialEventsEndBookmarkIfRequested (sendInitialEvents and
      allowWatchBookmarks): then a BOOKMARK at the cache's resourceVersion, an empty object of the
      kind, annotated by pkg/storage/util.go AnnotateInitialEventsEndBookmark with
      "k8s.io/initial-events-end": "true" (cache_watcher.go, convertToWatchEvent);
    - then the changes after that version.
    docs: https://kubernetes.io/docs/reference/using-api/api-concepts/#streaming-lists
    """
    api.ok("POST", WIDGETS, widget("wl-a"))
    api.ok("POST", WIDGETS, widget("wl-b"))
    listing = api.ok("GET", WIDGETS)
    watch = api.watch(
        WIDGETS,
        sendInitialEvents="true",
        resourceVersionMatch="NotOlderThan",
        allowWatchBookmarks="true",
        fieldSelector="metadata.name!=nothing",
    )
    try:
        assert watch.status == 200
        initial = [watch.next() for _ in listing["items"]]
        assert {e["type"] for e in initial} == {"ADDED"}
        assert sorted(e["object"]["metadata"]["name"] for e in initial) == sorted(
            i["metadata"]["name"] for i in listing["items"]
        )
        bookmark = watch.next()
        assert bookmark == {
            "type": "BOOKMARK",
            "object": {
                "kind": "Widget",
                "apiVersion": f"{GROUP}/v1",
                "metadata": {
                    "resourceVersion": listing["metadata"]["resourceVersion"],
                    "annotations": {"k8s.io/initial-events-end": "true"},
                },
            },
        }
        changed = api.patch_status("wl-a", {"phase": "later"})
        event = watch.next()
        assert event["type"] == "MODIFIED" and rv(event["object"]) == rv(changed) > rv(bookmark["object"])
    finally:
        watch.close()


def test_send_initial_events_false_starts_from_now(api: Api) -> None:
    """sendInitialEvents=false with no resourceVersion: "start watching from Any resourceVersion"
    (watch_cache.go, getAllEventsSinceLocked): no initial events, only what changes next."""
    api.ok("POST", WIDGETS, widget("from-now"))
    watch = api.watch(
        WIDGETS, sendInitialEvents="false", resourceVersionMatch="NotOlderThan", allowWatchBookmarks="true"
    )
    try:
        changed = api.patch_status("from-now", {"phase": "x"})
        event = watch.next()
        assert event["type"] == "MODIFIED" and event["object"]["metadata"]["name"] == "from-now"
        assert rv(event["object"]) == rv(changed)
    finally:
        watch.close()


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (
            {"watch": "true", "sendInitialEvents": "true"},
            "resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to "
            "NotOlderThan",
        ),
        (
            {"watch": "true", "resourceVersionMatch": "NotOlderThan"},
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless "
            "sendInitialEvents is provided",
        ),
        (
            {"sendInitialEvents": "true"},
            "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list",
        ),
        (
            {"resourceVersionMatch": "NotOlderThan"},
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion "
            "is provided",
        ),
    ],
)
def test_list_options_are_validated_as_the_real_server_does(
    api: Api, params: dict[str, str], message: str
) -> None:
    """k8s.io/apimachinery pkg/apis/meta/internalversion/validation/validation.go, ValidateListOptions
    (list) and validateWatchOptions (watch); the handler answers 422 Invalid for kind
    ListOptions.meta.k8s.io (k8s.io/apiserver pkg/endpoints/handlers/get.go, ListResource)."""
    status, payload = api.call("GET", WIDGETS, **params)
    assert status == 422 and payload["reason"] == "Invalid"
    assert payload["message"] == f'ListOptions.meta.k8s.io "" is invalid: {message}'
    assert payload["details"]["kind"] == "ListOptions" and payload["details"]["group"] == "meta.k8s.io"


# ---- kubectl 1.35 wait ------------------------------------------------------------------------------


def _ready_status() -> dict[str, Any]:
    return {
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Serving",
                "message": "test",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ]
    }


@pytest.fixture(scope="module")
def pools(cluster: EmulatedCluster, kubectl: Kubectl) -> str:
    """The shipped CRDs and a pool from the documented example, in its own namespace."""
    kubectl.apply(ROOT / "crds")
    kubectl.apply(yaml.safe_dump({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "waits"}}))
    return "waits"


def _pool(kubectl: Kubectl, namespace: str, name: str) -> None:
    example = yaml.safe_load((ROOT / "docs" / "examples" / "servingpool.yaml").read_text())
    example["metadata"] = {"name": name, "namespace": namespace}
    kubectl.apply(yaml.safe_dump(example))


def _make_ready(cluster: EmulatedCluster, namespace: str, name: str) -> None:
    response = requests.patch(
        f"{cluster.url}/apis/jitserve.dev/v1alpha1/namespaces/{namespace}/servingpools/{name}/status",
        data=json.dumps({"status": _ready_status()}),
        headers={"Content-Type": "application/merge-patch+json"},
        timeout=30,
    )
    assert response.status_code == 200, response.text


def _wait(kubectl: Kubectl, namespace: str, name: str) -> subprocess.Popen[str]:
    cmd = [
        kubectl.binary,
        f"--kubeconfig={kubectl.kubeconfig}",
        "wait",
        "--for=condition=Ready",
        f"servingpool/{name}",
        "-n",
        namespace,
        "--timeout=120s",
    ]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("watch_list", [True, False], ids=["watch-list", "list-then-watch"])
def test_kubectl_1_35_wait_sees_the_condition(
    cluster: EmulatedCluster, kubectl: Kubectl, pools: str, watch_list: bool
) -> None:
    """`kubectl wait --for=condition=Ready servingpool/x` (docs/crds.md) with the real kubectl 1.35,
    started before the condition holds, ends as soon as it does.

    kubectl 1.35 waits through an informer (k8s.io/kubectl pkg/cmd/wait/condition.go: a ListWatch
    with a metadata.name field selector, watchtools.UntilWithSync); client-go 1.35 turns the
    WatchListClient feature on by default (k8s.io/client-go features/known_features.go), so the
    reflector opens a watch with sendInitialEvents=true, resourceVersionMatch=NotOlderThan,
    allowWatchBookmarks=true and is synced only by the "k8s.io/initial-events-end" bookmark
    (tools/cache/reflector.go, watchList / handleListWatch). When the server refuses that watch
    (WatchList off: 422 "sendInitialEvents is forbidden for watch unless the WatchList feature gate
    is enabled"), ListAndWatchWithContext falls back to a plain list then watch. Both paths here.
    """
    name = f"wait-{'wl' if watch_list else 'lw'}"
    _pool(kubectl, pools, name)
    cluster.call(lambda server: setattr(server, "watch_list", watch_list))
    try:
        before = cluster.call(lambda server: server.watching("servingpools"))
        waiting = _wait(kubectl, pools, name)
        try:
            wait_for(
                lambda: cluster.call(lambda server: server.watching("servingpools")) > before, 60, "a watch"
            )
            assert waiting.poll() is None, waiting.communicate()
            _make_ready(cluster, pools, name)
            out, err = waiting.communicate(timeout=120)
        finally:
            if waiting.poll() is None:
                waiting.kill()
                waiting.communicate()
        assert waiting.returncode == 0, err
        assert f"servingpool.jitserve.dev/{name} condition met" in out
        # Once it holds, a new wait ends at once (the initial state carries it).
        assert "condition met" in kubectl("wait", "--for=condition=Ready", f"sp/{name}", "-n", pools).stdout
    finally:
        cluster.call(lambda server: setattr(server, "watch_list", True))


# ---- discovery ---------------------------------------------------------------------------------------


def _discovery(url: str) -> dict[str, Any]:
    """Every legacy discovery document, as kubectl and kopf read them."""
    get = lambda path: requests.get(url + path, timeout=30).json()  # noqa: E731
    docs = {path: get(path) for path in ("/", "/version", "/api", "/apis", "/api/v1")}
    for group in docs["/apis"]["groups"]:
        docs[f"/apis/{group['name']}"] = get(f"/apis/{group['name']}")
        for version in group["versions"]:
            docs[f"/apis/{version['groupVersion']}"] = get(f"/apis/{version['groupVersion']}")
    return json.loads(json.dumps(docs, sort_keys=True), object_hook=_sorted_lists)


def _sorted_lists(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: sorted(v, key=json.dumps) if isinstance(v, list) else v for k, v in obj.items()}


def test_discovery_never_reads_the_objects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Discovery lists what is served, not what is stored: the real server builds its discovery
    documents from the registered APIs (k8s.io/apiserver pkg/endpoints/discovery; for CRDs
    k8s.io/apiextensions-apiserver pkg/apiserver/customresource_discovery_controller.go, rebuilt when
    a CRD changes) and never from objects. kmock's discovery scanned the whole object store on each
    request (kopf took 12-18 s to start against a full store). Here, with 2,000 stored objects (one
    of an unregistered kind), computing every document reads the store zero times and gives the same
    documents as a server with no objects."""
    with EmulatedCluster(tmp_path / "empty") as empty, EmulatedCluster(tmp_path / "full") as full:
        for server in (empty, full):
            requests.post(
                server.url + "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=WIDGET_CRD
            )

        def fill(server: Any) -> None:
            for i in range(2000):
                plural = "configmaps" if i else "gizmos"  # kmock listed any stored object's kind
                key = (kmock.resource("", "v1", plural), "default", f"o{i}")
                server.objects[key] = {"apiVersion": "v1", "kind": "X", "metadata": {"name": f"o{i}"}}

        full.call(fill)
        # A CRD registered after the objects: every discovery document is computed afresh below.
        for server in (empty, full):
            requests.post(
                server.url + "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=_crd("late.test")
            )
        scans = []
        # Counting, not mocking: the real store's iterator still runs; wrapping it is the only way to
        # observe from outside the server whether discovery read it.
        real_iter = k8s_views.ObjectsArray.__iter__
        monkeypatch.setattr(
            k8s_views.ObjectsArray, "__iter__", lambda self: (scans.append(1), real_iter(self))[1]
        )
        got = _discovery(full.url)
        assert scans == [], f"discovery read the object store {len(scans)} times"
        monkeypatch.undo()
        assert got == _discovery(empty.url)
        assert "gizmos" not in json.dumps(got)
        assert "/apis/late.test/v1" in got and "/apis/emulated.test/v1" in got


def test_unserved_resources_are_not_found(api: Api) -> None:
    """A resource nobody registered is a 404 (no CRD, no API), not an object kmock would keep."""
    status, payload = api.call(
        "POST", "/apis/nothing.test/v1/namespaces/default/things", {"metadata": {"name": "a"}}
    )
    assert status == 404 and payload["reason"] == "NotFound"


# ---- admission over HTTP ------------------------------------------------------------------------------


def test_schema_and_cel_errors_are_one_422(api: Api) -> None:
    """k8s.io/apiextensions-apiserver pkg/registry/customresource/strategy.go, Validate: a bound
    violation does not block the CEL rules (hasBlockingErr), so both come back in one Invalid
    Status, each cause with its field error type (k8s.io/apimachinery pkg/api/errors NewInvalid)."""
    status, payload = api.call("POST", WIDGETS, widget("bad", mode="small", size=101))
    assert status == 422 and payload["reason"] == "Invalid"
    assert payload["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "field": "spec.size",
            "message": "Invalid value: 101: spec.size in body should be less than or equal to 100",
        },
        {"reason": "FieldValueInvalid", "field": "spec", "message": f"Invalid value: {RULE}"},
    ]
    status, payload = api.call("POST", WIDGETS, widget("bad", mode="tiny", size=101))
    assert status == 422 and RULE not in payload["message"]
    assert payload["details"]["causes"][0]["reason"] == "FieldValueNotSupported"
    assert "some validation rules were not checked" in payload["details"]["causes"][-1]["message"]
