"""Model and hardware facts from aiconfigurator-core's shipped data (no network), memoised.

AIC 0.12.0 API used (all offline):
* models: `aiconfigurator_core.sdk.common.DefaultHFModels` (the HF ids with a shipped
  `model_configs/<org>--<name>_config.json`), `sdk.utils.get_model_config_from_model_path(id)`
  (parsed config: architecture, context, num_experts, ...), and the weight size as
  sum(op.get_weights()) over `sdk.models.get_model(id, build_model_config(tp=1...), backend)`.
  We only ever call these for ids in DefaultHFModels, so AIC never tries a HuggingFace download.
* systems: `sdk.perf_database.get_systems_paths()` + `_iter_system_yaml_files` (the
  `systems/*.yaml` specs) and `load_system_spec(sku)` (gpu.mem_capacity, node.num_gpus_per_node).
* perf databases: `sdk.perf_database.get_supported_databases()`: {sku: {backend: [queryable
  slot versions]}}; "latest" is the highest by AIC's own `_version_sort_tuple`.
"""

import difflib
import logging
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

from spica_pipeline.config.precision import CHOICES
from spica_pipeline.errors import ModelHardwareError, NoPerfDatabase

# MLA = MoE and not in the GQA-MoE allow-list (informational only).
_GQA_MOE_ARCHITECTURES = frozenset({"Qwen3MoeForCausalLM"})


@dataclass(frozen=True)
class ModelFacts:
    """What enumeration needs to know about a model."""

    model_name: str
    architecture: str
    is_moe: bool
    is_mla: bool
    max_context_length: int | None
    weight_bytes: int
    num_layers: int
    num_experts: int
    experts_per_token: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class HardwareFacts:
    """Per-GPU memory and node size of an AIC system spec."""

    hardware_sku: str
    gpus_per_node: int
    vram_bytes: int
    sm_version: int | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def enable_wideep(model: ModelFacts, hardware: HardwareFacts) -> bool:
    """A MoE model that does not fit twice into one node (wide expert parallelism). Informational only."""
    return model.is_moe and hardware.gpus_per_node * hardware.vram_bytes < 2 * model.weight_bytes


def _one_line_choices(value: str, choices: list[str], limit: int = 8) -> str:
    """Closest matches first, then the rest alphabetically, truncated to `limit` names."""
    close = difflib.get_close_matches(value, choices, n=limit, cutoff=0.4)
    rest = [c for c in sorted(choices) if c not in close]
    shown = (close + rest)[:limit]
    more = len(choices) - len(shown)
    return ", ".join(shown) + (f", ... (+{more} more)" if more > 0 else "")


class QuietAIC:
    """AIC logs INFO/WARNING chatter on model loads; keep the user's console clean."""

    def __enter__(self):
        self._previous = logging.root.manager.disable
        logging.disable(logging.WARNING)

    def __exit__(self, *exc):
        logging.disable(self._previous)


@lru_cache(maxsize=1)
def available_models() -> tuple[str, ...]:
    """HF ids whose config ships with AIC (usable offline), sorted."""
    from aiconfigurator_core.sdk.common import DefaultHFModels

    return tuple(sorted(DefaultHFModels))


@lru_cache(maxsize=1)
def available_systems() -> tuple[str, ...]:
    """AIC system ids that have a GPU spec (some have no perf database, see supported_backends)."""
    from aiconfigurator_core.sdk import perf_database as pdb

    names = set()
    with QuietAIC():
        for _root, name, _path in pdb._iter_system_yaml_files(pdb.get_systems_paths()):
            spec = pdb.load_system_spec(name)
            if isinstance(spec, dict) and isinstance(spec.get("gpu"), dict) and "mem_capacity" in spec["gpu"]:
                names.add(name)
    return tuple(sorted(names))


def _require_known(value: str, known: tuple[str, ...], refusal: str, limit: int = 8) -> None:
    """Raise ModelHardwareError: `refusal`, then the known names nearest `value` (one line)."""
    if value not in known:
        raise ModelHardwareError(f"{refusal}: {_one_line_choices(value, list(known), limit)}")


def check_model(model_name: str) -> None:
    """Raise ModelHardwareError (one line) unless AIC ships a config for `model_name`."""
    models = available_models()
    _require_known(model_name, models, f"model_name {model_name!r} is not one of aiconfigurator-core's "
                   f"shipped offline models; available ({len(models)})")


def check_hardware(hardware_sku: str) -> None:
    """Raise ModelHardwareError (one line) unless `hardware_sku` is an AIC system."""
    _require_known(hardware_sku, available_systems(), f"unknown hardware_sku {hardware_sku!r}; available", 20)


