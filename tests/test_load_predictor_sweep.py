"""The load-predictor sub-sweep (spec §9.1, §9.4; §11 items 14-16)."""

import math
from types import SimpleNamespace

import numpy as np
import pytest

from spica_pipeline.space.load_predictor import (
    LoadPredictorResult,
    Windows,
    evaluate_entry,
    evaluate_predictors,
    make_predictor,
    sweep_load_predictor,
    throughput_intervals,
    window_loss,
    winner_fields,
)
from spica_pipeline.space.load_predictor.predictors import ConstantPredictor

FAST = ["constant_last", "kalman_default_raw", "kalman_default_log1p", "kalman_reactive_raw",
        "kalman_reactive_log1p"]


# ---- window loss (§11 item 14) --------------------------------------------------------------

def test_window_loss_exact_and_empty():
    assert window_loss((3, 100, 10), (3, 100, 10)) == 0.0
    assert window_loss((0, 0, 0), (0, 0, 0)) == 0.0


def test_window_loss_penalises_over_prediction():
    assert window_loss((6, 100, 10), (3, 100, 10)) > 0
    assert window_loss((5, 100, 10), (0, 0, 0)) > 0  # forecasting load during a lull


def test_window_loss_isl_error_weight():
    i_hat, i = 150.0, 100.0
    expected = 0.5 * abs(math.log1p(i_hat) - math.log1p(i))  # 0.4 via n*i plus 0.1 direct
    assert window_loss((1, i_hat, 10), (1, i, 10)) == pytest.approx(expected)


def test_window_loss_clamps_before_products():
    # two negative forecasts must not multiply into a positive (matching) load
    assert window_loss((-3, -100, 10), (3, 100, 10)) == window_loss((0, 0, 10), (3, 100, 10))
    assert window_loss((-3, -100, 10), (3, 100, 10)) > 0


# ---- evaluate (evaluate_preset-style) --------------------------------------------------------

def test_evaluate_last_value_predictor_with_warmup():
    rows = [(2, 100, 10), (2, 100, 10), (4, 200, 20)]
    triple = tuple(ConstantPredictor() for _ in range(3))
    got = evaluate_predictors(triple, rows, warmup=1)
    expected = (window_loss((2, 100, 10), (2, 100, 10)) + window_loss((2, 100, 10), (4, 200, 20))) / 2
    assert got == pytest.approx(expected)
    assert got > 0


def test_evaluate_no_windows_is_inf():
    assert evaluate_entry("constant_last", Windows.from_rows([], 180), 1) == math.inf
    assert evaluate_entry("constant_last", Windows.from_rows([(1, 1, 1)], 180), 5) == math.inf


# ---- triggers and fallbacks (§11 item 15) ----------------------------------------------------

def test_no_throughput_policy():
    r = sweep_load_predictor(["disabled", "load_180_5"], FAST, None, is_trace=True)
    assert r.reason == "no_throughput_scaling_candidate"
    assert r.best_by_interval == {} and r.losses == {}


def test_static_workload_uses_constant():
    r = sweep_load_predictor(["throughput_180_5", "hybrid_600_5"], FAST, None, is_trace=False)
    assert r.best_by_interval == {180: "constant_last", 600: "constant_last"}
    assert r.reason == "static_workload_constant"


def test_all_infinite_falls_back_to_constant_last():
    windows = {180: Windows.from_rows([(0, 0, 0)] * 3, 180)}
    r = sweep_load_predictor(["throughput_180_5"], ["kalman_default_raw", "kalman_reactive_raw"], windows,
                             is_trace=True)
    assert r.best_by_interval == {180: "constant_last"}
    assert "no_winner_fallback_constant_last" in r.reason and "180" in r.reason
    assert r.losses[180] and all(v == math.inf for v in r.losses[180].values())


def test_identical_windows_constant_scores_zero():
    windows = {180: Windows.from_rows([(3, 100, 10)] * 12, 180)}
    r = sweep_load_predictor(["throughput_180_5"], FAST, windows, is_trace=True)
    assert r.losses[180]["constant_last"] == 0.0
    winner = r.best_by_interval[180]
    assert r.losses[180][winner] == pytest.approx(0.0, abs=1e-9)
    assert r.reason == "swept"


