"""Pattern graphs: validation, prefix pruning, similarity, phi / sub-deadlines, decay and eviction.

One monkeypatch, not a mock: the eviction test lowers the store's real signature cap so a few graphs
reach it (at its default it would take thousands)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jitserve.scheduler.analyzer.patterns import (
    LLMCostModel,
    PatternConfig,
    PatternGraph,
    PatternNode,
    PatternStore,
    StageFeatures,
    guard_late_stage,
    k_medoids,
    oracle_plan,
    phi_from_stage_times,
    plan_from_stage_times,
    uniform_plan,
)
from jitserve.scheduler.analyzer.workload import sample_program, sample_programs

COST = LLMCostModel()


def chain(*stages: tuple[str, str, float]) -> PatternGraph:
    """A sequential program from (kind, identity, size) stages: size is output tokens or seconds."""
    nodes = tuple(
        PatternNode.llm(s, ident, 100, int(size)) if kind == "llm" else PatternNode.tool(s, ident, size)
        for s, (kind, ident, size) in enumerate(stages)
    )
    return PatternGraph(nodes, tuple((i, i + 1) for i in range(len(nodes) - 1)))


def signature(graph: PatternGraph) -> tuple:
    return StageFeatures.of(graph, COST).signature


@pytest.fixture(scope="module")
def history() -> list[PatternGraph]:
    return sample_programs(300, seed=11)


def filled_store(graphs: list[PatternGraph], **config) -> PatternStore:
    store = PatternStore(PatternConfig(capacity=max(500, len(graphs)), **config), now=0.0)
    for g in graphs:
        store.add(g, now=0.0)
    return store


# ------------------------------------------------------------------------------------- validation
def test_graph_validation_names_the_problem():
    with pytest.raises(ValueError, match="stage 1 has no node"):
        PatternGraph((PatternNode.llm(0, "m", 1, 1), PatternNode.llm(2, "m", 1, 1)))
    with pytest.raises(ValueError, match="later stage"):
        PatternGraph((PatternNode.llm(0, "m", 1, 1), PatternNode.llm(1, "m", 1, 1)), ((1, 0),))
    with pytest.raises(ValueError, match="out of range"):
        PatternGraph((PatternNode.llm(0, "m", 1, 1),), ((0, 3),))
    with pytest.raises(ValueError, match="output_len"):
        PatternNode.llm(0, "m", 10, -1)
    with pytest.raises(ValueError, match="duration_s"):
        PatternNode(0, PatternNode.tool(0, "t", 1.0).kind, "t")  # a tool without its time
    with pytest.raises(ValueError, match="deadline"):
        uniform_plan(3, deadline=0.0)


# ---------------------------------------------------------------------------------------- phi
def test_oracle_phi_is_the_accumulated_share_of_stage_time():
    # stage 0: one LLM call; stage 1: two parallel calls (the slower one counts); stage 2: a tool
    g = PatternGraph(
        (
            PatternNode.llm(0, "m", 0, 40),  # 40 * 0.025 = 1 s
            PatternNode.llm(1, "m", 0, 80),  # 2 s
            PatternNode.llm(1, "m", 0, 120),  # 3 s  -> stage 1 takes 3 s
            PatternNode.tool(2, "search", 4.0),
        ),
        ((0, 1), (0, 2), (1, 3), (2, 3)),
    )
    plan = oracle_plan(g, deadline=80.0)
    np.testing.assert_allclose(plan.phi, [1 / 8, 4 / 8, 1.0])
    np.testing.assert_allclose(plan.sub_deadlines, [10.0, 40.0, 80.0])
    assert plan.source == "oracle"
    assert plan.deadline_for_stage(7) == 80.0  # past the plan: the whole deadline


@settings(max_examples=200, deadline=None)
@given(
    times=st.lists(st.floats(0, 1e4, allow_nan=False), min_size=1, max_size=40),
    deadline=st.floats(1e-3, 1e5, allow_nan=False),
)
def test_sub_deadlines_are_monotone_and_end_at_the_deadline(times, deadline):
    plan = plan_from_stage_times(times, deadline, "match")
    assert np.all(np.diff(plan.sub_deadlines) >= 0)
    assert plan.sub_deadlines[-1] == deadline
    assert np.all(plan.sub_deadlines >= 0) and np.all(plan.phi <= 1.0)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), deadline=st.floats(1.0, 1e4), cut=st.floats(0, 1))
def test_store_plans_are_monotone_and_end_at_the_deadline(history, seed, deadline, cut):
    store = filled_store(history[:100], top_k=1 + seed % 8)
    g = sample_program(
        ["chatbot", "deep_research", "agentic_codegen", "math_reasoning"][seed % 4],
        np.random.default_rng(seed),
    )
    done = int(cut * (g.num_stages - 1))
    plan = store.plan(g.prefix(done + 1), done, deadline, now=0.0)
    assert np.all(np.diff(plan.sub_deadlines) >= 0)
    assert plan.sub_deadlines[-1] == deadline
    assert plan.num_stages >= done + 1  # covers every revealed stage


# ----------------------------------------------------------------------------------- matching
def test_identical_graph_matches_itself_best(history):
    store = filled_store(history)
    for slot in (0, 17, 123, 299):
        g = history[slot]
        found = store.match(g, completed_stages=g.num_stages)
        assert found is not None
        assert found.similarity == pytest.approx(1.0)
        np.testing.assert_allclose(found.stage_time, StageFeatures.of(g, COST).stage_time)


def test_prefix_pruning_keeps_exactly_the_compatible_graphs(history):
    store = filled_store(history)
    stored_sigs = [signature(h) for h in history]
    for g in history[:40]:
        for done in range(g.num_stages):
            partial = g.prefix(done + 1)  # stage `done` in progress
            sig = signature(partial)
            compatible = [h for h in stored_sigs if len(h) >= len(sig) and h[: len(sig)] == sig]
            found = store.match(partial, done, exhaustive=True)
            assert found is not None  # g itself is compatible
            assert found.candidates == len(compatible)
            assert stored_sigs[found.slot][: len(sig)] == sig  # slots fill in order


def test_divergent_prefix_is_pruned_and_falls_back():
    a = chain(("llm", "m1", 100), ("tool", "search", 2.0), ("llm", "m1", 300))
    b = chain(("llm", "m1", 100), ("tool", "calculator", 0.1), ("llm", "m1", 50), ("llm", "m1", 50))
    store = filled_store([a])
    partial_b = b.prefix(2)  # stage 1 runs a different tool than anything stored
    assert store.match(partial_b, completed_stages=1) is None
    plan = store.plan(partial_b, completed_stages=1, deadline=60.0, now=0.0, expected_stages=4)
    assert plan.source == "fallback"
    np.testing.assert_allclose(plan.sub_deadlines, [15.0, 30.0, 45.0, 60.0])
    # once b's kind of program is in history, the same partial matches it
    store.add(b, now=0.0)
    found = store.match(partial_b, completed_stages=1)
    assert found is not None and found.candidates == 1


def test_fewer_stages_than_revealed_is_pruned():
    short = chain(("llm", "m", 100), ("llm", "m", 100))
    long = chain(("llm", "m", 100), ("llm", "m", 100), ("llm", "m", 100))
    store = filled_store([short])
    assert store.match(long.prefix(3), completed_stages=2) is None
    # two stages done, the third not revealed: the 2-stage match says the next stage is the last
    plan = store.plan(long.prefix(2), completed_stages=2, deadline=40.0, now=0.0)
    assert plan.source == "match" and plan.deadline_for_stage(2) == 40.0


def test_similarity_prefers_closer_attributes():
    near = chain(("llm", "m", 100), ("llm", "m", 900))
    far = chain(("llm", "m", 3000), ("llm", "m", 100))
    store = filled_store([far, near])
    query = chain(("llm", "m", 110), ("llm", "m", 500))
    found = store.match(query.prefix(1), completed_stages=1)
    assert found is not None
    assert found.slot == 1  # near
    plan = store.plan(query.prefix(1), 1, deadline=100.0, now=0.0)
    near_phi0 = (0.02 + 2.5) / (0.02 + 2.5 + 0.02 + 22.5)  # prefill + decode seconds per stage
    assert plan.phi[0] == pytest.approx(near_phi0)
    assert plan.sub_deadlines[0] == pytest.approx(100 * near_phi0)


def test_completed_stages_beyond_the_graph():
    store = filled_store([chain(("llm", "m", 10), ("llm", "m", 10), ("llm", "m", 10))])
    two = chain(("llm", "m", 10), ("llm", "m", 10))
    with pytest.raises(ValueError, match="completed_stages"):
        store.match(two, completed_stages=3)
    with pytest.raises(ValueError, match="completed_stages"):
        store.plan(two, completed_stages=-1, deadline=10.0, now=0.0)
    plan = store.plan(two, completed_stages=3, deadline=10.0, now=0.0)  # clamped to 2
    assert plan.source == "match" and plan.sub_deadlines[-1] == 10.0


def test_top_k_blends_the_neighbours_phi():
    # two stored programs with the same first stage, phi(0) = 1/5 and 3/5 (equal similarity)
    a = chain(("llm", "m", 100), ("tool", "t", 10.0))  # stage times 2.52 s, 10 s
    b = chain(("llm", "m", 100), ("tool", "t", 10.0), ("tool", "u", 0.1))
    store = filled_store([a, b], top_k=2)
    query = chain(("llm", "m", 100))
    plan = store.plan(query, 1, deadline=10.0, now=0.0)
    phi_a = phi_from_stage_times([2.52, 10.0])
    phi_b = phi_from_stage_times([2.52, 10.0, 0.1])
    np.testing.assert_allclose(plan.phi, (np.r_[phi_a, 1.0] + phi_b) / 2)
    assert plan.num_stages == 3 and plan.sub_deadlines[-1] == 10.0
    assert np.all(np.diff(plan.phi) >= 0)
    best_only = filled_store([a, b]).plan(query, 1, deadline=10.0, now=0.0)  # tie: the newer, b
    np.testing.assert_allclose(best_only.phi, phi_b)


def test_empty_store_falls_back_to_uniform():
    assert filled_store([chain(("llm", "m", 1))]).match(PatternGraph(()), 0) is None  # nothing revealed
    store = PatternStore(now=0.0)
    g = chain(("llm", "m", 1), ("llm", "m", 1))
    plan = store.plan(g.prefix(1), 0, deadline=30.0, now=0.0)
    assert plan.source == "fallback" and plan.num_stages == PatternConfig().default_stages
    np.testing.assert_allclose(plan.sub_deadlines, [10.0, 20.0, 30.0])
    # more stages revealed than assumed: the split covers what is known
    five = chain(*[("llm", "m", 1)] * 5)
    assert store.plan(five, 4, deadline=50.0, now=0.0, expected_stages=2).num_stages == 5
    # all five done and the program still running: at least a sixth stage is coming
    assert store.plan(five, 5, deadline=50.0, now=0.0, expected_stages=2).num_stages == 6


def test_cluster_index_finds_a_match_whenever_the_scan_does(history):
    store = filled_store(history, index_min_graphs=0, clusters=8, probe_clusters=2)
    store.recluster()
    rng = np.random.default_rng(0)
    for g in sample_programs(60, seed=12):
        done = int(rng.integers(0, g.num_stages))
        partial = g.prefix(done + 1)
        scan = store.match(partial, done, exhaustive=True)
        indexed = store.match(partial, done, exhaustive=False)
        assert (scan is None) == (indexed is None)
        if scan is not None:
            assert indexed.similarity <= scan.similarity + 1e-12


# ---------------------------------------------------------------------------- decay, eviction
def test_capacity_holds_and_weights_decay_by_0_9_per_hour(history):
    store = PatternStore(PatternConfig(capacity=20), now=0.0)
    for i, g in enumerate(history[:100]):
        store.add(g, now=float(i))
        assert len(store) <= 20
    assert len(store) == 20
    fresh = PatternStore(PatternConfig(capacity=5), now=0.0)
    fresh.add(history[0], now=0.0)
    np.testing.assert_allclose(fresh.weights(now=7200.0), [0.81])


def test_eviction_keeps_the_reused_graph():
    graphs = [chain(("llm", "m", 100 * (i + 1)), ("llm", "m", 50)) for i in range(12)]
    store = PatternStore(PatternConfig(capacity=4), now=0.0)
    for g in graphs[:4]:
        store.add(g, now=0.0)
    keep = graphs[2]
    for _ in range(3):  # reuse graph 2 (weight 1 -> 4)
        store.plan(keep.prefix(1), 1, deadline=10.0, now=0.0)
    for t, g in enumerate(graphs[4:], start=1):
        store.add(g, now=float(t) * 3600.0)  # an hour apart: weights decay meanwhile
        assert len(store) == 4
    found = store.match(keep, keep.num_stages)
    assert found is not None and found.similarity == pytest.approx(1.0)


# -------------------------------------------------------------------------------- persistence
def test_save_load_round_trip_matches_the_same(history, tmp_path):
    store = PatternStore(PatternConfig(capacity=50, top_k=3), now=0.0)
    for i, g in enumerate(history[:80]):  # wraps: evictions and decayed weights get saved too
        store.add(g, now=60.0 * i)
    path = tmp_path / "patterns.npz"
    store.save(path)
    loaded = PatternStore.load(path, now=0.0)
    assert loaded.config == store.config and len(loaded) == len(store) == 50
    np.testing.assert_allclose(loaded.weights(now=0.0), store.weights(now=60.0 * 79))
    for g in history[80:120]:
        done = g.num_stages // 2
        a = store.plan(g.prefix(done + 1), done, 50.0, now=60.0 * 79, record_reuse=False)
        b = loaded.plan(g.prefix(done + 1), done, 50.0, now=0.0, record_reuse=False)
        np.testing.assert_array_equal(a.sub_deadlines, b.sub_deadlines)
        assert (a.source, a.matched_slot) == (b.source, b.matched_slot)
    loaded.add(history[120], now=1.0)  # interning continues consistently after a load
    found = loaded.match(history[120], history[120].num_stages)
    assert found is not None and found.similarity == pytest.approx(1.0)


def test_signature_vocabulary_stays_bounded(monkeypatch):
    """The store's real signature cap, lowered with monkeypatch (not a mock): at its default it takes
    thousands of distinct graphs to reach, too many for a unit test."""
    import jitserve.scheduler.analyzer.patterns as patterns

    # not a mock: the real cap, lowered so the test reaches it with a few graphs
    monkeypatch.setattr(patterns, "MAX_SIGNATURES", 12)
    store = PatternStore(PatternConfig(capacity=3), now=0.0)
    graphs = [chain(("llm", f"model-{i}", 100), ("tool", f"tool-{i}", 1.0)) for i in range(30)]
    for g in graphs:
        store.add(g, now=0.0)
        assert len(store._signatures) <= 12
    for g in graphs[-3:]:  # the stored graphs still match themselves after compactions
        found = store.match(g, g.num_stages)
        assert found is not None and found.similarity == pytest.approx(1.0)
    assert store.match(graphs[0], 2) is None  # evicted, and its signatures forgotten


def test_load_rejects_other_formats(tmp_path):
    path = tmp_path / "bad.npz"
    np.savez(path, meta=np.array('{"format": 0}'))
    with pytest.raises(ValueError, match="format"):
        PatternStore.load(path)


# ----------------------------------------------------------------------------------- K-medoids
def test_k_medoids_separates_groups_deterministically():
    rng = np.random.default_rng(3)
    pts = np.concatenate([rng.normal(0, 0.1, 30), rng.normal(5, 0.1, 30), rng.normal(10, 0.1, 30)])
    dist = np.abs(pts[:, None] - pts[None, :])
    labels, medoids = k_medoids(dist, 3, seed=1)
    for group in (slice(0, 30), slice(30, 60), slice(60, 90)):
        assert len(set(labels[group].tolist())) == 1
    assert len(set(labels.tolist())) == 3
    again = k_medoids(dist, 3, seed=1)
    np.testing.assert_array_equal(again[0], labels)
    np.testing.assert_array_equal(again[1], medoids)
    for c, m in enumerate(medoids):  # each medoid belongs to its own cluster
        assert labels[m] == c


def test_graph_distance_is_zero_to_itself_and_one_across_apps():
    store = filled_store([chain(("llm", "a", 100)), chain(("llm", "a", 100)), chain(("tool", "t", 1.0))])
    d = store.distance_matrix(np.arange(3))
    np.testing.assert_allclose(np.diag(d), 0.0, atol=1e-12)
    assert d[0, 1] == pytest.approx(0.0) and d[0, 2] == pytest.approx(1.0)


def test_later_stages_waits_for_a_slot_come_out_of_what_is_left_before_it_is_split():
    """A stage's sub-deadline leaves each later stage its expected wait for a slot: the plan's share of the
    rest shrinks by (what is left - the waits) / what is left (docs/decisions/core.md, "Later stages'
    waits come out of the plan")."""
    # no wait: the plan stands (D = 60 s, three stages, stage 0 planned to end at 30 s)
    assert guard_late_stage(30.0, 60.0, 0.0, 3) == 30.0
    assert guard_late_stage(30.0, 60.0, 0.0, 3, slot_wait_s=0.0) == 30.0
    # two later stages wait 5 s each: 50 s of work are left to split, so stage 0 ends at 30 x 50 / 60
    assert guard_late_stage(30.0, 60.0, 0.0, 3, slot_wait_s=5.0) == pytest.approx(25.0)
    # the same from a later start: only what is left is scaled (stage 1 of 3 at 20 s, planned for 45 s)
    assert guard_late_stage(45.0, 60.0, 20.0, 2, slot_wait_s=4.0) == pytest.approx(20.0 + 25.0 * 36.0 / 40.0)
    # the even-split floor is taken of the work left, not of what the waits take: 16 s / 2 after 4 s of wait
    assert guard_late_stage(21.0, 60.0, 40.0, 2, slot_wait_s=4.0) == pytest.approx(48.0)
    # waits beyond all but an even split are capped there: the stage keeps half of the 10 s left
    assert guard_late_stage(55.0, 60.0, 50.0, 2, slot_wait_s=100.0) == pytest.approx(52.5)
    # the last stage waits for no one after it: it gets everything left
    assert guard_late_stage(50.0, 60.0, 40.0, 1, slot_wait_s=30.0) == 60.0


@pytest.mark.parametrize("wait", [-1.0, float("nan")])
def test_a_negative_or_missing_slot_wait_names_the_argument(wait):
    with pytest.raises(ValueError, match="slot_wait_s: must be a number >= 0"):
        guard_late_stage(30.0, 60.0, 0.0, 3, slot_wait_s=wait)
