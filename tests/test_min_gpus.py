"""goal.target min_gpus: the smallest fleet that carries goal.load within goal.sla."""

import pytest
from sweep_fakes import CapacityEvaluator

from spica_pipeline.config import SmartSearchConfig
from spica_pipeline.errors import ConfigError
from spica_pipeline.evaluate import scoring
from spica_pipeline.sweep import run_sweep

CONFIG = {
    "search_space": {
        "model_name": "Qwen/Qwen3-32B", "hardware_sku": "h200_sxm", "gpu_budget": 2,
        "deployment_mode": ["agg"], "backend": ["vllm"], "router_mode": ["round_robin"],
        "planner_scaling_policy": ["disabled"], "agg_max_num_seqs": [256], "agg_max_num_batched_tokens": [8192],
    },
    "workload": {"isl": 512, "osl": 64, "request_rate": 4, "num_request_ratio": 10},
    "goal": {"target": "min_gpus", "load": {"request_rate": 20}, "sla": {"ttft_ms": 500, "itl_ms": 50}},
    "sweep": {"max_rounds": 2, "candidates_per_round": 2, "parallel_evals": 1},
}


def test_size_fleet_rounds_up_and_refuses_zero_capacity():
    f = scoring.size_fleet("request_rate", 20.0, 7.0, 2)
    assert (f.replicas, f.gpus) == (3, 6)
    assert scoring.size_fleet("request_rate", 21.0, 7.0, 2).replicas == 3
    assert scoring.size_fleet("concurrency", 64, 16, 4).gpus == 16
    assert scoring.size_fleet("request_rate", 20.0, 0.0, 2) is None
    assert scoring.size_fleet("request_rate", 20.0, None, 2) is None
    assert scoring.replica_capacity("concurrency", {}, {"kv_load_concurrency": 12}) == 12


def test_min_gpus_sweep_picks_the_smallest_fleet_under_the_sla(tmp_path):
    config = SmartSearchConfig.from_dict(CONFIG)
    assert config.goal.sla_gate == "strict"
    result = run_sweep(config, tmp_path, evaluator=CapacityEvaluator())
    merge = result.merge
    # TP1x1: 3 req/s -> 7 x 1 = 7 GPUs; TP2x1: 7 req/s -> 3 x 2 = 6 GPUs; TP1x2 breaks the p90 TTFT SLA
    best = merge.candidates[0]
    assert best.config["tp"] == 2 and best.metrics["fleet_replicas"] == 3 and best.metrics["fleet_gpus"] == 6
    assert [c.metrics["fleet_gpus"] for c in merge.candidates] == [6, 7]
    assert merge.counts["infeasible"] == 1  # the SLA-breaking shape never reaches the ranking
    assert "min_gpus: 6 GPUs = 3 x 2 for request_rate 20" in merge.summary_line()
    assert "fleet" in (tmp_path / "report.md").read_text().lower()
    # deploy/1/dgd.yaml deploys the whole fleet: 3 worker replicas of the 2-GPU engine
    import yaml

    from spica_pipeline.report.dgd import manifest_gpus, validate_manifest

    doc = yaml.safe_load((tmp_path / "deploy" / "1" / "dgd.yaml").read_text())
    assert validate_manifest(doc) == [] and manifest_gpus(doc) == 6
    assert [c["replicas"] for c in doc["spec"]["components"] if c["type"] == "worker"] == [3]


def test_concurrency_target_through_the_merge():
    """A concurrency load sizes by the concurrency each candidate was replayed at."""
    import json

    import pandas as pd

    from spica_pipeline.report import merge_candidates

    def row(h, gpus, conc, rps):
        report = {"request_throughput_rps": rps, "duration_ms": 3.6e6, "gpu_hours": float(gpus)}
        return {"branch": "agg", "status": "feasible", "spec_hash": h, "used_gpus": gpus, "reason": None,
                "config": json.dumps({"concurrency": conc, "used_gpus": gpus}), "report": json.dumps(report)}

    ledger = pd.DataFrame([row("a", 4, 32, 10.0), row("b", 1, 6, 2.0), row("c", 2, 0, 5.0)])
    m = merge_candidates(ledger, "min_gpus", load_target={"concurrency": 64})
    # a: ceil(64/32)=2 x 4 = 8 GPUs; b: ceil(64/6)=11 x 1 = 11 GPUs; c carried nothing
    assert [(c.spec_hash, c.metrics["fleet_gpus"]) for c in m.candidates] == [("a", 8.0), ("b", 11.0)]
    assert m.unservable == 1
    none = merge_candidates(ledger[ledger["spec_hash"] == "c"], "min_gpus", load_target={"concurrency": 64})
    assert "NO candidate carried any of the load" in none.summary_line()


def test_concurrency_load_uses_the_replayed_concurrency():
    ledger_cfg = {"concurrency": 16}
    assert scoring.replica_capacity("concurrency", None, ledger_cfg) == 16


@pytest.mark.parametrize("goal, message", [
    ({"target": "min_gpus", "sla": {"ttft_ms": 500, "itl_ms": 50}}, "needs goal.load"),
    ({"target": "min_gpus", "load": {"request_rate": 5}}, "needs goal.sla"),
    ({"target": "min_gpus", "load": {"request_rate": 5, "concurrency": 3}, "sla": {"e2e_ms": 9}},
     "exactly one of request_rate or concurrency"),
    ({"target": "min_gpus", "load": {"request_rate": 5}, "sla": {"e2e_ms": 9}, "sla_gate": "off"},
     "sla_gate 'strict'"),
    ({"target": "throughput", "load": {"request_rate": 5}}, "only used by target min_gpus"),
])
def test_min_gpus_goal_rules(tmp_path, goal, message):
    import yaml

    from spica_pipeline.config import load_config

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**CONFIG, "goal": goal}))
    with pytest.raises(ConfigError, match=message):
        load_config(path)
