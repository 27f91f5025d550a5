"""Picks a user can act on: the offered load, the SLA share, twins, one throughput definition, cost.

Ledgers are built here from plain report dicts, so every rule is checked without a replay; the
measurement tests feed idealised per-request records to fidelity/measurement.py.
"""

import json
import math

import pandas as pd
import pytest
from pydantic import ValidationError

from spica_pipeline.config import SmartSearchConfig
from spica_pipeline.config.goal import DEFAULT_GPU_PRICES, GPU_PRICE_KEY, OptimizationGoal, gpu_price
from spica_pipeline.evaluate import scoring
from spica_pipeline.fidelity import measurement as m
from spica_pipeline.report import merge_candidates, merge_for_config, verdict, write_outputs

# --------------------------------------------------------------------------------------------------
# fidelity/measurement.py: one throughput definition, the load measures, the SLA count


def open_loop(rate_per_s: float, n: int, e2e_ms, osl: int = 10, ttft_ms: float = 10.0) -> list[dict]:
    """n requests arriving 1000/rate ms apart, request i taking e2e_ms(i) ms (a callable) end to end."""
    out = []
    for i in range(n):
        t = i * 1000.0 / rate_per_s
        e2e = e2e_ms(i)
        out.append({"arrival_time_ms": t, "ttft_ms": ttft_ms, "terminal_time_ms": t + e2e, "e2e_latency_ms": e2e,
                    "itl_ms": (e2e - ttft_ms) / (osl - 1), "output_length": osl, "input_length": 100})
    return out


def test_request_rate_times_output_length_is_the_token_rate():
    for e2e in (lambda i: 200.0, lambda i: 200.0 + 40.0 * i):  # keeping up, and a queue that grows
        w = m.steady_state(open_loop(10.0, 200, e2e), "open_loop")
        assert w.metrics["request_throughput_rps"] * 10 == pytest.approx(w.metrics["output_throughput_tok_s"])
    assert "request throughput x mean output length = token throughput" in m.THROUGHPUT_DEFINITION


def test_load_measures_tell_a_fleet_that_keeps_up_from_one_that_falls_behind():
    steady = m.steady_state(open_loop(10.0, 200, lambda i: 200.0), "open_loop").metrics
    assert steady["offered_request_rate_rps"] == pytest.approx(10.0, rel=0.02)
    assert steady["settled_served_share"] == pytest.approx(1.0, abs=0.02)
    assert abs(steady["settled_queue_growth_rps"]) < 0.5
    assert scoring.carries_load(steady) is True
    # each request takes 40 ms longer than the one before: served falls behind the arrivals
    behind = m.steady_state(open_loop(10.0, 200, lambda i: 200.0 + 40.0 * i), "open_loop").metrics
    assert behind["settled_queue_growth_rps"] > 0.05 * behind["offered_request_rate_rps"]
    assert scoring.carries_load(behind) is False
    assert scoring.replicas_to_carry(behind) >= 2
    assert scoring.carries_load({}) is None


def test_one_request_arriving_before_the_window_ends_is_not_a_growing_queue():
    """40 requests at 4 req/s, 0.82 s each (a tiny sweep's 2 x TP1): in flight is 3 or 4 depending on the
    instant; the growth is read from means over time, so the fleet carries its load."""
    w = m.steady_state(open_loop(4.0, 40, lambda i: 820.0), "open_loop").metrics
    assert abs(w["settled_queue_growth_rps"]) < 0.05 * w["offered_request_rate_rps"]
    assert scoring.carries_load(w) is True


def test_the_sla_count_is_of_the_window_s_own_requests():
    """The calibrated count (sla_token_share, unit scales) and the replay's goodput count are of the same
    requests, so their share over window_counted_requests is the same number."""
    recs = open_loop(10.0, 200, lambda i: 200.0 + 40.0 * i)
    sla = {"ttft_ms": 50.0, "itl_ms": 10_000.0}  # every request meets it, also those still running at the end
    w = m.steady_state(recs, "open_loop", sla=sla)
    report = w.to_report()
    assert report["window_counts_arrivals"] == 1.0
    _, good = m.sla_token_share(recs, w.start_ms, w.end_ms, sla, arrivals_only=True)
    assert good == report["goodput_completed_requests"] > 0
    # without the open loop's rule, requests still running at the window's end would be left out
    _, completing = m.sla_token_share(recs, w.start_ms, w.end_ms, sla)
    assert completing < good


