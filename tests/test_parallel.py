import json
import time
from collections import defaultdict

import pytest

from spica_pipeline.errors import NoPerfDatabase, NoViableParallelConfig
from spica_pipeline.space.parallel import (
    GENERIC_TOPOLOGY,
    RULES,
    Topology,
    engine_shapes_at,
    gpu_ladder,
    parallel_configs_for,
    topology,
)
from spica_pipeline.space.shapes import DisaggShape, RoleShape

pytestmark = pytest.mark.integration  # real aiconfigurator-core estimates

DENSE, MOE, SKU = "Qwen/Qwen3-32B", "Qwen/Qwen3-30B-A3B", "h200_sxm"


def replicas_by_width(configs):
    out = defaultdict(set)
    for c in configs:
        out[c.gpus_per_engine].add(c.replicas)
    return dict(out)


def test_dense_vllm_budget_8_replicas_per_width():
    result = parallel_configs_for(DENSE, SKU, "vllm", "agg", 8)
    assert replicas_by_width(result.configs) == {8: {1}, 4: {1, 2}, 2: {1, 2, 3, 4}, 1: set(range(1, 9))}
    assert all(c.strategy == "tp" and c.tp == c.gpus_per_engine and c.pp == 1 for c in result.configs)
    diag = result.diagnostics
    assert diag.pruned_count("ladder") == 1 and diag.configs_kept == 15
    assert diag.backend_version == "0.27.0" and diag.max_seq_len == 40960  # the model's max context


def test_moe_patterns_at_1_and_4():
    result = parallel_configs_for(MOE, SKU, "vllm", "agg", 8)
    at4 = {c.engine_key() for c in result.configs if c.gpus_per_engine == 4}
    # (tp, pp, dp, moe_tp, moe_ep): TEP, DEP, MoE-TP, DTP, and TP2 x DP2 with the experts over all 4 GPUs
    assert at4 == {(4, 1, 1, 1, 4), (1, 1, 4, 1, 4), (4, 1, 1, 4, 1), (1, 1, 4, 4, 1), (2, 1, 2, 1, 4)}
    assert {c.strategy for c in result.configs} == {"tep", "dep", "tp", "dtp", "mixed"}
    # one GPU runs the whole MoE model (Qwen3-30B-A3B fits an H200), up to 8 replicas of it
    assert engine_shapes_at(True, "vllm", 1) == [RoleShape()]
    assert replicas_by_width(result.configs) == {1: set(range(1, 9)), 2: {1, 2, 3, 4}, 4: {1, 2}, 8: {1}}


def test_ladder_follows_the_system():
    h200, gb200 = topology("h200_sxm"), topology("gb200")
    assert (h200.gpus_per_node, h200.nvlink_domain, h200.tp_cap) == (8, 8, 16)
    assert (gb200.gpus_per_node, gb200.nvlink_domain, gb200.tp_cap) == (4, 72, 72)
    assert gpu_ladder(h200, 8) == (1, 2, 4, 8) and gpu_ladder(h200, 72) == (1, 2, 4, 8, 16, 32, 64)
    assert gpu_ladder(Topology("x", 6, 6), 30) == (1, 2, 4, 6, 12, 24)  # whole nodes past one node
    assert h200.ladder_problem(3) and h200.ladder_problem(12) and not h200.ladder_problem(24)
    assert not gb200.ladder_problem(72) and not gb200.ladder_problem(20) and gb200.ladder_problem(6)


def test_wide_ep_past_a_node():
    t = topology("h200_sxm")
    at64 = {s.engine_key() for s in engine_shapes_at(True, "sglang", 64, topo=t)}
    # DEP64 and TP inside a node x DP across with EP64; no TEP64 (attention TP stays within two nodes) and no
    # DTP64 (expert TP stays within 16 GPUs)
    assert at64 == {(1, 1, 64, 1, 64), (2, 1, 32, 1, 64), (4, 1, 16, 1, 64), (8, 1, 8, 1, 64)}
    assert (32, 1, 1, 1, 32) in {s.engine_key() for s in engine_shapes_at(True, "sglang", 32, topo=topology("gb200"))}
    assert engine_shapes_at(False, "vllm", 32, topo=t) == [] and engine_shapes_at(False, "vllm", 16, topo=t)


def test_backend_filters_are_recorded():
    from spica_pipeline.space.parallel import _Pruned

    pruned = {r: _Pruned() for r in RULES}
    shapes = engine_shapes_at(True, "trtllm", 4, pruned)
    assert all(not (s.tp > 1 and s.attention_dp > 1) for s in shapes)
    assert any("trtllm forbids tp>1 with attention_dp>1" in e for e in pruned["backend_filter"].examples)
    pruned = {r: _Pruned() for r in RULES}
    engine_shapes_at(True, "vllm", 4, pruned)
    assert any("tp4/pp1/dp1/moe_tp2/moe_ep2 (vllm forbids" in e for e in pruned["backend_filter"].examples)
    # sglang's EP-only kernel filter is dormant: moe_tp2 x moe_ep2 is only left to pins as a pattern
    pruned = {r: _Pruned() for r in RULES}
    engine_shapes_at(True, "sglang", 4, pruned, GENERIC_TOPOLOGY)
    assert pruned["backend_filter"].count == 0 and pruned["pattern"].count > 0


