"""`jitserve operator`: run the kopf operator (imports kopf and the client only when it runs)."""

from __future__ import annotations

import argparse
import contextlib
import os

from jitserve.operator import api


def add_arguments(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n", "--namespace", action="append", default=[], help="watch this namespace (repeatable)"
    )
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace (default)")
    parser.add_argument(
        "--engine-image",
        default=os.environ.get("JITSERVE_ENGINE_IMAGE", api.DEFAULT_ENGINE_IMAGE),
        help="default engine image for backend vllm (env JITSERVE_ENGINE_IMAGE)",
    )
    parser.add_argument(
        "--engine-cpu-image",
        default=os.environ.get("JITSERVE_ENGINE_CPU_IMAGE", api.DEFAULT_ENGINE_CPU_IMAGE),
        help="default engine image for backend vllm-cpu (env JITSERVE_ENGINE_CPU_IMAGE)",
    )
    parser.add_argument(
        "--router-image",
        default=os.environ.get("JITSERVE_ROUTER_IMAGE", api.DEFAULT_ROUTER_IMAGE),
        help="default router image (env JITSERVE_ROUTER_IMAGE)",
    )
    parser.add_argument(
        "--router-status-url",
        default=os.environ.get("JITSERVE_ROUTER_STATUS_URL"),
        help="template of the URL the operator reads per-class goodput from (the router's keyless "
        "Prometheus /metrics), with {service} {namespace} {port} {pool} (default: the router Service's "
        "cluster DNS name, path /metrics)",
    )
    parser.add_argument(
        "--resync-seconds",
        type=float,
        default=30.0,
        help="how often each pool re-reads its router's goodput and re-checks its children",
    )
    parser.add_argument("--workers", type=int, default=16, help="threads reconciling pools in parallel")
    parser.add_argument(
        "--liveness", default=None, help="kopf liveness endpoint, e.g. http://0.0.0.0:8080/healthz"
    )
    parser.add_argument("--verbose", action="store_true", help="debug logging")


def run(args: argparse.Namespace) -> int:
    import kopf  # noqa: F401 - heavy; only when the operator actually runs

    from jitserve.operator import runtime
    from jitserve.operator.children import Images
    from jitserve.operator.kube import Kube
    from jitserve.operator.reconciler import DEFAULT_ROUTER_STATUS_URL, Reconciler

    reconciler = Reconciler(
        Kube(_api_client()),
        Images(engine=args.engine_image, engine_cpu=args.engine_cpu_image, router=args.router_image),
        router_status_url=args.router_status_url or DEFAULT_ROUTER_STATUS_URL,
    )
    runtime.configure(reconciler, resync_seconds=args.resync_seconds, workers=args.workers)
    import jitserve.operator.handlers  # noqa: F401 - registers the handlers with the configuration above

    argv = ["run", "--standalone", "-m", "jitserve.operator.handlers"]
    argv += (
        ["-A"]
        if args.all_namespaces or not args.namespace
        else [f"--namespace={ns}" for ns in args.namespace]
    )
    if args.liveness:
        argv += ["--liveness", args.liveness]
    if args.verbose:
        argv += ["--verbose"]
    from kopf.cli import main as kopf_main

    with contextlib.suppress(KeyboardInterrupt):
        kopf_main(argv, standalone_mode=False)
    return 0


def _api_client():  # noqa: ANN202 - kubernetes types are not imported at module level
    """In a pod: the service account; elsewhere: $KUBECONFIG / ~/.kube/config."""
    import kubernetes

    try:
        kubernetes.config.load_incluster_config()
        return kubernetes.client.ApiClient()
    except kubernetes.config.ConfigException:
        return kubernetes.config.new_client_from_config(config_file=os.environ.get("KUBECONFIG"))
