"""Pattern graphs of compound programs and stage sub-deadlines (JITServe §4.1, App. B).

A program is a DAG of LLM calls (model, input_len, output_len) and tool calls (tool, duration),
each tagged with its stage. History is kept as compact per-stage arrays (no plaintext), padded to a
common stage count so that matching a partial program against every stored graph is a handful of
vectorized numpy operations:

1. prune stored graphs whose prefix diverges: a different set of models/tools at any stage already
   revealed (including the stage in progress), or fewer stages than already revealed (stages past a
   match's end get the whole deadline D);
2. score the rest with Gaussian kernels on log-scaled attributes: node kernel over a completed
   stage's output tokens (LLM) and tool seconds, edge kernel over the input tokens flowing into the
   stage (also known for the stage in progress);
3. take the best match, and from its stage times phi(s) = t_<=s / t_total, D_s = phi(s) * D.

Stage time is the max over the stage's nodes (calls of one stage run in parallel); an LLM node
without a measured duration is costed by `LLMCostModel`. History is capped (evict the lowest reuse
weight; weights decay by 0.9 per hour) and clustered with K-medoids; matching probes the clusters
whose medoids score best first (an IVF-style index) and falls back to a full scan if nothing there
survives pruning. Choices and fallbacks: docs/decisions/analyzer.md.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
PATTERN_FORMAT_VERSION = 1
# Interned stage signatures kept before unused ones are dropped (identities are client-supplied).
MAX_SIGNATURES = 10_000


class NodeKind(StrEnum):
    LLM = "llm"
    TOOL = "tool"


@dataclass(frozen=True, slots=True)
class PatternNode:
    """One call of a program. `identity` is the model (LLM) or the tool name."""

    stage: int
    kind: NodeKind
    identity: str
    input_len: int = 0
    output_len: int = 0
    duration_s: float | None = None  # measured time; required for tools, optional for LLM calls

    def __post_init__(self) -> None:
        if not isinstance(self.stage, int) or self.stage < 0:
            raise ValueError(f"stage: must be an integer >= 0, got {self.stage!r}")
        if self.input_len < 0:
            raise ValueError(f"input_len: must be >= 0, got {self.input_len}")
        if self.output_len < 0:
            raise ValueError(f"output_len: must be >= 0, got {self.output_len}")
        if self.duration_s is not None and not (self.duration_s >= 0 and math.isfinite(self.duration_s)):
            raise ValueError(f"duration_s: must be a finite number >= 0, got {self.duration_s}")
        if self.kind is NodeKind.TOOL and self.duration_s is None:
            raise ValueError("duration_s: a tool node needs its execution time")
        if not self.identity:
            raise ValueError("identity: must name the model or tool")

    @classmethod
    def llm(
        cls, stage: int, model: str, input_len: int, output_len: int, duration_s: float | None = None
    ) -> PatternNode:
        return cls(stage, NodeKind.LLM, model, input_len, output_len, duration_s)

    @classmethod
    def tool(cls, stage: int, tool: str, duration_s: float) -> PatternNode:
        return cls(stage, NodeKind.TOOL, tool, duration_s=duration_s)


@dataclass(frozen=True, slots=True)
class PatternGraph:
    """A (possibly partial) program: nodes in stages 0..S-1 (none empty), edges parent -> child."""

    nodes: tuple[PatternNode, ...]
    edges: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        stages = {n.stage for n in self.nodes}
        if stages and stages != set(range(max(stages) + 1)):
            missing = sorted(set(range(max(stages) + 1)) - stages)
            raise ValueError(f"nodes: stages must be contiguous from 0; stage {missing[0]} has no node")
        for i, (src, dst) in enumerate(self.edges):
            if not (0 <= src < len(self.nodes) and 0 <= dst < len(self.nodes)):
                raise ValueError(f"edges[{i}]: node index out of range: {(src, dst)}")
            if self.nodes[src].stage >= self.nodes[dst].stage:
                raise ValueError(f"edges[{i}]: a dependency must point to a later stage: {(src, dst)}")

    @property
    def num_stages(self) -> int:
        return 1 + max((n.stage for n in self.nodes), default=-1)

    def prefix(self, stages: int) -> PatternGraph:
        """The graph restricted to its first `stages` stages (node indices renumbered)."""
        keep = [i for i, n in enumerate(self.nodes) if n.stage < stages]
        index = {old: new for new, old in enumerate(keep)}
        edges = tuple((index[s], index[d]) for s, d in self.edges if s in index and d in index)
        return PatternGraph(tuple(self.nodes[i] for i in keep), edges)


@dataclass(frozen=True, slots=True)
class LLMCostModel:
    """Execution time of an LLM call without a measured duration: prefill + decode, linear.

    Defaults are in the range design.md measured for decode steps (tens of ms per token) and an
    A100-class prefill; only ratios matter for phi, so the absolute scale is unimportant.
    """

    prefill_s_per_token: float = 0.0002
    decode_s_per_token: float = 0.025

    def llm_seconds(self, input_len: float, output_len: float) -> float:
        return self.prefill_s_per_token * input_len + self.decode_s_per_token * output_len


@dataclass(frozen=True, slots=True)
class PatternConfig:
    capacity: int = 500  # paper: accuracy saturates at ~500 graphs
    max_stages: int = 32  # graphs with more stages are not stored
    decay_per_hour: float = 0.9  # paper: reuse weight decays by 0.9 every hour
    node_bandwidth: float = 0.5  # Gaussian kernel sigma on ln(1 + tokens) / ln(1 + 10 * seconds)
    edge_bandwidth: float = 0.5
    node_weight: float = 0.6  # output lengths drive stage time more than input lengths
    edge_weight: float = 0.4
    clusters: int = 16  # K of K-medoids
    probe_clusters: int = 4  # clusters searched before falling back to a full scan
    index_min_graphs: int = 2_000  # below this a full vectorized scan is faster (bench)
    recluster_fraction: float = 0.25  # recluster after this share of the history was replaced
    default_stages: int = 3  # fallback stage count with no usable history
    # phi from the best match (1, the paper) or the similarity-weighted mean of the k best
    # (8 cut the phi error by ~20% on the synthetic programs; docs/benchmarks/analyzer.md)
    top_k: int = 1
    seed: int = 0
    cost: LLMCostModel = field(default_factory=LLMCostModel)

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError(f"capacity: must be >= 1, got {self.capacity}")
        if self.max_stages < 1:
            raise ValueError(f"max_stages: must be >= 1, got {self.max_stages}")
        if not 0 < self.decay_per_hour <= 1:
            raise ValueError(f"decay_per_hour: must be in (0, 1], got {self.decay_per_hour}")
        for name in ("node_bandwidth", "edge_bandwidth"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be > 0, got {getattr(self, name)}")
        if self.node_weight < 0 or self.edge_weight < 0 or self.node_weight + self.edge_weight <= 0:
            raise ValueError("node_weight, edge_weight: must be >= 0 and not both 0")
        if self.clusters < 1 or self.probe_clusters < 1:
            raise ValueError("clusters, probe_clusters: must be >= 1")
        if self.top_k < 1:
            raise ValueError(f"top_k: must be >= 1, got {self.top_k}")
        if self.default_stages < 1:
            raise ValueError(f"default_stages: must be >= 1, got {self.default_stages}")


@dataclass(frozen=True, slots=True)
class StageFeatures:
    """A graph summarized per stage (what the store keeps and matching compares)."""

    signature: tuple[tuple[tuple[str, str], ...], ...]  # per stage: sorted unique (kind, identity)
    out_feature: FloatArray  # ln(1 + LLM output tokens of the stage)
    tool_feature: FloatArray  # ln(1 + 10 * tool seconds of the stage)
    in_feature: FloatArray  # ln(1 + input tokens into the stage)
    stage_time: FloatArray  # seconds, max over the stage's nodes

    @classmethod
    def of(cls, graph: PatternGraph, cost: LLMCostModel) -> StageFeatures:
        s = graph.num_stages
        out_tokens, tool_s, in_tokens, stage_time = np.zeros(s), np.zeros(s), np.zeros(s), np.zeros(s)
        members: list[set[tuple[str, str]]] = [set() for _ in range(s)]
        for node in graph.nodes:
            members[node.stage].add((node.kind.value, node.identity))
            if node.kind is NodeKind.LLM:
                out_tokens[node.stage] += node.output_len
                in_tokens[node.stage] += node.input_len
                t = node.duration_s
                if t is None:
                    t = cost.llm_seconds(node.input_len, node.output_len)
            else:
                tool_s[node.stage] += node.duration_s or 0.0
                t = node.duration_s or 0.0
            stage_time[node.stage] = max(stage_time[node.stage], t)
        return cls(
            signature=tuple(tuple(sorted(m)) for m in members),
            out_feature=np.log1p(out_tokens),
            tool_feature=np.log1p(10.0 * tool_s),
            in_feature=np.log1p(in_tokens),
            stage_time=stage_time,
        )


@dataclass(frozen=True, slots=True)
class StagePlan:
    """Sub-deadlines of a compound program: sub_deadlines[s] = phi[s] * deadline.

    phi is nondecreasing and phi[-1] == 1, so sub-deadlines are monotone and end at the deadline.
    Stages past the plan's end get the whole deadline.
    """

    phi: FloatArray
    sub_deadlines: FloatArray
    deadline: float
    source: Literal["match", "fallback", "oracle"]
    similarity: float = 0.0  # of the matched graph, in [0, 1]
    matched_slot: int = -1

    def deadline_for_stage(self, stage: int) -> float:
        """D_s, seconds after the program's arrival."""
        if stage < 0:
            raise ValueError(f"stage: must be >= 0, got {stage}")
        return float(self.sub_deadlines[stage]) if stage < self.sub_deadlines.size else self.deadline

    @property
    def num_stages(self) -> int:
        return int(self.phi.size)