# --------------------------------------------------------------------------------------------------
# config/goal.py


def test_tpot_ms_is_read_as_itl_ms():
    goal = OptimizationGoal(target="goodput", sla={"ttft_ms": 600, "tpot_ms": 30})
    assert goal.sla.itl_ms == 30 and goal.sla_thresholds() == {"ttft_ms": 600.0, "itl_ms": 30.0}
    with pytest.raises(ValidationError, match="itl_ms or tpot_ms, not both"):
        OptimizationGoal(target="goodput", sla={"ttft_ms": 600, "tpot_ms": 30, "itl_ms": 30})


def test_sla_attainment_defaults_and_needs_an_sla():
    assert OptimizationGoal(target="goodput", sla={"e2e_ms": 900}).required_attainment() == 0.9
    assert OptimizationGoal(target="throughput").required_attainment() is None
    assert OptimizationGoal(target="goodput", sla={"e2e_ms": 900}, sla_attainment=0.5).required_attainment() == 0.5
    with pytest.raises(ValidationError, match="sla_attainment needs goal.sla"):
        OptimizationGoal(target="throughput", sla_attainment=0.9)
    with pytest.raises(ValidationError):
        OptimizationGoal(target="goodput", sla={"e2e_ms": 900}, sla_attainment=1.5)


def test_gpu_prices_override_the_default_table_and_name_known_systems():
    goal = OptimizationGoal(target="cost_per_mtok", gpu_prices={"h200_sxm": 2.0})
    assert goal.gpu_usd_per_hour("h200_sxm") == 2.0 and goal.gpu_usd_per_hour("H100_SXM") == DEFAULT_GPU_PRICES["h100_sxm"]
    assert gpu_price("no_such_gpu") is None and goal.scores_cost()
    with pytest.raises(ValidationError, match="unknown GPU system"):
        OptimizationGoal(target="cost_per_mtok", gpu_prices={"h300": 2.0})
    pareto = OptimizationGoal(target="pareto", pareto_objectives=["cost_per_mtok", "throughput_per_user"])
    assert pareto.scores_cost() and scoring.directions_for(pareto.objectives()) == {
        "cost_per_mtok": "min", "throughput_per_user": "max"}


# --------------------------------------------------------------------------------------------------
# evaluate/scoring.py


def test_cost_per_mtok_prices_the_gpu_hours_per_output_token():
    report = {"output_throughput_tok_s": 1000.0, "request_throughput_rps": 5.0, "gpu_hours": 4.0,
              "duration_ms": 3.6e6, GPU_PRICE_KEY: 3.0}
    # 4 GPUs x 3 USD/h = 12 USD/h for 3.6 M tokens/h; 18,000 requests/h
    assert scoring.cost_per_mtok(report) == pytest.approx(12.0 / 3.6)
    assert scoring.cost_per_k_requests(report) == pytest.approx(12.0 / 18.0)
    assert scoring.usd_per_hour(report) == pytest.approx(12.0)
    assert scoring.objective_value("cost_per_mtok", report) == pytest.approx(12.0 / 3.6)
    assert scoring.score("cost_per_mtok", report) == pytest.approx(-12.0 / 3.6)  # minimised
    assert scoring.objective_value("cost_per_mtok", {**report, GPU_PRICE_KEY: None}) == math.inf


