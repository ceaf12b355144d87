"""The operator's decision core, pure: from a ServingPool and the SLOClasses it names to a plan
(children to apply, or why nothing may be deployed), and from observed children to the pool's status.

No API calls and no clock here (`now` is an argument), so every branch is unit-tested directly.
"""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from jitserve.operator import api
from jitserve.operator.children import Images, Pool
from jitserve.operator.events import NORMAL, WARNING, Event
from jitserve.operator.models import ServingPoolSpec
from jitserve.operator.validation import DNS1035_LABEL
from jitserve.scheduler.contracts.router_metrics import CLASS_ATTAINMENT, CLASS_GOODPUT, CLASS_LABEL
from jitserve.scheduler.slo import SLOClassSpec

READY, PROGRESSING, DEGRADED = "Ready", "Progressing", "Degraded"
# The status fields a good plan fills in (kept from the last good plan while the pool is broken).
PLAN_STATUS_KEYS = (
    "replicas",
    "updatedReplicas",
    "readyReplicas",
    "routerReadyReplicas",
    "endpoint",
    "defaultClass",
    "selector",
)


@dataclass(frozen=True)
class Problem:
    """Why a pool cannot be (fully) deployed; becomes the Degraded condition."""

    reason: str
    message: str


@dataclass(frozen=True)
class Failure:
    """A write the API server refused (or an object in the way); becomes the Degraded condition.

    `reason` is the API's Status reason (Forbidden, Invalid, NotFound, ...) or ApplyFailed (a child's
    name taken by an object the pool does not own); `transient` failures are retried soon."""

    reason: str
    message: str
    transient: bool = False


PROGRESS_DEADLINE_EXCEEDED = "ProgressDeadlineExceeded"


@dataclass(frozen=True)
class Plan:
    pool: Pool | None  # None: deploy nothing (see problem)
    problem: Problem | None = None
    allowed: tuple[str, ...] = ()


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    return f"{where}: {err['msg']}" if where else err["msg"]


def choose_default_class(spec: ServingPoolSpec, classes: Mapping[str, SLOClassSpec]) -> str:
    """The pool's explicit default; else an allowed class marked `default: true`; else the first allowed."""
    if spec.sloClasses.default:
        return spec.sloClasses.default
    marked = sorted(name for name in spec.sloClasses.allowed if classes[name].default)
    return marked[0] if marked else spec.sloClasses.allowed[0]


def plan_pool(
    name: str,
    namespace: str,
    uid: str,
    raw_spec: Mapping[str, Any],
    class_specs: Mapping[str, Mapping[str, Any] | None],
    images: Images,
) -> Plan:
    """Decide what to deploy. `class_specs` maps each referenced class to its SLOClass spec or None."""
    if len(name) > api.MAX_POOL_NAME or not re.fullmatch(DNS1035_LABEL, name):
        # The CRD refuses such names; an object stored before that rule existed still gets here.
        return Plan(None, Problem("InvalidSpec", f"the name {name!r} is not a DNS-1035 label of at most "
                                  f"{api.MAX_POOL_NAME} characters"))  # fmt: skip
    try:
        spec = ServingPoolSpec.model_validate(dict(raw_spec))
    except ValidationError as exc:
        return Plan(None, Problem("InvalidSpec", f"spec is invalid: {_first_error(exc)}"))
    allowed = tuple(spec.sloClasses.allowed)
    missing = [c for c in allowed if class_specs.get(c) is None]
    if missing:
        names = ", ".join(missing)
        noun = "SLOClass" if len(missing) == 1 else "SLOClasses"
        return Plan(
            None,
            Problem("SLOClassNotFound", f"{noun} {names} not found; create it or remove it from sloClasses"),
            allowed,
        )
    classes: dict[str, SLOClassSpec] = {}
    for cname in allowed:
        try:
            classes[cname] = SLOClassSpec.model_validate(dict(class_specs[cname] or {}))
        except ValidationError as exc:
            return Plan(
                None, Problem("InvalidSLOClass", f"SLOClass {cname} is invalid: {_first_error(exc)}"), allowed
            )
    default = choose_default_class(spec, classes)
    pool = Pool(name, namespace, uid, spec, classes, default, images)
    return Plan(pool, None, allowed)


