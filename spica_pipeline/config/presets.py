"""Choice tables and composite presets of the searched knobs, and how a composite entry expands.

A composite entry is either a preset id (a string from the tables below) or a self-contained
"raw-dict pin" holding the unrolled fields directly. Expansion never merges a dict with a preset.
"""

from typing import Any

from spica_pipeline.config.types import is_finite_number

# ---- atomic choice tables (deployment, engine and router knobs) -----------------------------

DEPLOYMENT_MODES = ("disagg", "agg")
BACKENDS = ("vllm", "sglang", "trtllm")
ROUTER_MODES = ("kv_router", "round_robin")

ENGINE_CHOICES: dict[str, tuple[int, ...]] = {
    "prefill_max_num_batched_tokens": (8192, 16384, 32768),
    "prefill_max_num_seqs": (1, 2, 4, 8, 16, 32, 64, 128, 256),
    "decode_max_num_batched_tokens": (8192,),
    "decode_max_num_seqs": (256, 512, 1024),
    "agg_max_num_batched_tokens": (8192, 16384, 32768),
    "agg_max_num_seqs": (256, 512, 1024),
}

ROUTER_CHOICES: dict[str, tuple[float, ...]] = {
    "overlap_score_credit": (0.0, 0.5, 1.0),
    "prefill_load_scale": (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0),
    "router_temperature": (0.0, 0.2, 0.5, 1.0),
    "host_cache_hit_weight": (0.5, 0.75, 1.0),
    "disk_cache_hit_weight": (0.0, 0.25, 0.5),
}

# Speculative decoding: the draft method, and the draft tokens per step (0 = off). The replay's
# speculative model (ai-dynamo-runtime's `aic_nextn`) takes 1 to 5 draft tokens.
SPECULATIVE_METHODS = ("none", "mtp", "eagle3")
SPECULATIVE_TOKENS = (0, 1, 2, 3, 4, 5)

# Router knobs that only matter when host offload (G2) is on.
OFFLOAD_ROUTER_KNOBS = ("host_cache_hit_weight", "disk_cache_hit_weight")

ADMISSION_FIELDS = (
    "active_decode_blocks_threshold",
    "active_prefill_tokens_threshold",
    "active_prefill_tokens_threshold_frac",
    "no_admission_control",
)

# ---- composite presets (planner knobs) -------------------------------------------------------

SCALING_FIELDS = (
    "enable_throughput_scaling",
    "enable_load_scaling",
    "throughput_adjustment_interval_seconds",
    "load_adjustment_interval_seconds",
)


def _policy(tput: bool, load: bool, ti: int | None, li: int | None) -> dict[str, Any]:
    return dict(zip(SCALING_FIELDS, (tput, load, ti, li)))


SCALING_POLICY_PRESETS: dict[str, dict[str, Any]] = {
    "disabled": _policy(False, False, None, None),
    "throughput_180_5": _policy(True, False, 180, 5),
    "throughput_600_5": _policy(True, False, 600, 5),
    "load_180_5": _policy(False, True, 180, 5),
    "load_180_10": _policy(False, True, 180, 10),
    "hybrid_180_5": _policy(True, True, 180, 5),
    "hybrid_600_5": _policy(True, True, 600, 5),
}

FPM_FIELDS = ("max_num_fpm_samples", "fpm_sample_bucket_size")
FPM_SAMPLING_PRESETS: dict[str, dict[str, Any]] = {
    "small": {"max_num_fpm_samples": 32, "fpm_sample_bucket_size": 4},
    "default": {"max_num_fpm_samples": 64, "fpm_sample_bucket_size": 16},
    "large": {"max_num_fpm_samples": 128, "fpm_sample_bucket_size": 16},
    "fine": {"max_num_fpm_samples": 128, "fpm_sample_bucket_size": 64},
}

SENSITIVITY_FIELDS = ("load_scaling_down_sensitivity", "load_min_observations")
LOAD_SENSITIVITY_PRESETS: dict[str, dict[str, Any]] = {
    "aggressive": {"load_scaling_down_sensitivity": 70, "load_min_observations": 3},
    "default": {"load_scaling_down_sensitivity": 80, "load_min_observations": 5},
    "conservative": {"load_scaling_down_sensitivity": 90, "load_min_observations": 8},
}

PREDICTOR_FAMILIES = ("arima", "constant", "kalman", "prophet")
PREDICTOR_FIELDS = (
    "load_predictor",
    "load_predictor_log1p",
    "prophet_window_size",
    "kalman_q_level",
    "kalman_q_trend",
    "kalman_r",
    "kalman_min_points",
)
# The knobs each family owns, with the defaults that fill a custom dict's gaps.
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "constant": {},
    "arima": {},
    "prophet": {"prophet_window_size": 50},
    "kalman": {"kalman_q_level": 1.0, "kalman_q_trend": 0.1, "kalman_r": 10.0, "kalman_min_points": 5},
}


