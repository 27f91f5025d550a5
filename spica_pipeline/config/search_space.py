"""`search_space:`: the knobs Spica searches and the context it pins."""

from typing import Any, Iterable

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from spica_pipeline.config import presets
from spica_pipeline.config.messages import render_validation_error
from spica_pipeline.config.precision import Precision
from spica_pipeline.config.types import (
    Bool,
    Float,
    Fraction,
    Int,
    NonNegFloat,
    NonNegInt,
    PosFloat,
    PosInt,
    StrictModel,
)


def _check_choices(field: str, value: list[Any], allowed: tuple[Any, ...]) -> list[Any]:
    """An atomic list knob: a non-empty, duplicate-free subset of its choice table."""
    shown = list(allowed)
    if not value:
        raise ValueError(f"{field} must list at least one choice; allowed: {shown}")
    for i, item in enumerate(value):
        if item not in allowed:
            raise ValueError(f"{field} has invalid choice {item!r}; allowed: {shown}")
        if item in value[:i]:
            raise ValueError(f"{field} lists {item!r} more than once")
    return value


# The atomic list knobs and the choice table each is a subset of (the router's float knobs convert first).
LIST_CHOICES: dict[str, tuple[Any, ...]] = {
    "deployment_mode": presets.DEPLOYMENT_MODES, "backend": presets.BACKENDS, "router_mode": presets.ROUTER_MODES,
    "speculative_method": presets.SPECULATIVE_METHODS, "speculative_num_tokens": presets.SPECULATIVE_TOKENS,
    **presets.ENGINE_CHOICES,
}


class ShapePin(StrictModel):
    """One pinned engine shape in the canonical keys (`space/shapes.RoleShape`'s fields).

    pp, attention_dp and replicas default to 1. moe_tp and moe_ep left out take the engines' default for a MoE
    model (the experts tensor-parallel across the engine's GPUs; one of them given, the other completes
    tp x attention_dp); a dense model has no experts, so its MoE widths are ignored."""

    tp: PosInt
    pp: PosInt = 1
    attention_dp: PosInt = 1
    moe_tp: PosInt | None = None
    moe_ep: PosInt | None = None
    replicas: PosInt = 1


class VllmShapePin(StrictModel):
    """One pinned engine shape in vLLM's words: `--tensor-parallel-size`, `--data-parallel-size`,
    `--enable-expert-parallel`."""

    tp: PosInt
    pp: PosInt = 1
    data_parallel: PosInt = 1
    enable_expert_parallel: Bool = False
    replicas: PosInt = 1


class SglangShapePin(StrictModel):
    """One pinned engine shape in SGLang's words: `--tp` (every GPU of the engine), `--dp`,
    `--enable-dp-attention`, `--ep`."""

    tp: PosInt
    pp: PosInt = 1
    dp: PosInt = 1
    ep: PosInt = 1
    enable_dp_attention: Bool = False
    replicas: PosInt = 1


# The keys that only one spelling has; `tp`, `pp` and `replicas` are shared.
SPELLING_KEYS: dict[str, frozenset[str]] = {
    "canonical": frozenset({"attention_dp", "moe_tp", "moe_ep"}),
    "vllm": frozenset({"data_parallel", "enable_expert_parallel"}),
    "sglang": frozenset({"dp", "ep", "enable_dp_attention"}),
}
SPELLING_NAMES = {"canonical": "canonical", "vllm": "vLLM", "sglang": "SGLang"}
SPELLING_MODELS: dict[str, type[StrictModel]] = {
    "canonical": ShapePin, "vllm": VllmShapePin, "sglang": SglangShapePin}


def pin_spelling(entry: dict[str, Any]) -> str:
    """'canonical', 'vllm' or 'sglang': whose words one role pin is written in (ValueError on a mix).

    A pin of only tp / pp / replicas reads the same in every spelling, so it is canonical."""
    used = {name: sorted(keys & set(entry)) for name, keys in SPELLING_KEYS.items() if keys & set(entry)}
    if len(used) > 1:
        mixed = " and ".join(f"{name} keys {keys}" for name, keys in used.items())
        raise ValueError(f"mixes {mixed}; write one spelling: canonical (tp, pp, attention_dp, moe_tp, moe_ep), "
                         "vLLM (tp, data_parallel, enable_expert_parallel) or SGLang (tp, dp, ep, enable_dp_attention)")
    return next(iter(used), "canonical")


