"""`spica sweep` end to end on a tiny config with the real replay: exit codes, files, report."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from spica_pipeline.report.dgd import validate_manifest

pytestmark = pytest.mark.integration

TINY = {
    "search_space": {
        "model_name": "Qwen/Qwen3-32B", "hardware_sku": "h200_sxm", "gpu_budget": 2,
        "deployment_mode": ["agg"], "backend": ["vllm"], "router_mode": ["round_robin"],
        "planner_scaling_policy": ["disabled"], "agg_max_num_seqs": [256],
        "agg_max_num_batched_tokens": [8192],
    },
    "workload": {"isl": 512, "osl": 64, "request_rate": 4, "num_request_ratio": 10},
    "goal": {"target": "throughput_per_gpu"},
    "sweep": {"max_rounds": 2, "candidates_per_round": 2, "parallel_evals": 1, "max_eval_seconds": 120},
}


def write_config(tmp_path: Path, **goal) -> Path:
    data = json.loads(json.dumps(TINY))
    data["goal"].update(goal)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def spica(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spica_pipeline", *args], capture_output=True, text=True,
                          timeout=300, env={**__import__("os").environ, "DYN_LOG": "warn"})


def test_tiny_sweep_writes_consistent_outputs(tmp_path):
    out = tmp_path / "out"
    proc = spica("sweep", "--config", str(write_config(tmp_path)), "--output-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    # the budget-2 agg pool (TP1x1, TP1x2, TP2x1) fits 2 rounds x 2: enumerated exhaustively
    assert "enumerated exhaustively" in proc.stderr
    assert "0: score=" in proc.stdout
    for name in ("ledger.parquet", "candidates.parquet", "candidates.csv", "report.md", "pareto.png",
                 "convergence.png", "deploy/1/dgd.yaml", "deploy/1/simulation_record.yaml", "journal.jsonl"):
        assert (out / name).is_file(), name
    ledger = pd.read_parquet(out / "ledger.parquet")
    assert len(ledger) == 3 and set(ledger["status"]) == {"feasible"}
    assert ledger["spec_hash"].is_unique
    candidates = pd.read_parquet(out / "candidates.parquet")
    assert set(candidates["spec_hash"]) <= set(ledger.loc[ledger["status"] == "feasible", "spec_hash"])
    assert list(candidates["score"]) == sorted(candidates["score"], reverse=True)
    report = (out / "report.md").read_text()
    assert "throughput_per_gpu" in report and "exhaustive" in report.lower()
    deployment = yaml.safe_load((out / "deploy/1/simulation_record.yaml").read_text())
    assert deployment  # a real YAML document a person can adapt
    manifest = yaml.safe_load((out / "deploy/1/dgd.yaml").read_text())
    assert validate_manifest(manifest) == [] and manifest["apiVersion"] == "nvidia.com/v1beta1"

    # recommendation.json (SweepResult) round-trips through `spica import` / `spica export`
    written = (out / "recommendation.json").read_text()
    assert json.loads(written)["schema_version"] == "1.1"
    imported = spica("import", "--input", str(out / "recommendation.json"), "--output-dir", str(tmp_path / "imp"))
    assert imported.returncode == 0, imported.stderr
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "imp/ledger.parquet"),
                                  pd.read_parquet(out / "ledger.parquet"))
    exported = spica("export", "--config", str(write_config(tmp_path)), "--run-dir", str(out),
                     "--output", str(tmp_path / "again.json"))
    assert exported.returncode == 0, exported.stderr
    assert (tmp_path / "again.json").read_text() == written
    bad = spica("import", "--input", str(out / "ledger.parquet"), "--output-dir", str(tmp_path / "x"))
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1

    # a rerun on the same directory replays nothing: every outcome comes from the journal
    again = spica("sweep", "--config", str(write_config(tmp_path)), "--output-dir", str(out))
    assert again.returncode == 0, again.stderr
    assert "resuming" in again.stderr
    rerun = pd.read_parquet(out / "ledger.parquet")
    assert (rerun["replay_seconds"] == ledger["replay_seconds"]).all()
    outcomes = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]
    assert sum(r["kind"] == "outcome" for r in outcomes) == 3


def test_nothing_feasible_exits_1_with_the_reasons(tmp_path):
    # an impossible SLA with the strict gate: every candidate is gated out
    config = write_config(tmp_path, sla={"ttft_ms": 0.001, "itl_ms": 0.001}, sla_gate="strict")
    proc = spica("sweep", "--config", str(config), "--output-dir", str(tmp_path / "out"))
    assert proc.returncode == 1, proc.stderr
    assert "no feasible candidate found" in proc.stderr
    assert "sla gate" in proc.stderr and "(x3)" in proc.stderr
    assert (tmp_path / "out" / "ledger.parquet").is_file()  # nothing is lost


def test_no_configuration_met_the_sla_exits_5_and_says_so(tmp_path):
    # the SLA acts through goodput (no strict gate), so every candidate is ranked and none meets it
    config = write_config(tmp_path, target="goodput_per_gpu", sla={"ttft_ms": 0.001, "tpot_ms": 0.001})
    out = tmp_path / "out"
    proc = spica("sweep", "--config", str(config), "--output-dir", str(out))
    assert proc.returncode == 5, proc.stderr
    sentence = "No configuration met the SLA (TTFT <= 0.001 ms, ITL <= 0.001 ms for >= 90 % of requests)."
    assert sentence[:-1] in proc.stdout and "Closest: agg, vllm" in proc.stdout
    report = (out / "report.md").read_text()
    assert report.index(sentence[:-1]) < report.index("## Goal")  # at the top
    assert (out / "deploy" / "1" / "dgd.yaml").is_file()  # an answer, written like any other


def test_bad_config_is_exit_2_one_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("search_space: {model_name: Qwen/Qwen3-32B, hardware_sku: h200_sxm, gpu_budget: 0}\n"
                    "workload: {isl: 1, osl: 1, request_rate: 1, num_request_ratio: 1}\n")
    proc = spica("sweep", "--config", str(path))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "invalid config" in proc.stderr and "gpu_budget" in proc.stderr


def test_tiny_pareto_sweep_over_a_kv_load_range(tmp_path):
    data = json.loads(json.dumps(TINY))
    data["workload"] = {"isl": 512, "osl": 64, "kv_load_ratio": [0.1, 0.9], "num_request_ratio": 4}
    data["goal"] = {"target": "pareto"}
    data["sweep"].update(max_rounds=1, candidates_per_round=3, algorithm="RANDOM_SEARCH")
    path = tmp_path / "pareto.yaml"
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    proc = spica("sweep", "--config", str(path), "--output-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "pareto front (" in proc.stdout
    ledger = pd.read_parquet(out / "ledger.parquet")
    feasible = ledger[ledger["status"] == "feasible"]
    configs = [json.loads(c) for c in feasible["config"]]
    assert len(configs) == 3 and all(0.1 <= c["kv_load_ratio"] <= 0.9 and c["concurrency"] >= 1 for c in configs)
