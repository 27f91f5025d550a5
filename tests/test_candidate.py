"""The candidate (space/candidate.py): built from a selection and a parallel config, and its flat form."""

import json
from types import SimpleNamespace

import pytest

from spica_pipeline.config import SearchSpace
from spica_pipeline.space.candidate import Candidate, build_candidate
from spica_pipeline.space.shapes import DisaggShape, RoleShape

TEP4x2 = RoleShape(tp=4, moe_ep=4, replicas=2)
TEP8 = RoleShape(tp=8, moe_ep=8)
DEP8x2 = RoleShape(attention_dp=8, moe_ep=8, replicas=2)

ROLE_PREFIXES = ("prefill_", "decode_")


def unroll(space, selection, parallel_config, load_predictor=None) -> dict:
    """The flat form of the built candidate, checked to read back into the same candidate."""
    candidate = build_candidate(space, selection, parallel_config, load_predictor)
    flat = candidate.to_dict()
    assert Candidate.from_dict(flat) == candidate and Candidate.from_dict(flat).to_dict() == flat
    return flat


def space(**kw) -> SearchSpace:
    return SearchSpace(model_name="m", hardware_sku="h200_sxm", **kw)


def agg_sel(**kw) -> dict:
    return {"deployment_mode": "agg", "backend": "vllm", "agg_max_num_batched_tokens": 8192,
            "agg_max_num_seqs": 256, "router_mode": "round_robin", "planner_scaling_policy": "disabled", **kw}


def disagg_sel(**kw) -> dict:
    return {"deployment_mode": "disagg", "backend": "trtllm", "prefill_max_num_batched_tokens": 16384,
            "prefill_max_num_seqs": 8, "decode_max_num_batched_tokens": 8192, "decode_max_num_seqs": 512,
            "router_mode": "round_robin", "planner_scaling_policy": "disabled", **kw}


def test_agg_tep():
    s = unroll(space(), agg_sel(), TEP4x2)
    assert (s["tp"], s["pp"], s["attention_dp"], s["moe_tp"], s["moe_ep"]) == (4, 1, 1, 1, 4)
    assert s["strategy"] == "tep" and s["replicas"] == 2 and s["used_gpus"] == 8
    assert not any(k.startswith(ROLE_PREFIXES) for k in s)
    assert s["agg_max_num_seqs"] == 256 and s["agg_block_size"] == 64
    assert s["agg_gpu_memory_utilization"] == 0.9 and s["agg_enable_prefix_caching"] is True
    json.dumps(s)


def test_disagg_tep_dep():
    s = unroll(space(), disagg_sel(), DisaggShape(TEP8, DEP8x2))
    assert s["prefill_tp"] == 8 and s["prefill_moe_ep"] == 8 and s["prefill_strategy"] == "tep"
    assert s["decode_attention_dp"] == 8 and s["decode_strategy"] == "dep"
    assert s["prefill_replicas"] == 1 and s["decode_replicas"] == 2 and s["used_gpus"] == 24
    assert not any(k.startswith("agg_") for k in s)
    for k in ("tp", "strategy", "replicas"):
        assert k not in s
    assert s["decode_enable_prefix_caching"] is False and s["prefill_max_num_batched_tokens"] == 16384
    assert s["backend"] == "trtllm"


def test_mode_shape_mismatch_is_type_error():
    with pytest.raises(TypeError):
        unroll(space(), agg_sel(), DisaggShape(TEP8, DEP8x2))
    with pytest.raises(TypeError):
        unroll(space(), disagg_sel(), TEP8)


def test_disabled_emits_only_flags():
    s = unroll(space(), agg_sel(), TEP4x2)
    assert s["planner_scaling_policy"] == "disabled"
    assert s["enable_throughput_scaling"] is False and s["enable_load_scaling"] is False
    for k in ("throughput_adjustment_interval_seconds", "load_adjustment_interval_seconds",
              "max_num_fpm_samples", "load_scaling_down_sensitivity", "load_predictor"):
        assert k not in s


def test_throughput_policy_intervals():
    s = unroll(space(), agg_sel(planner_scaling_policy="throughput_180_5", planner_fpm_sampling="default",
                                       planner_load_sensitivity="default"), TEP4x2)
    assert s["throughput_adjustment_interval_seconds"] == 180 and s["load_adjustment_interval_seconds"] == 5
    assert s["enable_throughput_scaling"] is True and "load_predictor" not in s  # no predictor result given


