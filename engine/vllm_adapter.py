"""The JITServe scheduler inside vLLM's V1 engine.

Loaded with `--scheduler-cls jitserve.engine.vllm_adapter.JITServeScheduler`.

A subclass of `AsyncScheduler` (subclassing the sync `Scheduler` would turn off async overlap) that
overrides hooks only; vLLM's own `schedule()` still builds every batch. Around it:

- `add_request`: resolve the SLO from `SamplingParams.extra_args` (`vllm_xargs`, keys in
  `jitserve.scheduler.contracts.xargs`) and add the request to the runner's table;
- `schedule` (wrapper): every step drop waiting requests past their waiting_time; at frame boundaries
  (and lightly when the queue changed) sync the table, run the policy and carry out its `FramePlan`:
  preempt exactly `plan.preempt` (vLLM V1 preempts by recompute), reorder the waiting queue (and the
  running list, which decides vLLM's own victim under KV pressure) by `plan.order`; with just-in-time
  GMAX, every step, hold the token budget to the running pace, put decodes and then started streams'
  prompts first in the running list, and cap prompt chunks while a stream waits
  (`scheduler.budget`); then call vLLM's `schedule()`, which admits from the head of the waiting queue
  into free slots;
- `update_from_output` (wrapper): measure step time and prefill rate, timestamp tokens, account
  goodput of finished requests, and emit the outputs of dropped requests so their clients get an
  answer: `finish_reason="abort"` and `stop_reason="jitserve: waiting_time 5s exceeded"`;
- `finish_requests`: client aborts leave the table.

Requires `--scheduling-policy fcfs` (the default): the adapter orders the FCFS deque itself.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections import defaultdict, deque
from typing import Any

import numpy as np
import vllm
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason
from vllm.v1.request import Request, RequestStatus

from jitserve.engine.logs import log_like_vllm
from jitserve.engine.runner import FrameRunner
from jitserve.engine.settings import SchedulerSettings
from jitserve.engine.state import StatePublisher
from jitserve.engine.version import check_vllm_version
from jitserve.scheduler.budget import prompt_chunk_cap, prompt_order
from jitserve.scheduler.gmax import FramePlan
from jitserve.scheduler.requests import shortest_reply
from jitserve.scheduler.slo import SLO

log = logging.getLogger("jitserve.engine")

# Busy engines publish their state at most this often: building it is about 0.1 ms of the step loop;
# serializing and writing it, and the history rows handed with it, are the writer thread's.
PUBLISH_EVERY_S = 0.25
# Engine steps further apart than this are not one busy stretch (the engine idled in between).
_MAX_STEP_GAP_S = 5.0


def drop_message(slo: SLO | None) -> str:
    """The `stop_reason` a dropped request's client reads: what it waited for unstarted (`drop_at`)."""
    if slo is None:
        return "jitserve: dropped unstarted"
    if slo.unstarted_limit == "deadline":
        return f"jitserve: not started by its deadline ({slo.unstarted_wait:g}s)"
    return f"jitserve: waiting_time {slo.waiting_time:g}s exceeded"


def _shortest_reply(sp: Any, max_tokens: int) -> int:
    """The fewest tokens vLLM can end this request with, from its sampling parameters (None: one)."""
    if sp is None:
        return 1
    return shortest_reply(max_tokens, sp.min_tokens, sp.ignore_eos, bool(sp.stop or sp.stop_token_ids))


def kept_block(cache_config: Any) -> int:
    """The block size in which vLLM's prefix cache keeps a preempted request's KV (0: caching off):
    a recompute re-prefills only what is past its last full block."""
    return int(cache_config.block_size) if cache_config.enable_prefix_caching else 0


