"""bench/bench_calibration_cost.py: matching two sweeps' trials by what was built, and the agreement
of their rankings (no sweep is run here; the bench's config must validate)."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import bench_calibration_cost as bench  # noqa: E402


def test_configuration_ignores_the_benchmark_client_replay_only():
    built = {"tp": 2, "replicas": 1, "concurrency": 64}
    auto = json.dumps({**built, "benchmark_client": {"mean_ttft_ms": 12.0}})
    assert bench.configuration("agg", auto) == bench.configuration("agg", json.dumps(built))
    assert bench.configuration("agg", auto) != bench.configuration("disagg", json.dumps(built))
    assert bench.configuration("agg", json.dumps({**built, "tp": 4})) != bench.configuration("agg", json.dumps(built))


def test_agreement_counts_ties_at_the_cut_and_the_shared_pick():
    raw = {"a": 10.0, "b": 10.0, "c": 8.0, "d": 0.0}
    calibrated = {"a": 8.0, "b": 9.0, "c": 4.0, "d": 0.0, "only-here": 1.0}
    out = bench.agreement(calibrated, raw)
    assert out["configurations"] == 4
    assert out["same_pick"]  # b leads the calibrated ranking and ties for the raw lead
    assert out["top_k_overlap"]["1"] == {"auto": 1, "none": 2, "both": 1}
    assert out["scoring_above_zero"] == {"auto": 3, "none": 3}
    assert out["median_auto_over_none"] == pytest.approx(0.8)
    assert out["spearman"] == pytest.approx(0.9487, abs=1e-4)


def test_the_bench_config_is_a_valid_closed_loop_goodput_sweep():
    from spica_pipeline.config import load_config

    config = load_config(str(ROOT / "bench" / "configs" / "closed_loop_goodput.yaml"))
    assert config.workload.concurrency and config.goal.target == "goodput_per_gpu"
