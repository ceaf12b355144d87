"""Columnar request state: the typed input of every scheduling decision.

Policies decide over thousands of requests in well under a millisecond, so request state lives in
numpy columns (one row per slot), not in Python objects. Adapters (vLLM, simulator, router) add a
request once, update its progress as tokens arrive, and remove it when it ends; policies only read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from jitserve.scheduler.slo import SLO, SLOType

# Integer codes of SLO types in the `slo_type` column.
SLO_TYPE_CODE: dict[SLOType, int] = {
    SLOType.LATENCY: 0,
    SLOType.DEADLINE: 1,
    SLOType.COMPOUND: 2,
    SLOType.BEST_EFFORT: 3,
}
LATENCY, DEADLINE, COMPOUND, BEST_EFFORT = 0, 1, 2, 3


def has_later_stages(stage_due: Any, program_due: Any) -> Any:
    """Whether a compound stage has stages after it: its program's deadline D (`program_due`, inf without
    one) is later than its own sub-deadline D_s (`stage_due`); the last stage's D_s is D. Scalars or
    arrays. GMAX's reservation, placement and Fair(r)'s count all ask it here."""
    return np.isfinite(program_due) & (program_due > stage_due)


def shortest_reply(
    max_tokens: int, min_tokens: int = 0, ignore_eos: bool = False, stops: bool = False
) -> int:
    """The fewest output tokens a request can end with, as vLLM ends it: `min_tokens` holds off every stop
    (EOS, stop strings, stop token ids); with `ignore_eos` and no stop of its own (`stops`: stop strings or
    stop token ids) only `max_tokens` ends it. In [1, max_tokens]. The router reads it from the request's
    body, the engine from vLLM's sampling parameters; placement's "a shorter reply might make it" never
    goes below it (docs/decisions/core.md, "A reply no shorter than the request allows")."""
    floor = max_tokens if ignore_eos and not stops else min_tokens
    return int(min(max(floor, 1), max_tokens))


# (name, dtype, fill value of a free slot)
_COLUMNS: tuple[tuple[str, Any, Any], ...] = (
    ("active", np.bool_, False),
    ("slo_type", np.int8, 0),
    ("arrival", np.float64, 0.0),
    ("deadline_abs", np.float64, np.inf),  # absolute deadline (compound: this stage's sub-deadline)
    ("program_deadline", np.float64, np.inf),  # compound stages: the program's deadline D (absolute)
    ("ttft", np.float64, np.inf),  # latency only
    ("tbt", np.float64, np.inf),  # latency only; inf when the SLO has no TBT
    ("waiting_deadline", np.float64, np.inf),  # drop if not started by then (`NewRequest.drop_at`)
    ("input_len", np.int64, 0),
    ("generated", np.int64, 0),  # output tokens produced so far
    ("computed", np.int64, 0),  # tokens whose KV is computed (prefill progress, preemption cost)
    ("len_ub", np.int64, 1),  # upper bound on the total output length (analyzer)
    ("max_tokens", np.int64, 1),
    ("min_len", np.int64, 1),  # the shortest reply the request allows (`shortest_reply`)
    ("true_len", np.int64, -1),  # oracle only: the real output length, -1 if unknown
    ("w_in", np.float64, 1.0),
    ("w_out", np.float64, 1.0),
    ("program_goodput", np.float64, 0.0),  # compound: program goodput riding on it (`stage_stake`)
    ("running", np.bool_, False),
    ("started", np.bool_, False),  # scheduled at least once (waiting_time no longer applies)
    ("preempted", np.bool_, False),  # preempted by its policy before (`mark_preempted`)
    ("frames_waited", np.int32, 0),  # frames spent eligible but unselected (starvation term)
    ("tenant", np.int32, 0),
    ("fairness", np.float64, 0.0),  # f of the tenant fairness term (the class's fairnessWeight)
)


@dataclass(frozen=True, slots=True)
class NewRequest:
    """What an adapter knows about a request when it arrives."""

    request_id: str
    slo: SLO
    arrival: float
    input_len: int
    max_tokens: int
    len_ub: int | None = None  # None: max_tokens, the only safe bound before the analyzer answers
    min_len: int = 1  # the shortest reply the request allows (`shortest_reply`): no bound goes below it
    true_len: int = -1
    deadline_abs: float | None = None  # compound stages: the sub-deadline D_s (absolute)
    program_deadline_abs: float | None = None  # compound stages: the program's deadline D (absolute)
    program_goodput: float = 0.0
    tenant: int = 0

    def __post_init__(self) -> None:
        if self.input_len < 0:
            raise ValueError(f"input_len: must be >= 0, got {self.input_len}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens: must be >= 1, got {self.max_tokens}")
        if not 1 <= self.min_len <= self.max_tokens:
            raise ValueError(f"min_len: must be in [1, max_tokens={self.max_tokens}], got {self.min_len}")

    def due(self) -> float:
        """Absolute deadline (compound stages: their sub-deadline); inf without one."""
        if self.deadline_abs is not None:
            return self.deadline_abs
        return self.arrival + self.slo.deadline if self.slo.deadline is not None else float("inf")

    def drop_at(self) -> float:
        """When the request is dropped if it has not started (§5's waiting_time admission control); deadline
        and compound work not before its deadline (`SLO.waits_for_deadline`), a compound stage not before
        its program's: D_s orders the stages, but a stage past it can still finish the program in time,
        and dropping it forfeits the whole program (docs/decisions/core.md, "A stage waits for its
        program's deadline")."""
        wait = self.arrival + self.slo.waiting_time
        if not self.slo.waits_for_deadline:
            return wait
        end = self.program_deadline_abs if self.program_deadline_abs is not None else self.due()
        return max(wait, end)


class RequestTable:
    """Fixed-width columns with a free list; grows by doubling. Not thread-safe by design:
    each adapter owns one table and calls it from its scheduling thread."""

    def __init__(self, capacity: int = 256) -> None:
        self._capacity = 0
        self._free: list[int] = []
        self.slot_of: dict[str, int] = {}
        self.id_of: list[str | None] = []
        for name, dtype, fill in _COLUMNS:
            setattr(self, name, np.full(0, fill, dtype=dtype))
        self._grow(max(1, capacity))

    # columns, declared for type checkers
    active: np.ndarray
    slo_type: np.ndarray
    arrival: np.ndarray
    deadline_abs: np.ndarray
    program_deadline: np.ndarray
    ttft: np.ndarray
    tbt: np.ndarray
    waiting_deadline: np.ndarray
    input_len: np.ndarray
    generated: np.ndarray
    computed: np.ndarray
    len_ub: np.ndarray
    max_tokens: np.ndarray
    min_len: np.ndarray
    true_len: np.ndarray
    w_in: np.ndarray
    w_out: np.ndarray
    program_goodput: np.ndarray
    running: np.ndarray
    started: np.ndarray
    frames_waited: np.ndarray
    tenant: np.ndarray
    fairness: np.ndarray

    def __len__(self) -> int:
        return len(self.slot_of)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self.slot_of

    @property
    def capacity(self) -> int:
        return self._capacity

    def _grow(self, new_capacity: int) -> None:
        old = self._capacity
        for name, dtype, fill in _COLUMNS:
            column = np.full(new_capacity, fill, dtype=dtype)
            column[:old] = getattr(self, name)
            setattr(self, name, column)
        self.id_of.extend([None] * (new_capacity - old))
        # pop() hands out low slots first, keeping active rows dense at the front
        self._free.extend(range(new_capacity - 1, old - 1, -1))
        self._capacity = new_capacity

    def add(self, req: NewRequest) -> int:
        if req.request_id in self.slot_of:
            raise KeyError(f"request_id: {req.request_id!r} is already in the table")
        if not self._free:
            self._grow(self._capacity * 2)
        slot = self._free.pop()
        slo = req.slo
        self.slot_of[req.request_id] = slot
        self.id_of[slot] = req.request_id
        self.active[slot] = True
        self.slo_type[slot] = SLO_TYPE_CODE[slo.type]
        self.arrival[slot] = req.arrival
        self.deadline_abs[slot] = req.due()
        self.program_deadline[slot] = np.inf if req.program_deadline_abs is None else req.program_deadline_abs
        self.ttft[slot] = slo.ttft if slo.ttft is not None else np.inf
        self.tbt[slot] = slo.tbt if slo.tbt is not None else np.inf
        self.waiting_deadline[slot] = req.drop_at()
        self.input_len[slot] = req.input_len
        self.generated[slot] = 0
        self.computed[slot] = 0
        self.max_tokens[slot] = req.max_tokens
        self.min_len[slot] = req.min_len
        ub = req.max_tokens if req.len_ub is None else req.len_ub
        self.len_ub[slot] = int(min(max(ub, req.min_len), req.max_tokens))
        self.true_len[slot] = req.true_len
        self.w_in[slot] = slo.weights.input
        self.w_out[slot] = slo.weights.output
        self.program_goodput[slot] = req.program_goodput
        self.running[slot] = False
        self.started[slot] = False
        self.frames_waited[slot] = 0
        self.tenant[slot] = req.tenant
        self.fairness[slot] = slo.fairness
        return slot

    def remove(self, request_id: str) -> None:
        slot = self.slot_of.pop(request_id)
        self.id_of[slot] = None
        for name, _dtype, fill in _COLUMNS:
            getattr(self, name)[slot] = fill
        self._free.append(slot)

    def slot(self, request_id: str) -> int:
        return self.slot_of[request_id]

    def active_slots(self) -> np.ndarray:
        return np.flatnonzero(self.active)

    def ids(self, slots: np.ndarray) -> list[str]:
        return [self.id_of[int(s)] for s in slots]  # type: ignore[misc]

    def progress(self, request_id: str, generated: int, computed: int | None = None) -> None:
        slot = self.slot_of[request_id]
        self.generated[slot] = generated
        if computed is not None:
            self.computed[slot] = computed
        # a bound below what is already generated is stale: the request is at least one token longer
        if self.len_ub[slot] <= generated:
            self.len_ub[slot] = min(generated + 1, int(self.max_tokens[slot]))

    def set_bounds(self, slots: np.ndarray, bounds: np.ndarray) -> None:
        """New length bounds for `slots` (the analyzer's, as tokens arrive), kept where a bound can be: at
        least one token past what each generated and its shortest reply, at most its max_tokens."""
        floor = np.maximum(self.generated[slots] + 1, self.min_len[slots])
        self.len_ub[slots] = np.minimum(np.maximum(bounds, floor), self.max_tokens[slots])

    def planned_len(self, slots: np.ndarray, oracle: bool = False) -> np.ndarray:
        """The total output length each slot is planned for: its length bound, or with `oracle` its true
        length where known (the oracle ablation); never less than one token past what it generated. The
        one reading of lengths behind GMAX's analysis and the paced step budget."""
        generated = self.generated[slots]
        total = self.len_ub[slots]
        if oracle:
            true = self.true_len[slots]
            total = np.where(true > 0, true, total)
        return np.maximum(total, generated + 1)

    def prefill_left(self, slots: np.ndarray, computed: np.ndarray | None = None) -> np.ndarray:
        """Tokens each slot must still run through prefill: its prompt plus what it generated (a request
        preempted by recompute computes both again), less what is computed (`computed` overrides the
        table's progress, as placement's cache hits do)."""
        done = self.computed[slots] if computed is None else computed
        return np.maximum(self.input_len[slots] + self.generated[slots] - done, 0)

    def token_due(self, slots: np.ndarray) -> np.ndarray:
        """When each stream's next token is due on its timeline, arrival + TTFT + i x TBT for token i (the
        SLO its tokens are scored by, `scheduler.goodput`); a stream without a TBT has only its first token
        due. Meaningful for latency rows only."""
        tbt = self.tbt[slots]
        gap = np.where(np.isfinite(tbt), tbt, 0.0)
        return self.arrival[slots] + self.ttft[slots] + self.generated[slots] * gap

    def mark_preempted(self, slot: int) -> None:
        """The policy's preemption of `slot` was carried out (a recompute engine yields a request once:
        docs/decisions/core.md, "One recompute per request"); the adapter also sets it not running."""
        self.preempted[slot] = True

    def set_running(self, request_id: str, running: bool) -> None:
        slot = self.slot_of[request_id]
        self.running[slot] = running
        if running:
            self.started[slot] = True
            self.frames_waited[slot] = 0
        else:
            self.computed[slot] = 0  # preempted by recompute: its KV is gone
