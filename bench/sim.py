"""Paper-mix comparison across request rates: JITServe's goodput ratio over every baseline.

    python bench/sim.py --rates 1.5,2.5,3.5 --duration 600 --replicas 1 --out /tmp/simbench
    python bench/sim.py --scale            # 10,000 requests over an hour on 16 replicas: wall time
    python bench/sim.py --diagnose 3.5 [--predictor qrf]  # where the distance from the oracle comes from
    python bench/sim.py --placements 2.5 --replicas 4 --duration 300 [--admission on|off]
    python bench/sim.py --admission-sweep 1.5,2.5,3.5 --replicas 1 --duration 600
    python bench/sim.py --short-reply-rules 0.5,1.5,2.5,3.5 --duration 300 --seeds 0,1,2,3,4,5,6
    python bench/sim.py --suite --seeds 0,1,2 --out docs/benchmarks   # every workload x load x policy
    python bench/sim.py --saturation agentic          # vLLM FCFS's saturation rate on a workload
    python bench/sim.py --mechanisms agentic --loads 1,2 --seeds 0,1,2  # what each JITServe part costs
    python bench/sim.py --suite-variants occupancy,one-token --seeds 0,1,2  # admission variants, whole suite

Writes `<out>/ratios.md` (the tables of docs/benchmarks/sim.md) and `<out>/sweep.json`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from jitserve.scheduler.placement import DEPLOYED_SHORT_REPLY, ShortReplyRule
from jitserve.sim.settings import DEFAULT_POLICIES, JITSERVE, ORACLE, PAPER

# every baseline `jitserve sim` runs by default, in its order (sim/settings.py declares the names)
BASELINES = [p for p in DEFAULT_POLICIES if p not in (JITSERVE, ORACLE, PAPER)]


def ratios_markdown(by_rate: dict[float, dict[str, object]]) -> str:
    lines = []
    for metric in ("token_goodput", "request_goodput"):
        lines.append(f"\n**JITServe {metric.replace('_', ' ')} / baseline's**\n")
        names = [n for n in next(iter(by_rate.values())) if n != "jitserve"]
        lines.append("| rate/replica | " + " | ".join(names) + " |")
        lines.append("|---" * (len(names) + 1) + "|")
        for rate, reports in sorted(by_rate.items()):
            ours = getattr(reports["jitserve"], metric)
            cells = []
            for n in names:
                theirs = getattr(reports[n], metric)
                cells.append(f"{ours / theirs:.2f}" if theirs > 0 else "inf")
            lines.append(f"| {rate:g} | " + " | ".join(cells) + " |")
    lines.append("\n**Absolute numbers (token goodput/s, request goodput/s, total throughput tok/s)**\n")
    names = list(next(iter(by_rate.values())))
    lines.append("| rate | " + " | ".join(names) + " |")
    lines.append("|---" * (len(names) + 1) + "|")
    for rate, reports in sorted(by_rate.items()):
        cells = [
            f"{r.token_goodput:.0f} / {r.request_goodput:.2f} / {r.throughput_total_tokens_per_s:.0f}"  # type: ignore[attr-defined]
            for r in reports.values()
        ]
        lines.append(f"| {rate:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def scale_run() -> int:
    from jitserve.sim.runner import RunConfig, compare
    from jitserve.sim.workload import load_workload

    spec = load_workload("paper-mix")
    rate = 10_000 / 3600 / 16
    for policy in ("jitserve", "sarathi"):
        t0, c0 = time.perf_counter(), time.process_time()
        rep = compare(
            spec,
            [policy],
            RunConfig(rate_per_replica=rate, replicas=16, duration_s=3600, predictor="conditional"),
        )[policy]
        print(
            f"{policy}: {rep.requests} requests, 16 replicas, 3600 s simulated: "
            f"wall {time.perf_counter() - t0:.1f} s, cpu {time.process_time() - c0:.1f} s, "
            f"token goodput {rep.token_goodput:.0f}/s",
            flush=True,
        )
    return 0


def diagnose(rate: float, duration: float, predictor: str = "conditional") -> int:
    """Where JITServe's distance from the oracle comes from (docs/benchmarks/sim.md, section 1)."""
    import dataclasses

    from jitserve.scheduler.placement import ShortReplyRule
    from jitserve.sim import policies
    from jitserve.sim.runner import RunConfig, compare
    from jitserve.sim.workload import load_workload

    def variant(oracle: bool, deadlines: str):  # type: ignore[no-untyped-def]
        return lambda ctx: dataclasses.replace(policies._jitserve(ctx, oracle), deadlines=deadlines)

    def admission_knows(oracle_sched: bool, oracle_admission: bool):  # type: ignore[no-untyped-def]
        def build(ctx):  # type: ignore[no-untyped-def]
            setup = policies._jitserve(ctx, oracle_sched)
            params = dataclasses.replace(setup.policy.params, oracle=oracle_admission)  # type: ignore[attr-defined]
            return dataclasses.replace(setup, placement_params=params)

        return build

    policies.FACTORIES["true-lengths"] = variant(True, "analyzer")
    policies.FACTORIES["true-subdeadlines"] = variant(False, "oracle")
    # the router's admission and the engine's scheduling, each with and without the true lengths
    policies.FACTORIES["oracle-admission-only"] = admission_knows(False, True)
    policies.FACTORIES["oracle-scheduling-only"] = admission_knows(True, False)
    policies.FACTORIES["bound-admission"] = lambda ctx: dataclasses.replace(
        policies._jitserve(ctx, False), short_reply=ShortReplyRule.BOUND
    )
    spec = load_workload("paper-mix")
    cfg = RunConfig(rate_per_replica=rate, replicas=1, duration_s=duration, predictor=predictor)
    names = ["jitserve", "true-lengths", "true-subdeadlines", "jitserve-oracle"]
    runs = compare(spec, [*names, "oracle-admission-only", "oracle-scheduling-only", "bound-admission"], cfg)
    runs["no-router-admission"] = compare(
        spec, ["jitserve"], dataclasses.replace(cfg, router_admission=False)
    )["jitserve"]
    low = 0.5 if predictor == "conditional" else 0.55  # the analyzer's QRF takes quantiles in (0.5, 1)
    runs[f"bounds-q{low:g}"] = compare(spec, ["jitserve"], dataclasses.replace(cfg, quantile=low))["jitserve"]
    no_drop = spec.model_copy(update={"slo": spec.slo.model_copy(update={"waiting_time": 1e4})})
    runs["no-waiting-drop"] = compare(no_drop, ["jitserve"], cfg)["jitserve"]
    for name, rep in runs.items():
        print(f"{name:<20} token goodput {rep.token_goodput:8.1f}  request goodput {rep.request_goodput:.3f}")
    return 0


