"""`jitserve operator`'s settings, declared once (jitserve.settings): flag, JITSERVE_OPERATOR_<OPTION>
variable, default, validation and docs line come from these fields.

The image and status-URL options also read their older variables (JITSERVE_ENGINE_IMAGE,
JITSERVE_ENGINE_CPU_IMAGE, JITSERVE_ROUTER_IMAGE, JITSERVE_ROUTER_STATUS_URL) after their own.
"""

from __future__ import annotations

from pydantic import Field, PositiveFloat, PositiveInt
from pydantic_settings import SettingsConfigDict

from jitserve.operator import api
from jitserve.settings import Settings

_SCOPE = {"exclusive": "scope"}  # -n and -A: one or the other


def _also(variable: str) -> dict[str, tuple[str, ...]]:
    return {"env_also": (variable,)}


class OperatorSettings(Settings):
    """`jitserve operator`: the kopf operator reconciling ServingPools."""

    model_config = SettingsConfigDict(env_prefix="JITSERVE_OPERATOR_")

    namespace: tuple[str, ...] = Field(
        (),
        description="watch this namespace",
        json_schema_extra={**_SCOPE, "short": "-n", "metavar": "NAMESPACE"},
    )
    # no variable: watching every namespace is already what no --namespace means, and a variable could
    # not lose to a -n flag (argparse sees only flags as conflicting)
    all_namespaces: bool = Field(
        False,
        description="watch every namespace (the default)",
        json_schema_extra={**_SCOPE, "short": "-A", "env": False},
    )
    engine_image: str = Field(
        api.DEFAULT_ENGINE_IMAGE,
        min_length=1,
        description="default engine image for backend vllm",
        json_schema_extra=_also("JITSERVE_ENGINE_IMAGE"),
    )
    engine_cpu_image: str = Field(
        api.DEFAULT_ENGINE_CPU_IMAGE,
        min_length=1,
        description="default engine image for backend vllm-cpu",
        json_schema_extra=_also("JITSERVE_ENGINE_CPU_IMAGE"),
    )
    router_image: str = Field(
        api.DEFAULT_ROUTER_IMAGE,
        min_length=1,
        description="default router image",
        json_schema_extra=_also("JITSERVE_ROUTER_IMAGE"),
    )
    router_status_url: str | None = Field(
        None,
        min_length=1,
        description="template of the URL the operator reads per-class goodput from (the router's keyless "
        "Prometheus /metrics), with {service} {namespace} {port} {pool} (default: the router Service's "
        "cluster DNS name, path /metrics)",
        json_schema_extra={**_also("JITSERVE_ROUTER_STATUS_URL"), "metavar": "URL"},
    )
    resync_seconds: PositiveFloat = Field(
        30.0, description="how often each pool re-reads its router's goodput and re-checks its children"
    )
    workers: PositiveInt = Field(16, description="threads reconciling pools in parallel")
    liveness: str | None = Field(
        None,
        min_length=1,
        description="kopf liveness endpoint, e.g. http://0.0.0.0:8080/healthz",
        json_schema_extra={"metavar": "URL"},
    )
    verbose: bool = Field(False, description="debug logging")
