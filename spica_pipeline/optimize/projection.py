"""Projection of a requested parallel feature vector onto the legal pool.

Vizier only sees a handful of structural features (GPU ratio, prefill share, per-engine GPU
targets, attention/FFN modes); the concrete shape (tp, dp, moe_ep, replicas, ...) is never a free
knob. Projection picks the legal config nearest to what the optimizer asked for. It is deterministic
and history-independent, so the same suggestion always maps to the same config (needed for dedup
and for replaying the ledger).
"""

import json
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from spica_pipeline.space.shapes import DisaggShape, ParallelConfig, RoleShape

FeatureValue = float | str

ATTENTION_ORDER = ("tp", "dp")
FFN_ORDER = ("ep", "tp")
# Features compared on a log2 scale; every other numeric feature is compared as is.
LOG_FEATURE_SUFFIX = "_num_gpus_per_engine_target"


def attention_mode(shape: RoleShape) -> str:
    """'dp' when attention is data-parallel; a 1-GPU engine is canonically 'tp'."""
    if shape.gpus_per_engine == 1:
        return "tp"
    return "dp" if shape.attention_dp > 1 else "tp"


def ffn_mode(shape: RoleShape) -> str:
    """'ep' when the experts are expert-parallel; a 1-GPU engine is canonically 'tp'."""
    if shape.gpus_per_engine == 1:
        return "tp"
    return "ep" if shape.moe_ep > 1 else "tp"


def pool_is_moe(pool: Sequence[ParallelConfig]) -> bool:
    return any(c.is_moe for c in pool)


def pool_budget(pool: Sequence[ParallelConfig], gpu_budget: float | None) -> float:
    """The branch budget, or the largest total in the pool when no budget is set (scales used_gpu_ratio)."""
    if gpu_budget:
        return float(gpu_budget)
    return float(max(c.used_gpus for c in pool))


def _role_features(prefix: str, shape: RoleShape, moe: bool) -> dict[str, FeatureValue]:
    out: dict[str, FeatureValue] = {
        f"{prefix}_num_gpus_per_engine_target": float(shape.gpus_per_engine),
        f"{prefix}_attention_mode": attention_mode(shape),
    }
    if moe:
        out[f"{prefix}_ffn_mode"] = ffn_mode(shape)
    return out


def config_features(config: ParallelConfig, gpu_budget: float, moe: bool) -> dict[str, FeatureValue]:
    """The structural feature vector of one config: numbers as floats, modes as strings."""
    out: dict[str, FeatureValue] = {"used_gpu_ratio": config.used_gpus / gpu_budget}
    if isinstance(config, DisaggShape):
        p, d = config.prefill.used_gpus, config.decode.used_gpus
        out["prefill_gpu_share"] = p / (p + d)
        out.update(_role_features("prefill", config.prefill, moe))
        out.update(_role_features("decode", config.decode, moe))
    elif isinstance(config, RoleShape):
        out.update(_role_features("agg", config, moe))
    else:
        raise TypeError(f"parallel config must be RoleShape or DisaggShape, got {type(config).__name__}")
    return out


def is_categorical_feature(name: str) -> bool:
    return name.endswith("_attention_mode") or name.endswith("_ffn_mode")


def _transform(name: str, value: float) -> float:
    return math.log2(value) if name.endswith(LOG_FEATURE_SUFFIX) else value


@dataclass(frozen=True)
class Projection:
    """Where a suggestion landed; `to_dict()` is written to the trial metadata `spica_projection`."""

    config: ParallelConfig
    requested_features: dict[str, FeatureValue] = field(default_factory=dict)
    actual_features: dict[str, FeatureValue] = field(default_factory=dict)
    distance: float = 0.0
    mode_projected: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "requested_features": dict(sorted(self.requested_features.items())),
            "actual_features": dict(sorted(self.actual_features.items())),
            "projection_distance": self.distance,
            "mode_projected": self.mode_projected,
            "actual_parallel_config": self.config.to_dict(),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