@dataclass(frozen=True)
class Observed:
    """What the children report (Deployment statuses); None where the Deployment does not exist."""

    engine: Mapping[str, Any] | None = None
    router: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Counts:
    """A Deployment's replicas as its controller reports them; `seen`: it has seen the latest spec."""

    replicas: int = 0
    updated: int = 0
    ready: int = 0
    seen: bool = False
    exceeded: str | None = None  # the message of its ProgressDeadlineExceeded condition, if any
    reports_progress: bool = False  # it has a Progressing condition (a Deployment controller runs)


def _deployment_counts(dep: Mapping[str, Any] | None) -> Counts:
    if dep is None:
        return Counts()
    status = dep.get("status") or {}
    generation = (dep.get("metadata") or {}).get("generation")
    exceeded, reports = None, False
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Progressing":
            reports = True
            if cond.get("status") == "False" and cond.get("reason") == PROGRESS_DEADLINE_EXCEEDED:
                exceeded = cond.get("message") or PROGRESS_DEADLINE_EXCEEDED
    return Counts(
        replicas=int(status.get("replicas") or 0),
        updated=int(status.get("updatedReplicas") or 0),
        ready=int(status.get("readyReplicas") or 0),
        seen=generation is None or status.get("observedGeneration") == generation,
        exceeded=exceeded,
        reports_progress=reports,
    )


@dataclass
class Conditions:
    items: dict[str, dict[str, Any]] = field(default_factory=dict)

    def set(self, ctype: str, status: bool, reason: str, message: str) -> None:
        self.items[ctype] = {
            "type": ctype,
            "status": "True" if status else "False",
            "reason": reason,
            "message": message,
        }


def _seconds_between(start: str | None, end: str) -> float | None:
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    try:
        a = datetime.datetime.strptime(start or "", fmt)
        b = datetime.datetime.strptime(end, fmt)
    except ValueError:
        return None
    return (b - a).total_seconds()


def _failure_summary(failures: Sequence[Failure]) -> tuple[str, str]:
    """(reason, message) of the Degraded condition: the first failure's reason, every message."""
    message = "; ".join(f.message for f in failures)
    return failures[0].reason, message if len(message) <= 1000 else message[:997] + "..."


def _progress(
    plan: Plan,
    engine: Counts,
    router: Counts,
    counts: str,
    previous: Mapping[str, Any],
    generation: int | None,
    now: str,
) -> tuple[bool, str, str]:
    """(status, reason, message) of Progressing for a rollout that is not complete.

    Exceeded when a Deployment says so (its controller counts from its last progress), or, for a
    Deployment without a controller reporting (none observed it yet, or it could not be created),
    when the rollout has lasted progressDeadlineSeconds by our own clock. Once exceeded it stays so
    until the pool's spec changes (a new generation is a new attempt) or the rollout completes."""
    assert plan.pool is not None
    for name, c in ((api.engine_name(plan.pool.name), engine), (api.router_name(plan.pool.name), router)):
        if c.exceeded:
            return False, PROGRESS_DEADLINE_EXCEEDED, f"Deployment {name}: {c.exceeded} ({counts})"
    old = next((c for c in previous.get("conditions") or [] if c.get("type") == PROGRESSING), None)
    if old is not None and previous.get("observedGeneration") == generation:
        if old.get("reason") == PROGRESS_DEADLINE_EXCEEDED:
            return False, PROGRESS_DEADLINE_EXCEEDED, old.get("message") or counts
        deadline = plan.pool.spec.progressDeadlineSeconds
        elapsed = _seconds_between(old.get("lastTransitionTime"), now)
        unreported = not (engine.reports_progress and router.reports_progress)
        if old.get("status") == "True" and unreported and elapsed is not None and elapsed > deadline:
            return False, PROGRESS_DEADLINE_EXCEEDED, f"rollout not complete after {deadline} s: {counts}"
    return True, "RollingOut", counts