def _check_role_pin(entry: Any, where: str, backends: list[str]) -> None:
    """Validate one role pin against the model of its spelling; an engine spelling needs that backend."""
    if not isinstance(entry, dict):
        raise ValueError(f"{where} must be a dict, got {entry!r}")
    try:
        spelling = pin_spelling(entry)
    except ValueError as err:
        raise ValueError(f"{where} {err}") from None
    try:
        SPELLING_MODELS[spelling].model_validate(entry)
    except ValidationError as err:
        raise ValueError(f"{where}.{render_validation_error(err)}") from None
    if spelling != "canonical" and spelling not in backends:
        words = sorted(SPELLING_KEYS[spelling] & set(entry))
        raise ValueError(f"{where} is written in {SPELLING_NAMES[spelling]}'s words ({', '.join(words)}) but backend lists "
                         f"{backends}; add {spelling} to backend or write the canonical keys "
                         "(tp, pp, attention_dp, moe_tp, moe_ep)")


# the speculative-decoding fields and their defaults (off), left out of a dump (SearchSpace._dump)
SPECULATIVE_DEFAULTS: dict[str, Any] = {"speculative_method": ["none"], "speculative_num_tokens": [0, 1, 2, 3],
                                        "speculative_draft_model": None}


# the fields of heterogeneous disaggregation, left out of a dump while unset (SearchSpace._dump)
ROLE_SYSTEM_FIELDS = ("prefill_hardware_sku", "decode_hardware_sku")


def _gpu_types(field: str, value: Any) -> Any:
    """A role's GPU type: one name or a non-empty, duplicate-free list of names (kept as a list)."""
    if value is None:
        return None
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise ValueError(f"{field} must be a GPU type or a non-empty list of them, got {value!r}")
    for i, item in enumerate(items):
        if not isinstance(item, str) or not item.strip():
            raise ValueError(f"{field} must name GPU types (strings), got {item!r}")
        if item in items[:i]:
            raise ValueError(f"{field} lists {item!r} more than once")
    return list(items)


def _budget_map(value: dict[Any, Any]) -> dict[str, int]:
    """gpu_budget written per GPU type: {type: GPUs}, each a positive integer."""
    if not value:
        raise ValueError("gpu_budget must be a positive number of GPUs or a map of GPU type to GPUs, got {}")
    for key, gpus in value.items():
        if not isinstance(key, str) or not key.strip():
            raise ValueError(f"gpu_budget: a GPU type must be a name, got {key!r}")
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
            raise ValueError(f"gpu_budget.{key} must be a positive number of GPUs, got {gpus!r}")
    return dict(value)


def _names(names: Iterable[str]) -> list[str | dict[str, Any]]:
    """A composite field's default: the preset names (a fresh list per config)."""
    return list(names)


