import json

import pytest

from spica_pipeline.space.candidate import Candidate
from spica_pipeline.space.plan import DeploymentPlan, build_deployment_plan

# flat keys that follow from the shape: a hand-built dict leaves them to the candidate unless a test sets them
SHAPE_DERIVED = ("strategy", "prefill_strategy", "decode_strategy", "used_gpus")


def agg_sample(**over):
    s = {
        "deployment_mode": "agg", "backend": "vllm", "backend_version": "0.24.0",
        "model_name": "Qwen/Qwen3-32B", "hardware_sku": "h200_sxm", "gpu_budget": 8,
        "min_gpu_budget": None, "min_endpoint": None, "context_length": None, "startup_time": None,
        "aic_nextn": None, "num_g2_blocks": 0, "kv_bytes_per_token": None, "bandwidth_g1_to_g2_gbps": None,
        "bandwidth_g2_to_g1_gbps": None, "offload_batch_size": None,
        "tp": 2, "pp": 1, "attention_dp": 1, "moe_tp": 1, "moe_ep": 1, "strategy": "tp", "replicas": 2,
        "used_gpus": 4, "agg_max_num_batched_tokens": 8192, "agg_max_num_seqs": 256, "agg_block_size": 64,
        "agg_gpu_memory_utilization": 0.9, "agg_enable_prefix_caching": True, "router_mode": "round_robin",
        "planner_scaling_policy": "disabled", "enable_throughput_scaling": False, "enable_load_scaling": False,
    }
    s.update(over)
    return s


def disagg_sample(**over):
    s = agg_sample()
    for k in ("tp", "pp", "attention_dp", "moe_tp", "moe_ep", "strategy", "replicas") + tuple(
        k for k in list(s) if k.startswith("agg_")
    ):
        s.pop(k)
    s.update({
        "deployment_mode": "disagg",
        "prefill_tp": 2, "prefill_pp": 1, "prefill_attention_dp": 1, "prefill_moe_tp": 1, "prefill_moe_ep": 1,
        "prefill_strategy": "tp", "prefill_replicas": 1,
        "decode_tp": 2, "decode_pp": 1, "decode_attention_dp": 2, "decode_moe_tp": 1, "decode_moe_ep": 1,
        "decode_strategy": "mixed", "decode_replicas": 1, "used_gpus": 6,
        "prefill_max_num_batched_tokens": 16384, "prefill_max_num_seqs": 8, "prefill_block_size": 64,
        "prefill_gpu_memory_utilization": 0.9, "prefill_enable_prefix_caching": True,
        "decode_max_num_batched_tokens": 8192, "decode_max_num_seqs": 512, "decode_block_size": 64,
        "decode_gpu_memory_utilization": 0.85, "decode_enable_prefix_caching": False,
    })
    s.update(over)
    return s


def as_candidate(flat, **over):
    """The Candidate of a hand-built flat dict (strategy and used_gpus follow its shape unless in `over`)."""
    return Candidate.from_dict({k: v for k, v in flat.items() if k not in SHAPE_DERIVED or k in over})


def agg_candidate(**over):
    return as_candidate(agg_sample(**over), **over)


def disagg_candidate(**over):
    return as_candidate(disagg_sample(**over), **over)


THROUGHPUT_180_5 = {
    "planner_scaling_policy": "throughput_180_5", "enable_throughput_scaling": True, "enable_load_scaling": False,
    "throughput_adjustment_interval_seconds": 180, "load_adjustment_interval_seconds": 5,
    "max_num_fpm_samples": 64, "fpm_sample_bucket_size": 16,
    "load_scaling_down_sensitivity": 80, "load_min_observations": 5,
    "load_predictor": "prophet", "load_predictor_log1p": False, "prophet_window_size": 50,
}
LOAD_180_5 = dict(THROUGHPUT_180_5, planner_scaling_policy="load_180_5", enable_throughput_scaling=False,
                  enable_load_scaling=True)
for k in ("load_predictor", "load_predictor_log1p", "prophet_window_size"):
    LOAD_180_5.pop(k)


