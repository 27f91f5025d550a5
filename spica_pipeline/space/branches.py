"""Stage 3: one `BranchSpace` per deployment mode.

A branch holds the legal parallel pool (with the backends that can run each config), the searched
knobs that still matter in that mode (dependent knobs pruned: router sub-knobs under round-robin
only, planner sub-knobs when every policy is static, cache-hit weights without G2 offload, speculative
methods the model cannot run, with the reason as a warning), and
the workload's kv_load_ratio as a float range or a constant. Backends replay cannot run, or with
no perf DB / no viable shape, are dropped with a warning; no viable branch at all is an error.
Pinned parallel_configs are not enumerated: each pin is read (in the canonical keys or the engine's
own) and checked rule by rule on every backend it names (space/pins.py); a pin no backend runs is
refused with the rule and the nearest accepted shape.

With prefill and decode on their own GPU types (`prefill_hardware_sku` / `decode_hardware_sku`) the
disagg pool is the union over the listed type pairs of each pair's pool (space/parallel.py
`split_disagg_configs`), and a type listed more than once is a searched knob of the disagg branch; a
(pool config, type pair) the budget of a type does not allow is refused when the candidate is built
(evaluate/engine_args.py).
"""

from dataclasses import dataclass, field
from functools import lru_cache
from math import prod
from typing import Any

from spica_pipeline.config.precision import quant_modes
from spica_pipeline.errors import NoPerfDatabase, NoViableParallelConfig, PerfModelError
from spica_pipeline.space.engine import EngineIdentity
from spica_pipeline.space.model_hw import (
    check_hardware,
    check_model,
    check_precision,
    latest_backend_version,
    model_facts,
)
from spica_pipeline.space.parallel import (
    parallel_configs_for,
    resolve_max_seq_len,
    split_disagg_configs,
)
from spica_pipeline.space.perf_data import check_timing, is_missing_data
from spica_pipeline.space.pins import PinContext, check_pins
from spica_pipeline.space.policies import is_static
from spica_pipeline.space.shapes import ParallelConfig, parallel_config_from_dict
from spica_pipeline.space.speculative import speculative_choices

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
    the order router, planner, engine, backend, speculative decoding, kv_load_ratio; diagnostics is JSON-able
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
    """The searched knobs of one mode with dependent knobs pruned (a pruned knob cannot change a replay)."""
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
    if mode == "disagg" and getattr(space, "split_systems", False):  # a role's GPU type, when several are listed
        for role in ("prefill", "decode"):
            if len(space.role_systems(role)) > 1:
                knobs[f"{role}_hardware_sku"] = space.role_systems(role)
    knobs.update(speculative_choices(space).knobs())  # method and draft tokens, when the model can speculate
    float_ranges: dict[str, tuple[float, float]] = {}
    if isinstance(kv_load_ratio, (list, tuple)):
        float_ranges["kv_load_ratio"] = (float(kv_load_ratio[0]), float(kv_load_ratio[1]))
    elif kv_load_ratio is not None:
        knobs["kv_load_ratio"] = [float(kv_load_ratio)]
    return knobs, float_ranges


def timing_check(space: Any, backend: str, config: ParallelConfig, system: str | None = None) -> str | None:
    """Can AIC's perf data time this backend for the model at all? Probes one shape of its pool on
    `system` (default hardware_sku).

    Returns the fidelity note of a substitution (None: exact data); raises PerfModelError when
    even the nearest data cannot serve it (the backend is then dropped before sampling).
    """
    shape = config.prefill if hasattr(config, "prefill") else config
    p = space.precision
    system = system or space.hardware_sku
    identity = EngineIdentity(
        model=space.model_name, system=system, backend=backend,
        version=latest_backend_version(system, backend), tp=shape.tp, pp=shape.pp,
        attention_dp=shape.attention_dp, moe_tp=shape.moe_tp, moe_ep=shape.moe_ep, nextn=int(space.aic_nextn or 0),
        weight_dtype=p.weights if p else None, moe_dtype=p.moe if p else None,
        attention_dtype=p.attention if p else None, kv_cache_dtype=p.kv_cache if p else None,
    )
    return check_timing(identity)


def _timing_may_lack_data(space: Any) -> bool:
    """Where AIC's attention data has per-dtype gaps: MLA models (e.g. SGLang's H200 data has only
    bf16 MLA) and pinned precisions. Other models use the well-covered default path, so they skip
    the probe (an AIC model build, seconds per backend); a gap there still fails its trials, with
    the reason, instead of silently."""

    p = space.precision
    return model_facts(space.model_name).is_mla or (p is not None and any(p.model_dump().values()))


def _timing_verdict(space: Any, backend: str, config: ParallelConfig, warnings: list[str],
                    system: str | None = None) -> PerfModelError | None:
    """The reason AIC cannot time `backend` at all on `system` (default hardware_sku; None: it can), warning
    once either way."""
    try:
        note = timing_check(space, backend, config, system)
    except PerfModelError as exc:
        if not is_missing_data(exc.__cause__):
            return None  # not a data gap (e.g. this one shape): keep the backend; its trials record why
        warnings.append(f"smart-sweep: backend '{backend}' dropped: aiconfigurator-core's perf data cannot time "
                        f"{space.model_name} on {system or space.hardware_sku}: {exc.detail}")
        return exc
    if note:
        warnings.append(f"smart-sweep: backend '{backend}': {note} (recorded as fidelity_note on every trial)")
    return None


