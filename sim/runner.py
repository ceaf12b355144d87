"""One comparison: a workload, a set of policies, the same arrivals and seed for every policy."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from jitserve.sim.metrics import Report, report
from jitserve.sim.predictor import ConditionalBounds, LengthBoundSource, QRFBounds, qrf_available
from jitserve.sim.profiles import Profile, load_profile
from jitserve.sim.simulator import call_features, simulate
from jitserve.sim.subdeadlines import SubDeadlines
from jitserve.sim.workload import Program, WorkloadSpec, generate


@dataclass(frozen=True, slots=True)
class RunConfig:
    rate_per_replica: float | None = None  # None: the workload's
    replicas: int | None = None
    duration_s: float | None = None
    seed: int | None = None
    profile: str | None = None
    placement: str | None = None
    predictor: str = "auto"  # auto | qrf | conditional
    quantile: float = 0.9
    drain_s: float = 600.0
    heterogeneity: float | None = None  # override the profile's h (ablation)
    router_admission: bool | None = None  # override each policy's router admission (None: its own)


def make_bounds(spec: WorkloadSpec, cfg: RunConfig, seed: int) -> LengthBoundSource:
    """The analyzer's QRF trained on a warm-up slice (a disjoint seed), or the stand-in."""
    kind = cfg.predictor
    if kind == "auto":
        kind = "qrf" if qrf_available() and spec.warmup_requests > 0 else "conditional"
    if kind == "conditional":
        return ConditionalBounds(quantile=cfg.quantile)
    if kind != "qrf":
        raise ValueError(f"predictor: unknown {kind!r} (known: auto, qrf, conditional)")
    warm = _warmup_programs(spec, seed)
    feats = np.asarray([call_features(c, p) for p in warm for c in p.calls], dtype=np.float64)
    outs = np.asarray([c.output_len for p in warm for c in p.calls], dtype=np.int64)
    qrf = QRFBounds(quantile=cfg.quantile, seed=seed)
    qrf.train(feats, outs)
    return qrf


def make_subdeadlines(spec: WorkloadSpec, cfg: RunConfig, seed: int, profile: Profile) -> SubDeadlines:
    """Pattern graphs from the warm-up slice (or the uniform stand-in without the analyzer)."""
    from jitserve.sim.profiles import BatchTimeModel

    timing = BatchTimeModel.from_profile(profile)
    sub = SubDeadlines(
        spec,
        timing.decode_step_time(max(profile.max_num_seqs // 4, 1), 1024.0),
        timing.prefill_tokens_per_s(2048),
    )
    if cfg.predictor == "conditional" or spec.warmup_requests == 0:
        return sub
    with contextlib.suppress(ImportError):  # without the analyzer: the uniform stand-in
        sub.train(_warmup_programs(spec, seed), seed=seed)
    return sub


def _warmup_programs(spec: WorkloadSpec, seed: int) -> list[Program]:
    rate = max(spec.warmup_requests / spec.duration_s, 1e-3)
    return generate(spec, rate=rate, replicas=1, seed=seed + 1_000_003)[: spec.warmup_requests]


def resolve_profile(spec: WorkloadSpec, cfg: RunConfig) -> Profile:
    profile = load_profile(cfg.profile or spec.profile)
    if cfg.heterogeneity is not None:
        profile = profile.model_copy(update={"heterogeneity": cfg.heterogeneity})
    return profile


def compare(
    spec: WorkloadSpec,
    policies: list[str],
    cfg: RunConfig = RunConfig(),
    on_progress: Callable[[str, float], None] | None = None,
    bounds: LengthBoundSource | None = None,
) -> dict[str, Report]:
    seed = spec.seed if cfg.seed is None else cfg.seed
    replicas = cfg.replicas or spec.replicas
    duration = cfg.duration_s or spec.duration_s
    programs = generate(spec, rate=cfg.rate_per_replica, replicas=replicas, seed=seed, duration_s=duration)
    profile = resolve_profile(spec, cfg)
    bounds = bounds or make_bounds(spec, cfg, seed)
    subdeadlines = make_subdeadlines(spec, cfg, seed, profile)
    results: dict[str, Report] = {}
    for name in policies:
        fresh = generate(spec, rate=cfg.rate_per_replica, replicas=replicas, seed=seed, duration_s=duration)
        assert len(fresh) == len(programs)
        progress = (lambda t, n=name: on_progress(n, t)) if on_progress else None
        outcome = simulate(
            fresh,
            name,
            profile,
            replicas,
            bounds,
            horizon=duration,
            placement=cfg.placement,
            seed=seed,
            drain_s=cfg.drain_s,
            progress=progress,
            subdeadlines=subdeadlines,
            router_admission=cfg.router_admission,
        )
        results[name] = report(outcome)
    return results
