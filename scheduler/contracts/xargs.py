"""The per-request keys of `SamplingParams.extra_args` (the OpenAI body field `vllm_xargs`).

This module is the one place that names them: the router writes them (`render_xargs`) and the engine
reads them (`parse_xargs`).

| key               | type          | meaning                                                             |
|-------------------|---------------|---------------------------------------------------------------------|
| `slo_class`       | str           | an SLO class of the pool (classes file); unknown -> default class   |
| `deadline`        | seconds > 0   | end-to-end deadline after arrival (deadline SLO)                    |
| `target_ttft`     | seconds > 0   | time to first token (latency SLO)                                   |
| `target_tbt`      | seconds > 0   | time between tokens (latency SLO, needs `target_ttft`)              |
| `waiting_time`    | seconds > 0   | drop the request if it has not started within this                  |
| `program_id`      | str           | compound program the call belongs to (informational on the engine)  |
| `stages`          | int >= 1      | stages of the program (scales a per-stage compound class deadline)  |
| `stage_deadline`  | seconds > 0   | this stage's sub-deadline D_s = phi(s) * D, relative to arrival     |
| `program_goodput` | float >= 0    | program goodput riding on this call: earlier calls' + later stages' |
| `tenant`          | str           | tenant (API key owner); feeds GMAX's fairness term                  |
| `length_bound`    | int >= 1      | the router analyzer's output-length upper bound (<= max_tokens)     |

Explicit SLO fields override the class (as in `resolve_request_slo`). A malformed value never fails the
request inside the engine (the router validates and answers 400): the engine falls back to the pool's
default class and reports the error in its state (`recent[].error`, `invalid_slo_total`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jitserve.scheduler.slo import SLO, SLOClassSpec, SLOError, SLOType, resolve_request_slo

SLO_CLASS = "slo_class"
DEADLINE = "deadline"
TARGET_TTFT = "target_ttft"
TARGET_TBT = "target_tbt"
WAITING_TIME = "waiting_time"
PROGRAM_ID = "program_id"
STAGES = "stages"
STAGE_DEADLINE = "stage_deadline"
PROGRAM_GOODPUT = "program_goodput"
TENANT = "tenant"
LENGTH_BOUND = "length_bound"

SLO_KEYS: tuple[str, ...] = (SLO_CLASS, DEADLINE, TARGET_TTFT, TARGET_TBT, WAITING_TIME)
XARGS_KEYS: tuple[str, ...] = (
    *SLO_KEYS,
    PROGRAM_ID,
    STAGES,
    STAGE_DEADLINE,
    PROGRAM_GOODPUT,
    TENANT,
    LENGTH_BOUND,
)

CUSTOM_CLASS = "custom"  # resolve_request_slo's name for explicit fields without a class
MIN_SECONDS = 0.001
BEST_EFFORT_WAITING_TIME = 86_400.0  # the SLO model's largest time (scheduler/slo.py: PositiveSeconds)


@dataclass(frozen=True, slots=True)
class RequestSLO:
    """What the engine schedules a request by, resolved from its xargs at arrival."""

    slo_class: str
    slo: SLO
    deadline_abs: float | None = None  # compound stage: absolute sub-deadline; None -> slo.deadline
    program_deadline_abs: float | None = None  # compound stage: the program's deadline (absolute)
    program_id: str | None = None
    program_goodput: float = 0.0
    tenant: str = ""
    length_bound: int | None = None
    error: str | None = None  # why the xargs were ignored (fell back to the default class)


def _number(key: str, value: Any, minimum: float, integer: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise SLOError(key, f"must be a number, got {type(value).__name__}")
    try:
        number = float(value)
    except ValueError:
        raise SLOError(key, f"must be a number, got {value!r}") from None
    if not (number >= minimum) or number == float("inf"):
        raise SLOError(key, f"must be a finite number >= {minimum:g}, got {value!r}")
    if integer and number != int(number):
        raise SLOError(key, f"must be an integer, got {value!r}")
    return number


def parse_xargs(
    xargs: Mapping[str, Any] | None,
    classes: dict[str, SLOClassSpec],
    default_class: str | None,
    arrival: float,
) -> RequestSLO:
    """xargs -> RequestSLO; never raises (a bad value falls back to the default class, with `error`)."""
    xargs = xargs or {}
    try:
        stages = int(_number(STAGES, xargs[STAGES], 1, integer=True)) if STAGES in xargs else 1
        name, slo = resolve_request_slo(
            {k: xargs[k] for k in SLO_KEYS if k in xargs}, classes, default_class, stages=stages
        )
        deadline_abs = program_deadline_abs = None
        if xargs.get(STAGE_DEADLINE) is not None:
            deadline_abs = arrival + _number(STAGE_DEADLINE, xargs[STAGE_DEADLINE], 1e-9)
            # a stage's `deadline` is its program's remaining budget (render_xargs' deadline_rel)
            if slo.deadline is not None:
                program_deadline_abs = arrival + slo.deadline
        program_goodput = 0.0
        if xargs.get(PROGRAM_GOODPUT) is not None:
            program_goodput = _number(PROGRAM_GOODPUT, xargs[PROGRAM_GOODPUT], 0.0)
        length_bound = None
        if xargs.get(LENGTH_BOUND) is not None:
            length_bound = int(_number(LENGTH_BOUND, xargs[LENGTH_BOUND], 1, integer=True))
    except SLOError as exc:
        name, slo = resolve_request_slo({}, classes, default_class)
        return RequestSLO(name, slo, tenant=str(xargs.get(TENANT) or ""), error=str(exc))
    program_id = xargs.get(PROGRAM_ID)
    return RequestSLO(
        slo_class=name,
        slo=slo,
        deadline_abs=deadline_abs,
        program_deadline_abs=program_deadline_abs,
        program_id=None if program_id is None else str(program_id),
        program_goodput=program_goodput,
        tenant=str(xargs.get(TENANT) or ""),
        length_bound=length_bound,
    )


def render_xargs(
    slo_class: str,
    slo: SLO,
    tenant: str,
    send_class: bool = True,
    deadline_rel: float | None = None,
    stage_deadline_rel: float | None = None,
    program_id: str | None = None,
    program_goodput: float = 0.0,
    length_bound: int | None = None,
) -> dict[str, Any]:
    """The router's side: a resolved SLO -> xargs with explicit numbers, so a router and an engine that
    briefly disagree about a class (a ConfigMap edit propagating) still agree about this request."""
    # Best-effort is never dropped for waiting (docs/decisions/router.md): it gets the longest
    # waiting_time the SLO model allows, so an engine of any version keeps it queued.
    waiting = BEST_EFFORT_WAITING_TIME if slo.type is SLOType.BEST_EFFORT else slo.waiting_time
    x: dict[str, Any] = {WAITING_TIME: waiting, TENANT: tenant}
    if send_class and slo_class != CUSTOM_CLASS:
        x[SLO_CLASS] = slo_class
    if slo.type is SLOType.LATENCY:
        x[TARGET_TTFT] = slo.ttft
        if slo.tbt is not None:
            x[TARGET_TBT] = slo.tbt
    else:
        deadline = slo.deadline if deadline_rel is None else deadline_rel
        x[DEADLINE] = max(float(deadline or 0.0), MIN_SECONDS)
    if program_id is not None:
        x[PROGRAM_ID] = program_id
        x[PROGRAM_GOODPUT] = float(program_goodput)
        if stage_deadline_rel is not None:
            x[STAGE_DEADLINE] = max(stage_deadline_rel, MIN_SECONDS)
    if length_bound is not None:
        x[LENGTH_BOUND] = int(length_bound)
    return x
