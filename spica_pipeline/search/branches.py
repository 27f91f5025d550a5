"""Stage 3: one `BranchSpace` per deployment mode (spec §6.1).

A branch holds the legal parallel pool (with the backends that can run each config), the searched
knobs that still matter in that mode (dependent knobs pruned: router sub-knobs under round-robin
only, planner sub-knobs when every policy is static, cache-hit weights without G2 offload), and
the workload's kv_load_ratio as a float range or a constant. Backends replay cannot run, or with
no perf DB / no viable shape, are dropped with a warning; no viable branch at all is an error.
"""

from dataclasses import dataclass, field
from functools import lru_cache
from math import prod
from typing import Any

from spica_pipeline.errors import NoPerfDatabase, NoViableParallelConfig
from spica_pipeline.search.model_hw import check_hardware, check_model
from spica_pipeline.search.parallel import check_pins, parallel_configs_for, resolve_max_seq_len
from spica_pipeline.search.policies import is_static
from spica_pipeline.search.shapes import ParallelConfig, parallel_config_from_dict

# Dynamo replay rejects TRT-LLM disaggregation.
REPLAY_INCOMPATIBLE = {"disagg": ("trtllm",)}
ROUTER_SUBKNOBS = ("overlap_score_credit", "prefill_load_scale", "router_temperature")
OFFLOAD_ROUTER_KNOBS = ("host_cache_hit_weight", "disk_cache_hit_weight")
PLANNER_SUBKNOBS = ("planner_fpm_sampling", "planner_load_sensitivity")
ENGINE_KNOBS = {
    "agg": ("agg_max_num_batched_tokens", "agg_max_num_seqs"),
    "disagg": ("prefill_max_num_batched_tokens", "prefill_max_num_seqs",
               "decode_max_num_batched_tokens", "decode_max_num_seqs"),
}


