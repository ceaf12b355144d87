"""The workload suite: every shipped workload, swept from light load to twice saturation, every policy.

Load is relative to each workload's **saturation rate**: the requests per second per replica that vLLM
FCFS (`vllm`, the paper's vLLM baseline) completes when it is overloaded (`saturation_rate`). A load of
1.0 offers exactly that; 2.0 offers twice what FCFS can serve. Each workload records its measured rate
in `arrivals.saturation_per_replica`, and its default rate (`arrivals.rate_per_replica`) is 1.5 times it,
so `jitserve sim --workload NAME` with no flags runs a loaded regime.

`run_suite` writes per workload, load, seed and policy: token goodput, request goodput, and per request
type (class) token goodput and attainment; `suite_markdown` turns that into the goals' table (JITServe
vs the best baseline, every class vs vLLM FCFS, the oracle vs JITServe) and flags each failed cell.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jitserve.sim.runner import RunConfig, compare, make_bounds
from jitserve.sim.settings import BASELINES, JITSERVE, ORACLE, PAPER
from jitserve.sim.workload import WorkloadSpec, generate, load_workload

FCFS = "vllm"  # the reference for load and for "no class below vLLM FCFS"
POLICIES = (JITSERVE, PAPER, ORACLE, *BASELINES)
LOADS = (0.5, 1.0, 1.5, 2.0)
# A ratio counts as a loss only below this: seeds' spread and ties at light load (every policy serves
# nearly everything) sit within it.
TOLERANCE = 0.01


@dataclass(frozen=True, slots=True)
class SuiteWorkload:
    name: str
    duration_s: float  # arrival window in the sweep (shorter than the workload's own default)
    replicas: int | None = None  # None: the workload's own


# Durations keep the whole sweep (5 workloads x 4 loads x 14 policies x 3 seeds) under 25 minutes on one
# core: each run offers a few hundred requests at load 1.0 (docs/benchmarks/sim.md, "Workload suite").
SUITE = (
    SuiteWorkload("paper-mix", 120.0, replicas=1),
    SuiteWorkload("chat-heavy", 30.0),
    SuiteWorkload("agentic", 60.0),
    SuiteWorkload("bursty", 40.0),
    SuiteWorkload("agentic-fleet", 25.0),
)


def saturation_rate(
    spec: WorkloadSpec,
    policy: str = FCFS,
    replicas: int | None = None,
    duration_s: float = 300.0,
    seeds: tuple[int, ...] = (0, 1, 2),
    start: float | None = None,
) -> float:
    """Requests/s per replica that `policy` sustains, measured in work under overload.

    Offer a rate and count the tokens (prefill + decode) the replicas process inside the arrival
    window; while that keeps up with the tokens offered (>= 70%), double the offer (first seed only).
    At the first offer it cannot keep up with, the mean over `seeds` of the tokens processed per
    replica-second is the capacity; divided by the workload's mean tokens per request (every call's
    prompt and reply) it is the saturation rate. Counted in tokens rather than finished requests: a
    compound program finishing just after the window would otherwise count as nothing. The capacity
    still depends on the seed (a heavy-tailed mix) and on how deep the overload is (vLLM v0's
    prefill-first steps speed up with a deeper queue): it is a reference for load, good to ~15%."""
    replicas = replicas or spec.replicas
    per_request = mean_tokens_per_request(spec)
    rate = start or spec.arrivals.saturation_per_replica or spec.arrivals.rate_per_replica
    cfg = RunConfig(replicas=replicas, duration_s=duration_s, seed=seeds[0], predictor="conditional")
    for _ in range(12):
        tokens = _processed_tokens_per_replica_s(
            spec, policy, dataclasses.replace(cfg, rate_per_replica=rate)
        )
        if tokens < 0.7 * rate * per_request:
            break
        rate *= 2.0
    else:
        raise RuntimeError(f"{spec.name}: {policy} kept up with {rate:g} requests/s per replica")
    more = [
        _processed_tokens_per_replica_s(spec, policy, dataclasses.replace(cfg, rate_per_replica=rate, seed=s))
        for s in seeds[1:]
    ]
    return statistics.fmean([tokens, *more]) / per_request


def mean_tokens_per_request(spec: WorkloadSpec, n: int = 20_000) -> float:
    """Prompt plus reply tokens of every call, averaged over requests (a program counts once)."""
    programs = generate(spec, rate=n / spec.duration_s, replicas=1, seed=spec.seed + 424_242)
    return statistics.fmean(sum(c.input_len + c.output_len for c in p.calls) for p in programs)


def _processed_tokens_per_replica_s(spec: WorkloadSpec, policy: str, cfg: RunConfig) -> float:
    from jitserve.sim.runner import make_subdeadlines, resolve_profile
    from jitserve.sim.simulator import simulate

    assert cfg.duration_s is not None and cfg.replicas is not None
    seed = spec.seed if cfg.seed is None else cfg.seed
    programs = generate(
        spec, rate=cfg.rate_per_replica, replicas=cfg.replicas, seed=seed, duration_s=cfg.duration_s
    )
    profile = resolve_profile(spec, cfg)
    out = simulate(
        programs,
        policy,
        profile,
        cfg.replicas,
        make_bounds(spec, cfg, seed),
        horizon=cfg.duration_s,
        seed=seed,
        drain_s=0.0,
        subdeadlines=make_subdeadlines(spec, cfg, seed, profile),
    )
    tokens = sum(e.stats.prefill_tokens + e.stats.decode_tokens for e in out.engines)
    span = max(max(e.clock for e in out.engines), cfg.duration_s)
    return tokens / (span * cfg.replicas)


def run_suite(
    workloads: tuple[SuiteWorkload, ...] = SUITE,
    loads: tuple[float, ...] = LOADS,
    seeds: tuple[int, ...] = (0, 1, 2),
    policies: tuple[str, ...] = POLICIES,
    predictor: str = "conditional",
    duration_scale: float = 1.0,
    log: Callable[[str], None] | None = None,
    checkpoint: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Every workload x load x seed x policy. Returns the JSON document (see the module docstring)."""
    doc: dict[str, Any] = {
        "policies": list(policies),
        "loads": list(loads),
        "seeds": list(seeds),
        "predictor": predictor,
        "workloads": {},
    }
    for w in workloads:
        spec = load_workload(w.name)
        sat = spec.arrivals.saturation_per_replica
        if sat is None:
            raise ValueError(
                f"workload {w.name}: no arrivals.saturation_per_replica (bench/sim.py --saturation)"
            )
        replicas = w.replicas or spec.replicas
        duration = w.duration_s * duration_scale
        entry: dict[str, Any] = {
            "saturation_per_replica": sat,
            "replicas": replicas,
            "duration_s": duration,
            "by_load": {},
        }
        doc["workloads"][w.name] = entry
        for seed in seeds:
            base = RunConfig(replicas=replicas, duration_s=duration, seed=seed, predictor=predictor)
            bounds = make_bounds(spec, base, seed)
            for load in loads:
                t0, c0 = time.perf_counter(), time.process_time()
                cfg = dataclasses.replace(base, rate_per_replica=load * sat)
                reports = compare(spec, list(policies), cfg, bounds=bounds)
                cell = entry["by_load"].setdefault(f"{load:g}", {})
                cell[str(seed)] = {name: _summary(rep) for name, rep in reports.items()}
                if log:
                    log(
                        f"{w.name} load {load:g} seed {seed}: wall {time.perf_counter() - t0:.1f} s, "
                        f"cpu {time.process_time() - c0:.1f} s"
                    )
                if checkpoint:  # what is done so far, in case the sweep is stopped
                    checkpoint(doc)
    return doc


