"""Spec §4 / §11 items 10-12 (and the scoring bits of 27): targets, score, rank, feasibility,
the SLA rules, Pareto fronts and hypervolume."""

import itertools
import math
import random

import pytest

from spica_pipeline.config.goal import GOODPUT_KEY, Target
from spica_pipeline.evaluate import scoring
from spica_pipeline.evaluate.scoring import Candidate

REPORT = {
    "output_throughput_tok_s": 5000.0,
    "mean_e2e_latency_ms": 1200.0,
    "goodput_output_throughput_tok_s": 4000.0,
    "mean_output_token_throughput_per_user": 50.0,
    "gpu_hours": 2.0,
    "duration_ms": 1.8e6,
    "planner_total_ticks": 17,
    "p90_ttft_ms": 800.0,
    "p90_itl_ms": 30.0,
    "p90_e2e_latency_ms": 2500.0,
}


# --- §11.10 scoring -------------------------------------------------------------------------

@pytest.mark.parametrize("target, value, signed", [
    ("throughput", 5000.0, 5000.0),
    ("e2e_latency", 1200.0, -1200.0),
    ("goodput", 4000.0, 4000.0),
    ("goodput_per_gpu", 1000.0, 1000.0),
    ("throughput_per_gpu", 1250.0, 1250.0),
    ("throughput_per_user", 50.0, 50.0),
])
def test_values_and_signed_scores(target, value, signed):
    assert scoring.objective_value(target, REPORT) == pytest.approx(value)
    assert scoring.score(target, REPORT) == pytest.approx(signed)


def test_avg_gpu_is_gpu_hours_over_run_hours():
    assert scoring.avg_gpu(REPORT) == pytest.approx(4.0)
    assert scoring.avg_gpu({}) == 0.0
    assert scoring.avg_gpu(None) == 0.0
    assert scoring.avg_gpu({"gpu_hours": -1.0, "duration_ms": 1000}) == 0.0


def test_empty_report_scores_zero_throughput_and_minus_infinity_latency():
    assert scoring.objective_value("throughput", {}) == 0.0
    assert scoring.score("throughput", {}) == 0.0
    assert scoring.objective_value("e2e_latency", {}) == math.inf
    assert scoring.score("e2e_latency", {}) == -math.inf
    assert scoring.score("e2e_latency", None) == -math.inf


@pytest.mark.parametrize("patch", [{"gpu_hours": 0.0}, {"duration_ms": None}])
def test_per_gpu_is_zero_without_gpu_hours_or_duration(patch):
    report = {k: v for k, v in {**REPORT, **patch}.items() if v is not None}
    assert scoring.objective_value("throughput_per_gpu", report) == 0.0
    assert scoring.objective_value("goodput_per_gpu", report) == 0.0
    assert scoring.objective_value("throughput", report) == 5000.0


def test_metrics_keep_planner_ticks_and_only_known_keys():
    m = scoring.metrics_from_report({**REPORT, "wall_time_ms": 3.0})
    assert m["planner_total_ticks"] == 17
    assert m["p90_ttft_ms"] == 800.0  # the report table shows p90 TTFT/ITL
    assert "wall_time_ms" not in m
    assert set(m) <= set(scoring.METRIC_KEYS)
    c = Candidate.from_report({"used_gpus": 8}, REPORT, "throughput")
    assert c.metrics["planner_total_ticks"] == 17 and c.used_gpus == 8 and c.objectives is None


def test_directions_and_target_errors():
    for t in scoring.TARGET_METRICS:
        assert scoring.direction(t) == ("min" if t in ("e2e_latency", "cost_per_mtok") else "max")
    assert set(scoring.TARGET_METRICS) == set(Target) - {Target.PARETO}  # every scalar target reads a metric
    with pytest.raises(ValueError, match="multi-objective and has no scalar direction"):
        scoring.direction("pareto")
    with pytest.raises(ValueError, match="multi-objective"):
        scoring.objective_value("pareto", REPORT)
    with pytest.raises(ValueError, match="multi-objective"):
        scoring.score("pareto", REPORT)
    with pytest.raises(ValueError, match="unknown optimization target"):
        scoring.score("tokens", REPORT)


