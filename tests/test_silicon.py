"""Silicon rows -> evaluator cases: names, precisions, the binding split, shapes, reasons."""

import csv
from pathlib import Path

import pytest

from spica_pipeline.fidelity import silicon

MODELS = {"Qwen/Qwen3-32B", "Qwen/Qwen3-32B-FP8", "nvidia/Llama-3.1-70B-Instruct-FP8",
          "meta-llama/Meta-Llama-3.1-70B", "zai-org/GLM-5-FP8", "nvidia/GLM-5-NVFP4", "deepseek-ai/DeepSeek-R1",
          "Qwen/Qwen3.5-397B-A17B"}
DBS = {"h200_sxm": {"vllm": ["0.24.0"], "sglang": ["0.5.16"]}, "b200_sxm": {"vllm": ["0.24.0"]}}
MOE = {"zai-org/GLM-5-FP8", "nvidia/GLM-5-NVFP4", "deepseek-ai/DeepSeek-R1", "Qwen/Qwen3.5-397B-A17B"}


def raw(**over):
    row = {"id": "r1", "silicon_data_source": "x; silicon_concurrency=16; y", "backend": "vllm",
           "backend_version": "0.19.0", "model_path": "meta-llama/Llama-3.1-70B", "system": "h200_sxm",
           "precision": "fp8", "mode": "agg", "isl": "1024", "osl": "1024", "gemm_quant_mode": "fp8",
           "moe_quant_mode": "fp8", "batch_size": "16", "tp_size": "4", "pp_size": "1", "attention_dp_size": "1",
           "moe_tp_size": "4", "moe_ep_size": "1", "silicon_ttft_ms": "120.5", "silicon_tpot_ms": "12.25"}
    row.update(over)
    return row


def mapped(**over):
    (row,) = silicon.parse_rows([raw(**over)])
    return silicon.map_row(row, models=MODELS, databases=DBS, is_moe=lambda m: m in MOE)


def test_llama_70b_fp8_maps_to_the_fp8_checkpoint_dense_shape():
    case = mapped()
    assert isinstance(case, silicon.SiliconCase)
    assert case.aic_model == "nvidia/Llama-3.1-70B-Instruct-FP8"
    agg = case.roles["agg"]
    # a dense model ignores the row's moe_tp (= tp) and runs one TP4 engine
    assert (agg.tp, agg.pp, agg.attention_dp, agg.moe_tp, agg.moe_ep, agg.workers) == (4, 1, 1, 1, 1, 1)
    assert case.row.concurrency == 16 and case.used_gpus == 4
    s = case.sample("0.24.0")
    assert s["model_name"] == "nvidia/Llama-3.1-70B-Instruct-FP8" and s["replicas"] == 1
    assert s["router_mode"] == "round_robin" and s["agg_max_num_batched_tokens"] == 8192
    assert case.workload(6, client_lengths=False) == {"isl": 1024, "osl": 1024, "concurrency": 16,
                                                      "num_request_ratio": 6}


@pytest.mark.parametrize("model,precision,expected", [
    ("Qwen/Qwen3-32B", "", "Qwen/Qwen3-32B"),
    ("Qwen/Qwen3-32B", "bf16", "Qwen/Qwen3-32B"),
    ("Qwen/Qwen3-32B", "fp8", "Qwen/Qwen3-32B-FP8"),
    ("meta-llama/Llama-3.1-70B", "", "meta-llama/Meta-Llama-3.1-70B"),
    ("zhipuai/GLM-5", "fp8", "zai-org/GLM-5-FP8"),
    ("zhipuai/GLM-5", "fp4", "nvidia/GLM-5-NVFP4"),
])
def test_names_and_precisions(model, precision, expected):
    over = {"model_path": model, "precision": precision}
    if expected in MOE:
        over.update(tp_size="8", moe_tp_size="1", moe_ep_size="8")
    case = mapped(**over)
    assert isinstance(case, silicon.SiliconCase), case
    assert case.aic_model == expected


def test_a_precision_without_a_checkpoint_is_never_substituted():
    out = mapped(precision="fp4", gemm_quant_mode="nvfp4")
    assert isinstance(out, silicon.Inexpressible)
    assert out.reason == "no AIC checkpoint for meta-llama/Llama-3.1-70B at fp4"
    # Qwen3.5 ships at bf16 in AIC: an fp8 row must not silently use it
    out = mapped(model_path="Qwen/Qwen3.5-397B-A17B", precision="fp8")
    assert isinstance(out, silicon.Inexpressible) and "at fp8" in out.reason


