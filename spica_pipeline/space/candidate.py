"""A candidate: one deployment the sweep evaluates, as a small typed value.

Per role (agg, or prefill and decode) its parallel shape with its replica count and its engine
arguments; the router and its knobs; the planner (None when static); the search space's pinned
scalars (budgets, context length, startup time, MTP draft layers, host offload); speculative decoding
when searched (method and draft tokens); the precision; a role's own GPU type when it is not the
candidate's (heterogeneous disaggregation) and the budget per GPU type;
and, once the sweep resolves them, the perf-database version and the load it is replayed at.

`Candidate.to_dict()` is its one flat serialisation: agg shape fields unprefixed (`tp`), disagg ones
by role (`prefill_tp`), engine knobs by role (`agg_max_num_seqs`), router and planner fields
unprefixed, a role's GPU type (`decode_hardware_sku`) only where it is not `hardware_sku`, and keys
that do not apply to the mode, router or planner state absent. Spec hashes,
the journal, the ledger's `config` column and the deploy output are built from it, so its keys and
values never change; `Candidate.from_dict` reads it back.

`build_candidate` makes one from a selection and a parallel config: composite knobs are expanded and
pinned scalars folded in, so nothing downstream decodes preset ids again.
"""

import json
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Literal, Mapping

from spica_pipeline.config import presets
from spica_pipeline.config.precision import CHOICES as PRECISION_FIELDS
from spica_pipeline.config.precision import SAMPLE_PREFIX as PRECISION_PREFIX
from spica_pipeline.config.search_space import SearchSpace
from spica_pipeline.space.policies import PolicyEntry
from spica_pipeline.space.shapes import SHAPE_KEYS, DisaggShape, ParallelConfig, RoleShape

# the roles of each deployment mode, in the order every consumer walks them (prefill before decode)
MODE_ROLES: dict[str, tuple[str, ...]] = {"agg": ("agg",), "disagg": ("prefill", "decode")}


@dataclass(frozen=True)
class EngineArgs:
    """One role's engine knobs, the same for every replica of the role."""

    max_num_batched_tokens: int
    max_num_seqs: int
    block_size: int
    gpu_memory_utilization: float
    enable_prefix_caching: bool


ENGINE_FIELDS = tuple(f.name for f in fields(EngineArgs))
SEARCHED_ENGINE_FIELDS = ("max_num_batched_tokens", "max_num_seqs")  # the rest are pinned scalars


@dataclass(frozen=True)
class Role:
    """One worker pool: agg, prefill or decode; its engine layout with the replica count, its engine
    arguments, and its GPU type when it is not the candidate's (`system`; None = the candidate's, and
    then absent from the flat form). Read a role's type with `Candidate.role_system`."""

    name: str
    shape: RoleShape
    engine: EngineArgs
    system: str | None = None

    @property
    def replicas(self) -> int:
        return self.shape.replicas

    @property
    def gpus_per_engine(self) -> int:
        return self.shape.gpus_per_engine

    @property
    def used_gpus(self) -> int:
        return self.shape.used_gpus

    @property
    def prefix(self) -> str:
        """The flat prefix of the role's shape fields: none for agg (`tp`), the role's for disagg."""
        return "" if self.name == "agg" else f"{self.name}_"


@dataclass(frozen=True)
class Admission:
    """The KV router's admission-control scalars (pinned in the search space; None = unset)."""

    active_decode_blocks_threshold: int | None = None
    active_prefill_tokens_threshold: int | None = None
    active_prefill_tokens_threshold_frac: float | None = None
    no_admission_control: bool | None = None


ADMISSION_FIELDS = tuple(f.name for f in fields(Admission))  # = presets.ADMISSION_FIELDS