def test_str_enum_targets_are_accepted():
    import enum

    class T(str, enum.Enum):
        throughput_per_gpu = "throughput_per_gpu"

    assert scoring.score(T.throughput_per_gpu, REPORT) == pytest.approx(1250.0)


# --- SLA rules ------------------------------------------------------------------------------

def test_goodput_fails_closed_without_per_request_accounting():
    no_goodput = {k: v for k, v in REPORT.items() if k != GOODPUT_KEY}
    with pytest.raises(RuntimeError, match="per-request SLA accounting"):
        scoring.require_goodput(["goodput"], no_goodput)
    with pytest.raises(RuntimeError, match="per-request SLA accounting"):
        scoring.require_goodput(["throughput_per_user", "goodput_per_gpu"], None)
    scoring.require_goodput(["goodput"], REPORT)
    scoring.require_goodput(["throughput", "e2e_latency"], no_goodput)


def test_sla_gate_strict_uses_p90():
    ok, reason = scoring.sla_gate(REPORT, {"ttft_ms": 1000, "itl_ms": 50, "e2e_ms": 3000}, "strict")
    assert ok and reason is None
    ok, reason = scoring.sla_gate(REPORT, {"ttft_ms": 500}, "strict")
    assert not ok and "p90_ttft_ms" in reason
    ok, reason = scoring.sla_gate(REPORT, {"e2e_ms": 2000}, "strict")
    assert not ok and "p90_e2e_latency_ms" in reason
    ok, reason = scoring.sla_gate({"p90_ttft_ms": 1.0}, {"ttft_ms": 5, "itl_ms": 5}, "strict")
    assert not ok and "lacks p90_itl_ms" in reason
    assert scoring.sla_gate(REPORT, {"ttft_ms": 1}, "off") == (True, None)
    assert scoring.sla_gate(REPORT, None, "strict") == (True, None)
    assert scoring.sla_gate(REPORT, {"ttft_ms": 700}, "strict", percentile=75)[0] is False
    with pytest.raises(ValueError, match="sla gate mode"):
        scoring.sla_gate(REPORT, {"ttft_ms": 1}, "lenient")


# --- §11.11 rank and feasibility ------------------------------------------------------------

def _c(score, gpus, **kw):
    return Candidate(config={"used_gpus": gpus}, used_gpus=gpus, score=score, metrics={}, **kw)


def test_rank_best_first_ties_to_fewer_gpus():
    a, b, c = _c(1000, 16), _c(1000, 8), _c(500, 8)
    assert scoring.rank([a, b, c]) == [b, a, c]
    assert scoring.rank([c, a, b]) == [b, a, c]


def test_is_feasible_is_the_gpu_budget():
    assert scoring.is_feasible(16, 32)
    assert scoring.is_feasible(32, 32)
    assert not scoring.is_feasible(64, 32)


# --- §11.12 Pareto --------------------------------------------------------------------------

DIRS = {"throughput_per_gpu": "max", "throughput_per_user": "max"}


def _p(per_gpu, per_user, gpus=8):
    return Candidate.pareto({"used_gpus": gpus}, {"throughput_per_gpu": per_gpu, "throughput_per_user": per_user})


def test_front_drops_dominated_and_sorts_by_last_objective():
    a, b, c = _p(100, 10), _p(50, 20), _p(40, 8)
    assert scoring.pareto_front([a, b, c], DIRS) == [a, b]
    assert scoring.pareto_front([c, b, a], DIRS) == [a, b]


def test_front_ignores_candidates_without_objectives_and_keeps_exact_ties():
    a, b = _p(100, 10), _p(100, 10)
    none = _c(1e9, 1)
    front = scoring.pareto_front([a, none, b], DIRS)
    assert front == [a, b] and front[0] is a and front[1] is b


def test_pareto_candidate_score_is_first_objective_and_needs_objectives():
    assert _p(100, 10).score == 100
    with pytest.raises(ValueError, match="needs objectives"):
        Candidate.pareto({"used_gpus": 8}, None)
    c = Candidate.from_report({"used_gpus": 8}, REPORT, "pareto")
    assert c.objectives == {"throughput_per_gpu": pytest.approx(1250.0), "throughput_per_user": 50.0}
    assert c.score == pytest.approx(1250.0)
    c = Candidate.from_report({"used_gpus": 8}, REPORT, "pareto", ["e2e_latency", "throughput"])
    assert c.objectives == {"e2e_latency": 1200.0, "throughput": 5000.0} and c.score == 1200.0