class JITServeScheduler(AsyncScheduler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        check_vllm_version(vllm.__version__)
        log_like_vllm()  # the engine core's own process: vLLM configured only its own logger
        super().__init__(*args, **kwargs)
        if self.policy != SchedulingPolicy.FCFS:
            raise ValueError(
                "JITServeScheduler orders the queue itself: start vLLM with --scheduling-policy fcfs "
                f"(got {self.policy.value!r}); choose the JITServe policy with JITSERVE_POLICY instead"
            )
        model = str(getattr(self.vllm_config.model_config, "served_model_name", None) or "model")
        settings = SchedulerSettings.from_env(os.environ)  # set by `jitserve engine` (engine/settings.py)
        self.jit = FrameRunner(
            settings, self.max_num_running_reqs, model, prefix_block_tokens=kept_block(self.cache_config)
        )
        runtime_dir = self.jit.runtime_dir
        self.jit_publisher = StatePublisher(runtime_dir) if runtime_dir else None
        self._jit_pending: dict[int, list[EngineCoreOutput]] = defaultdict(list)
        self._jit_last_update: float | None = None
        # The configured max_num_batched_tokens caps every step; the policy may hold a step below it. Only
        # with chunked prefill: without, vLLM never schedules a prompt longer than the budget.
        self._jit_ceiling = int(self.max_num_scheduled_tokens)
        self._jit_paces_steps = bool(self.scheduler_config.enable_chunked_prefill)
        # the step's prompts in `prompt_order`, capped while streams wait (`prompt_chunk_cap`); a
        # long_prefill_token_threshold the operator configured stays the most a chunk may take
        self._jit_orders_prompts = self._jit_paces_steps and bool(
            getattr(self.jit.policy, "orders_prompts", False)
        )
        self._jit_configured_chunk = int(self.scheduler_config.long_prefill_token_threshold or 0)
        self._jit_rank: dict[str, int] = {}  # the last plan's order
        self._jit_last_publish = 0.0
        self._jit_publish(time.time(), force=True)  # the router sees an idle engine before any request
        log.info(
            "JITServe scheduler: policy=%s frame_steps=%d batch=%d runtime_dir=%s",
            self.jit.policy.name,
            self.jit.frame_steps,
            self.max_num_running_reqs,
            runtime_dir,
        )

    # ---------------------------------------------------------------------------------- arrivals
    def add_request(self, request: Request) -> None:
        new = request.request_id not in self.requests
        super().add_request(request)
        if new and request.request_id not in self.jit:  # streaming-input updates are not arrivals
            sp = request.sampling_params
            self.jit.admit(
                request.request_id,
                sp.extra_args if sp is not None else None,
                arrival=request.arrival_time,
                input_len=request.num_prompt_tokens,
                max_tokens=request.max_tokens,
                min_len=_shortest_reply(sp, request.max_tokens),
            )

    def finish_requests(self, request_ids: Any, finished_status: RequestStatus) -> list[Request]:
        finished = super().finish_requests(request_ids, finished_status)
        now = time.time()
        for request in finished:
            self.jit.end(request.request_id, now, "aborted")
        return finished

    # ---------------------------------------------------------------------------------- schedule
    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        now = time.time()
        self._jit_drop_expired(now)
        kind = self.jit.step_kind()
        if kind is not None:
            self._jit_sync()
            self._jit_apply(self.jit.plan(kind))
        self._jit_publish(now)  # throttled (PUBLISH_EVERY_S): about every frame, and while frames are long
        if self._jit_paces_steps:
            # vLLM spends this budget on the running requests' next tokens, then on prompt chunks: held to
            # the tightest running pace, a step's prompt work cannot make those tokens late
            self.max_num_scheduled_tokens = self.jit.token_budget(self._jit_ceiling)
        if self._jit_orders_prompts:
            self._jit_compose_step()
        output = super().schedule(*args, **kwargs)
        for request in self.running:  # admitted now or before: waiting_time no longer applies
            self.jit.started(request.request_id)
        return output

    def _jit_sync(self) -> None:
        self.jit.sync(
            (rid, r.status == RequestStatus.RUNNING, r.num_output_tokens, r.num_computed_tokens)
            for rid, r in self.requests.items()
        )

    def _jit_apply(self, plan: FramePlan) -> None:
        """Carry out a plan: its preemptions (the runner keeps mid-frame ones only for policies that
        make them), its drops, then its queue order."""
        ids = self.jit.table.ids
        if plan.preempt.size:
            victims = [self.requests[r] for r in ids(plan.preempt) if r in self.requests]
            victims = [r for r in victims if r.status == RequestStatus.RUNNING]
            if victims:
                gone = set(victims)
                self.running = [r for r in self.running if r not in gone]
                stamp = time.monotonic()  # vLLM stamps scheduler events with the monotonic clock
                for request in victims:
                    self._preempt_request(request, stamp)
                    self.jit.preempted(request.request_id)
        if plan.drop.size:
            self._jit_drop(ids(plan.drop), time.time())
        rank = {rid: i for i, rid in enumerate(ids(plan.order))}
        self._jit_rank = rank
        last = len(rank)
        if isinstance(self.waiting, deque) and len(self.waiting) > 1:
            ordered = sorted(self.waiting, key=lambda r: rank.get(r.request_id, last))
            self.waiting.clear()
            self.waiting.extend(ordered)
        if len(self.running) > 1 and not self._jit_orders_prompts:  # else every step orders it
            # vLLM's KV-pressure preemption takes running[-1]: make that the plan's least valuable.
            self.running.sort(key=lambda r: rank.get(r.request_id, last))

    def _jit_compose_step(self) -> None:
        """vLLM spends a step's budget down the running list, then on the waiting queue: put the decodes
        first (in the plan's order, so running[-1], vLLM's victim under KV pressure, is the plan's least
        valuable when no prompt runs), then the started prompts in `prompt_order`; and while streams wait
        unstarted, cap every prompt's chunk by `prompt_chunk_cap` so started prompts leave them room."""
        running = self.running
        last = len(self._jit_rank)
        rank = np.array([self._jit_rank.get(r.request_id, last) for r in running], dtype=np.float64)
        prompting = np.array([r.is_prefill_chunk for r in running], dtype=bool)
        if len(running) > 1:
            decodes = np.flatnonzero(~prompting)
            decodes = decodes[np.argsort(rank[decodes], kind="stable")]
            prompts = np.flatnonzero(prompting)
            if prompts.size > 1:  # the class lookup only where an order among prompts is to be made
                streams = np.array([self.jit.is_stream(running[i].request_id) for i in prompts], dtype=bool)
                prompts = prompts[prompt_order(np.ones(prompts.size, bool), streams, rank[prompts])]
            self.running = [running[i] for i in np.concatenate([decodes, prompts])]
        cap = None
        free = self.max_num_running_reqs - len(running)
        if prompting.any() and free > 0:
            waiting = [
                r.num_prompt_tokens - r.num_computed_tokens
                for r in itertools.islice(self.waiting, free)  # the requests vLLM would admit now
                if r.num_computed_tokens == 0 and self.jit.is_stream(r.request_id)
            ]
            decoding = len(running) - int(prompting.sum())
            cap = prompt_chunk_cap(self.max_num_scheduled_tokens - decoding, np.array(waiting, np.int64))
        configured = self._jit_configured_chunk
        if cap is None:
            cap = configured
        elif configured:
            cap = min(cap, configured)
        self.scheduler_config.long_prefill_token_threshold = cap

    def _jit_drop_expired(self, now: float) -> None:
        if self.waiting:
            expired = self.jit.expired_ids(now)
            if expired:
                self._jit_drop(expired, now)

    def _jit_drop(self, request_ids: list[str], now: float) -> None:
        """Finish never-started requests with a reason their clients can read."""
        waiting = [
            self.requests[r]
            for r in request_ids
            if r in self.requests
            and self.requests[r].status == RequestStatus.WAITING
            and self.requests[r].num_computed_tokens == 0
        ]
        if not waiting:
            return
        reasons = {}
        for request in waiting:
            meta = self.jit.meta.get(request.request_id)
            reasons[request.request_id] = drop_message(meta.info.slo if meta else None)
            self.jit.end(request.request_id, now, "dropped")
        for request in super().finish_requests(
            [r.request_id for r in waiting], RequestStatus.FINISHED_ABORTED
        ):
            self._jit_pending[request.client_index].append(
                EngineCoreOutput(
                    request_id=request.request_id,
                    new_token_ids=[],
                    finish_reason=FinishReason.ABORT,
                    stop_reason=reasons[request.request_id],
                    events=request.take_events(),
                    trace_headers=request.trace_headers,
                )
            )
        log.info("jitserve: dropped %d request(s) not started in time", len(waiting))

    def has_requests(self) -> bool:
        # Drop outputs not yet emitted keep the engine stepping until update_from_output sends them.
        return bool(self._jit_pending) or super().has_requests()

    # ---------------------------------------------------------------------------------- outputs
    def update_from_output(
        self, scheduler_output: Any, model_runner_output: Any
    ) -> dict[int, EngineCoreOutputs]:
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        now = time.time()
        self._jit_measure(scheduler_output, now)
        for eco in outputs.values():
            for out in eco.outputs:
                self.jit.tokens(out.request_id, len(out.new_token_ids), now)
                if out.finish_reason is not None:
                    self.jit.end(out.request_id, now, "finished")
        if self._jit_pending:
            for client, extra in self._jit_pending.items():
                if client in outputs:
                    outputs[client].outputs.extend(extra)
                else:
                    outputs[client] = EngineCoreOutputs(outputs=extra)
            self._jit_pending = defaultdict(list)
        if not self.has_unfinished_requests():
            self._jit_publish(now, force=True)  # idle: report the empty queue at once
        elif self.jit_publisher is not None:
            self.jit_publisher.heartbeat(busy=True)
        return outputs

    def _jit_measure(self, scheduler_output: Any, now: float) -> None:
        """One step's wall time (between consecutive busy steps) -> SpeedMeter."""
        last, self._jit_last_update = self._jit_last_update, now
        scheduled = scheduler_output.num_scheduled_tokens
        if last is None or not scheduled or now - last > _MAX_STEP_GAP_S:
            return
        decode = sum(1 for n in scheduled.values() if n == 1)
        prefill = sum(n for n in scheduled.values() if n > 1)
        self.jit.meter.observe(now - last, decode, prefill)
        if not self.has_unfinished_requests():
            self._jit_last_update = None  # the next step starts a new busy stretch

    def _jit_publish(self, now: float, force: bool = False) -> None:
        if self.jit_publisher is None or (not force and now - self._jit_last_publish < PUBLISH_EVERY_S):
            return
        self._jit_last_publish = now
        running, waiting = self.get_request_counts()
        state = self.jit.state(now, running, waiting, self.get_kv_cache_usage(), vllm.__version__)
        # the history rows go with it: the writer thread appends them, so no file I/O in the step loop
        self.jit_publisher.publish(state, busy=running + waiting > 0, history=self.jit.take_history())

    def shutdown(self) -> None:
        try:
            if self.jit_publisher is not None:
                self.jit_publisher.close()  # appends the rows already handed over, then the runner the rest
            self.jit.close()
        finally:
            super().shutdown()