def _standin(rate: float, replicas: int, duration: float, **over: Any) -> Any:
    """The studies' run: the paper mix at `rate` per replica with the stand-in (conditional) predictor."""
    from jitserve.sim.runner import RunConfig

    return RunConfig(
        rate_per_replica=rate, replicas=replicas, duration_s=duration, predictor="conditional", **over
    )


def admission_sweep(rates: list[float], duration: float, replicas: int) -> int:
    """JITServe with and without the router's admission (place()) on the same arrivals."""
    from jitserve.sim.runner import compare
    from jitserve.sim.workload import load_workload

    spec = load_workload("paper-mix")
    for rate in rates:
        for admission in (False, True):
            cfg = _standin(rate, replicas, duration, router_admission=admission)
            rep = compare(spec, ["jitserve"], cfg)["jitserve"]
            att = " ".join(f"{k} {v:.2f}" for k, v in rep.attainment.items())
            print(
                f"rate {rate:g} admission {'on ' if admission else 'off'} "
                f"token goodput {rep.token_goodput:8.1f}"
                f"  request goodput {rep.request_goodput:.3f}  rejected {rep.rejected}  dropped {rep.dropped}"
                f"  attainment {att}",
                flush=True,
            )
    return 0


def short_reply_rules(rates: list[float], duration: float, replicas: int, seeds: list[int]) -> int:
    """place()'s rules for requests on time only with a reply shorter than the bound, on paired
    arrivals: occupancy (deployed: B/4), no-queue (a free slot, no queue delay), one-token (always
    admit) and bound (never admit)."""
    import dataclasses

    from jitserve.scheduler.placement import ShortReplyRule
    from jitserve.sim import policies
    from jitserve.sim.runner import compare
    from jitserve.sim.workload import load_workload

    spec = load_workload("paper-mix")
    for rule in ShortReplyRule:
        policies.FACTORIES[f"rule-{rule}"] = lambda ctx, r=rule: dataclasses.replace(
            policies._jitserve(ctx, False), short_reply=r
        )
    for rate in rates:
        for seed in seeds:
            cfg = _standin(rate, replicas, duration, seed=seed)
            for rule in ShortReplyRule:  # one rule per run: each on the same arrivals, as before
                rep = compare(spec, [f"rule-{rule}"], cfg)[f"rule-{rule}"]
                print(
                    f"rate {rate:g} seed {seed} rule {rule:<9} token goodput {rep.token_goodput:8.1f}"
                    f"  request goodput {rep.request_goodput:.3f}  rejected {rep.rejected}",
                    flush=True,
                )
    return 0