def test_hybrid_large_aggressive():
    s = unroll(space(), agg_sel(planner_scaling_policy="hybrid_180_5", planner_fpm_sampling="large",
                                       planner_load_sensitivity="aggressive"), TEP4x2)
    assert (s["max_num_fpm_samples"], s["fpm_sample_bucket_size"]) == (128, 16)
    assert (s["load_scaling_down_sensitivity"], s["load_min_observations"]) == (70, 3)


def test_throughput_policy_gets_its_interval_winner():
    lp = SimpleNamespace(best_by_interval={180: "prophet_w20_log1p", 600: "arima_raw"})
    s = unroll(space(), agg_sel(planner_scaling_policy="throughput_180_5", planner_fpm_sampling="small",
                                       planner_load_sensitivity="default"), TEP4x2, lp)
    assert s["load_predictor"] == "prophet" and s["load_predictor_log1p"] is True
    assert s["prophet_window_size"] == 20
    assert not any(k.startswith("kalman_") for k in s)
    s = unroll(space(), agg_sel(planner_scaling_policy="throughput_600_5", planner_fpm_sampling="small",
                                       planner_load_sensitivity="default"), TEP4x2, lp)
    assert s["load_predictor"] == "arima" and "prophet_window_size" not in s


def test_predictor_result_as_json_dict_with_string_keys():
    lp = {"best_by_interval": {"180": "constant_last"}}
    s = unroll(space(), agg_sel(planner_scaling_policy="hybrid_180_5", planner_fpm_sampling="small",
                                       planner_load_sensitivity="default"), TEP4x2, lp)
    assert s["load_predictor"] == "constant"


def test_no_winner_for_interval_emits_no_predictor():
    lp = SimpleNamespace(best_by_interval={600: "arima_raw"})
    s = unroll(space(), agg_sel(planner_scaling_policy="throughput_180_5", planner_fpm_sampling="small",
                                       planner_load_sensitivity="default"), TEP4x2, lp)
    assert "load_predictor" not in s


def test_load_only_policy_has_no_predictor_fields():
    lp = SimpleNamespace(best_by_interval={180: "prophet_w20_log1p"})
    s = unroll(space(), agg_sel(planner_scaling_policy="load_180_5", planner_fpm_sampling="small",
                                       planner_load_sensitivity="default"), TEP4x2, lp)
    assert s["enable_load_scaling"] is True and s["max_num_fpm_samples"] == 32
    assert not any(k.startswith(("load_predictor", "prophet_", "kalman_")) for k in s)


def test_round_robin_has_no_router_keys():
    s = unroll(space(), agg_sel(), TEP4x2)
    assert s["router_mode"] == "round_robin"
    for k in ("overlap_score_credit", "prefill_load_scale", "router_temperature", "host_cache_hit_weight",
              "active_decode_blocks_threshold", "no_admission_control"):
        assert k not in s


def test_kv_router_emits_weights_and_admission_scalars():
    sel = agg_sel(router_mode="kv_router", overlap_score_credit=0.5, prefill_load_scale=4.0, router_temperature=0.2)
    s = unroll(space(), sel, TEP4x2)
    assert (s["overlap_score_credit"], s["prefill_load_scale"], s["router_temperature"]) == (0.5, 4.0, 0.2)
    assert s["no_admission_control"] is False and s["active_decode_blocks_threshold"] is None
    assert "active_prefill_tokens_threshold_frac" in s
    assert "host_cache_hit_weight" not in s and "disk_cache_hit_weight" not in s  # offload off
    s = unroll(space(num_g2_blocks=64, kv_bytes_per_token=1024),
                      {**sel, "host_cache_hit_weight": 0.75, "disk_cache_hit_weight": 0.0}, TEP4x2)
    assert s["host_cache_hit_weight"] == 0.75 and s["disk_cache_hit_weight"] == 0.0


RAW_POLICY = {"enable_throughput_scaling": True, "enable_load_scaling": True,
              "throughput_adjustment_interval_seconds": 240, "load_adjustment_interval_seconds": 5}
RAW_FPM = {"max_num_fpm_samples": 96, "fpm_sample_bucket_size": 16}
RAW_SENS = {"load_scaling_down_sensitivity": 75, "load_min_observations": 4}


