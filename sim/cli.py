"""`jitserve sim`: run policies on a workload in the simulator and compare their goodput.

Imports stay light at module level (the `jitserve` dispatcher imports every subcommand's module to
build its parser); the simulator loads inside `run`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from jitserve import settings as cli_settings
from jitserve.sim.settings import SimSettings

SETTINGS = SimSettings  # the options' one declaration (docgen reads it)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # every option is declared once, in sim/settings.py (flag, JITSERVE_SIM_* variable, default)
    cli_settings.add_arguments(parser, SimSettings)


def settings_from(args: argparse.Namespace | SimSettings) -> SimSettings:
    """Validated settings; a bad value (unknown workload or policy, a negative load) exits with status 2,
    naming its flag."""
    return cli_settings.parse_settings(SimSettings, args, "jitserve sim")


def _table(reports: dict, rate: float) -> str:  # type: ignore[type-arg]
    head = (
        f"{'policy':<16}{'tok goodput/s':>14}{'req goodput/s':>14}{'lat':>6}{'ddl':>6}{'cmp':>6}"
        f"{'ttft p50':>9}{'tbt p50':>8}{'thr tok/s':>10}{'drops':>7}{'wall s':>7}"
    )
    lines = [f"rate {rate:g} req/s per replica", head]
    for name, r in reports.items():
        att = r.attainment
        lines.append(
            f"{name:<16}{r.token_goodput:>14.1f}{r.request_goodput:>14.3f}"
            f"{att.get('latency', 0):>6.2f}{att.get('deadline', 0):>6.2f}{att.get('compound', 0):>6.2f}"
            f"{(r.ttft_p50 or 0):>9.2f}{(r.tbt_p50 or 0):>8.3f}{r.throughput_total_tokens_per_s:>10.0f}"
            f"{r.dropped:>7d}{r.wall_s:>7.1f}"
        )
    return "\n".join(lines)


def storm_warnings(reports: dict, rate: float) -> list[str]:  # type: ignore[type-arg]
    """A line per policy whose replicas preempted more than the storm threshold per second."""
    from jitserve.sim.metrics import PREEMPTION_STORM_PER_REPLICA_S as LIMIT

    return [
        f"warning: preemption storm: {name} at rate {rate:g} preempted "
        f"{r.preemptions_per_replica_s:.1f} times per replica-second (threshold {LIMIT:g}; "
        f"{r.kv_preemptions} of {r.preemptions} for KV blocks)"
        for name, r in reports.items()
        if r.preemption_storm
    ]


def _rates(args: argparse.Namespace | SimSettings, spec) -> list[float]:  # type: ignore[no-untyped-def]
    args = settings_from(args)
    if args.rates:
        return list(args.rates)
    if args.rate:
        return [args.rate]
    if args.load or args.loads:
        sat = spec.arrivals.saturation_per_replica
        if sat is None:
            raise ValueError(f"--load: workload {spec.name} has no arrivals.saturation_per_replica")
        loads = [args.load] if args.load else list(args.loads)
        return [round(x * sat, 6) for x in loads]
    return [spec.arrivals.rate_per_replica]


def run(args: argparse.Namespace | SimSettings) -> int:
    from tqdm import tqdm

    from jitserve.sim.runner import RunConfig, compare, make_bounds
    from jitserve.sim.workload import load_workload

    args = settings_from(args)
    try:
        spec = load_workload(args.workload)
    except (ValueError, OSError) as exc:
        print(f"jitserve sim: {exc}", file=sys.stderr)
        return 2
    policies = list(args.policies)
    try:
        rates = _rates(args, spec)
    except ValueError as exc:
        print(f"jitserve sim: {exc}", file=sys.stderr)
        return 2
    base = RunConfig(
        replicas=args.replicas,
        duration_s=args.duration,
        seed=args.seed,
        profile=args.profile,
        placement=args.placement,
        predictor=args.predictor,
        heterogeneity=args.heterogeneity,
    )
    duration = args.duration or spec.duration_s
    seed = spec.seed if args.seed is None else args.seed
    bounds = make_bounds(spec, base, seed)
    by_rate = {}
    # no progress bar when stderr is not a terminal: a log file would fill with its redraws
    bar = tqdm(
        total=len(rates) * len(policies) * int(duration),
        unit="sim-s",
        disable=args.quiet or not sys.stderr.isatty(),
        file=sys.stderr,
    )
    for rate in rates:
        cfg = dataclasses.replace(base, rate_per_replica=rate)  # the options', at this rate
        done: dict[str, float] = {}

        def progress(name: str, t: float, done: dict[str, float] = done, rate: float = rate) -> None:
            prev = done.get(name, 0.0)
            bar.set_description(f"{name} @ {rate:g}/s")
            bar.update(int(t) - int(prev))
            done[name] = t

        try:
            by_rate[rate] = compare(spec, policies, cfg, on_progress=progress, bounds=bounds)
        except ValueError as exc:
            bar.close()
            print(f"jitserve sim: {exc}", file=sys.stderr)
            return 2
    bar.close()
    for rate, reports in by_rate.items():
        print(_table(reports, rate))
        for line in storm_warnings(reports, rate):
            print(line)
        print()
    if args.json_out:
        out: dict[str, object] = {}
        first = by_rate[rates[0]]
        for name in policies:
            entry = first[name].to_json()
            entry.pop("goodput_timeline", None)
            if len(rates) > 1:
                entry["by_rate"] = {
                    str(r): {k: v for k, v in by_rate[r][name].to_json().items() if k != "goodput_timeline"}
                    for r in rates
                }
            entry["goodput_timeline"] = first[name].goodput_timeline
            out[name] = entry
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(out, indent=1))
    if args.plots:
        from jitserve.sim.plots import goodput_over_time, goodput_vs_rate

        args.plots.mkdir(parents=True, exist_ok=True)
        goodput_over_time(by_rate[rates[0]], args.plots / "goodput_over_time.png")
        if len(rates) > 1:
            goodput_vs_rate(by_rate, args.plots / "goodput_vs_rate.png")
            goodput_vs_rate(by_rate, args.plots / "request_goodput_vs_rate.png", metric="request_goodput")
    return 0
