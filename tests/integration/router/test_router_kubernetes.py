"""Kubernetes discovery and configuration against the EMULATED API server (tests/emulated: kmock,
extended; no real kube-apiserver can run here): engine pods found by label selector, pods that go
away or turn unready leave the pool, and an edited classes ConfigMap or auth Secret reaches the running
router without a restart. Engines are FAKE engines on 127.0.0.2/127.0.0.3 (emulated pod IPs, one port).
"""

from __future__ import annotations

import base64
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from router_fakes import MODEL, FakeEngine, RunningRouter, free_port

ROOT = Path(__file__).resolve().parents[3]
NS = "default"
SELECTOR = "app.kubernetes.io/component=engine,app.kubernetes.io/instance=pool"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    sys.path.insert(0, str(ROOT / "tests"))
    from emulated import EmulatedCluster

    with EmulatedCluster(Path(tempfile.mkdtemp(prefix="router-kube-")) / "config") as c:
        yield c


@pytest.fixture(scope="module")
def core(cluster: Any) -> Any:
    import kubernetes

    return kubernetes.client.CoreV1Api(
        kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig))
    )


def pod(name: str, ip: str, ready: bool = True) -> dict[str, Any]:
    labels = dict(kv.split("=") for kv in SELECTOR.split(","))
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {"containers": [{"name": "engine", "image": "jitserve/engine-cpu:0.1.0"}]},
        "status": {"phase": "Running", "podIP": ip,
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }  # fmt: skip


def put_pod(core: Any, body: dict[str, Any]) -> None:
    """Create the pod, then write its status as the kubelet would (status is a subresource)."""
    import kubernetes

    name = body["metadata"]["name"]
    try:
        core.create_namespaced_pod(NS, body)
    except kubernetes.client.ApiException as exc:
        if exc.status != 409:
            raise
    core.patch_namespaced_pod_status(name, NS, {"status": body["status"]})


def wait_for(fn: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"gave up waiting for {what}")


def status(r: RunningRouter, key: str = "sk-1") -> dict[str, Any]:
    """The router's status; with auth on it needs a key (before the Secret is read: 401, so {})."""
    resp = httpx.get(r.url + "/jitserve/status", headers={"Authorization": f"Bearer {key}"})
    return resp.json() if resp.status_code == 200 else {}


def pods_seen(r: RunningRouter) -> dict[str, str]:
    replicas = status(r).get("replicas", {})
    return {name: info["health"] for name, info in replicas.items()}


def test_pods_classes_and_keys_come_from_the_api_and_follow_edits(
    cluster: Any, core: Any, start_router: Callable[..., RunningRouter]
) -> None:
    port = free_port()
    a = FakeEngine("a", port=port, host="127.0.0.2").start()
    b = FakeEngine("b", port=port, host="127.0.0.3").start()
    try:
        classes = {
            "chat": {"type": "latency", "ttftSeconds": 1.0},
            "jobs": {"type": "deadline", "deadlineSeconds": 30},
        }
        data = {"classes.json": json.dumps(classes), "default": "jobs"}
        core.create_namespaced_config_map(NS, {"metadata": {"name": "pool-classes"}, "data": data})
        keys = base64.b64encode(b"sk-1 team-1\n").decode()
        core.create_namespaced_secret(NS, {"metadata": {"name": "pool-keys"}, "data": {"api-keys": keys}})
        put_pod(core, pod("pool-engine-a", "127.0.0.2"))
        put_pod(core, pod("pool-engine-b", "127.0.0.3", ready=False))  # not Ready: not a target yet
        r = start_router(
            "--engine-selector", SELECTOR, "--namespace", NS, "--engine-port", str(port),
            "--classes-configmap", "pool-classes", "--default-class", "jobs", "--auth-secret", "pool-keys",
            "--kubeconfig", str(cluster.kubeconfig),
        )  # fmt: skip
        wait_for(lambda: pods_seen(r) == {"pool-engine-a": "fresh"}, "pod a discovered")
        c = openai.OpenAI(base_url=r.url + "/v1", api_key="sk-1", max_retries=0)
        wait_for(lambda: status(r)["class_source"].startswith("configmap"), "classes loaded")
        out = c.completions.with_raw_response.create(model=MODEL, prompt="x", max_tokens=2)
        assert out.headers["x-jitserve-slo-class"] == "jobs"
        assert a.received[-1]["vllm_xargs"]["tenant"] == "team-1"

        # b turns Ready, a is deleted: the router follows the pods
        put_pod(core, pod("pool-engine-b", "127.0.0.3", ready=True))
        core.delete_namespaced_pod("pool-engine-a", NS)
        wait_for(lambda: pods_seen(r) == {"pool-engine-b": "fresh"}, "pool follows the pods")
        c.completions.create(model=MODEL, prompt="x", max_tokens=2, extra_body={"slo_class": "chat"})
        assert len(b.received) == 1 and b.received[0]["vllm_xargs"]["target_ttft"] == 1.0

        # an SLOClass edit (the operator rewrites the ConfigMap) applies without a restart
        classes["chat"]["ttftSeconds"] = 0.5
        classes["batch"] = {"type": "best-effort", "deadlineSeconds": 200}
        core.patch_namespaced_config_map("pool-classes", NS, {"data": {"classes.json": json.dumps(classes)}})

        def reloaded() -> bool:
            try:
                c.completions.create(model=MODEL, prompt="x", max_tokens=1, extra_body={"slo_class": "batch"})
            except openai.BadRequestError:
                return False  # not yet: "batch" is still an unknown class
            return True

        wait_for(reloaded, "classes reloaded")
        c.completions.create(model=MODEL, prompt="x", max_tokens=2, extra_body={"slo_class": "chat"})
        assert b.received[-1]["vllm_xargs"]["target_ttft"] == 0.5

        # a rotated key: the old one stops working, the new one works
        new_keys = base64.b64encode(b"sk-2 team-2\n").decode()
        core.patch_namespaced_secret("pool-keys", NS, {"data": {"api-keys": new_keys}})

        def rotated() -> bool:
            try:
                c.completions.create(model=MODEL, prompt="x", max_tokens=1)
            except openai.AuthenticationError:
                return True
            return False

        wait_for(rotated, "key rotation")
        c2 = openai.OpenAI(base_url=r.url + "/v1", api_key="sk-2", max_retries=0)
        c2.completions.create(model=MODEL, prompt="x", max_tokens=1)
        assert b.received[-1]["vllm_xargs"]["tenant"] == "team-2"
    finally:
        a.stop()
        b.stop()