def test_raw_dicts_give_exact_values():
    sp = space(planner_scaling_policy=[RAW_POLICY], planner_fpm_sampling=[RAW_FPM],
               planner_load_sensitivity=[RAW_SENS])
    s = unroll(sp, agg_sel(planner_scaling_policy=RAW_POLICY, planner_fpm_sampling=RAW_FPM,
                                  planner_load_sensitivity=RAW_SENS), TEP4x2)
    assert s["throughput_adjustment_interval_seconds"] == 240
    assert s["max_num_fpm_samples"] == 96
    assert (s["load_scaling_down_sensitivity"], s["load_min_observations"]) == (75, 4)
    assert s["planner_scaling_policy"] == RAW_POLICY and s["planner_scaling_policy"] is not RAW_POLICY


def test_custom_label_and_pinned_composites_resolve():
    sp = space(planner_scaling_policy=["disabled", RAW_POLICY], planner_fpm_sampling=[RAW_FPM],
               planner_load_sensitivity=["default"])
    sel = agg_sel(planner_scaling_policy="custom_1")
    del sel["agg_max_num_seqs"]  # searched knob missing -> build fails with a clear KeyError
    with pytest.raises(KeyError, match="agg_max_num_seqs"):
        unroll(sp, sel, TEP4x2)
    sel["agg_max_num_seqs"] = 512
    s = unroll(sp, sel, TEP4x2)  # fpm / sensitivity pinned by one-element lists
    assert s["planner_scaling_policy"] == RAW_POLICY
    assert s["max_num_fpm_samples"] == 96 and s["load_min_observations"] == 5


def test_both_flags_false_dict_is_disabled():
    off = {**RAW_POLICY, "enable_throughput_scaling": False, "enable_load_scaling": False}
    s = unroll(space(planner_scaling_policy=[off]), agg_sel(planner_scaling_policy=off), TEP4x2)
    assert s["enable_throughput_scaling"] is False and s["enable_load_scaling"] is False
    assert "throughput_adjustment_interval_seconds" not in s and "max_num_fpm_samples" not in s


def test_custom_kalman_winner():
    lp = SimpleNamespace(best_by_interval={180: {"load_predictor": "kalman", "kalman_q_level": 2.5}})
    s = unroll(space(), agg_sel(planner_scaling_policy="throughput_180_5", planner_fpm_sampling="small",
                                       planner_load_sensitivity="default"), TEP4x2, lp)
    assert s["load_predictor"] == "kalman" and s["kalman_q_level"] == 2.5 and s["kalman_min_points"] == 5
    assert s["load_predictor_log1p"] is False and "prophet_window_size" not in s


def test_pinned_scalars_folded_in():
    sp = space(gpu_budget=16, min_gpu_budget=8, min_endpoint=2, context_length=4096, startup_time=300.0,
               aic_nextn=2, num_g2_blocks=100, kv_bytes_per_token=2048, offload_batch_size=4)
    s = unroll(sp, disagg_sel(), DisaggShape(TEP8, DEP8x2))
    assert (s["gpu_budget"], s["min_gpu_budget"], s["min_endpoint"], s["context_length"]) == (16, 8, 2, 4096)
    assert (s["startup_time"], s["aic_nextn"], s["num_g2_blocks"]) == (300.0, 2, 100)
    assert (s["kv_bytes_per_token"], s["offload_batch_size"]) == (2048, 4)
    assert s["bandwidth_g1_to_g2_gbps"] is None and "bandwidth_g2_to_g1_gbps" in s
    assert s["model_name"] == "m" and s["hardware_sku"] == "h200_sxm"


def test_pinned_one_element_knobs_may_be_omitted_from_selection():
    sp = space(deployment_mode=["agg"], backend=["sglang"], router_mode=["round_robin"],
               agg_max_num_batched_tokens=[16384], agg_max_num_seqs=[1024], planner_scaling_policy=["disabled"])
    s = unroll(sp, {}, RoleShape(tp=2))
    assert (s["deployment_mode"], s["backend"], s["agg_max_num_seqs"]) == ("agg", "sglang", 1024)
    assert s["strategy"] == "tp" and s["used_gpus"] == 2


# ---- the typed value ---------------------------------------------------------------------------