def _summary(rep: Any) -> dict[str, Any]:
    return _rounded(
        {
            "token_goodput": rep.token_goodput,
            "request_goodput": rep.request_goodput,
            "token_goodput_by_type": rep.token_goodput_by_type,
            "attainment": rep.attainment,
            "requests": rep.requests,
            "rejected": rep.rejected,
            "dropped": rep.dropped,
            "preemptions_per_replica_s": rep.preemptions_per_replica_s,
            "ttft_p50": rep.ttft_p50,
        }
    )


def _rounded(x: Any) -> Any:
    """Four significant digits: the JSON of 840 runs stays small enough to commit."""
    if isinstance(x, float):
        return float(f"{x:.4g}")
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    return x


# ------------------------------------------------------------------------------------------- tables
def _mean(runs: dict[str, dict[str, Any]], policy: str, get: Callable[[dict[str, Any]], float]) -> float:
    return statistics.fmean(get(r[policy]) for r in runs.values())


def _spread(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}" if len(values) > 1 else f"{values[0]:.2f}"


def _ratio(a: float, b: float) -> float:
    if b <= 0:
        return float("inf") if a > 0 else 1.0
    return a / b


def _classes(runs: dict[str, dict[str, Any]]) -> list[str]:
    first = next(iter(runs.values()))
    return sorted(next(iter(first.values()))["attainment"])


