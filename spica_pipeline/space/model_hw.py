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
* a local model: a directory holding a Hugging Face `config.json`; AIC reads such a directory
  itself (`get_model_config_from_model_path(dir)`) when its architecture is one of
  `sdk.common.ARCHITECTURE_TO_MODEL_FAMILY`.

Names (`resolve_model`, `resolve_hardware`): a name the user writes maps once, before the sweep, to
the name AIC ships (a Hugging Face id of the same checkpoint, an alias, a local directory); an
unknown name is refused with the three closest names.
"""

import difflib
import json
import logging
import re
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from spica_pipeline.config.precision import CHOICES
from spica_pipeline.errors import ModelHardwareError, NoPerfDatabase
from spica_pipeline.jsonvalue import spec_hash
from spica_pipeline.storage import atomic_write_text, default_cache_dir

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
    """Raise ModelHardwareError (one line) unless AIC ships a config for `model_name` or it is a local
    directory holding a config.json (`resolve_model` has checked its architecture)."""
    if model_name in available_models() or local_model_dir(model_name) is not None:
        return
    raise ModelHardwareError(f"model_name {model_name!r} is not one of aiconfigurator-core's shipped offline "
                             f"models; {_closest_text(model_name, available_models(), _model_key)}")


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
    """{system: {backend: queryable perf-DB versions}}. aiconfigurator-core reads every system's YAML and data
    folder for it (over a second at every command's start), so the answer is kept on disk per installed version."""
    from aiconfigurator_core.sdk.perf_database import get_supported_databases

    cache = _database_index_path()
    try:
        stored = json.loads(cache.read_text())
        return {sku: {b: tuple(v) for b, v in backends.items()} for sku, backends in stored.items()}
    except (OSError, ValueError, AttributeError):
        pass
    with QuietAIC():
        raw = get_supported_databases()
    found = {sku: {b: tuple(v) for b, v in backends.items() if v} for sku, backends in raw.items()}
    try:
        atomic_write_text(cache, json.dumps(found, sort_keys=True))
    except OSError:  # a read-only home still answers, only slower
        pass
    return found


def _database_index_path() -> Path:
    """The cached index's file: named by aiconfigurator-core's version and where its systems folder lies and
    when that folder last changed, so an upgrade or an edited install is read afresh."""
    from importlib.metadata import version

    from aiconfigurator_core.sdk.perf_database import get_systems_paths

    stamp = [(str(path), Path(path).stat().st_mtime_ns) for path in get_systems_paths() if Path(path).is_dir()]
    key = spec_hash({"aiconfigurator_core": version("aiconfigurator-core"), "systems": stamp})
    return default_cache_dir() / "aic-databases" / f"{key}.json"


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


# --------------------------------------------------------------------------------------------
# names: what a user writes -> what AIC ships
# --------------------------------------------------------------------------------------------

# Checkpoints whose config.json has the architecture and dimensions of a shipped one under another
# name (a later release of the same shape), keyed like `_model_key`.
SAME_SHAPE = {
    "llama-3.3-70b": "meta-llama/Meta-Llama-3.1-70B",
    "deepseek-v3-0324": "deepseek-ai/DeepSeek-V3",
    "deepseek-r1-0528": "deepseek-ai/DeepSeek-R1",
}
# Words that name a fine-tune or a packaging of the same weights' shape, not another shape.
_VARIANT_WORDS = frozenset({"instruct", "chat", "hf", "it", "base"})
_PATH_LIKE = re.compile(r"^(~|\.{1,2}(/|$)|/)|\.json$")


@dataclass(frozen=True)
class ResolvedName:
    """A model or GPU name as written and as the sweep uses it; `how` says why they differ."""

    given: str
    name: str
    how: str | None = None
    # the checkpoint a deployment serves when it is not `name`: a Hugging Face id timed by a shipped config's shape
    served: str | None = None

    def note(self, what: str) -> str | None:
        """`model X -> Y (how)`, or None when the name is used as written."""
        return None if self.how is None else f"{what} {self.given} -> {self.name} ({self.how})"


def _model_key(name: str) -> str:
    """A model name without its org, case, variant words (Instruct, Chat, HF, IT, Base) or `Meta-`
    prefix, `_` read as `.` (Llama-3_3 is Llama-3.3): names with one key have one weights' shape."""
    words = [w for w in name.strip().rsplit("/", 1)[-1].lower().replace("_", ".").split("-")
             if w not in _VARIANT_WORDS]
    if words and words[0] == "meta":
        words = words[1:]
    return "-".join(words)


@lru_cache(maxsize=1)
def _models_by_key() -> dict[str, tuple[str, ...]]:
    keyed: dict[str, list[str]] = {}
    for name in available_models():
        keyed.setdefault(_model_key(name), []).append(name)
    return {key: tuple(names) for key, names in keyed.items()}


def closest(value: str, names: Any, key: Any = str.lower, n: int = 3) -> list[str]:
    """The `n` names most like `value` (difflib's ratio on `key` of each), closest first."""
    target = key(value)
    ratio = {name: difflib.SequenceMatcher(None, target, key(name)).ratio() for name in names}
    return sorted(ratio, key=lambda name: (-ratio[name], name))[:n]


def _closest_text(value: str, names: tuple[str, ...], key: Any = str.lower) -> str:
    return f"closest: {', '.join(closest(value, names, key))} ({len(names)} in all)"


def local_model_dir(name: str) -> Path | None:
    """The directory of a local Hugging Face model named by `name` (the directory or its config.json),
    or None when `name` names no existing config.json."""
    try:
        path = Path(name).expanduser()
        if path.is_file() and path.name == "config.json":
            return path.resolve().parent
        if path.is_dir() and (path / "config.json").is_file():
            return path.resolve()
    except (OSError, ValueError):
        pass
    return None


def supported_architectures() -> dict[str, str]:
    """{Hugging Face architecture: AIC model family}: what AIC can model from a config.json."""
    from aiconfigurator_core.sdk.common import ARCHITECTURE_TO_MODEL_FAMILY

    return dict(sorted(ARCHITECTURE_TO_MODEL_FAMILY.items()))


def _local_model(given: str) -> ResolvedName | None:
    """A local config.json of an architecture AIC models, resolved to its directory; None when
    `given` does not look like a path; ModelHardwareError naming the reason otherwise."""
    from aiconfigurator_core.sdk.utils import get_model_config_from_model_path

    families = supported_architectures()

    directory = local_model_dir(given)
    if directory is None:
        if not _PATH_LIKE.search(given.strip()) and not Path(given).expanduser().exists():
            return None
        raise ModelHardwareError(f"search_space.model_name {given!r}: a local model is a directory holding a "
                                 "Hugging Face config.json (or that config.json itself); there is none there")
    config = directory / "config.json"
    try:
        raw = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelHardwareError(f"search_space.model_name: cannot read {config}: {str(exc).splitlines()[0]}") from None
    architectures = raw.get("architectures") if isinstance(raw, dict) else None
    if not (isinstance(architectures, list) and architectures and isinstance(architectures[0], str)):
        raise ModelHardwareError(f"search_space.model_name: {config} names no architectures (a Hugging Face "
                                 "config.json lists them, e.g. [\"LlamaForCausalLM\"])")
    architecture = architectures[0]
    if architecture not in families:
        raise ModelHardwareError(f"search_space.model_name: {config} is a {architecture}, which aiconfigurator-core "
                                 f"cannot model; {_closest_text(architecture, tuple(families))}; `spica list models` "
                                 "prints the architectures it can")
    try:
        with QuietAIC():
            get_model_config_from_model_path(str(directory))
    except Exception as exc:  # a field AIC needs is missing or malformed: its own words, on one line
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelHardwareError(f"search_space.model_name: aiconfigurator-core cannot read {config} "
                                 f"({architecture}): {detail}") from None
    return ResolvedName(given, str(directory), f"local config.json, {architecture}, "
                                               f"aiconfigurator-core family {families[architecture]}")


def resolve_model(given: str) -> ResolvedName:
    """The model the sweep uses for `given`: a shipped name as is; a local directory (or its
    config.json) of a supported architecture; a Hugging Face id or alias of a shipped checkpoint's
    shape. Otherwise ModelHardwareError with the three closest shipped names."""
    models = available_models()
    if given in models:
        return ResolvedName(given, given)
    local = _local_model(given)
    if local is not None:
        return local
    key = _model_key(given)
    matches = (SAME_SHAPE[key],) if key in SAME_SHAPE else _models_by_key().get(key, ())
    if len(matches) == 1:
        hub_id = given.strip() if "/" in given else None  # org/name; an alias has no checkpoint of its own
        return ResolvedName(given, matches[0], "aiconfigurator-core's shipped config of the same shape", hub_id)
    if matches:
        raise ModelHardwareError(f"search_space.model_name {given!r} may be any of {', '.join(matches)}; "
                                 "name one of them")
    raise ModelHardwareError(
        f"search_space.model_name {given!r} is not a model aiconfigurator-core ships, a Hugging Face id of "
        f"one, or a local directory holding a config.json; {_closest_text(given, models, _model_key)}; "
        "`spica list models` prints them")


def _hardware_key(name: str) -> str:
    key = re.sub(r"[\s\-]+", "_", name.strip().lower())
    return key.removeprefix("nvidia_")


def resolve_hardware(given: str) -> ResolvedName:
    """The AIC system for `given`: a system id as is; the same id in another case or spelling
    (H200 SXM, h200-sxm); a GPU name that begins exactly one system id with perf data (H200 ->
    h200_sxm, H100 -> h100_sxm). Otherwise ModelHardwareError with the three closest ids."""
    systems = available_systems()
    if given in systems:
        return ResolvedName(given, given)
    key = _hardware_key(given)
    if key in systems:
        return ResolvedName(given, key, "aiconfigurator-core system")
    prefixed = [s for s in systems if s.startswith(key + "_")]
    with_data = [s for s in prefixed if _supported_databases().get(s)] or prefixed
    if len(with_data) == 1:
        return ResolvedName(given, with_data[0], "aiconfigurator-core system with perf data")
    if with_data:
        raise ModelHardwareError(f"search_space.hardware_sku {given!r} may be any of {', '.join(with_data)}; "
                                 "name one of them")
    raise ModelHardwareError(f"search_space.hardware_sku {given!r} is not a GPU system aiconfigurator-core knows; "
                             f"{_closest_text(key, systems)}; `spica list hardware` prints them")


# --------------------------------------------------------------------------------------------
# catalogues: what `spica list` prints
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelEntry:
    """One shipped model: its architecture, AIC's model family for it, experts and context."""

    name: str
    architecture: str
    family: str
    num_experts: int
    max_context_length: int | None


def model_catalogue() -> list[ModelEntry]:
    """Every shipped model, in name order (case-insensitive), read from AIC's configs (no model build)."""
    from aiconfigurator_core.sdk.utils import get_model_config_from_model_path

    families = supported_architectures()
    entries = []
    with QuietAIC():
        for name in sorted(available_models(), key=str.lower):
            parsed = get_model_config_from_model_path(name)
            architecture = str(parsed["architecture"])
            context = parsed.get("context")
            entries.append(ModelEntry(name, architecture, families.get(architecture, "?"),
                                      int(parsed.get("num_experts") or 0), int(context) if context else None))
    return entries


def perf_databases() -> dict[str, dict[str, list[str]]]:
    """{system: {backend: perf-data versions, oldest first}} for every system with any, in name order."""
    from aiconfigurator_core.sdk.perf_database import _version_sort_tuple

    return {sku: {b: sorted(v, key=_version_sort_tuple) for b, v in sorted(backends.items())}
            for sku, backends in sorted(_supported_databases().items()) if backends}
