"""The ServingPool spec and the status models of both custom resources (pydantic, camelCase).

These models are the source of truth for the CRD schemas (crdgen.py turns them into OpenAPI). Rules
that span fields are written twice on purpose: as pydantic validators here (the operator re-checks
what it reads) and as CEL rules in crdgen.py (the API server rejects bad input before we see it);
tests/unit/operator/test_cel_rules.py checks that both agree.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from jitserve.operator import validation as v
from jitserve.scheduler.contracts.gmax_params import (
    GMAX_DEFAULTS,
    ClassFairness,
    Cutoff,
    FrameSteps,
    StarvationDelta,
)


def _check_quantity(value: str | int) -> str | int:
    if not v.is_quantity(value):
        raise ValueError(
            f"{value!r} is not a Kubernetes quantity (a non-negative number with an optional suffix: "
            "500m, 4, 16Gi, 1e9)"
        )
    return value


# Kubernetes quantities ("4", "500m", "16Gi"); the CRD marks them x-kubernetes-int-or-string, with the
# quantity grammar as the pattern of strings and a minimum of 0 for integers.
Quantity = Annotated[
    int | str,
    Field(
        json_schema_extra={
            "x-kubernetes-int-or-string": True,
            "pattern": v.QUANTITY,
            "maxLength": v.QUANTITY_MAX_LENGTH,
            "minimum": 0,
        }
    ),
    AfterValidator(_check_quantity),
]

# Names of other objects: Secrets, PersistentVolumeClaims, SLOClasses (DNS-1123 subdomains).
ObjectName = Annotated[
    str, Field(min_length=1, max_length=v.DNS1123_SUBDOMAIN_MAX_LENGTH, pattern=v.DNS1123_SUBDOMAIN)
]
NamespaceName = Annotated[
    str, Field(min_length=1, max_length=v.DNS1123_LABEL_MAX_LENGTH, pattern=v.DNS1123_LABEL)
]
LabelValue = Annotated[str, Field(max_length=v.LABEL_VALUE_MAX_LENGTH, pattern=v.LABEL_VALUE)]
Image = Annotated[str, Field(min_length=1, max_length=512, pattern=v.IMAGE)]


# Engines get 30 minutes to load weights (their startup probe); a rollout may take that plus a pull.
DEFAULT_PROGRESS_DEADLINE = 2400


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ModelSource(StrEnum):
    HUGGINGFACE = "huggingface"
    PVC = "pvc"
    URI = "uri"


class PVCModel(_Model):
    claimName: ObjectName = Field(description="PersistentVolumeClaim holding weights")
    path: str = Field("", max_length=1024, description="directory of the model inside the claim")


class ModelSpec(_Model):
    source: ModelSource = Field(
        ModelSource.HUGGINGFACE, description="where the weights come from: huggingface, pvc or uri"
    )
    name: str | None = Field(
        None, min_length=1, max_length=512, description="huggingface: the model id, e.g. org/model"
    )
    pvc: PVCModel | None = Field(
        None, description="pvc: the claim and path of the weights (mounted read-only)"
    )
    uri: str | None = Field(
        None, min_length=1, max_length=2048, description="uri: passed to the engine as-is"
    )
    servedName: str = Field(
        min_length=1,
        max_length=253,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$",
        description="the model name clients send in OpenAI requests",
    )
    hfTokenSecret: ObjectName | None = Field(
        None, description="Secret with key 'token' exported as HF_TOKEN (gated models)"
    )

    @model_validator(mode="after")
    def _check_source(self) -> ModelSpec:
        needed = {ModelSource.HUGGINGFACE: "name", ModelSource.PVC: "pvc", ModelSource.URI: "uri"}[
            self.source
        ]
        if getattr(self, needed) is None:
            raise ValueError(f"model.source {self.source.value} needs model.{needed}")
        return self


class EngineBackend(StrEnum):
    VLLM = "vllm"  # GPU engines (production)
    VLLM_CPU = "vllm-cpu"  # GPU-free clusters, tests


class EngineSpec(_Model):
    backend: EngineBackend = Field(EngineBackend.VLLM, description="vllm (GPUs) or vllm-cpu (no GPUs)")
    image: Image | None = Field(None, description="engine image; the operator's default if unset")
    extraArgs: list[str] = Field(
        default_factory=list, max_length=64, description="extra vLLM arguments, after '--'"
    )


class Toleration(_Model):
    key: str | None = Field(
        None,
        max_length=v.QUALIFIED_NAME_MAX_LENGTH,
        pattern=v.QUALIFIED_NAME,
        description="taint key (a label key); unset: every key, with operator Exists",
    )
    operator: str | None = Field(None, json_schema_extra={"enum": ["Exists", "Equal"]})
    value: LabelValue | None = Field(None, description="taint value (a label value); none with Exists")
    effect: str | None = Field(
        None, json_schema_extra={"enum": ["NoSchedule", "PreferNoSchedule", "NoExecute"]}
    )
    tolerationSeconds: int | None = Field(None, description="NoExecute only: how long the pod stays")

    @model_validator(mode="after")
    def _check(self) -> Toleration:
        # The checks of Kubernetes' validateTolerations (pkg/apis/core/validation/validation.go).
        if self.operator == "Exists" and self.value:
            raise ValueError("a toleration with operator Exists takes no value")
        if not self.key and self.operator != "Exists":
            raise ValueError("a toleration without a key needs operator Exists")
        if self.tolerationSeconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds needs effect NoExecute")
        return self


class ResourcesSpec(_Model):
    gpus: int | None = Field(
        None, ge=0, le=16, description="nvidia.com/gpu per engine pod; default 1 for vllm, 0 for vllm-cpu"
    )
    cpu: Quantity | None = Field(None, description="CPU request and limit per engine pod")
    memory: Quantity | None = Field(None, description="memory request and limit per engine pod")


class PreemptionMode(StrEnum):
    # vLLM V1 preempts only by recomputing, so there is no `swap`: a setting the engine cannot honour
    # would be a surprise. `auto` = the engine's own mechanism (recompute today).
    AUTO = "auto"
    RECOMPUTE = "recompute"
    NEVER = "never"  # GMAX never preempts (vLLM still does when its KV cache is full)


class SchedulerSpec(_Model):
    """JITServe scheduler parameters (the engine's flags; K goes to the router)."""

    frameSteps: FrameSteps = GMAX_DEFAULTS.frame_steps
    cutoff: Cutoff = GMAX_DEFAULTS.cutoff
    starvationDelta: StarvationDelta = GMAX_DEFAULTS.starvation_delta
    classFairness: ClassFairness = GMAX_DEFAULTS.class_fairness
    preemption: PreemptionMode = Field(
        PreemptionMode.AUTO,
        description="GMAX's preemptions: auto (the engine's mechanism: vLLM V1 recomputes), recompute, never",
    )
    k: int | None = Field(None, ge=1, le=1024, description="router: pods sampled per request (default all)")
    maxNumSeqs: int | None = Field(
        None, ge=1, le=4096, description="B: sequences per batch (the engine's default if unset)"
    )


class SLOClassesSpec(_Model):
    allowed: list[ObjectName] = Field(
        min_length=1, max_length=64, description="SLOClass names this pool serves"
    )
    default: ObjectName | None = Field(
        None, description="class of requests without one; must be among allowed"
    )

    @model_validator(mode="after")
    def _check_default(self) -> SLOClassesSpec:
        if self.default is not None and self.default not in self.allowed:
            raise ValueError(f"sloClasses.default {self.default!r} must be one of sloClasses.allowed")
        if len(set(self.allowed)) != len(self.allowed):
            raise ValueError("sloClasses.allowed has duplicates")
        return self


class RouterSpec(_Model):
    replicas: int = Field(1, ge=0, le=100, description="router pods")
    image: Image | None = Field(None, description="router image; the operator's default if unset")
    port: int = Field(8080, ge=1024, le=65535, description="port of the router Service (the OpenAI endpoint)")
    authSecret: ObjectName | None = Field(
        None, description="Secret of API keys (see the router docs); none: no auth"
    )


class NetworkPolicySpec(_Model):
    enabled: bool = Field(True, description="engines accept traffic only from this pool's router pods")
    metricsNamespaces: list[NamespaceName] = Field(
        default_factory=list, max_length=16, description="namespaces also allowed to reach the engines"
    )


class ServingPoolSpec(_Model):
    """The spec of a ServingPool custom resource."""

    model: ModelSpec = Field(description="the model to serve and the name clients use for it")
    replicas: int = Field(1, ge=0, le=1000, description="engine pods")
    engine: EngineSpec = Field(default_factory=EngineSpec, description="engine backend, image, vLLM args")
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="per engine pod")
    # Keys are checked here only: a CEL rule over map keys has no bound on their length, so its
    # estimated cost would exceed what the API server allows a CRD rule (docs/decisions/operator.md).
    nodeSelector: dict[str, LabelValue] = Field(
        default_factory=dict, max_length=64, description="engine pods' node selector (label keys and values)"
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=32, description="engine pods' tolerations"
    )
    scheduler: SchedulerSpec = Field(default_factory=SchedulerSpec, description="JITServe parameters")
    sloClasses: SLOClassesSpec = Field(description="the SLOClasses this pool serves")
    router: RouterSpec = Field(
        default_factory=RouterSpec, description="the router: the pool's OpenAI endpoint"
    )
    networkPolicy: NetworkPolicySpec = Field(
        default_factory=NetworkPolicySpec, description="engine isolation"
    )
    progressDeadlineSeconds: int = Field(
        DEFAULT_PROGRESS_DEADLINE,
        ge=60,
        le=86_400,
        description="a rollout that has not finished after this long reports Progressing=False, "
        "reason ProgressDeadlineExceeded (set on both Deployments; longer than the engines' 30-minute "
        "startup allowance by default)",
    )

    @field_validator("nodeSelector")
    @classmethod
    def _check_node_selector(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if len(key) > v.QUALIFIED_NAME_MAX_LENGTH or not re.fullmatch(v.QUALIFIED_NAME, key):
                raise ValueError(f"nodeSelector key {key!r} is not a valid label key")
        return value

    @model_validator(mode="after")
    def _check_backend(self) -> ServingPoolSpec:
        if self.engine.backend is EngineBackend.VLLM_CPU and (self.resources.gpus or 0) > 0:
            raise ValueError("engine.backend vllm-cpu takes no GPUs: unset resources.gpus or set it to 0")
        return self

    @property
    def gpus(self) -> int:
        if self.resources.gpus is not None:
            return self.resources.gpus
        return 1 if self.engine.backend is EngineBackend.VLLM else 0


# ---- status ---------------------------------------------------------------------------------------


class Condition(_Model):
    type: str
    status: str = Field(json_schema_extra={"enum": ["True", "False", "Unknown"]})
    reason: str = ""
    message: str = ""
    lastTransitionTime: str | None = None
    observedGeneration: int | None = None


class ClassStatus(_Model):
    name: str
    goodput: float | None = Field(None, description="goodput (tokens/s on time) reported by the router")
    attainment: float | None = Field(None, description="fraction of requests meeting the SLO")


class ServingPoolStatus(_Model):
    observedGeneration: int | None = None
    replicas: int | None = Field(None, description="engine pods that exist (the engine Deployment's status)")
    updatedReplicas: int | None = Field(None, description="engine pods running the current spec")
    readyReplicas: int | None = Field(None, description="engine pods ready")
    routerReadyReplicas: int | None = None
    endpoint: str | None = Field(None, description="in-cluster OpenAI base URL")
    defaultClass: str | None = None
    conditions: list[Condition] = Field(default_factory=list)
    classes: list[ClassStatus] = Field(default_factory=list, description="per-class goodput, attainment")
    classesUpdated: str | None = Field(None, description="when the router's report last changed")
    selector: str | None = Field(None, description="label selector of the engine pods (scale subresource)")


class SLOClassStatus(_Model):
    pools: list[str] = Field(default_factory=list, description="namespace/name of pools using this class")
    poolCount: int = 0
