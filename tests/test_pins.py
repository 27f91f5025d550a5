"""Pins in the engines' words, the rules that refuse a pin (each named, with the nearest accepted shape), and the
CLI's own path for one deployment (space/deployment.py)."""

import pytest

from spica_pipeline.config.search_space import pin_spelling
from spica_pipeline.space.deployment import check_deployment, deployment_config
from spica_pipeline.space.pins import _Refusal, read_pin, read_role
from spica_pipeline.space.shapes import DisaggShape, RoleShape


# ---- reading a pin (no AIC) ------------------------------------------------------------------------------

@pytest.mark.parametrize("entry, shape", [
    # canonical: MoE widths left out take the engines' default (experts tensor-parallel over the engine)
    ({"tp": 2}, RoleShape(tp=2, moe_tp=2)),
    ({"tp": 1, "attention_dp": 4}, RoleShape(attention_dp=4, moe_tp=4)),
    ({"tp": 4, "moe_ep": 4}, RoleShape(tp=4, moe_ep=4)),
    ({"tp": 4, "moe_ep": 2}, RoleShape(tp=4, moe_tp=2, moe_ep=2)),
    # attention_dp left out beside MoE widths wider than tp: the MoE widths say how wide the engine is
    ({"tp": 1, "moe_tp": 2}, RoleShape(attention_dp=2, moe_tp=2)),
    ({"tp": 2, "moe_tp": 4, "moe_ep": 1}, RoleShape(tp=2, attention_dp=2, moe_tp=4)),
    ({"tp": 1}, RoleShape()),
    # vLLM: --tensor-parallel-size, --data-parallel-size, --enable-expert-parallel
    ({"tp": 8, "data_parallel": 1}, RoleShape(tp=8, moe_tp=8)),
    ({"tp": 8, "enable_expert_parallel": True}, RoleShape(tp=8, moe_ep=8)),
    ({"tp": 2, "data_parallel": 2, "enable_expert_parallel": True}, RoleShape(tp=2, attention_dp=2, moe_ep=4)),
    ({"tp": 4, "data_parallel": 4, "enable_expert_parallel": True, "replicas": 2},
     RoleShape(tp=4, attention_dp=4, moe_ep=16, replicas=2)),
    ({"tp": 1, "data_parallel": 8}, RoleShape(attention_dp=8, moe_tp=8)),
    # SGLang: --tp counts every GPU; --dp with --enable-dp-attention splits attention; --ep the experts
    ({"tp": 8, "ep": 8}, RoleShape(tp=8, moe_ep=8)),
    ({"tp": 8, "dp": 8, "enable_dp_attention": True, "ep": 8}, RoleShape(attention_dp=8, moe_ep=8)),
    ({"tp": 16, "dp": 4, "enable_dp_attention": True, "ep": 16}, RoleShape(tp=4, attention_dp=4, moe_ep=16)),
    ({"tp": 16, "ep": 4}, RoleShape(tp=16, moe_tp=4, moe_ep=4)),
    ({"tp": 4, "dp": 2}, RoleShape(tp=4, moe_tp=4, replicas=2)),  # dp without DP attention: copies
])
def test_moe_pins_in_each_spelling(entry, shape):
    assert read_role(entry, is_moe=True)[0] == shape


def test_dense_pins_ignore_moe_widths_and_say_so():
    shape, notes = read_role({"tp": 4, "moe_tp": 4}, is_moe=False, model="meta-llama/Meta-Llama-3.1-70B")
    assert shape == RoleShape(tp=4) and notes == ["meta-llama/Meta-Llama-3.1-70B is dense: moe_tp / moe_ep ignored"]
    shape, notes = read_role({"tp": 2, "data_parallel": 4}, is_moe=False, model="m")
    assert shape == RoleShape(tp=2, replicas=4) and "read as replicas 4" in notes[0]
    assert read_role({"tp": 2, "ep": 2}, is_moe=False)[0] == RoleShape(tp=2)


def test_engine_words_that_do_not_add_up_are_a_shape_refusal():
    with pytest.raises(_Refusal, match="SGLang's ep 3 does not divide its tp 8") as info:
        read_role({"tp": 8, "ep": 3}, is_moe=True)
    assert info.value.rule == "shape"
    with pytest.raises(_Refusal, match="SGLang's dp 3 does not divide its tp 8"):
        read_role({"tp": 8, "dp": 3, "enable_dp_attention": True}, is_moe=True)
    with pytest.raises(_Refusal, match="moe_ep 3 does not divide"):
        read_role({"tp": 4, "attention_dp": 1, "moe_ep": 3}, is_moe=True)