def test_trtllm_moe_disagg_pair_counts():
    plain = parallel_configs_for(MOE, SKU, "trtllm", "disagg", 8)
    assert len(plain.configs) == 332
    assert all(isinstance(c, DisaggShape) and c.used_gpus <= 8 for c in plain.configs)
    floor = parallel_configs_for(MOE, SKU, "trtllm", "disagg", 8, min_budget=8)
    assert len(floor.configs) == 135 and all(c.used_gpus == 8 for c in floor.configs)
    d = floor.diagnostics
    # 13 engine shapes (1 GPU; TEP, DEP, MoE-TP, DTP at 2, 4, 8; trtllm has no TP x DP) give 36 role
    # configs; every raw prefill x decode pair is kept or pruned by exactly one rule
    assert d.engine_shapes_kept == 13 and d.configs_considered == 36 * 36
    pruned = sum(d.pruned_count(rule) for rule in ("budget", "min_budget", "kv"))
    assert d.configs_kept + pruned == 36 * 36
    assert d.pruned_count("min_budget") == 197


def test_agg_min_gpu_budget():
    result = parallel_configs_for(DENSE, SKU, "sglang", "agg", 8, min_budget=6)
    assert {c.used_gpus for c in result.configs} == {6, 7, 8}
    assert result.diagnostics.pruned_count("min_budget") == 15 - len(result.configs)


def test_kv_filter_uses_max_seq_len():
    big = "Qwen/Qwen3-235B-A22B"
    strict = parallel_configs_for(big, SKU, "vllm", "agg", 4)
    loose = parallel_configs_for(big, SKU, "vllm", "agg", 4, max_seq_len=4096)
    kv = dict(strict.diagnostics.kv_tokens)
    dep4 = "tp1/pp1/dp4/moe_tp1/moe_ep4"
    assert 4096 < kv[dep4] <= 40960  # a few thousand tokens per rank: too few for the 40k context
    assert kv["tp2/pp1/dp1/moe_tp1/moe_ep2"] is None  # weights leave no KV budget on 2 GPUs
    assert not any(c.engine_key() == (1, 1, 4, 1, 4) for c in strict.configs)
    assert any(c.engine_key() == (1, 1, 4, 1, 4) for c in loose.configs)
    assert kv["tp1/pp1/dp1/moe_tp1/moe_ep1"] is None  # nor on one
    assert strict.diagnostics.pruned_count("kv") > 0
    kv_examples = strict.diagnostics.to_dict()["pruned"]["kv"]["examples"]
    assert all("no KV budget" in e or "KV tokens per rank <= max_seq_len 40960" in e for e in kv_examples)


def test_model_too_big_for_budget():
    with pytest.raises(NoViableParallelConfig) as err:
        parallel_configs_for("meta-llama/Meta-Llama-3.1-405B", SKU, "vllm", "agg", 2)
    msg = str(err.value)
    assert "gpu_budget=2" in msg and "kv: 3 pruned" in msg and "no KV budget" in msg and "\n" not in msg


def test_no_perf_database_for_backend():
    with pytest.raises(NoPerfDatabase):
        parallel_configs_for(DENSE, "b60", "sglang", "agg", 8)


def test_memoised_second_call_is_free():
    args = (MOE, SKU, "sglang", "disagg", 16)
    first = parallel_configs_for(*args)
    t0 = time.perf_counter()
    again = parallel_configs_for(*args)
    assert again is first and time.perf_counter() - t0 < 0.01


def test_diagnostics_json_round_trip():
    diag = parallel_configs_for(MOE, SKU, "vllm", "disagg", 8, min_budget=4).diagnostics.to_dict()
    assert json.loads(json.dumps(diag)) == diag
    assert set(diag["pruned"]) == set(RULES)
    assert diag["engine_shapes_kept"] == 16  # 1 + 4 + 5 + 6 engine layouts at 1, 2, 4, 8 GPUs
    assert diag["pruned"]["ladder"]["examples"] == ["g=16 > gpu_budget=8"]


def test_width_the_model_cannot_split_is_pruned_not_fatal():
    # Qwen3.5-27B has 24 attention heads: TP16 cannot be modelled, TP1..TP8 still can
    result = parallel_configs_for("Qwen/Qwen3.5-27B", SKU, "vllm", "agg", 16)
    assert max(c.tp for c in result.configs) == 8
    kv = result.diagnostics.to_dict()["pruned"]["kv"]
    assert kv["count"] == 1 and "not modellable" in kv["examples"][0] and "tp_size 16" in kv["examples"][0]


def test_model_aic_cannot_estimate_is_one_line_error():
    from spica_pipeline.errors import ModelHardwareError

    with pytest.raises(ModelHardwareError, match="cannot estimate KV capacity for model") as err:
        parallel_configs_for("nvidia/Llama-3_3-Nemotron-Super-49B-v1", SKU, "vllm", "agg", 2)
    assert "\n" not in str(err.value)
