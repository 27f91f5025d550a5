"""Schema behaviour of SmartSearchConfig (spec §11 items 1-9, plus our stricter rules)."""

import copy
import math

import pytest
from pydantic import ValidationError

from spica_pipeline.config import (
    OptimizationGoal,
    SmartSearchConfig,
    SweepConfig,
    Target,
    Workload,
    planner_target,
    target_direction,
)

SYNTH = {"isl": 4000, "osl": 1000, "request_rate": 25, "num_request_ratio": 1000}


def cfg(search_space=None, workload=None, goal=None, sweep=None) -> dict:
    d = {
        "search_space": {"model_name": "Qwen/Qwen3-32B", "hardware_sku": "h200_sxm", **(search_space or {})},
        "workload": copy.deepcopy(SYNTH if workload is None else workload),
    }
    if goal is not None:
        d["goal"] = goal
    if sweep is not None:
        d["sweep"] = sweep
    return d


def build(**kw) -> SmartSearchConfig:
    return SmartSearchConfig.from_dict(cfg(**kw))


def rejects(match: str, **kw) -> ValidationError:
    with pytest.raises(ValidationError, match=match) as info:
        build(**kw)
    return info.value


# ---- 1. defaults and unknown keys -----------------------------------------------------------


def test_defaults():
    c = build()
    s = c.search_space
    assert s.gpu_budget == 32
    assert s.prefill_block_size == 64
    assert s.prefill_max_num_seqs == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert len(s.load_predictor_candidates) == 11
    assert c.goal.target is Target.THROUGHPUT
    assert c.sweep.parallel_evals == 16
    assert s.deployment_mode == ["disagg", "agg"] and s.backend == ["vllm"]
    assert s.decode_enable_prefix_caching is False and s.agg_enable_prefix_caching is True
    assert len(s.planner_scaling_policy) == 7 and s.planner_fpm_sampling == ["small", "default", "large", "fine"]
    assert c.sweep.max_rounds == 20 and c.sweep.candidates_per_round is None
    assert c.sweep.max_eval_seconds == 600.0 and c.sweep.seed == 0 and c.sweep.policy == "rapid"
    assert c.sweep.algorithm == "DEFAULT" and c.sweep.router_repeats == 3
    assert c.sweep.cost_aware == "predicted" and c.sweep.optimizer_share == 0.25  # deterministic by default


@pytest.mark.parametrize("algorithm,share", [("DEFAULT", 0.25), ("RANDOM_SEARCH", None), ("QUASI_RANDOM_SEARCH", None)])
def test_a_model_free_study_is_never_filled_from_another_designer(algorithm, share, monkeypatch):
    """The cost-aware fill replaces model-based asks only: a random study stays random."""
    from spica_pipeline.optimize.branch_plan import study_settings

    monkeypatch.delenv("SPICA_VIZIER_ALGO", raising=False)
    assert study_settings(build(sweep={"algorithm": algorithm})).optimizer_share == share


@pytest.mark.parametrize("section", ["search_space", "workload", "goal", "sweep", None])
def test_unknown_key_anywhere_fails(section):
    d = cfg(goal={"target": "throughput"}, sweep={})
    if section is None:
        d["bogus"] = 1
    else:
        d[section]["bogus"] = 1
    with pytest.raises(ValidationError, match="bogus|Extra inputs"):
        SmartSearchConfig.from_dict(d)


def test_unknown_key_in_sla_fails():
    rejects("Extra inputs", goal={"target": "throughput", "sla": {"ttft_ms": 1, "ttfb_ms": 2}})


def test_tpot_ms_in_the_sla_is_itl_ms():
    c = build(goal={"target": "throughput", "sla": {"ttft_ms": 1, "tpot_ms": 2}})
    assert c.goal.sla.itl_ms == 2 and "tpot_ms" not in c.goal.sla.model_dump()


def test_model_dump_round_trips():
    c = build(goal={"target": "pareto", "pareto_objectives": ["throughput", "e2e_latency"]},
              workload={"isl": 10, "osl": 10, "num_request_ratio": 2})
    again = SmartSearchConfig.from_dict(c.model_dump(mode="json"))
    assert again == c
    assert SmartSearchConfig.from_dict(c.model_dump()) == c


# ---- 2. goal and SLA -------------------------------------------------------------------------


