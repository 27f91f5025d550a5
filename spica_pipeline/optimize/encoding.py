"""Optimizer-independent search-space encoding of one branch and its decoding.

The encoding is plain data (`ParamSpec`s): `optimize/vizier.py` turns it into a Vizier problem,
the exhaustive policy walks it with `enumerate_space`, and the study loop decodes suggestions with
`SearchEncoding.decode` and replays ledger history with `SearchEncoding.encode`.
"""

import itertools
import math
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal

from spica_pipeline.optimize.projection import (
    ATTENTION_ORDER,
    FFN_ORDER,
    FeatureValue,
    PoolIndex,
    Projection,
    config_features,
    is_categorical_feature,
    pool_budget,
    pool_is_moe,
    project,
)
from spica_pipeline.space.shapes import ParallelConfig

if TYPE_CHECKING:
    from spica_pipeline.space.branches import BranchSpace

ParamKind = Literal["double", "discrete", "categorical"]
ParamRole = Literal["feature", "knob", "float", "internal"]

CONSTANT_PARAM = "_spica_constant"
FLOAT_TOL = 1e-9


@dataclass(frozen=True)
class ParamSpec:
    """One optimizer parameter. `values` for discrete (sorted floats) / categorical (strings);
    `bounds` for double. `role` says how decoding treats it."""

    name: str
    kind: ParamKind
    values: tuple = ()
    bounds: tuple[float, float] | None = None
    scale: Literal["linear", "log"] = "linear"
    default: float | str | None = None
    role: ParamRole = "knob"
    indexed: bool = False  # categorical over entry indices "0".."n-1" (composites with dict entries)


def _dedupe(choices: Sequence[Any]) -> list[Any]:
    """De-duplicate non-dict choices keeping order; dict entries are all kept (each is its own preset)."""
    out: list[Any] = []
    seen: set = set()
    for c in choices:
        if isinstance(c, dict):
            out.append(c)
            continue
        key = (type(c).__name__, c) if isinstance(c, bool) else c
        try:
            if key in seen:
                continue
            seen.add(key)
        except TypeError:  # unhashable non-dict (a list): keep it, compared by equality later
            if c in out:
                continue
        out.append(c)
    return out


def _is_number(c: Any) -> bool:
    return isinstance(c, (int, float)) and not isinstance(c, bool)


def _nearest_log(values: Sequence[float], target: float) -> float:
    """Feasible value nearest to target in log space; ties go to the smaller."""
    return min(values, key=lambda v: (round(abs(math.log2(v) - math.log2(target)), 9), v))


