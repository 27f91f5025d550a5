import json
from math import prod

import pytest

from spica_pipeline.config import SmartSearchConfig
from spica_pipeline.errors import ModelHardwareError, NoViableParallelConfig
from spica_pipeline.space.branches import BranchSpace, enumerate_branches, knob_choices_for
from spica_pipeline.space.pins import PinRefused
from spica_pipeline.space.shapes import RoleShape

pytestmark = pytest.mark.integration  # real aiconfigurator-core data

SYNTHETIC = {"isl": 1000, "osl": 100, "request_rate": 5.0, "num_request_ratio": 10.0}
ROUTER = ["router_mode", "overlap_score_credit", "prefill_load_scale", "router_temperature"]
PLANNER = ["planner_scaling_policy", "planner_fpm_sampling", "planner_load_sensitivity"]


def config(goal=None, workload=None, **space):
    space.setdefault("model_name", "Qwen/Qwen3-30B-A3B")
    space.setdefault("hardware_sku", "h200_sxm")
    space.setdefault("gpu_budget", 8)
    data = {"search_space": space, "workload": workload or SYNTHETIC}
    if goal:
        data["goal"] = goal
    return SmartSearchConfig.from_dict(data)


def test_trtllm_disagg_skipped_with_warning_only_agg_remains():
    result = enumerate_branches(config(backend=["trtllm"], deployment_mode=["agg", "disagg"]))
    assert [b.deployment_mode for b in result.branches] == ["agg"]
    assert any("['trtllm'] skipped for deployment_mode='disagg'" in w and "TRT-LLM disaggregation" in w
               for w in result.warnings)
    assert any("deployment_mode='disagg' skipped" in w and "gpu_budget=8" in w and "replay-incompatible" in w
               for w in result.warnings)
    agg = result.branches[0]
    assert len(agg.parallel_configs) == 36 and agg.knob_choices["backend"] == ["trtllm"]
    assert result.diagnostics["disagg"]["trtllm"] == {"error": "replay-incompatible"}


def test_default_modes_order_backends_and_knob_layout():
    result = enumerate_branches(config(backend=["sglang", "trtllm", "vllm"]))
    disagg, agg = result.branches
    assert (disagg.deployment_mode, agg.deployment_mode) == ("disagg", "agg")  # user (default) order
    assert disagg.knob_choices["backend"] == ["sglang", "vllm"]
    assert agg.knob_choices["backend"] == ["sglang", "trtllm", "vllm"]
    # trtllm runs every agg shape but TP x attention DP (tp2/dp2 x1 and x2, tp2/dp4, tp4/dp2)
    assert [c for c, s in zip(agg.parallel_configs, agg.supported_backends) if s != ("sglang", "trtllm", "vllm")] \
        == [RoleShape(tp=2, attention_dp=2, moe_ep=4), RoleShape(tp=2, attention_dp=2, moe_ep=4, replicas=2),
            RoleShape(tp=2, attention_dp=4, moe_ep=8), RoleShape(tp=4, attention_dp=2, moe_ep=8)]
    assert len(disagg.parallel_configs) == 365 and len(disagg.supported_backends) == 365
    engine = ["agg_max_num_batched_tokens", "agg_max_num_seqs"]
    assert list(agg.knob_choices) == [*ROUTER, *PLANNER, *engine, "backend"]
    assert "prefill_max_num_seqs" in disagg.knob_choices and "agg_max_num_seqs" not in disagg.knob_choices
    assert "host_cache_hit_weight" not in agg.knob_choices  # offload off
    assert agg.diagnostics["vllm"]["configs_kept"] == 40


def test_finite_size_is_choice_product_times_pool():
    agg = enumerate_branches(config(deployment_mode=["agg"], backend=["vllm", "sglang"])).branches[0]
    expected = (2 * 3 * 9 * 4) * (7 * 4 * 3) * (3 * 3) * 2 * len(agg.parallel_configs)
    assert agg.finite_size == expected == prod(len(v) for v in agg.knob_choices.values()) * 40


