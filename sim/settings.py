"""`jitserve sim`'s settings, declared once (jitserve.settings): flag, JITSERVE_SIM_<OPTION> variable,
default, validation and docs line come from these fields.

Names are checked against what the simulator ships (workloads, profiles, policies) when the settings
are validated, so a typo fails before any simulation runs; the modules that know them load only then
(the `jitserve` dispatcher imports this module to build its parser).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import Field, PositiveFloat, PositiveInt, field_validator
from pydantic_settings import SettingsConfigDict

from jitserve.settings import Seed, Settings, comma_list

# The simulator's policy names, declared once (the suite, `jitserve sim` and bench/sim.py read them here;
# this module stays light: the `jitserve` dispatcher imports it to build its parser).
JITSERVE, ORACLE, PAPER = "jitserve", "jitserve-oracle", "jitserve-paper"
BASELINES = (
    "vllm",
    "vllm-v1",
    "vllm-priority",
    "sarathi",
    "edf",
    "sjf",
    "ltr",
    "autellix",
    "tempo",
    "slos-serve",
    "qlm",
)
# `jitserve sim`'s default: JITServe, its oracle and paper ranking, then every baseline but vllm-v1 (a
# variant of vllm's queue the suite audits; sim/policies.py has a few more variants)
DEFAULT_POLICIES = (JITSERVE, ORACLE, PAPER, *(p for p in BASELINES if p != "vllm-v1"))
Names = comma_list(str)
PositiveFloats = comma_list(PositiveFloat)


def _shipped(folder: str, name: str) -> bool:
    return resources.files("jitserve.sim").joinpath(folder, f"{name}.yaml").is_file()


def _shipped_names(folder: str) -> str:
    files = resources.files("jitserve.sim").joinpath(folder).iterdir()
    return ", ".join(sorted(f.name.removesuffix(".yaml") for f in files if f.name.endswith(".yaml")))


class SimSettings(Settings):
    """`jitserve sim`: policies on a workload in the simulator, compared by goodput."""

    model_config = SettingsConfigDict(env_prefix="JITSERVE_SIM_")

    workload: str = Field("paper-mix", min_length=1, description="YAML file or shipped workload name")
    policies: Names = Field(DEFAULT_POLICIES, min_length=1, description="policy names")
    json_out: Path | None = Field(
        None,
        description="write results here (policy -> metrics)",
        json_schema_extra={"flag": "--json", "metavar": "PATH"},
    )
    rate: PositiveFloat | None = Field(None, description="requests/s per replica (default: the workload's)")
    rates: PositiveFloats = Field((), description="rates per replica: a sweep (goodput vs rate)")
    load: PositiveFloat | None = Field(
        None,
        description="rate as a multiple of the workload's saturation rate (arrivals.saturation_per_replica)",
    )
    loads: PositiveFloats = Field((), description="multiples of the saturation rate: a sweep")
    replicas: PositiveInt | None = Field(None, description="replicas (default: the workload's)")
    duration: PositiveFloat | None = Field(None, description="seconds of arrivals (default: the workload's)")
    seed: Seed | None = Field(None, description="seed (default: the workload's)")
    profile: str | None = Field(
        None, min_length=1, description="engine profile name or YAML (default: the workload's)"
    )
    placement: Literal["power-of-k", "round-robin", "least-load", "power-of-two"] | None = Field(
        None, description="placement across replicas for every policy (default: each policy's own)"
    )
    predictor: Literal["auto", "qrf", "conditional"] = Field(
        "auto", description="length bounds: the analyzer's QRF or the conditional-quantile stand-in"
    )
    heterogeneity: float | None = Field(
        None, ge=0, le=1, description="override the profile's length-mix penalty h"
    )
    plots: Path | None = Field(
        None, description="directory for PNG plots", json_schema_extra={"metavar": "DIR"}
    )
    quiet: bool = Field(False, description="no progress bar (there is none when stderr is not a terminal)")

    @field_validator("workload")
    @classmethod
    def _known_workload(cls, value: str) -> str:
        if not Path(value).exists() and not _shipped("workloads", value):
            raise ValueError(f"no such file or shipped workload (shipped: {_shipped_names('workloads')})")
        return value

    @field_validator("profile")
    @classmethod
    def _known_profile(cls, value: str | None) -> str | None:
        yaml_file = Path(value or "").suffix in (".yaml", ".yml") and Path(value or "").exists()
        if value is not None and not yaml_file and not _shipped("profiles", value):
            raise ValueError(f"no such YAML file or shipped profile (shipped: {_shipped_names('profiles')})")
        return value

    @field_validator("policies")
    @classmethod
    def _known_policies(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        from jitserve.sim.policies import ALIASES, FACTORIES  # the simulator's own list, loaded here only

        unknown = [p for p in value if ALIASES.get(p, p) not in FACTORIES]
        if unknown:
            raise ValueError(f"unknown policy {', '.join(unknown)} (known: {', '.join(FACTORIES)})")
        return value
