"""Reports: token- and request-level goodput (always through `jitserve.scheduler.goodput`),
attainment per type, latency percentiles, throughput, and goodput over time."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from jitserve.scheduler.goodput import Goodput, max_goodput, program_goodput, request_goodput
from jitserve.scheduler.slo import SLOType
from jitserve.sim.simulator import ProgramState, SimOutcome

# Preemptions per replica per second above which a run's report warns of a preemption storm: a
# replica that preempts several requests every second spends a large share of its steps re-doing
# prefills (recompute) or copying KV (swap). Measured on the workload suite (docs/decisions/sim.md,
# "Preemption storms"): no policy that works as intended comes near it.
PREEMPTION_STORM_PER_REPLICA_S = 2.0


@dataclass
class Report:
    policy: str
    label: str
    requests: int
    token_goodput: float  # weighted goodput tokens per second of the arrival window
    request_goodput: float  # requests meeting their SLO per second of the arrival window
    token_goodput_total: float
    requests_met: int
    attainment: dict[str, float]  # share of requests meeting the SLO, per type
    token_attainment: float  # goodput / the goodput of perfect service
    throughput_tokens_per_s: float  # output tokens per second of the run
    throughput_total_tokens_per_s: float  # prefill + output tokens per second
    ttft_p50: float | None
    ttft_p95: float | None
    tbt_p50: float | None
    tbt_p95: float | None
    e2el_p50: dict[str, float | None]
    e2el_p95: dict[str, float | None]
    dropped: int
    rejected: int
    preemptions: int
    wall_s: float
    token_goodput_by_type: dict[str, float] = field(default_factory=dict)  # tokens/s, per request type
    requests_by_type: dict[str, int] = field(default_factory=dict)
    kv_preemptions: int = 0  # of `preemptions`: forced by KV blocks running out
    preemptions_per_replica_s: float = 0.0  # over the run (arrival window and drain)
    replicas: int = 1
    goodput_timeline: list[float] = field(default_factory=list)  # per bin, tokens/s
    timeline_bin_s: float = 60.0
    # router admission's rejections by "<SLO type>: <rule>" (scheduler.placement.Rejection); {} without it
    rejections_by_rule: dict[str, int] = field(default_factory=dict)
    output_tokens: int = 0  # generated over the run (throughput is per second of a run that may run longer)

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @property
    def preemption_storm(self) -> bool:
        return self.preemptions_per_replica_s > PREEMPTION_STORM_PER_REPLICA_S


def program_result(st: ProgramState) -> Goodput:
    prog = st.program
    if st.dropped or not st.records:
        return Goodput(0.0, False)
    if prog.slo_type is SLOType.COMPOUND:
        assert prog.slo.deadline is not None
        return program_goodput(st.records, prog.arrival, prog.slo.deadline, st.finish)
    return request_goodput(st.records[0])


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def report(outcome: SimOutcome, bin_s: float = 60.0) -> Report:
    horizon = outcome.horizon
    total = 0.0
    met = 0
    perfect = 0.0
    by_type: dict[str, list[bool]] = {}
    tokens_by_type: dict[str, float] = {}
    ttft: list[float] = []
    tbt_samples: list[np.ndarray] = []
    e2el: dict[str, list[float]] = {}
    dropped = rejected = 0
    nbins = int(np.ceil(outcome.end_time / bin_s)) + 1
    timeline = np.zeros(nbins)
    for st in outcome.programs:
        prog = st.program
        g = program_result(st)
        total += g.tokens
        met += int(g.met)
        key = prog.slo_type.value
        by_type.setdefault(key, []).append(g.met)
        tokens_by_type[key] = tokens_by_type.get(key, 0.0) + g.tokens
        perfect += sum(max_goodput(prog.slo, c.input_len, c.output_len) for c in prog.calls)
        dropped += int(st.dropped)
        rejected += int(st.rejected)
        if g.tokens > 0:
            t_credit = st.finish if st.finish is not None else prog.arrival
            timeline[min(int(t_credit // bin_s), nbins - 1)] += g.tokens
        if prog.slo_type is SLOType.LATENCY and st.records and not st.dropped:
            times = np.asarray(st.records[0].token_times, dtype=np.float64)
            if times.size:
                ttft.append(float(times[0] - prog.arrival))
                if times.size > 1:
                    tbt_samples.append(np.diff(times))
        elif st.finish is not None:
            e2el.setdefault(key, []).append(st.finish - prog.arrival)
    tbt = np.concatenate(tbt_samples) if tbt_samples else np.zeros(0)
    engines = outcome.engines
    span = max(outcome.end_time, horizon)
    out_tokens = sum(e.stats.decode_tokens for e in engines) + sum(len(st.records) for st in outcome.programs)
    all_tokens = sum(e.stats.decode_tokens + e.stats.prefill_tokens for e in engines)
    n = len(outcome.programs)
    return Report(
        policy=outcome.policy,
        label=outcome.label,
        requests=n,
        token_goodput=total / horizon,
        request_goodput=met / horizon,
        token_goodput_total=total,
        requests_met=met,
        attainment={k: float(np.mean(v)) for k, v in sorted(by_type.items())},
        token_attainment=total / perfect if perfect else 0.0,
        throughput_tokens_per_s=out_tokens / span,
        output_tokens=int(out_tokens),
        throughput_total_tokens_per_s=all_tokens / span,
        ttft_p50=_pct(ttft, 50),
        ttft_p95=_pct(ttft, 95),
        tbt_p50=float(np.percentile(tbt, 50)) if tbt.size else None,
        tbt_p95=float(np.percentile(tbt, 95)) if tbt.size else None,
        e2el_p50={k: _pct(v, 50) for k, v in sorted(e2el.items())},
        e2el_p95={k: _pct(v, 95) for k, v in sorted(e2el.items())},
        dropped=dropped,
        rejected=rejected,
        rejections_by_rule=dict(outcome.rejections),
        preemptions=sum(e.stats.preemptions for e in engines),
        wall_s=outcome.wall_s,
        token_goodput_by_type={k: v / horizon for k, v in sorted(tokens_by_type.items())},
        requests_by_type={k: len(v) for k, v in sorted(by_type.items())},
        kv_preemptions=sum(e.stats.kv_preemptions for e in engines),
        preemptions_per_replica_s=sum(e.stats.preemptions for e in engines) / (max(len(engines), 1) * span),
        replicas=len(engines),
        goodput_timeline=(timeline / bin_s).tolist(),
        timeline_bin_s=bin_s,
    )
