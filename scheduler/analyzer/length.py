"""Conservative output-length upper bound (JITServe §4.1): a quantile regression forest, served
from a lookup table.

Training: every finished request of output length L emits rows at generated g = 0, 50, 100, ... < L
with target L, so the forest learns L | (features, "has already generated g tokens") and the bound
is conditional on progress, refreshed every `refresh_tokens` (50, the paper's granularity).

Serving: a 300-tree forest costs ~50 ms per single-row predict, far too slow for 1,000 active
requests every frame. All features are small integers (log-spaced prompt bucket, g // 50, SLO type,
class, model, max_tokens octave), so at fit time we evaluate the forest once on every cell of the
grid the training data covers and answer queries by numpy indexing. Within the training support the
table equals the forest's prediction exactly (a test checks it); outside it we fall back:
- unseen categorical context, or more tokens generated than any training request of that context
  had: max_tokens (the only safe bound);
- prompt bucket outside the context's seen range: the nearest seen bucket (trees cannot split beyond
  the data, so this is what the forest itself would mostly do).
The bound is always clamped to [generated + 1, max_tokens]. Before `min_history_requests` finished
requests it is max_tokens.

Persistence: `save` writes a NumPy .npz (arrays only, loaded with allow_pickle=False) holding the
history and the table; the forest is not saved (it is rebuilt by `fit`), so no pickle is involved.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from jitserve.scheduler.analyzer.features import (
    MAX_CATEGORY_CODE,
    MAX_SLO_TYPE_CODE,
    IntArray,
    as_int_array,
    context_key,
    max_tokens_level,
    prompt_bucket,
)

FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class LengthPredictorConfig:
    """Knobs of the length predictor; defaults are the paper's where it has them (§6.1)."""

    quantile: float = 0.9
    n_estimators: int = 300  # paper §6.1
    max_depth: int = 150  # paper §6.1
    # 50 rows per leaf (not the library's 1) and all leaf rows kept for the quantile (Meinshausen's
    # QRF, not the library's one-sample-per-leaf default): deep 1-row leaves under-cover held-out
    # data (82% for a 90% bound on the synthetic workload; 89-90% with these settings).
    min_samples_leaf: int = 50
    max_samples_leaf: int | None = None
    refresh_tokens: int = 50  # paper §4.1: re-predict every 50 generated tokens
    min_history_requests: int = 200  # below this the bound is max_tokens
    history_requests_cap: int = 5_000  # ring buffer of finished requests
    training_rows_cap: int = 20_000  # rows per fit, uniformly subsampled beyond this
    refit_every_requests: int = 500  # maybe_refit() threshold of newly finished requests
    n_jobs: int = 1  # forest threads; the engine shares its cores
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.5 < self.quantile < 1.0:
            raise ValueError(f"quantile: must be in (0.5, 1), got {self.quantile}")
        for name in (
            "n_estimators",
            "max_depth",
            "min_samples_leaf",
            "refresh_tokens",
            "min_history_requests",
            "history_requests_cap",
            "training_rows_cap",
            "refit_every_requests",
            "n_jobs",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be a positive integer, got {value!r}")
        if self.max_samples_leaf is not None and self.max_samples_leaf < 1:
            raise ValueError(
                f"max_samples_leaf: must be a positive integer or None, got {self.max_samples_leaf!r}"
            )


@dataclass(frozen=True, slots=True)
class RequestFeatures:
    """Validated, vectorized serving-time features of n requests (all int64 arrays of length n)."""

    prompt_len: IntArray
    generated: IntArray
    slo_type: IntArray
    class_code: IntArray
    model_code: IntArray
    max_tokens: IntArray

    @classmethod
    def of(
        cls,
        prompt_len: npt.ArrayLike,
        generated: npt.ArrayLike,
        slo_type_code: npt.ArrayLike,
        class_code: npt.ArrayLike,
        model_code: npt.ArrayLike,
        max_tokens: npt.ArrayLike,
    ) -> RequestFeatures:
        cols = (
            as_int_array("prompt_len", prompt_len, 0),
            as_int_array("generated", generated, 0),
            as_int_array("slo_type_code", slo_type_code, 0, MAX_SLO_TYPE_CODE),
            as_int_array("class_code", class_code, 0, MAX_CATEGORY_CODE),
            as_int_array("model_code", model_code, 0, MAX_CATEGORY_CODE),
            as_int_array("max_tokens", max_tokens, 1),
        )
        n = max(c.size for c in cols)
        names = ("prompt_len", "generated", "slo_type_code", "class_code", "model_code", "max_tokens")
        for name, c in zip(names, cols, strict=True):
            if c.size not in (1, n):
                raise ValueError(f"{name}: length {c.size} does not match the other fields ({n})")
        full = [np.broadcast_to(c, (n,)) for c in cols]
        return cls(*full)

    def matrix(self, refresh_tokens: int) -> npt.NDArray[np.float64]:
        """The forest's feature matrix: every column a small integer (see module docstring)."""
        return np.column_stack(
            (
                prompt_bucket(self.prompt_len),
                self.generated // refresh_tokens,
                self.slo_type,
                self.class_code,
                self.model_code,
                max_tokens_level(self.max_tokens),
            )
        ).astype(np.float64)

    def context(self) -> IntArray:
        return context_key(self.slo_type, self.class_code, self.model_code, max_tokens_level(self.max_tokens))


def training_rows(
    finished: RequestFeatures, output_len: IntArray, refresh_tokens: int
) -> tuple[RequestFeatures, IntArray]:
    """Rows at generated = 0, refresh, 2*refresh, ... < L for each finished request of length L.

    `finished.generated` is ignored. Returns (row features, row targets).
    """
    lengths = np.maximum(output_len, 1)
    per_request = (lengths - 1) // refresh_tokens + 1  # count of multiples of refresh below L
    owner = np.repeat(np.arange(lengths.size), per_request)
    # position of each row within its request: 0, 1, 2, ...
    starts = np.cumsum(per_request) - per_request
    step = np.arange(owner.size) - np.repeat(starts, per_request)
    rows = RequestFeatures(
        prompt_len=finished.prompt_len[owner],
        generated=step * refresh_tokens,
        slo_type=finished.slo_type[owner],
        class_code=finished.class_code[owner],
        model_code=finished.model_code[owner],
        max_tokens=finished.max_tokens[owner],
    )
    return rows, lengths[owner]


@dataclass(frozen=True, slots=True)
class LengthTable:
    """The forest evaluated on the grid of its training support, flattened.

    Context i (sorted `keys`) owns cells offsets[i] : offsets[i] + n_prompt[i] * n_gen[i], laid out
    prompt-bucket-major; prompt buckets start at prompt_min[i], generated buckets at 0.
    """

    keys: IntArray
    offsets: IntArray
    prompt_min: IntArray
    n_prompt: IntArray
    n_gen: IntArray
    bounds: IntArray  # ceil of the forest's quantile, per cell
    refresh_tokens: int

    def lookup(self, features: RequestFeatures) -> IntArray:
        """Table bound per request, or max_tokens where the request is outside the support."""
        keys = features.context()
        pos = np.searchsorted(self.keys, keys)
        pos = np.minimum(pos, self.keys.size - 1)
        gen_bucket = features.generated // self.refresh_tokens
        in_support = (self.keys[pos] == keys) & (gen_bucket < self.n_gen[pos])
        p = np.clip(prompt_bucket(features.prompt_len) - self.prompt_min[pos], 0, self.n_prompt[pos] - 1)
        cell = self.offsets[pos] + p * self.n_gen[pos] + np.where(in_support, gen_bucket, 0)
        return np.where(in_support, self.bounds[cell], features.max_tokens)

    def grid(self, key_fields: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        """The feature matrix of every cell, in table order (used to build and to verify it)."""
        blocks = []
        for i, (slo, cls_, model, mt) in enumerate(key_fields):
            p = np.repeat(np.arange(self.n_prompt[i]) + self.prompt_min[i], self.n_gen[i])
            g = np.tile(np.arange(self.n_gen[i]), self.n_prompt[i])
            const = np.broadcast_to(np.array([slo, cls_, model, mt]), (p.size, 4))
            blocks.append(np.column_stack((p, g, const)))
        return np.vstack(blocks).astype(np.float64)


def _split_key(keys: IntArray) -> npt.NDArray[np.int64]:
    return np.column_stack(((keys >> 48) & 0xFF, (keys >> 32) & 0xFFFF, (keys >> 16) & 0xFFFF, keys & 0xFFFF))


def clamp_bounds(raw: IntArray, features: RequestFeatures) -> IntArray:
    """Clamp to [generated + 1, max_tokens]: at least one more token, never past the hard cap."""
    low = np.minimum(features.generated + 1, features.max_tokens)
    return np.clip(raw, low, features.max_tokens).astype(np.int64)


class LengthPredictor:
    """Online QRF length upper bound with a table-backed vectorized query path.

    Thread model: `observe*` and `fit` may run on a background thread; queries read one immutable
    table reference, swapped atomically by `fit`.
    """

    def __init__(self, config: LengthPredictorConfig | None = None) -> None:
        self.config = config or LengthPredictorConfig()
        cap = self.config.history_requests_cap
        # Ring buffer of finished requests: prompt, output, slo type, class, model, max_tokens.
        self._history = np.zeros((cap, 6), dtype=np.int64)
        self._history_count = 0  # valid entries (<= cap)
        self._history_head = 0  # next slot to write
        self._observed_total = 0
        self._observed_at_fit = 0
        self._table: LengthTable | None = None
        self._forest: object | None = None
        self._lock = threading.Lock()  # serializes writers (observe, fit); readers never take it

    # ----------------------------------------------------------------------------------- history
    def observe(
        self,
        prompt_len: int,
        output_len: int,
        slo_type_code: int,
        class_code: int,
        model_code: int,
        max_tokens: int,
    ) -> None:
        """Record one finished request."""
        self.observe_many(
            [prompt_len], [output_len], [slo_type_code], [class_code], [model_code], [max_tokens]
        )

    def observe_many(
        self,
        prompt_len: npt.ArrayLike,
        output_len: npt.ArrayLike,
        slo_type_code: npt.ArrayLike,
        class_code: npt.ArrayLike,
        model_code: npt.ArrayLike,
        max_tokens: npt.ArrayLike,
    ) -> None:
        """Record finished requests (vectorized); the oldest are overwritten beyond the cap."""
        out = as_int_array("output_len", output_len, 1)
        others = (prompt_len, slo_type_code, class_code, model_code, max_tokens)
        n = max(out.size, *(np.size(x) for x in others))
        if out.size not in (1, n):
            raise ValueError(f"output_len: length {out.size} does not match the other fields ({n})")
        # output_len rides in the `generated` slot only to share validation and broadcasting
        f = RequestFeatures.of(prompt_len, out, slo_type_code, class_code, model_code, max_tokens)
        rows = np.column_stack(
            (f.prompt_len, f.generated, f.slo_type, f.class_code, f.model_code, f.max_tokens)
        )
        cap = self.config.history_requests_cap
        with self._lock:
            rows = rows[-cap:]
            slots = (self._history_head + np.arange(rows.shape[0])) % cap
            self._history[slots] = rows
            self._history_head = int((self._history_head + rows.shape[0]) % cap)
            self._history_count = min(cap, self._history_count + rows.shape[0])
            self._observed_total += int(out.size)

    @property
    def history_size(self) -> int:
        """Finished requests currently held (never more than `history_requests_cap`)."""
        return self._history_count

    @property
    def trained(self) -> bool:
        return self._table is not None

    @property
    def table(self) -> LengthTable | None:
        return self._table

    def history(self) -> npt.NDArray[np.int64]:
        """A copy of the held finished requests, oldest first, columns as in `observe`."""
        n, cap = self._history_count, self.config.history_requests_cap
        order = (self._history_head - n + np.arange(n)) % cap
        return self._history[order].copy()

    # -------------------------------------------------------------------------------------- fit
    def refit_due(self) -> bool:
        """Enough requests finished since the last fit (or history suffices for the first one)."""
        new = self._observed_total - self._observed_at_fit
        return (not self.trained and self._history_count >= self.config.min_history_requests) or (
            self.trained and new >= self.config.refit_every_requests
        )

    def maybe_refit(self) -> bool:
        """Fit if `refit_due()`."""
        return self.fit() if self.refit_due() else False

    def fit(self) -> bool:
        """Train the forest on the history and rebuild the table. False if history is too short."""
        from quantile_forest import RandomForestQuantileRegressor  # heavy import, only when fitting

        cfg = self.config
        with self._lock:
            hist = self.history()
            observed = self._observed_total
        if hist.shape[0] < cfg.min_history_requests:
            return False
        finished = RequestFeatures.of(hist[:, 0], 0, hist[:, 2], hist[:, 3], hist[:, 4], hist[:, 5])
        rows, targets = training_rows(finished, hist[:, 1], cfg.refresh_tokens)
        if targets.size > cfg.training_rows_cap:
            # uniform subsample keeps every conditional distribution L | (x, g) unbiased
            keep = np.sort(np.random.default_rng(cfg.seed).choice(targets.size, cfg.training_rows_cap, False))
            rows = RequestFeatures(*(getattr(rows, n)[keep] for n in RequestFeatures.__slots__))
            targets = targets[keep]
        x = rows.matrix(cfg.refresh_tokens)
        forest = RandomForestQuantileRegressor(
            n_estimators=cfg.n_estimators,
            max_depth=cfg.max_depth,
            min_samples_leaf=cfg.min_samples_leaf,
            max_samples_leaf=cfg.max_samples_leaf,
            random_state=cfg.seed,
            n_jobs=cfg.n_jobs,
        )
        forest.fit(x, targets.astype(np.float64))
        table = self._build_table(forest, rows, x)
        with self._lock:
            self._forest, self._table = forest, table
            self._observed_at_fit = observed
        return True

    def _build_table(self, forest: object, rows: RequestFeatures, x: npt.NDArray[np.float64]) -> LengthTable:
        keys = rows.context()
        uniq, inverse = np.unique(keys, return_inverse=True)
        pb, gb = x[:, 0].astype(np.int64), x[:, 1].astype(np.int64)
        prompt_min = np.full(uniq.size, np.iinfo(np.int64).max)
        prompt_max = np.full(uniq.size, -1)
        gen_max = np.full(uniq.size, -1)
        np.minimum.at(prompt_min, inverse, pb)
        np.maximum.at(prompt_max, inverse, pb)
        np.maximum.at(gen_max, inverse, gb)
        n_prompt, n_gen = prompt_max - prompt_min + 1, gen_max + 1
        sizes = n_prompt * n_gen
        offsets = np.cumsum(sizes) - sizes
        table = LengthTable(
            keys=uniq,
            offsets=offsets,
            prompt_min=prompt_min,
            n_prompt=n_prompt,
            n_gen=n_gen,
            bounds=np.zeros(int(sizes.sum()), dtype=np.int64),
            refresh_tokens=self.config.refresh_tokens,
        )
        grid = table.grid(_split_key(uniq))
        # Cells that land in the same leaf of every tree get the same quantile: predict each distinct
        # leaf vector once (about 40% of the cells on the synthetic workload; exact, not approximate).
        leaves = np.ascontiguousarray(forest.apply(grid))  # type: ignore[attr-defined]
        rows = leaves.view(np.dtype((np.void, leaves.dtype.itemsize * leaves.shape[1]))).ravel()
        _, first, inverse = np.unique(rows, return_index=True, return_inverse=True)
        pred = forest.predict(grid[first], quantiles=self.config.quantile)  # type: ignore[attr-defined]
        table.bounds[:] = np.ceil(np.asarray(pred, dtype=np.float64) - 1e-9).astype(np.int64)[inverse.ravel()]
        return table

    # ----------------------------------------------------------------------------------- queries
    def upper_bounds(
        self,
        prompt_len: npt.ArrayLike,
        generated: npt.ArrayLike,
        slo_type_code: npt.ArrayLike,
        class_code: npt.ArrayLike,
        model_code: npt.ArrayLike,
        max_tokens: npt.ArrayLike,
    ) -> IntArray:
        """Output-length upper bounds (total tokens, not remaining) for n active requests.

        Scalars broadcast. Use `upper_bounds_features` to skip validation on a pre-built batch.
        """
        features = RequestFeatures.of(
            prompt_len, generated, slo_type_code, class_code, model_code, max_tokens
        )
        return self.upper_bounds_features(features)

    def upper_bounds_features(self, features: RequestFeatures) -> IntArray:
        table = self._table  # one read: a concurrent fit swaps the reference, never mutates it
        raw = features.max_tokens if table is None else table.lookup(features)
        return clamp_bounds(raw, features)

    def upper_bound(
        self,
        prompt_len: int,
        generated: int,
        slo_type_code: int,
        class_code: int,
        model_code: int,
        max_tokens: int,
    ) -> int:
        """Scalar convenience wrapper of `upper_bounds`."""
        return int(
            self.upper_bounds(prompt_len, generated, slo_type_code, class_code, model_code, max_tokens)[0]
        )

    def upper_bounds_exact(
        self,
        prompt_len: npt.ArrayLike,
        generated: npt.ArrayLike,
        slo_type_code: npt.ArrayLike,
        class_code: npt.ArrayLike,
        model_code: npt.ArrayLike,
        max_tokens: npt.ArrayLike,
    ) -> IntArray:
        """The same bound computed by the forest itself (slow; for comparison and verification).

        Applies the same support rules as the table. Needs a forest in memory: after `load`, call
        `fit()` first.
        """
        features = RequestFeatures.of(
            prompt_len, generated, slo_type_code, class_code, model_code, max_tokens
        )
        table, forest = self._table, self._forest
        if table is None:
            return clamp_bounds(features.max_tokens, features)
        if forest is None:
            raise RuntimeError(
                "upper_bounds_exact: no forest in memory (loaded from disk?); call fit() first"
            )
        x = features.matrix(self.config.refresh_tokens)
        keys = features.context()
        pos = np.minimum(np.searchsorted(table.keys, keys), table.keys.size - 1)
        in_support = (table.keys[pos] == keys) & (x[:, 1].astype(np.int64) < table.n_gen[pos])
        # same prompt-range rule as the table: clamp to the context's seen buckets
        x[:, 0] = np.clip(x[:, 0], table.prompt_min[pos], table.prompt_min[pos] + table.n_prompt[pos] - 1)
        raw = features.max_tokens.copy()
        if np.any(in_support):
            pred = forest.predict(x[in_support], quantiles=self.config.quantile)  # type: ignore[attr-defined]
            raw[in_support] = np.ceil(np.asarray(pred, dtype=np.float64) - 1e-9).astype(np.int64)
        return clamp_bounds(raw, features)

    # ------------------------------------------------------------------------------ persistence
    def save(self, path: str | os.PathLike[str]) -> None:
        """Write history, table and config to `path` (.npz, arrays only; atomic rename)."""
        path = Path(path)
        arrays: dict[str, npt.NDArray[np.generic]] = {
            "meta": np.array(
                json.dumps(
                    {
                        "format": FORMAT_VERSION,
                        "config": asdict(self.config),
                        "observed_total": self._observed_total,
                        "observed_at_fit": self._observed_at_fit,
                    }
                )
            ),
            "history": self.history(),
        }
        table = self._table
        if table is not None:
            for name in ("keys", "offsets", "prompt_min", "n_prompt", "n_gen", "bounds"):
                arrays[f"table_{name}"] = getattr(table, name)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as fh:
            np.savez_compressed(fh, **arrays)  # type: ignore[arg-type]
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> LengthPredictor:
        """Read a file written by `save`. Never unpickles (allow_pickle=False)."""
        with np.load(Path(path), allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            if meta.get("format") != FORMAT_VERSION:
                raise ValueError(f"format: unsupported length predictor file version {meta.get('format')!r}")
            predictor = cls(LengthPredictorConfig(**meta["config"]))
            hist = data["history"].astype(np.int64)
            if hist.ndim != 2 or hist.shape[1] != 6:
                raise ValueError(f"history: expected shape (n, 6), got {hist.shape}")
            if hist.shape[0]:
                predictor.observe_many(*(hist[:, i] for i in (0, 1, 2, 3, 4, 5)))
            predictor._observed_total = int(meta["observed_total"])
            predictor._observed_at_fit = int(meta["observed_at_fit"])
            if "table_keys" in data:
                predictor._table = LengthTable(
                    **{n: data[f"table_{n}"].astype(np.int64) for n in _TABLE_ARRAYS},
                    refresh_tokens=predictor.config.refresh_tokens,
                )
        return predictor


_TABLE_ARRAYS = ("keys", "offsets", "prompt_min", "n_prompt", "n_gen", "bounds")