def test_goodput_needs_satisfying_sla():
    rejects("require", goal={"target": "goodput"})
    rejects("require", goal={"target": "goodput", "sla": {"ttft_ms": 500}})
    rejects("require", goal={"target": "goodput_per_gpu", "sla": {"itl_ms": 20}})
    rejects(r"\['goodput_per_gpu'\] require an SLA", goal={"target": "pareto", "sla": {"ttft_ms": 100},
                                                         "pareto_objectives": ["goodput_per_gpu", "throughput"]})
    assert build(goal={"target": "pareto", "sla": {"ttft_ms": 100}}).goal.sla.ttft_ms == 100  # no goodput: any SLA
    assert build(goal={"target": "goodput", "sla": {"ttft_ms": 500, "itl_ms": 20}}).goal.sla.itl_ms == 20
    assert build(goal={"target": "goodput", "sla": {"e2e_ms": 9000}}).goal.sla.satisfying
    assert build(goal={"target": "throughput_per_gpu"}).goal.sla is None
    # any SLA shape is accepted (and still passed on) when no goodput objective needs it
    assert build(goal={"target": "throughput", "sla": {"ttft_ms": 500}}).goal.sla.ttft_ms == 500


@pytest.mark.parametrize("sla", [{"ttft_ms": 0, "itl_ms": 5}, {"ttft_ms": 5, "itl_ms": -1}, {"e2e_ms": -5},
                                 {"e2e_ms": float("nan")}, {"e2e_ms": float("inf")}, {"e2e_ms": True}])
def test_sla_values_must_be_positive_finite_numbers(sla):
    rejects("greater than 0|finite|valid number", goal={"target": "throughput", "sla": sla})


def test_directions():
    for t in Target:
        if t is Target.PARETO:
            with pytest.raises(ValueError, match="no scalar direction"):
                target_direction(t)
        else:
            assert target_direction(t) == ("min" if t in (Target.E2E_LATENCY, Target.COST_PER_MTOK) else "max")
    assert target_direction("throughput") == "max"
    with pytest.raises(ValueError, match="unknown optimization target"):
        target_direction("speed")


def test_target_prints_as_its_value():
    assert str(Target.PARETO) == "pareto" and f"{Target.GOODPUT_PER_GPU}" == "goodput_per_gpu"
    assert Target("throughput") is Target.THROUGHPUT and Target.THROUGHPUT == "throughput"


def test_planner_mapping():
    assert planner_target(Target.GOODPUT) == "sla" and planner_target("goodput_per_gpu") == "sla"
    assert planner_target("e2e_latency") == "latency"
    for t in ("throughput", "throughput_per_gpu", "throughput_per_user", "pareto"):
        assert planner_target(t) == "throughput"
    assert planner_target("min_gpus") == "sla"
    with pytest.raises(ValueError, match="unknown optimization target"):
        planner_target("speed")
    goal = OptimizationGoal(target="goodput", sla={"ttft_ms": 500, "itl_ms": 30})
    assert goal.planner_target == "sla" and goal.goodput_objectives() == ["goodput"]


def test_unknown_target_rejected():
    rejects("target", goal={"target": "speed"})


# ---- 3. pareto goal --------------------------------------------------------------------------


def test_pareto_default_objectives():
    g = OptimizationGoal(target="pareto")
    assert g.objectives() == [Target.THROUGHPUT_PER_GPU, Target.THROUGHPUT_PER_USER]
    assert OptimizationGoal(target="e2e_latency").objectives() == [Target.E2E_LATENCY]


@pytest.mark.parametrize("objs,match", [
    ([], "at least 2 objectives"),
    (["throughput"], "at least 2 objectives"),
    (["throughput", "throughput"], "distinct"),
    (["throughput", "pareto"], "pareto"),
])
def test_pareto_objective_rules(objs, match):
    with pytest.raises(ValidationError, match=match):
        OptimizationGoal(target="pareto", pareto_objectives=objs)


def test_pareto_objectives_need_pareto_target():
    with pytest.raises(ValidationError, match="only valid when target is 'pareto'"):
        OptimizationGoal(target="throughput", pareto_objectives=["throughput", "e2e_latency"])


def test_pareto_goodput_objective_needs_sla():
    with pytest.raises(ValidationError, match=r"\['goodput_per_gpu'\] require an SLA"):
        OptimizationGoal(target="pareto", pareto_objectives=["goodput_per_gpu", "throughput_per_user"])
    g = OptimizationGoal(target="pareto", pareto_objectives=["goodput_per_gpu", "throughput_per_user"],
                         sla={"e2e_ms": 5000})
    assert g.objectives()[0] is Target.GOODPUT_PER_GPU


