"""ReplicaState payloads for pure router tests (the same shapes as the integration tests' fake engines
serve, tests/integration/router/router_fakes.py)."""

from __future__ import annotations

import time
from typing import Any

MODEL = "fake-model"


def idle_state(name: str, **over: Any) -> dict[str, Any]:
    """A ReplicaState payload of an idle engine (50 ms steps, 8 slots free)."""
    state = {
        "pod": name, "model": MODEL, "step_time_s": 0.05, "prefill_tokens_per_s": 4000.0, "batch_size": 8,
        "running": 0, "waiting": 0, "committed_bandwidth": 0.0, "residual_capacity": 8.0,
        "admission_priority": 0.0, "queue_delay_s": 0.0, "kv_usage": 0.0, "cutoff": 0.95, "frames": 1,
        "updated_at": time.time(),
    }  # fmt: skip
    state.update(over)
    return state


def loaded_state(name: str, queue_delay_s: float = 30.0, **over: Any) -> dict[str, Any]:
    """A full engine: every slot busy, a long queue and a high admission bar."""
    return idle_state(
        name, running=8, waiting=40, committed_bandwidth=12.0, residual_capacity=-4.0,
        admission_priority=1e6, queue_delay_s=queue_delay_s, kv_usage=0.9, **over,
    )  # fmt: skip
