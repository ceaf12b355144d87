"""Engine profiles: a model on a GPU (or a CPU), and the roofline batch-time model they imply.

A step of a vLLM engine runs one forward pass over a batch of decode tokens (one per decoding
sequence) and prefill tokens (chunks of prompts). Its time is the larger of the compute time and the
memory time, plus a fixed per-step overhead (scheduling, sampling, kernel launches):

    flops = 2 * params * tokens + attention_flops
    bytes = weight_bytes + kv_bytes_per_token * (context read by every query token's attention)
    step  = overhead + max(flops / (peak_flops * mfu), bytes / (mem_bw * mbu))

Attention over a batch whose contexts differ wastes work: kernels split by sequence, so the longest
context sets the pace of its layer (JITServe Figure 8). We model the decode KV read as
    (1 - h) * sum(ctx) + h * n * max(ctx)
with h the profile's `heterogeneity`: h = 0 is a perfectly balanced kernel, h = 1 makes every
sequence cost as much as the longest. Prefill chunks read their own prefix.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field


class ModelSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    params: float = Field(gt=0, description="parameter count")
    layers: int = Field(gt=0)
    hidden: int = Field(gt=0, description="model width d_model")
    kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    bytes_per_param: float = Field(2.0, gt=0, description="2 for bf16 weights")

    @property
    def kv_bytes_per_token(self) -> float:
        # K and V, every layer, bf16
        return 2.0 * self.layers * self.kv_heads * self.head_dim * 2.0


class HardwareSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    peak_flops: float = Field(gt=0, description="dense bf16 FLOP/s of one device (datasheet)")
    mem_bandwidth: float = Field(gt=0, description="device memory bytes/s (datasheet)")
    mem_bytes: float = Field(gt=0, description="device memory")
    host_bandwidth: float = Field(gt=0, description="host<->device bytes/s for KV swap (PCIe)")
    devices: int = Field(1, ge=1, description="tensor-parallel degree of one replica")


class Profile(BaseModel):
    """One replica: model x hardware x efficiency factors x vLLM engine limits."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    model: ModelSpec
    hardware: HardwareSpec
    mfu: float = Field(0.55, gt=0, le=1, description="achieved share of peak FLOP/s")
    mbu: float = Field(0.75, gt=0, le=1, description="achieved share of memory bandwidth")
    tp_efficiency: float = Field(0.85, gt=0, le=1, description="scaling of TP>1 (all-reduce cost)")
    step_overhead_s: float = Field(0.003, ge=0, description="fixed cost of every engine step")
    prefill_token_overhead_s: float = Field(
        0.0, ge=0, description="extra per prefill token (CPU backends: not captured by the roofline)"
    )
    heterogeneity: float = Field(0.3, ge=0, le=1, description="h of the decode-attention imbalance")
    attention_flops_factor: float = Field(
        1.0, gt=0, description="multiplies the attention FLOPs (CPU backends: fitted, see sim/calibrate.py)"
    )
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    activation_reserve_bytes: float = Field(2e9, ge=0)
    kv_capacity_tokens: int | None = Field(None, gt=0, description="override the derived KV capacity")
    block_size: int = Field(16, gt=0)
    max_num_seqs: int = Field(256, gt=0, description="vLLM max_num_seqs: the batch size B")
    max_model_len: int = Field(32768, gt=0)

    @property
    def scale(self) -> float:
        d = self.hardware.devices
        return d * (self.tp_efficiency if d > 1 else 1.0)

    @property
    def flops_per_s(self) -> float:
        return self.hardware.peak_flops * self.mfu * self.scale

    @property
    def bytes_per_s(self) -> float:
        return self.hardware.mem_bandwidth * self.mbu * self.scale

    @property
    def weight_bytes(self) -> float:
        return self.model.params * self.model.bytes_per_param

    @property
    def kv_capacity(self) -> int:
        """KV cache tokens of one replica, rounded down to whole blocks."""
        if self.kv_capacity_tokens is not None:
            tokens = self.kv_capacity_tokens
        else:
            hw = self.hardware
            free = (
                hw.mem_bytes * hw.devices * self.gpu_memory_utilization
                - self.weight_bytes
                - self.activation_reserve_bytes * hw.devices
            )
            if free <= 0:
                raise ValueError(f"profile {self.name}: the weights do not fit in device memory")
            tokens = int(free / self.model.kv_bytes_per_token)
        return tokens // self.block_size * self.block_size

    @property
    def swap_bytes_per_s(self) -> float:
        return self.hardware.host_bandwidth * self.hardware.devices