# ---- 4. pareto load defaults and kv_load_ratio -----------------------------------------------

NO_LOAD = {"isl": 100, "osl": 100, "num_request_ratio": 4}


def test_pareto_default_load_is_full_range():
    c = build(workload=NO_LOAD, goal={"target": "pareto"})
    assert c.workload.kv_load_ratio == [0.0, 1.0]
    assert c.workload.kv_load_range() == (0.0, 1.0) and c.workload.kv_load_scalar() is None


def test_pareto_default_load_not_applied_to_traces_or_explicit_loads():
    c = build(workload={"trace_path": "t.jsonl"}, goal={"target": "pareto"})
    assert c.workload.kv_load_ratio is None
    c = build(workload={**NO_LOAD, "concurrency": 8}, goal={"target": "pareto"})
    assert c.workload.kv_load_ratio is None and c.workload.concurrency == 8


def test_no_load_without_pareto_is_an_error():
    rejects("exactly one of", workload=NO_LOAD)


def test_ranged_load_needs_pareto():
    rejects("ranged workload.kv_load_ratio", workload={**NO_LOAD, "kv_load_ratio": [0, 1]},
            goal={"target": "throughput_per_gpu"})


def test_scalar_load_fine_for_any_goal():
    c = build(workload={**NO_LOAD, "kv_load_ratio": 0.75}, goal={"target": "throughput_per_gpu"})
    assert c.workload.kv_load_range() is None and c.workload.kv_load_scalar() == 0.75
    assert c.workload.is_kv_load and c.workload.shape == "kv_load"
    c = build(workload={**NO_LOAD, "kv_load_ratio": 1.5}, goal={"target": "pareto"})  # oversubscription
    assert c.workload.kv_load_scalar() == 1.5


@pytest.mark.parametrize("bad", [[], [0.0], [0, 0.5, 1], [-0.1, 1], [1.0, 1.0], [0.8, 0.2], float("inf"),
                                 float("nan"), -0.5, True, "half", [0, float("inf")], [0, True]])
def test_bad_kv_load_ratio(bad):
    rejects("kv_load_ratio", workload={**NO_LOAD, "kv_load_ratio": bad}, goal={"target": "pareto"})


def test_thorough_policy_rejects_continuous_range():
    rejects("thorough", workload={**NO_LOAD, "kv_load_ratio": [0, 1]}, goal={"target": "pareto"},
            sweep={"policy": "thorough"})
    c = build(workload={**NO_LOAD, "kv_load_ratio": 0.5}, goal={"target": "pareto"}, sweep={"policy": "thorough"})
    assert c.sweep.policy == "thorough"


# ---- 5. concurrency, request counts, workload shapes -----------------------------------------

CONC = {"isl": 100, "osl": 100, "num_request_ratio": 10}


@pytest.mark.parametrize("conc", [[8, 16, 32], 1.9, 0, -3, True, "8", 8.0])
@pytest.mark.parametrize("goal", ["throughput", "pareto"])
def test_bad_concurrency(conc, goal):
    rejects("concurrency", workload={**CONC, "concurrency": conc}, goal={"target": goal})


def test_request_counts():
    w = Workload(**CONC, concurrency=256)
    assert w.synthetic_request_count() == 2560
    assert w.synthetic_request_count(8) == 80
    assert w.in_flight_cap() == 256 and w.in_flight_cap(8) == 8
    assert w.arrival_interval_ms() is None
    r = Workload(isl=1, osl=1, request_rate=25, num_request_ratio=4)
    assert r.synthetic_request_count() == 100
    assert r.arrival_interval_ms() == 40.0 and r.in_flight_cap() is None
    assert Workload(isl=1, osl=1, request_rate=1, num_request_ratio=0.1).synthetic_request_count() == 1


def test_kv_load_request_count_needs_override():
    w = Workload(isl=1, osl=1, num_request_ratio=25, kv_load_ratio=0.5)
    with pytest.raises(ValueError, match="override"):
        w.synthetic_request_count()
    assert w.synthetic_request_count(8) == 200 and w.in_flight_cap(8) == 8 and w.in_flight_cap() is None