@dataclass(frozen=True)
class Router:
    """How the frontend routes: `round_robin`, or `kv_router` with its knobs (None = not set).

    A KV router carries its searched knobs and its admission scalars; the host and disk cache-hit
    weights only when host offload is on or they are searched."""

    mode: str = "round_robin"
    overlap_score_credit: float | None = None
    prefill_load_scale: float | None = None
    router_temperature: float | None = None
    host_cache_hit_weight: float | None = None
    disk_cache_hit_weight: float | None = None
    admission: Admission | None = None

    @property
    def is_kv(self) -> bool:
        return self.mode == "kv_router"

    def knobs(self) -> dict[str, float]:
        """The set routing knobs by name (the replay's KvRouterConfig fields)."""
        return {k: v for k in ROUTER_KNOBS if (v := getattr(self, k)) is not None}


ROUTER_KNOBS = ("overlap_score_credit", "prefill_load_scale", "router_temperature", "host_cache_hit_weight",
                "disk_cache_hit_weight")
SEARCHED_ROUTER_KNOBS = ROUTER_KNOBS[:3]


@dataclass(frozen=True)
class LoadPredictor:
    """The throughput planner's forecaster: a family, its log1p flag and only that family's knobs."""

    load_predictor: str
    load_predictor_log1p: bool = False
    prophet_window_size: int | None = None
    kalman_q_level: float | None = None
    kalman_q_trend: float | None = None
    kalman_r: float | None = None
    kalman_min_points: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The family and its set knobs (what `presets.expand_load_predictor` gives)."""
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}


PREDICTOR_FIELDS = tuple(f.name for f in fields(LoadPredictor))  # = presets.PREDICTOR_FIELDS


@dataclass(frozen=True)
class Planner:
    """A scaling planner: at least one of throughput and load scaling on, with its expanded settings."""

    enable_throughput_scaling: bool
    enable_load_scaling: bool
    throughput_adjustment_interval_seconds: float | None = None
    load_adjustment_interval_seconds: float | None = None
    max_num_fpm_samples: int | None = None
    fpm_sample_bucket_size: int | None = None
    load_scaling_down_sensitivity: float | None = None
    load_min_observations: int | None = None
    predictor: LoadPredictor | None = None  # throughput scaling with a sub-sweep winner for its interval

    def settings(self) -> dict[str, Any]:
        """The scaling, FPM-sampling and sensitivity fields by name, then the predictor's."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "predictor"}
        if self.predictor is not None:
            out.update(self.predictor.to_dict())
        return out


PLANNER_FIELDS = tuple(f.name for f in fields(Planner) if f.name != "predictor")


@dataclass(frozen=True)
class HostOffload:
    """KVBM host (G2) offload, on when `num_g2_blocks` > 0; prefill and agg engines carry it."""

    num_g2_blocks: int | None = None
    kv_bytes_per_token: int | None = None
    bandwidth_g1_to_g2_gbps: float | None = None
    bandwidth_g2_to_g1_gbps: float | None = None
    offload_batch_size: int | None = None

    @property
    def enabled(self) -> bool:
        return int(self.num_g2_blocks or 0) > 0

    def set_fields(self) -> dict[str, Any]:
        """The set fields by name (what an offloading engine's arguments carry)."""
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}


OFFLOAD_FIELDS = tuple(f.name for f in fields(HostOffload))
# the scalars every flat candidate carries, None or not, in their flat order
PINNED_SCALARS = ("gpu_budget", "min_gpu_budget", "min_endpoint", "context_length", "startup_time",
                  "aic_nextn")
# speculative decoding: in the flat form only when on
SPECULATIVE_FIELDS = ("speculative_method", "speculative_num_tokens", "speculative_draft_model")


