"""bench/bench_coverage.py: silicon rows grouped into deployments and pinned as the CLI's one-candidate configs,
and the stored result's headline agreeing with its own records."""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import bench_coverage  # noqa: E402

from spica_pipeline.fidelity.silicon import parse_rows  # noqa: E402

HEADER = {"backend": "vllm", "backend_version": "0.19.0", "system": "h200_sxm", "precision": "fp8",
          "silicon_ttft_ms": "100", "silicon_tpot_ms": "10", "silicon_data_source": "x; silicon_concurrency=16"}


def _row(**kw):
    return {**HEADER, **{k: str(v) for k, v in kw.items()}}


def test_rows_of_one_deployment_group_and_pin_as_written():
    rows = parse_rows([
        _row(id="a", model_path="Qwen/Qwen3-235B-A22B-FP8", mode="agg", isl=1024, osl=1024, tp_size=2,
             pp_size=1, moe_tp_size=4, moe_ep_size=1),
        _row(id="b", model_path="Qwen/Qwen3-235B-A22B-FP8", mode="agg", isl=8192, osl=1024, tp_size=2,
             pp_size=1, moe_tp_size=4, moe_ep_size=1),
        _row(id="c", model_path="Qwen/Qwen3-235B-A22B-FP8", mode="disagg", isl=1024, osl=1024,
             prefill_tp_size=1, prefill_attention_dp_size=4, prefill_moe_tp_size=0, prefill_moe_ep_size=0,
             prefill_num_workers=2, decode_tp_size=4, decode_num_workers=""),
    ])
    groups = bench_coverage.deployments(rows)
    assert [len(g) for g in groups.values()] == [2, 1]
    agg, disagg = (bench_coverage.row_config(g, "Qwen/Qwen3-235B-A22B-FP8") for g in groups.values())
    space = agg["search_space"]
    # attention_dp unstated: the engine is as wide as its experts (4 GPUs); the longest ISL + OSL it ran
    assert space["parallel_configs"] == [{"tp": 2, "pp": 1, "moe_tp": 4, "moe_ep": 1, "replicas": 1}]
    assert (space["gpu_budget"], space["context_length"], space["backend"]) == (4, 9216, ["vllm"])
    assert agg["workload"] == {"isl": 1024, "osl": 1024, "concurrency": 16, "num_request_ratio": 10.0}
    pin = disagg["search_space"]["parallel_configs"][0]
    # MoE widths of 0 are unstated (left out); an unstated worker count is one worker
    assert pin == {"prefill": {"tp": 1, "attention_dp": 4, "replicas": 2}, "decode": {"tp": 4, "replicas": 1}}
    assert disagg["search_space"]["gpu_budget"] == 12


def test_stored_result_counts_its_records():
    result = json.loads((ROOT / "bench" / "results" / "coverage.json").read_text())
    headline = [r for r in result["records"] if r["set"] == "checkpoint"]
    assert result["deployments"] == len(headline)
    assert result["accepted"] == sum(r["accepted"] for r in headline)
    assert len(result["refused"]) == result["deployments"] - result["accepted"]
    assert all(r["rule"] and r["message"] for r in result["refused"])
    assert sum(m["deployments"] for m in result["by_mode"].values()) == result["deployments"]