def test_trace_derived_quantities():
    w = Workload(trace_path="x.jsonl", replay_concurrency=32)
    assert w.is_trace and w.in_flight_cap() == 32 and w.in_flight_cap(8) == 32  # override ignored
    assert w.arrival_interval_ms() is None and w.shape == "capped_trace"
    assert Workload(trace_path="x.jsonl").in_flight_cap() is None
    with pytest.raises(ValueError):
        w.synthetic_request_count()


def test_missing_num_request_ratio_named():
    rejects("num_request_ratio", workload={"isl": 1, "osl": 1, "request_rate": 2})


@pytest.mark.parametrize("workload,match", [
    ({"trace_path": "t.jsonl", "isl": 5}, r"must not set synthetic fields \['isl'\]"),
    ({"trace_path": "t.jsonl", "request_rate": 5, "concurrency": 2}, "request_rate', 'concurrency"),
    ({"trace_path": "t.jsonl", "replay_concurrency": 0}, "replay_concurrency"),
    ({**SYNTH, "replay_concurrency": 4}, "use 'concurrency'"),
    ({**SYNTH, "concurrency": 4}, "exactly one of"),
    ({"isl": 0, "osl": 1, "request_rate": 1, "num_request_ratio": 1}, "isl"),
    ({"isl": 1, "osl": 1, "request_rate": 0, "num_request_ratio": 1}, "request_rate"),
    ({"isl": 1, "osl": 1, "request_rate": float("inf"), "num_request_ratio": 1}, "request_rate"),
    ({"isl": 1, "osl": 1, "request_rate": 1, "num_request_ratio": -2}, "num_request_ratio"),
    ({**SYNTH, "trace_format": "csv"}, "trace_format"),
    ({**SYNTH, "shared_prefix_ratio": 1.5}, "shared_prefix_ratio"),
    ({"trace_path": "t.jsonl", "arrival_speedup_ratio": 0}, "arrival_speedup_ratio"),
])
def test_workload_rules(workload, match):
    rejects(match, workload=workload)


# ---- 6. choice validation --------------------------------------------------------------------


@pytest.mark.parametrize("knob,value,match", [
    ("router_mode", ["bogus"], "invalid choice 'bogus'"),
    ("prefill_max_num_seqs", [1, 999], "invalid choice 999"),
    ("planner_scaling_policy", ["disabled", "made_up"], "invalid choice 'made_up'"),
    ("router_mode", [], "at least one choice"),
    ("backend", ["vllm", "vllm"], "more than once"),
    ("deployment_mode", ["agg", "hybrid"], "invalid choice"),
    ("overlap_score_credit", [0.25], "invalid choice"),
    ("decode_max_num_batched_tokens", [16384], "invalid choice"),
    ("agg_max_num_seqs", [256.0], "valid integer"),
    ("agg_max_num_seqs", [True], "valid integer"),
    ("backend", "vllm", "valid list"),
    ("planner_fpm_sampling", [], "at least one choice"),
    ("planner_fpm_sampling", ["small", "small"], "more than once"),
    ("planner_load_sensitivity", [5], "preset id or a dict"),
])
def test_choice_validation(knob, value, match):
    rejects(match, search_space={knob: value})


def test_choice_subsets_accepted():
    c = build(search_space={"router_mode": ["kv_router"], "backend": ["vllm", "sglang"],
                            "prefill_load_scale": [0, 32]})
    assert c.search_space.router_mode == ["kv_router"] and c.search_space.backend == ["vllm", "sglang"]
    assert c.search_space.prefill_load_scale == [0.0, 32.0]


# ---- 7. composite dicts ----------------------------------------------------------------------

POLICY_240 = {"enable_throughput_scaling": True, "enable_load_scaling": False,
              "throughput_adjustment_interval_seconds": 240, "load_adjustment_interval_seconds": 5}


def test_composite_dicts_accepted():
    c = build(search_space={
        "planner_scaling_policy": ["disabled", POLICY_240],
        "planner_fpm_sampling": [{"max_num_fpm_samples": 96, "fpm_sample_bucket_size": 16}],
        "load_predictor_candidates": ["constant_last", {"load_predictor": "prophet", "prophet_window_size": 30}],
        "planner_load_sensitivity": [{"load_scaling_down_sensitivity": 75, "load_min_observations": 4}],
    })
    assert c.search_space.planner_scaling_policy[1] == POLICY_240
    assert c.search_space.load_predictor_candidates[1]["prophet_window_size"] == 30


