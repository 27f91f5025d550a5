"""From an unrolled sample to a `DeploymentPlan`: pure dict building.

The plan is what a deployment (or the replay) needs per role; nothing from Dynamo is imported here,
so the same plan feeds the evaluator, the deploy YAML and tests alike.
"""

from dataclasses import asdict, dataclass
from typing import Any

ROLES = ("agg", "prefill", "decode")

SCALING_FIELDS = (
    "enable_throughput_scaling", "enable_load_scaling",
    "throughput_adjustment_interval_seconds", "load_adjustment_interval_seconds",
)
FPM_FIELDS = ("max_num_fpm_samples", "fpm_sample_bucket_size")
SENSITIVITY_FIELDS = ("load_scaling_down_sensitivity", "load_min_observations")
PREDICTOR_FIELDS = (
    "load_predictor", "load_predictor_log1p", "prophet_window_size",
    "kalman_q_level", "kalman_q_trend", "kalman_r", "kalman_min_points",
)
ROUTER_FIELDS = (
    "overlap_score_credit", "prefill_load_scale", "host_cache_hit_weight", "disk_cache_hit_weight",
    "router_temperature",
)

@dataclass(frozen=True)
class DeploymentPlan:
    deployment_mode: str
    is_static: bool
    agg_engine_args: dict[str, Any] | None
    prefill_engine_args: dict[str, Any] | None
    decode_engine_args: dict[str, Any] | None
    num_workers: int
    num_prefill_workers: int
    num_decode_workers: int
    router_mode: str
    router_config: dict[str, Any] | None
    planner_config: dict[str, Any] | None

    def engine_args(self) -> dict[str, dict[str, Any]]:
        """The active roles' engine args by role name, prefill before decode."""
        out = {}
        for role in ROLES:
            args = getattr(self, f"{role}_engine_args")
            if args is not None:
                out[role] = args
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def shape_prefix(sample: dict[str, Any], role: str) -> str:
    """Agg shape fields are unprefixed (`tp`); disagg ones carry the role (`prefill_tp`)."""
    return "" if role == "agg" else f"{role}_"


def role_shape(sample: dict[str, Any], role: str) -> tuple[int, int, int, int, int]:
    """(tp, pp, attention_dp, moe_tp, moe_ep) of one role; missing dimensions default to 1."""
    p = shape_prefix(sample, role)
    tp, pp, dp, moe_tp, moe_ep = (int(sample.get(f"{p}{k}") or 1) for k in ("tp", "pp", "attention_dp", "moe_tp", "moe_ep"))
    return tp, pp, dp, moe_tp, moe_ep


def role_replicas(sample: dict[str, Any], role: str) -> int:
    return int(sample.get("replicas" if role == "agg" else f"{role}_replicas") or 0)


def active_roles(sample: dict[str, Any]) -> tuple[str, ...]:
    mode = sample.get("deployment_mode")
    if mode == "agg":
        return ("agg",)
    if mode == "disagg":
        return ("prefill", "decode")
    raise ValueError(f"deployment_mode must be 'agg' or 'disagg', got {mode!r}")


def _engine_args(sample: dict[str, Any], role: str) -> dict[str, Any]:
    tp, _pp, dp, moe_tp, moe_ep = role_shape(sample, role)
    backend = sample["backend"]
    worker_type = "aggregated" if role == "agg" else role
    args: dict[str, Any] = {
        "worker_type": worker_type,
        "engine_type": backend,
        "aic_backend": backend,
        "aic_backend_version": sample.get("backend_version"),
        "aic_system": sample["hardware_sku"],
        "aic_model_path": sample["model_name"],
        "aic_tp_size": tp,
        "aic_attention_dp_size": dp,
        "max_num_batched_tokens": int(sample[f"{role}_max_num_batched_tokens"]),
        "max_num_seqs": int(sample[f"{role}_max_num_seqs"]),
        "block_size": int(sample[f"{role}_block_size"]),
        "gpu_memory_utilization": float(sample[f"{role}_gpu_memory_utilization"]),
        "enable_prefix_caching": bool(sample[f"{role}_enable_prefix_caching"]),
    }
    if moe_tp * moe_ep > 1:
        args["aic_moe_tp_size"] = moe_tp
        args["aic_moe_ep_size"] = moe_ep
    if sample.get("aic_nextn") is not None:
        args["aic_nextn"] = int(sample["aic_nextn"])
    if sample.get("startup_time") is not None:
        args["startup_time"] = float(sample["startup_time"])
    if role != "decode" and int(sample.get("num_g2_blocks") or 0) > 0:
        for key, value in sample.items():
            if value is None:
                continue
            if key in ("kv_bytes_per_token", "offload_batch_size") or key.startswith(("num_g", "bandwidth_g")):
                args[key] = value
    return args