def _check_deadline(deadline: float) -> float:
    if not (deadline > 0 and math.isfinite(deadline)):
        raise ValueError(f"deadline: must be a positive finite number of seconds, got {deadline}")
    return float(deadline)


def phi_from_stage_times(stage_time: npt.ArrayLike) -> FloatArray:
    """phi(s) = t_<=s / t_total; uniform if the total is zero. Exactly 1.0 at the last stage."""
    t = np.maximum(np.asarray(stage_time, dtype=np.float64), 0.0)
    if t.size == 0:
        return np.ones(1)
    total = float(t.sum())
    phi = np.cumsum(t) / total if total > 0 else np.arange(1, t.size + 1) / t.size
    phi = np.minimum(np.maximum.accumulate(phi), 1.0)  # guard rounding: monotone, <= 1
    phi[-1] = 1.0
    return phi


def plan_from_stage_times(
    stage_time: npt.ArrayLike,
    deadline: float,
    source: Literal["match", "fallback", "oracle"],
    similarity: float = 0.0,
    matched_slot: int = -1,
) -> StagePlan:
    deadline = _check_deadline(deadline)
    phi = phi_from_stage_times(stage_time)
    sub = phi * deadline
    sub[-1] = deadline
    return StagePlan(phi, sub, deadline, source, similarity, matched_slot)