@pytest.mark.parametrize("knob,value,match", [
    ("planner_fpm_sampling", [{"max_num_fpm_samples": 96, "fpm_sample_bucket_size": 16, "bogus": 1}],
     "unknown keys"),
    ("load_predictor_candidates", [{"prophet_window_size": 30}], "missing required keys"),
    ("planner_scaling_policy", [{"enable_throughput_scaling": True, "enable_load_scaling": False}],
     "missing required keys"),
    ("router_mode", [{"mode": "kv_router"}], "does not accept a dict entry"),
    ("planner_scaling_policy", [{}], "must not be empty"),
    ("planner_scaling_policy", [{**POLICY_240, "enable_load_scaling": 1}], "true or false"),
    ("planner_scaling_policy", [{**POLICY_240, "throughput_adjustment_interval_seconds": None}], "required when"),
    ("planner_scaling_policy", [{**POLICY_240, "throughput_adjustment_interval_seconds": -5}], "positive"),
    ("planner_fpm_sampling", [{"max_num_fpm_samples": 96.5, "fpm_sample_bucket_size": 16}], "positive integer"),
    ("planner_load_sensitivity", [{"load_scaling_down_sensitivity": 120, "load_min_observations": 4}], "0, 100"),
    ("load_predictor_candidates", [{"load_predictor": "bogus"}], "load_predictor must be one of"),
    ("load_predictor_candidates", [{"load_predictor": "kalman", "kalman_r": float("nan")}], "positive number"),
])
def test_composite_dict_errors(knob, value, match):
    rejects(match, search_space={knob: value})


# ---- 8. parallel_configs structure -----------------------------------------------------------

TEP8 = {"tp": 8, "moe_ep": 8}
DEP8 = {"tp": 1, "attention_dp": 8, "moe_ep": 8}


@pytest.mark.parametrize("space,match", [
    ({"parallel_configs": [{"tp": 4}]}, "exactly one mode"),
    ({"deployment_mode": ["agg"], "parallel_configs": [{"moe_ep": 4}]}, r"parallel_configs\[0\]\.tp: field required"),
    ({"deployment_mode": ["disagg"], "parallel_configs": [{"tp": 4}]}, "prefill"),
    ({"deployment_mode": ["disagg"], "parallel_configs": [{"prefill": 4, "decode": TEP8}]}, r"prefill.*dict"),
    ({"deployment_mode": ["disagg"], "parallel_configs": [{"prefill": TEP8, "decode": {"moe_ep": 8}}]},
     r"parallel_configs\[0\]\.decode\.tp: field required"),
    ({"deployment_mode": ["agg"], "parallel_configs": [{"tp": 0}]}, "tp: input should be greater than or equal to 1"),
    ({"deployment_mode": ["agg"], "parallel_configs": [{"tp": 2.5}]}, "tp: input should be a valid integer"),
    ({"deployment_mode": ["agg"], "parallel_configs": [{"tp": 2, "dpp": 2}]}, r"parallel_configs\[0\]\.dpp: unknown key"),
    ({"deployment_mode": ["agg"], "parallel_configs": [{"tp": 2, "dp": 2}]},
     r"parallel_configs\[0\] is written in SGLang's words \(dp\) but backend lists \['vllm'\]"),
    ({"deployment_mode": ["agg"], "parallel_configs": ["tp4"]}, "must be a dict"),
    ({"deployment_mode": ["disagg"], "parallel_configs": [{"prefill": TEP8, "decode": DEP8, "x": 1}]},
     r"parallel_configs\[0\]\.x: unknown key"),
])
def test_parallel_configs_structure(space, match):
    rejects(match, search_space=space)


def test_parallel_configs_well_formed():
    c = build(search_space={"deployment_mode": ["agg"], "parallel_configs": [{"tp": 4, "moe_ep": 4, "replicas": 2}]})
    assert c.search_space.parallel_configs[0]["replicas"] == 2
    c = build(search_space={"deployment_mode": ["disagg"],
                            "parallel_configs": [{"prefill": TEP8, "decode": {**DEP8, "replicas": 2}}]})
    assert c.search_space.parallel_configs[0]["decode"]["attention_dp"] == 8


# ---- 9. router admission, KVBM, budgets ------------------------------------------------------


@pytest.mark.parametrize("field,value", [("active_decode_blocks_threshold", 100),
                                         ("active_prefill_tokens_threshold", 4096),
                                         ("active_prefill_tokens_threshold_frac", 0.5),
                                         ("no_admission_control", True)])