def placements(rate: float, duration: float, replicas: int, admission: bool | None = None) -> int:
    from jitserve.sim.runner import compare
    from jitserve.sim.workload import load_workload

    spec = load_workload("paper-mix")
    for placement in ("power-of-k", "round-robin", "least-load", "power-of-two"):
        cfg = _standin(rate, replicas, duration, placement=placement, router_admission=admission)
        rep = compare(spec, ["jitserve"], cfg)["jitserve"]
        att = " ".join(f"{k} {v:.2f}" for k, v in rep.attainment.items())
        print(
            f"jitserve {placement:<13} token goodput {rep.token_goodput:8.1f}  "
            f"request goodput {rep.request_goodput:.3f}  rejected {rep.rejected}  attainment {att}",
            flush=True,
        )
    return 0


def suite_run(
    out: Path, seeds: list[int], loads: list[float] | None, workloads: list[str] | None, scale: float
) -> int:
    """The workload suite (sim/suite.py): writes <out>/suite.json and <out>/suite.md."""
    from jitserve.sim import suite

    chosen = tuple(w for w in suite.SUITE if not workloads or w.name in workloads)
    t0, c0 = time.perf_counter(), time.process_time()
    doc = suite.run_suite(
        workloads=chosen,
        loads=tuple(loads or suite.LOADS),
        seeds=tuple(seeds),
        duration_scale=scale,
        log=lambda m: print(f"{m} (total {time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True),
        checkpoint=lambda d: suite.write({**d, "cpu_s": time.process_time() - c0, "partial": True}, out),
    )
    doc["wall_s"] = time.perf_counter() - t0
    doc["cpu_s"] = time.process_time() - c0  # one process, one core: the budget (<= 25 minutes)
    suite.write(doc, out)
    print(suite.suite_markdown(doc))
    print(f"wall {doc['wall_s']:.0f} s, cpu {doc['cpu_s']:.0f} s; {out / 'suite.json'}, {out / 'suite.md'}")
    return 0


# Admission variants `--suite-variants` knows: the deployed setup first (it must reproduce the stored run),
# then place()'s other short-reply rules (by their `ShortReplyRule` names) and GMAX's B at max_num_seqs.
SUITE_VARIANTS = (
    "deployed",
    *(r.value for r in ShortReplyRule if r is not DEPLOYED_SHORT_REPLY),
    "b-max-num-seqs",
)


def suite_variants(
    names: list[str],
    stored_path: Path,
    seeds: list[int],
    loads: list[float] | None,
    workloads: list[str] | None,
) -> int:
    """JITServe and its oracle re-run on the suite under each admission variant; the baselines are the
    stored run's (`stored_path`, a suite.json), which is valid only while their code is unchanged: the
    `deployed` row must then reproduce the stored JITServe exactly (geometric mean 1.000)."""
    import dataclasses
    import math
    import statistics

    from jitserve.sim import policies, suite

    stored = json.loads(stored_path.read_text())
    chosen = tuple(w for w in suite.SUITE if not workloads or w.name in workloads)
    loads = loads or list(suite.LOADS)
    missing = [
        f"{w} load {load:g} seed {seed}"
        for w in (workloads or [w.name for w in suite.SUITE])
        for load in loads
        for seed in seeds
        if str(seed) not in stored["workloads"].get(w, {}).get("by_load", {}).get(f"{load:g}", {})
    ]
    if missing:
        more = " ..." if len(missing) > 3 else ""
        print(f"--stored: {stored_path} has no run of {', '.join(missing[:3])}{more}", file=sys.stderr)
        return 2
    # the variants run at the stored run's own windows (a `--suite --duration-scale` run stores longer ones)
    scales = {round(stored["workloads"][w.name]["duration_s"] / w.duration_s, 6) for w in chosen}
    if len(scales) != 1:
        print(
            f"--stored: {stored_path} scales its workloads' windows unevenly: {sorted(scales)}",
            file=sys.stderr,
        )
        return 2
    (duration_scale,) = scales
    deployed = {k: policies.FACTORIES[k] for k in (JITSERVE, ORACLE)}

    def build(name: str, oracle: bool):  # type: ignore[no-untyped-def]
        def factory(ctx):  # type: ignore[no-untyped-def]
            if name == "b-max-num-seqs":
                ctx = dataclasses.replace(ctx, gmax_step_share=math.inf)
            setup = policies._jitserve(ctx, oracle)
            if name in ("deployed", "b-max-num-seqs"):
                return setup
            return dataclasses.replace(setup, short_reply=ShortReplyRule(name))

        return factory

    print(
        "| variant | cells meeting every goal "
        "| JITServe tok/s over the stored run: geometric mean (min-max) |"
    )
    print("|---|---|---|")
    cells_out: dict[str, list[str]] = {}
    try:
        for name in ["deployed", *[n for n in names if n != "deployed"]]:
            policies.FACTORIES[JITSERVE] = build(name, False)
            policies.FACTORIES[ORACLE] = build(name, True)
            # the suite's own loop, for these two policies only
            doc = suite.run_suite(
                workloads=chosen,
                loads=tuple(loads),
                seeds=tuple(seeds),
                policies=(JITSERVE, ORACLE),
                predictor=stored.get("predictor", "conditional"),
                duration_scale=duration_scale,
            )
            met, ratios, lines = 0, [], []
            for w in chosen:
                for load in loads:
                    stored_cell = stored["workloads"][w.name]["by_load"][f"{load:g}"]
                    new_cell = doc["workloads"][w.name]["by_load"][f"{load:g}"]
                    runs = {str(s): {**stored_cell[str(s)], **new_cell[str(s)]} for s in seeds}
                    verdict = suite.cell_verdicts(runs, stored["policies"])
                    before = statistics.fmean(stored_cell[str(s)][JITSERVE]["token_goodput"] for s in seeds)
                    ratio = verdict["jitserve_token_goodput"] / before if before else 1.0
                    ratios.append(ratio)
                    met += not verdict["fails"]
                    # per class: the stored run's attainment -> this variant's (a class can lose while the
                    # total gains)
                    stored_attainment = {
                        c: statistics.fmean(
                            stored_cell[str(s)][JITSERVE]["attainment"].get(c, 0.0) for s in seeds
                        )
                        for c in verdict["classes"]
                    }
                    classes = ", ".join(
                        f"{c} {stored_attainment[c]:.2f} -> {v['attainment'][0]:.2f}"
                        for c, v in sorted(verdict["classes"].items())
                    )
                    lines.append(
                        f"| {w.name} | {load:g} | {ratio:.3f} "
                        f"| {verdict['vs_best']:.2f} ({verdict['best_baseline']}) | {classes} "
                        f"| {'; '.join(verdict['fails']) or 'met'} |"
                    )
            gm = math.exp(statistics.fmean(math.log(max(r, 1e-9)) for r in ratios))
            print(
                f"| {name} | {met} of {len(ratios)} | {gm:.3f} ({min(ratios):.3f}-{max(ratios):.3f}) |",
                flush=True,
            )
            cells_out[name] = lines
    finally:
        policies.FACTORIES.update(deployed)
    for name, lines in cells_out.items():
        print(
            f"\n{name}: per cell\n| workload | load | over the stored run | over the best baseline "
            "| attainment per class, stored -> this | goals |"
        )
        print("|---|---|---|---|---|---|")
        print("\n".join(lines))
    return 0


def saturation(names: list[str]) -> int:
    """vLLM FCFS's saturation rate per replica on each workload (sim/suite.py: saturation_rate)."""
    from jitserve.sim import suite
    from jitserve.sim.workload import load_workload

    by_name = {w.name: w for w in suite.SUITE}
    for name in names:
        spec = load_workload(name)
        w = by_name.get(name)
        replicas = w.replicas if w and w.replicas else spec.replicas
        duration = 120.0 if replicas >= 8 else 300.0
        sat = suite.saturation_rate(spec, replicas=replicas, duration_s=duration, start=0.5)
        print(f"{name}: {sat:.3f} requests/s per replica ({replicas} replicas, {duration:g} s windows)")
    return 0


def _by_rule(reps: list[Any]) -> str:
    """Admission's rejections per "<SLO type>: <rule>", means over seeds (the rules: scheduler.placement's
    `Rejection`); "-" when nothing was rejected."""
    keys = sorted({k for r in reps for k in r.rejections_by_rule})
    means = {k: sum(r.rejections_by_rule.get(k, 0) for r in reps) / len(reps) for k in keys}
    return ", ".join(f"{k} {round(v, 1):g}" for k, v in means.items() if v) or "-"


def mechanism_variants() -> dict[str, Any]:
    """`--mechanisms`' variants: policy factories, each JITServe with one mechanism switched off or
    changed. The simulator calls a factory once per replica of every run, so a factory must build the
    same variant every time (one used to pop its settings on the first call: only the first replica of
    the first run was the variant)."""
    import dataclasses

    from jitserve.scheduler.policy import GMAXPolicy
    from jitserve.sim import policies

    class NoMidframe(GMAXPolicy):
        @property
        def preempts_midframe(self) -> bool:  # type: ignore[override]
            return False

    def jit(params: dict[str, Any] | None = None, no_midframe: bool = False, **setup_fields: Any):  # type: ignore[no-untyped-def]
        def build(ctx):  # type: ignore[no-untyped-def]
            setup = policies._jitserve(ctx, False)
            gmax = setup.policy.params  # type: ignore[attr-defined]
            if params:
                gmax = dataclasses.replace(gmax, **params)
            policy = (NoMidframe if no_midframe else GMAXPolicy)(params=gmax)
            return dataclasses.replace(setup, policy=policy, **setup_fields)

        return build

    return {
        "m:no-preemption": jit(params={"preemption": "never"}),
        "m:no-midframe-preemption": jit(no_midframe=True),
        "m:no-queue rule": jit(short_reply=ShortReplyRule.NO_QUEUE),
        "m:one-token admission": jit(short_reply=ShortReplyRule.ONE_TOKEN),
        "m:bound admission": jit(short_reply=ShortReplyRule.BOUND),
        "m:stages with a program stake exempt (later-stages)": jit(short_reply=ShortReplyRule.LATER_STAGES),
        "m:occupancy rule (busy replicas take no short-reply request)": jit(
            short_reply=ShortReplyRule.OCCUPANCY
        ),
        "m:B=max_num_seqs": lambda ctx: jit(params={"batch_size": ctx.batch_size})(ctx),
        "m:least-load placement (no admission)": jit(placement="least-load", router_admission=False),
    }


def mechanisms(name: str, loads: list[float], seeds: list[int], scale: float) -> int:
    """What each of JITServe's mechanisms costs or earns on a workload: the deployed JITServe, then one
    mechanism switched off (or changed) per variant, on the same arrivals; the best baseline for scale.
    Token goodput and per-class attainment, means over seeds."""
    import dataclasses
    import statistics

    from jitserve.sim import policies, suite
    from jitserve.sim.runner import RunConfig, compare, make_bounds
    from jitserve.sim.workload import load_workload

    variants = mechanism_variants()
    policies.FACTORIES.update(variants)
    spec = load_workload(name)
    w = {x.name: x for x in suite.SUITE}.get(name)
    replicas = (w.replicas if w else None) or spec.replicas
    duration = (w.duration_s if w else spec.duration_s) * scale
    sat = spec.arrivals.saturation_per_replica or spec.arrivals.rate_per_replica
    # the baselines the issue names (EDF, Sarathi-Serve, SLOs-Serve, Tempo) and vLLM FCFS
    baselines = ["vllm", "sarathi", "edf", "slos-serve", "tempo"]
    base_names = ["jitserve", *variants, "jitserve-paper", "jitserve-oracle", *baselines]
    no_drop = spec.model_copy(update={"slo": spec.slo.model_copy(update={"waiting_time": 1e4})})
    for load in loads:
        rows: dict[str, list[Any]] = {}
        for seed in seeds:
            cfg = RunConfig(
                rate_per_replica=load * sat,
                replicas=replicas,
                duration_s=duration,
                seed=seed,
                predictor="conditional",
            )
            bounds = make_bounds(spec, cfg, seed)
            runs = compare(spec, base_names, cfg, bounds=bounds)
            runs["m:no-router-admission"] = compare(
                spec, ["jitserve"], dataclasses.replace(cfg, router_admission=False), bounds=bounds
            )["jitserve"]
            runs["m:no-waiting-drop"] = compare(no_drop, ["jitserve"], cfg, bounds=bounds)["jitserve"]
            for k, rep in runs.items():
                rows.setdefault(k, []).append(rep)
        best = max(baselines, key=lambda b: statistics.fmean(r.token_goodput for r in rows[b]))
        ref = statistics.fmean(r.token_goodput for r in rows["jitserve"])
        print(
            f"\n{name} at load {load:g} ({load * sat:.3f} req/s per replica, {replicas} replicas, "
            f"{duration:g} s, seeds {seeds}); best baseline: {best}"
        )
        print(
            "| variant | token goodput | vs JITServe | per class attainment | rejected | dropped "
            "| preempt/replica-s | rejected by type and rule |"
        )
        print("|---|---|---|---|---|---|---|---|")
        show = [
            "jitserve",
            *[k for k in rows if k.startswith("m:")],
            "jitserve-paper",
            "jitserve-oracle",
            best,
            "vllm",
        ]
        for k in show:
            reps = rows[k]
            tok = statistics.fmean(r.token_goodput for r in reps)
            att = ", ".join(
                f"{c} {statistics.fmean(r.attainment.get(c, 0.0) for r in reps):.2f}"
                for c in sorted(reps[0].attainment)
            )
            print(
                f"| {k.removeprefix('m:')} | {tok:.0f} | {tok / ref if ref else float('nan'):.2f} | {att} | "
                f"{statistics.fmean(r.rejected for r in reps):.0f} | "
                f"{statistics.fmean(r.dropped for r in reps):.0f} | "
                f"{statistics.fmean(r.preemptions_per_replica_s for r in reps):.2f} | {_by_rule(reps)} |",
                flush=True,
            )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rates", default="1.5,2.5,3.5")
    parser.add_argument("--duration", type=float, default=600.0)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument(
        "--policies",
        default=None,
        help="the paper-mix rate sweep's policies (default: JITServe, the oracle and every baseline); "
        "--suite always runs every policy of sim/suite.py, which its goals compare",
    )
    parser.add_argument("--predictor", default="auto")
    parser.add_argument("--out", type=Path, default=Path("/tmp/simbench"))
    parser.add_argument("--scale", action="store_true", help="only the 10k-request / 16-replica timing run")
    parser.add_argument("--diagnose", type=float, metavar="RATE", help="oracle-gap variants at this rate")
    parser.add_argument("--placements", type=float, metavar="RATE", help="JITServe under each placement")
    parser.add_argument(
        "--admission",
        choices=("on", "off"),
        default=None,
        help="with --placements: router admission (place()) on or off (default: JITServe's own setting)",
    )
    parser.add_argument(
        "--admission-sweep", metavar="RATES", help="JITServe with and without router admission at these rates"
    )
    parser.add_argument(
        "--short-reply-rules",
        metavar="RATES",
        help="place()'s rules for requests on time only with a shorter-than-bound reply, side by side",
    )
    parser.add_argument(
        "--seeds",
        default="0",
        help="with --short-reply-rules, --suite, --mechanisms, --suite-variants: workload seeds",
    )
    parser.add_argument(
        "--suite", action="store_true", help="every workload x load x policy x seed (sim/suite.py)"
    )
    parser.add_argument(
        "--loads", help="with --suite, --mechanisms: multiples of saturation (default 0.5,1,1.5,2)"
    )
    parser.add_argument("--workloads", help="with --suite: only these workloads (comma-separated)")
    parser.add_argument(
        "--duration-scale",
        type=float,
        default=1.0,
        help="with --suite, --mechanisms: scale the arrival windows",
    )
    parser.add_argument("--saturation", metavar="WORKLOADS", help="measure vLLM FCFS's saturation rate")
    parser.add_argument(
        "--merge",
        metavar="DIRS",
        help="merge --suite outputs of disjoint seeds (comma-separated dirs) into --out",
    )
    parser.add_argument("--mechanisms", metavar="WORKLOAD", help="JITServe with each mechanism switched off")
    parser.add_argument(
        "--suite-variants",
        metavar="NAMES",
        help="JITServe and its oracle on the suite under these admission variants "
        f"({', '.join(SUITE_VARIANTS)}), against the baselines of a stored suite run (--stored); "
        "with --seeds, --loads, --workloads",
    )
    parser.add_argument(
        "--stored",
        type=Path,
        default=Path("docs/benchmarks/suite/suite.json"),
        help="with --suite-variants: the suite run whose baselines the variants are judged against, at its "
        "windows",
    )
    args = parser.parse_args(argv)
    seeds = [int(x) for x in args.seeds.split(",")]
    loads = [float(x) for x in args.loads.split(",")] if args.loads else None
    if args.suite and args.policies is not None:
        # the suite judges JITServe against vLLM FCFS and the best baseline: a subset cannot be judged
        parser.error("--policies: --suite runs every policy of sim/suite.py (POLICIES); leave it out")
    if args.suite_variants:
        names = args.suite_variants.split(",")
        unknown = [n for n in names if n not in SUITE_VARIANTS]
        if unknown:
            parser.error(
                f"--suite-variants: unknown {', '.join(unknown)} (known: {', '.join(SUITE_VARIANTS)})"
            )
        if args.duration_scale != 1.0:
            parser.error(
                "--duration-scale: --suite-variants runs at the windows of the stored run (--stored)"
            )
        if not args.stored.is_file():
            parser.error(f"--stored: no suite run at {args.stored} (bench/sim.py --suite writes one)")
        workloads = args.workloads.split(",") if args.workloads else None
        return suite_variants(names, args.stored, seeds, loads, workloads)
    if args.suite:
        workloads = args.workloads.split(",") if args.workloads else None
        return suite_run(args.out, seeds, loads, workloads, args.duration_scale)
    if args.saturation:
        return saturation(args.saturation.split(","))
    if args.merge:
        from jitserve.sim import suite

        doc = suite.merge([json.loads((Path(d) / "suite.json").read_text()) for d in args.merge.split(",")])
        suite.write(doc, args.out)
        print(suite.suite_markdown(doc))
        print(f"cpu {doc.get('cpu_s', 0):.0f} s over {len(args.merge.split(','))} processes")
        return 0
    if args.mechanisms:
        return mechanisms(args.mechanisms, loads or [1.0, 2.0], seeds, args.duration_scale)
    if args.scale:
        return scale_run()
    if args.diagnose:
        # the stand-in predictor unless --predictor says otherwise (the tables before this option)
        return diagnose(
            args.diagnose, args.duration, "conditional" if args.predictor == "auto" else args.predictor
        )
    if args.admission_sweep:
        rates = [float(r) for r in args.admission_sweep.split(",")]
        return admission_sweep(rates, args.duration, args.replicas)
    if args.short_reply_rules:
        rates = [float(r) for r in args.short_reply_rules.split(",")]
        return short_reply_rules(rates, args.duration, args.replicas, [int(x) for x in args.seeds.split(",")])
    if args.placements:
        admission = None if args.admission is None else args.admission == "on"
        return placements(args.placements, args.duration, args.replicas, admission)
    from jitserve.sim.runner import RunConfig, compare, make_bounds
    from jitserve.sim.workload import load_workload

    spec = load_workload("paper-mix")
    policies = (args.policies or ",".join(["jitserve", "jitserve-oracle", *BASELINES])).split(",")
    base = RunConfig(replicas=args.replicas, duration_s=args.duration, predictor=args.predictor)
    bounds = make_bounds(spec, base, spec.seed)
    by_rate = {}
    for rate in [float(r) for r in args.rates.split(",")]:
        cfg = RunConfig(
            rate_per_replica=rate, replicas=args.replicas, duration_s=args.duration, predictor=args.predictor
        )
        by_rate[rate] = compare(spec, policies, cfg, bounds=bounds)
        print(f"rate {rate:g} done", file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ratios.md").write_text(ratios_markdown(by_rate))
    (args.out / "sweep.json").write_text(
        json.dumps(
            {str(r): {n: rep.to_json() for n, rep in reps.items()} for r, reps in by_rate.items()}, indent=1
        )
    )
    print(ratios_markdown(by_rate))
    return 0


if __name__ == "__main__":
    sys.exit(main())
