"""`jitserve operator`: run the kopf operator (imports kopf and the client only when it runs)."""

from __future__ import annotations

import argparse
import contextlib
import os

from jitserve import settings as cli_settings
from jitserve.operator.settings import OperatorSettings

SETTINGS = OperatorSettings  # the options' one declaration (docgen reads it)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # every option is declared once, in operator/settings.py (flag, JITSERVE_OPERATOR_* variable)
    cli_settings.add_arguments(parser, OperatorSettings)


def settings_from(args: argparse.Namespace | OperatorSettings) -> OperatorSettings:
    """Validated settings; a bad value exits with status 2, naming its flag."""
    return cli_settings.parse_settings(OperatorSettings, args, "jitserve operator")


def run(args: argparse.Namespace | OperatorSettings) -> int:
    args = settings_from(args)  # before kopf loads: a bad value fails at once
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