@dataclass(frozen=True)
class SearchEncoding:
    """The parameters of one branch, the constants injected into every selection, and what
    decoding and projection need (pool, supports, feature defaults, original knob entries)."""

    deployment_mode: str
    params: tuple[ParamSpec, ...]
    constants: dict[str, Any]
    parallel_configs: tuple[ParallelConfig, ...]
    supported_backends: tuple[tuple[str, ...], ...]
    gpu_budget: float
    is_moe: bool
    feature_defaults: dict[str, FeatureValue]
    knob_entries: dict[str, tuple[Any, ...]] = field(default_factory=dict)

    # ----- introspection -------------------------------------------------------------------
    @property
    def pinned_config(self) -> ParallelConfig | None:
        """The single config of a one-config pool (a strict pin that bypasses projection)."""
        return self.parallel_configs[0] if len(self.parallel_configs) == 1 else None

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def param(self, name: str) -> ParamSpec:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    @property
    def is_finite(self) -> bool:
        """True when every parameter is discrete or categorical (exhaustive enumeration works)."""
        return all(p.kind != "double" or p.role == "feature" for p in self.params)

    def supports(self, selection: Mapping[str, Any], config: ParallelConfig) -> bool:
        """Whether the selection's backend can run `config` (no backend knob: always). Projection
        only ever picks such a config, except a one-config pool, which is a strict pin."""
        backend = selection.get("backend")
        if backend is None:
            return True
        position = self.pool_index.position.get(config)
        if position is None:
            raise ValueError(f"{config} is not in this branch's pool")
        return backend in self.supported_backends[position]

    @cached_property
    def pool_index(self) -> PoolIndex:
        """The pool's features and positions, computed once (projection and `supports` run for
        every suggestion and every neighbour a local designer considers)."""
        return PoolIndex(self.parallel_configs, self.gpu_budget)

    def features_of(self, config: ParallelConfig) -> dict[str, FeatureValue]:
        return config_features(config, self.gpu_budget, self.is_moe)

    # ----- decode ----------------------------------------------------------------------------
    def decode(self, parameters: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, FeatureValue]]:
        """Optimizer parameters -> (selection, requested_features).

        The selection holds `deployment_mode`, the constants and every decoded knob. The requested
        features hold every structural feature (missing ones take their default); they are empty
        for a pinned single config.
        """
        selection: dict[str, Any] = {"deployment_mode": self.deployment_mode, **self.constants}
        requested: dict[str, FeatureValue] = {}
        if self.pinned_config is None:
            requested = dict(self.feature_defaults)
        for p in self.params:
            if p.role == "internal":
                continue
            if p.name not in parameters:
                if p.role == "feature":
                    continue  # the default stays
                if p.default is None:
                    raise ValueError(f"suggestion lacks parameter {p.name!r}")
                raw: Any = p.default
            else:
                raw = parameters[p.name]
            value = self._decode_value(p, raw)
            if p.role == "feature":
                requested[p.name] = value
            else:
                selection[p.name] = value
        return selection, requested

    def _decode_value(self, p: ParamSpec, raw: Any) -> Any:
        if p.kind == "double":
            lo, hi = p.bounds  # type: ignore[misc]
            return min(max(float(raw), lo), hi)
        if p.kind == "discrete":
            x = float(raw)
            v = min(p.values, key=lambda c: (abs(c - x), c))  # snap to the domain
            if p.role == "knob" and all(_is_number(e) and isinstance(e, int) for e in self.knob_entries[p.name]):
                return int(round(v))
            return float(v)
        # categorical
        s = str(raw)
        if p.indexed:
            idx = int(round(float(s)))
            entries = self.knob_entries[p.name]
            if not 0 <= idx < len(entries):
                raise ValueError(f"parameter {p.name!r}: index {s!r} out of range 0..{len(entries) - 1}")
            return entries[idx]
        if s not in p.values:
            raise ValueError(f"parameter {p.name!r}: {s!r} is not one of {list(p.values)}")
        return s

    # ----- encode (the inverse) --------------------------------------------------------------
    def encode(self, selection: Mapping[str, Any], parallel_config: ParallelConfig) -> dict[str, Any]:
        """(selection, config) -> optimizer parameters: feature parameters take the config's
        actual features. Used for warm-start / exhaustive trials and to replay ledger rows that
        carry no raw parameters. Raises ValueError naming the knob when a value is not in the space."""
        feats = self.features_of(parallel_config) if self.pinned_config is None else {}
        out: dict[str, Any] = {}
        for p in self.params:
            if p.role == "internal":
                out[p.name] = "0"
                continue
            if p.role == "feature":
                v = feats[p.name]
                out[p.name] = v if p.kind == "categorical" else float(v)
                continue
            if p.name not in selection:
                raise ValueError(f"selection lacks knob {p.name!r}")
            v = selection[p.name]
            if p.kind == "double":
                out[p.name] = float(v)
            elif p.kind == "discrete":
                if not _is_number(v) or not any(abs(float(v) - c) <= FLOAT_TOL for c in p.values):
                    raise ValueError(f"knob {p.name!r}: {v!r} is not one of {list(p.values)}")
                out[p.name] = float(v)
            else:
                entries = self.knob_entries.get(p.name, ())
                if p.indexed:
                    idx = next((i for i, e in enumerate(entries) if _same(e, v)), None)
                    if idx is None:
                        raise ValueError(f"knob {p.name!r}: {v!r} is not one of its choices")
                    out[p.name] = str(idx)
                else:
                    if str(v) not in p.values or not isinstance(v, str):
                        raise ValueError(f"knob {p.name!r}: {v!r} is not one of {list(p.values)}")
                    out[p.name] = v
        return out

    # ----- projection ------------------------------------------------------------------------
    def project(
        self,
        selection: Mapping[str, Any],
        requested: Mapping[str, FeatureValue],
        exclude: Collection[ParallelConfig] = (),
    ) -> Projection:
        """Projection of a decoded suggestion onto the pool (a pinned config bypasses it);
        `exclude` lists configs that would repeat an evaluated point (see `projection.project`)."""
        return project(
            requested,
            selection.get("backend"),
            self.parallel_configs,
            self.supported_backends,
            gpu_budget=self.gpu_budget,
            exclude=exclude,
            index=self.pool_index,
        )


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


