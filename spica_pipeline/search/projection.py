"""Projection of a requested parallel feature vector onto the legal pool (spec §6.3).

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

from spica_pipeline.search.shapes import DisaggShape, ParallelConfig, RoleShape

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
    """The branch budget, or the largest total in the pool when no budget is set (spec §6.2)."""
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


def project(
    requested: Mapping[str, FeatureValue],
    backend: str | None,
    pool: Sequence[ParallelConfig],
    supported_backends: Sequence[Collection[str]],
    *,
    gpu_budget: float | None,
    exclude: Collection[ParallelConfig] = (),
) -> Projection:
    """Pick the legal config nearest to `requested` (spec §6.3 steps 1-4).

    `exclude` removes configs from the candidates after the spans are measured (so distances stay
    comparable): the study loop passes the configs that would repeat an already-evaluated point,
    which moves a suggestion to its nearest unevaluated neighbour instead of a duplicate. When
    every candidate is excluded, the projection ignores `exclude`.

    A one-config pool is a strict pin: it is returned as is, without the backend filter (the study
    loop's triage reports an unsupported backend). Features absent from `requested` are ignored.
    `backend=None` skips the backend filter (a branch without a backend knob).
    """
    if not pool:
        raise ValueError("projection needs a non-empty parallel config pool")
    if len(supported_backends) != len(pool):
        raise ValueError(
            f"supported_backends has {len(supported_backends)} entries for {len(pool)} parallel configs"
        )
    budget = pool_budget(pool, gpu_budget)
    moe = pool_is_moe(pool)
    if len(pool) == 1:
        actual = config_features(pool[0], budget, moe)
        return Projection(pool[0], dict(requested), actual, 0.0, False)

    # 1. backend hard filter
    if backend is None:
        candidates = list(pool)
    else:
        candidates = [c for c, sup in zip(pool, supported_backends) if backend in sup]
        if not candidates:
            raise ValueError(f"backend {backend!r} has no valid parallel config in this branch")
    feats = [config_features(c, budget, moe) for c in candidates]

    # 3 (spans first): R_j over every config this backend supports, before the mode filter
    numeric = [k for k in requested if not is_categorical_feature(k) and k in feats[0]]
    spans: dict[str, float] = {}
    for k in numeric:
        vals = [_transform(k, float(f[k])) for f in feats]
        spans[k] = max(vals) - min(vals)

    if exclude:
        excluded = set(exclude)
        kept = [(c, f) for c, f in zip(candidates, feats) if c not in excluded]
        if kept:
            candidates, feats = [c for c, _ in kept], [f for _, f in kept]

    # 2. mode match: fewest categorical mismatches wins outright
    categorical = [k for k in requested if is_categorical_feature(k)]
    mismatches = [sum(1 for k in categorical if f.get(k) != str(requested[k])) for f in feats]
    best_mismatch = min(mismatches)

    best: tuple[float, tuple[int, ...]] | None = None
    chosen = -1
    for i, (c, f) in enumerate(zip(candidates, feats)):
        if mismatches[i] != best_mismatch:
            continue
        dist = 0.0
        for k in numeric:
            if spans[k] > 0:
                want = _transform(k, float(requested[k]))
                dist += ((_transform(k, float(f[k])) - want) / spans[k]) ** 2
        key = (round(dist, 12), c.sort_key())  # rounding: float noise must not beat the tie-break
        if best is None or key < best:
            best, chosen = key, i
    assert best is not None
    return Projection(
        config=candidates[chosen],
        requested_features=dict(requested),
        actual_features=feats[chosen],
        distance=best[0],
        mode_projected=best_mismatch > 0,
    )
