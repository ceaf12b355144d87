"""The SLO model: what a request (or an SLOClass) promises, validated at the edge.

Four request types, as in JITServe §3:
- latency: streamed tokens, token i (0-based) is on time if done by TTFT + i * TBT after arrival;
- deadline: the whole response by an end-to-end deadline;
- compound: a multi-call program finishing by its deadline (optionally `per_stage` x stages);
- best_effort: no SLO, but a default deadline so GMAX never starves it (§4.2).

Times are seconds. Defaults are the paper's evaluation settings (§6.1): TTFT 2 s, TBT 100 ms,
deadline 20 s, compound 20 s per stage, waiting_time 5 s.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

DEFAULT_TTFT_S = 2.0
DEFAULT_TBT_S = 0.1
DEFAULT_DEADLINE_S = 20.0
DEFAULT_STAGE_DEADLINE_S = 20.0
DEFAULT_WAITING_TIME_S = 5.0
# Our choice (the papers leave it open, docs/decisions.md): best-effort work gets a deadline loose
# enough never to compete with real SLOs, yet finite so the starvation term eventually wins.
DEFAULT_BEST_EFFORT_DEADLINE_S = 300.0

PositiveSeconds = Annotated[float, Field(gt=0, le=86_400)]


class SLOType(StrEnum):
    LATENCY = "latency"
    DEADLINE = "deadline"
    COMPOUND = "compound"
    BEST_EFFORT = "best-effort"


class OverloadAction(StrEnum):
    """What admission does when no pod can still meet the SLO."""

    REJECT = "reject"  # 429 with Retry-After
    DOWNGRADE = "downgrade"  # serve as best-effort


class GoodputWeights(BaseModel):
    """w_i and w_o of the paper's base goodput R = w_i * L_i + w_o * L_o (App. C)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: float = Field(1.0, ge=0, le=1000, description="weight of each prompt token")
    output: float = Field(1.0, ge=0, le=1000, description="weight of each generated token")