# ----- building ------------------------------------------------------------------------------
def _feature_params(
    pool: Sequence[ParallelConfig], budget: float, moe: bool
) -> tuple[list[ParamSpec], dict[str, FeatureValue]]:
    """Structured parallel parameters (only when the pool has >1 config) and every feature's default."""
    feats = [config_features(c, budget, moe) for c in pool]
    names = list(feats[0])
    params: list[ParamSpec] = []
    defaults: dict[str, FeatureValue] = {}
    for name in names:
        vals = [f[name] for f in feats]
        if is_categorical_feature(name):
            order = FFN_ORDER if name.endswith("_ffn_mode") else ATTENTION_ORDER
            present = tuple(m for m in order if m in vals)
            default: FeatureValue = present[0]
            spec = ParamSpec(name, "categorical", values=present, default=default, role="feature")
            n_distinct = len(present)
        elif name.endswith("_num_gpus_per_engine_target"):
            distinct = tuple(sorted({float(v) for v in vals}))
            default = _nearest_log(distinct, math.sqrt(distinct[0] * distinct[-1]))
            spec = ParamSpec(name, "discrete", values=distinct, scale="log", default=default, role="feature")
            n_distinct = len(distinct)
        else:  # used_gpu_ratio, prefill_gpu_share
            lo, hi = min(float(v) for v in vals), max(float(v) for v in vals)
            base = 1.0 if name == "used_gpu_ratio" else 0.5
            default = min(max(base, lo), hi)
            spec = ParamSpec(name, "double", bounds=(lo, hi), default=default, role="feature")
            n_distinct = 2 if hi - lo > FLOAT_TOL else 1
        defaults[name] = default
        if len(pool) > 1 and n_distinct > 1:
            params.append(spec)
    return params, defaults


def _knob_param(name: str, choices: Sequence[Any]) -> tuple[ParamSpec | None, tuple[Any, ...]]:
    """One knob -> its parameter (None for a constant) and its de-duplicated entries."""
    entries = tuple(_dedupe(choices))
    if not entries:
        raise ValueError(f"knob {name!r} has no choices")
    if len(entries) == 1:
        return None, entries
    if all(isinstance(e, str) for e in entries):
        default = entries[0] if name == "backend" else None
        return ParamSpec(name, "categorical", values=entries, default=default), entries
    if all(_is_number(e) for e in entries):
        values = tuple(sorted({float(e) for e in entries}))
        if len(values) == 1:  # 1 and 1.0 collapse to one value
            return None, entries[:1]
        return ParamSpec(name, "discrete", values=values), entries
    # composites with raw-dict entries, and any other mix (bools, None): categorical over indices
    indices = tuple(str(i) for i in range(len(entries)))
    return ParamSpec(name, "categorical", values=indices, indexed=True), entries