def plan_from_phi(
    phi: npt.ArrayLike,
    deadline: float,
    source: Literal["match", "fallback", "oracle"],
    similarity: float = 0.0,
    matched_slot: int = -1,
) -> StagePlan:
    """A plan from accumulated shares (made monotone, clipped to [0, 1], last forced to 1)."""
    deadline = _check_deadline(deadline)
    phi = np.minimum(np.maximum.accumulate(np.clip(np.asarray(phi, dtype=np.float64), 0.0, 1.0)), 1.0)
    if phi.size == 0:
        phi = np.ones(1)
    phi[-1] = 1.0
    sub = phi * deadline
    sub[-1] = deadline
    return StagePlan(phi, sub, deadline, source, similarity, matched_slot)


def guard_late_stage(
    deadline_abs: float, program_end: float, now: float, stages_left: int, slot_wait_s: float = 0.0
) -> float:
    """A stage's absolute sub-deadline, never below an even split of what is left of the program's
    deadline over its remaining stages (`stages_left`, this one included) and never past that deadline.
    A stage that starts late must not inherit a sub-deadline that has already passed while the program
    as a whole can still finish. The router applies it to every stage; the simulator does too.

    `slot_wait_s`: how long a stage waits for a slot once it is at stake (a just-in-time engine's reserved
    delay, `ReplicaState.reserved_delay_s`). The plan's shares assume each later stage starts the moment it
    arrives; a just-in-time engine starts a stage only once it is behind, so each later stage will wait that
    long too. Those waits come out of what is left before the shares are split: this stage's share of the
    rest shrinks by that factor (docs/decisions/core.md, "Later stages' waits come out of the plan"). The
    waits never take more than all but an even split of what is left: past that the program is late anyway.
    """
    if slot_wait_s < 0 or math.isnan(slot_wait_s):
        raise ValueError(f"slot_wait_s: must be a number >= 0, got {slot_wait_s}")
    n = max(stages_left, 1)
    remaining = max(program_end - now, 0.0)
    work = max(remaining - (n - 1) * slot_wait_s, remaining / n)
    if remaining > 0 and work < remaining:
        deadline_abs = now + max(deadline_abs - now, 0.0) * (work / remaining)
    return min(max(deadline_abs, now + work / n), program_end)


