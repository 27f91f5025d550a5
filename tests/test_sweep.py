"""Whole-sweep orchestration with a fake evaluator: a stalled branch does not stop the next one."""

import pytest
from sweep_fakes import AggFailsEvaluator

from spica_pipeline.config import SmartSearchConfig
from spica_pipeline.optimize.vizier import VizierClient
from spica_pipeline.sweep import run_sweep

CONFIG = {
    "search_space": {
        "model_name": "Qwen/Qwen3-32B", "hardware_sku": "h200_sxm", "gpu_budget": 2,
        "deployment_mode": ["agg", "disagg"], "backend": ["vllm"], "router_mode": ["round_robin"],
        "planner_scaling_policy": ["disabled"], "agg_max_num_seqs": [256], "agg_max_num_batched_tokens": [8192],
        "prefill_max_num_seqs": [8], "prefill_max_num_batched_tokens": [8192], "decode_max_num_seqs": [256],
    },
    "workload": {"isl": 512, "osl": 64, "request_rate": 4, "num_request_ratio": 10},
    "goal": {"target": "throughput"},
    "sweep": {"max_rounds": 1, "candidates_per_round": 2, "parallel_evals": 1,
              "algorithm": "QUASI_RANDOM_SEARCH"},
}


@pytest.mark.integration
def test_a_stopped_branch_does_not_stop_the_next(tmp_path):
    """Every agg candidate fails: the circuit breaker stops agg with the reason; disagg still runs.
    The budget (1 round x 2) counts the failures, so agg costs 2 replays, not 11 x per_round."""
    data = {**CONFIG, "sweep": {**CONFIG["sweep"], "failure_breaker": 2}}
    events = []
    result = run_sweep(SmartSearchConfig.from_dict(data), tmp_path, evaluator=AggFailsEvaluator(),
                       vizier=VizierClient(), progress=events.append)
    agg, disagg = result.branches
    assert agg.branch == "agg" and agg.mode == "vizier" and not agg.stalled
    assert agg.stopped and "injected" in agg.stopped and agg.stopped.startswith("circuit breaker")
    assert all("injected" in r.reason for r in agg.records)
    assert [r.status for r in agg.records].count("failed") == 2 and agg.evaluated == 2
    assert disagg.mode == "exhaustive" and [r.status for r in disagg.records] == ["feasible"]
    assert [c.branch for c in result.merge.candidates] == ["disagg"]
    assert {"event": "stopped", "branch": "agg", "reason": agg.stopped} in events
    report = (tmp_path / "report.md").read_text()
    assert "evaluated 2 of 3 points" in report and "evaluated 1 of 1 points" in report


@pytest.mark.integration
def test_a_time_budget_stop_writes_a_valid_anytime_result(tmp_path):
    """sweep.time_budget with no max_rounds: rounds go on until the budget is spent; the ranking
    is on disk after every batch, and the final outputs are written as usual."""
    data = {**CONFIG, "sweep": {"time_budget": "3s", "candidates_per_round": 1, "parallel_evals": 1,
                                "algorithm": "QUASI_RANDOM_SEARCH"}}
    data["search_space"] = {**CONFIG["search_space"], "deployment_mode": ["disagg"],
                            "decode_max_num_seqs": [256, 512, 1024]}
    config = SmartSearchConfig.from_dict(data)
    assert config.sweep.max_rounds is None and config.sweep.time_budget == 3.0
    events = []
    result = run_sweep(config, tmp_path, evaluator=AggFailsEvaluator(), vizier=VizierClient(),
                       progress=events.append)
    (disagg,) = result.branches
    assert disagg.mode == "exhaustive"  # 3 points <= the default budget of 20 rounds
    assert (tmp_path / "candidates.csv").read_text().count("\n") >= 2
    assert (tmp_path / "ledger.parquet").exists() and (tmp_path / "report.md").exists()


@pytest.mark.parametrize("neighbourhood", [True, False])
def test_the_stock_baseline_study_runs_without_the_neighbourhood_designer(monkeypatch, neighbourhood):
    """bench_time_to_quality's Spica-style baseline (`neighbourhood=False`) is the Vizier study alone:
    no seed batch or look-alike goes to this product's neighbourhood designer (SPICA_BASELINE_RULE)."""
    import spica_pipeline.sweep as sweep
    from spica_pipeline.optimize.branch_plan import plan_branch

    data = {**CONFIG, "search_space": {**CONFIG["search_space"], "deployment_mode": ["agg"],
                                       "agg_max_num_seqs": [256, 512, 1024],
                                       "agg_max_num_batched_tokens": [8192, 16384, 32768]},
            "sweep": {**CONFIG["sweep"], "algorithm": "DEFAULT"}}
    config = SmartSearchConfig.from_dict(data)
    prepared = sweep.prepare(config)
    plan = plan_branch(prepared.branches[0], config)
    assert not plan.exhaustive
    seen = []
    monkeypatch.setattr(sweep, "run_branch_study", lambda mode, sampler, *a, **k: seen.append(sampler))
    sweep.run_branch(plan, config, prepared.load_predictor, evaluate_wave=lambda requests: [],
                     vizier=VizierClient(), neighbourhood=neighbourhood)
    (sampler,) = seen
    assert (sampler.local is not None) is neighbourhood and sampler.study is not None