def test_disagg_pin_reads_each_role():
    config, notes = read_pin({"prefill": {"tp": 4, "enable_expert_parallel": True},
                              "decode": {"tp": 8, "dp": 8, "enable_dp_attention": True, "ep": 8, "replicas": 2}},
                             is_moe=True, model="m")
    assert config == DisaggShape(RoleShape(tp=4, moe_ep=4), RoleShape(attention_dp=8, moe_ep=8, replicas=2))


def test_spelling_is_one_of_three():
    assert pin_spelling({"tp": 2, "replicas": 2}) == "canonical"
    assert pin_spelling({"tp": 2, "data_parallel": 2}) == "vllm"
    assert pin_spelling({"tp": 2, "enable_dp_attention": True}) == "sglang"
    with pytest.raises(ValueError, match="mixes canonical keys \\['moe_ep'\\] and sglang keys \\['dp'\\]"):
        pin_spelling({"tp": 2, "dp": 2, "moe_ep": 4})


# ---- the rules, through the CLI's path (real aiconfigurator-core) -----------------------------------------

def _check(model, system, backend, pin, gpus, mode="agg", **kw):
    return check_deployment(deployment_config(model=model, system=system, backend=backend, mode=mode, pin=pin,
                                              gpus=gpus, isl=5000, osl=250, concurrency=8, **kw))


@pytest.mark.integration
def test_single_gpu_moe_is_accepted():
    """gpt-oss-120b in MXFP4 fits one 80 GB H100 (AIC: ~56 GiB of weights, KV for its whole context)."""
    verdict = _check("openai/gpt-oss-120b", "h100_sxm", "vllm", {"tp": 1}, 1)
    assert verdict.accepted and verdict.config == "tp1/pp1/dp1/moe_tp1/moe_ep1x1"


@pytest.mark.integration
def test_memory_refusal_shows_the_numbers():
    verdict = _check("MiniMaxAI/MiniMax-M2.5", "b200_sxm", "vllm", {"tp": 1}, 1)
    assert verdict.rule == "memory"
    assert "no KV budget at gpu_memory_utilization 0.9" in verdict.message
    assert "GiB of 180.0 GiB per GPU outside the KV" in verdict.message
    assert verdict.nearest is None  # a 1-GPU budget leaves nothing nearer


@pytest.mark.integration
def test_block_quantized_expert_split_is_a_shape_refusal_with_the_ep_twin_nearest():
    """MiniMax-M2.5's fp8 experts (intermediate 1536, 128 blocks) cannot split 8 ways: vLLM needs EP at TP8."""
    verdict = _check("MiniMaxAI/MiniMax-M2.5", "h200_sxm", "vllm", {"tp": 8}, 8)
    assert verdict.rule == "shape" and "block-quantized experts cannot split moe_tp 8 ways" in verdict.message
    assert verdict.nearest == "tp8/pp1/dp1/moe_tp1/moe_ep8x1"
    assert _check("MiniMaxAI/MiniMax-M2.5", "h200_sxm", "vllm", {"tp": 8, "enable_expert_parallel": True}, 8).accepted


@pytest.mark.integration
def test_perf_data_refusal_names_the_missing_data():
    """AIC's MoE data has no 48-way expert parallelism for DeepSeek-R1 on GB200: refused by the perf-data rule."""
    verdict = _check("deepseek-ai/DeepSeek-R1", "gb200", "sglang",
                     {"tp": 48, "dp": 48, "enable_dp_attention": True, "ep": 48}, 48, context_length=9216)
    assert verdict.rule == "perf_data" and "MoE data missing" in verdict.message
    assert verdict.nearest is not None


@pytest.mark.integration
def test_budget_and_dense_readings():
    assert _check("Qwen/Qwen3-32B", "h200_sxm", "vllm", {"tp": 4, "replicas": 2}, 4).rule == "budget"
    dense = _check("Qwen/Qwen3-32B", "h200_sxm", "vllm", {"tp": 4, "moe_tp": 4}, 4)
    assert dense.accepted and any("is dense: moe_tp / moe_ep ignored" in n for n in dense.notes)
    wrong = _check("Qwen/Qwen3-32B", "h200_sxm", "vllm", {"tp": 2, "attention_dp": 2}, 4)
    assert wrong.rule == "shape" and "pin replicas 2 of tp 2" in wrong.message


@pytest.mark.integration
def test_a_config_error_is_its_own_rule():
    verdict = _check("Qwen/Qwen3-30B-A3B", "h200_sxm", "vllm", {"tp": 2, "dp": 2}, 4)
    assert verdict.rule == "config" and "SGLang's words" in verdict.message