def test_winner_is_smallest_and_ties_keep_the_earlier_entry():
    rows = [(max(0.0, round(50 + 40 * np.sin(k / 2.0))), 100 + k, 10) for k in range(16)]
    windows = {180: Windows.from_rows(rows, 180)}
    r = sweep_load_predictor(["throughput_180_5"], FAST, windows, is_trace=True)
    best = r.best_by_interval[180]
    assert r.losses[180][best] == min(r.losses[180].values())
    custom = {"load_predictor": "constant"}
    first = sweep_load_predictor(["throughput_180_5"], ["constant_last", custom], windows, is_trace=True)
    assert first.best_by_interval[180] == "constant_last"
    assert first.losses[180]["constant_last"] == first.losses[180]["custom_1"]
    second = sweep_load_predictor(["throughput_180_5"], [custom, "constant_last"], windows, is_trace=True)
    assert second.best_by_interval[180] == custom


def test_raising_predictor_is_disqualified_not_fatal():
    class Broken(ConstantPredictor):
        def predict_next(self):
            if len(self.data) >= 2:
                raise RuntimeError("solver exploded")
            return super().predict_next()

    def factory(fields, interval_s, cache=None):
        if fields["load_predictor"] == "kalman":
            return Broken()
        return make_predictor(fields, interval_s, cache)

    windows = {180: Windows.from_rows([(3, 100, 10), (4, 100, 10)] * 4, 180)}
    messages: list[str] = []
    r = sweep_load_predictor(["throughput_180_5"], ["kalman_default_raw", "constant_last"], windows,
                             is_trace=True, factory=factory, on_progress=messages.append)
    assert r.losses[180]["kalman_default_raw"] == math.inf
    assert math.isfinite(r.losses[180]["constant_last"])
    assert r.best_by_interval[180] == "constant_last"
    assert r.reason == "swept"
    assert any("disqualified" in m and "solver exploded" in m for m in messages)


def test_unknown_family_fails_the_sweep():
    with pytest.raises(ValueError, match="load_predictor must be one of"):
        sweep_load_predictor(["throughput_180_5"], [{"load_predictor": "bogus"}], None, is_trace=False)


def test_windows_built_per_interval_from_trace_arrays():
    # 40 minutes: one request every 10 s, a burst in minute 30
    ts = np.concatenate([np.arange(0, 2_400_000, 10_000.0), np.full(20, 1_800_500.0)])
    trace = SimpleNamespace(timestamp_ms=np.sort(ts), input_length=np.full(len(ts), 100),
                            output_length=np.full(len(ts), 10))
    r = sweep_load_predictor(["throughput_180_5", "throughput_600_5"], ["constant_last"], trace, is_trace=True)
    assert set(r.best_by_interval) == {180, 600}
    assert r.losses[180]["constant_last"] > 0 and r.losses[600]["constant_last"] > 0


def test_missing_windows_for_an_interval():
    with pytest.raises(ValueError, match="no windows given for interval 600"):
        sweep_load_predictor(["throughput_600_5"], ["constant_last"], {180: Windows.from_rows([], 180)},
                             is_trace=True)


def test_throughput_intervals_mixed_entries():
    assert throughput_intervals(["disabled", "load_180_5", "throughput_180_5", "hybrid_600_5",
                                 "throughput_600_5"]) == [180, 600]
    assert throughput_intervals(["disabled", "load_180_10"]) == []
    custom = {"enable_throughput_scaling": True, "enable_load_scaling": False,
              "throughput_adjustment_interval_seconds": 240, "load_adjustment_interval_seconds": 5}
    assert throughput_intervals(["throughput_180_5", custom]) == [180, 240]