def test_front_respects_min_directions():
    dirs = {"e2e_latency": "min", "throughput": "max"}
    pts = [{"e2e_latency": 100, "throughput": 10}, {"e2e_latency": 200, "throughput": 30},
           {"e2e_latency": 150, "throughput": 5}, {"e2e_latency": 250, "throughput": 30}]
    front = scoring.pareto_front(pts, dirs)
    assert front == [pts[0], pts[1]]  # sorted ascending by throughput (the last objective)


def test_front_brute_force_agrees_on_random_points():
    rng = random.Random(7)
    dirs = ["max", "min", "max"]
    pts = [tuple(rng.randint(0, 6) for _ in range(3)) for _ in range(60)]
    front = scoring.pareto_front(pts, dirs)
    for p in pts:
        dominated = any(scoring.dominates(q, p, dirs) for q in pts)
        assert (p in front) != dominated
    assert [p[-1] for p in front] == sorted(p[-1] for p in front)


# --- hypervolume ----------------------------------------------------------------------------

def test_hypervolume_2d_max_max_by_hand():
    # Staircase (1,3), (2,2), (3,1) from the origin: 3 + 2 + 1 = 6.
    assert scoring.hypervolume([(1, 3), (2, 2), (3, 1)], ["max", "max"]) == pytest.approx(6.0)
    # Dominated points and duplicates add nothing.
    assert scoring.hypervolume([(1, 3), (2, 2), (3, 1), (1, 1), (2, 2)], ["max", "max"]) == pytest.approx(6.0)
    # Spec §11.12 front against (0, 0): 100*10 + 50*(20-10) = 1500.
    front = [_p(100, 10), _p(50, 20), _p(40, 8)]
    assert scoring.hypervolume(front, DIRS) == pytest.approx(1500.0)


def test_hypervolume_2d_with_min_direction_and_default_reference():
    # latency (min), throughput (max); reference latency = 1.1 * 200 = 220, throughput 0.
    pts = [{"lat": 100, "thr": 10}, {"lat": 200, "thr": 30}]
    dirs = {"lat": "min", "thr": "max"}
    # (220-100)*10 + (220-200)*(30-10) = 1200 + 400
    assert scoring.hypervolume(pts, dirs) == pytest.approx(1600.0)
    assert scoring.default_reference([(100, 10), (200, 30)], ["min", "max"]) == pytest.approx((220.0, 0.0))
    assert scoring.hypervolume(pts, dirs, reference=(300, 0)) == pytest.approx(200 * 10 + 100 * 20)
    # A point worse than the reference on some objective contributes nothing.
    assert scoring.hypervolume([{"lat": 400, "thr": 50}], dirs, reference=(300, 0)) == 0.0


def test_hypervolume_3d_by_hand():
    # Two boxes from the origin: [2,2,1] and [1,1,3]; overlap [1,1,1] -> 4 + 3 - 1 = 6.
    assert scoring.hypervolume([(2, 2, 1), (1, 1, 3)], ["max"] * 3) == pytest.approx(6.0)
    # Single unit cube corners (1,0,0)... are zero-volume; (1,1,1) alone is 1.
    assert scoring.hypervolume([(1, 1, 1)], ["max"] * 3) == pytest.approx(1.0)
    # Min on the first objective: reference x = 1.1*4 = 4.4; boxes [4.4-2, 3, 1] and [4.4-4, 5, 2].
    pts = [(2, 3, 1), (4, 5, 2)]
    # Box A: 2.4*3*1 = 7.2 ; box B: 0.4*5*2 = 4.0 ; overlap: 0.4*3*1 = 1.2 -> 10.0
    assert scoring.hypervolume(pts, ["min", "max", "max"]) == pytest.approx(10.0)


