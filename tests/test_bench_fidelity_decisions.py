"""bench/fidelity/decisions.py: one deployment question per (model, system, backend, ISL, OSL), the pick on predicted
numbers against silicon's best within the SLA, and the campaign a row was measured in."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from fidelity import decisions as dc  # noqa: E402

from spica_pipeline.fidelity import transfer  # noqa: E402


def rec(i, tp, c, ttft, tpot, predicted=None, campaign="camp", isl=1024, model="m"):
    """A row of `tp` GPUs at concurrency c; predicted (ttft, tpot) defaults to silicon's."""
    p_ttft, p_tpot = predicted or (ttft, tpot)
    return {"id": f"r{i}", "split": "calibration", "status": "feasible", "model": model, "precision": "fp8",
            "system": "h200_sxm", "backend": "vllm", "mode": "agg", "isl": isl, "osl": 100, "concurrency": c,
            "shape": {"agg": {"tp": tp, "pp": 1, "attention_dp": 1, "workers": 1, "max_num_seqs": c}},
            "campaign": campaign, "window_rule": "benchmark_client",
            "silicon": {"ttft": ttft, "tpot": tpot}, "ours": {"ttft": p_ttft, "tpot": p_tpot},
            "sweep": {"ttft": p_ttft, "tpot": p_tpot}, "calibrated": {"ttft": p_ttft, "tpot": p_tpot},
            "band": {"tpot": {"lo": p_tpot * 0.8, "hi": p_tpot * 1.25}}}


def question(predicted=None):
    """Three options: c=8 slow per user, c=32 and c=64 faster per GPU but slower per user; SLA = median TPOT 20."""
    predicted = predicted or {}
    return [rec(0, 1, 8, 100.0, 10.0, predicted.get(0)), rec(1, 1, 32, 200.0, 20.0, predicted.get(1)),
            rec(2, 1, 64, 400.0, 40.0, predicted.get(2))]


def test_a_right_prediction_picks_silicon_s_best_within_the_sla():
    d = dc.decide(dc.options(question(), lambda r: r["calibrated"]))
    assert d == {"within": True, "broken": False, "picked": True}


def test_an_optimistic_prediction_breaks_the_sla():
    """c=64 predicted at TPOT 15 looks within the SLA and fastest per GPU; silicon says 40 ms."""
    d = dc.decide(dc.options(question({2: (300.0, 15.0)}), lambda r: r["calibrated"]))
    assert d == {"within": False, "broken": True, "picked": True}


def test_a_pessimistic_prediction_picks_a_worse_option_or_none():
    d = dc.decide(dc.options(question({1: (200.0, 25.0)}), lambda r: r["calibrated"]))
    assert d == {"within": False, "broken": False, "picked": True}  # c=8 is within the SLA but half as fast
    none = dc.decide(dc.options(question({0: (100.0, 30.0), 1: (200.0, 30.0)}), lambda r: r["calibrated"]))
    assert none == {"within": False, "broken": False, "picked": False}


def test_repeats_are_one_option_and_a_single_option_asks_nothing():
    rows = question() + [{**question()[0], "id": "again", "silicon": {"ttft": 110.0, "tpot": 11.0}}]
    assert len(dc.options(rows, lambda r: r["calibrated"])) == 3
    assert dc.decide(dc.options(question()[:1], lambda r: r["calibrated"])) is None


def test_campaigns_come_from_the_source_file_and_engine_version():
    assert dc.source_file("source_file=2026-04-06.csv; model=x; measured=2025") == "2026-04-06.csv"
    assert dc.source_file("db-dump/2026-04-27; config_id=733; silicon_concurrency=128") == "db-dump/2026-04-27"
    rows = [{"id": "a", "model": "m", "precision": "fp8", "system": "s", "backend": "vllm", "mode": "agg",
             "silicon_backend_version": "0.19.0"}, {"id": "b"}]
    dc.attach_campaigns(rows, {"a": "source_file=f.csv; measured=1"})
    assert rows[0]["campaign"] == "m|fp8|s|vllm|agg|0.19.0|f.csv" and "campaign" not in rows[1]


def test_the_report_holds_every_prediction_and_own_measurements_on_the_same_questions():
    rows = question() + [rec(10 + i, 2, c, 150.0, 12.0 + i, isl=2048) for i, c in enumerate((8, 16, 32, 64))]
    for r in rows:
        r["ours"] = {"ttft": r["silicon"]["ttft"] / 2, "tpot": r["silicon"]["tpot"] * 0.9}
    base = transfer.fit_profile([{**r, "model": m, "id": f"{m}{r['id']}"} for r in rows for m in ("a", "b")],
                                fitted="d", source="t")
    out = dc.decisions(rows, base)
    assert out["questions_asked"] == 2 and set(out["by_prediction"]) == set(dc.PREDICTIONS)
    assert out["by_prediction"]["calibrated"]["questions"] == 2
    assert {"own 3", "calibrated"} <= set(out["same_questions"])
    errors = dc.own_errors(rows, base)
    assert errors["campaigns"] == 1 and errors["3"]["ttft"]["n"] > 0
