"""`unroll_sample`: one selection + one parallel config -> the flat, self-contained candidate dict.

Composite knobs are expanded and pinned scalars folded in, so nothing downstream decodes
preset ids again. Keys that do not apply to the chosen mode, router or planner state are absent.
"""

from typing import Any

from spica_pipeline.config import presets
from spica_pipeline.config.search_space import SearchSpace
from spica_pipeline.errors import SpicaError
from spica_pipeline.space.policies import is_static
from spica_pipeline.space.shapes import DisaggShape, ParallelConfig, RoleShape

PINNED_SCALARS = (
    "model_name",
    "hardware_sku",
    "gpu_budget",
    "min_gpu_budget",
    "min_endpoint",
    "context_length",
    "startup_time",
    "aic_nextn",
    "num_g2_blocks",
    "kv_bytes_per_token",
    "bandwidth_g1_to_g2_gbps",
    "bandwidth_g2_to_g1_gbps",
    "offload_batch_size",
)
ROLE_SCALARS = ("block_size", "gpu_memory_utilization", "enable_prefix_caching")
SHAPE_OUT_KEYS = ("tp", "pp", "attention_dp", "moe_tp", "moe_ep")
SEARCHED_ROUTER_KNOBS = ("overlap_score_credit", "prefill_load_scale", "router_temperature")


def _resolve_composite(space: SearchSpace, field: str, value: Any) -> Any:
    """A composite selection value: the entry itself, or a `custom_<i>` label / index into the list."""
    entries = getattr(space, field)
    if isinstance(value, bool):
        raise ValueError(f"{field}: selection value {value!r} is not an entry")
    if isinstance(value, int):
        return entries[value]
    if isinstance(value, str) and value.startswith("custom_") and value[7:].isdigit():
        entry = entries[int(value[7:])]
        if not isinstance(entry, dict):
            raise ValueError(f"{field}: {value!r} does not name a dict entry")
        return entry
    return value


def _pick(space: SearchSpace, selection: dict[str, Any], key: str) -> Any:
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


def _shape_fields(shape: RoleShape, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {f"{prefix}{k}": getattr(shape, k) for k in SHAPE_OUT_KEYS}
    out[f"{prefix}strategy"] = shape.strategy
    return out


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


def unroll_sample(
    search_space: SearchSpace,
    selection: dict[str, Any],
    parallel_config: ParallelConfig,
    load_predictor: Any = None,
) -> dict[str, Any]:
    """Build the flat candidate dict (raises TypeError on a mode/shape mismatch)."""
    space = search_space
    mode = _pick(space, selection, "deployment_mode")
    sample: dict[str, Any] = {"deployment_mode": mode, "backend": _pick(space, selection, "backend")}
    for key in PINNED_SCALARS:
        sample[key] = getattr(space, key)
    if space.precision is not None:  # only when set: an unset precision leaves the spec hash as it was
        sample.update(space.precision.sample_fields())

    # parallel fields
    if mode == "agg":
        if not isinstance(parallel_config, RoleShape):
            raise TypeError(f"agg needs a single-role RoleShape, got {type(parallel_config).__name__}")
        sample.update(_shape_fields(parallel_config))
        sample["replicas"] = parallel_config.replicas
        sample["used_gpus"] = parallel_config.used_gpus
        roles: tuple[str, ...] = ("agg",)
    elif mode == "disagg":
        if not isinstance(parallel_config, DisaggShape):
            raise TypeError(f"disagg needs a prefill/decode DisaggShape, got {type(parallel_config).__name__}")
        sample.update(_shape_fields(parallel_config.prefill, "prefill_"))
        sample.update(_shape_fields(parallel_config.decode, "decode_"))
        sample["prefill_replicas"] = parallel_config.prefill.replicas
        sample["decode_replicas"] = parallel_config.decode.replicas
        sample["used_gpus"] = parallel_config.used_gpus
        roles = ("prefill", "decode")
    else:
        raise ValueError(f"unknown deployment_mode {mode!r}")

    # engine knobs of the active roles
    for role in roles:
        for knob in ("max_num_batched_tokens", "max_num_seqs"):
            sample[f"{role}_{knob}"] = _pick(space, selection, f"{role}_{knob}")
        for scalar in ROLE_SCALARS:
            sample[f"{role}_{scalar}"] = getattr(space, f"{role}_{scalar}")

    # router
    router_mode = _pick(space, selection, "router_mode")
    sample["router_mode"] = router_mode
    if router_mode == "kv_router":
        for knob in SEARCHED_ROUTER_KNOBS:
            sample[knob] = _pick(space, selection, knob)
        for knob in presets.OFFLOAD_ROUTER_KNOBS:
            if knob in selection or (space.offload_enabled and len(getattr(space, knob)) == 1):
                sample[knob] = _pick(space, selection, knob)
        for field in presets.ADMISSION_FIELDS:
            sample[field] = getattr(space, field)

    # planner
    entry = _pick(space, selection, "planner_scaling_policy")
    policy = presets.expand_scaling_policy(entry)
    sample["planner_scaling_policy"] = dict(entry) if isinstance(entry, dict) else entry
    sample["enable_throughput_scaling"] = policy["enable_throughput_scaling"]
    sample["enable_load_scaling"] = policy["enable_load_scaling"]
    if not (policy["enable_throughput_scaling"] or policy["enable_load_scaling"]):
        return sample
    sample["throughput_adjustment_interval_seconds"] = policy["throughput_adjustment_interval_seconds"]
    sample["load_adjustment_interval_seconds"] = policy["load_adjustment_interval_seconds"]
    sample.update(presets.expand_fpm_sampling(_pick(space, selection, "planner_fpm_sampling")))
    sample.update(presets.expand_load_sensitivity(_pick(space, selection, "planner_load_sensitivity")))
    if policy["enable_throughput_scaling"]:
        winner = _predictor_entry(load_predictor, policy["throughput_adjustment_interval_seconds"])
        if winner is not None:
            sample.update(presets.expand_load_predictor(winner))
    return sample


def router_has_choice(sample: dict[str, Any]) -> bool:
    """Whether a KV router can route differently between repeats of this candidate.

    With one worker per role (one replica and no attention-DP ranks) and no planner scaling, every
    request has exactly one destination, so repeated kv_router replays return the same numbers
    (spread 0 on every such candidate seen): one replay is enough."""

    mode = sample.get("deployment_mode")
    roles = ("",) if mode == "agg" else ("prefill_", "decode_")
    for prefix in roles:
        if int(sample.get(f"{prefix}replicas") or 1) > 1 or int(sample.get(f"{prefix}attention_dp") or 1) > 1:
            return True
    policy = sample.get("planner_scaling_policy")
    if policy is None:
        return False
    try:
        return not is_static(policy)
    except (ValueError, SpicaError):  # an unreadable policy: keep the repeats, the replay reports the error
        return True


def router_repeats_for(sample: dict[str, Any], repeats: int) -> int:
    """Replays per candidate: `repeats` for a KV router that has a choice, else 1."""
    if sample.get("router_mode") != "kv_router" or not router_has_choice(sample):
        return 1
    return max(1, int(repeats))