def test_dependent_knobs_pruned():
    rr = enumerate_branches(config(deployment_mode=["agg"], router_mode=["round_robin"],
                                   planner_scaling_policy=["disabled"])).branches[0]
    assert list(rr.knob_choices) == ["router_mode", "planner_scaling_policy", "agg_max_num_batched_tokens",
                                     "agg_max_num_seqs", "backend"]
    offload = enumerate_branches(config(deployment_mode=["agg"], num_g2_blocks=128, kv_bytes_per_token=4096,
                                        router_mode=["kv_router"])).branches[0]
    assert offload.knob_choices["host_cache_hit_weight"] == [0.5, 0.75, 1.0]
    assert offload.knob_choices["disk_cache_hit_weight"] == [0.0, 0.25, 0.5]
    # offload on but round-robin only: the weights have nothing to act on
    both = enumerate_branches(config(deployment_mode=["agg"], num_g2_blocks=128, kv_bytes_per_token=4096,
                                     router_mode=["round_robin"])).branches[0]
    assert "host_cache_hit_weight" not in both.knob_choices


def test_kv_load_ratio_range_and_scalar():
    pareto = enumerate_branches(config(goal={"target": "pareto"}, deployment_mode=["agg"],
                                       workload={"isl": 1000, "osl": 100, "num_request_ratio": 4.0}))
    agg = pareto.branches[0]
    assert agg.float_ranges == {"kv_load_ratio": (0.0, 1.0)} and agg.finite_size is None
    scalar = enumerate_branches(config(deployment_mode=["agg"], workload={
        "isl": 1000, "osl": 100, "num_request_ratio": 4.0, "kv_load_ratio": 0.75})).branches[0]
    assert scalar.knob_choices["kv_load_ratio"] == [0.75] and scalar.float_ranges == {}
    assert list(scalar.knob_choices)[-1] == "kv_load_ratio"


def test_context_length_is_the_kv_max_seq_len():
    result = enumerate_branches(config(deployment_mode=["agg"], context_length=4096,
                                       model_name="Qwen/Qwen3-235B-A22B", gpu_budget=4))
    assert result.branches[0].diagnostics["vllm"]["max_seq_len"] == 4096
    assert RoleShape(attention_dp=4, moe_ep=4) in result.branches[0].parallel_configs


def test_backend_without_perf_db_dropped_from_backend_knob():
    result = enumerate_branches(config(model_name="Qwen/Qwen3-8B", hardware_sku="b60", gpu_budget=4,
                                       deployment_mode=["agg"], backend=["sglang", "vllm"]))
    assert result.branches[0].knob_choices["backend"] == ["vllm"]
    assert any("backend 'sglang' dropped" in w and "no perf database" in w for w in result.warnings)


def test_no_viable_mode_names_the_budget():
    with pytest.raises(NoViableParallelConfig,
                       match=r"no deployment_mode has a viable parallel config "
                             r"\(skipped \['disagg', 'agg'\]\); "
                             r"check backends / model / hardware / gpu_budget=2"):
        enumerate_branches(config(model_name="meta-llama/Meta-Llama-3.1-405B", gpu_budget=2))


def test_refusal_names_its_pruning_reasons():
    """DeepSeek-V3 on 4 GPUs: the refusal says why (weights leave no KV room), per mode and backend."""
    with pytest.raises(NoViableParallelConfig) as info:
        enumerate_branches(config(model_name="deepseek-ai/DeepSeek-V3", gpu_budget=4, backend=["vllm"]))
    text = str(info.value)
    assert "pruned: disagg/vllm: " in text and "agg/vllm: " in text
    assert "no KV budget (weights leave no room)" in text
    assert "\n" not in text


def test_pins():
    pinned = enumerate_branches(config(deployment_mode=["agg"], backend=["vllm", "sglang"],
                                       parallel_configs=[{"tp": 4, "moe_ep": 4, "replicas": 2}]))
    agg = pinned.branches[0]
    assert agg.parallel_configs == (RoleShape(tp=4, moe_ep=4, replicas=2),)
    assert agg.supported_backends == (("vllm", "sglang"),)
    assert agg.diagnostics["vllm"]["pins"][0]["accepted"]
    with pytest.raises(PinRefused, match=r"rule 'ladder': 3 GPUs per engine: an engine inside one 8-GPU node") as info:
        enumerate_branches(config(deployment_mode=["agg"], parallel_configs=[{"tp": 3}]))
    assert info.value.rule == "ladder" and info.value.nearest == RoleShape(tp=4, moe_tp=4)
    assert "nearest accepted: tp4/pp1/dp1/moe_tp4/moe_ep1x1 on vllm" in str(info.value)
    with pytest.raises(PinRefused, match=r"parallel_configs\[1\] .* rule 'shape': moe_tp 1 x moe_ep 3 = 3 but tp 4"):
        enumerate_branches(config(deployment_mode=["agg"],
                                  parallel_configs=[{"tp": 4, "moe_ep": 4}, {"tp": 4, "moe_tp": 1, "moe_ep": 3}]))