def _kalman(log1p: bool, q_level: float, q_trend: float, r: float, min_points: int) -> dict[str, Any]:
    return {
        "load_predictor": "kalman",
        "load_predictor_log1p": log1p,
        "kalman_q_level": q_level,
        "kalman_q_trend": q_trend,
        "kalman_r": r,
        "kalman_min_points": min_points,
    }


LOAD_PREDICTOR_PRESETS: dict[str, dict[str, Any]] = {
    "constant_last": {"load_predictor": "constant", "load_predictor_log1p": False},
    "arima_raw": {"load_predictor": "arima", "load_predictor_log1p": False},
    "arima_log1p": {"load_predictor": "arima", "load_predictor_log1p": True},
    "prophet_w20_raw": {"load_predictor": "prophet", "load_predictor_log1p": False, "prophet_window_size": 20},
    "prophet_w20_log1p": {"load_predictor": "prophet", "load_predictor_log1p": True, "prophet_window_size": 20},
    "prophet_w50_raw": {"load_predictor": "prophet", "load_predictor_log1p": False, "prophet_window_size": 50},
    "prophet_w50_log1p": {"load_predictor": "prophet", "load_predictor_log1p": True, "prophet_window_size": 50},
    "kalman_default_raw": _kalman(False, 1.0, 0.1, 10.0, 5),
    "kalman_default_log1p": _kalman(True, 1.0, 0.1, 10.0, 5),
    "kalman_reactive_raw": _kalman(False, 10.0, 1.0, 5.0, 3),
    "kalman_reactive_log1p": _kalman(True, 10.0, 1.0, 5.0, 3),
}


# ---- the composite knobs: presets plus allowed / required dict keys ---------------------------

COMPOSITES: dict[str, dict[str, Any]] = {
    "planner_scaling_policy": {
        "presets": SCALING_POLICY_PRESETS,
        "allowed": SCALING_FIELDS,
        "required": SCALING_FIELDS,
    },
    "planner_fpm_sampling": {"presets": FPM_SAMPLING_PRESETS, "allowed": FPM_FIELDS, "required": FPM_FIELDS},
    "planner_load_sensitivity": {
        "presets": LOAD_SENSITIVITY_PRESETS,
        "allowed": SENSITIVITY_FIELDS,
        "required": SENSITIVITY_FIELDS,
    },
    "load_predictor_candidates": {
        "presets": LOAD_PREDICTOR_PRESETS,
        "allowed": PREDICTOR_FIELDS,
        "required": ("load_predictor",),
    },
}


def composite_label(entry: str | dict[str, Any], index: int) -> str:
    """A stable name for a composite entry: the preset id, or `custom_<index>` for a dict."""
    return entry if isinstance(entry, str) else f"custom_{index}"


def _lookup(field: str, entry: str | dict[str, Any]) -> dict[str, Any]:
    if isinstance(entry, dict):
        return dict(entry)
    presets = COMPOSITES[field]["presets"]
    if entry not in presets:
        raise ValueError(f"{field} has invalid choice {entry!r}; allowed: {sorted(presets)}")
    return dict(presets[entry])


def expand_scaling_policy(entry: str | dict[str, Any]) -> dict[str, Any]:
    """The four scaling fields; a dict's missing flag means False, a missing interval None."""
    raw = _lookup("planner_scaling_policy", entry)
    return {
        "enable_throughput_scaling": bool(raw.get("enable_throughput_scaling", False)),
        "enable_load_scaling": bool(raw.get("enable_load_scaling", False)),
        "throughput_adjustment_interval_seconds": raw.get("throughput_adjustment_interval_seconds"),
        "load_adjustment_interval_seconds": raw.get("load_adjustment_interval_seconds"),
    }


def expand_fpm_sampling(entry: str | dict[str, Any]) -> dict[str, Any]:
    raw = _lookup("planner_fpm_sampling", entry)
    return {k: raw.get(k) for k in FPM_FIELDS}


def expand_load_sensitivity(entry: str | dict[str, Any]) -> dict[str, Any]:
    raw = _lookup("planner_load_sensitivity", entry)
    return {k: raw.get(k) for k in SENSITIVITY_FIELDS}


def expand_load_predictor(entry: str | dict[str, Any]) -> dict[str, Any]:
    """Family, log1p flag and only that family's own knobs, family defaults filling the gaps."""
    raw = _lookup("load_predictor_candidates", entry)
    family = raw.get("load_predictor")
    if family not in PREDICTOR_FAMILIES:
        raise ValueError(f"load_predictor must be one of [{', '.join(PREDICTOR_FAMILIES)}], got {family!r}")
    out: dict[str, Any] = {"load_predictor": family, "load_predictor_log1p": bool(raw.get("load_predictor_log1p", False))}
    for key, default in FAMILY_DEFAULTS[family].items():
        value = raw.get(key)
        out[key] = default if value is None else value
    return out