def cell_verdicts(runs: dict[str, dict[str, Any]], policies: list[str]) -> dict[str, Any]:
    """One workload at one load, over seeds: the goals' numbers (means over seeds) and which fail."""
    tok = lambda r: r["token_goodput"]  # noqa: E731
    baselines = [p for p in policies if p in BASELINES]
    ours = _mean(runs, JITSERVE, tok)
    best = max(baselines, key=lambda p: _mean(runs, p, tok))
    best_ratio = _ratio(ours, _mean(runs, best, tok))
    per_seed = [
        _ratio(r[JITSERVE]["token_goodput"], max(r[p]["token_goodput"] for p in baselines))
        for r in runs.values()
    ]
    out: dict[str, Any] = {
        "jitserve_token_goodput": ours,
        "best_baseline": best,
        "vs_best": best_ratio,
        "vs_best_seeds": per_seed,
        "fails": [],
    }
    if best_ratio < 1 - TOLERANCE:
        out["fails"].append(f"total < {best}")
    classes: dict[str, Any] = {}
    for c in _classes(runs):
        g_ours = _mean(runs, JITSERVE, lambda r, c=c: r["token_goodput_by_type"].get(c, 0.0))
        g_fcfs = _mean(runs, FCFS, lambda r, c=c: r["token_goodput_by_type"].get(c, 0.0))
        a_ours = _mean(runs, JITSERVE, lambda r, c=c: r["attainment"].get(c, 0.0))
        a_fcfs = _mean(runs, FCFS, lambda r, c=c: r["attainment"].get(c, 0.0))
        classes[c] = {"goodput": _ratio(g_ours, g_fcfs), "attainment": (a_ours, a_fcfs)}
        if g_ours < (1 - TOLERANCE) * g_fcfs or a_ours < a_fcfs - TOLERANCE:
            out["fails"].append(f"{c} < FCFS")
    out["classes"] = classes
    if ORACLE in policies:
        out["oracle_vs_jitserve"] = _ratio(_mean(runs, ORACLE, tok), ours)
        if out["oracle_vs_jitserve"] < 1 - TOLERANCE:
            out["fails"].append("oracle < JITServe")
    if PAPER in policies:
        out["paper_vs_jitserve"] = _ratio(_mean(runs, PAPER, tok), ours)
    return out


def suite_markdown(doc: dict[str, Any]) -> str:
    policies = doc["policies"]
    lines = [
        "| workload | load | JITServe tok/s | best baseline | JITServe / best (seeds) "
        "| per class vs vLLM FCFS: goodput ratio, attainment ours/FCFS "
        "| oracle / JITServe | paper ranking / JITServe | goals |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    failed = 0
    cells = 0
    for name, w in doc["workloads"].items():
        for load, runs in w["by_load"].items():
            v = cell_verdicts(runs, policies)
            cells += 1
            failed += bool(v["fails"])
            cls = "; ".join(
                f"{c} {x['goodput']:.2f}x, {x['attainment'][0]:.2f}/{x['attainment'][1]:.2f}"
                for c, x in v["classes"].items()
            )
            lines.append(
                f"| {name} | {load} | {v['jitserve_token_goodput']:.0f} | {v['best_baseline']} | "
                f"{v['vs_best']:.2f} ({_spread(v['vs_best_seeds'])}) | {cls} | "
                f"{v.get('oracle_vs_jitserve', float('nan')):.2f} | "
                f"{v.get('paper_vs_jitserve', float('nan')):.2f} | "
                f"{'**FAIL: ' + ', '.join(v['fails']) + '**' if v['fails'] else 'met'} |"
            )
    lines.append("")
    lines.append(
        f"{cells - failed} of {cells} cells meet every goal (tolerance {TOLERANCE:.0%}, means over seeds)."
    )
    return "\n".join(lines) + "\n"


def absolute_markdown(doc: dict[str, Any]) -> str:
    """Token goodput (mean over seeds) of every policy, per workload and load."""
    policies = doc["policies"]
    lines = ["| workload | load | " + " | ".join(policies) + " |", "|---" * (len(policies) + 2) + "|"]
    for name, w in doc["workloads"].items():
        for load, runs in w["by_load"].items():
            cells = [f"{_mean(runs, p, lambda r: r['token_goodput']):.0f}" for p in policies]
            lines.append(f"| {name} | {load} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def merge(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """One document from runs of the same suite over disjoint seeds (parallel processes)."""
    out = json.loads(json.dumps(docs[0]))
    for doc in docs[1:]:
        if doc["policies"] != out["policies"] or doc["loads"] != out["loads"]:
            raise ValueError("merge: the documents ran different policies or loads")
        out["seeds"] = sorted(set(out["seeds"]) | set(doc["seeds"]))
        for name, w in doc["workloads"].items():
            dest = out["workloads"].setdefault(name, json.loads(json.dumps(w)))
            for load, runs in w["by_load"].items():
                dest["by_load"].setdefault(load, {}).update(runs)
        for key in ("wall_s", "cpu_s"):
            if key in doc:
                out[key] = out.get(key, 0.0) + doc[key]
    return out


def write(doc: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "suite.json").write_text(json.dumps(doc, sort_keys=True, separators=(",", ":")))
    (out / "suite.md").write_text(suite_markdown(doc) + "\n" + absolute_markdown(doc))
