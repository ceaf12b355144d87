"""The state an engine pod reports, and the channel from the scheduler to the HTTP server.

vLLM runs the scheduler in its engine-core process and HTTP in the API-server process. The scheduler
hands a fresh `EngineState` to a `StatePublisher`, whose thread atomically writes it as JSON into the
engine's runtime dir (`state.json`: write a temp file, then rename). The API server's middleware
(`jitserve.engine.http`) reads that file per request. Why a file: it survives either process
restarting, needs no extra port or protocol, costs one small write per frame off the scheduling thread,
and is trivial to inspect (`cat`). See docs/decisions/engine.md.

Liveness: `updated_at` is refreshed by the publisher thread while the scheduler is idle or stepping; if
the engine has work but has not stepped for `stall_after_s`, refreshing stops and readers see the
state go stale (the router then treats the pod as unhealthy).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import threading
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from jitserve.scheduler.placement import ReplicaState

STATE_FILE = "state.json"
HISTORY_FILE = "history.jsonl"
ANALYZER_FILE = "length_predictor.npz"

log = logging.getLogger("jitserve.engine")


class RequestDebug(BaseModel):
    """How the engine understood one recent request's SLO (the path xargs -> scheduler, observable)."""

    model_config = ConfigDict(extra="forbid")

    request_id: str
    slo_class: str
    slo_type: str
    deadline_s: float | None = None
    ttft_s: float | None = None
    tbt_s: float | None = None
    waiting_time_s: float
    stage_deadline_abs: float | None = None
    program_id: str | None = None
    tenant: str = ""
    max_tokens: int
    length_bound: int
    error: str | None = None
    outcome: str | None = Field(None, description="None while queued or running; finished/dropped/aborted")
    arrival: float | None = Field(None, description="unix time the request reached the scheduler")
    started_at: float | None = Field(None, description="unix time it was first scheduled")
    finished_at: float | None = Field(None, description="unix time it left the engine")


class ClassTotalsModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    finished: int = 0
    met: int = 0
    dropped: int = 0
    goodput_tokens: float = 0.0


class EngineState(ReplicaState):
    """`ReplicaState` (what the router's power-of-K reads) plus engine diagnostics."""

    policy: str = Field(description="scheduling policy in this engine")
    frame_steps: int = Field(ge=1, description="Delta: engine steps per scheduling frame")
    steps: int = Field(0, ge=0, description="engine steps so far")
    invalid_slo_total: int = Field(0, ge=0, description="requests whose xargs were malformed")
    classes: list[str] = Field(default_factory=list, description="SLO classes the engine knows")
    default_class: str | None = None
    classes_version: int = Field(0, ge=0, description="increments on every reload of the classes file")
    classes_error: str | None = None
    totals: dict[str, ClassTotalsModel] = Field(default_factory=dict, description="since start, per class")
    recent: list[RequestDebug] = Field(default_factory=list, description="latest requests, newest last")
    vllm_version: str = ""
    started_at: float = 0.0
    length_fits_total: int = Field(0, ge=0, description="length-predictor fits finished since start")
    length_fit_cpu_seconds_total: float = Field(
        0.0, ge=0, description="CPU seconds those fits took, in the child process that ran them"
    )
    step_token_budget: int | None = Field(
        None,
        ge=1,
        description="tokens the last step could schedule: just-in-time GMAX keeps a step within the tightest "
        "running pace (docs/decisions/core.md); null while the engine's configured budget applies unchanged",
    )


def state_schema() -> dict[str, Any]:
    return EngineState.model_json_schema()


def write_atomic(path: str, text: str) -> None:
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".state-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)  # atomic on POSIX: readers see the old or the new file, never half
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def append_jsonl(path: str, rows: list[dict[str, Any]]) -> None:
    """Append `rows` to a JSON-lines file (one compact object per line)."""
    with open(path, "a", encoding="utf-8") as f:
        f.writelines(json.dumps(r, separators=(",", ":")) + "\n" for r in rows)