def test_prophet_memo_gives_the_same_losses():
    rows = [(10 + 3 * k, 100, 10) for k in range(7)]
    windows = {60: Windows.from_rows(rows, 60)}
    policy = {"enable_throughput_scaling": True, "enable_load_scaling": False,
              "throughput_adjustment_interval_seconds": 60, "load_adjustment_interval_seconds": 5}
    cands = ["prophet_w20_raw", "prophet_w50_raw"]
    memo = sweep_load_predictor([policy], cands, windows, is_trace=True, memoize=True)
    plain = sweep_load_predictor([policy], cands, windows, is_trace=True, memoize=False)
    assert memo.losses == plain.losses
    assert memo.losses[60]["prophet_w20_raw"] == memo.losses[60]["prophet_w50_raw"]  # history <= 20 points


# ---- result serialisation and unrolled fields ------------------------------------------------

def test_result_round_trip_with_infinite_losses():
    r = LoadPredictorResult({180: "kalman_default_raw", 600: {"load_predictor": "prophet"}},
                            {180: {"kalman_default_raw": 0.25, "arima_raw": math.inf}}, "swept")
    d = r.to_dict()
    assert d["best_by_interval"] == {"180": "kalman_default_raw", "600": {"load_predictor": "prophet"}}
    assert d["losses"] == {"180": {"kalman_default_raw": 0.25, "arima_raw": None}}
    import json

    back = LoadPredictorResult.from_dict(json.loads(json.dumps(d, allow_nan=False)))
    assert back == r
    assert back.winner(180.0) == "kalman_default_raw" and back.winner(None) is None


def test_winner_fields_only_that_family():
    assert winner_fields("prophet_w20_log1p") == {"load_predictor": "prophet", "load_predictor_log1p": True,
                                                  "prophet_window_size": 20}
    custom = winner_fields({"load_predictor": "kalman", "kalman_r": 2.0})
    assert custom == {"load_predictor": "kalman", "load_predictor_log1p": False, "kalman_q_level": 1.0,
                      "kalman_q_trend": 0.1, "kalman_r": 2.0, "kalman_min_points": 5}
    assert winner_fields("arima_log1p") == {"load_predictor": "arima", "load_predictor_log1p": True}


# ---- stage glue: config -> trace -> sweep ----------------------------------------------------

def _config(workload: dict, policies: list, candidates: list):
    from spica_pipeline.config.model import SmartSearchConfig

    return SmartSearchConfig.from_dict({
        "search_space": {"model_name": "Qwen/Qwen3-32B", "hardware_sku": "h200_sxm",
                         "planner_scaling_policy": policies, "load_predictor_candidates": candidates},
        "workload": workload,
    })


def test_load_predictor_for_config_reads_the_trace(tmp_path):
    import importlib.util
    from pathlib import Path

    from spica_pipeline.space.load_predictor.from_trace import load_predictor_for_config

    spec = importlib.util.spec_from_file_location(
        "gen_sine_trace", Path(__file__).resolve().parents[1] / "scripts" / "gen_sine_trace.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    path = gen.write_sine_trace(tmp_path / "sine.jsonl", duration_s=1800, period_s=900, base_rps=2,
                                amplitude_rps=1.5, isl=600, osl=20)
    config = _config({"trace_path": str(path)}, ["throughput_180_5", "load_180_5"], FAST)
    r = load_predictor_for_config(config)
    assert r.reason == "swept" and list(r.best_by_interval) == [180]
    assert set(r.losses[180]) == set(FAST)
    fast = _config({"trace_path": str(path), "arrival_speedup_ratio": 2.0}, ["throughput_180_5"], FAST)
    assert load_predictor_for_config(fast).losses != r.losses  # windows follow the sped-up arrivals


def test_load_predictor_for_config_bad_trace_names_the_line(tmp_path):
    from spica_pipeline.errors import TraceError
    from spica_pipeline.space.load_predictor.from_trace import load_predictor_for_config

    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n{"timestamp": 5}\n')
    with pytest.raises(TraceError, match="bad.jsonl:2"):
        load_predictor_for_config(_config({"trace_path": str(path)}, ["throughput_180_5"], FAST))


def test_load_predictor_for_config_synthetic():
    from spica_pipeline.space.load_predictor.from_trace import load_predictor_for_config

    config = _config({"isl": 100, "osl": 10, "request_rate": 5, "num_request_ratio": 10}, ["hybrid_180_5"], FAST)
    assert load_predictor_for_config(config).reason == "static_workload_constant"