def test_sla_attainment_bases():
    metrics = {"window_counted_requests": 200.0, "goodput_completed_requests": 150.0,
               "calibrated_goodput_completed_requests": 120.0, "pessimistic_goodput_completed_requests": 40.0}
    assert scoring.sla_attainment(metrics) == 0.6  # calibrated: what picks are judged on
    assert scoring.sla_attainment(metrics, "raw") == 0.75 and scoring.sla_attainment(metrics, "pessimistic") == 0.2
    assert scoring.meets_sla(metrics, 0.6) is True and scoring.meets_sla(metrics, 0.9) is False
    assert scoring.meets_sla(metrics, None) is None and scoring.sla_attainment({}) is None


# --------------------------------------------------------------------------------------------------
# the merge: tiers, twins, cost; the verdict sentences


def report(tok: float, gpus: int, *, served: float = 8.0, offered: float = 8.0, share: float = 1.0,
           growth: float = 0.0, good: float | None = None, ttft: float = 100.0, itl: float = 20.0) -> dict:
    out = {"output_throughput_tok_s": tok, "request_throughput_rps": served, "gpu_hours": float(gpus),
           "duration_ms": 3.6e6, "mean_ttft_ms": ttft, "p90_ttft_ms": ttft * 1.2, "mean_tpot_ms": itl,
           "p90_itl_ms": itl * 1.1, "mean_e2e_latency_ms": ttft + 200 * itl,
           "offered_request_rate_rps": offered, "settled_served_share": share, "settled_queue_growth_rps": growth,
           "window_counted_requests": 100.0}
    if good is not None:
        out.update(goodput_completed_requests=good, goodput_output_throughput_tok_s=tok * good / 100.0)
    return out


AGG = {"deployment_mode": "agg", "backend": "vllm", "backend_version": "0.24.0", "model_name": "Qwen/Qwen3-32B",
       "hardware_sku": "h200_sxm", "gpu_budget": 8, "tp": 1, "pp": 1, "attention_dp": 1, "moe_tp": 1, "moe_ep": 1,
       "strategy": "tp", "replicas": 1, "agg_max_num_seqs": 256, "agg_max_num_batched_tokens": 8192,
       "agg_block_size": 64, "agg_gpu_memory_utilization": 0.9, "agg_enable_prefix_caching": True,
       "router_mode": "round_robin", "planner_scaling_policy": "disabled", "enable_throughput_scaling": False,
       "enable_load_scaling": False}


def ledger(rows: list[tuple[str, int, dict, dict]]) -> pd.DataFrame:
    """(spec_hash, GPUs, extra config, report) per feasible agg row."""
    return pd.DataFrame([{"branch": "agg", "status": "feasible", "spec_hash": h, "used_gpus": g, "reason": None,
                          "config": json.dumps({**AGG, "tp": g, "used_gpus": g, **cfg}),
                          "report": json.dumps(rep)} for h, g, cfg, rep in rows])


def test_a_candidate_that_does_not_carry_the_load_ranks_after_those_that_do():
    rows = ledger([("fast-but-short", 2, {}, report(1300.0, 2, served=6.2, share=0.8, growth=1.8)),
                   ("carries", 3, {}, report(1560.0, 3, served=7.8))])
    merged = merge_candidates(rows, "throughput_per_gpu", offered="8 req/s")
    assert [c.spec_hash for c in merged.candidates] == ["carries", "fast-but-short"]
    short = merged.candidates[1]
    assert verdict.marks(short, merged) == [
        "does not carry 8 req/s: served 80 % of the arrivals in the window's settled half; served 6.2 req/s over "
        "the window; 2 copies (4 GPUs) would carry it"]
    lines = verdict.headline(merged)
    assert lines[0].startswith("Rank 1 carries the offered load (8 req/s): in the window's settled second half it "
                               "served 100 % of the requests arriving (7.8 req/s of 8 req/s over the whole window")
    assert "1 of 2 distinct configurations do not carry it" in lines[1]
    assert "it served 6.2 req/s; 2 copies (4 GPUs) of it would carry the load" in lines[2]
    # served every arrival, but requests in flight still grew, and a request lasts over a quarter of the window
    filling = ledger([("filling", 8, {}, {**report(1500.0, 8, served=5.2, growth=0.8, ttft=400.0, itl=50.0),
                                          "window_start_ms": 3000.0, "window_end_ms": 27000.0}),
                      ("carries", 8, {}, report(1400.0, 8, served=7.9))])
    merged = merge_candidates(filling, "throughput_per_gpu", offered="8 req/s")
    assert "in flight were still growing in the window's settled half (10 % of the offered rate)" in \
        verdict.marks(merged.candidates[1], merged)[0]
    assert "may have been filling up rather than falling behind" in verdict.headline(merged)[-1]
    # goal.offered_load: report keeps the goal's order and only marks
    marked = merge_candidates(rows, "throughput_per_gpu", offered="8 req/s", offered_required=False)
    assert [c.spec_hash for c in marked.candidates] == ["fast-but-short", "carries"]
    # a closed loop offers nothing to carry
    assert merge_candidates(rows, "throughput_per_gpu").candidates[0].spec_hash == "fast-but-short"
    none = merge_candidates(rows.iloc[:1], "throughput_per_gpu", offered="8 req/s")
    assert verdict.headline(none)[0].startswith("No configuration carried the offered load (8 req/s)")