def test_static_agg_plan():
    plan = build_deployment_plan(agg_candidate(), planner_target="throughput", sla=None)
    assert isinstance(plan, DeploymentPlan)
    assert plan.is_static and plan.planner_config is None
    assert plan.num_workers == 2 and plan.num_prefill_workers == 0 and plan.num_decode_workers == 0
    assert plan.prefill_engine_args is None and plan.decode_engine_args is None
    a = plan.agg_engine_args
    assert a["worker_type"] == "aggregated" and a["engine_type"] == "vllm"
    assert a["aic_backend"] == "vllm" and a["aic_backend_version"] == "0.24.0"
    assert a["aic_system"] == "h200_sxm" and a["aic_model_path"] == "Qwen/Qwen3-32B"
    assert a["aic_tp_size"] == 2 and a["aic_attention_dp_size"] == 1
    assert a["max_num_batched_tokens"] == 8192 and a["max_num_seqs"] == 256 and a["block_size"] == 64
    assert a["gpu_memory_utilization"] == 0.9 and a["enable_prefix_caching"] is True
    assert "num_gpu_blocks" not in a
    assert not any(k.startswith("aic_moe") for k in a)  # dense
    assert "aic_nextn" not in a and "startup_time" not in a
    assert plan.router_mode == "round_robin" and plan.router_config is None
    json.dumps(plan.to_dict())  # JSON-able


def test_throughput_policy_under_sla_target():
    s = agg_sample(tp=4, **THROUGHPUT_180_5)
    plan = build_deployment_plan(as_candidate(s), planner_target="sla", sla={"ttft_ms": 500.0, "itl_ms": 30.0})
    p = plan.planner_config
    assert not plan.is_static
    assert p["mode"] == "agg" and p["optimization_target"] == "sla"
    assert p["decode_engine_num_gpu"] == 4 and "prefill_engine_num_gpu" not in p
    assert p["load_predictor"] == "prophet" and p["prophet_window_size"] == 50
    assert p["ttft_ms"] == 500.0 and p["itl_ms"] == 30.0
    assert p["report_interval_hours"] is None and p["live_dashboard_port"] == 0
    assert p["metric_pulling_prometheus_extra_query_params"] is None
    assert p["throughput_adjustment_interval_seconds"] == 180 and p["max_num_fpm_samples"] == 64
    assert p["load_scaling_down_sensitivity"] == 80


def test_load_policy_throughput_target_has_no_sla_keys():
    plan = build_deployment_plan(agg_candidate(**LOAD_180_5), planner_target="throughput",
                                 sla={"ttft_ms": 500.0, "itl_ms": 30.0})
    p = plan.planner_config
    assert p["optimization_target"] == "throughput"
    assert "ttft_ms" not in p and "itl_ms" not in p
    assert "load_predictor" not in p


def test_budget_limits_and_disagg_gpu_counts():
    s = disagg_sample(gpu_budget=16, min_gpu_budget=4, min_endpoint=2, **LOAD_180_5)
    p = build_deployment_plan(as_candidate(s), planner_target="throughput", sla=None).planner_config
    assert p["max_gpu_budget"] == 16 and p["min_gpu_budget"] == 4 and p["min_endpoint"] == 2
    assert p["prefill_engine_num_gpu"] == 2 and p["decode_engine_num_gpu"] == 4
    p2 = build_deployment_plan(disagg_candidate(**LOAD_180_5), planner_target="throughput", sla=None).planner_config
    assert "min_gpu_budget" not in p2 and "min_endpoint" not in p2 and p2["max_gpu_budget"] == 8


def test_disagg_roles():
    plan = build_deployment_plan(disagg_candidate(), planner_target="throughput", sla=None)
    assert plan.agg_engine_args is None and plan.num_workers == 0
    assert plan.num_prefill_workers == 1 and plan.num_decode_workers == 1
    pre, dec = plan.prefill_engine_args, plan.decode_engine_args
    assert pre["worker_type"] == "prefill" and dec["worker_type"] == "decode"
    assert pre["engine_type"] == dec["engine_type"] == "vllm"
    assert pre["max_num_seqs"] == 8 and dec["max_num_seqs"] == 512
    assert dec["aic_attention_dp_size"] == 2 and dec["gpu_memory_utilization"] == 0.85
    assert dec["enable_prefix_caching"] is False
    assert list(plan.engine_args()) == ["prefill", "decode"]