def _conditions(
    plan: Plan,
    observed: Observed,
    failures: Sequence[Failure],
    previous: Mapping[str, Any],
    generation: int | None,
    now: str,
) -> Conditions:
    cond = Conditions()
    if plan.pool is None:
        assert plan.problem is not None
        msg = f"{plan.problem.message} (nothing new was deployed)"
        cond.set(READY, False, plan.problem.reason, msg)
        cond.set(PROGRESSING, False, "Blocked", msg)
        cond.set(DEGRADED, True, plan.problem.reason, plan.problem.message)
        return cond
    spec = plan.pool.spec
    engine, router = _deployment_counts(observed.engine), _deployment_counts(observed.router)
    want_e, want_r = spec.replicas, spec.router.replicas
    counts = f"engines {engine.ready}/{want_e} ready, routers {router.ready}/{want_r} ready"
    rolled_out = engine.seen and router.seen and engine.updated >= want_e and router.updated >= want_r
    if rolled_out and engine.ready >= want_e and router.ready >= want_r:
        cond.set(PROGRESSING, False, "RolloutComplete", counts)
    else:
        cond.set(PROGRESSING, *_progress(plan, engine, router, counts, previous, generation, now))
    failure = _failure_summary(failures) if failures else None
    if failure is not None:
        cond.set(DEGRADED, True, *failure)
    elif cond.items[PROGRESSING]["reason"] == PROGRESS_DEADLINE_EXCEEDED:
        cond.set(DEGRADED, True, PROGRESS_DEADLINE_EXCEEDED, cond.items[PROGRESSING]["message"])
    else:
        cond.set(DEGRADED, False, "AsExpected", "all children match the spec")
    if want_e == 0:
        cond.set(READY, False, "ScaledToZero", "replicas is 0: no engine serves this pool")
    elif want_r == 0:
        cond.set(READY, False, "NoRouter", "router.replicas is 0: the endpoint has no backend")
    elif engine.ready >= 1 and router.ready >= 1 and failure is None:
        # Serving as soon as one engine and one router are up; Progressing tells whether all are.
        cond.set(READY, True, "Ready", counts)
    elif engine.ready < 1:
        cond.set(READY, False, "EnginesNotReady", counts)
    elif router.ready < 1:
        cond.set(READY, False, "RouterNotReady", counts)
    else:
        assert failure is not None
        cond.set(READY, False, failure[0], failure[1])
    return cond


def merge_conditions(
    new: Conditions, previous: list[Mapping[str, Any]], generation: int | None, now: str
) -> list[dict[str, Any]]:
    """Keep lastTransitionTime when a condition's status did not change (Kubernetes convention)."""
    before = {c.get("type"): c for c in previous or []}
    out = []
    for ctype in (READY, PROGRESSING, DEGRADED):
        cond = dict(new.items[ctype])
        old = before.get(ctype)
        same = old is not None and old.get("status") == cond["status"]
        cond["lastTransitionTime"] = old.get("lastTransitionTime", now) if same and old else now
        if generation is not None:
            cond["observedGeneration"] = generation
        out.append(cond)
    return out


def pool_status(
    plan: Plan,
    observed: Observed,
    generation: int | None,
    previous: Mapping[str, Any] | None,
    now: str,
    failures: Sequence[Failure] = (),
) -> dict[str, Any]:
    """The whole status of a pool (router-reported fields are carried over from `previous`)."""
    previous = previous or {}
    cond = _conditions(plan, observed, failures, previous, generation, now)
    status: dict[str, Any] = {
        "observedGeneration": generation,
        "conditions": merge_conditions(cond, previous.get("conditions") or [], generation, now),
    }
    pool = plan.pool
    if pool is not None:
        engine, router = _deployment_counts(observed.engine), _deployment_counts(observed.router)
        status.update(
            # What exists, as the engine Deployment's controller reports it (the scale subresource's
            # status replicas, as for a Deployment), not what the spec asks for.
            replicas=engine.replicas,
            updatedReplicas=engine.updated,
            readyReplicas=engine.ready,
            routerReadyReplicas=router.ready,
            endpoint=pool.endpoint,
            defaultClass=pool.default_class,
            selector=api.selector_string(api.selector_labels(pool.name, "engine")),
        )
    for key in ("classes", "classesUpdated"):
        if key in previous:
            status[key] = previous[key]
    if pool is None:  # keep what a previous good plan reported, so the pool's state stays visible
        for key in PLAN_STATUS_KEYS:
            if key in previous:
                status[key] = previous[key]
    return status