def test_admission_control_with_kv_router(field, value):
    rejects("not supported by the Dynamo replay API", search_space={field: value})
    rejects("not supported by the Dynamo replay API", search_space={field: value, "router_mode": ["kv_router"]})
    c = build(search_space={field: value, "router_mode": ["round_robin"]})
    assert getattr(c.search_space, field) == value


def test_kvbm_rules():
    rejects("kv_bytes_per_token is required", search_space={"num_g2_blocks": 128})
    assert build(search_space={"num_g2_blocks": 128, "kv_bytes_per_token": 4096}).search_space.offload_enabled
    rejects("kv_bytes_per_token", search_space={"kv_bytes_per_token": 0})
    rejects("kv_bytes_per_token", search_space={"kv_bytes_per_token": -1})
    rejects("num_g2_blocks", search_space={"num_g2_blocks": -1})
    rejects("bandwidth_g1_to_g2_gbps", search_space={"bandwidth_g1_to_g2_gbps": float("nan")})


def test_budget_rules():
    rejects("min_gpu_budget", search_space={"gpu_budget": 16, "min_gpu_budget": 32})
    rejects("min_gpu_budget", search_space={"min_gpu_budget": 0})
    assert build(search_space={"gpu_budget": 32, "min_gpu_budget": 8}).search_space.min_gpu_budget == 8
    assert build(search_space={"gpu_budget": 8, "min_gpu_budget": 8}).search_space.min_gpu_budget == 8
    for bad in (0, -8, 8.5, True, "8"):
        rejects("gpu_budget", search_space={"gpu_budget": bad})


@pytest.mark.parametrize("space", [{"model_name": ""}, {"startup_time": -1}, {"aic_nextn": -1},
                                   {"agg_gpu_memory_utilization": 1.5}, {"agg_block_size": 0},
                                   {"decode_enable_prefix_caching": "no"}, {"context_length": 0}])
def test_pinned_scalar_rules(space):
    with pytest.raises(ValidationError):
        build(search_space=space)


def test_required_fields():
    with pytest.raises(ValidationError, match="model_name"):
        SmartSearchConfig.from_dict({"search_space": {"hardware_sku": "h200_sxm"}, "workload": SYNTH})
    with pytest.raises(ValidationError, match="workload"):
        SmartSearchConfig.from_dict({"search_space": {"model_name": "m", "hardware_sku": "h"}})


# ---- sweep -----------------------------------------------------------------------------------


def test_sweep_rules_and_per_round():
    assert SweepConfig().per_round == 16
    assert SweepConfig(parallel_evals=2, candidates_per_round=5).per_round == 5
    assert SweepConfig(max_eval_seconds=None).max_eval_seconds is None
    for bad in ({"max_rounds": 0}, {"parallel_evals": 0}, {"candidates_per_round": 0},
                {"max_eval_seconds": 0}, {"max_eval_seconds": math.inf}, {"router_repeats": 0},
                {"seed": -1}, {"policy": "fast"}, {"algorithm": "CMA_ES"}, {"max_rounds": True},
                {"cost_aware": "wallclock"}, {"optimizer_share": 0}, {"optimizer_share": 1.5}):
        with pytest.raises(ValidationError):
            SweepConfig(**bad)
    assert SweepConfig(algorithm="NSGA2", policy="thorough", seed=7).seed == 7


def test_length_jitter_is_a_synthetic_fraction():
    w = Workload(isl=1000, osl=100, concurrency=4, num_request_ratio=8, isl_jitter=0.25)
    assert w.has_jitter and w.osl_jitter == 0.0
    with pytest.raises(ValidationError, match="fraction in"):
        Workload(isl=1000, osl=100, concurrency=4, num_request_ratio=8, osl_jitter=1.0)
    with pytest.raises(ValidationError, match="turns_per_session: 1"):
        Workload(isl=1000, osl=100, concurrency=4, num_request_ratio=8, isl_jitter=0.1, turns_per_session=2)
    with pytest.raises(ValidationError, match="isl_jitter"):
        Workload(trace_path="t.jsonl", isl_jitter=0.1)


def test_a_validated_config_is_frozen():
    """Its hash keys the journal and the Dagster runs: nothing may change it after validation."""
    config = build()
    for model, field, value in ((config.sweep, "seed", 1), (config.search_space, "gpu_budget", 4),
                                (config.goal, "sla_gate", "strict"), (config, "sweep", config.sweep)):
        with pytest.raises(ValidationError, match="frozen"):
            setattr(model, field, value)