def memory_fraction_of(space: Any, mode: str) -> float:
    """The gpu_memory_utilization the enumeration's KV filter probes at: the agg role's, or for disagg the
    smaller of prefill's and decode's (a role shape is offered for either)."""
    if mode == "agg":
        return float(space.agg_gpu_memory_utilization)
    return float(min(space.prefill_gpu_memory_utilization, space.decode_gpu_memory_utilization))


def _enumerated_pool(space: Any, mode: str, excluded: list[str], max_seq_len: int, quant: Any,
                     mode_diag: dict[str, Any], warnings: list[str], why_not: list[str],
                     timing_verdicts: dict[str, PerfModelError | None],
                     ) -> tuple[tuple[ParallelConfig, ...], tuple[tuple[str, ...], ...]]:
    """The merged pool of every backend's enumeration (backends without perf data or a viable shape dropped)."""
    legal: dict[str, tuple[ParallelConfig, ...]] = {}
    fraction = memory_fraction_of(space, mode)
    for backend in space.backend:
        if backend in excluded:
            continue
        try:
            result = parallel_configs_for(space.model_name, space.hardware_sku, backend, mode, mode_budget(space, mode),
                                          space.min_gpu_budget, max_seq_len, precision=quant,
                                          memory_fraction=fraction)
        except (NoPerfDatabase, NoViableParallelConfig) as exc:
            warnings.append(f"smart-sweep: backend '{backend}' dropped for deployment_mode='{mode}': "
                            f"{exc}")
            mode_diag[backend] = {"error": str(exc)}
            why_not.append(f"{mode}/{backend}: {getattr(exc, 'pruning', None) or exc}")
            continue
        if backend not in timing_verdicts and result.configs and _timing_may_lack_data(space):
            timing_verdicts[backend] = _timing_verdict(space, backend, result.configs[0], warnings)
        verdict = timing_verdicts.get(backend)
        if verdict is not None:
            mode_diag[backend] = {"error": f"no perf data: {verdict.detail}"}
            why_not.append(f"{mode}/{backend}: no perf data to time it")
            continue
        legal[backend] = result.configs
        mode_diag[backend] = result.diagnostics.to_dict()
    return _merge_pools(tuple((b, _Identity(configs)) for b, configs in legal.items()))


def mode_budget(space: Any, mode: str) -> int:
    """The GPUs a branch's candidates may use: gpu_budget, or with a budget per GPU type the budget of
    hardware_sku (what agg, and disagg without per-role types, run on)."""
    type_budget = getattr(space, "type_budget", None)
    return int(type_budget(space.hardware_sku)) if type_budget is not None else int(space.gpu_budget)


def split_pair_pool(space: Any, backend: str, prefill: str, decode: str, max_seq_len: int,
                    quant: Any) -> tuple[tuple[ParallelConfig, ...], dict[str, Any]]:
    """The disagg pool of prefill on `prefill` and decode on `decode` with its diagnostics: one type's own
    disagg pool within its budget, or each role enumerated on its own type (space/parallel.py)."""
    if prefill == decode:
        result = parallel_configs_for(space.model_name, prefill, backend, "disagg", space.type_budget(prefill),
                                      space.min_gpu_budget, max_seq_len, precision=quant,
                                      memory_fraction=memory_fraction_of(space, "disagg"))
        return result.configs, result.diagnostics.to_dict()
    per_type = space.gpu_budget_by_type is not None
    budgets = (space.type_budget(prefill), space.type_budget(decode)) if per_type else None
    pool = split_disagg_configs(
        space.model_name, prefill, decode, backend, budgets=budgets,
        total=sum(budgets) if budgets else int(space.gpu_budget), min_budget=space.min_gpu_budget,
        max_seq_len=max_seq_len, precision=quant,
        memory_fractions=(float(space.prefill_gpu_memory_utilization), float(space.decode_gpu_memory_utilization)))
    return pool.configs, pool.diagnostics()