def test_split_is_by_the_rows_own_model_name():
    assert silicon.split_of("meta-llama/Llama-3.1-70B") == "calibration"
    assert silicon.split_of("nvidia/Llama-3.1-8B-Instruct-FP8") == "calibration"
    assert silicon.split_of("deepseek-ai/DeepSeek-V3") == "calibration"
    assert silicon.split_of("zhipuai/GLM-5") == "heldout"
    assert silicon.split_of("Qwen/Qwen3.5-397B-A17B") == "heldout"
    assert silicon.split_of("openai/gpt-oss-120b") == "heldout"
    assert mapped(model_path="zhipuai/GLM-5", tp_size="8", moe_tp_size="1", moe_ep_size="8").split == "heldout"


@pytest.mark.parametrize("over,reason", [
    ({"backend": "trtllm"}, "backend trtllm is outside the bench scope (vllm, sglang)"),
    ({"system": "gb300"}, "no AIC perf database for vllm on gb300"),
    ({"backend": "sglang", "system": "b200_sxm"}, "no AIC perf database for sglang on b200_sxm"),
    ({"silicon_data_source": "x", "id": "no_conc"}, "concurrency missing"),
    ({"silicon_ttft_ms": ""}, "silicon TTFT/TPOT missing"),
])
def test_inexpressible_reasons(over, reason):
    out = mapped(**over)
    assert isinstance(out, silicon.Inexpressible) and out.reason == reason


def test_concurrency_from_the_id_when_the_source_lacks_it():
    (row,) = silicon.parse_rows([raw(silicon_data_source="x", id="m_agg_1024x1024_c64_tp4")])
    assert row.concurrency == 64


def test_moe_shape_is_inferred_or_rejected_like_aic():
    glm = {"model_path": "zhipuai/GLM-5", "precision": "fp8", "tp_size": "8"}
    case = mapped(**glm, moe_tp_size="", moe_ep_size="8")
    assert (case.roles["agg"].moe_tp, case.roles["agg"].moe_ep) == (1, 8)
    out = mapped(**glm, moe_tp_size="2", moe_ep_size="8")
    assert isinstance(out, silicon.Inexpressible) and "does not match tp x dp = 8" in out.reason


def test_disagg_roles_and_worker_counts():
    over = {"mode": "disagg", "model_path": "Qwen/Qwen3-32B", "precision": "", "tp_size": "", "moe_tp_size": "",
            "batch_size": "", "silicon_data_source": "silicon_concurrency=64", "backend": "sglang",
            "prefill_num_workers": "2", "prefill_tp_size": "2", "prefill_pp_size": "1", "prefill_batch_size": "1",
            "decode_num_workers": "1", "decode_tp_size": "4", "decode_pp_size": "1", "decode_batch_size": "64"}
    case = mapped(**over)
    assert isinstance(case, silicon.SiliconCase), case
    assert case.roles["prefill"].workers == 2 and case.roles["decode"].tp == 4
    assert case.used_gpus == 8
    s = case.sample("0.5.16")
    assert s["prefill_replicas"] == 2 and s["decode_replicas"] == 1 and s["decode_max_num_seqs"] == 64
    out = mapped(**{**over, "prefill_num_workers": ""})
    assert isinstance(out, silicon.Inexpressible) and out.reason == "prefill worker count missing"


def test_every_shipped_row_is_classified():
    """The real CSV from the installed aiconfigurator-core: each row is a case or has a reason."""
    import aiconfigurator_core

    path = Path(aiconfigurator_core.__file__).resolve().parent / "systems" / "silicon_sample.csv"
    with open(path, newline="") as fh:
        rows = silicon.parse_rows(csv.DictReader(fh))
    assert len(rows) > 5000
    models = set(silicon.CHECKPOINTS.values())
    dbs = {r.system: {"vllm": ["x"], "sglang": ["x"]} for r in rows}
    out = [silicon.map_row(r, models=models, databases=dbs, is_moe=lambda m: False) for r in rows]
    cases = [o for o in out if isinstance(o, silicon.SiliconCase)]
    assert cases and all(o.reason for o in out if isinstance(o, silicon.Inexpressible))
    assert {c.split for c in cases} == {"calibration", "heldout"}
    assert {r.model for r in rows} >= silicon.CALIBRATION_MODELS