class PoolIndex:
    """A branch's pool with every config's features computed once.

    Projection runs for every suggestion and every neighbour a local designer looks at; computing
    the features of a large pool (bench/spaces/large_disagg.yaml) on each call would be a large
    share of a long sweep's main-thread time. Columns are built lazily, one per feature name.
    """

    def __init__(self, pool: Sequence[ParallelConfig], gpu_budget: float | None):
        self.pool = tuple(pool)
        self.budget = pool_budget(self.pool, gpu_budget) if self.pool else 0.0
        self.moe = pool_is_moe(self.pool)
        self.features = [config_features(c, self.budget, self.moe) for c in self.pool]
        self.position = {c: i for i, c in enumerate(self.pool)}
        self._numeric: dict[str, Any] = {}
        self._categorical: dict[str, Any] = {}
        self._rows: dict[str | None, Any] = {}

    def numeric(self, name: str) -> Any:
        """The feature's transformed values over the pool (float array)."""
        col = self._numeric.get(name)
        if col is None:
            col = self._numeric[name] = np.array([_transform(name, float(f[name])) for f in self.features])
        return col

    def categorical(self, name: str) -> Any:
        col = self._categorical.get(name)
        if col is None:
            col = self._categorical[name] = np.array([f.get(name) for f in self.features], dtype=object)
        return col

    def rows(self, backend: str | None, supported_backends: Sequence[Collection[str]]) -> Any:
        """Pool positions `backend` can run (all when None)."""
        got = self._rows.get(backend)
        if got is None:
            got = self._rows[backend] = np.array(
                [i for i, sup in enumerate(supported_backends) if backend is None or backend in sup], dtype=int)
        return got


def project(
    requested: Mapping[str, FeatureValue],
    backend: str | None,
    pool: Sequence[ParallelConfig],
    supported_backends: Sequence[Collection[str]],
    *,
    gpu_budget: float | None,
    exclude: Collection[ParallelConfig] = (),
    index: PoolIndex | None = None,
) -> Projection:
    """Pick the legal config nearest to `requested`: backend filter, fewest mode mismatches, smallest
    span-normalised distance, then the shape's sort key as tie-break.

    `exclude` removes configs from the candidates after the spans are measured (so distances stay
    comparable): the study loop passes the configs that would repeat an already-evaluated point,
    which moves a suggestion to its nearest unevaluated neighbour instead of a duplicate. When
    every candidate is excluded, the projection ignores `exclude`.

    A one-config pool is a strict pin: it is returned as is, without the backend filter (the study
    loop's triage reports an unsupported backend). Features absent from `requested` are ignored.
    `backend=None` skips the backend filter (a branch without a backend knob). `index` is the
    pool's `PoolIndex` when the caller keeps one (it must be built from the same pool and budget).
    """
    if not pool:
        raise ValueError("projection needs a non-empty parallel config pool")
    if len(supported_backends) != len(pool):
        raise ValueError(
            f"supported_backends has {len(supported_backends)} entries for {len(pool)} parallel configs"
        )
    if len(pool) == 1:
        actual = config_features(pool[0], pool_budget(pool, gpu_budget), pool_is_moe(pool))
        return Projection(pool[0], dict(requested), actual, 0.0, False)
    if index is None:
        index = PoolIndex(pool, gpu_budget)

    # 1. backend hard filter
    rows = index.rows(backend, supported_backends)
    if not len(rows):
        raise ValueError(f"backend {backend!r} has no valid parallel config in this branch")

    # 3 (spans first): R_j over every config this backend supports, before the mode filter
    first = index.features[rows[0]]
    numeric = [k for k in requested if not is_categorical_feature(k) and k in first]
    spans = {k: float(index.numeric(k)[rows].max() - index.numeric(k)[rows].min()) for k in numeric}

    if exclude:
        excluded = set(exclude)
        kept = np.array([i for i in rows if index.pool[i] not in excluded], dtype=int)
        if len(kept):
            rows = kept

    # 2. mode match: fewest categorical mismatches wins outright
    mismatches = np.zeros(len(rows), dtype=int)
    for k in requested:
        if is_categorical_feature(k):
            mismatches += index.categorical(k)[rows] != str(requested[k])
    best_mismatch = int(mismatches.min())
    rows = rows[mismatches == best_mismatch]

    # 4. nearest by the span-normalised distance; ties (after rounding away float noise) go to the
    # smallest sort key. Same arithmetic, term by term, as a Python loop over the candidates.
    dist = np.zeros(len(rows))
    for k in numeric:
        if spans[k] > 0:
            want = _transform(k, float(requested[k]))
            dist += ((index.numeric(k)[rows] - want) / spans[k]) ** 2
    near = np.flatnonzero(dist <= dist.min() + 1e-9)  # every row whose rounded distance can tie
    key, chosen = min(((round(float(dist[j]), 12), index.pool[rows[j]].sort_key()), int(rows[j])) for j in near)
    return Projection(
        config=index.pool[chosen],
        requested_features=dict(requested),
        actual_features=dict(index.features[chosen]),
        distance=key[0],
        mode_projected=best_mismatch > 0,
    )
