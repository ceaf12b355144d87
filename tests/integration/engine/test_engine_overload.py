"""Real engines held overloaded: what the JITServe scheduler must do when the batch is full.

Each test runs twice, against `slow_engine` (tests/fixtures/slow_engines.py):

- `[jitserve]`: `jitserve engine` with the JITServe scheduler, B = 4, frames of 50 steps;
- `[stock]`: stock vLLM (FCFS) configured alike: the control. The same scenario must NOT meet the
  requirement there, which proves the scenario can fail and that passing it is the scheduler's doing.

Why the engines are slowed, and why that is not a mock: the tiny test model decodes a step in 2-3 ms,
faster than clients can build a queue. Both engines load a subclass of their real scheduler class
whose only change is a fixed sleep (`SLOW_STEP_S`, 60 ms) in each busy step, where a bigger model's
compute would be (tests/fixtures/slow_scheduler.py). vLLM's engine core, KV cache, the scheduler and
its policy all run unchanged; a decode step then takes ~65 ms, the pace of the demo's SmolLM2-135M
here and of GPU decode steps, and a 1,000-token request holds its slot for about a minute. JITServe
measures the slower steps itself (its state's `step_time_s`) and plans with them.

No assertion is about how long the machine took. The requirements are SLO outcomes: a first token
before the request's TTFT, every token on its TBT pace, a deadline met, the order of first tokens.
Times are the client's (the moment a streamed chunk arrived, minus the moment the request was sent),
which include HTTP and queueing in the API server, so they are the stricter measure. Each SLO leaves
several steps of slack over the minimum the engine needs (one step to see the arrival, one prefill
step), and each is far shorter than the time a held slot takes to free by itself, which is what an
FCFS engine waits for.

Queues are built by waiting for vLLM's own gauges (`/metrics`, the same on both engines), never for
time; "holders" (1,000-token loose-deadline requests) fill the batch and are released explicitly by
closing their streams (vLLM aborts a request whose client left).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.fixtures.engines import TEST_CLASSES
from tests.fixtures.slow_engines import SLOW_BATCH, SLOW_STEP_S, SlowEngine, slow_engine_fixture  # noqa: F401

pytestmark = pytest.mark.engine

B = SLOW_BATCH
HOLD_TOKENS = 1000  # ~65 s of decoding: a holder never frees its slot during a test on its own
PHASE_TIMEOUT_S = 90.0
INTERACTIVE = TEST_CLASSES["interactive"]  # latency: TTFT 1 s, TBT 0.2 s
TIGHT = TEST_CLASSES["tight"]  # deadline 4 s, output tokens worth 5
DUE_FACTOR = 1.6  # the state test's deadlines, in units of the requests' own decoding time
STATE_KEYS = (
    "running", "waiting", "step_time_s", "committed_bandwidth", "residual_capacity", "queue_delay_s",
    "admission_priority", "kv_usage", "frames", "steps", "preempted_total", "dropped_total",
)  # fmt: skip


class Stream:
    """One streaming completion consumed on a thread; records when each chunk reached the client.
    `close()` drops the connection at the next chunk, which makes vLLM abort the request."""

    def __init__(
        self, engine: SlowEngine, client: Any, name: str, max_tokens: int, xargs: dict[str, Any]
    ) -> None:
        self.engine, self.name, self.max_tokens = engine, name, max_tokens
        self.sent_at: float | None = None
        self.token_times: list[float] = []
        self.finish_reason: str | None = None
        self.error: BaseException | None = None
        self.closing = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(client, xargs), daemon=True)
        self.thread.start()

    def _run(self, client: Any, xargs: dict[str, Any]) -> None:
        try:
            self.sent_at = time.time()
            stream = client.completions.create(
                model=self.engine.model_name, prompt=f"{self.name} request", max_tokens=self.max_tokens,
                stream=True, extra_body={"ignore_eos": True, "return_token_ids": True, "vllm_xargs": xargs},
            )  # fmt: skip
            for chunk in stream:
                now = time.time()
                if chunk.choices:
                    # a chunk carries one step's token, or several when vLLM merged steps for a slow reader
                    new_tokens = len((chunk.choices[0].model_extra or {}).get("token_ids") or [])
                    self.token_times.extend([now] * new_tokens)
                    if chunk.choices[0].finish_reason is not None:
                        self.finish_reason = chunk.choices[0].finish_reason
                if self.closing.is_set():
                    stream.close()
                    return
        except BaseException as exc:  # reported by the test
            self.error = exc

    @property
    def ended(self) -> bool:
        return not self.thread.is_alive()

    @property
    def first_token_at(self) -> float | None:
        return self.token_times[0] if self.token_times else None

    def ttft(self) -> float | None:
        first = self.first_token_at
        return None if first is None or self.sent_at is None else first - self.sent_at

    def _where(self) -> str:
        """Where this stream's thread is now (for a report on a request that was never sent)."""
        frame = sys._current_frames().get(self.thread.ident or -1)
        if frame is None:
            return ""
        return ", thread at:\n" + "".join(traceback.format_stack(frame)[-4:])

    def describe(self) -> str:
        if self.sent_at is None:
            return f"{self.name}: not sent{self._where()}"
        rel = [round(t - self.sent_at, 3) for t in self.token_times]
        head = rel[:3] + (["..."] if len(rel) > 4 else []) + rel[3:][-1:]
        return (
            f"{self.name}: sent {self.sent_at:.3f}, {len(rel)} tokens at +{head} s, "
            f"finish {self.finish_reason}, error {self.error!r}"
        )


