"""recommendation.json: the SweepResult 1.1 envelope round-trips losslessly with our ledger."""

import json

import pandas as pd
import pytest
from test_report import GOAL, make_ledger

from spica_pipeline.report import merge_candidates, write_outputs
from spica_pipeline.report.sweep_result import (
    REASON_CATEGORIES,
    STATUSES,
    classify,
    config_sha256,
    ledger_to_sweep_result,
    sweep_result_to_ledger,
    to_json_text,
)

CONFIG = {"search_space": {"model_name": "Qwen/Qwen3-32B", "gpu_budget": 16}, "sweep": {"seed": 0}}


@pytest.mark.parametrize("target", ["throughput_per_gpu", "pareto"])
def test_round_trip_is_lossless(tmp_path, target):
    ledger = make_ledger(seed=5, n=45)
    ledger.to_parquet(tmp_path / "l.parquet")
    ledger = pd.read_parquet(tmp_path / "l.parquet")  # the dtypes a sweep's ledger.parquet has
    m = merge_candidates(ledger, target, gpu_budget=16)
    doc = ledger_to_sweep_result(ledger, m, config_json=CONFIG, top_n=3, goal=GOAL)
    text = to_json_text(doc)
    back = sweep_result_to_ledger(json.loads(text))
    pd.testing.assert_frame_equal(back, ledger)
    assert to_json_text(ledger_to_sweep_result(back, m, config_json=CONFIG, top_n=3, goal=GOAL)) == text


def test_envelope_fields():
    ledger = make_ledger(seed=5, n=45)
    m = merge_candidates(ledger, "throughput_per_gpu", gpu_budget=16)
    doc = ledger_to_sweep_result(ledger, m, config_json=CONFIG, top_n=3, goal=GOAL)
    assert doc["schema_version"] == "1.1" and doc["candidate_retention"] == "all"
    prov = doc["provenance"]
    assert prov["input_fingerprint"]["config_sha256"] == config_sha256(CONFIG) and prov["config"] == CONFIG
    c = doc["counts"]
    assert c["cache_hits"] == 1 and len(doc["candidates"]) == len(ledger) - 1
    assert c["evaluated"] == c["feasible"] + c["infeasible"] + c["timed_out"] + c["failed"] + c["resource_limited"]
    ids = [x["candidate_id"] for x in doc["candidates"]]
    assert len(set(ids)) == len(ids) and all(i.startswith("candidate-") and len(i) == 16 for i in ids)
    assert len(doc["views"]["top_n"]) == 3 and doc["views"]["pareto_front"] == []
    by_id = {x["candidate_id"]: x for x in doc["candidates"]}
    top = [by_id[i] for i in doc["views"]["top_n"]]
    assert [t["score"] for t in top] == sorted((t["score"] for t in top), reverse=True)
    assert top[0]["config"] == m.candidates[0].config | {} or top[0]["used_gpus"] == m.candidates[0].used_gpus
    for x in doc["candidates"]:
        assert x["status"] in STATUSES
        assert (x["reason_category"] is None) == (x["status"] == "feasible")
        assert x["reason_category"] is None or x["reason_category"] in REASON_CATEGORIES
    kinds = {(x["status"], x["reason_category"]) for x in doc["candidates"]}
    assert ("infeasible", "kv_capacity") in kinds and ("timed_out", "runtime_timeout") in kinds
    assert ("unsupported", "backend_topology") in kinds and ("failed", "replay_runtime") in kinds
    front = ledger_to_sweep_result(ledger, merge_candidates(ledger, "pareto"), config_json=CONFIG, goal=GOAL)
    assert front["views"]["top_n"] == [] and len(front["views"]["pareto_front"]) >= 1


def test_classify_resource_limits_and_budget():
    assert classify("failed", "replay failed: MemoryError") == ("resource_limited", "resource_limit")
    assert classify("infeasible", "used_gpus 24 exceeds the budget 16 (gpu_budget)") == ("infeasible", "gpu_budget")
    assert classify("infeasible", "p90 TTFT 900 ms breaks the SLA ttft_ms 500") == ("infeasible", "sla_constraint")
    assert classify("feasible", None) == ("feasible", None)
    assert classify("failed", "workload.isl=50000 exceeds the model context length 40960") == (
        "failed", "candidate_materialization")


def test_import_refuses_foreign_or_broken_documents():
    with pytest.raises(ValueError, match="schema_version"):
        sweep_result_to_ledger({"schema_version": "2.0"})
    with pytest.raises(ValueError, match="not a spica export"):
        sweep_result_to_ledger({"schema_version": "1.0", "candidates": [], "provenance": {}})
    ledger = make_ledger()
    doc = ledger_to_sweep_result(ledger, merge_candidates(ledger, "throughput"), config_json=CONFIG)
    doc["candidates"].pop(3)
    with pytest.raises(ValueError, match="contiguous"):
        sweep_result_to_ledger(doc)


def test_write_outputs_writes_recommendation_atomically(tmp_path):
    ledger = make_ledger()
    m = merge_candidates(ledger, "throughput_per_gpu")
    paths = write_outputs(tmp_path, ledger, m, goal_summary=GOAL, workload_summary={}, timings={},
                          config_json=CONFIG)
    doc = json.loads(paths["recommendation"].read_text())
    assert doc["schema_version"] == "1.1" and not list(tmp_path.rglob("*.tmp"))
