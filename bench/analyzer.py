"""Request Analyzer benchmark: length-bound refresh and pattern-graph matching (medians).

    .venv/bin/python bench/analyzer.py [--train 5000] [--seed 0] [--quick]

Prints a markdown report: refresh time for 1,000 active requests (table vs the 300-tree forest),
held-out coverage of the table, of the same forest, and of a plain 300-tree QRF on raw features,
then matching time against 500 stored graphs and the accuracy of the resulting phi(s).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from jitserve.scheduler.analyzer.length import (
    LengthPredictor,
    LengthPredictorConfig,
    clamp_bounds,
    training_rows,
)
from jitserve.scheduler.analyzer.length import RequestFeatures as Features
from jitserve.scheduler.analyzer.patterns import (
    PatternConfig,
    PatternStore,
    StageFeatures,
    phi_from_stage_times,
)
from jitserve.scheduler.analyzer.workload import RequestSample, sample_programs, sample_requests


def median_ms(fn: Callable[[], object], repeats: int, warmup: int = 3) -> tuple[float, float]:
    """(median, p99) wall time of fn in milliseconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times), float(np.percentile(times, 99))


def progress_points(s: RequestSample, seed: int) -> np.ndarray:
    """A random refresh point (multiple of 50) strictly below each request's true length."""
    rng = np.random.default_rng(seed)
    return 50 * rng.integers(0, (s.output_len - 1) // 50 + 1)


def coverage(bounds: np.ndarray, targets: np.ndarray) -> tuple[float, float]:
    """(share of bounds >= the true length, mean bound / true length)."""
    return float(np.mean(bounds >= targets)), float(np.mean(bounds / targets))


QuerySet = tuple[str, Features, np.ndarray]  # (name, features, true output lengths)


def query_sets(test: RequestSample, seed: int, max_rows: int) -> list[QuerySet]:
    """Held-out queries at arrival, and at every 50-token refresh of every request (subsampled).

    The second is the population a scheduler sees: one bound per refresh of each running request.
    """
    arrival = Features.of(
        test.prompt_len, 0, test.slo_type, test.class_code, test.model_code, test.max_tokens
    )
    rows, targets = training_rows(arrival, test.output_len, 50)
    keep = np.sort(np.random.default_rng(seed).choice(targets.size, min(max_rows, targets.size), False))
    rows = Features(*(getattr(rows, n)[keep] for n in Features.__slots__))
    return [("arrival (g = 0)", arrival, test.output_len), ("every 50-token refresh", rows, targets[keep])]


def raw_forest_bounds(train: RequestSample, queries: list[QuerySet], cfg, **forest_kw):
    """A plain QRF on raw (unbucketed) features: the reference the table must match in coverage."""
    from quantile_forest import RandomForestQuantileRegressor

    f = Features.of(train.prompt_len, 0, train.slo_type, train.class_code, train.model_code, train.max_tokens)
    rows, y = training_rows(f, train.output_len, cfg.refresh_tokens)
    if y.size > cfg.training_rows_cap:
        keep = np.sort(np.random.default_rng(cfg.seed).choice(y.size, cfg.training_rows_cap, False))
        rows = Features(*(getattr(rows, n)[keep] for n in Features.__slots__))
        y = y[keep]

    def raw(x: Features) -> np.ndarray:
        return np.column_stack(
            (x.prompt_len, x.generated, x.slo_type, x.class_code, x.model_code, x.max_tokens)
        ).astype(float)

    forest = RandomForestQuantileRegressor(
        n_estimators=cfg.n_estimators, max_depth=cfg.max_depth, random_state=cfg.seed, n_jobs=2, **forest_kw
    )
    t = time.perf_counter()
    forest.fit(raw(rows), y.astype(float))
    fit_s = time.perf_counter() - t
    out = {}
    for name, q, targets in queries:
        pred = np.ceil(forest.predict(raw(q), quantiles=cfg.quantile) - 1e-9).astype(np.int64)
        out[name] = coverage(clamp_bounds(pred, q), targets)
    return out, fit_s


def bench_length(args: argparse.Namespace) -> None:
    cfg = LengthPredictorConfig(seed=args.seed, n_jobs=2)
    train = sample_requests(args.train, seed=args.seed)
    test = sample_requests(args.test, seed=args.seed + 1)
    p = LengthPredictor(cfg)
    p.observe_many(train.prompt_len, train.output_len, train.slo_type, train.class_code, train.model_code,
                   train.max_tokens)  # fmt: skip
    t = time.perf_counter()
    p.fit()
    fit_s = time.perf_counter() - t
    table = p.table
    assert table is not None
    print("## Length upper bound (quantile 0.9, 300 trees, max depth 150)\n")
    n_rows = int(np.sum((train.output_len - 1) // cfg.refresh_tokens + 1))
    print(f"- training: {args.train} finished requests -> {n_rows} rows, subsampled to "
          f"{min(n_rows, cfg.training_rows_cap)}; fit + table build {fit_s:.1f} s; "
          f"table: {table.keys.size} contexts, {table.bounds.size} cells "
          f"({table.bounds.nbytes / 1024:.0f} KiB)")  # fmt: skip

    active = test.take(np.arange(1000))
    gen = progress_points(active, args.seed + 2)
    args6 = (active.prompt_len, gen, active.slo_type, active.class_code, active.model_code, active.max_tokens)
    feats = Features.of(*args6)
    fast = median_ms(lambda: p.upper_bounds(*args6), args.repeats)
    fast_pre = median_ms(lambda: p.upper_bounds_features(feats), args.repeats)
    exact = median_ms(lambda: p.upper_bounds_exact(*args6), args.exact_repeats, warmup=1)
    one = tuple(a[:1] for a in args6)
    exact_one = median_ms(lambda: p.upper_bounds_exact(*one), args.exact_repeats, warmup=1)
    same = np.array_equal(p.upper_bounds(*args6), p.upper_bounds_exact(*args6))
    print("\n| refresh of 1,000 active requests | median ms | p99 ms |\n|---|---|---|")
    print(f"| table, `upper_bounds` (validates input) | {fast[0]:.3f} | {fast[1]:.3f} |")
    print(f"| table, `upper_bounds_features` (pre-validated batch) | {fast_pre[0]:.3f} | {fast_pre[1]:.3f} |")
    print(f"| exact 300-tree forest, `upper_bounds_exact` | {exact[0]:.1f} | {exact[1]:.1f} |")
    print(f"| exact 300-tree forest, one request | {exact_one[0]:.1f} | {exact_one[1]:.1f} |")
    print(f"\ntable == forest on these 1,000 requests: {same}\n")

    queries = query_sets(test, args.seed + 3, args.refresh_rows)
    rows = []
    for name, q, targets in queries:
        q6 = (q.prompt_len, q.generated, q.slo_type, q.class_code, q.model_code, q.max_tokens)
        rows.append(
            (name, coverage(p.upper_bounds(*q6), targets), coverage(p.upper_bounds_exact(*q6), targets))
        )
    raw, raw_fit = raw_forest_bounds(train, queries, cfg, min_samples_leaf=cfg.min_samples_leaf,
                                     max_samples_leaf=cfg.max_samples_leaf)  # fmt: skip
    lib, lib_fit = ({}, 0.0) if args.quick else raw_forest_bounds(train, queries, cfg)
    print(f"held-out coverage / mean(bound / true length); {args.test} requests, "
          f"{queries[1][2].size} sampled refresh points:\n")  # fmt: skip
    print("| query point | table | same forest, exact | plain 300-tree QRF, raw features | "
          "library-default QRF (1-row leaves), raw |\n|---|---|---|---|---|")  # fmt: skip
    for name, t_cov, e_cov in rows:
        lib_cell = f"{lib[name][0]:.3f} / {lib[name][1]:.2f}" if lib else "skipped"
        print(f"| {name} | {t_cov[0]:.3f} / {t_cov[1]:.2f} | {e_cov[0]:.3f} / {e_cov[1]:.2f} | "
              f"{raw[name][0]:.3f} / {raw[name][1]:.2f} | {lib_cell} |")  # fmt: skip
    print(f"\n(fit: plain raw QRF {raw_fit:.1f} s, library-default {lib_fit:.1f} s)\n")


def bench_patterns(args: argparse.Namespace) -> None:
    programs = sample_programs(500 + args.queries, seed=args.seed + 10)
    history, queries = programs[:500], programs[500:]
    rng = np.random.default_rng(args.seed)
    partials = []
    for g in queries:
        done = int(rng.integers(0, g.num_stages))
        partials.append((g.prefix(done + 1), done, g))
    print("## Pattern-graph matching, 500 stored graphs\n")
    print("| path | median ms | p99 ms | phi(s) abs error, mean | no match |\n|---|---|---|---|---|")
    for label, index in (
        ("full vectorized scan (default at 500)", False),
        ("K-medoids index, 4 of 16", True),
    ):
        store = PatternStore(PatternConfig(index_min_graphs=0 if index else 10**9), now=0.0)
        for g in history:
            store.add(g, now=0.0)
        if index:
            t = time.perf_counter()
            store.recluster()
            cluster_ms = (time.perf_counter() - t) * 1e3
        times, errs, misses = [], [], 0
        for partial, done, true in partials:
            t = time.perf_counter()
            found = store.match(partial, done, exhaustive=not index)
            times.append((time.perf_counter() - t) * 1e3)
            true_phi = phi_from_stage_times(StageFeatures.of(true, store.config.cost).stage_time)
            if found is None:
                misses += 1
                continue
            est = phi_from_stage_times(found.stage_time)
            errs.append(abs((est[done] if done < est.size else 1.0) - true_phi[done]))
        print(f"| {label} | {statistics.median(times):.3f} | {np.percentile(times, 99):.3f} | "
              f"{np.mean(errs):.3f} | {misses} |")  # fmt: skip
    plan_rows, plan_err = [], {}
    for k in (1, 8):
        store = PatternStore(PatternConfig(top_k=k), now=0.0)
        for g in history:
            store.add(g, now=0.0)
        times, errs = [], []
        for partial, done, true in partials:
            t = time.perf_counter()
            plan = store.plan(partial, done, deadline=100.0, now=0.0, record_reuse=False)
            times.append((time.perf_counter() - t) * 1e3)
            true_phi = phi_from_stage_times(StageFeatures.of(true, store.config.cost).stage_time)
            est = plan.phi[done] if done < plan.num_stages else 1.0
            errs.append((done, abs(est - true_phi[done])))
        plan_err[k] = errs
        plan_rows.append(
            f"| `plan()`, top_k={k} (match + sub-deadlines) | {statistics.median(times):.3f} | "
            f"{np.percentile(times, 99):.3f} | {np.mean([e for _, e in errs]):.3f} | |"
        )
    print("\n".join(plan_rows))
    uniform_err = []
    med_stages = int(np.median([g.num_stages for g in history]))
    for _, done, true in partials:
        true_phi = phi_from_stage_times(StageFeatures.of(true, store.config.cost).stage_time)
        uniform_err.append((done, abs((done + 1) / max(med_stages, done + 1) - true_phi[done])))
    print(f"\nphi(s) error of the no-history fallback (uniform over the median {med_stages} stages): "
          f"{np.mean([e for _, e in uniform_err]):.3f}; K-medoids clustering of 500 graphs: "
          f"{cluster_ms:.0f} ms\n")  # fmt: skip
    print("phi(s) mean abs error by stages already completed:\n")
    print("| completed stages | queries | best match (paper) | top-8 blend | uniform fallback |")
    print("|---|---|---|---|---|")
    for label, lo, hi in (("0", 0, 0), ("1", 1, 1), ("2", 2, 2), ("3-4", 3, 4), ("5+", 5, 99)):
        cols = [[e for d, e in errs if lo <= d <= hi] for errs in (plan_err[1], plan_err[8], uniform_err)]
        print(f"| {label} | {len(cols[0])} | " + " | ".join(f"{np.mean(c):.3f}" for c in cols) + " |")
    print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", type=int, default=5000, help="finished requests to train on")
    ap.add_argument("--test", type=int, default=5000, help="held-out requests for coverage")
    ap.add_argument("--refresh-rows", type=int, default=10_000, help="held-out refresh points sampled")
    ap.add_argument("--queries", type=int, default=1000, help="partial programs to match")
    ap.add_argument("--repeats", type=int, default=300)
    ap.add_argument("--exact-repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="skip the library-default QRF comparison")
    ap.add_argument("--only", choices=("length", "patterns"), default=None)
    args = ap.parse_args()
    if args.only != "patterns":
        bench_length(args)
    if args.only != "length":
        bench_patterns(args)


if __name__ == "__main__":
    main()
