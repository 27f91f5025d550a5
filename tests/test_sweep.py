"""Whole-sweep orchestration with a fake evaluator: a stalled branch does not stop the next one."""

import pytest
from sweep_fakes import AggFailsEvaluator

from spica_pipeline.config import SmartSearchConfig
from spica_pipeline.resources.vizier import VizierClient
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
def test_a_stalled_branch_does_not_stop_the_next(tmp_path):
    events = []
    result = run_sweep(SmartSearchConfig.from_dict(CONFIG), tmp_path, evaluator=AggFailsEvaluator(),
                       vizier=VizierClient(), progress=events.append)
    agg, disagg = result.branches
    assert agg.branch == "agg" and agg.stalled and agg.mode == "vizier"
    assert len(agg.records) == 22  # 11 x per_round attempts, every one told infeasible
    assert all("injected" in r.reason for r in agg.records)
    # the 3-config agg pool is replayed once per config; every repeat is answered from the cache
    assert sorted(r.status for r in agg.records).count("failed") == 3
    assert {r.status for r in agg.records} == {"failed", "cached"}
    assert disagg.mode == "exhaustive" and [r.status for r in disagg.records] == ["feasible"]
    assert [c.branch for c in result.merge.candidates] == ["disagg"]
    assert {"event": "stalled", "branch": "agg", "rounds": 1} in events