def test_batch_size_is_per_attention_dp_rank():
    glm = {"model_path": "zhipuai/GLM-5", "precision": "fp8", "tp_size": "2", "attention_dp_size": "2",
           "moe_tp_size": "1", "moe_ep_size": "4", "batch_size": "32", "silicon_data_source": "silicon_concurrency=64",
           "backend": "sglang"}
    case = mapped(**glm)
    assert case.roles["agg"].max_num_seqs == 32  # 32 per rank x 2 ranks = the 64 clients
    assert case.sample("0.5.16")["agg_max_num_seqs"] == 32 and case.note is None


def test_vllm_attention_dp_equal_to_tp_with_ep_over_both_is_read_as_its_twin():
    """Round 9: such rows measure the same deployment as tp GPUs, no attention DP, moe_ep = tp."""
    twin = {"model_path": "zhipuai/GLM-5", "precision": "fp8", "tp_size": "4", "attention_dp_size": "4",
            "moe_tp_size": "1", "moe_ep_size": "16", "batch_size": "4", "silicon_data_source": "silicon_concurrency=16"}
    case = mapped(**twin)
    shape = case.roles["agg"]
    assert (shape.tp, shape.attention_dp, shape.moe_tp, shape.moe_ep, shape.max_num_seqs) == (4, 1, 1, 4, 16)
    assert case.used_gpus == 4 and case.note == silicon.EP_TWIN_NOTE
    near = silicon.nearest_deployments(case, "no KV budget")  # a nearest deployment keeps the note
    assert near and all(c.note == silicon.EP_TWIN_NOTE for c, _, _ in near)
    for other in ({"backend": "sglang"}, {"attention_dp_size": "2", "moe_ep_size": "8"}):
        kept = mapped(**{**twin, **other})  # SGLang's convention, or dp != tp: read literally
        assert kept.note is None and kept.roles["agg"].attention_dp > 1


def test_inferencemax_rows_are_replayed_with_their_clients_length_spread():
    """Round 10: InferenceMAX's client draws ISL and OSL uniformly in [int(0.8 L), L]; AIC's runners do not."""
    assert silicon.range_ratio_lengths(1024, 0.8) == (922, (1024 - 922) / 922)
    mean, jitter = silicon.range_ratio_lengths(8192, 0.8)
    assert round(mean * (1 + jitter)) == 8192 and abs(mean * (1 - jitter) - int(0.8 * 8192)) <= 1
    imx = mapped(silicon_data_source="db-dump/2026-04-27; config_id=81; silicon_concurrency=16; workflow_run_id=1")
    assert imx.client == silicon.INFERENCEMAX
    w = imx.workload(10)
    assert (w["isl"], w["osl"], w["concurrency"]) == (922, 922, 16)
    assert w["isl_jitter"] == w["osl_jitter"] == pytest.approx(102 / 922)
    long = mapped(isl="8192", silicon_data_source="source_file=2026-04-06.csv; silicon_concurrency=16")
    assert long.client == silicon.INFERENCEMAX and long.workload(10)["isl"] == 7372
    for over in ({"silicon_data_source": "source_file=/x/aic-auto-gap-analysis/data/h100_sxm/vllm/q.csv; "
                                         "silicon_concurrency=16"},   # AIC's own runner: fixed lengths
                 {"isl": "4096", "osl": "512"}):                        # not an InferenceMAX scenario
        case = mapped(**over)
        assert case.client == silicon.AIC_RUNNER
        assert "isl_jitter" not in case.workload(10) and case.workload(10)["isl"] == int(over.get("isl", 1024))


def test_nearest_deployment_for_a_refused_moe_split_is_expert_parallel():
    case = mapped(model_path="zhipuai/GLM-5", precision="fp8", tp_size="8", moe_tp_size="8", moe_ep_size="1")
    tries = silicon.nearest_deployments(case, "no KV budget for backend=vllm, shape=tp8/pp1/dp1/moe_tp8/moe_ep1 "
                                              "(Invalid quantized MoE configuration: 1536 / 8 % 128 != 0)")
    first, fraction, note = tries[0]
    assert (first.roles["agg"].moe_tp, first.roles["agg"].moe_ep, first.roles["agg"].tp) == (1, 8, 8)
    assert fraction == 0.9 and "expert-parallel" in note
    assert all(n for _, _, n in tries)  # every substitution says what it changed


def test_nearest_deployment_for_no_kv_budget_raises_the_memory_fraction_first():
    case = mapped()
    tries = silicon.nearest_deployments(case, "no KV budget for backend=vllm, shape=tp4/pp1/dp1/moe_tp1/moe_ep1")
    assert [(t[0] is case, t[1]) for t in tries] == [(True, 0.95), (True, 0.98)]
    assert "memory fraction 0.9; replayed at 0.95" in tries[0][2]


