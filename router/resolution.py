"""Which SLO a request gets: the model check, the SLO resolution (cached per class table), and a
compound program's stage plan."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from jitserve.router.classes import ClassRegistry
from jitserve.router.errors import RouterError, bad_request
from jitserve.router.inbound import Inbound
from jitserve.router.programs import ProgramTracker, StageDeadline
from jitserve.scheduler.slo import SLO, OverloadAction, SLOError, SLOType, resolve_request_slo

Resolved = tuple[str, SLO, OverloadAction, float | None]  # class name, SLO, overload action, per-stage D

# The SLO model's field names -> the request field a client sent (400s name what the client wrote)
_SLO_PARAM = {
    "ttft": "target_ttft",
    "ttftSeconds": "target_ttft",
    "tbt": "target_tbt",
    "tbtSeconds": "target_tbt",
    "deadlineSeconds": "deadline",
    "waitingTimeSeconds": "waiting_time",
}
MAX_CACHED = 4096  # program_stages comes from clients: the cache stays bounded


def check_model(model: str, known: frozenset[str] | set[str]) -> None:
    """A 404 for a model no replica serves (no check while nothing is known yet)."""
    if known and model not in known:
        raise RouterError(
            404,
            f"model {model!r} is not served here (available: {', '.join(sorted(known))})",
            "invalid_request_error",
            "model",
            "model_not_found",
        )


class Resolver:
    def __init__(self, classes: ClassRegistry) -> None:
        self.classes = classes
        # SLO resolution of requests that name at most a class, per class table (SLOs are immutable)
        self.cache: dict[tuple[str | None, int | None], Resolved] = {}
        self._table: Any = None

    def resolve(self, inbound: Inbound) -> Resolved:
        table = self.classes.table
        fields = dict(inbound.slo_fields)
        if inbound.program_id is not None and not fields.keys() - {"waiting_time"}:
            # A program id without an SLO: the pool's compound class, so the program gets one deadline.
            compound = sorted(n for n, s in table.classes.items() if s.type is SLOType.COMPOUND)
            if compound:
                fields["slo_class"] = "compound" if "compound" in compound else compound[0]
        key = None
        if fields.keys() <= {"slo_class"} and isinstance(fields.get("slo_class", ""), str):
            # Only a class name (or nothing): the answer depends on the class table alone.
            if table is not self._table:
                self.cache.clear()
                self._table = table
            key = (fields.get("slo_class"), inbound.program_stages)
            found = self.cache.get(key)
            if found is not None:
                return found
        result = resolve_fields(fields, table, inbound.program_stages)
        if key is not None and len(self.cache) < MAX_CACHED:
            self.cache[key] = result
        return result


def resolve_fields(fields: dict[str, Any], table: Any, program_stages: int | None) -> Resolved:
    try:
        name, slo = resolve_request_slo(fields, table.classes, table.default, program_stages or 1)
    except SLOError as exc:
        code = "unknown_slo_class" if exc.field == "slo_class" else "invalid_slo"
        raise bad_request(str(exc), param=_SLO_PARAM.get(exc.field, exc.field), code=code) from None
    except ValidationError as exc:  # a bound the SLO model checks and inbound.py did not: still a 400
        err = exc.errors()[0] if exc.errors() else {"loc": (), "msg": str(exc)}
        loc = ".".join(map(str, err.get("loc", ()))) or "slo"
        param = _SLO_PARAM.get(loc, loc)
        raise bad_request(f"{param}: {err.get('msg')}", param=param, code="invalid_slo") from None
    spec = table.classes.get(name)
    overload = spec.overload if spec is not None else OverloadAction.REJECT
    per_stage = None
    if spec is not None and spec.perStage and program_stages is None and "deadline" not in fields:
        per_stage = spec.deadlineSeconds
    return name, slo, overload, per_stage


def stage_plan(
    programs: ProgramTracker,
    inbound: Inbound,
    slo_class: str,
    slo: SLO,
    now: float,
    per_stage: float | None,
    slot_wait: Callable[[str], float] = lambda model: 0.0,
) -> StageDeadline | None:
    """A compound program's next stage (sub-deadline, program goodput so far), or None. `slot_wait(model)`:
    how long a stage of that model waits for a slot once at stake (asked only for a compound stage)."""
    if inbound.program_id is None or slo.type is not SLOType.COMPOUND:
        return None
    return programs.begin_stage(
        inbound.program_id,
        slo_class,
        slo,
        now,
        inbound.program_stages,
        per_stage,
        model=inbound.model,
        input_len=inbound.input_len,
        slot_wait_s=slot_wait(inbound.model),
    )