# Ready=False reasons that are what the user asked for, not a fault.
_INTENDED = frozenset({"ScaledToZero", "NoRouter"})


def transition_events(
    previous: Sequence[Mapping[str, Any]] | None, current: Sequence[Mapping[str, Any]]
) -> list[Event]:
    """The Events of the condition changes from `previous` to `current` (each a status.conditions).

    Only changes of status or reason make an Event, so a steady pool makes none. Warning: Degraded
    turned True (or changed its reason), Ready lost, a progress deadline exceeded. Normal: recovered,
    ready, a rollout started or completed. A new pool's initial not-ready state makes none."""
    before = {c.get("type"): c for c in previous or []}
    events: list[Event] = []
    for cond in current:
        ctype, status, reason = cond.get("type"), cond.get("status"), cond.get("reason") or ""
        old = before.get(ctype)
        if old is not None and (old.get("status"), old.get("reason")) == (status, reason):
            continue
        message = cond.get("message") or ""
        was_true = old is not None and old.get("status") == "True"
        if ctype == DEGRADED:
            if status == "True":
                events.append(Event(WARNING, reason, message))
            elif was_true:
                events.append(Event(NORMAL, "Recovered", f"no longer degraded: {message}"))
        elif ctype == READY:
            if status == "True":
                events.append(Event(NORMAL, "Ready", message))
            elif was_true or reason in _INTENDED:
                events.append(Event(NORMAL if reason in _INTENDED else WARNING, reason, message))
        elif ctype == PROGRESSING:
            if status == "True":
                events.append(Event(NORMAL, reason, message))
            elif reason == PROGRESS_DEADLINE_EXCEEDED:
                events.append(Event(WARNING, reason, message))
            elif reason == "RolloutComplete" and was_true:
                events.append(Event(NORMAL, reason, message))
    # Ready lost for the reason Degraded gives is one event, not two.
    return list(dict.fromkeys(events))


def parse_router_metrics(text: str) -> dict[str, dict[str, float]]:
    """The router's Prometheus `GET /metrics` (keyless) -> {class: {"goodput", "attainment"}}, from its
    per-class gauges over the status window (names: scheduler/contracts/router_metrics.py). Classes without
    a goodput gauge are left out; a malformed exposition reads as no classes."""
    from prometheus_client.parser import text_string_to_metric_families

    keys = {CLASS_GOODPUT: "goodput", CLASS_ATTAINMENT: "attainment"}
    out: dict[str, dict[str, float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            key = keys.get(family.name)
            if key is None:
                continue
            for sample in family.samples:
                name = sample.labels.get(CLASS_LABEL)
                if sample.name == family.name and name and math.isfinite(sample.value):
                    out.setdefault(name, {})[key] = float(sample.value)
    except ValueError:  # not an exposition (an HTML error page, a proxy's answer)
        return {}
    return {name: row for name, row in out.items() if "goodput" in row}


def parse_router_report(payload: Any) -> list[dict[str, Any]]:
    """The router's report -> status.classes. A string is its Prometheus `/metrics` (what the operator
    reads: no API key needed); JSON is `GET /jitserve/status`, in the shapes a router may send:
    {"classes": {name: {...}}}, {"classes": [{"name": ...}]}, or {name: {...}} at the top level."""
    if isinstance(payload, str):
        payload = parse_router_metrics(payload)
    if isinstance(payload, dict) and "classes" in payload:
        payload = payload["classes"]
    items: list[tuple[str, Any]]
    if isinstance(payload, dict):
        items = list(payload.items())
    elif isinstance(payload, list):
        items = [(str(x.get("name")), x) for x in payload if isinstance(x, dict) and x.get("name")]
    else:
        return []
    out = []
    for name, data in sorted(items):
        if not isinstance(data, dict):
            continue
        row: dict[str, Any] = {"name": name}
        for key in ("goodput", "attainment"):
            value = data.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                row[key] = float(value)
        out.append(row)
    return out