@lru_cache(maxsize=256)
def model_facts(model_name: str) -> ModelFacts:
    """Architecture, MoE-ness, max context and total (unsharded) weight bytes of a shipped model."""
    check_model(model_name)
    from aiconfigurator_core.sdk.config_builders import build_model_config
    from aiconfigurator_core.sdk.models import get_model
    from aiconfigurator_core.sdk.utils import get_model_config_from_model_path

    with QuietAIC():
        try:
            parsed = get_model_config_from_model_path(model_name)
            single_gpu = build_model_config(tp_size=1, pp_size=1, attention_dp_size=1, moe_tp_size=1,
                                            moe_ep_size=1)
            model = get_model(model_name, single_gpu, "vllm")
            weight_bytes = int(sum(op.get_weights() for op in model.context_ops))
        except Exception as exc:  # an AIC model-zoo failure for a shipped id: name it, on one line
            raise ModelHardwareError(
                f"aiconfigurator-core cannot build model {model_name!r}: {str(exc).splitlines()[0]}"
            ) from None
    architecture = str(parsed["architecture"])
    num_experts = int(parsed.get("num_experts") or 0)
    topk = int(parsed.get("topk") or 0)
    is_moe = num_experts > 1 and topk > 0
    context = parsed.get("context")
    return ModelFacts(
        model_name=model_name,
        architecture=architecture,
        is_moe=is_moe,
        is_mla=is_moe and architecture not in _GQA_MOE_ARCHITECTURES,
        max_context_length=int(context) if context else None,
        weight_bytes=weight_bytes,
        num_layers=int(parsed.get("layers") or 0),
        num_experts=num_experts,
        experts_per_token=topk,
    )


@lru_cache(maxsize=256)
def checkpoint_quant(model_name: str) -> str | None:
    """The checkpoint's own weight quantization in AIC's mode names (e.g. fp8_block), None for bf16."""
    from aiconfigurator_core.sdk.utils import get_model_config_from_model_path

    try:
        with QuietAIC():
            parsed = get_model_config_from_model_path(model_name)
    except Exception:  # not a model AIC ships: nothing to substitute; building its timing says why
        return None
    algo = (parsed.get("raw_config") or {}).get("quant_algo")
    return str(algo) if algo else None


@lru_cache(maxsize=64)
def hardware_facts(hardware_sku: str) -> HardwareFacts:
    """GPUs per node and VRAM per GPU of an AIC system spec."""
    check_hardware(hardware_sku)
    from aiconfigurator_core.sdk.perf_database import load_system_spec

    spec = load_system_spec(hardware_sku)
    gpu, node = spec.get("gpu") or {}, spec.get("node") or {}
    sm = gpu.get("sm_version")
    return HardwareFacts(
        hardware_sku=hardware_sku,
        gpus_per_node=int(node.get("num_gpus_per_node") or 1),
        vram_bytes=int(gpu["mem_capacity"]),
        sm_version=int(sm) if sm is not None else None,
    )


@lru_cache(maxsize=1)
def _supported_databases() -> dict[str, dict[str, tuple[str, ...]]]:
    from aiconfigurator_core.sdk.perf_database import get_supported_databases

    with QuietAIC():
        raw = get_supported_databases()
    return {sku: {b: tuple(v) for b, v in backends.items() if v} for sku, backends in raw.items()}


def supported_backends(hardware_sku: str) -> dict[str, list[str]]:
    """{backend: queryable perf-DB versions, oldest first}; empty for a spec without data."""
    check_hardware(hardware_sku)
    return {b: list(v) for b, v in sorted(_supported_databases().get(hardware_sku, {}).items())}


@lru_cache(maxsize=64)
def latest_backend_version(hardware_sku: str, backend: str) -> str:
    """The highest queryable perf-DB version for (sku, backend); NoPerfDatabase if there is none."""
    from aiconfigurator_core.sdk.perf_database import _version_sort_tuple

    versions = supported_backends(hardware_sku).get(backend)
    if not versions:
        have = supported_backends(hardware_sku)
        raise NoPerfDatabase(
            f"aiconfigurator-core has no perf database for backend={backend!r} "
            f"on hardware_sku={hardware_sku!r}; "
            f"available there: {', '.join(sorted(have)) or 'none'}"
        )
    return max(versions, key=_version_sort_tuple)


def precision_choices(hardware_sku: str, field: str) -> list[str]:
    """The modes of one precision field the GPU can compute (fp8 needs fp8 tensor cores, nvfp4 fp4)."""
    from aiconfigurator_core.sdk.perf_database import load_system_spec


    check_hardware(hardware_sku)
    gpu = load_system_spec(hardware_sku).get("gpu") or {}
    return [mode for mode, compute in CHOICES[field].items()
            if compute is None or (gpu.get(f"{compute}_tc_flops") or 0) > 0]


def check_precision(precision: Any, model_name: str, hardware_sku: str) -> None:
    """Raise ModelHardwareError naming the field and its valid choices for a precision the model or
    GPU cannot run (`precision` is a config.precision.Precision or None)."""
    if precision is None:
        return
    for field, mode in precision.model_dump().items():
        if mode is None:
            continue
        where = f"search_space.precision.{field}"
        if field == "moe" and not model_facts(model_name).is_moe:
            raise ModelHardwareError(f"{where}: {model_name} has no experts, so it has no MoE precision; "
                                     "valid choices: none (leave it unset)")
        valid = precision_choices(hardware_sku, field)
        if mode not in valid:
            raise ModelHardwareError(f"{where}: {mode!r} is not supported for {model_name} on {hardware_sku} "
                                     f"(the GPU has no tensor cores for it); valid choices: {valid}")