def _planner_config(sample: dict[str, Any], planner_target: str, sla: dict[str, Any] | None) -> dict[str, Any] | None:
    if not (sample.get("enable_throughput_scaling") or sample.get("enable_load_scaling")):
        return None
    sla = sla or {}
    if planner_target == "sla" and (sla.get("ttft_ms") is None or sla.get("itl_ms") is None):
        raise ValueError(
            "SLA-based planner scaling (optimization_target 'sla') requires both ttft_ms and itl_ms "
            f"in goal.sla, got {dict(sla)}"
        )
    mode = sample["deployment_mode"]
    cfg: dict[str, Any] = {
        "mode": mode,
        "optimization_target": planner_target,
        "report_interval_hours": None,
        "live_dashboard_port": 0,
        "metric_pulling_prometheus_extra_query_params": None,
    }
    for key in (*SCALING_FIELDS, *FPM_FIELDS, *SENSITIVITY_FIELDS, *PREDICTOR_FIELDS):
        if key in sample:
            cfg[key] = sample[key]
    cfg["max_gpu_budget"] = sample.get("gpu_budget")
    for key in ("min_gpu_budget", "min_endpoint"):
        if sample.get(key) is not None:
            cfg[key] = sample[key]
    if mode == "disagg":
        ptp, _, pdp, _, _ = role_shape(sample, "prefill")
        dtp, _, ddp, _, _ = role_shape(sample, "decode")
        cfg["prefill_engine_num_gpu"] = ptp * pdp
        cfg["decode_engine_num_gpu"] = dtp * ddp
    else:
        tp, _, dp, _, _ = role_shape(sample, "agg")
        cfg["decode_engine_num_gpu"] = tp * dp
    if planner_target == "sla":
        cfg["ttft_ms"] = sla["ttft_ms"]
        cfg["itl_ms"] = sla["itl_ms"]
    return cfg


def planner_config_for(sample: dict[str, Any], *, planner_target: str,
                       sla: dict[str, Any] | None) -> dict[str, Any] | None:
    """The planner payload alone (None when static): what a deployed Planner component is given."""
    return _planner_config(sample, planner_target, sla)


def build_deployment_plan(
    sample: dict[str, Any], *, planner_target: str, sla: dict[str, Any] | None
) -> DeploymentPlan:
    """Build the per-role engine args, router and planner payloads of one candidate.

    `planner_target` comes from the goal (`OptimizationGoal.planner_target`), `sla` is `goal.sla` as a dict (or
    None). `num_gpu_blocks` is deliberately absent: capacity is the evaluator's business.
    Raises ValueError for an 'sla' planner target without both ttft_ms and itl_ms.
    """
    mode = str(sample["deployment_mode"])  # every unrolled sample names its mode
    roles = active_roles(sample)
    args = {role: _engine_args(sample, role) for role in roles}
    router_mode = sample.get("router_mode") or "round_robin"
    router_config = None
    if router_mode == "kv_router":
        router_config = {k: sample[k] for k in ROUTER_FIELDS if sample.get(k) is not None}
    planner_config = _planner_config(sample, planner_target, sla)
    return DeploymentPlan(
        deployment_mode=mode,
        is_static=planner_config is None,
        agg_engine_args=args.get("agg"),
        prefill_engine_args=args.get("prefill"),
        decode_engine_args=args.get("decode"),
        num_workers=role_replicas(sample, "agg") if mode == "agg" else 0,
        num_prefill_workers=role_replicas(sample, "prefill") if mode == "disagg" else 0,
        num_decode_workers=role_replicas(sample, "decode") if mode == "disagg" else 0,
        router_mode=router_mode,
        router_config=router_config,
        planner_config=planner_config,
    )