def _hv_inclusion_exclusion(points, ref):
    """Exact union volume by inclusion-exclusion (small n only)."""
    total = 0.0
    for k in range(1, len(points) + 1):
        for combo in itertools.combinations(points, k):
            vol = 1.0
            for dim in range(len(ref)):
                vol *= max(0.0, min(p[dim] for p in combo) - ref[dim])
            total += (-1) ** (k + 1) * vol
    return total


@pytest.mark.parametrize("dim", [3, 4])
def test_hypervolume_matches_inclusion_exclusion(dim):
    rng = random.Random(dim)
    for _ in range(5):
        pts = [tuple(rng.uniform(0, 10) for _ in range(dim)) for _ in range(7)]
        assert scoring.hypervolume(pts, ["max"] * dim) == pytest.approx(_hv_inclusion_exclusion(pts, (0.0,) * dim))


def test_hypervolume_empty_and_bad_directions():
    assert scoring.hypervolume([], ["max", "max"]) == 0.0
    with pytest.raises(ValueError, match="directions"):
        scoring.hypervolume([(1, 2)], ["up", "max"])
    with pytest.raises(ValueError, match="reference"):
        scoring.hypervolume([(1, 2)], ["max", "max"], reference=(0,))


# ---- picks on calibrated numbers (evaluation.calibration) -------------------------------------------


def test_ranking_reads_calibrated_goal_metrics_when_present():
    """With a calibration profile the report carries calibrated_<key>; picks rank on it, raw stays beside."""
    from spica_pipeline.evaluate import scoring

    fast_raw = {"output_throughput_tok_s": 1000.0, "calibrated_output_throughput_tok_s": 600.0}
    slow_raw = {"output_throughput_tok_s": 900.0, "calibrated_output_throughput_tok_s": 800.0}
    assert scoring.ranked_value(fast_raw, "output_throughput_tok_s") == 600.0
    assert scoring.objective_value("throughput", fast_raw) == 600.0
    a = scoring.Candidate.from_report({"used_gpus": 1}, fast_raw, "throughput", branch="a")
    b = scoring.Candidate.from_report({"used_gpus": 1}, slow_raw, "throughput", branch="b")
    assert [c.branch for c in scoring.rank([a, b])] == ["b", "a"]
    assert a.metrics["output_throughput_tok_s"] == 1000.0  # raw kept beside
    assert scoring.ranked_on(a.metrics, "throughput") == "calibrated"
    # calibration none: no calibrated keys, raw ranks as before
    raw_a = scoring.Candidate.from_report({"used_gpus": 1}, {"output_throughput_tok_s": 1000.0}, "throughput")
    raw_b = scoring.Candidate.from_report({"used_gpus": 1}, {"output_throughput_tok_s": 900.0}, "throughput")
    assert scoring.rank([raw_b, raw_a])[0] is raw_a and scoring.ranked_on(raw_a.metrics, "throughput") == "raw"


def test_minimised_and_pareto_goals_and_the_sla_gate_use_calibrated_values():
    from spica_pipeline.evaluate import scoring

    report = {"mean_e2e_latency_ms": 100.0, "calibrated_mean_e2e_latency_ms": 180.0,
              "mean_output_token_throughput_per_user": 50.0, "calibrated_mean_output_token_throughput_per_user": 40.0,
              "output_throughput_tok_s": 10.0, "calibrated_output_throughput_tok_s": 8.0,
              "gpu_hours": 1.0, "duration_ms": 3_600_000.0,
              "p90_ttft_ms": 100.0, "calibrated_p90_ttft_ms": 300.0}
    assert scoring.score("e2e_latency", report) == -180.0
    vec = scoring.objective_vector(["throughput_per_user", "throughput_per_gpu"], report)
    assert vec == {"throughput_per_user": 40.0, "throughput_per_gpu": 8.0}
    assert scoring.ranked_on(report, "pareto", ["throughput_per_user", "throughput_per_gpu"]) == "calibrated"
    passes, why = scoring.sla_gate(report, {"ttft_ms": 200.0}, "strict")
    assert not passes and "p90_ttft_ms" in why
    assert scoring.sla_gate({"p90_ttft_ms": 100.0}, {"ttft_ms": 200.0}, "strict") == (True, None)
