"""The router's settings: one frozen dataclass built from flags and environment by cli.py.

Every default is declared here once; cli.py reads its flag defaults from these fields (and `Pool` its
own), so a flag and the code it configures cannot disagree. Standard library only: `jitserve --help`
imports the CLI, which reads these defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Defaults:
    """Speeds assumed for replicas without state (plain vLLM engines, or before the first report)."""

    step_time_s: float = 0.05
    prefill_tokens_per_s: float = 2000.0
    batch_size: int = 8
    assumed_output_tokens: int = 128  # per queued request, to turn queue length into delay
    stale_after_s: float = 2.0


@dataclass(frozen=True)
class RouterConfig:
    k: int | None = None  # pods sampled per request (None: all)
    max_inflight: int = 4096  # requests open in the router at once; beyond: 429 router_overloaded
    max_body_bytes: int = 4 * 1024 * 1024
    max_retries: int = 2  # other pods tried when a pod fails before the first token
    connect_timeout_s: float = 2.0
    max_connecting: int = 64  # upstream connects under way at once (more wait their turn, untimed)
    read_timeout_s: float = 600.0  # longest silence tolerated from an engine mid-response
    first_token_grace_s: float = 5.0  # streaming: waiting_time + prefill estimate + this, then drop
    # streaming: an engine's response headers within this (vLLM sends them before scheduling), else
    # the request is retried elsewhere and the engine probed
    header_timeout_s: float = 30.0
    best_effort_queue: int = 2048  # best-effort requests waiting in the router; beyond: 429 queue_full
    best_effort_slots: int = 0  # best-effort requests open per engine; 0: twice its batch size
    best_effort_max_wait_s: float = 600.0  # queued best-effort gives up only if no engine is usable then
    default_max_tokens: int = 1024  # length bound when the request gives no max_tokens
    drop_finish_reasons: frozenset[str] = frozenset({"abort"})  # engine finish reasons meaning "dropped"
    served_models: frozenset[str] = frozenset()  # extra names /v1/models lists (engines report theirs)
    program_idle_timeout_s: float = 60.0
    max_programs: int = 10_000
    prefix_cache_entries: int = 50_000
    status_window_s: int = 60
    length_predictor: bool = True  # QRF output-length bounds learned from finished requests
    # at most one QRF fit per this many seconds (`RefitPacing.min_interval_s`; its cpu_share paces too)
    length_refit_interval_s: float = 60.0
    pattern_graphs: bool = True  # compound sub-deadlines from matched pattern graphs
    seed: int | None = None
    defaults: Defaults = field(default_factory=Defaults)
    # replica polling (router/pool.py)
    poll_interval_s: float = 0.25  # a pod's report is at most this old (plus its own frame)
    poll_timeout_s: float = 1.0  # one poll; a late answer makes the report stale, not the pod down
    down_after: int = 2  # failed polls in a row before a pod is excluded (refused: at once)
    unresponsive_timeout_s: float = 10.0  # a pod silent this long to its health probe is hung