@dataclass(frozen=True)
class Candidate:
    """One deployment to evaluate; see the module docstring. `roles` is (agg,) or (prefill, decode).

    `scaling_policy` is the selected planner_scaling_policy entry as configured (a preset id or a
    raw dict), `planner` its expansion (None when both scaling flags are off). `precision` maps the
    set precision fields (weights, moe, attention, kv_cache) to their modes. `backend_version`,
    `concurrency` and `kv_load_ratio` are None until the sweep resolves them (and stay None where a
    workload has no such load).

    `system` is the GPU type of every role without one of its own (`Role.system`); `gpu_budget` is the
    GPUs it may use in all, `gpu_budget_by_type` the GPUs of each type when the budget is per type.

    A new setting (a role's own GPU type, a speculative-decoding method) is a field whose default
    `to_dict` leaves out, so every existing candidate keeps its flat keys and its spec hash."""

    model: str
    system: str
    backend: str
    roles: tuple[Role, ...]
    router: Router = field(default_factory=Router)
    scaling_policy: PolicyEntry = "disabled"
    planner: Planner | None = None
    precision: Mapping[str, str] = field(default_factory=dict)
    gpu_budget: int | None = None
    min_gpu_budget: int | None = None
    min_endpoint: int | None = None
    context_length: int | None = None
    startup_time: float | None = None
    aic_nextn: int | None = None
    gpu_budget_by_type: Mapping[str, int] | None = None
    offload: HostOffload = field(default_factory=HostOffload)
    # speculative decoding searched: the method (mtp, eagle3) and its draft tokens per step; both None
    # when off (a method with 0 tokens is off), and then absent from the flat form
    speculative_method: str | None = None
    speculative_num_tokens: int | None = None
    speculative_draft_model: str | None = None  # the EAGLE-3 draft head's checkpoint
    backend_version: str | None = None
    concurrency: int | None = None
    kv_load_ratio: float | None = None

    def __post_init__(self) -> None:
        names = tuple(r.name for r in self.roles)
        if names not in MODE_ROLES.values():
            raise ValueError(f"a candidate's roles are (agg,) or (prefill, decode), got {names}")
        if names == ("agg",) and self.roles[0].system not in (None, self.system):
            raise ValueError("an agg candidate runs on its own GPU type (system), not a role's")

    # ---- reading ---------------------------------------------------------------------------

    @property
    def deployment_mode(self) -> str:
        return "agg" if self.roles[0].name == "agg" else "disagg"

    @property
    def role_names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.roles)

    def role(self, name: str) -> Role:
        for r in self.roles:
            if r.name == name:
                return r
        raise KeyError(f"a {self.deployment_mode} candidate has no {name!r} role")

    @property
    def load_role(self) -> Role:
        """The role whose KV capacity bounds in-flight requests: decode for disagg, else agg."""
        return self.roles[-1]

    @property
    def used_gpus(self) -> int:
        """Provisioned GPUs: engine GPUs x replicas over the roles (a static fleet)."""
        return sum(r.used_gpus for r in self.roles)

    @property
    def is_static(self) -> bool:
        return self.planner is None

    def role_system(self, role: "str | Role") -> str:
        """The GPU type a role runs on: its own, else the candidate's."""
        r = self.role(role) if isinstance(role, str) else role
        return r.system or self.system

    @property
    def systems(self) -> tuple[str, ...]:
        """The GPU types the candidate runs on, in role order (one unless its roles have their own)."""
        return tuple(dict.fromkeys(self.role_system(r) for r in self.roles))

    def gpus_by_system(self) -> dict[str, int]:
        """Provisioned GPUs per GPU type (a static fleet), in role order."""
        out: dict[str, int] = {}
        for r in self.roles:
            out[self.role_system(r)] = out.get(self.role_system(r), 0) + r.used_gpus
        return out

    def over_type_budget(self) -> str | None:
        """Why the candidate uses more GPUs of a type than its budget for that type gives, or None."""
        if self.gpu_budget_by_type is None:
            return None
        for system, gpus in self.gpus_by_system().items():
            budget = int(self.gpu_budget_by_type.get(system, 0))
            if gpus > budget:
                return f"over gpu_budget for {system}: {gpus} GPUs > {budget}"
        return None

    def gpu_usd_per_hour(self, price_of: Callable[[str], float | None]) -> float | None:
        """USD per GPU-hour averaged over the candidate's GPUs, each priced by its type (`price_of`, e.g. the
        goal's gpu_usd_per_hour): what its GPUs cost per hour over their count; None when a type has no price."""
        gpus = self.gpus_by_system()
        if len(gpus) == 1:  # one GPU type: its price as it is
            return price_of(next(iter(gpus)))
        prices = {system: price_of(system) for system in gpus}
        if any(p is None for p in prices.values()) or not sum(gpus.values()):
            return None
        return sum(float(prices[s] or 0.0) * n for s, n in gpus.items()) / sum(gpus.values())

    @property
    def draft_tokens(self) -> int:
        """Draft tokens per decode step: the searched speculative count, else the pinned aic_nextn, else 0."""
        return int(self.speculative_num_tokens or self.aic_nextn or 0)

    @property
    def draft_method(self) -> str | None:
        """'mtp' or 'eagle3' while speculating (a pinned aic_nextn is MTP), None otherwise."""
        if self.speculative_method:
            return self.speculative_method
        return "mtp" if self.aic_nextn else None

    def quant_modes(self) -> tuple[str | None, str | None, str | None, str | None]:
        """(gemm, moe, kvcache, fmha) quant modes, as AIC's KV estimator names them."""
        p = self.precision
        return (p.get("weights"), p.get("moe"), p.get("kv_cache"), p.get("attention"))

    # ---- the flat form -------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The flat candidate dict (module docstring): the form every hash and record is built from."""
        out: dict[str, Any] = {"deployment_mode": self.deployment_mode, "backend": self.backend,
                               "model_name": self.model, "hardware_sku": self.system}
        out.update({f"{r.name}_hardware_sku": r.system for r in self.roles if r.system not in (None, self.system)})
        for key in PINNED_SCALARS:
            out[key] = getattr(self, key)
        if self.gpu_budget_by_type is not None:
            out["gpu_budget_by_type"] = dict(self.gpu_budget_by_type)
        out.update({k: v for k in SPECULATIVE_FIELDS if (v := getattr(self, k)) is not None})
        for key in OFFLOAD_FIELDS:
            out[key] = getattr(self.offload, key)
        out.update({f"{PRECISION_PREFIX}{k}": self.precision[k]
                    for k in PRECISION_FIELDS if k in self.precision})
        for role in self.roles:
            out.update({f"{role.prefix}{k}": getattr(role.shape, k) for k in SHAPE_KEYS})
            out[f"{role.prefix}strategy"] = role.shape.strategy
        for role in self.roles:
            out["replicas" if role.name == "agg" else f"{role.name}_replicas"] = role.replicas
        out["used_gpus"] = self.used_gpus
        for role in self.roles:
            out.update({f"{role.name}_{k}": getattr(role.engine, k) for k in ENGINE_FIELDS})
        out["router_mode"] = self.router.mode
        out.update(self.router.knobs())
        if self.router.admission is not None:
            out.update({k: getattr(self.router.admission, k) for k in ADMISSION_FIELDS})
        policy = self.scaling_policy
        out["planner_scaling_policy"] = dict(policy) if isinstance(policy, dict) else policy
        if self.planner is None:
            out["enable_throughput_scaling"] = out["enable_load_scaling"] = False
        else:
            out.update(self.planner.settings())
        for key in ("backend_version", "concurrency", "kv_load_ratio"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, extra: Literal["forbid", "ignore"] = "forbid") -> "Candidate":
        """Read a flat candidate dict back (ValueError naming the field when it cannot be one).

        extra="forbid" (building a request) also refuses keys no candidate has and values that
        disagree with the shape (`used_gpus`, `strategy`), so `to_dict` gives the same keys back;
        extra="ignore" reads a ledger row's `config`, whose derived fields (KV capacities, block
        counts, notes) are not the candidate's."""
        mode = d.get("deployment_mode")
        if mode not in MODE_ROLES:
            raise ValueError(f"deployment_mode must be 'agg' or 'disagg', got {mode!r}")
        system = _required(d, "hardware_sku")
        roles = tuple(_role_from_dict(d, name, system) for name in MODE_ROLES[mode])
        router = Router(
            mode=str(d.get("router_mode") or "round_robin"),
            **{k: d[k] for k in ROUTER_KNOBS if d.get(k) is not None},
            admission=(Admission(**{k: d.get(k) for k in ADMISSION_FIELDS})
                       if any(k in d for k in ADMISSION_FIELDS) else None),
        )
        planner = None
        if d.get("enable_throughput_scaling") or d.get("enable_load_scaling"):
            predictor = None
            if d.get("load_predictor") is not None:
                predictor = LoadPredictor(**{k: d[k] for k in PREDICTOR_FIELDS if d.get(k) is not None})
            settings: dict[str, Any] = {k: d.get(k) for k in PLANNER_FIELDS}
            for flag in ("enable_throughput_scaling", "enable_load_scaling"):
                settings[flag] = bool(settings[flag])
            planner = Planner(**settings, predictor=predictor)
        policy = d.get("planner_scaling_policy", "disabled")
        candidate = cls(
            model=_required(d, "model_name"), system=system,
            backend=_required(d, "backend"),
            roles=roles, router=router, scaling_policy=dict(policy) if isinstance(policy, dict) else policy,
            planner=planner,
            precision={k: str(d[f"{PRECISION_PREFIX}{k}"]) for k in PRECISION_FIELDS
                       if d.get(f"{PRECISION_PREFIX}{k}")},
            **{k: d.get(k) for k in PINNED_SCALARS},
            gpu_budget_by_type=_budget_by_type(d.get("gpu_budget_by_type")),
            **{k: d.get(k) for k in SPECULATIVE_FIELDS},
            offload=HostOffload(**{k: d.get(k) for k in OFFLOAD_FIELDS}),
            backend_version=d.get("backend_version"), concurrency=d.get("concurrency"),
            kv_load_ratio=d.get("kv_load_ratio"),
        )
        if extra == "forbid":
            _check_round_trip(d, candidate.to_dict())
        return candidate


