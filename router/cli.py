"""`jitserve router`: the SLO-aware OpenAI-compatible router.

Every option can also come from the environment: `JITSERVE_ROUTER_<OPTION>` with dashes as
underscores (e.g. `JITSERVE_ROUTER_K=2`); a flag on the command line wins. Module-level imports stay
light (argparse, os, the standard-library config.py) because `jitserve --help` imports every
component's CLI. Flag defaults are RouterConfig's own: declared once, in config.py.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from jitserve.router.config import RouterConfig

ENV_PREFIX = "JITSERVE_ROUTER_"
_C = RouterConfig()  # every flag's default is the config's own (declared once, in config.py)


def _env(name: str, default: Any) -> Any:
    return os.environ.get(ENV_PREFIX + name.upper().replace("-", "_"), default)


def _env_list(name: str) -> list[str] | None:
    value = _env(name, None)
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        f"Every option may be set from the environment as {ENV_PREFIX}<OPTION> (dashes -> underscores); "
        "flags win. Request API (SLO fields, headers, errors): docs/api.md."
    )
    parser.formatter_class = argparse.ArgumentDefaultsHelpFormatter

    g = parser.add_argument_group("serving")
    g.add_argument("--host", default=_env("host", "0.0.0.0"), help="address to listen on")
    g.add_argument("--port", type=int, default=_env("port", 8080), help="port of the OpenAI endpoint")
    g.add_argument(
        "--log-level",
        default=_env("log-level", "info"),
        choices=["debug", "info", "warning", "error"],
        help="log level",
    )
    g.add_argument(
        "--served-model-name",
        action="append",
        default=_env_list("served-model-name"),
        metavar="NAME",
        help="model name to accept and list besides what engines report (repeatable; env: comma list)",
    )

    g = parser.add_argument_group("engine discovery (static list, or Kubernetes pods)")
    g.add_argument(
        "--engines",
        default=_env("engines", None),
        metavar="URL[,URL...]",
        help="static engine base URLs for local runs, e.g. http://127.0.0.1:8001,http://127.0.0.1:8002",
    )
    g.add_argument(
        "--engine-selector",
        default=_env("engine-selector", None),
        metavar="SELECTOR",
        help="label selector of the pool's engine pods (Kubernetes discovery)",
    )
    g.add_argument(
        "--namespace",
        default=_env("namespace", os.environ.get("POD_NAMESPACE", "default")),
        help="namespace of the engine pods, ConfigMap and Secret",
    )
    g.add_argument(
        "--kubeconfig",
        default=_env("kubeconfig", None),
        metavar="PATH",
        help="kubeconfig for out-of-cluster runs (in a pod: the service account; else KUBECONFIG)",
    )
    g.add_argument(
        "--engine-port", type=int, default=_env("engine-port", 8000), help="engine pods' HTTP port"
    )
    g.add_argument(
        "--poll-interval",
        type=float,
        default=_env("poll-interval", _C.poll_interval_s),
        help="seconds between polls of each engine's /jitserve/state",
    )
    g.add_argument(
        "--poll-timeout",
        type=float,
        default=_env("poll-timeout", _C.poll_timeout_s),
        help="timeout of one poll, seconds",
    )
    g.add_argument(
        "--stale-after",
        type=float,
        default=_env("stale-after", _C.defaults.stale_after_s),
        help="seconds after which a pod's reported state is stale (router falls back to its own counts)",
    )
    g.add_argument(
        "--down-after",
        type=int,
        default=_env("down-after", _C.down_after),
        help="failed polls in a row before a pod is excluded (connection refused excludes at once)",
    )
    g.add_argument(
        "--unresponsive-timeout",
        type=float,
        default=_env("unresponsive-timeout", _C.unresponsive_timeout_s),
        help="after a poll or request timed out on a pod, its GET /health gets this long to answer; "
        "no answer: the pod is down, its requests end (retried elsewhere if nothing was sent yet)",
    )

    g = parser.add_argument_group("SLO classes")
    g.add_argument(
        "--classes-configmap",
        default=_env("classes-configmap", None),
        metavar="NAME",
        help="ConfigMap (key classes.json; optional key default) with the pool's SLO classes; watched",
    )
    g.add_argument(
        "--classes-file",
        default=_env("classes-file", None),
        metavar="PATH",
        help="JSON file of class name -> SLOClass spec (or the ConfigMap's data); read at start",
    )
    g.add_argument(
        "--default-class",
        default=_env("default-class", None),
        metavar="NAME",
        help="class of requests that name none (ConfigMap key 'default' wins when present)",
    )

    g = parser.add_argument_group("auth")
    g.add_argument(
        "--auth-secret",
        default=_env("auth-secret", None),
        metavar="NAME",
        help="Kubernetes Secret of API keys ('<key> [tenant]' lines; key api-keys); watched",
    )
    g.add_argument(
        "--auth-file",
        default=_env("auth-file", None),
        metavar="PATH",
        help="file of API keys, one '<key> [tenant]' per line; no file and no Secret: auth off",
    )

    g = parser.add_argument_group("admission and placement")
    g.add_argument(
        "--k", type=int, default=_env("k", _C.k), help="pods sampled per request (power-of-K); default all"
    )
    g.add_argument(
        "--max-inflight",
        type=int,
        default=_env("max-inflight", _C.max_inflight),
        help="requests open in the router at once; more get 429 router_overloaded",
    )
    g.add_argument(
        "--max-body-bytes",
        type=int,
        default=_env("max-body-bytes", _C.max_body_bytes),
        help="largest request body; larger gets 413",
    )
    g.add_argument(
        "--max-retries",
        type=int,
        default=_env("max-retries", _C.max_retries),
        help="other pods tried when a pod fails before the first token",
    )
    g.add_argument(
        "--first-token-grace",
        type=float,
        default=_env("first-token-grace", _C.first_token_grace_s),
        help="streaming: drop when no token came within waiting_time + prefill estimate + this",
    )
    g.add_argument(
        "--default-max-tokens",
        type=int,
        default=_env("default-max-tokens", _C.default_max_tokens),
        help="output length bound for requests without max_tokens",
    )
    g.add_argument(
        "--connect-timeout",
        type=float,
        default=_env("connect-timeout", _C.connect_timeout_s),
        help="engine connect timeout, s",
    )
    g.add_argument(
        "--max-connecting",
        type=int,
        default=_env("max-connecting", _C.max_connecting),
        help="new engine connections set up at once; more wait their turn (not counted in --connect-timeout)",
    )
    g.add_argument(
        "--header-timeout",
        type=float,
        default=_env("header-timeout", _C.header_timeout_s),
        help="streaming: an engine's response headers within this, else the request is retried on another "
        "engine and the engine probed, s",
    )
    g.add_argument(
        "--best-effort-queue",
        type=int,
        default=_env("best-effort-queue", _C.best_effort_queue),
        help="best-effort (no SLO) requests waiting in the router for room at the engines; "
        "more get 429 queue_full with Retry-After",
    )
    g.add_argument(
        "--best-effort-slots",
        type=int,
        default=_env("best-effort-slots", _C.best_effort_slots),
        help="best-effort requests open at each engine at once; 0: twice the engine's batch size",
    )
    g.add_argument(
        "--best-effort-max-wait",
        type=float,
        default=_env("best-effort-max-wait", _C.best_effort_max_wait_s),
        help="a queued best-effort request gets 503 no_replica only after this long with no usable engine, s",
    )
    g.add_argument(
        "--read-timeout",
        type=float,
        default=_env("read-timeout", _C.read_timeout_s),
        help="longest silence tolerated from an engine mid-response, s",
    )
    g.add_argument(
        "--drop-finish-reason",
        action="append",
        default=_env_list("drop-finish-reason"),
        metavar="REASON",
        help="engine finish_reason meaning 'dropped past waiting_time' (repeatable; default abort)",
    )
    g.add_argument(
        "--default-step-time",
        type=float,
        default=_env("default-step-time", _C.defaults.step_time_s),
        help="decode step seconds assumed for engines that report no state",
    )
    g.add_argument(
        "--default-prefill-rate",
        type=float,
        default=_env("default-prefill-rate", _C.defaults.prefill_tokens_per_s),
        help="prompt tokens/s assumed for engines that report no state",
    )
    g.add_argument(
        "--default-batch-size",
        type=int,
        default=_env("default-batch-size", _C.defaults.batch_size),
        help="batch size assumed for engines that report no state",
    )
    g.add_argument("--seed", type=int, default=_env("seed", _C.seed), help="seed of power-of-K sampling")

    g = parser.add_argument_group("compound programs and status")
    g.add_argument(
        "--program-idle-timeout",
        type=float,
        default=_env("program-idle-timeout", _C.program_idle_timeout_s),
        help="a program ends after this many seconds without calls",
    )
    g.add_argument(
        "--max-programs",
        type=int,
        default=_env("max-programs", _C.max_programs),
        help="programs tracked at once",
    )
    g.add_argument(
        "--length-predictor",
        default=_env("length-predictor", "qrf"),
        choices=["qrf", "max-tokens"],
        help="output-length bound: the analyzer's QRF learned online from finished requests, or max_tokens",
    )
    g.add_argument(
        "--length-refit-interval",
        type=float,
        default=_env("length-refit-interval", _C.length_refit_interval_s),
        help="seconds between QRF refits at least (a fit costs seconds of CPU)",
    )
    g.add_argument(
        "--subdeadlines",
        default=_env("subdeadlines", "pattern-graph"),
        choices=["pattern-graph", "remaining"],
        help="compound stage sub-deadlines: matched pattern graphs, or the whole remaining budget",
    )
    g.add_argument(
        "--status-window",
        type=int,
        default=_env("status-window", _C.status_window_s),
        help="seconds of history in GET /jitserve/status",
    )


def build(args: argparse.Namespace) -> tuple[Any, Any]:
    """(ASGI app, Router) from parsed options; discovery and watches start with the app."""
    import asyncio

    from jitserve.router.app import serve_app
    from jitserve.router.auth import Keyring, keys_from_secret_data, parse_keys
    from jitserve.router.classes import ClassRegistry, table_from_configmap, table_from_file
    from jitserve.router.config import Defaults
    from jitserve.router.pool import Pool
    from jitserve.router.service import Router

    if not args.engines and not args.engine_selector:
        raise SystemExit("jitserve router: give --engines URL[,URL...] or --engine-selector SELECTOR")
    defaults = Defaults(
        step_time_s=args.default_step_time,
        prefill_tokens_per_s=args.default_prefill_rate,
        batch_size=args.default_batch_size,
        stale_after_s=args.stale_after,
    )
    drop_reasons = args.drop_finish_reason or sorted(_C.drop_finish_reasons)
    config = RouterConfig(
        k=args.k,
        max_inflight=args.max_inflight,
        max_body_bytes=args.max_body_bytes,
        max_retries=args.max_retries,
        connect_timeout_s=args.connect_timeout,
        max_connecting=args.max_connecting,
        read_timeout_s=args.read_timeout,
        first_token_grace_s=args.first_token_grace,
        header_timeout_s=args.header_timeout,
        best_effort_queue=args.best_effort_queue,
        best_effort_slots=args.best_effort_slots,
        best_effort_max_wait_s=args.best_effort_max_wait,
        default_max_tokens=args.default_max_tokens,
        drop_finish_reasons=frozenset(drop_reasons),
        served_models=frozenset(args.served_model_name or ()),
        program_idle_timeout_s=args.program_idle_timeout,
        max_programs=args.max_programs,
        status_window_s=args.status_window,
        length_predictor=args.length_predictor == "qrf",
        length_refit_interval_s=args.length_refit_interval,
        pattern_graphs=args.subdeadlines == "pattern-graph",
        seed=args.seed,
        defaults=defaults,
        poll_interval_s=args.poll_interval,
        poll_timeout_s=args.poll_timeout,
        down_after=args.down_after,
        unresponsive_timeout_s=args.unresponsive_timeout,
    )
    registry = ClassRegistry()
    if args.classes_file:
        registry.replace(table_from_file(args.classes_file, args.default_class))
    elif args.default_class:
        from jitserve.router.classes import ClassTable

        table = ClassTable(default=args.default_class)
        if args.default_class not in table.classes and not args.classes_configmap:
            raise SystemExit(f"jitserve router: --default-class {args.default_class!r} is not a known class")
        registry.replace(table)
    if args.classes_configmap:
        registry.awaiting = f"configmap {args.namespace}/{args.classes_configmap}"
    keyring = Keyring()
    if args.auth_file:
        with open(args.auth_file, encoding="utf-8") as f:
            keyring.replace(parse_keys(f.read(), args.auth_file))
    pool = Pool.from_config(config)
    router = Router(config, pool, registry, keyring)
    background: list[Any] = [lambda: pool.run(router.poll_session())]

    if args.engines:
        urls = [u.strip() for u in args.engines.split(",") if u.strip()]
        pool.set_targets({u.split("://", 1)[-1]: u for u in urls})

    needs_kube = args.engine_selector or args.classes_configmap or args.auth_secret
    if needs_kube:

        async def start_watches() -> None:
            from jitserve.router import kube

            loop = asyncio.get_running_loop()
            api = await asyncio.to_thread(kube.load_api, args.kubeconfig)
            watches = []
            if args.engine_selector:
                watches.append(
                    kube.Watch(
                        loop,
                        api.list_namespaced_pod,
                        args.namespace,
                        lambda pods: pool.set_targets(kube.pod_targets(pods, args.engine_port)),
                        label_selector=args.engine_selector,
                        what="pods",
                    )
                )
            if args.classes_configmap:

                def on_configmap(objs: dict[str, Any]) -> None:
                    cm = objs.get(args.classes_configmap)
                    where = f"configmap {args.namespace}/{args.classes_configmap}"
                    if cm is None:
                        registry.last_error = f"{where} not found; keeping the current classes"
                        return
                    try:
                        registry.replace(table_from_configmap(cm.data or {}, args.default_class, where))
                        router.metrics.classes_reloads.labels("ok").inc()
                    except ValueError as exc:
                        registry.last_error = str(exc)
                        router.metrics.classes_reloads.labels("error").inc()

                watches.append(
                    kube.Watch(
                        loop,
                        api.list_namespaced_config_map,
                        args.namespace,
                        on_configmap,
                        field_selector=f"metadata.name={args.classes_configmap}",
                        what="configmap",
                    )
                )
            if args.auth_secret:

                def on_secret(objs: dict[str, Any]) -> None:
                    secret = objs.get(args.auth_secret)
                    keyring.replace(
                        keys_from_secret_data(kube.decode_secret(secret.data), args.auth_secret)
                        if secret is not None
                        else {}
                    )

                keyring.replace({})  # closed until the Secret is read: never open by accident
                watches.append(
                    kube.Watch(
                        loop,
                        api.list_namespaced_secret,
                        args.namespace,
                        on_secret,
                        field_selector=f"metadata.name={args.auth_secret}",
                        what="secret",
                    )
                )
            for w in watches:
                w.start()
            try:
                await asyncio.Event().wait()
            finally:
                for w in watches:
                    w.stopped.set()

        background.append(start_watches)
    app = serve_app(router, background)
    return app, router


def run(args: argparse.Namespace) -> int:
    import gc
    import logging

    import uvicorn

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    app, _ = build(args)
    import importlib.util

    # uvloop and httptools are the fast paths (pyproject pulls them in); plain asyncio/h11 still work.
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    # Everything alive now (modules, the app, the class table: ~70,000 objects) lives as long as the
    # process: keep it out of the cyclic GC's full collections, which otherwise walk it all and stall
    # the event loop for tens of milliseconds at a time (p99) while the router churns through requests.
    gc.collect()
    gc.freeze()
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=False,
        loop=loop,
        http=http,
        timeout_graceful_shutdown=5,
        # clients (and Service proxies) reuse connections; uvicorn's 5 s default races with them
        timeout_keep_alive=75,
        # X-Forwarded-* rewriting of the client address: the router never reads it, and the middleware
        # would scan every request's headers
        proxy_headers=False,
    )
    return 0
