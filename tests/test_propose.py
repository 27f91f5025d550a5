"""Dedup-aware projection: a suggestion that lands on an evaluated point moves to its nearest
unevaluated neighbour, and only falls back to the duplicate when nothing else is left."""

from spica_pipeline.optimize.branch_plan import finite_points, propose
from spica_pipeline.optimize.encoding import build_encoding, enumerate_space
from spica_pipeline.optimize.trial import point_key
from spica_pipeline.space.shapes import RoleShape


class Branch:
    deployment_mode = "agg"
    parallel_configs = (RoleShape(tp=1, replicas=1), RoleShape(tp=1, replicas=2), RoleShape(tp=2, replicas=1),
                        RoleShape(tp=4, replicas=1))
    supported_backends = (("vllm",),) * 4
    knob_choices = {"backend": ["vllm"], "agg_max_num_seqs": [256, 512]}
    gpu_budget = 4
    float_ranges = {}


def test_collapsed_suggestion_moves_to_nearest_unevaluated_point():
    enc = build_encoding(Branch())
    params = enc.encode({"deployment_mode": "agg", "backend": "vllm", "agg_max_num_seqs": 256},
                        RoleShape(tp=1, replicas=1))
    first = propose(enc, params)
    assert first.parallel_config == RoleShape(tp=1, replicas=1)
    taken = {point_key(first.selection, first.parallel_config)}
    second = propose(enc, params, taken)
    assert second.parallel_config != first.parallel_config
    assert second.projection["moved_to_unevaluated"] is True
    everything = {point_key(first.selection, c) for c in Branch.parallel_configs}
    last = propose(enc, params, everything)  # nothing left: the duplicate it is
    assert last.parallel_config == first.parallel_config


def test_strict_sla_gate_marks_a_slow_candidate_infeasible():
    from spica_pipeline.config import SmartSearchConfig
    from spica_pipeline.evaluate.evaluator import EvalOutcome
    from spica_pipeline.optimize.branch_plan import scorer

    def config(gate):
        return SmartSearchConfig.from_dict({
            "search_space": {"model_name": "Qwen/Qwen3-32B", "hardware_sku": "h200_sxm"},
            "workload": {"isl": 100, "osl": 10, "request_rate": 1, "num_request_ratio": 10},
            "goal": {"target": "throughput", "sla": {"ttft_ms": 500, "itl_ms": 50}, "sla_gate": gate}})
    report = {"output_throughput_tok_s": 900.0, "p90_ttft_ms": 800.0, "p90_itl_ms": 20.0}
    strict = scorer(config("strict").goal)(EvalOutcome("feasible", report=report))
    assert strict.told_metrics is None and "p90_ttft_ms" in strict.reason
    relaxed = scorer(config("off").goal)(EvalOutcome("feasible", report=report))
    assert relaxed.told_metrics == {"objective": 900.0}


def test_finite_points_counts_what_enumerate_space_yields():
    class TwoBackends(Branch):
        supported_backends = (("vllm", "sglang"), ("vllm",), ("sglang",), ("vllm", "sglang"))
        knob_choices = {"backend": ["vllm", "sglang"], "agg_max_num_seqs": [256, 512, 1024]}

    for branch in (Branch(), TwoBackends()):
        enc = build_encoding(branch)
        assert finite_points(enc) == sum(1 for _ in enumerate_space(enc))


def test_a_searched_kv_load_ratio_reaches_the_candidate_and_the_spec_hash():
    from spica_pipeline.config import SmartSearchConfig
    from spica_pipeline.optimize.branch_plan import candidate_builder

    config = SmartSearchConfig.from_dict({
        "search_space": {"model_name": "Qwen/Qwen3-32B", "hardware_sku": "h200_sxm", "gpu_budget": 4,
                         "deployment_mode": ["agg"], "router_mode": ["round_robin"],
                         "planner_scaling_policy": ["disabled"]},
        "workload": {"isl": 100, "osl": 10, "num_request_ratio": 4},  # pareto default: kv_load_ratio [0, 1]
        "goal": {"target": "pareto"}})
    build = candidate_builder(config, None, {})
    selection = {"deployment_mode": "agg", "backend": "vllm", "router_mode": "round_robin",
                 "planner_scaling_policy": "disabled", "agg_max_num_seqs": 256,
                 "agg_max_num_batched_tokens": 8192}
    low = build({**selection, "kv_load_ratio": 0.25}, RoleShape(tp=2))
    high = build({**selection, "kv_load_ratio": 0.75}, RoleShape(tp=2))
    assert low.candidate.kv_load_ratio == 0.25 and high.candidate.kv_load_ratio == 0.75
    assert low.to_dict()["sample"]["kv_load_ratio"] == 0.25
    assert low.spec_hash != high.spec_hash
    # the request carries the goal typed (the config's own), hashed as its JSON dump
    assert low.goal is config.goal and low.to_dict()["goal"] == config.goal.model_dump(mode="json")
    from spica_pipeline.evaluate.evaluator import EvalRequest

    as_dict = EvalRequest(low.candidate, low.workload, config.goal.model_dump(mode="json"), low.context)
    assert as_dict.goal == config.goal and as_dict.spec_hash == low.spec_hash
