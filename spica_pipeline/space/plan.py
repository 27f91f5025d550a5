"""From a candidate to a `DeploymentPlan`: pure dict building.

The plan is what a deployment (or the replay) needs per role; nothing from Dynamo is imported here,
so the same plan feeds the evaluator, the deploy YAML and tests alike.
"""

from dataclasses import asdict, dataclass
from typing import Any

from spica_pipeline.space.candidate import Candidate, Role

ROLES = ("agg", "prefill", "decode")


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


def _engine_args(candidate: Candidate, role: Role) -> dict[str, Any]:
    shape, engine, backend = role.shape, role.engine, candidate.backend
    args: dict[str, Any] = {
        "worker_type": "aggregated" if role.name == "agg" else role.name,
        "engine_type": backend,
        "aic_backend": backend,
        "aic_backend_version": candidate.backend_version,
        "aic_system": candidate.role_system(role),
        "aic_model_path": candidate.model,
        "aic_tp_size": shape.tp,
        "aic_attention_dp_size": shape.attention_dp,
        "max_num_batched_tokens": int(engine.max_num_batched_tokens),
        "max_num_seqs": int(engine.max_num_seqs),
        "block_size": int(engine.block_size),
        "gpu_memory_utilization": float(engine.gpu_memory_utilization),
        "enable_prefix_caching": bool(engine.enable_prefix_caching),
    }
    if shape.moe_tp * shape.moe_ep > 1:
        args["aic_moe_tp_size"] = shape.moe_tp
        args["aic_moe_ep_size"] = shape.moe_ep
    if candidate.aic_nextn is not None:
        args["aic_nextn"] = int(candidate.aic_nextn)
    if candidate.startup_time is not None:
        args["startup_time"] = float(candidate.startup_time)
    if role.name != "decode" and candidate.offload.enabled:
        args.update(candidate.offload.set_fields())
    return args


def _planner_config(candidate: Candidate, planner_target: str,
                    sla: dict[str, Any] | None) -> dict[str, Any] | None:
    planner = candidate.planner
    if planner is None:
        return None
    sla = sla or {}
    if planner_target == "sla" and (sla.get("ttft_ms") is None or sla.get("itl_ms") is None):
        raise ValueError(
            "SLA-based planner scaling (optimization_target 'sla') requires both ttft_ms and itl_ms "
            f"in goal.sla, got {dict(sla)}"
        )
    mode = candidate.deployment_mode
    cfg: dict[str, Any] = {
        "mode": mode,
        "optimization_target": planner_target,
        "report_interval_hours": None,
        "live_dashboard_port": 0,
        "metric_pulling_prometheus_extra_query_params": None,
    }
    cfg.update(planner.settings())
    cfg["max_gpu_budget"] = candidate.gpu_budget
    for key in ("min_gpu_budget", "min_endpoint"):
        if getattr(candidate, key) is not None:
            cfg[key] = getattr(candidate, key)
    for role in candidate.roles:  # engines sized by tp x attention-DP; an agg engine counts as decode's
        name = "prefill" if role.name == "prefill" else "decode"
        cfg[f"{name}_engine_num_gpu"] = role.shape.tp * role.shape.attention_dp
    if planner_target == "sla":
        cfg["ttft_ms"] = sla["ttft_ms"]
        cfg["itl_ms"] = sla["itl_ms"]
    return cfg


def planner_config_for(candidate: Candidate, *, planner_target: str,
                       sla: dict[str, Any] | None) -> dict[str, Any] | None:
    """The planner payload alone (None when static): what a deployed Planner component is given."""
    return _planner_config(candidate, planner_target, sla)


def build_deployment_plan(
    candidate: Candidate, *, planner_target: str, sla: dict[str, Any] | None
) -> DeploymentPlan:
    """Build the per-role engine args, router and planner payloads of one candidate.

    `planner_target` comes from the goal (`OptimizationGoal.planner_target`), `sla` is `goal.sla` as a dict (or
    None). `num_gpu_blocks` is deliberately absent: capacity is the evaluator's business.
    Raises ValueError for an 'sla' planner target without both ttft_ms and itl_ms.
    """
    args = {role.name: _engine_args(candidate, role) for role in candidate.roles}
    replicas = {role.name: role.replicas for role in candidate.roles}
    router = candidate.router
    planner_config = _planner_config(candidate, planner_target, sla)
    return DeploymentPlan(
        deployment_mode=candidate.deployment_mode,
        is_static=planner_config is None,
        agg_engine_args=args.get("agg"),
        prefill_engine_args=args.get("prefill"),
        decode_engine_args=args.get("decode"),
        num_workers=replicas.get("agg", 0),
        num_prefill_workers=replicas.get("prefill", 0),
        num_decode_workers=replicas.get("decode", 0),
        router_mode=router.mode,
        router_config=router.knobs() if router.is_kv else None,
        planner_config=planner_config,
    )