def read_state(runtime_dir: str) -> EngineState | None:
    try:
        with open(os.path.join(runtime_dir, STATE_FILE), encoding="utf-8") as f:
            return EngineState.model_validate_json(f.read())
    except (OSError, ValueError):
        return None


class StatePublisher:
    """Writes the latest state, and appends the finished requests' history rows, off the scheduling
    thread: on `publish` and every `interval_s`. Both writes are file I/O the engine's step loop would
    otherwise wait for between steps (docs/decisions/engine.md)."""

    def __init__(self, runtime_dir: str, interval_s: float = 1.0, stall_after_s: float = 15.0) -> None:
        os.makedirs(runtime_dir, exist_ok=True)
        self.path = os.path.join(runtime_dir, STATE_FILE)
        self.history_path = os.path.join(runtime_dir, HISTORY_FILE)
        self.interval_s = interval_s
        self.stall_after_s = stall_after_s
        self._state: EngineState | None = None
        self._busy = False
        self._last_step = time.time()
        self._history: list[dict[str, Any]] = []
        self._history_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="jitserve-state", daemon=True)
        self._thread.start()

    def publish(self, state: EngineState, busy: bool, history: list[dict[str, Any]] | None = None) -> None:
        """Called by the scheduler; a reference swap, so the writer thread never sees a torn state.
        `history`: rows to append to history.jsonl, handed over (the caller keeps no reference)."""
        if history:
            with self._history_lock:
                self._history.extend(history)
        self._state = state
        self._busy = busy
        self._last_step = time.time()
        self._wake.set()

    def heartbeat(self, busy: bool) -> None:
        self._busy = busy
        self._last_step = time.time()

    def _run(self) -> None:
        while True:
            self._wake.wait(self.interval_s)
            self._wake.clear()
            self._append_history()
            if self._stop.is_set():
                return  # closing: every row handed over is appended; the state is left to age
            state = self._state
            if state is None:
                continue
            now = time.time()
            if self._busy and now - self._last_step > self.stall_after_s:
                continue  # work pending but no step: let the report go stale
            # A full or vanished disk must not take the engine down; the state just ages.
            with contextlib.suppress(OSError):
                write_atomic(self.path, state.model_copy(update={"updated_at": now}).model_dump_json())

    def _append_history(self) -> None:
        with self._history_lock:
            rows, self._history = self._history, []
        if not rows:
            return
        try:
            append_jsonl(self.history_path, rows)
        except OSError as exc:  # the analyzer's training rows are lost, the engine serves on
            log.warning("jitserve: cannot append %d history row(s): %s", len(rows), exc)

    def close(self) -> None:
        """Stop the writer thread once it has appended every history row handed to it."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=10)


def prometheus_text(state: EngineState | None, now: float) -> bytes:
    """The engine's `jitserve_engine_*` metrics in Prometheus text format (prometheus-client)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    class _Collector:
        def collect(self):  # type: ignore[no-untyped-def]
            if state is None:
                up = GaugeMetricFamily("jitserve_engine_up", "1 when the scheduler reported its state")
                up.add_metric([], 0.0)
                yield up
                return
            s = state
            gauges: list[tuple[str, str, float]] = [
                ("jitserve_engine_up", "1 when the scheduler reported its state", 1.0),
                (
                    "jitserve_engine_state_age_seconds",
                    "seconds since the state was written",
                    now - s.updated_at,
                ),
                ("jitserve_engine_step_time_seconds", "seconds per decoding step (v_token)", s.step_time_s),
                (
                    "jitserve_engine_prefill_tokens_per_second",
                    "measured prompt tokens per second",
                    s.prefill_tokens_per_s,
                ),
                ("jitserve_engine_batch_size_requests", "B: max sequences per batch", s.batch_size),
                ("jitserve_engine_running_requests", "requests running", s.running),
                ("jitserve_engine_waiting_requests", "requests waiting", s.waiting),
                (
                    "jitserve_engine_committed_bandwidth_slots",
                    "sum of t_gen/t_rem over requests",
                    s.committed_bandwidth,
                ),
                (
                    "jitserve_engine_residual_capacity_slots",
                    "batch size minus committed bandwidth",
                    s.residual_capacity,
                ),
                (
                    "jitserve_engine_admission_priority",
                    "priority a new request must reach to be admitted",
                    s.admission_priority,
                ),
                (
                    "jitserve_engine_queue_delay_seconds",
                    "expected wait before a new request starts",
                    s.queue_delay_s,
                ),
                (
                    "jitserve_engine_pending_prefill_tokens",
                    "prompt tokens the batch has yet to compute",
                    s.pending_prefill_tokens,
                ),
                ("jitserve_engine_kv_usage_ratio", "fraction of KV cache blocks in use", s.kv_usage),
                ("jitserve_engine_cutoff_ratio", "GMAX cutoff p", s.cutoff),
            ]
            if s.reserved_waiting is not None and s.yieldable is not None:
                # only a policy that reserves (just-in-time GMAX) reports these; absent, not 0, otherwise
                gauges += [
                    (
                        "jitserve_engine_reserved_waiting_requests",
                        "requests that cannot wait a frame and have no batch slot yet",
                        s.reserved_waiting,
                    ),
                    (
                        "jitserve_engine_yieldable_requests",
                        "requests in the batch that can wait a frame (not reserved, not streams)",
                        s.yieldable,
                    ),
                ]
            if s.step_token_budget is not None:
                gauges.append(
                    (
                        "jitserve_engine_step_token_budget_tokens",
                        "tokens the last step could schedule (the running requests' pace caps prompt work)",
                        s.step_token_budget,
                    )
                )
            for name, doc, value in gauges:
                g = GaugeMetricFamily(name, doc)
                g.add_metric([], float(value))
                yield g
            counters: list[tuple[str, str, float]] = [
                ("jitserve_engine_frames", "scheduling frames planned", s.frames),
                ("jitserve_engine_steps", "engine steps", s.steps),
                ("jitserve_engine_dropped_requests", "requests dropped past waiting_time", s.dropped_total),
                ("jitserve_engine_preempted_requests", "preemptions GMAX decided", s.preempted_total),
                (
                    "jitserve_engine_invalid_slo_requests",
                    "requests with malformed SLO xargs",
                    s.invalid_slo_total,
                ),
                ("jitserve_engine_length_fits", "length-predictor (QRF) fits finished", s.length_fits_total),
                (
                    "jitserve_engine_length_fit_cpu_seconds",
                    "CPU seconds the length-predictor fits took (in their child process)",
                    s.length_fit_cpu_seconds_total,
                ),
            ]
            for name, doc, value in counters:
                c = CounterMetricFamily(name, doc)
                c.add_metric([], float(value))
                yield c
            rate = GaugeMetricFamily(
                "jitserve_engine_goodput_tokens_per_second",
                "token goodput over the recent window",
                labels=["slo_class"],
            )
            att = GaugeMetricFamily(
                "jitserve_engine_slo_attainment_ratio",
                "share of recent requests that met the SLO",
                labels=["slo_class"],
            )
            for cls, g in sorted(s.goodput.items()):
                rate.add_metric([cls], g.goodput_tokens_per_s)
                att.add_metric([cls], g.attainment)
            yield rate
            yield att
            fin = CounterMetricFamily(
                "jitserve_engine_finished_requests", "requests ended, per class", labels=["slo_class"]
            )
            met = CounterMetricFamily(
                "jitserve_engine_met_requests", "requests that met the SLO", labels=["slo_class"]
            )
            tok = CounterMetricFamily(
                "jitserve_engine_goodput_tokens", "token goodput earned", labels=["slo_class"]
            )
            for cls, t in sorted(s.totals.items()):
                fin.add_metric([cls], t.finished)
                met.add_metric([cls], t.met)
                tok.add_metric([cls], t.goodput_tokens)
            yield fin
            yield met
            yield tok

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())  # type: ignore[arg-type]
    return generate_latest(registry)


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()