def test_roles_read_as_typed_fields():
    c = build_candidate(space(aic_nextn=1), disagg_sel(), DisaggShape(TEP8, DEP8x2))
    assert c.deployment_mode == "disagg" and c.role_names == ("prefill", "decode")
    assert c.role("prefill").shape == TEP8 and c.role("decode").replicas == 2 and c.load_role.name == "decode"
    assert c.role("prefill").engine.max_num_batched_tokens == 16384 and c.role("decode").engine.block_size == 64
    assert c.used_gpus == 24 and c.is_static and c.router.mode == "round_robin" and c.aic_nextn == 1
    with pytest.raises(KeyError, match="agg"):
        c.role("agg")
    agg = build_candidate(space(), agg_sel(), TEP4x2)
    assert agg.role_names == ("agg",) and agg.load_role is agg.role("agg") and agg.used_gpus == 8


def test_a_full_candidate_reads_back_from_its_flat_form():
    lp = SimpleNamespace(best_by_interval={180: "kalman_default_log1p"})
    sp = space(num_g2_blocks=64, kv_bytes_per_token=1024, precision={"weights": "fp8", "kv_cache": "fp8"},
               planner_scaling_policy=["hybrid_180_5"], planner_fpm_sampling=["large"],
               planner_load_sensitivity=["default"])
    sel = disagg_sel(router_mode="kv_router", overlap_score_credit=0.5, prefill_load_scale=4.0,
                     router_temperature=0.2, host_cache_hit_weight=0.75, disk_cache_hit_weight=0.0,
                     planner_scaling_policy="hybrid_180_5")
    c = build_candidate(sp, sel, DisaggShape(TEP8, DEP8x2), lp)
    assert c.precision == {"weights": "fp8", "kv_cache": "fp8"} and c.quant_modes() == ("fp8", None, "fp8", None)
    assert c.router.knobs() == {"overlap_score_credit": 0.5, "prefill_load_scale": 4.0, "router_temperature": 0.2,
                                "host_cache_hit_weight": 0.75, "disk_cache_hit_weight": 0.0}
    assert c.planner.predictor.load_predictor == "kalman" and c.offload.enabled
    flat = c.to_dict()
    assert flat["precision_weights"] == "fp8" and flat["kalman_r"] == 10.0 and flat["num_g2_blocks"] == 64
    assert Candidate.from_dict(flat) == c
    resolved = Candidate.from_dict({**flat, "backend_version": "1.0", "kv_load_ratio": 0.5})
    assert (resolved.backend_version, resolved.kv_load_ratio) == ("1.0", 0.5)


def test_from_dict_refuses_what_no_candidate_holds():
    flat = build_candidate(space(), agg_sel(), TEP4x2).to_dict()
    with pytest.raises(ValueError, match="not candidate fields: num_gpu_blocks"):
        Candidate.from_dict({**flat, "num_gpu_blocks": 10})
    with pytest.raises(ValueError, match="used_gpus=16 .the candidate gives 8"):
        Candidate.from_dict({**flat, "used_gpus": 16})
    with pytest.raises(ValueError, match="deployment_mode"):
        Candidate.from_dict({**flat, "deployment_mode": "mixed"})
    with pytest.raises(ValueError, match="agg role needs agg_block_size"):
        Candidate.from_dict({k: v for k, v in flat.items() if k != "agg_block_size"})
    # a ledger row's config carries derived fields beside the candidate's: read with extra="ignore"
    row = {**flat, "num_gpu_blocks": 10, "concurrency": 12, "fidelity_note": "x"}
    assert Candidate.from_dict(row, extra="ignore").role("agg").shape == TEP4x2


def test_field_tables_match_the_presets():
    from spica_pipeline.config import presets
    from spica_pipeline.space import candidate

    assert candidate.ADMISSION_FIELDS == presets.ADMISSION_FIELDS
    assert candidate.PREDICTOR_FIELDS == presets.PREDICTOR_FIELDS
    assert candidate.PLANNER_FIELDS == (*presets.SCALING_FIELDS, *presets.FPM_FIELDS, *presets.SENSITIVITY_FIELDS)


def test_a_request_carries_a_candidate_and_hashes_its_flat_form():
    from spica_pipeline.evaluate.evaluator import EvalRequest
    from spica_pipeline.jsonvalue import spec_hash

    c = build_candidate(space(), agg_sel(), TEP4x2)
    request = EvalRequest(c, {"isl": 1}, {"target": "throughput"})
    assert request.to_dict()["sample"] == c.to_dict()
    assert request.spec_hash == spec_hash({"sample": c.to_dict(), "workload": {"isl": 1},
                                           "goal": request.goal.model_dump(mode="json"), "context": {}})
    with pytest.raises(TypeError, match="Candidate.from_dict"):
        EvalRequest(c.to_dict(), {}, {})
