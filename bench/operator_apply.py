"""Operator benchmark: time from applying a ServingPool to all of its children existing.

Runs the real operator (`jitserve operator`, a process) against the emulated API server
(`python -m tests.emulated`, another process). Children's creation times are taken by the server itself, so
the numbers do not include polling. Scenarios:
  single  - one pool at a time, N trials: apply -> last child created (goal <= 1 s)
  burst   - P pools applied at once: each pool's apply -> last child, and first apply -> last child
Results go to stdout as a table and, with --json, to a file. Usage:
  python bench/operator_apply.py [--trials 20] [--pools 100] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
KUBECONFIG = Path(tempfile.mkdtemp(prefix="bench-kube-")) / "config"
os.environ["KUBECONFIG"] = str(KUBECONFIG)  # before anything imports kubernetes

import httpx  # noqa: E402
import yaml  # noqa: E402

from jitserve.operator.kube import Kube  # noqa: E402

CHILD_PLURALS = [
    ("configmaps", "classes"),
    ("serviceaccounts", "router"),
    ("roles", "router"),
    ("rolebindings", "router"),
    ("services", "engine"),
    ("services", "router"),
    ("deployments", "engine"),
    ("deployments", "router"),
    ("networkpolicies", "engine"),
]


def pool_manifest(name: str, namespace: str) -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "docs" / "examples" / "servingpool.yaml").read_text())
    doc["metadata"] = {"name": name, "namespace": namespace}
    return doc


class RemoteCluster:
    """The emulated API server in a process of its own (python -m tests.emulated)."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def __enter__(self) -> RemoteCluster:
        cmd = [sys.executable, "-m", "tests.emulated", "--kubeconfig", str(self.kubeconfig)]
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http"):
            raise RuntimeError("the emulated API server did not start")
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self.proc is not None
        self.proc.terminate()
        self.proc.wait(10)

    def created_at(self) -> dict[tuple[str, str, str], float]:
        rows = httpx.get(f"{self.url}/emulated/created-at", timeout=30).json()
        return {(plural, ns, name): t for plural, ns, name, t in rows}


def children_created(cluster: RemoteCluster, pools: list[tuple[str, str]]) -> dict[tuple[str, str], float]:
    """Monotonic time each pool's last child was created (server-side), for pools whose children all exist."""
    created = cluster.created_at()
    out = {}
    for ns, name in pools:
        times = [created.get((plural, ns, f"{name}-{suffix}")) for plural, suffix in CHILD_PLURALS]
        if None not in times:
            out[(ns, name)] = max(times)  # CLOCK_MONOTONIC: comparable across processes on Linux
    return out


def wait_all(
    cluster: RemoteCluster, pools: list[tuple[str, str]], timeout: float = 300
) -> dict[tuple[str, str], float]:
    done: dict[tuple[str, str], float] = {}
    deadline = time.monotonic() + timeout
    while len(done) < len(pools):
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(done)}/{len(pools)} pools complete after {timeout} s")
        done.update(children_created(cluster, [p for p in pools if p not in done]))
        time.sleep(0.05)
    return done


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "median_s": statistics.median(values),
        "p90_s": percentile(values, 0.9),
        "max_s": max(values),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=20, help="single-pool trials")
    parser.add_argument("--pools", type=int, default=100, help="pools applied at once in the burst")
    parser.add_argument("--workers", type=int, default=16, help="the operator's --workers")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    import kubernetes

    with RemoteCluster(KUBECONFIG) as cluster:
        kube = Kube(kubernetes.config.new_client_from_config(config_file=str(KUBECONFIG)))
        for crd in sorted((ROOT / "crds").glob("*.yaml")):
            kube_create_any(kube, yaml.safe_load(crd.read_text()))
        for doc in yaml.safe_load_all((ROOT / "docs" / "examples" / "slo-class.yaml").read_text()):
            kube.create(doc)
        for ns in ("single", "burst"):
            kube._call(
                "POST",
                "/api/v1/namespaces",
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
            )
        env = dict(os.environ, KUBECONFIG=str(KUBECONFIG))
        cmd = [sys.executable, "-m", "jitserve.main", "operator", "-A", "--resync-seconds", "3600"]
        cmd += ["--workers", str(args.workers)]
        operator = subprocess.Popen(
            cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            kube.create(pool_manifest("warmup", "default"))  # also waits out the operator's start-up
            wait_all(cluster, [("default", "warmup")], timeout=120)

            single = []
            for i in range(args.trials):
                name = f"pool-{i}"
                t0 = time.monotonic()
                kube.create(pool_manifest(name, "single"))
                single.append(wait_all(cluster, [("single", name)])[("single", name)] - t0)

            names = [f"pool-{i}" for i in range(args.pools)]
            starts = {}
            t_first = time.monotonic()
            for name in names:
                starts[("burst", name)] = time.monotonic()
                kube.create(pool_manifest(name, "burst"))
            t_applied = time.monotonic()
            done = wait_all(cluster, [("burst", n) for n in names])
            burst = [done[key] - starts[key] for key in done]
            results = {
                "single_pool_apply_to_children": summary(single),
                "burst": {
                    "pools": args.pools,
                    "apply_all_s": t_applied - t_first,
                    "first_apply_to_last_child_s": max(done.values()) - t_first,
                    "per_pool_apply_to_children": summary(burst),
                },
                "children_per_pool": len(CHILD_PLURALS),
                "operator_workers": args.workers,
                "load_average_1m": os.getloadavg()[0],  # the machine is shared: read numbers with this
            }
        finally:
            operator.terminate()  # a graceful stop may wait for queued events; the numbers are in already
            try:
                operator.wait(10)
            except subprocess.TimeoutExpired:
                operator.kill()
                operator.wait()

    s, b = results["single_pool_apply_to_children"], results["burst"]
    print(
        f"single pool, {s['n']} trials: apply -> {len(CHILD_PLURALS)} children created: "
        f"median {s['median_s'] * 1000:.0f} ms, p90 {s['p90_s'] * 1000:.0f} ms, "
        f"max {s['max_s'] * 1000:.0f} ms"
    )
    pb = b["per_pool_apply_to_children"]
    print(
        f"{b['pools']} pools at once: all applied in {b['apply_all_s']:.2f} s; first apply -> last child "
        f"{b['first_apply_to_last_child_s']:.2f} s; per pool median {pb['median_s']:.2f} s, "
        f"p90 {pb['p90_s']:.2f} s, max {pb['max_s']:.2f} s (load average {results['load_average_1m']:.1f})"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


def kube_create_any(kube: Kube, manifest: dict[str, Any]) -> None:
    """CRDs are not among the kinds the operator's adapter knows; post them by path."""
    kube._call("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", manifest)  # noqa: SLF001


if __name__ == "__main__":
    sys.exit(main())
