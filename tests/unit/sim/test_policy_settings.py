"""GMAX's B in the simulator is a SimContext field, never an environment variable read at import."""

from __future__ import annotations

import inspect

from jitserve.sim import policies
from jitserve.sim.policies import SimContext, build_policy
from jitserve.sim.profiles import BatchTimeModel, load_profile


def test_policies_read_no_environment() -> None:
    source = inspect.getsource(policies)
    assert "os.environ" not in source and "getenv" not in source and "\nimport os\n" not in source


def test_step_share_is_explicit_and_engine_batch_policy_uses_max_num_seqs() -> None:
    prof = load_profile("smollm2-135m-vllm-cpu")
    timing = BatchTimeModel.from_profile(prof)
    tight = SimContext(prof, timing, tightest_tbt=1e-6)
    assert tight.gmax_batch_size == 1  # no batch fits the share of a tiny TBT
    engine_b = build_policy("jitserve-engine-batch", tight)
    assert engine_b.policy.params.batch_size == prof.max_num_seqs  # type: ignore[attr-defined]
    assert build_policy("jitserve", tight).policy.params.batch_size == 1  # type: ignore[attr-defined]