@dataclass(frozen=True, slots=True)
class BatchTimeModel:
    """Step time of one engine step; vectorized over the decode contexts."""

    flops_per_s: float
    bytes_per_s: float
    weight_bytes: float
    params: float
    attn_flops_per_ctx: float  # 4 * layers * hidden: QK^T and AV per (query, key) pair
    kv_bytes_per_token: float
    heterogeneity: float
    overhead_s: float
    prefill_token_overhead_s: float

    @classmethod
    def from_profile(cls, profile: Profile) -> BatchTimeModel:
        m = profile.model
        return cls(
            flops_per_s=profile.flops_per_s,
            bytes_per_s=profile.bytes_per_s,
            weight_bytes=profile.weight_bytes,
            params=m.params,
            attn_flops_per_ctx=4.0 * m.layers * m.hidden * profile.attention_flops_factor,
            kv_bytes_per_token=m.kv_bytes_per_token,
            heterogeneity=profile.heterogeneity,
            overhead_s=profile.step_overhead_s,
            prefill_token_overhead_s=profile.prefill_token_overhead_s,
        )

    def step_time(
        self,
        decode_ctx: np.ndarray,
        prefill_chunks: np.ndarray | None = None,
        prefill_offsets: np.ndarray | None = None,
    ) -> float:
        """Seconds for one step: decodes with contexts `decode_ctx`, prefill chunks of the given
        sizes that start at the given offsets into their prompts."""
        n_dec = int(decode_ctx.size)
        ctx_sum = float(decode_ctx.sum()) if n_dec else 0.0
        ctx_max = float(decode_ctx.max()) if n_dec else 0.0
        kv_read = (1.0 - self.heterogeneity) * ctx_sum + self.heterogeneity * n_dec * ctx_max
        attn_pairs = ctx_sum
        n_pre = 0.0
        if prefill_chunks is not None and prefill_chunks.size:
            chunks = prefill_chunks.astype(np.float64)
            offs = (
                prefill_offsets.astype(np.float64) if prefill_offsets is not None else np.zeros_like(chunks)
            )
            n_pre = float(chunks.sum())
            attn_pairs += float((chunks * (offs + (chunks + 1) / 2.0)).sum())
            kv_read += float((offs + chunks).sum())
        tokens = n_dec + n_pre
        if tokens == 0:
            return 0.0
        flops = 2.0 * self.params * tokens + self.attn_flops_per_ctx * attn_pairs
        mem = self.weight_bytes + self.kv_bytes_per_token * kv_read
        return (
            self.overhead_s
            + self.prefill_token_overhead_s * n_pre
            + max(flops / self.flops_per_s, mem / self.bytes_per_s)
        )

    def decode_step_time(self, batch: int, ctx: float) -> float:
        """A homogeneous decode-only step: the speed GMAX plans with (v_token)."""
        return self.step_time(np.full(max(batch, 1), ctx))

    def prefill_tokens_per_s(self, chunk: int = 512, offset: float = 0.0) -> float:
        t = self.step_time(np.zeros(0), np.asarray([chunk]), np.asarray([offset])) - self.overhead_s
        return chunk / max(t, 1e-9)

    def max_tokens_within(self, seconds: float, ctx: float = 1024.0) -> int:
        """time2bs: the largest token batch (1-token decodes of context `ctx`) within `seconds`."""
        lo, hi = 1, 1 << 16
        if self.step_time(np.full(1, ctx)) > seconds:
            return 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.step_time(np.zeros(0), np.asarray([mid]), np.asarray([ctx])) <= seconds:
                lo = mid
            else:
                hi = mid - 1
        return lo


_PROFILE_DIR = "profiles"


def profile_names() -> list[str]:
    files = resources.files("jitserve.sim").joinpath(_PROFILE_DIR)
    return sorted(p.name.removesuffix(".yaml") for p in files.iterdir() if p.name.endswith(".yaml"))


@cache
def load_profile(name_or_path: str) -> Profile:
    """A shipped profile by name (see `profile_names()`) or a YAML file path."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.exists():
        text = path.read_text()
    else:
        res = resources.files("jitserve.sim").joinpath(_PROFILE_DIR, f"{name_or_path}.yaml")
        if not res.is_file():
            raise ValueError(
                f"profile: unknown profile {name_or_path!r} (known: {', '.join(profile_names())})"
            )
        text = res.read_text()
    return Profile.model_validate(yaml.safe_load(text))