@pytest.mark.parametrize("backend", ["vllm", "sglang", "trtllm"])
def test_engine_type_equals_backend(backend):
    plan = build_deployment_plan(disagg_candidate(backend=backend), planner_target="throughput", sla=None)
    for args in plan.engine_args().values():
        assert args["engine_type"] == backend == args["aic_backend"]


def test_moe_keys_only_for_moe():
    plan = build_deployment_plan(agg_candidate(tp=2, moe_tp=1, moe_ep=2), planner_target="throughput", sla=None)
    assert plan.agg_engine_args["aic_moe_tp_size"] == 1 and plan.agg_engine_args["aic_moe_ep_size"] == 2
    plan = build_deployment_plan(disagg_candidate(decode_moe_ep=4, decode_attention_dp=4, decode_tp=1),
                                 planner_target="throughput", sla=None)
    assert "aic_moe_ep_size" not in plan.prefill_engine_args
    assert plan.decode_engine_args["aic_moe_ep_size"] == 4


def test_offload_keys_agg_and_prefill_only():
    offload = {"num_g2_blocks": 1000, "kv_bytes_per_token": 131072, "bandwidth_g1_to_g2_gbps": 20.0,
               "bandwidth_g2_to_g1_gbps": None, "offload_batch_size": 8}
    agg = build_deployment_plan(agg_candidate(**offload), planner_target="throughput", sla=None).agg_engine_args
    assert agg["num_g2_blocks"] == 1000 and agg["kv_bytes_per_token"] == 131072
    assert agg["bandwidth_g1_to_g2_gbps"] == 20.0 and agg["offload_batch_size"] == 8
    assert "bandwidth_g2_to_g1_gbps" not in agg  # None values are not emitted
    plan = build_deployment_plan(disagg_candidate(**offload), planner_target="throughput", sla=None)
    assert plan.prefill_engine_args["num_g2_blocks"] == 1000
    assert not any(k.startswith(("num_g", "bandwidth_g")) or k in ("kv_bytes_per_token", "offload_batch_size")
                   for k in plan.decode_engine_args)
    off = dict(offload, num_g2_blocks=0)
    agg0 = build_deployment_plan(agg_candidate(**off), planner_target="throughput", sla=None).agg_engine_args
    assert not any(k.startswith(("num_g", "bandwidth_g")) or k in ("kv_bytes_per_token", "offload_batch_size")
                   for k in agg0)


def test_e2e_only_sla_with_scaling_policy_raises():
    with pytest.raises(ValueError, match="ttft_ms"):
        build_deployment_plan(agg_candidate(**LOAD_180_5), planner_target="sla", sla={"e2e_ms": 2000.0})
    # A static candidate never builds a planner payload, so the same SLA is fine.
    plan = build_deployment_plan(agg_candidate(), planner_target="sla", sla={"e2e_ms": 2000.0})
    assert plan.planner_config is None


def test_router_payload():
    s = agg_sample(router_mode="kv_router", overlap_score_credit=0.5, prefill_load_scale=2.0,
                   router_temperature=0.0, active_decode_blocks_threshold=None)
    plan = build_deployment_plan(as_candidate(s), planner_target="throughput", sla=None)
    assert plan.router_mode == "kv_router"
    assert plan.router_config == {"overlap_score_credit": 0.5, "prefill_load_scale": 2.0, "router_temperature": 0.0}
    s.pop("router_mode")
    assert build_deployment_plan(as_candidate(s), planner_target="throughput", sla=None).router_mode == "round_robin"


def test_optional_nextn_and_startup():
    a = build_deployment_plan(agg_candidate(aic_nextn=2, startup_time=30.0), planner_target="throughput",
                              sla=None).agg_engine_args
    assert a["aic_nextn"] == 2 and a["startup_time"] == 30.0


def test_bad_mode():
    with pytest.raises(ValueError, match="deployment_mode"):
        agg_candidate(deployment_mode="mixed")