class SLO(BaseModel):
    """One request's SLO, fully resolved (absolute numbers, no class lookups left)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: SLOType
    ttft: PositiveSeconds | None = Field(None, description="time to first token target (latency)")
    tbt: PositiveSeconds | None = Field(None, description="time between tokens target (latency)")
    deadline: PositiveSeconds | None = Field(
        None, description="end-to-end deadline after arrival (deadline, compound, best-effort)"
    )
    waiting_time: PositiveSeconds = Field(
        DEFAULT_WAITING_TIME_S, description="drop the request if not scheduled within this"
    )
    weights: GoodputWeights = GoodputWeights()
    fairness: float = Field(
        0.0, ge=0, le=1, description="f of the tenant fairness term: its class's fairnessWeight"
    )

    @model_validator(mode="after")
    def _check_fields_for_type(self) -> SLO:
        t = self.type
        if t is SLOType.LATENCY:
            if self.ttft is None:
                raise ValueError("latency SLO needs ttft (seconds > 0)")
            if self.deadline is not None:
                raise ValueError("deadline is not used by a latency SLO; use type 'deadline'")
        else:
            if self.tbt is not None and self.ttft is None:
                raise ValueError("tbt needs ttft: a token timeline starts at the first token")
            if self.ttft is not None or self.tbt is not None:
                raise ValueError(f"ttft/tbt apply to latency SLOs only, not to type '{t.value}'")
            if self.deadline is None:
                raise ValueError(f"{t.value} SLO needs deadline (seconds > 0)")
        return self

    @property
    def waits_for_deadline(self) -> bool:
        """Deadline and compound work is dropped unstarted only once its deadline has passed (or its
        waiting_time, if later): unstarted it holds no slot, and a compound stage dropped early loses
        its whole program (docs/decisions/core.md, "Deadline work waits for its deadline")."""
        return self.type in (SLOType.DEADLINE, SLOType.COMPOUND) and self.deadline is not None

    @property
    def unstarted_wait(self) -> float:
        """Longest a request may wait unstarted, in seconds after its arrival (`NewRequest.drop_at` is
        the same rule with a compound stage's sub-deadline)."""
        return max(self.waiting_time, self.deadline or 0.0) if self.waits_for_deadline else self.waiting_time

    @property
    def unstarted_limit(self) -> str:
        """Which bound `unstarted_wait` is, as a dropped request's client is told: "deadline" when deadline
        work waits past its waiting_time, else "waiting_time" (the engine's and the router's messages)."""
        return "deadline" if self.unstarted_wait > self.waiting_time else "waiting_time"

    @property
    def effective_tbt(self) -> float:
        """TBT for latency requests; a latency SLO without TBT only constrains the first token."""
        return self.tbt if self.tbt is not None else float("inf")

    @classmethod
    def latency(cls, ttft: float = DEFAULT_TTFT_S, tbt: float | None = DEFAULT_TBT_S, **kw: Any) -> SLO:
        return cls(type=SLOType.LATENCY, ttft=ttft, tbt=tbt, **kw)

    @classmethod
    def deadline_slo(cls, deadline: float = DEFAULT_DEADLINE_S, **kw: Any) -> SLO:
        return cls(type=SLOType.DEADLINE, deadline=deadline, **kw)

    @classmethod
    def compound(cls, stages: int = 1, per_stage: float = DEFAULT_STAGE_DEADLINE_S, **kw: Any) -> SLO:
        return cls(type=SLOType.COMPOUND, deadline=per_stage * stages, **kw)

    @classmethod
    def best_effort(cls, deadline: float = DEFAULT_BEST_EFFORT_DEADLINE_S, **kw: Any) -> SLO:
        return cls(type=SLOType.BEST_EFFORT, deadline=deadline, **kw)


class SLOClassSpec(BaseModel):
    """The spec of an SLOClass custom resource; the CRD schema is generated from this model.

    Field names are camelCase because this is a Kubernetes API; `to_slo` turns it into an `SLO`.
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    type: SLOType = Field(description="latency, deadline, compound or best-effort")
    ttftSeconds: PositiveSeconds | None = Field(None, description="latency: time to first token target")
    tbtSeconds: PositiveSeconds | None = Field(None, description="latency: time between tokens target")
    deadlineSeconds: PositiveSeconds | None = Field(
        None, description="deadline and best-effort: end-to-end deadline; compound: whole program"
    )
    perStage: bool = Field(
        False, description="compound only: deadlineSeconds is per stage, scaled by the program's stages"
    )
    waitingTimeSeconds: PositiveSeconds = Field(
        DEFAULT_WAITING_TIME_S, description="drop the request if not scheduled within this"
    )
    goodputWeights: GoodputWeights = Field(GoodputWeights(), description="w_i, w_o of token goodput")
    lengthQuantile: float = Field(
        0.9, gt=0.5, lt=1.0, description="quantile of the output-length upper bound (QRF)"
    )
    overload: OverloadAction = Field(
        OverloadAction.REJECT, description="when no pod can meet the SLO: reject (429) or downgrade"
    )
    fairnessWeight: float = Field(
        0.0,
        ge=0,
        le=1,
        description="f in (1-f)*priority + f*Fair(r), Fair(r) = 1 - the tenant's SLO attainment on the "
        "engine over the last minute: how far this class's requests favour tenants it has been failing",
    )
    default: bool = Field(False, description="requests without an SLO get this class")

    @model_validator(mode="after")
    def _check(self) -> SLOClassSpec:
        if self.perStage and self.type is not SLOType.COMPOUND:
            raise ValueError("perStage applies to compound classes only")
        # Reuse the request-level rules so a class can never resolve to an invalid SLO.
        self.to_slo(stages=1)
        return self

    def to_slo(self, stages: int = 1, overrides: dict[str, float] | None = None) -> SLO:
        """Resolve this class (plus per-request overrides) into a concrete SLO."""
        deadline = self.deadlineSeconds
        if self.type is SLOType.BEST_EFFORT and deadline is None:
            deadline = DEFAULT_BEST_EFFORT_DEADLINE_S
        if self.type is SLOType.COMPOUND and deadline is not None and self.perStage:
            deadline = deadline * max(1, stages)
        fields: dict[str, Any] = {
            "type": self.type,
            "ttft": self.ttftSeconds,
            "tbt": self.tbtSeconds,
            "deadline": deadline,
            "waiting_time": self.waitingTimeSeconds,
            "weights": self.goodputWeights,
            "fairness": self.fairnessWeight,
        }
        fields.update({k: v for k, v in (overrides or {}).items() if v is not None})
        return SLO(**fields)


# The paper's evaluation classes; the chart ships them as optional default SLOClasses.
PAPER_CLASSES: dict[str, SLOClassSpec] = {
    "latency": SLOClassSpec(type=SLOType.LATENCY, ttftSeconds=DEFAULT_TTFT_S, tbtSeconds=DEFAULT_TBT_S),
    "deadline": SLOClassSpec(type=SLOType.DEADLINE, deadlineSeconds=DEFAULT_DEADLINE_S),
    "compound": SLOClassSpec(type=SLOType.COMPOUND, deadlineSeconds=DEFAULT_STAGE_DEADLINE_S, perStage=True),
    "best-effort": SLOClassSpec(
        type=SLOType.BEST_EFFORT, deadlineSeconds=DEFAULT_BEST_EFFORT_DEADLINE_S, default=True
    ),
}

# Request-level SLO fields of the paper's API (§5), as the router and engine accept them.
REQUEST_SLO_FIELDS: tuple[str, ...] = ("deadline", "target_ttft", "target_tbt", "waiting_time")


class SLOError(ValueError):
    """A request's SLO is malformed; the message names the field and the rule."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def _seconds(field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise SLOError(field, f"must be a number of seconds, got {type(value).__name__}")
    try:
        seconds = float(value)
    except ValueError:
        raise SLOError(field, f"must be a number of seconds, got {value!r}") from None
    if not seconds > 0 or seconds == float("inf"):
        raise SLOError(field, f"must be a positive finite number of seconds, got {value!r}")
    return seconds


def resolve_request_slo(
    fields: dict[str, Any],
    classes: dict[str, SLOClassSpec],
    default_class: str | None,
    stages: int = 1,
) -> tuple[str, SLO]:
    """Turn a request's SLO fields into (class name, SLO).

    `fields` may hold `slo_class` and the paper's explicit fields (`deadline`, `target_ttft`,
    `target_tbt`, `waiting_time`). Explicit fields override the class; with only explicit fields the
    type follows from them (ttft -> latency, deadline -> deadline). Raises SLOError naming the field.
    """
    name = fields.get("slo_class")
    explicit = {k: _seconds(k, fields[k]) for k in REQUEST_SLO_FIELDS if fields.get(k) is not None}
    if name is not None:
        if not isinstance(name, str) or name not in classes:
            known = ", ".join(sorted(classes)) or "none"
            raise SLOError("slo_class", f"unknown SLO class {name!r} (known: {known})")
        spec = classes[name]
    elif explicit.keys() - {"waiting_time"}:
        name = "custom"
        if "target_tbt" in explicit and "target_ttft" not in explicit:
            raise SLOError("target_tbt", "needs target_ttft: a token timeline starts at the first token")
        if "deadline" in explicit and "target_ttft" in explicit:
            raise SLOError("deadline", "give either deadline or target_ttft/target_tbt, not both")
        slo_type = SLOType.LATENCY if "target_ttft" in explicit else SLOType.DEADLINE
        spec = SLOClassSpec(
            type=slo_type,
            ttftSeconds=explicit.get("target_ttft"),
            tbtSeconds=explicit.get("target_tbt"),
            deadlineSeconds=explicit.get("deadline"),
        )
    else:
        if default_class is None or default_class not in classes:
            spec, name = PAPER_CLASSES["best-effort"], "best-effort"
        else:
            spec, name = classes[default_class], default_class
    overrides = {
        "ttft": explicit.get("target_ttft"),
        "tbt": explicit.get("target_tbt"),
        "deadline": explicit.get("deadline"),
        "waiting_time": explicit.get("waiting_time"),
    }
    try:
        return name, spec.to_slo(stages=stages, overrides=overrides)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise SLOError(".".join(map(str, err["loc"])) or "slo", err["msg"]) from None