@dataclass(frozen=True)
class BranchSpace:
    """Everything one per-branch study searches over.

    supported_backends[i] are the backends that can run parallel_configs[i]; knob_choices keeps
    the order router, planner, engine, backend, kv_load_ratio; diagnostics is JSON-able
    ({backend: EnumerationDiagnostics.to_dict() or {"error": message}}).
    """

    deployment_mode: str
    parallel_configs: tuple[ParallelConfig, ...]
    supported_backends: tuple[tuple[str, ...], ...]
    knob_choices: dict[str, list[Any]]
    gpu_budget: int
    float_ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    diagnostics: dict[str, Any] = field(default_factory=dict)

    @property
    def finite_size(self) -> int | None:
        """Knob-choice product x pool size; None when a continuous knob makes the space infinite."""
        if self.float_ranges:
            return None
        return prod(len(c) for c in self.knob_choices.values()) * len(self.parallel_configs)

    def to_dict(self) -> dict[str, Any]:
        return {
            "deployment_mode": self.deployment_mode,
            "parallel_configs": [c.to_dict() for c in self.parallel_configs],
            "supported_backends": [list(b) for b in self.supported_backends],
            "knob_choices": {k: list(v) for k, v in self.knob_choices.items()},
            "gpu_budget": self.gpu_budget,
            "float_ranges": {k: [lo, hi] for k, (lo, hi) in self.float_ranges.items()},
            "diagnostics": self.diagnostics,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "BranchSpace":
        return cls(
            deployment_mode=d["deployment_mode"],
            parallel_configs=tuple(parallel_config_from_dict(c) for c in d["parallel_configs"]),
            supported_backends=tuple(tuple(b) for b in d["supported_backends"]),
            knob_choices={k: list(v) for k, v in d["knob_choices"].items()},
            gpu_budget=int(d["gpu_budget"]),
            float_ranges={k: (float(v[0]), float(v[1])) for k, v in d.get("float_ranges", {}).items()},
            diagnostics=dict(d.get("diagnostics", {})),
        )


@dataclass(frozen=True)
class BranchEnumeration:
    """The branches in the user's mode order, the warnings to print, and per-mode diagnostics."""

    branches: list[BranchSpace]
    warnings: list[str]
    diagnostics: dict[str, dict[str, Any]]


class _Identity:
    """Hash/compare a (large, memoised) pool by identity, so merging it again is a dict lookup."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any):
        self.obj = obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Identity) and other.obj is self.obj


@lru_cache(maxsize=64)
def _merge_pools(
    legal: tuple[tuple[str, _Identity], ...]
) -> tuple[tuple[ParallelConfig, ...], tuple[tuple[str, ...], ...]]:
    """Union of the backends' sorted pools, each config with its backends in user order."""
    configs: dict[tuple[int, ...], ParallelConfig] = {}
    backends: dict[tuple[int, ...], list[str]] = {}
    for backend, pool in legal:
        for config in pool.obj:
            key = config.sort_key()  # all shape fields: equal keys <=> equal configs
            configs.setdefault(key, config)
            backends.setdefault(key, []).append(backend)
    keys = sorted(configs)
    return tuple(configs[k] for k in keys), tuple(tuple(backends[k]) for k in keys)


def knob_choices_for(
    space: Any, mode: str, viable_backends: list[str], kv_load_ratio: float | list[float] | None
) -> tuple[dict[str, list[Any]], dict[str, tuple[float, float]]]:
    """Spec §6.1 step 4: the searched knobs of one mode with dependent knobs pruned."""
    knobs: dict[str, list[Any]] = {"router_mode": list(space.router_mode)}
    if list(space.router_mode) != ["round_robin"]:
        for name in ROUTER_SUBKNOBS:
            knobs[name] = list(getattr(space, name))
        if (space.num_g2_blocks or 0) > 0:
            for name in OFFLOAD_ROUTER_KNOBS:
                knobs[name] = list(getattr(space, name))
    policies = list(space.planner_scaling_policy)
    knobs["planner_scaling_policy"] = policies
    if not all(is_static(p) for p in policies):
        for name in PLANNER_SUBKNOBS:
            knobs[name] = list(getattr(space, name))
    for name in ENGINE_KNOBS[mode]:
        knobs[name] = list(getattr(space, name))
    knobs["backend"] = list(viable_backends)
    float_ranges: dict[str, tuple[float, float]] = {}
    if isinstance(kv_load_ratio, (list, tuple)):
        float_ranges["kv_load_ratio"] = (float(kv_load_ratio[0]), float(kv_load_ratio[1]))
    elif kv_load_ratio is not None:
        knobs["kv_load_ratio"] = [float(kv_load_ratio)]
    return knobs, float_ranges


def enumerate_branches(config: Any) -> BranchEnumeration:
    """Stage 3 on a (policy-filtered) SmartSearchConfig; see the module docstring."""
    space = config.search_space
    check_hardware(space.hardware_sku)
    check_model(space.model_name)
    max_seq_len = resolve_max_seq_len(space.model_name, space.context_length)
    pins = list(space.parallel_configs or [])
    budget = int(space.gpu_budget)
    warnings: list[str] = []
    diagnostics: dict[str, dict[str, Any]] = {}
    branches: list[BranchSpace] = []
    skipped: list[str] = []
    why_not: list[str] = []  # per mode/backend: the pruning reasons, for the refusal below

    for mode in dict.fromkeys(space.deployment_mode):
        excluded = [b for b in space.backend if b in REPLAY_INCOMPATIBLE.get(mode, ())]
        if excluded:
            warnings.append(f"smart-sweep: backend(s) {excluded} skipped for deployment_mode='{mode}': "
                            "Dynamo replay cannot run TRT-LLM disaggregation")
        mode_diag: dict[str, Any] = {b: {"error": "replay-incompatible"} for b in excluded}
        legal: dict[str, tuple[ParallelConfig, ...]] = {}
        for backend in space.backend:
            if backend in excluded:
                continue
            try:
                result = parallel_configs_for(space.model_name, space.hardware_sku, backend, mode, budget,
                                              space.min_gpu_budget, max_seq_len)
            except (NoPerfDatabase, NoViableParallelConfig) as exc:
                warnings.append(f"smart-sweep: backend '{backend}' dropped for deployment_mode='{mode}': "
                                f"{exc}")
                mode_diag[backend] = {"error": str(exc)}
                why_not.append(f"{mode}/{backend}: {getattr(exc, 'pruning', None) or exc}")
                continue
            legal[backend] = result.configs
            mode_diag[backend] = result.diagnostics.to_dict()
        diagnostics[mode] = mode_diag

        if pins:
            support = check_pins(pins, mode, legal)  # raises when a pin is unsupported
            pool = tuple(support)
            supported = tuple(support[c] for c in pool)
        else:
            pool, supported = _merge_pools(tuple((b, _Identity(configs)) for b, configs in legal.items()))
        viable = [b for b in space.backend if any(b in s for s in supported)]
        if not pool:
            skipped.append(mode)
            extra = f" (replay-incompatible: {excluded})" if excluded else ""
            warnings.append(f"smart-sweep: deployment_mode='{mode}' skipped — no configured backend has "
                            f"a viable parallel config within gpu_budget={budget}{extra}")
            continue
        knobs, float_ranges = knob_choices_for(space, mode, viable, config.workload.kv_load_ratio)
        branches.append(BranchSpace(deployment_mode=mode, parallel_configs=pool, supported_backends=supported,
                                    knob_choices=knobs, gpu_budget=budget, float_ranges=float_ranges,
                                    diagnostics=mode_diag))

    if not branches:
        raise NoViableParallelConfig(
            f"no deployment_mode has a viable parallel config (skipped {skipped}); "
            f"check backends / model / hardware / gpu_budget={budget}"
            + (f"; pruned: {'; '.join(why_not)}" if why_not else "")
        )
    return BranchEnumeration(branches=branches, warnings=warnings, diagnostics=diagnostics)
