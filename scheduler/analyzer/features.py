"""Serving-time features of a request, as small integer codes shared by the length predictor,
the workload generator and the callers (router, simulator, vLLM adapter).

Everything here is cheap to compute from what a request carries when it is scheduled: no text.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from jitserve.scheduler.slo import SLOType

# Fixed codes (not enum order) so saved predictors stay valid if SLOType ever grows.
SLO_TYPE_CODE: dict[SLOType, int] = {
    SLOType.LATENCY: 0,
    SLOType.DEADLINE: 1,
    SLOType.COMPOUND: 2,
    SLOType.BEST_EFFORT: 3,
}
MAX_SLO_TYPE_CODE = 255
# Class and model codes are caller-assigned small integers (e.g. the index of an SLOClass or a model
# name in a registry); 16 bits each lets one int64 key hold a whole categorical context.
MAX_CATEGORY_CODE = 65_535

# Log-spaced length buckets: 4 per octave (bucket edges ~19% apart). The bucketed forest covers
# within 1 point of one on raw lengths (docs/benchmarks/analyzer.md); finer buckets cost table cells.
PROMPT_BUCKETS_PER_OCTAVE = 4

IntArray = npt.NDArray[np.int64]


def slo_type_code(slo_type: SLOType | str) -> int:
    """The integer code of an SLO type ('latency', 'deadline', 'compound', 'best-effort')."""
    try:
        return SLO_TYPE_CODE[SLOType(slo_type)]
    except ValueError:
        known = ", ".join(t.value for t in SLOType)
        raise ValueError(f"slo_type: unknown SLO type {slo_type!r} (known: {known})") from None


def as_int_array(name: str, values: npt.ArrayLike, minimum: int, maximum: int | None = None) -> IntArray:
    """`values` as a 1-d int64 array, or a ValueError that names the field and the offending entry."""
    arr = np.asarray(values)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1:
        raise ValueError(f"{name}: expected a 1-d array, got shape {arr.shape}")
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{name}: must be finite, got {arr[~np.isfinite(arr)][0]!r}")
        if np.any(arr != np.floor(arr)):
            raise ValueError(f"{name}: must be whole numbers of tokens/codes")
    elif arr.dtype.kind not in "iub":
        raise ValueError(f"{name}: must be integers, got dtype {arr.dtype}")
    out = arr.astype(np.int64, copy=False)
    if out.size and out.min() < minimum:
        bad = int(np.argmin(out))
        raise ValueError(f"{name}: must be >= {minimum}, got {int(out[bad])} at index {bad}")
    if maximum is not None and out.size and out.max() > maximum:
        bad = int(np.argmax(out))
        raise ValueError(f"{name}: must be <= {maximum}, got {int(out[bad])} at index {bad}")
    return out


def prompt_bucket(prompt_len: IntArray) -> IntArray:
    """Log-spaced bucket index of a prompt length (0 for an empty prompt)."""
    return np.floor(PROMPT_BUCKETS_PER_OCTAVE * np.log2(prompt_len + 1.0)).astype(np.int64)


def max_tokens_level(max_tokens: IntArray) -> IntArray:
    """ceil(log2(max_tokens)): max_tokens matters through truncation, which an octave captures."""
    return np.ceil(np.log2(np.maximum(max_tokens, 1).astype(np.float64))).astype(np.int64)


def context_key(
    slo_type: IntArray, class_code: IntArray, model_code: IntArray, mt_level: IntArray
) -> IntArray:
    """One int64 per categorical context (SLO type, class, model, max_tokens octave)."""
    return (slo_type << 48) | (class_code << 32) | (model_code << 16) | mt_level