def _split_pool(space: Any, excluded: list[str], max_seq_len: int, quant: Any, mode_diag: dict[str, Any],
                warnings: list[str], why_not: list[str], timing_verdicts: dict[str, PerfModelError | None],
                ) -> tuple[tuple[ParallelConfig, ...], tuple[tuple[str, ...], ...]]:
    """The disagg pool with prefill and decode on their own GPU types: per backend the union over the listed
    type pairs (a pair or backend without perf data or a viable shape dropped with the reason)."""
    legal: dict[str, tuple[ParallelConfig, ...]] = {}
    for backend in space.backend:
        if backend in excluded:
            continue
        configs: dict[ParallelConfig, None] = {}
        diag: dict[str, Any] = {}
        for prefill in space.role_systems("prefill"):
            for decode in space.role_systems("decode"):
                pair = f"prefill {prefill} + decode {decode}"
                try:
                    pool, diag[pair] = split_pair_pool(space, backend, prefill, decode, max_seq_len, quant)
                except (NoPerfDatabase, NoViableParallelConfig) as exc:
                    warnings.append(f"smart-sweep: {pair} dropped for backend '{backend}': {exc}")
                    diag[pair] = {"error": str(exc)}
                    why_not.append(f"disagg/{backend} ({pair}): {getattr(exc, 'pruning', None) or exc}")
                    continue
                if pool and _timing_may_lack_data(space):
                    for system in dict.fromkeys((prefill, decode)):
                        if f"{backend}@{system}" not in timing_verdicts:
                            timing_verdicts[f"{backend}@{system}"] = _timing_verdict(space, backend, pool[0],
                                                                                     warnings, system)
                if any(timing_verdicts.get(f"{backend}@{system}") for system in (prefill, decode)):
                    diag[pair] = {"error": "no perf data to time it"}
                    why_not.append(f"disagg/{backend} ({pair}): no perf data to time it")
                    continue
                configs.update(dict.fromkeys(pool))
        mode_diag[backend] = diag
        if configs:
            legal[backend] = tuple(sorted(configs, key=lambda c: c.sort_key()))
    return _merge_pools(tuple((b, _Identity(configs)) for b, configs in legal.items()))


def _pinned_pool(space: Any, mode: str, pins: list[dict[str, Any]], excluded: list[str], max_seq_len: int,
                 quant: Any, mode_diag: dict[str, Any], warnings: list[str],
                 ) -> tuple[tuple[ParallelConfig, ...], tuple[tuple[str, ...], ...]]:
    """The pins every rule accepts (space/pins.py), each with the backends that run it; PinRefused when a pin
    runs on no backend."""
    backends = []
    for backend in space.backend:
        if backend in excluded:
            continue
        try:
            latest_backend_version(space.hardware_sku, backend)
        except NoPerfDatabase as exc:
            warnings.append(f"smart-sweep: backend '{backend}' dropped for deployment_mode='{mode}': {exc}")
            mode_diag[backend] = {"error": str(exc)}
            continue
        backends.append(backend)
    ctx = PinContext(
        model=space.model_name, hardware=space.hardware_sku, mode=mode, budget=mode_budget(space, mode),
        min_budget=space.min_gpu_budget, max_seq_len=max_seq_len, precision=quant,
        memory_fraction={"agg": float(space.agg_gpu_memory_utilization),
                         "prefill": float(space.prefill_gpu_memory_utilization),
                         "decode": float(space.decode_gpu_memory_utilization)},
        nextn=int(space.aic_nextn or 0))
    checked = check_pins(pins, ctx, backends)
    warnings.extend(checked.warnings)
    mode_diag.update(checked.diagnostics())
    pool = tuple(checked.support)
    return pool, tuple(checked.support[c] for c in pool)


def enumerate_branches(config: Any) -> BranchEnumeration:
    """Stage 3 on a (policy-filtered) SmartSearchConfig; see the module docstring."""
    space = config.search_space
    systems = dict.fromkeys([space.hardware_sku, *(s for role in ("prefill", "decode")
                                                   for s in getattr(space, "role_systems", lambda r: [])(role))])
    for system in systems:
        check_hardware(system)
    check_model(space.model_name)
    for system in systems:
        check_precision(space.precision, space.model_name, system)
    max_seq_len = resolve_max_seq_len(space.model_name, space.context_length)
    pins = list(space.parallel_configs or [])
    warnings: list[str] = []
    diagnostics: dict[str, dict[str, Any]] = {}
    branches: list[BranchSpace] = []
    skipped: list[str] = []
    why_not: list[str] = []  # per mode/backend: the pruning reasons, for the refusal below
    quant = quant_modes(space.precision.sample_fields()) if space.precision is not None else None
    # backend (or backend@system of a per-role GPU type) -> why AIC cannot time it (once)
    timing_verdicts: dict[str, PerfModelError | None] = {}
    warnings.extend(speculative_choices(space).warnings())

    for mode in dict.fromkeys(space.deployment_mode):
        excluded = [b for b in space.backend if b in REPLAY_INCOMPATIBLE.get(mode, ())]
        if excluded:
            warnings.append(f"smart-sweep: backend(s) {excluded} skipped for deployment_mode='{mode}': "
                            "Dynamo replay cannot run TRT-LLM disaggregation")
        mode_diag: dict[str, Any] = {b: {"error": "replay-incompatible"} for b in excluded}
        split = mode == "disagg" and getattr(space, "split_systems", False)
        budget = int(space.gpu_budget) if split else mode_budget(space, mode)
        if split:
            pool, supported = _split_pool(space, excluded, max_seq_len, quant, mode_diag, warnings, why_not,
                                          timing_verdicts)
        elif pins:
            pool, supported = _pinned_pool(space, mode, pins, excluded, max_seq_len, quant, mode_diag, warnings)
        else:
            pool, supported = _enumerated_pool(space, mode, excluded, max_seq_len, quant, mode_diag, warnings,
                                               why_not, timing_verdicts)
        diagnostics[mode] = mode_diag

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
