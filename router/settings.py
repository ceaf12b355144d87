"""`jitserve router`'s settings, declared once (jitserve.settings): flag, JITSERVE_ROUTER_<OPTION>
variable, default, validation and docs line all come from these fields.

Defaults are RouterConfig's own (config.py, which the router's code reads), so the flags and the code
cannot disagree; `to_config()` turns the settings into that config.
"""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, Field
from pydantic_settings import SettingsConfigDict

from jitserve.router.config import Defaults, RouterConfig
from jitserve.settings import ClassesFile, Host, Port, Settings

_C = RouterConfig()  # every default below is the config's own (declared once, in config.py)
_SERVING, _DISCOVERY, _CLASSES = (
    "serving",
    "engine discovery (static list, or Kubernetes pods)",
    "SLO classes",
)
_AUTH, _ADMISSION, _PROGRAMS = "auth", "admission and placement", "compound programs and status"


def _g(group: str, metavar: str | None = None) -> dict[str, str]:
    return {"group": group, **({"metavar": metavar} if metavar else {})}


class RouterSettings(Settings):
    model_config = SettingsConfigDict(env_prefix="JITSERVE_ROUTER_")

    host: Host = Field("0.0.0.0", json_schema_extra=_g(_SERVING))
    port: Port = Field(8080, description="port of the OpenAI endpoint", json_schema_extra=_g(_SERVING))
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="log level", json_schema_extra=_g(_SERVING)
    )
    served_model_name: list[str] | None = Field(
        None,
        description="model name to accept and list besides what engines report",
        json_schema_extra=_g(_SERVING, "NAME"),
    )
    engines: str | None = Field(
        None,
        description="static engine base URLs for local runs, e.g. "
        "http://127.0.0.1:8001,http://127.0.0.1:8002",
        json_schema_extra=_g(_DISCOVERY, "URL[,URL...]"),
    )
    engine_selector: str | None = Field(
        None,
        description="label selector of the pool's engine pods (Kubernetes discovery)",
        json_schema_extra=_g(_DISCOVERY, "SELECTOR"),
    )
    namespace: str = Field(
        "default",
        min_length=1,
        validation_alias=AliasChoices("namespace", "JITSERVE_ROUTER_NAMESPACE", "POD_NAMESPACE"),
        description="namespace of the engine pods, ConfigMap and Secret",
        json_schema_extra=_g(_DISCOVERY),
    )
    kubeconfig: str | None = Field(
        None,
        description="kubeconfig for out-of-cluster runs (in a pod: the service account; else KUBECONFIG)",
        json_schema_extra=_g(_DISCOVERY, "PATH"),
    )
    engine_port: Port = Field(8000, description="engine pods' HTTP port", json_schema_extra=_g(_DISCOVERY))
    poll_interval: float = Field(
        _C.poll_interval_s,
        gt=0,
        description="seconds between polls of each engine's /jitserve/state",
        json_schema_extra=_g(_DISCOVERY),
    )
    poll_timeout: float = Field(
        _C.poll_timeout_s, gt=0, description="timeout of one poll, seconds", json_schema_extra=_g(_DISCOVERY)
    )
    stale_after: float = Field(
        _C.defaults.stale_after_s,
        gt=0,
        description="seconds after which a pod's reported state is stale (router falls back to its "
        "own counts)",
        json_schema_extra=_g(_DISCOVERY),
    )
    down_after: int = Field(
        _C.down_after,
        ge=1,
        description="failed polls in a row before a pod is excluded (connection refused excludes at once)",
        json_schema_extra=_g(_DISCOVERY),
    )
    unresponsive_timeout: float = Field(
        _C.unresponsive_timeout_s,
        gt=0,
        description="after a poll or request timed out on a pod, its GET /health gets this long to answer; "
        "no answer: the pod is down, its requests end (retried elsewhere if nothing was sent yet)",
        json_schema_extra=_g(_DISCOVERY),
    )
    classes_configmap: str | None = Field(
        None,
        description="ConfigMap (key classes.json; optional key default) with the pool's SLO classes; watched",
        json_schema_extra=_g(_CLASSES, "NAME"),
    )
    classes_file: ClassesFile = Field(
        None,
        description="JSON file of class name -> SLOClass spec (or the ConfigMap's data); read at start",
        json_schema_extra=_g(_CLASSES, "PATH"),
    )
    default_class: str | None = Field(
        None,
        description="class of requests that name none (ConfigMap key 'default' wins when present)",
        json_schema_extra=_g(_CLASSES, "NAME"),
    )
    auth_secret: str | None = Field(
        None,
        description="Kubernetes Secret of API keys ('<key> [tenant]' lines; key api-keys); watched",
        json_schema_extra=_g(_AUTH, "NAME"),
    )
    auth_file: str | None = Field(
        None,
        description="file of API keys, one '<key> [tenant]' per line; no file and no Secret: auth off",
        json_schema_extra=_g(_AUTH, "PATH"),
    )
    k: int | None = Field(
        _C.k,
        ge=1,
        description="pods sampled per request (power-of-K); default all",
        json_schema_extra=_g(_ADMISSION),
    )
    max_inflight: int = Field(
        _C.max_inflight,
        ge=1,
        description="requests open in the router at once; more get 429 router_overloaded",
        json_schema_extra=_g(_ADMISSION),
    )
    max_body_bytes: int = Field(
        _C.max_body_bytes,
        ge=1,
        description="largest request body; larger gets 413",
        json_schema_extra=_g(_ADMISSION),
    )
    max_retries: int = Field(
        _C.max_retries,
        ge=0,
        description="other pods tried when a pod fails before the first token",
        json_schema_extra=_g(_ADMISSION),
    )
    first_token_grace: float = Field(
        _C.first_token_grace_s,
        ge=0,
        description="streaming: drop when no token came within waiting_time + prefill estimate + this",
        json_schema_extra=_g(_ADMISSION),
    )
    default_max_tokens: int = Field(
        _C.default_max_tokens,
        ge=1,
        description="output length bound for requests without max_tokens",
        json_schema_extra=_g(_ADMISSION),
    )
    connect_timeout: float = Field(
        _C.connect_timeout_s, gt=0, description="engine connect timeout, s", json_schema_extra=_g(_ADMISSION)
    )
    max_connecting: int = Field(
        _C.max_connecting,
        ge=1,
        description="new engine connections set up at once; more wait their turn (not counted in "
        "--connect-timeout)",
        json_schema_extra=_g(_ADMISSION),
    )
    header_timeout: float = Field(
        _C.header_timeout_s,
        gt=0,
        description="streaming: an engine's response headers within this, else the request is "
        "retried on another "
        "engine and the engine probed, s",
        json_schema_extra=_g(_ADMISSION),
    )
    best_effort_queue: int = Field(
        _C.best_effort_queue,
        ge=0,
        description="best-effort (no SLO) requests waiting in the router for room at the engines; "
        "more get 429 queue_full with Retry-After",
        json_schema_extra=_g(_ADMISSION),
    )
    best_effort_slots: int = Field(
        _C.best_effort_slots,
        ge=0,
        description="best-effort requests open at each engine at once; 0: twice the engine's batch size",
        json_schema_extra=_g(_ADMISSION),
    )
    best_effort_max_wait: float = Field(
        _C.best_effort_max_wait_s,
        ge=0,
        description="a queued best-effort request gets 503 no_replica only after this long with no "
        "usable engine, s",
        json_schema_extra=_g(_ADMISSION),
    )
    read_timeout: float = Field(
        _C.read_timeout_s,
        gt=0,
        description="longest silence tolerated from an engine mid-response, s",
        json_schema_extra=_g(_ADMISSION),
    )
    drop_finish_reason: list[str] | None = Field(
        None,
        description="engine finish_reason meaning 'dropped past waiting_time' (default "
        f"{', '.join(sorted(_C.drop_finish_reasons))})",
        json_schema_extra=_g(_ADMISSION, "REASON"),
    )
    default_step_time: float = Field(
        _C.defaults.step_time_s,
        gt=0,
        description="decode step seconds assumed for engines that report no state",
        json_schema_extra=_g(_ADMISSION),
    )
    default_prefill_rate: float = Field(
        _C.defaults.prefill_tokens_per_s,
        gt=0,
        description="prompt tokens/s assumed for engines that report no state",
        json_schema_extra=_g(_ADMISSION),
    )
    default_batch_size: int = Field(
        _C.defaults.batch_size,
        ge=1,
        description="batch size assumed for engines that report no state",
        json_schema_extra=_g(_ADMISSION),
    )
    seed: int | None = Field(
        _C.seed, description="seed of power-of-K sampling", json_schema_extra=_g(_ADMISSION)
    )
    program_idle_timeout: float = Field(
        _C.program_idle_timeout_s,
        gt=0,
        description="a program ends after this many seconds without calls",
        json_schema_extra=_g(_PROGRAMS),
    )
    max_programs: int = Field(
        _C.max_programs, ge=1, description="programs tracked at once", json_schema_extra=_g(_PROGRAMS)
    )
    length_predictor: Literal["qrf", "max-tokens"] = Field(
        "qrf" if _C.length_predictor else "max-tokens",
        description="output-length bound: the analyzer's QRF learned online from finished requests, "
        "or max_tokens",
        json_schema_extra=_g(_PROGRAMS),
    )
    length_refit_interval: float = Field(
        _C.length_refit_interval_s,
        ge=0,
        description="seconds between QRF refits at least; a refit also waits until the fits have used at "
        "most 1% of a core (a fit costs seconds of CPU)",
        json_schema_extra=_g(_PROGRAMS),
    )
    subdeadlines: Literal["pattern-graph", "remaining"] = Field(
        "pattern-graph" if _C.pattern_graphs else "remaining",
        description="compound stage sub-deadlines: matched pattern graphs, or the whole remaining budget",
        json_schema_extra=_g(_PROGRAMS),
    )
    status_window: int = Field(
        _C.status_window_s,
        ge=1,
        description="seconds of history in GET /jitserve/status",
        json_schema_extra=_g(_PROGRAMS),
    )

    def to_config(self) -> RouterConfig:
        """The router's runtime config (config.py) from these settings."""
        defaults = Defaults(
            step_time_s=self.default_step_time,
            prefill_tokens_per_s=self.default_prefill_rate,
            batch_size=self.default_batch_size,
            stale_after_s=self.stale_after,
        )
        return RouterConfig(
            k=self.k,
            max_inflight=self.max_inflight,
            max_body_bytes=self.max_body_bytes,
            max_retries=self.max_retries,
            connect_timeout_s=self.connect_timeout,
            max_connecting=self.max_connecting,
            read_timeout_s=self.read_timeout,
            first_token_grace_s=self.first_token_grace,
            header_timeout_s=self.header_timeout,
            best_effort_queue=self.best_effort_queue,
            best_effort_slots=self.best_effort_slots,
            best_effort_max_wait_s=self.best_effort_max_wait,
            default_max_tokens=self.default_max_tokens,
            drop_finish_reasons=frozenset(self.drop_finish_reason or _C.drop_finish_reasons),
            served_models=frozenset(self.served_model_name or ()),
            program_idle_timeout_s=self.program_idle_timeout,
            max_programs=self.max_programs,
            status_window_s=self.status_window,
            length_predictor=self.length_predictor == "qrf",
            length_refit_interval_s=self.length_refit_interval,
            pattern_graphs=self.subdeadlines == "pattern-graph",
            seed=self.seed,
            defaults=defaults,
            poll_interval_s=self.poll_interval,
            poll_timeout_s=self.poll_timeout,
            down_after=self.down_after,
            unresponsive_timeout_s=self.unresponsive_timeout,
        )