def build_encoding(branch: "BranchSpace") -> SearchEncoding:
    """Encode one branch: structural features, knobs, the kv_load_ratio range."""
    pool = tuple(branch.parallel_configs)
    if not pool:
        raise ValueError(f"branch {branch.deployment_mode!r} has an empty parallel config pool")
    supports = tuple(tuple(s) for s in branch.supported_backends)
    if len(supports) != len(pool):
        raise ValueError(
            f"branch {branch.deployment_mode!r}: supported_backends has {len(supports)} entries "
            f"for {len(pool)} parallel configs"
        )
    budget = pool_budget(pool, branch.gpu_budget)
    moe = pool_is_moe(pool)
    params, defaults = _feature_params(pool, budget, moe)

    constants: dict[str, Any] = {}
    entries_by_knob: dict[str, tuple[Any, ...]] = {}
    for name, choices in branch.knob_choices.items():
        spec, entries = _knob_param(name, list(choices))
        entries_by_knob[name] = entries
        if spec is None:
            constants[name] = entries[0]
        else:
            params.append(spec)
    for name, (lo, hi) in (branch.float_ranges or {}).items():
        lo, hi = float(lo), float(hi)
        if lo > hi:
            raise ValueError(f"float range {name!r}: min {lo} > max {hi}")
        if hi - lo <= FLOAT_TOL:
            constants[name] = lo
            continue
        params.append(ParamSpec(name, "double", bounds=(lo, hi), default=(lo + hi) / 2, role="float"))

    names = [p.name for p in params]
    if len(set(names)) != len(names):
        raise ValueError(f"branch {branch.deployment_mode!r}: duplicate parameter names in {names}")
    if not params:  # GP designers reject an empty study
        params.append(ParamSpec(CONSTANT_PARAM, "categorical", values=("0",), default="0", role="internal"))
    return SearchEncoding(
        deployment_mode=branch.deployment_mode,
        params=tuple(params),
        constants=constants,
        parallel_configs=pool,
        supported_backends=supports,
        gpu_budget=budget,
        is_moe=moe,
        feature_defaults=defaults,
        knob_entries=entries_by_knob,
    )


def enumerate_space(
    encoding: SearchEncoding, branch: "BranchSpace | None" = None, *, supported_only: bool = True
) -> Iterator[tuple[dict[str, Any], ParallelConfig]]:
    """Every (selection, parallel_config) point of the finite space, knob product x pool, in a
    deterministic order (knob choices in their configured order, pool in its branch order).

    With `supported_only`, pairs whose selected backend does not support the config are skipped
    (they could only be told `unsupported`). Raises ValueError when a knob is continuous.
    """
    if not encoding.is_finite:
        cont = [p.name for p in encoding.params if p.kind == "double" and p.role != "feature"]
        raise ValueError(f"cannot enumerate a continuous search space (continuous: {cont})")
    pool = tuple(branch.parallel_configs) if branch is not None else encoding.parallel_configs
    supports = (
        tuple(tuple(s) for s in branch.supported_backends) if branch is not None else encoding.supported_backends
    )
    knobs = [p for p in encoding.params if p.role == "knob"]
    axes = [encoding.knob_entries[p.name] for p in knobs]
    base = {"deployment_mode": encoding.deployment_mode, **encoding.constants}
    for combo in itertools.product(*axes):
        selection = dict(base)
        selection.update(zip((p.name for p in knobs), combo))
        backend = selection.get("backend")
        for config, sup in zip(pool, supports):
            if supported_only and backend is not None and backend not in sup:
                continue
            yield dict(selection), config


def space_size(encoding: SearchEncoding, branch: "BranchSpace | None" = None) -> int:
    """Number of points `enumerate_space` yields (without materialising them)."""
    return sum(1 for _ in enumerate_space(encoding, branch))


__all__ = [
    "CONSTANT_PARAM",
    "ParamSpec",
    "SearchEncoding",
    "build_encoding",
    "enumerate_space",
    "space_size",
]