def enables_throughput_scaling(entry: str | dict[str, Any]) -> bool:
    return expand_scaling_policy(entry)["enable_throughput_scaling"]


def enables_load_scaling(entry: str | dict[str, Any]) -> bool:
    return expand_scaling_policy(entry)["enable_load_scaling"]


def is_static_policy(entry: str | dict[str, Any]) -> bool:
    """Both flags off: the planner is off and the replica count is static (same as `disabled`)."""
    policy = expand_scaling_policy(entry)
    return not (policy["enable_throughput_scaling"] or policy["enable_load_scaling"])


def throughput_intervals(policies: list[str | dict[str, Any]]) -> list[int | float]:
    """Sorted distinct throughput intervals among throughput-scaling policies (the load-predictor grid)."""
    found = set()
    for entry in policies:
        policy = expand_scaling_policy(entry)
        interval = policy["throughput_adjustment_interval_seconds"]
        if policy["enable_throughput_scaling"] and interval is not None:
            found.add(int(interval) if float(interval).is_integer() else float(interval))
    return sorted(found)


# ---- load-time checks of a composite list ----------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_dict_values(field: str, entry: dict[str, Any]) -> None:
    """Type checks of a raw-dict pin (stricter than upstream: no bool-as-number, no NaN/inf)."""

    def bad(key: str, want: str) -> ValueError:
        return ValueError(f"{field} dict entry: {key} must be {want}, got {entry[key]!r}")

    for key, value in entry.items():
        if key.startswith("enable_") or key == "load_predictor_log1p":
            if not isinstance(value, bool):
                raise bad(key, "true or false")
        elif key.endswith("_interval_seconds"):
            if value is not None and not (is_finite_number(value) and value > 0):
                raise bad(key, "a positive number or null")
        elif key in ("max_num_fpm_samples", "fpm_sample_bucket_size", "load_min_observations",
                     "prophet_window_size", "kalman_min_points"):
            if not (_is_int(value) and value > 0):
                raise bad(key, "a positive integer")
        elif key == "load_scaling_down_sensitivity":
            if not (is_finite_number(value) and 0 <= value <= 100):
                raise bad(key, "a number in [0, 100]")
        elif key in ("kalman_q_level", "kalman_q_trend", "kalman_r"):
            if not (is_finite_number(value) and value > 0):
                raise bad(key, "a positive number")
        elif key == "load_predictor":
            if value not in PREDICTOR_FAMILIES:
                raise ValueError(f"{field} dict entry: load_predictor must be one of "
                                 f"{list(PREDICTOR_FAMILIES)}, got {value!r}")
    if field == "planner_scaling_policy":
        for flag, interval in (("enable_throughput_scaling", "throughput_adjustment_interval_seconds"),
                               ("enable_load_scaling", "load_adjustment_interval_seconds")):
            if entry[flag] and entry[interval] is None:
                raise ValueError(f"{field} dict entry: {interval} is required when {flag} is true")


def validate_composite_list(field: str, value: Any) -> list[str | dict[str, Any]]:
    """Check one composite list at load time: non-empty; strings are known presets; dicts are non-empty,
    with no unknown and every required key (self-contained); plus value types and no duplicates."""
    spec = COMPOSITES[field]
    allowed = sorted(spec["presets"])
    if not isinstance(value, list):
        raise ValueError(f"{field} must be a list of preset ids or dicts; allowed presets: {allowed}")
    if not value:
        raise ValueError(f"{field} must list at least one choice; allowed: {allowed}")
    seen: list[Any] = []
    for entry in value:
        if isinstance(entry, str):
            if entry not in spec["presets"]:
                raise ValueError(f"{field} has invalid choice {entry!r}; allowed: {allowed}")
        elif isinstance(entry, dict):
            if not entry:
                raise ValueError(f"{field} dict entry must not be empty")
            unknown = sorted(str(k) for k in entry if k not in spec["allowed"])
            if unknown:
                raise ValueError(f"{field} dict has unknown keys {unknown}; allowed: {list(spec['allowed'])}")
            missing = [k for k in spec["required"] if k not in entry]
            if missing:
                raise ValueError(f"{field} dict is missing required keys {missing}; "
                                 "a dict entry must be self-contained")
            _check_dict_values(field, entry)
        else:
            raise ValueError(f"{field} entry {entry!r} must be a preset id or a dict; allowed presets: {allowed}")
        if entry in seen:
            raise ValueError(f"{field} lists {entry!r} more than once")
        seen.append(entry)
    return [dict(e) if isinstance(e, dict) else e for e in value]