def test_nearest_deployment_for_tp_not_dividing_heads_is_dp_attention():
    case = mapped(model_path="deepseek-ai/DeepSeek-R1", precision="fp8", backend="sglang", tp_size="72",
                  moe_tp_size="72", moe_ep_size="1", batch_size="576", system="h200_sxm")
    (first, fraction, note), *_ = silicon.nearest_deployments(case, "num_heads 128 should be divisible by tp_size 72")
    s = first.roles["agg"]
    assert (s.tp, s.attention_dp, s.moe_tp, s.moe_ep) == (1, 72, 1, 72) and "DP-attention" in note


def test_no_nearest_deployment_for_other_failures():
    assert silicon.nearest_deployments(mapped(), "PerfDataNotAvailableError: MoE data missing") == []


def _sglang(**over):
    base = {"backend": "sglang", "backend_version": "0.5.9", "model_path": "deepseek-ai/DeepSeek-R1",
            "system": "b200_sxm", "tp_size": "8", "moe_tp_size": "8", "batch_size": "16",
            "id": "2026_04_06_deepseek_r1_b200_sxm_sglang_fp8_agg_1024x1024_c16_tp8_ep1_286",
            "silicon_data_source": "source_file=2026-04-06.csv; silicon_concurrency=16"}
    (row,) = silicon.parse_rows([raw(**{**base, **over})])
    return row


def test_script_flags_follow_the_inferencex_script_branch():
    """Round 16: the flags InferenceX's script passed for the row's branch; the receive interval as polling steps."""
    f = silicon.script_flags(_sglang())
    assert (f.chunk_tokens, f.max_running, f.memory_fraction, f.recv_interval) == (32768, 128, 0.82, 30)
    assert f.recv_wait_steps == 14.5 and "dsr1_fp8_b200.sh" in f.script
    low = silicon.script_flags(_sglang(silicon_data_source="source_file=2026-04-06.csv; silicon_concurrency=8"))
    assert low.recv_interval == 10 and low.recv_wait_steps == 4.5
    tp4 = silicon.script_flags(_sglang(tp_size="4", moe_tp_size="4", isl="8192"))
    assert (tp4.chunk_tokens, tp4.max_running, tp4.memory_fraction, tp4.recv_interval) == (8192, 32, 0.95, 10)
    h200 = silicon.script_flags(_sglang(system="h200_sxm"))
    assert (h200.chunk_tokens, h200.max_running, h200.recv_interval) == (32768, 512, 1) and h200.recv_wait_steps == 0
    glm_h200 = silicon.script_flags(_sglang(model_path="zhipuai/GLM-5", system="h200_sxm"))
    assert glm_h200.chunk_tokens == silicon.SGLANG_SMALL_GPU_CHUNK and glm_h200.max_running is None
    glm_b200 = silicon.script_flags(_sglang(model_path="zhipuai/GLM-5"))
    assert glm_b200.max_running == 16 and glm_b200.recv_interval == 1  # --max-running-requests $CONC


@pytest.mark.parametrize("over", [
    {"silicon_data_source": "source_file=2026-04-06.csv; silicon_concurrency=128"},  # above the script's search space
    {"backend": "vllm"},                                                               # SGLang scripts only
    {"mode": "disagg"},
    {"isl": "4096", "osl": "512"},                                                     # AIC's runner's scenario
    {"model_path": "Qwen/Qwen3.5-397B-A17B", "precision": "bf16", "id": "qwen35_b200_bf16_c16_cfg1"},  # undated:
    {"model_path": "zhipuai/GLM-5", "precision": "fp4", "id": "x_c4", "batch_size": "4",         # versions disagree
     "silicon_data_source": "source_file=2026-04-06.csv; silicon_concurrency=4"},
])
def test_rows_whose_script_is_unknown_or_ambiguous_keep_the_old_replay(over):
    assert silicon.script_flags(_sglang(**over)) is None


def test_the_scripts_running_request_cap_bounds_max_num_seqs():
    case = mapped(backend="sglang", batch_size="64", silicon_data_source="x; silicon_concurrency=64")
    capped = silicon.with_script_flags(case, silicon.ScriptFlags(32768, 32, 0.9, 1, "s"))
    assert case.roles["agg"].max_num_seqs == 64 and capped.roles["agg"].max_num_seqs == 32
    assert silicon.with_script_flags(case, silicon.ScriptFlags(32768, None, 0.9, 1, "s")) is case