def test_no_configuration_met_the_sla_says_so_with_the_closest_and_what_would_meet_it():
    sla = {"ttft_ms": 600.0, "itl_ms": 30.0}
    rows = ledger([("a", 8, {}, report(1500.0, 8, good=40.0, itl=45.0)),
                   ("b", 4, {}, report(900.0, 4, good=10.0, itl=60.0)),
                   ("c", 2, {}, report(500.0, 2, good=0.0, itl=90.0))])
    merged = merge_candidates(rows, "goodput_per_gpu", sla=sla, sla_required=0.9)
    assert verdict.sla_unmet(merged)
    lines = verdict.headline(merged)
    assert lines[0].startswith("No configuration met the SLA (TTFT <= 600 ms, ITL <= 30 ms for >= 90 % of requests)")
    assert "with 40 % of requests within it" in lines[0] and "1 x TP8 (8 GPUs)" in lines[0]
    assert lines[1].startswith("What would meet it: ") and "ITL <= 50 ms (now 30)" in lines[1]
    assert "2 GPUs: 0 %, 4 GPUs: 10 %, 8 GPUs: 40 %" in lines[1]
    # one that meets it ranks first and the headline says so
    rows = ledger([("a", 8, {}, report(1500.0, 8, good=40.0)), ("ok", 8, {}, report(800.0, 8, good=95.0))])
    merged = merge_candidates(rows, "goodput_per_gpu", sla=sla, sla_required=0.9)
    assert merged.candidates[0].spec_hash == "ok" and not verdict.sla_unmet(merged)
    assert verdict.headline(merged)[0].startswith("Rank 1 meets the SLA")
    assert verdict.marks(merged.candidates[1], merged) == ["SLA met by 40 % of requests (needs 90 %)"]


def test_twins_are_one_entry_with_the_smallest_settings_and_one_deploy_folder(tmp_path):
    same = report(1500.0, 2, served=7.5)
    rows = ledger([("big", 2, {"agg_max_num_seqs": 512}, same),
                   ("small", 2, {"agg_max_num_seqs": 256, "agg_max_num_batched_tokens": 16384}, same),
                   ("smallest", 2, {"agg_max_num_seqs": 256}, same),
                   ("more-gpus", 4, {}, same),
                   ("other", 2, {}, report(1400.0, 2, served=7.0))])
    merged = merge_candidates(rows, "throughput", offered="8 req/s")
    assert [c.spec_hash for c in merged.candidates] == ["smallest", "other"]
    rep = merged.candidates[0]
    assert sorted(t.spec_hash for t in rep.twins) == ["big", "more-gpus", "small"]
    assert "+3 equivalent settings" in verdict.marks(rep, merged)
    write_outputs(tmp_path, rows, merged, goal_summary={"target": "throughput"}, workload_summary={}, timings={})
    assert sorted(p.name for p in (tmp_path / "deploy").iterdir()) == ["1", "2"]
    table = pd.read_csv(tmp_path / "candidates.csv")
    assert list(table["equivalent_settings"]) == [3, 0] and len(table) == 2
    text = (tmp_path / "report.md").read_text()
    assert "+3 equivalent settings" in text and "## Glossary" in text and "fewest GPUs" in text