def test_pins_in_the_engines_words():
    """vLLM's and SGLang's spellings resolve to the canonical shape and run on their own engine only."""
    result = enumerate_branches(config(deployment_mode=["agg"], backend=["vllm", "sglang"], parallel_configs=[
        {"tp": 2, "data_parallel": 2, "enable_expert_parallel": True},   # vLLM: TP2 x DP2, EP4
        {"tp": 4, "dp": 4, "enable_dp_attention": True, "ep": 4},       # SGLang: DEP4
        {"tp": 2}]))                                                    # either: MoE-TP2 (the default)
    agg = result.branches[0]
    assert agg.parallel_configs == (RoleShape(tp=2, attention_dp=2, moe_ep=4), RoleShape(attention_dp=4, moe_ep=4),
                                    RoleShape(tp=2, moe_tp=2))
    assert agg.supported_backends == (("vllm",), ("sglang",), ("vllm", "sglang"))
    assert any("moe_tp 2: experts tensor-parallel across the engine's 2 GPUs" in w for w in result.warnings)


def test_unknown_sku_and_model_fail_up_front():
    with pytest.raises(ModelHardwareError, match="unknown hardware_sku 'h300_sxm'"):
        enumerate_branches(config(hardware_sku="h300_sxm"))
    with pytest.raises(ModelHardwareError, match="not one of aiconfigurator-core.s shipped offline models"):
        enumerate_branches(config(model_name="acme/secret-70b"))


def test_branch_space_json_round_trip():
    result = enumerate_branches(config(backend=["vllm", "sglang"], planner_scaling_policy=[
        "disabled", {"enable_throughput_scaling": True, "enable_load_scaling": False,
                     "throughput_adjustment_interval_seconds": 240, "load_adjustment_interval_seconds": 5}],
        goal={"target": "goodput", "sla": {"ttft_ms": 500, "itl_ms": 30}}))
    for branch in result.branches:
        text = json.dumps(branch.to_dict())
        again = BranchSpace.from_dict(json.loads(text))
        assert again == branch and again.finite_size == branch.finite_size


def test_knob_choices_for_plain_values():
    class Space:
        router_mode = ["kv_router"]
        overlap_score_credit, prefill_load_scale, router_temperature = [1.0], [0.5, 1.0], [0.0]
        host_cache_hit_weight, disk_cache_hit_weight = [1.0], [0.0]
        num_g2_blocks = 0
        planner_scaling_policy = ["load_180_5"]
        planner_fpm_sampling, planner_load_sensitivity = ["small"], ["default", "aggressive"]
        prefill_max_num_batched_tokens = prefill_max_num_seqs = [8192]
        decode_max_num_batched_tokens = decode_max_num_seqs = [256]

    knobs, ranges = knob_choices_for(Space, "disagg", ["vllm"], [0.2, 0.9])
    assert knobs["planner_load_sensitivity"] == ["default", "aggressive"]
    assert ranges == {"kv_load_ratio": (0.2, 0.9)} and "kv_load_ratio" not in knobs


def test_branch_space_feeds_the_encoding():
    from spica_pipeline.optimize.encoding import build_encoding

    result = enumerate_branches(config(backend=["vllm", "sglang"], goal={"target": "pareto"},
                                       workload={"isl": 1000, "osl": 100, "num_request_ratio": 4.0}))
    for branch in result.branches:
        encoding = build_encoding(branch)
        names = {p.name for p in encoding.params}
        assert "kv_load_ratio" in names and "used_gpu_ratio" in names