def _required(d: Mapping[str, Any], key: str) -> Any:
    if d.get(key) is None:
        raise ValueError(f"a candidate needs {key!r}")
    return d[key]


def _budget_by_type(value: Any) -> dict[str, int] | None:
    """A per-type budget as the flat form holds it (a ledger may have stored it as JSON text)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = json.loads(value)
    return {str(k): int(v) for k, v in dict(value).items()}


def _role_from_dict(d: Mapping[str, Any], name: str, system: str) -> Role:
    prefix = "" if name == "agg" else f"{name}_"
    replicas = d.get("replicas" if name == "agg" else f"{name}_replicas")
    shape = RoleShape(**{k: int(d.get(f"{prefix}{k}") or 1) for k in SHAPE_KEYS}, replicas=int(replicas or 1))
    missing = [f"{name}_{k}" for k in ENGINE_FIELDS if f"{name}_{k}" not in d]
    if missing:
        raise ValueError(f"a {name} role needs {', '.join(missing)}")
    own = d.get(f"{name}_hardware_sku") if name != "agg" else None
    return Role(name, shape, EngineArgs(**{k: d[f"{name}_{k}"] for k in ENGINE_FIELDS}),
                system=str(own) if own and own != system else None)


def _check_round_trip(d: Mapping[str, Any], back: dict[str, Any]) -> None:
    unknown = sorted(k for k in d if k not in back and d[k] is not None)  # None: an unset optional field
    if unknown:
        raise ValueError(f"not candidate fields: {', '.join(unknown)}")
    differ = [f"{k}={d[k]!r} (the candidate gives {back[k]!r})" for k in d if k in back and back[k] != d[k]]
    if differ:
        raise ValueError(f"inconsistent candidate fields: {'; '.join(differ)}")


# ---- building a candidate from a selection ---------------------------------------------------

def _resolve_composite(space: SearchSpace, field_name: str, value: Any) -> Any:
    """A composite selection value: the entry itself, or a `custom_<i>` label / index into the list."""
    entries = getattr(space, field_name)
    if isinstance(value, bool):
        raise ValueError(f"{field_name}: selection value {value!r} is not an entry")
    if isinstance(value, int):
        return entries[value]
    if isinstance(value, str) and value.startswith("custom_") and value[7:].isdigit():
        entry = entries[int(value[7:])]
        if not isinstance(entry, dict):
            raise ValueError(f"{field_name}: {value!r} does not name a dict entry")
        return entry
    return value


def _pick(space: SearchSpace, selection: Mapping[str, Any], key: str) -> Any:
    """The selected value; a knob pinned by a one-element list may be left out of the selection."""
    if key in selection:
        value = selection[key]
    else:
        choices = getattr(space, key)
        if len(choices) != 1:
            raise KeyError(f"selection is missing {key!r} (searched over {len(choices)} choices)")
        value = choices[0]
    if key in presets.COMPOSITES:
        value = _resolve_composite(space, key, value)
    return value


def _predictor_entry(load_predictor: Any, interval: Any) -> Any:
    """The winner for a throughput interval; keys may be ints or (after JSON) strings."""
    if load_predictor is None or interval is None:
        return None
    if isinstance(load_predictor, dict):
        best = load_predictor.get("best_by_interval") or {}
    else:
        best = getattr(load_predictor, "best_by_interval", None) or {}
    keys = [interval]
    if isinstance(interval, float) and interval.is_integer():
        keys.append(int(interval))
    keys += [str(k) for k in list(keys)]
    for key in keys:
        if key in best:
            return best[key]
    return None


def _role_shapes(mode: str, parallel_config: ParallelConfig) -> dict[str, RoleShape]:
    if mode == "agg":
        if not isinstance(parallel_config, RoleShape):
            raise TypeError(f"agg needs a single-role RoleShape, got {type(parallel_config).__name__}")
        return {"agg": parallel_config}
    if mode == "disagg":
        if not isinstance(parallel_config, DisaggShape):
            raise TypeError(f"disagg needs a prefill/decode DisaggShape, "
                            f"got {type(parallel_config).__name__}")
        return {"prefill": parallel_config.prefill, "decode": parallel_config.decode}
    raise ValueError(f"unknown deployment_mode {mode!r}")


def _router(space: SearchSpace, selection: Mapping[str, Any]) -> Router:
    mode = _pick(space, selection, "router_mode")
    if mode != "kv_router":
        return Router(mode)
    knobs = {k: _pick(space, selection, k) for k in SEARCHED_ROUTER_KNOBS}
    for knob in presets.OFFLOAD_ROUTER_KNOBS:
        if knob in selection or (space.offload_enabled and len(getattr(space, knob)) == 1):
            knobs[knob] = _pick(space, selection, knob)
    admission = Admission(**{k: getattr(space, k) for k in ADMISSION_FIELDS})
    return Router(mode, **knobs, admission=admission)


def _planner(space: SearchSpace, selection: Mapping[str, Any], entry: PolicyEntry,
             load_predictor: Any) -> Planner | None:
    policy = presets.expand_scaling_policy(entry)
    if not (policy["enable_throughput_scaling"] or policy["enable_load_scaling"]):
        return None
    predictor = None
    if policy["enable_throughput_scaling"]:
        winner = _predictor_entry(load_predictor, policy["throughput_adjustment_interval_seconds"])
        if winner is not None:
            predictor = LoadPredictor(**presets.expand_load_predictor(winner))
    return Planner(**policy,
                   **presets.expand_fpm_sampling(_pick(space, selection, "planner_fpm_sampling")),
                   **presets.expand_load_sensitivity(_pick(space, selection, "planner_load_sensitivity")),
                   predictor=predictor)


def build_candidate(
    search_space: SearchSpace,
    selection: Mapping[str, Any],
    parallel_config: ParallelConfig,
    load_predictor: Any = None,
) -> Candidate:
    """The candidate of one selection and parallel config (TypeError on a mode/shape mismatch,
    KeyError when a searched knob is missing from the selection)."""
    space = search_space
    mode = _pick(space, selection, "deployment_mode")
    backend = _pick(space, selection, "backend")
    roles = []
    for name, shape in _role_shapes(mode, parallel_config).items():
        searched = {k: _pick(space, selection, f"{name}_{k}") for k in SEARCHED_ENGINE_FIELDS}
        pinned = {k: getattr(space, f"{name}_{k}") for k in ENGINE_FIELDS if k not in SEARCHED_ENGINE_FIELDS}
        system = _role_system(space, selection, name)
        roles.append(Role(name, shape, EngineArgs(**searched, **pinned),
                          system=None if system == space.hardware_sku else system))
    entry = _pick(space, selection, "planner_scaling_policy")
    method, tokens = _speculative(selection)
    return Candidate(
        model=space.model_name, system=space.hardware_sku, backend=backend, roles=tuple(roles),
        router=_router(space, selection), scaling_policy=dict(entry) if isinstance(entry, dict) else entry,
        planner=_planner(space, selection, entry, load_predictor),
        # only the set fields: an unset precision leaves the flat form (and the spec hash) as it was
        precision={k: v for k, v in (space.precision.model_dump() if space.precision else {}).items()
                   if v is not None},
        **{k: getattr(space, k) for k in PINNED_SCALARS},
        gpu_budget_by_type=dict(space.gpu_budget_by_type) if space.gpu_budget_by_type is not None else None,
        offload=HostOffload(**{k: getattr(space, k) for k in OFFLOAD_FIELDS}),
        speculative_method=method, speculative_num_tokens=tokens,
        speculative_draft_model=space.speculative_draft_model if method == "eagle3" else None,
    )


def _role_system(space: SearchSpace, selection: Mapping[str, Any], role: str) -> str:
    """A role's GPU type: the selection's when the branch searches it (`<role>_hardware_sku`), else the one
    type the space gives the role (space/branches.knob_choices_for lists the knob only for several)."""
    key = f"{role}_hardware_sku"
    if key in selection:
        return str(selection[key])
    systems = space.role_systems(role)
    if len(systems) != 1:
        raise KeyError(f"selection is missing {key!r} (searched over {len(systems)} GPU types)")
    return systems[0]


def _speculative(selection: Mapping[str, Any]) -> tuple[str | None, int | None]:
    """(method, draft tokens) of a selection, (None, None) when off. Only the selection says: the branch
    leaves the knobs out where the model cannot speculate (space/branches.speculative_choices)."""
    method, tokens = selection.get("speculative_method"), selection.get("speculative_num_tokens")
    if method in (None, "none") or tokens is None or int(tokens) <= 0:
        return None, None
    return str(method), int(tokens)


# ---- KV-router repeats ------------------------------------------------------------------------

def router_has_choice(candidate: Candidate) -> bool:
    """Whether a KV router can route differently between repeats of this candidate.

    With one worker per role (one replica and no attention-DP ranks) and no planner scaling, every
    request has exactly one destination, so repeated kv_router replays return the same numbers
    (spread 0 on every such candidate seen): one replay is enough."""
    if any(r.replicas > 1 or r.shape.attention_dp > 1 for r in candidate.roles):
        return True
    return not candidate.is_static


def router_repeats_for(candidate: Candidate, repeats: int) -> int:
    """Replays per candidate: `repeats` for a KV router that has a choice, else 1."""
    if not candidate.router.is_kv or not router_has_choice(candidate):
        return 1
    return max(1, int(repeats))