def test_twins_are_judged_on_replayed_metrics_within_one_tier():
    """Calibration spreads a load over a role's engines, so an idle extra engine moves calibrated TTFT though
    no request saw it: still a twin. A twin that misses the SLA where the other meets it is not one."""
    base = report(1500.0, 3, served=7.5, good=95.0)
    rows = ledger([("three", 3, {}, {**base, "calibrated_mean_ttft_ms": 670.0}),
                   ("four", 4, {}, {**base, "calibrated_mean_ttft_ms": 630.0})])
    merged = merge_candidates(rows, "throughput_per_gpu")
    assert [c.spec_hash for c in merged.candidates] == ["three"] and merged.candidates[0].twins[0].spec_hash == "four"
    rows = ledger([("meets", 3, {}, base), ("misses", 2, {}, {**base, "calibrated_goodput_completed_requests": 50.0})])
    merged = merge_candidates(rows, "throughput", sla={"e2e_ms": 9000.0}, sla_required=0.9)
    assert [c.spec_hash for c in merged.candidates] == ["meets", "misses"]


def test_cost_per_mtok_ranks_the_cheapest_first_and_every_pick_has_a_cost(tmp_path):
    rows = ledger([("dear", 8, {}, report(1600.0, 8)), ("cheap", 2, {}, report(1000.0, 2))])
    merged = merge_candidates(rows, "cost_per_mtok", gpu_price=3.0)
    assert [c.spec_hash for c in merged.candidates] == ["cheap", "dear"]
    assert merged.candidates[0].score == pytest.approx(-6.0 / 3.6)
    write_outputs(tmp_path, rows, merged, goal_summary={"target": "cost_per_mtok"}, workload_summary={}, timings={})
    table = pd.read_csv(tmp_path / "candidates.csv")
    assert table["cost_per_mtok_usd"].tolist() == pytest.approx([6.0 / 3.6, 24.0 / 5.76])
    assert table["cost_per_k_requests_usd"].notna().all() and table["usd_per_hour"].tolist() == [6.0, 24.0]
    text = (tmp_path / "report.md").read_text()
    assert "| USD/Mtok | USD/1k req |" in text and "3 USD per GPU-hour" in text
    assert "Cost at 3 USD per GPU-hour: 6 USD/h; 1.67 USD per million output tokens" in text
    front = merge_candidates(rows, "pareto", ["cost_per_mtok", "throughput"], gpu_price=3.0)
    assert {c.spec_hash for c in front.candidates} == {"cheap", "dear"}


def test_merge_for_config_reads_offered_load_sla_and_prices():
    config = SmartSearchConfig.from_dict({
        "search_space": {"model_name": "Qwen/Qwen3-32B", "hardware_sku": "h200_sxm", "gpu_budget": 8,
                         "deployment_mode": ["agg"], "backend": ["vllm"]},
        "workload": {"isl": 2000, "osl": 200, "request_rate": 8, "num_request_ratio": 30},
        "goal": {"target": "goodput_per_gpu", "sla": {"ttft_ms": 600, "tpot_ms": 30}, "sla_attainment": 0.8,
                 "gpu_prices": {"h200_sxm": 2.5}},
    })
    merged = merge_for_config(ledger([("a", 2, {}, report(1000.0, 2, good=85.0))]), config)
    assert (merged.offered, merged.sla, merged.sla_required, merged.gpu_price) == (
        "8 req/s", {"ttft_ms": 600.0, "itl_ms": 30.0}, 0.8, 2.5)
    assert merged.candidates[0].metrics[GPU_PRICE_KEY] == 2.5 and merged.meets_sla(merged.candidates[0])
