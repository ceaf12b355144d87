"""The operator's decision core, pure: from a ServingPool and the SLOClasses it names to a plan
(children to apply, or why nothing may be deployed), and from observed children to the pool's status.

No API calls and no clock here (`now` is an argument), so every branch is unit-tested directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from jitserve.operator import api
from jitserve.operator.children import Images, Pool
from jitserve.operator.models import ServingPoolSpec
from jitserve.scheduler.slo import SLOClassSpec

READY, PROGRESSING, DEGRADED = "Ready", "Progressing", "Degraded"


@dataclass(frozen=True)
class Problem:
    """Why a pool cannot be (fully) deployed; becomes the Degraded condition."""

    reason: str
    message: str


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


def _deployment_counts(dep: Mapping[str, Any] | None) -> tuple[int, int, bool]:
    """(ready, updated, rolled_out) of a Deployment: rolled out when its controller saw the latest spec."""
    if dep is None:
        return 0, 0, False
    status = dep.get("status") or {}
    ready = int(status.get("readyReplicas") or 0)
    updated = int(status.get("updatedReplicas") or 0)
    generation = (dep.get("metadata") or {}).get("generation")
    seen = status.get("observedGeneration")
    return ready, updated, generation is None or seen == generation


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


def _conditions(plan: Plan, observed: Observed, apply_error: str | None) -> Conditions:
    cond = Conditions()
    if plan.pool is None:
        assert plan.problem is not None
        msg = f"{plan.problem.message} (nothing new was deployed)"
        cond.set(READY, False, plan.problem.reason, msg)
        cond.set(PROGRESSING, False, "Blocked", msg)
        cond.set(DEGRADED, True, plan.problem.reason, plan.problem.message)
        return cond
    spec = plan.pool.spec
    if apply_error is not None:
        cond.set(DEGRADED, True, "ApplyFailed", apply_error)
    else:
        cond.set(DEGRADED, False, "AsExpected", "all children match the spec")
    e_ready, e_updated, e_seen = _deployment_counts(observed.engine)
    r_ready, r_updated, r_seen = _deployment_counts(observed.router)
    want_e, want_r = spec.replicas, spec.router.replicas
    counts = f"engines {e_ready}/{want_e} ready, routers {r_ready}/{want_r} ready"
    rolled_out = e_seen and r_seen and e_updated >= want_e and r_updated >= want_r
    if rolled_out and e_ready >= want_e and r_ready >= want_r:
        cond.set(PROGRESSING, False, "RolloutComplete", counts)
    else:
        cond.set(PROGRESSING, True, "RollingOut", counts)
    if want_e == 0:
        cond.set(READY, False, "ScaledToZero", "replicas is 0: no engine serves this pool")
    elif want_r == 0:
        cond.set(READY, False, "NoRouter", "router.replicas is 0: the endpoint has no backend")
    elif e_ready >= 1 and r_ready >= 1 and apply_error is None:
        # Serving as soon as one engine and one router are up; Progressing tells whether all are.
        cond.set(READY, True, "Ready", counts)
    elif e_ready < 1:
        cond.set(READY, False, "EnginesNotReady", counts)
    elif r_ready < 1:
        cond.set(READY, False, "RouterNotReady", counts)
    else:
        cond.set(READY, False, "ApplyFailed", apply_error or counts)
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
    apply_error: str | None = None,
) -> dict[str, Any]:
    """The whole status of a pool (router-reported fields are carried over from `previous`)."""
    previous = previous or {}
    cond = _conditions(plan, observed, apply_error)
    status: dict[str, Any] = {
        "observedGeneration": generation,
        "conditions": merge_conditions(cond, previous.get("conditions") or [], generation, now),
    }
    pool = plan.pool
    if pool is not None:
        e_ready, _, _ = _deployment_counts(observed.engine)
        r_ready, _, _ = _deployment_counts(observed.router)
        status.update(
            replicas=pool.spec.replicas,
            readyReplicas=e_ready,
            routerReadyReplicas=r_ready,
            endpoint=pool.endpoint,
            defaultClass=pool.default_class,
            selector=api.selector_string(api.selector_labels(pool.name, "engine")),
        )
    for key in ("classes", "classesUpdated"):
        if key in previous:
            status[key] = previous[key]
    if pool is None:  # keep what a previous good plan reported, so the pool's state stays visible
        for key in (
            "replicas",
            "readyReplicas",
            "routerReadyReplicas",
            "endpoint",
            "defaultClass",
            "selector",
        ):
            if key in previous:
                status[key] = previous[key]
    return status


def parse_router_report(payload: Any) -> list[dict[str, Any]]:
    """The router's `GET /jitserve/status` -> status.classes, tolerating the shapes a router may send:
    {"classes": {name: {...}}}, {"classes": [{"name": ...}]}, or {name: {...}} at the top level."""
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
