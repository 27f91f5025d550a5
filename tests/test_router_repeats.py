"""KV-router repeats are skipped where routing has no choice (issue 15 item 6)."""

from spica_pipeline.evaluate.evaluator import EvalOutcome
from spica_pipeline.space.candidate import build_candidate, router_repeats_for
from spica_pipeline.space.shapes import DisaggShape, RoleShape
from tests.test_candidate import agg_sel, disagg_sel, space

ONE = RoleShape(tp=8, moe_ep=8)
TWO = RoleShape(tp=4, moe_ep=4, replicas=2)
DP = RoleShape(attention_dp=8, moe_ep=8)


def kv(sel_fn, **kw):
    return sel_fn(router_mode="kv_router", overlap_score_credit=1.0, prefill_load_scale=1.0,
                  router_temperature=0.0, **kw)


def repeats(sel, shape) -> int:
    return router_repeats_for(build_candidate(space(), sel, shape), 3)


def test_single_worker_per_role_replays_once():
    assert repeats(kv(agg_sel), ONE) == 1
    assert repeats(kv(disagg_sel), DisaggShape(ONE, ONE)) == 1


def test_a_role_with_a_choice_keeps_the_repeats():
    assert repeats(kv(agg_sel), TWO) == 3
    assert repeats(kv(agg_sel), DP) == 3  # attention-DP ranks are routed to
    assert repeats(kv(disagg_sel), DisaggShape(ONE, TWO)) == 3
    assert repeats(kv(disagg_sel), DisaggShape(TWO, ONE)) == 3


def test_planner_scaling_can_add_workers_so_repeats_stay():
    sel = kv(agg_sel, planner_scaling_policy="load_180_10", planner_fpm_sampling="default",
             planner_load_sensitivity="default")
    assert router_repeats_for(build_candidate(space(), sel, ONE), 3) == 3


def test_round_robin_is_always_one_replay():
    assert repeats(agg_sel(), TWO) == 1


class CountingEvaluator:
    """Records the repeats each request asks for (what the replay evaluator would run)."""

    def __init__(self):
        self.repeats = []

    def evaluate(self, request):
        self.repeats.append(request.context["router_repeats"])
        return EvalOutcome("feasible", report={"x": 1.0})


def test_candidate_builder_sets_one_repeat_for_single_worker_roles():
    from spica_pipeline.config import SmartSearchConfig
    from spica_pipeline.optimize.branch_plan import candidate_builder

    config = SmartSearchConfig.from_dict({
        "search_space": {"model_name": "m", "hardware_sku": "h200_sxm", "router_mode": ["kv_router"]},
        "workload": {"isl": 1000, "osl": 100, "request_rate": 1.0, "num_request_ratio": 10},
        "sweep": {"router_repeats": 3},
    })
    build = candidate_builder(config, None, {})
    ev = CountingEvaluator()
    ev.evaluate(build(kv(agg_sel), ONE))
    ev.evaluate(build(kv(agg_sel), TWO))
    assert ev.repeats == [1, 3]
