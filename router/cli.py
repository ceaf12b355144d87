"""`jitserve router`: the SLO-aware OpenAI-compatible router.

Every option can also come from the environment: `JITSERVE_ROUTER_<OPTION>` with dashes as
underscores (e.g. `JITSERVE_ROUTER_K=2`); a flag on the command line wins. The options are declared
once, in settings.py (`RouterSettings`, pydantic-settings), with RouterConfig's defaults. Module-level
imports stay light (no FastAPI, no kubernetes) because `jitserve --help` imports every component's CLI.
"""

from __future__ import annotations

import argparse
from typing import Any

from jitserve import settings as cli_settings
from jitserve.router.settings import RouterSettings

ENV_PREFIX = RouterSettings.model_config["env_prefix"]
SETTINGS = RouterSettings  # the options' one declaration (docgen reads it)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        f"Every option may be set from the environment as {ENV_PREFIX}<OPTION> (dashes -> underscores); "
        "flags win. Request API (SLO fields, headers, errors): docs/api.md."
    )
    # every option is declared once, in router/settings.py (flag, variable, default, validation)
    cli_settings.add_arguments(parser, RouterSettings)


def settings_from(args: argparse.Namespace | RouterSettings) -> RouterSettings:
    """Validated settings; a bad value exits naming its flag."""
    if isinstance(args, RouterSettings):
        return args
    try:
        return cli_settings.from_args(RouterSettings, args)
    except cli_settings.SettingsError as exc:
        raise SystemExit(f"jitserve router: {exc}") from None


def build(args: argparse.Namespace | RouterSettings) -> tuple[Any, Any]:
    """(ASGI app, Router) from parsed options; discovery and watches start with the app."""
    import asyncio

    from jitserve.router.app import serve_app
    from jitserve.router.auth import Keyring, keys_from_secret_data, parse_keys
    from jitserve.router.classes import ClassRegistry, snapshot_from_file
    from jitserve.router.pool import Pool
    from jitserve.router.service import Router
    from jitserve.scheduler.contracts.classes_configmap import builtin_snapshot, snapshot_from_data

    args = settings_from(args)
    if not args.engines and not args.engine_selector:
        raise SystemExit("jitserve router: give --engines URL[,URL...] or --engine-selector SELECTOR")
    config = args.to_config()
    registry = ClassRegistry()
    if args.classes_file:
        registry.replace(snapshot_from_file(args.classes_file, args.default_class))
    elif args.default_class:
        try:
            registry.replace(builtin_snapshot(args.default_class))
        except ValueError as exc:
            # The pool's ConfigMap may define the class; until it loads the router is not ready anyway.
            if not args.classes_configmap:
                raise SystemExit(f"jitserve router: {exc}") from None
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
                        registry.replace(snapshot_from_data(cm.data or {}, where, args.default_class))
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


def run(args: argparse.Namespace | RouterSettings) -> int:
    import gc
    import logging

    import uvicorn

    args = settings_from(args)
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