def uniform_plan(stages: int, deadline: float) -> StagePlan:
    """Fallback: equal stage shares (the paper's 'treat stages uniformly' baseline)."""
    if stages < 1:
        raise ValueError(f"stages: must be >= 1, got {stages}")
    return plan_from_stage_times(np.ones(stages), deadline, "fallback")


def oracle_plan(graph: PatternGraph, deadline: float, cost: LLMCostModel | None = None) -> StagePlan:
    """phi from the program's true graph (the simulator's oracle JITServe*)."""
    if graph.num_stages == 0:
        raise ValueError("graph: has no nodes")
    feats = StageFeatures.of(graph, cost or LLMCostModel())
    return plan_from_stage_times(feats.stage_time, deadline, "oracle", similarity=1.0)


@dataclass(frozen=True, slots=True)
class Match:
    slot: int
    similarity: float
    stage_time: FloatArray  # the matched graph's stage times
    candidates: int  # graphs that survived pruning
    # the `top_k` best survivors, best first (slot and similarity are their first entries)
    top_slots: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    top_similarities: FloatArray = field(default_factory=lambda: np.zeros(0))


class PatternStore:
    """Capped, decaying history of pattern graphs with vectorized prefix matching.

    Not thread-safe: call it from one thread (the router's event loop, the simulator's loop).
    `now` arguments are seconds on the caller's clock (default: time.monotonic()).
    """

    def __init__(self, config: PatternConfig | None = None, now: float | None = None) -> None:
        self.config = cfg = config or PatternConfig()
        cap, s = cfg.capacity, cfg.max_stages
        self._valid = np.zeros(cap, dtype=bool)
        self._n_stages = np.zeros(cap, dtype=np.int64)
        self._sig = np.full((cap, s), -1, dtype=np.int64)  # interned stage signatures, -1 = none
        self._out = np.zeros((cap, s))
        self._tool = np.zeros((cap, s))
        self._in = np.zeros((cap, s))
        self._time = np.zeros((cap, s))
        self._weight = np.zeros(cap)
        self._added_seq = np.zeros(cap, dtype=np.int64)  # insertion order, for eviction ties
        self._seq = 0
        self._signatures: dict[tuple[tuple[str, str], ...], int] = {}
        self._clock = time.monotonic() if now is None else float(now)
        # K-medoids index: cluster id per slot (-1: added after the last clustering), medoid slots
        self._cluster = np.full(cap, -1, dtype=np.int64)
        self._medoids = np.zeros(0, dtype=np.int64)
        self._added_since_clustering = 0

    # ----------------------------------------------------------------------------------- storage
    def __len__(self) -> int:
        return int(self._valid.sum())

    def weights(self, now: float | None = None) -> FloatArray:
        """Reuse weights of the stored graphs (slot order, valid slots only), decayed to `now`."""
        self._decay_to(now)
        return self._weight[self._valid].copy()

    def add(self, graph: PatternGraph, now: float | None = None) -> int:
        """Store a finished program; returns its slot, or -1 if it has no nodes or too many stages."""
        cfg = self.config
        if graph.num_stages == 0 or graph.num_stages > cfg.max_stages:
            return -1
        self._decay_to(now)
        feats = StageFeatures.of(graph, cfg.cost)
        if len(self._signatures) + graph.num_stages > MAX_SIGNATURES:
            self._compact_signatures()  # before interning: codes must not change mid-graph
        free = np.flatnonzero(~self._valid)
        if free.size:
            slot = int(free[0])
        else:  # evict the lowest reuse weight; the oldest among equals
            order = np.lexsort((self._added_seq, self._weight))
            slot = int(order[0])
        s = graph.num_stages
        self._valid[slot] = True
        self._n_stages[slot] = s
        self._sig[slot] = -1
        self._sig[slot, :s] = [self._intern(sig) for sig in feats.signature]
        for arr, values in ((self._out, feats.out_feature), (self._tool, feats.tool_feature)):
            arr[slot] = 0.0
            arr[slot, :s] = values
        self._in[slot] = 0.0
        self._in[slot, :s] = feats.in_feature
        self._time[slot] = 0.0
        self._time[slot, :s] = feats.stage_time
        self._weight[slot] = 1.0
        self._added_seq[slot] = self._seq
        self._seq += 1
        self._cluster[slot] = -1
        self._added_since_clustering += 1
        # Keep the index fresh only where it is used: unclustered graphs are always scanned.
        stale = self._added_since_clustering > cfg.recluster_fraction * len(self)
        if len(self) >= cfg.index_min_graphs and stale:
            self.recluster()
        return slot

    def _intern(self, signature: tuple[tuple[str, str], ...]) -> int:
        code = self._signatures.get(signature)
        if code is None:
            code = self._signatures[signature] = len(self._signatures)
        return code

    def _compact_signatures(self) -> None:
        """Forget signatures no stored graph uses (identities come from clients: bound the memory)."""
        in_use = np.unique(self._sig[self._valid])
        in_use = in_use[in_use >= 0]
        by_code = {code: sig for sig, code in self._signatures.items()}
        remap = np.full(len(by_code), -1, dtype=np.int64)
        remap[in_use] = np.arange(in_use.size)
        self._sig = np.where(self._sig >= 0, remap[np.maximum(self._sig, 0)], -1)
        self._signatures = {by_code[int(old)]: new for new, old in enumerate(in_use)}

    def _decay_to(self, now: float | None) -> None:
        now = time.monotonic() if now is None else float(now)
        if now > self._clock:
            self._weight *= self.config.decay_per_hour ** ((now - self._clock) / 3600.0)
            self._clock = now

    # ---------------------------------------------------------------------------------- matching
    def _query(
        self, partial: PatternGraph, completed_stages: int
    ) -> tuple[StageFeatures, npt.NDArray[np.int64]]:
        if completed_stages < 0:
            raise ValueError(f"completed_stages: must be >= 0, got {completed_stages}")
        if completed_stages > partial.num_stages:
            raise ValueError(
                f"completed_stages: {completed_stages} exceeds the partial graph's "
                f"{partial.num_stages} stages"
            )
        feats = StageFeatures.of(partial, self.config.cost)
        # an unseen signature can match nothing: -2 never equals a stored code (>= 0) or padding (-1)
        sig = np.array([self._signatures.get(s, -2) for s in feats.signature], dtype=np.int64)
        return feats, sig

    def _scores(
        self, slots: npt.NDArray[np.int64], feats: StageFeatures, sig: npt.NDArray[np.int64], done: int
    ) -> tuple[FloatArray, npt.NDArray[np.bool_]]:
        """Similarity in [0, 1] of each slot's graph to the partial one, and the pruning mask."""
        cfg = self.config
        seen = sig.size  # revealed stages: `done` completed plus at most one in progress
        if seen > cfg.max_stages:
            return np.zeros(slots.size), np.zeros(slots.size, dtype=bool)
        # A stored graph shorter than the revealed prefix diverged. One exactly as long as the
        # completed prefix is kept: it says the next stage is the last (D_s = D past its end).
        alive = self._valid[slots] & (self._n_stages[slots] >= seen)
        if seen:
            alive &= np.all(self._sig[slots, :seen] == sig, axis=1)
        if done:
            d_out = self._out[slots, :done] - feats.out_feature[:done]
            d_tool = self._tool[slots, :done] - feats.tool_feature[:done]
            node_k = np.exp(-(d_out**2 + d_tool**2) / (2 * cfg.node_bandwidth**2)).sum(axis=1)
        else:
            node_k = np.zeros(slots.size)
        if seen:
            d_in = self._in[slots, :seen] - feats.in_feature
            edge_k = np.exp(-(d_in**2) / (2 * cfg.edge_bandwidth**2)).sum(axis=1)
        else:
            edge_k = np.zeros(slots.size)
        denom = cfg.node_weight * done + cfg.edge_weight * seen
        score = (
            (cfg.node_weight * node_k + cfg.edge_weight * edge_k) / denom
            if denom > 0
            else np.ones(slots.size)
        )
        return score, alive

    def _best(
        self,
        slots: npt.NDArray[np.int64],
        feats: StageFeatures,
        sig: npt.NDArray[np.int64],
        done: int,
        top_k: int = 1,
    ) -> Match | None:
        score, alive = self._scores(slots, feats, sig, done)
        if not np.any(alive):
            return None
        cand = slots[alive]
        cand_score = score[alive]
        # best similarity; ties go to the more reused, then the newer graph
        order = np.lexsort((-self._added_seq[cand], -self._weight[cand], -cand_score))[:top_k]
        best = order[0]
        slot = int(cand[best])
        return Match(
            slot=slot,
            similarity=float(cand_score[best]),
            stage_time=self._time[slot, : self._n_stages[slot]].copy(),
            candidates=int(cand.size),
            top_slots=cand[order],
            top_similarities=cand_score[order],
        )

    def match(
        self,
        partial: PatternGraph,
        completed_stages: int,
        exhaustive: bool | None = None,
        top_k: int = 1,
    ) -> Match | None:
        """Best stored graph for a program whose first `completed_stages` stages finished.

        `partial` holds those stages plus, optionally, the stage in progress (its calls and input
        lengths are known, its outputs not yet). None if nothing survives pruning or nothing is
        revealed yet.
        `exhaustive`: scan all graphs (True), use the cluster index (False), or decide by history
        size (None, see `index_min_graphs`). `top_k`: also return the k best survivors.
        """
        if top_k < 1:
            raise ValueError(f"top_k: must be >= 1, got {top_k}")
        feats, sig = self._query(partial, completed_stages)
        if sig.size == 0:
            return None  # nothing revealed yet: no evidence to match on
        use_index = (len(self) >= self.config.index_min_graphs) if exhaustive is None else not exhaustive
        if use_index and self._medoids.size:
            probe = self._probe_slots(feats, sig, completed_stages)
            found = self._best(probe, feats, sig, completed_stages, top_k)
            if found is not None:
                return found
        return self._best(np.flatnonzero(self._valid), feats, sig, completed_stages, top_k)

    def plan(
        self,
        partial: PatternGraph,
        completed_stages: int,
        deadline: float,
        now: float | None = None,
        expected_stages: int | None = None,
        record_reuse: bool = True,
    ) -> StagePlan:
        """Sub-deadlines for a compound program from its best historical match.

        Fallback when nothing matches: a uniform split over max(revealed stages, expected_stages or
        the median stored stage count or `default_stages`) stages. Unlike `match`, a
        `completed_stages` beyond the partial graph's stages is clamped rather than rejected: callers
        that drop calls from their records should still get a deadline, not an error.
        """
        deadline = _check_deadline(deadline)
        if completed_stages < 0:
            raise ValueError(f"completed_stages: must be >= 0, got {completed_stages}")
        completed_stages = min(completed_stages, partial.num_stages)
        self._decay_to(now)
        top_k = self.config.top_k
        found = self.match(partial, completed_stages, top_k=top_k)
        if found is None:
            revealed = max(partial.num_stages, completed_stages + 1)
            if expected_stages is None:
                valid = self._n_stages[self._valid]
                expected_stages = int(np.median(valid)) if valid.size else self.config.default_stages
            return uniform_plan(max(revealed, expected_stages), deadline)
        if record_reuse:
            self._weight[found.slot] += 1.0
        if top_k == 1:
            return plan_from_stage_times(found.stage_time, deadline, "match", found.similarity, found.slot)
        phi = self._blended_phi(found.top_slots, found.top_similarities)
        return plan_from_phi(phi, deadline, "match", found.similarity, found.slot)

    def _blended_phi(self, slots: npt.NDArray[np.int64], similarity: FloatArray) -> FloatArray:
        """Similarity-weighted mean of the neighbours' phi, each padded with 1.0 past its end.

        A mean of nondecreasing curves ending at 1 is nondecreasing and ends at 1.
        """
        length = int(self._n_stages[slots].max())
        phis = np.ones((slots.size, length))
        for row, slot in enumerate(slots):
            n = int(self._n_stages[slot])
            phis[row, :n] = phi_from_stage_times(self._time[slot, :n])
        weights = similarity if similarity.sum() > 0 else np.ones(slots.size)
        return np.average(phis, axis=0, weights=weights)

    # ------------------------------------------------------------------------------ persistence
    _ARRAYS = ("_valid", "_n_stages", "_sig", "_out", "_tool", "_in", "_time", "_weight", "_added_seq")

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the history to `path` (.npz of arrays plus JSON metadata; atomic rename, no pickle)."""
        path = Path(path)
        vocab = sorted(self._signatures.items(), key=lambda item: item[1])
        meta = {
            "format": PATTERN_FORMAT_VERSION,
            "config": asdict(self.config),
            "seq": self._seq,
            "signatures": [[list(pair) for pair in sig] for sig, _ in vocab],
        }
        arrays = {name.lstrip("_"): getattr(self, name) for name in self._ARRAYS}
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as fh:
            np.savez_compressed(fh, meta=np.array(json.dumps(meta)), **arrays)  # type: ignore[arg-type]
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str], now: float | None = None) -> PatternStore:
        """Read a file written by `save` (allow_pickle=False).

        Reuse weights are restored as saved; `now` is the clock they count from afterwards (the
        saving process's clock means nothing here, so downtime does not decay them).
        """
        with np.load(Path(path), allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            if meta.get("format") != PATTERN_FORMAT_VERSION:
                raise ValueError(f"format: unsupported pattern store file version {meta.get('format')!r}")
            raw = dict(meta["config"])
            config = PatternConfig(**{**raw, "cost": LLMCostModel(**raw["cost"])})
            store = cls(config, now=now)
            for name in cls._ARRAYS:
                saved = data[name.lstrip("_")]
                current = getattr(store, name)
                if saved.shape != current.shape:
                    raise ValueError(f"{name.lstrip('_')}: shape {saved.shape} does not match the config")
                current[...] = saved
        store._seq = int(meta["seq"])
        store._signatures = {
            tuple((str(kind), str(identity)) for kind, identity in sig): code
            for code, sig in enumerate(meta["signatures"])
        }
        store._added_since_clustering = len(store)  # the index, if used, is rebuilt on the next add
        return store

    # ------------------------------------------------------------------------------- K-medoids
    def _probe_slots(
        self, feats: StageFeatures, sig: npt.NDArray[np.int64], done: int
    ) -> npt.NDArray[np.int64]:
        """Members of the clusters whose medoids score best, plus graphs added since clustering."""
        score, alive = self._scores(self._medoids, feats, sig, done)
        # a pruned medoid still represents compatible members, so rank by score, compatible first
        rank = np.lexsort((-score, ~alive))[: self.config.probe_clusters]
        take = np.isin(self._cluster, rank) | (self._cluster < 0)
        return np.flatnonzero(take & self._valid)

    def distance_matrix(self, slots: npt.NDArray[np.int64]) -> FloatArray:
        """Pairwise graph distance in [0, 1]: 1 - mean per-stage similarity over the longer graph.

        A stage missing from one graph or with different models/tools counts as distance 1.
        """
        cfg = self.config
        s = int(self._n_stages[slots].max()) if slots.size else 0
        sig, n = self._sig[slots, :s], self._n_stages[slots]
        dist = np.zeros((slots.size, slots.size))
        for lo in range(0, slots.size, 128):  # chunks bound memory at 128 x n x s
            hi = min(lo + 128, slots.size)
            same = sig[lo:hi, None, :] == sig[None, :, :]
            d_node = (self._out[slots[lo:hi], None, :s] - self._out[slots][None, :, :s]) ** 2 + (
                self._tool[slots[lo:hi], None, :s] - self._tool[slots][None, :, :s]
            ) ** 2
            d_edge = (self._in[slots[lo:hi], None, :s] - self._in[slots][None, :, :s]) ** 2
            k = cfg.node_weight * np.exp(-d_node / (2 * cfg.node_bandwidth**2)) + cfg.edge_weight * np.exp(
                -d_edge / (2 * cfg.edge_bandwidth**2)
            )
            sim = np.where(same & (sig[lo:hi, None, :] >= 0), k / (cfg.node_weight + cfg.edge_weight), 0.0)
            longer = np.maximum(n[lo:hi, None], n[None, :])
            dist[lo:hi] = 1.0 - sim.sum(axis=2) / longer
        return dist

    def recluster(self) -> None:
        """K-medoids over the stored graphs (deterministic for a given history and seed)."""
        slots = np.flatnonzero(self._valid)
        self._cluster[:] = -1
        self._added_since_clustering = 0
        if slots.size == 0:
            self._medoids = np.zeros(0, dtype=np.int64)
            return
        labels, medoids = k_medoids(self.distance_matrix(slots), self.config.clusters, self.config.seed)
        self._cluster[slots] = labels
        self._medoids = slots[medoids]


def k_medoids(
    dist: FloatArray, k: int, seed: int = 0, max_iter: int = 30
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Alternating K-medoids with k-medoids++ seeding on a precomputed distance matrix.

    Returns (label per point, medoid index per cluster). Deterministic for a given seed.
    """
    n = dist.shape[0]
    if dist.shape != (n, n):
        raise ValueError(f"dist: must be square, got shape {dist.shape}")
    if k < 1:
        raise ValueError(f"k: must be >= 1, got {k}")
    k = min(k, n)
    rng = np.random.default_rng(seed)
    medoids = [int(rng.integers(n))]
    nearest = dist[medoids[0]].copy()
    while len(medoids) < k:
        weight = nearest**2
        total = weight.sum()
        if total <= 0:  # all remaining points coincide with a medoid: take unused ones in order
            unused = np.setdiff1d(np.arange(n), medoids)
            medoids.extend(int(i) for i in unused[: k - len(medoids)])
            break
        nxt = int(rng.choice(n, p=weight / total))
        medoids.append(nxt)
        nearest = np.minimum(nearest, dist[nxt])
    med = np.array(medoids, dtype=np.int64)
    labels = np.argmin(dist[:, med], axis=1)
    for _ in range(max_iter):
        new_med = med.copy()
        for c in range(med.size):
            members = np.flatnonzero(labels == c)
            if members.size:
                within = dist[np.ix_(members, members)].sum(axis=1)
                new_med[c] = members[int(np.argmin(within))]
        new_labels = np.argmin(dist[:, new_med], axis=1)
        if np.array_equal(new_med, med) and np.array_equal(new_labels, labels):
            break
        med, labels = new_med, new_labels
    return labels.astype(np.int64), med
