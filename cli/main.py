"""The `jitserve` command: one entry point, one subcommand per component.

Each component registers its own subcommand in `SUBCOMMANDS`, so this file stays a thin dispatcher and
importing it never pulls in vLLM, kopf or FastAPI until that subcommand runs.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from jitserve import settings

# name -> (module with `add_arguments(parser)` and `run(args) -> int`, one-line help). A module with a
# `SETTINGS` class (jitserve.settings) has its options validated here, before `run`.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "engine": ("jitserve.engine.cli", "start a vLLM engine with the JITServe scheduler"),
    "router": ("jitserve.router.cli", "start the SLO-aware OpenAI-compatible router"),
    "operator": ("jitserve.operator.cli", "run the Kubernetes operator (kopf)"),
    "sim": ("jitserve.sim.cli", "simulate policies on a workload and compare goodput"),
    "bench": ("jitserve.local.bench", "run a workload against real local engines"),
    "up": ("jitserve.local.up", "run the whole stack on this machine"),
    "demo": ("jitserve.local.demo", "compare JITServe with vLLM FCFS on the local stack"),
    "crds": ("jitserve.operator.crdgen", "print or write the CRD YAML generated from the models"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jitserve",
        description="JITServe: SLO-aware LLM serving. Each subcommand has its own --help.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module_name, _parser=p)
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue  # component not installed in this image; its subcommand explains when run
        module.add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    module = importlib.import_module(args._module)
    if extra and not getattr(module, "ACCEPTS_EXTRA_ARGS", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra
    settings_cls = getattr(module, "SETTINGS", None)
    if settings_cls is not None:
        try:
            settings.from_args(settings_cls, args)
        except settings.SettingsError as exc:
            args._parser.error(str(exc))  # usage, the message naming the flag, exit status 2
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