class Overload:
    """A scenario on one engine: holders fill the batch, then the requests under test queue."""

    def __init__(self, engine: SlowEngine) -> None:
        self.engine = engine
        self.run = uuid.uuid4().hex[:8]
        self.streams: dict[str, Stream] = {}
        self.holders: list[str] = []
        # One client for every stream, built here on the test's thread (httpx clients are thread-safe):
        # CI once saw two of four holder threads, each building its own client, still before their
        # request a minute later, so the batch never filled.
        self.client = engine.openai(timeout=PHASE_TIMEOUT_S * 2)

    def submit(self, name: str, max_tokens: int, xargs: dict[str, Any]) -> Stream:
        # length_bound = max_tokens: GMAX's inputs do not depend on what the length predictor learned
        xargs = {**xargs, "length_bound": max_tokens, "tenant": f"{self.run}-{name}"}
        self.streams[name] = Stream(self.engine, self.client, name, max_tokens, xargs)
        return self.streams[name]

    def wait(self, what: str, predicate: Callable[[], bool], timeout: float = PHASE_TIMEOUT_S) -> None:
        """Poll until `predicate()`; fail at once if a holder ended before its release."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name in self.holders:
                stream = self.streams[name]
                assert not (stream.ended and not stream.closing.is_set()), (
                    f"{name} ended before the test released it, so the batch was not held:\n{self.report()}"
                )
            if predicate():
                return
            time.sleep(0.05)
        raise AssertionError(f"engine never reached: {what}\n{self.report()}")

    def queued(self, running: int, waiting: int) -> Callable[[], bool]:
        return lambda: self.engine.queue() == (running, waiting)

    def hold(self, queued_loose: int = 0) -> None:
        """B holders running (each has streamed a token), then `queued_loose` loose requests waiting."""
        self.holders = [f"holder{i}" for i in range(B)]
        for name in self.holders:
            self.submit(name, HOLD_TOKENS, {"slo_class": "loose"})
        self.wait(
            "the batch full of holders",
            lambda: all(self.streams[h].token_times for h in self.holders) and self.engine.queue() == (B, 0),
        )
        for i in range(queued_loose):  # one at a time: their arrival order is certain
            self.submit(f"loose{i}", HOLD_TOKENS, {"slo_class": "loose"})
            self.wait(f"loose{i} queued", self.queued(B, i + 1))

    def wait_until_settled(self, stream: Stream, seconds_after_send: float) -> None:
        """Until `stream` has ended, or `seconds_after_send` passed since it was sent (by then its SLO
        is decided either way; waiting longer would only slow the control down)."""
        self.wait(
            f"{stream.name} settled",
            lambda: (
                stream.ended
                or (stream.sent_at is not None and time.time() > stream.sent_at + seconds_after_send)
            ),
        )

    def release_one(self) -> None:
        """Close a running holder's stream and wait until a waiting request took the freed slot.

        Running: the holder whose latest token is the most recent. A holder the scheduler preempted
        waits for a slot like the requests under test, and its stream ends only once it gets one."""
        left = [self.streams[h] for h in self.holders if not self.streams[h].closing.is_set()]
        holder = max(left, key=lambda s: s.token_times[-1])
        waiting = self.engine.queue()[1]
        holder.closing.set()
        self.wait(f"{holder.name} released", lambda: holder.ended)
        if waiting:
            self.wait(
                f"a waiting request admitted after {holder.name}", lambda: self.engine.queue()[1] < waiting
            )

    def release_all(self) -> None:
        while any(not self.streams[h].closing.is_set() for h in self.holders):
            self.release_one()

    def report(self) -> str:
        lines = [s.describe() for s in self.streams.values()]
        try:
            lines.append(f"vLLM queue (running, waiting): {self.engine.queue()}")
            if self.engine.kind == "jitserve":
                state = self.engine.state()
                prefix = f"{self.run}-"
                for r in state["recent"]:
                    if r["tenant"].startswith(prefix):
                        lines.append(
                            f"engine: {r['tenant'][len(prefix) :]} arrival {r['arrival']} started "
                            f"{r['started_at']} finished {r['finished_at']} outcome {r['outcome']}"
                        )
                lines.append("state: " + ", ".join(f"{k}={state[k]}" for k in STATE_KEYS))
        except (OSError, RuntimeError) as exc:
            lines.append(f"(engine unreadable: {exc})")
        return "\n".join(lines)

    def close(self) -> None:
        """End every stream (a queued one ends at its first token) and wait until the engine idles."""
        for stream in self.streams.values():
            stream.closing.set()
        for stream in self.streams.values():
            stream.thread.join(PHASE_TIMEOUT_S)
        self.wait("idle again", self.queued(0, 0))
        self.client.close()


@pytest.fixture
def overload(slow_engine: SlowEngine) -> Iterator[Overload]:
    scenario = Overload(slow_engine)
    scenario.wait("idle before the scenario", scenario.queued(0, 0))
    try:
        yield scenario
    finally:
        scenario.holders = []  # closing them now is intended
        scenario.close()


def expect(engine: SlowEngine, met: bool, what: str, scenario: Overload) -> None:
    """JITServe must meet the requirement; the stock-FCFS control must not (else the test proves nothing)."""
    print(f"[{engine.kind}] {what}: {'met' if met else 'NOT met'}\n{scenario.report()}")
    if engine.kind == "jitserve":
        assert met, f"JITServe did not meet: {what}\n{scenario.report()}"
    else:
        assert not met, f"stock FCFS met it too, so the scenario does not test the scheduler: {what}\n" + (
            scenario.report()
        )


def test_latency_request_behind_a_full_batch_gets_its_first_token_within_its_ttft(
    slow_engine: SlowEngine, overload: Overload
) -> None:
    """Four holders (loose deadline, ~65 s each) fill the batch and two more loose requests queue; then
    a latency request (`interactive`: TTFT 1 s, TBT 0.2 s, 8 tokens) arrives. Its first token must come
    within 1 s and every later token on its TBT pace (token i by TTFT + i x TBT), as measured by the
    client. 1 s is ~15 decode steps: the engine needs one to see the arrival and one prefill step; no
    slot frees by itself for a minute, and the next frame boundary (50 steps, ~3 s) may be after the
    deadline, so the scheduler must give it bandwidth mid-frame (the loose work can spare a slot).
    Stock FCFS leaves it behind the queue until a slot frees."""
    overload.hold(queued_loose=2)
    latency = overload.submit("latency", 8, {"slo_class": "interactive"})
    ttft, tbt = INTERACTIVE["ttftSeconds"], INTERACTIVE["tbtSeconds"]
    overload.wait_until_settled(latency, ttft + 7 * tbt + 1.0)
    overload.release_all()  # the control's request starts only now; JITServe's is long done
    overload.wait("the latency request ended", lambda: latency.ended)
    assert latency.sent_at is not None and latency.error is None, overload.report()
    on_pace = len(latency.token_times) == 8 and all(
        t - latency.sent_at <= ttft + i * tbt for i, t in enumerate(latency.token_times)
    )
    first = latency.ttft()
    expect(
        slow_engine,
        first is not None and first <= ttft and on_pace,
        f"first token within TTFT {ttft} s (got {first}) and every token on its {tbt} s pace",
        overload,
    )


def test_tight_deadline_overtakes_loose_work(slow_engine: SlowEngine, overload: Overload) -> None:
    """Four holders fill the batch, two loose requests (600 s deadline) queue, then a `tight` request
    arrives (deadline 4 s, 16 tokens: ~1 s of decoding). It must finish within its deadline, and its
    first token must precede those of the loose requests that queued before it. The loose work has
    minutes of slack; the tight request has ~3 s. Slots are then freed one at a time, so on the control
    the FCFS order (loose0, loose1, tight) shows in the first tokens."""
    overload.hold(queued_loose=2)
    tight = overload.submit("tight", 16, {"slo_class": "tight"})
    deadline = TIGHT["deadlineSeconds"]
    overload.wait_until_settled(tight, deadline + 1.0)
    overload.release_all()
    overload.wait("the tight request ended", lambda: tight.ended)
    loose = [overload.streams[f"loose{i}"] for i in range(2)]
    overload.wait("the loose requests started", lambda: all(s.token_times for s in loose))
    assert tight.sent_at is not None and tight.error is None, overload.report()
    in_time = (
        tight.finish_reason == "length"
        and len(tight.token_times) == 16
        and tight.token_times[-1] - tight.sent_at <= deadline
    )
    first = tight.first_token_at
    overtook = first is not None and all(first < s.token_times[0] for s in loose)
    expect(
        slow_engine,
        in_time and overtook,
        f"tight finished within {deadline} s (in time: {in_time}) and started before the loose ones "
        f"queued ahead of it (overtook: {overtook})",
        overload,
    )


def test_best_effort_waits_for_slo_work(slow_engine: SlowEngine, overload: Overload) -> None:
    """Four holders fill the batch; two best-effort requests (`batch`, the pool's default class) queue,
    then two deadline requests (60 s deadline: SLO work with slack, so nothing needs preempting), all
    32 tokens. Slots are freed one at a time: both SLO requests must get their first token before
    either best-effort one, although those arrived first; best-effort work still finishes (it waits,
    it is not dropped). Stock FCFS serves the best-effort requests first."""
    overload.hold()
    for i in range(2):
        overload.submit(f"be{i}", 32, {"slo_class": "batch"})
        overload.wait(f"be{i} queued", overload.queued(B, i + 1))
    for i in range(2):
        overload.submit(f"slo{i}", 32, {"slo_class": "loose", "deadline": 60})
        overload.wait(f"slo{i} queued", overload.queued(B, 3 + i))
    overload.release_all()
    be = [overload.streams[f"be{i}"] for i in range(2)]
    slo = [overload.streams[f"slo{i}"] for i in range(2)]
    overload.wait("all four ended", lambda: all(s.ended for s in be + slo))
    assert all(s.finish_reason == "length" and s.error is None for s in be + slo), overload.report()
    last_slo = max(s.token_times[0] for s in slo)
    first_be = min(s.token_times[0] for s in be)
    expect(
        slow_engine,
        last_slo < first_be,
        "both SLO requests got their first token before either best-effort request",
        overload,
    )


def test_state_shows_the_overload(slow_engine: SlowEngine, overload: Overload) -> None:
    """Four holders fill the batch, then eight deadline requests queue that together need more
    bandwidth than the engine has: 200 tokens each, due in 1.6x the time they take to decode at the
    engine's measured step time (bw = t_gen / t_rem ~ 0.6 each, ~5 slots in all on top of the holders'
    ~0.4, with B = 4). The state must say so while they wait: the batch full, the queue, committed
    bandwidth above B (residual capacity negative), a bar for admission, a queue delay, and the
    stretched step as the engine's own measured step time (JITServe plans with the slow model's real
    pace). On the stock control, which has no state endpoint, vLLM's gauges show the same queue: the
    control runs under the same load."""
    overload.hold()
    step = slow_engine.state()["step_time_s"] if slow_engine.kind == "jitserve" else SLOW_STEP_S
    due_s = round(200 * step * DUE_FACTOR, 1)
    for i in range(8):
        overload.submit(f"due{i}", 200, {"deadline": due_s, "waiting_time": due_s})
    overload.wait("eight requests queued", overload.queued(B, 8))
    if slow_engine.kind == "stock":
        return  # the control: vLLM's own gauges showed (B, 8) above
    seen: dict[str, Any] = {}

    def overloaded() -> bool:
        state = slow_engine.state()
        seen.update(state)
        mine = [r for r in state["recent"] if r["tenant"].startswith(f"{overload.run}-due")]
        return (
            state["running"] == B
            and state["waiting"] == 8
            and len(mine) == 8
            and state["committed_bandwidth"] > B
        )

    overload.wait(
        f"the state reports committed bandwidth above B with eight waiting (deadline {due_s} s)",
        overloaded,
        timeout=10,
    )
    state = seen
    print(f"deadline {due_s} s; state: " + ", ".join(f"{k}={state[k]}" for k in STATE_KEYS))
    assert state["batch_size"] == B and state["policy"] == os.environ.get("JITSERVE_TEST_POLICY", "jitserve")
    assert state["residual_capacity"] == pytest.approx(B - state["committed_bandwidth"]) and (
        state["residual_capacity"] < 0
    )
    assert state["queue_delay_s"] > 0 and state["admission_priority"] > 0 and state["kv_usage"] > 0
    assert state["step_time_s"] >= SLOW_STEP_S  # the engine measures the slowed step, not the tiny model's
    assert state["frames"] > 0 and state["steps"] > 0