class SearchSpace(StrictModel):
    """Searched knobs are lists (one element pins); context fields are pinned scalars."""

    # deployment
    deployment_mode: list[str] = Field(default_factory=lambda: ["disagg", "agg"])
    backend: list[str] = Field(default_factory=lambda: ["vllm"])
    parallel_configs: list[dict[str, Any]] = Field(default_factory=list)
    model_name: str = Field(min_length=1)
    hardware_sku: str = Field(min_length=1)
    # GPUs a candidate may use: one number, or a map per GPU type ({h100_sxm: 8, h200_sxm: 8}), which
    # `gpu_budget_by_type` holds while gpu_budget is their sum (a dump writes the map back as gpu_budget)
    gpu_budget: PosInt = 32
    gpu_budget_by_type: dict[str, PosInt] | None = Field(default=None, exclude=True)
    # heterogeneous disaggregation: the GPU type of the prefill and of the decode workers, one or a list
    # to search; unset = hardware_sku (what agg runs on)
    prefill_hardware_sku: list[str] | None = None
    decode_hardware_sku: list[str] | None = None
    min_gpu_budget: PosInt | None = None
    min_endpoint: PosInt | None = None
    context_length: PosInt | None = None
    startup_time: NonNegFloat | None = None
    aic_nextn: NonNegInt | None = None  # MTP draft tokens pinned; speculative_method/_num_tokens search them
    # speculative decoding, searched: the method (mtp: the checkpoint's own MTP layers; eagle3: a draft
    # head, `speculative_draft_model`) and the draft tokens per step (0 = off); a method the model cannot
    # run drops out of the search with the reason (space/branches.speculative_choices)
    speculative_method: list[str] = Field(default_factory=lambda: list(SPECULATIVE_DEFAULTS["speculative_method"]))
    speculative_num_tokens: list[Int] = Field(
        default_factory=lambda: list(SPECULATIVE_DEFAULTS["speculative_num_tokens"]))
    speculative_draft_model: str | None = Field(default=None, min_length=1)
    # weight / MoE / attention / KV-cache quantization (AIC modes); unset = the checkpoint's own
    precision: Precision | None = None

    # engine, per role
    prefill_max_num_batched_tokens: list[Int] = Field(default_factory=lambda: [8192, 16384, 32768])
    prefill_max_num_seqs: list[Int] = Field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128, 256])
    decode_max_num_batched_tokens: list[Int] = Field(default_factory=lambda: [8192])
    decode_max_num_seqs: list[Int] = Field(default_factory=lambda: [256, 512, 1024])
    agg_max_num_batched_tokens: list[Int] = Field(default_factory=lambda: [8192, 16384, 32768])
    agg_max_num_seqs: list[Int] = Field(default_factory=lambda: [256, 512, 1024])
    prefill_block_size: PosInt = 64
    decode_block_size: PosInt = 64
    agg_block_size: PosInt = 64
    prefill_gpu_memory_utilization: Fraction = 0.9
    decode_gpu_memory_utilization: Fraction = 0.9
    agg_gpu_memory_utilization: Fraction = 0.9
    prefill_enable_prefix_caching: Bool = True
    decode_enable_prefix_caching: Bool = False
    agg_enable_prefix_caching: Bool = True

    # KV manager, G2 host offload
    num_g2_blocks: NonNegInt = 0
    kv_bytes_per_token: PosInt | None = None
    bandwidth_g1_to_g2_gbps: PosFloat | None = None
    bandwidth_g2_to_g1_gbps: PosFloat | None = None
    offload_batch_size: PosInt | None = None

    # router
    router_mode: list[str] = Field(default_factory=lambda: ["kv_router", "round_robin"])
    overlap_score_credit: list[Float] = Field(default_factory=lambda: [0.0, 0.5, 1.0])
    prefill_load_scale: list[Float] = Field(
        default_factory=lambda: [0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
    )
    router_temperature: list[Float] = Field(default_factory=lambda: [0.0, 0.2, 0.5, 1.0])
    host_cache_hit_weight: list[Float] = Field(default_factory=lambda: [0.5, 0.75, 1.0])
    disk_cache_hit_weight: list[Float] = Field(default_factory=lambda: [0.0, 0.25, 0.5])
    active_decode_blocks_threshold: NonNegInt | None = None
    active_prefill_tokens_threshold: NonNegInt | None = None
    active_prefill_tokens_threshold_frac: NonNegFloat | None = None
    no_admission_control: Bool = False

    # planner composites
    planner_scaling_policy: list[str | dict[str, Any]] = Field(
        default_factory=lambda: _names(presets.SCALING_POLICY_PRESETS)
    )
    planner_fpm_sampling: list[str | dict[str, Any]] = Field(
        default_factory=lambda: _names(presets.FPM_SAMPLING_PRESETS)
    )
    planner_load_sensitivity: list[str | dict[str, Any]] = Field(
        default_factory=lambda: _names(presets.LOAD_SENSITIVITY_PRESETS)
    )
    load_predictor_candidates: list[str | dict[str, Any]] = Field(
        default_factory=lambda: _names(presets.LOAD_PREDICTOR_PRESETS)
    )

    @field_validator("deployment_mode", "backend", "router_mode", *presets.ENGINE_CHOICES,
                     *presets.ROUTER_CHOICES, mode="before")
    @classmethod
    def _no_dicts(cls, v: Any, info: Any) -> Any:
        """Only the four composite knobs take raw-dict pins (a dict is a self-contained preset)."""
        if isinstance(v, list) and any(isinstance(x, dict) for x in v):
            raise ValueError(f"{info.field_name} does not accept a dict entry")
        return v

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The speculative-decoding fields leave a dump while they hold their defaults, so a config without
        them dumps (and hashes: the Dagster journal key) as before they existed."""
        out = handler(self)
        for key, default in SPECULATIVE_DEFAULTS.items():
            if key in out and out[key] == default:
                out.pop(key)
        for key in ROLE_SYSTEM_FIELDS:
            if key in out and out[key] is None:
                out.pop(key)
        if self.gpu_budget_by_type is not None and "gpu_budget" in out:
            out["gpu_budget"] = dict(self.gpu_budget_by_type)
        return out

    @model_validator(mode="before")
    @classmethod
    def _budget_per_type(cls, data: Any) -> Any:
        """gpu_budget as a map per GPU type: the map is kept in gpu_budget_by_type, gpu_budget is its sum."""
        if not isinstance(data, dict) or not isinstance(data.get("gpu_budget"), dict):
            return data
        if data.get("gpu_budget_by_type") is not None:
            raise ValueError("write the budget per GPU type as gpu_budget: {type: GPUs}, without gpu_budget_by_type")
        per_type = _budget_map(data["gpu_budget"])
        return {**data, "gpu_budget": sum(per_type.values()), "gpu_budget_by_type": per_type}

    @field_validator(*ROLE_SYSTEM_FIELDS, mode="before")
    @classmethod
    def _role_systems(cls, v: Any, info: Any) -> Any:
        return _gpu_types(info.field_name, v)

    @field_validator("speculative_method", mode="before")
    @classmethod
    def _one_method(cls, v: Any) -> Any:
        """One method may be written as a plain string."""
        return [v] if isinstance(v, str) else v

    @field_validator(*LIST_CHOICES)
    @classmethod
    def _choices(cls, v: list[Any], info: Any) -> list[Any]:
        return _check_choices(info.field_name, v, LIST_CHOICES[info.field_name])

    @field_validator(*presets.ROUTER_CHOICES)
    @classmethod
    def _router(cls, v: list[float], info: Any) -> list[float]:
        return _check_choices(info.field_name, [float(x) for x in v], presets.ROUTER_CHOICES[info.field_name])

    @field_validator(*presets.COMPOSITES, mode="before")
    @classmethod
    def _composites(cls, v: Any, info: Any) -> list[Any]:
        return presets.validate_composite_list(info.field_name, v)

    @field_validator("parallel_configs", mode="before")
    @classmethod
    def _parallel_type(cls, v: Any) -> Any:
        if not isinstance(v, list):
            raise ValueError("parallel_configs must be a list of shape dicts")
        for i, entry in enumerate(v):
            if not isinstance(entry, dict):
                raise ValueError(f"parallel_configs[{i}] must be a dict, got {entry!r}")
        return v

    @model_validator(mode="after")
    def _cross_field(self) -> "SearchSpace":
        self._check_parallel_configs()
        if self.min_gpu_budget is not None and self.min_gpu_budget > self.gpu_budget:
            raise ValueError(
                f"min_gpu_budget ({self.min_gpu_budget}) must be <= gpu_budget ({self.gpu_budget})"
            )
        if self.num_g2_blocks > 0 and self.kv_bytes_per_token is None:
            raise ValueError(
                "kv_bytes_per_token is required when num_g2_blocks > 0 so replay can model KVBM offload"
            )
        self._check_speculative()
        self._check_role_systems()
        if "kv_router" in self.router_mode:
            set_fields = [f for f in presets.ADMISSION_FIELDS[:3] if getattr(self, f) is not None]
            if self.no_admission_control:
                set_fields.append("no_admission_control")
            if set_fields:
                raise ValueError(
                    f"admission-control fields {set_fields} are not supported by the Dynamo replay API "
                    "with kv_router; remove them or use router_mode: [round_robin]"
                )
        return self

    def _check_speculative(self) -> None:
        if self.speculative_on and self.aic_nextn:
            raise ValueError("aic_nextn pins MTP draft tokens and speculative_method searches them; set one "
                             "(speculative_method: mtp with speculative_num_tokens: [n] is aic_nextn: n)")
        if "eagle3" in self.speculative_method and self.speculative_draft_model is None:
            raise ValueError("speculative_method eagle3 needs speculative_draft_model: the EAGLE-3 draft "
                             "head's checkpoint (a Hugging Face id or path) the engines load")

    def _check_role_systems(self) -> None:
        """Per-role GPU types are a disagg setting; a budget per type sums to gpu_budget. Which types the
        budget must name is checked once the names resolve (preflight.check_gpu_types)."""
        if self.gpu_budget_by_type is not None and sum(self.gpu_budget_by_type.values()) != self.gpu_budget:
            raise ValueError(f"gpu_budget_by_type sums to {sum(self.gpu_budget_by_type.values())}, not gpu_budget "
                             f"{self.gpu_budget}; write the budget per GPU type as gpu_budget: {{type: GPUs}}")
        if not self.split_systems:
            return
        set_fields = [f for f in ROLE_SYSTEM_FIELDS if getattr(self, f) is not None]
        if "disagg" not in self.deployment_mode:
            raise ValueError(f"{set_fields[0]} places a disagg role on its own GPU type, but deployment_mode is "
                             f"{self.deployment_mode}; add disagg or remove {', '.join(set_fields)}")
        if self.parallel_configs:
            raise ValueError(f"parallel_configs are checked on one GPU type, and {', '.join(set_fields)} gives the "
                             "disagg roles their own: leave parallel_configs out (each role is enumerated on its "
                             "own type) or remove the per-role types")

    def _check_parallel_configs(self) -> None:
        if not self.parallel_configs:
            return
        if len(self.deployment_mode) != 1:
            raise ValueError(
                "pinning parallel_configs requires deployment_mode to list exactly one mode "
                f"(got {self.deployment_mode}); pin the mode too"
            )
        # validated by the pin model of its spelling; stored as written, so the config hash keeps its form
        mode = self.deployment_mode[0]
        for i, entry in enumerate(self.parallel_configs):
            where = f"parallel_configs[{i}]"
            if mode == "agg":
                if "prefill" in entry or "decode" in entry:
                    raise ValueError(f"{where} is a prefill/decode pair but deployment_mode is 'agg'")
                _check_role_pin(entry, where, self.backend)
                continue
            for role in ("prefill", "decode"):
                if role not in entry:
                    raise ValueError(f"{where}.{role}: field required")
            extra = sorted(set(entry) - {"prefill", "decode"})
            if extra:
                raise ValueError(f"{where}.{extra[0]}: unknown key (not allowed here)")
            for role in ("prefill", "decode"):
                _check_role_pin(entry[role], f"{where}.{role}", self.backend)

    # ---- helpers used by the search ----------------------------------------------------------

    @property
    def round_robin_only(self) -> bool:
        return self.router_mode == ["round_robin"]

    @property
    def offload_enabled(self) -> bool:
        return self.num_g2_blocks > 0

    @property
    def speculative_on(self) -> bool:
        """Some method other than none with some draft token count above 0 is listed."""
        methods = any(m != "none" for m in self.speculative_method)
        return methods and any(k > 0 for k in self.speculative_num_tokens)

    def role_systems(self, role: str) -> list[str]:
        """The GPU types a role may run on: agg on hardware_sku, prefill and decode on their own lists
        (hardware_sku when unset)."""
        listed = getattr(self, f"{role}_hardware_sku", None) if role in ("prefill", "decode") else None
        return list(listed) if listed else [self.hardware_sku]

    @property
    def split_systems(self) -> bool:
        """Whether a disagg role may run on another GPU type than hardware_sku."""
        return any(self.role_systems(role) != [self.hardware_sku] for role in ("prefill", "decode"))

    def type_budget(self, system: str) -> int:
        """The GPUs the candidates may use of one GPU type: its gpu_budget entry, else all of gpu_budget."""
        if self.gpu_budget_by_type is None:
            return int(self.gpu_budget)
        return int(self.gpu_budget_by_type.get(system, 0))

    def choice_lists(self) -> dict[str, list[Any]]:
        """Every list knob (atomic and composite) by name, in schema order."""
        names = ("deployment_mode", "backend", *presets.ENGINE_CHOICES, "router_mode",
                 *presets.ROUTER_CHOICES, *presets.COMPOSITES)
        return {name: list(getattr(self, name)) for name in names}
