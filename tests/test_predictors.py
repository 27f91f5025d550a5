"""Load predictors and candidate entries (spec §9.3, §11 item 16)."""

import math

import numpy as np
import pytest

from spica_pipeline.space.load_predictor.predictors import (
    ArimaPredictor,
    ConstantPredictor,
    KalmanPredictor,
    ProphetPredictor,
    entry_label,
    make_predictor,
    minimum_points,
    predictor_fields,
)


def test_constant_skips_leading_zeros_and_nan():
    p = ConstantPredictor()
    assert p.predict_next() == 0.0  # before any data
    for v in (0, float("nan"), 0):
        p.add_data_point(v)
    assert p.data == []
    p.add_data_point(5)
    p.add_data_point(float("nan"))  # NaN after the start counts as 0
    assert p.data == [5.0, 0.0]
    assert p.predict_next() == 0.0
    p.add_data_point(7)
    assert p.predict_next() == 7.0


def test_kalman_last_value_before_min_points_then_tracks_a_ramp():
    p = KalmanPredictor(q_level=1.0, q_trend=0.1, r=1.0, min_points=5)
    for v in (10, 20, 30):
        p.add_data_point(v)
    assert p.predict_next() == 30.0
    for v in range(40, 200, 10):
        p.add_data_point(v)
    forecast = p.predict_next()
    assert forecast == pytest.approx(200.0, abs=3.0)  # the trend carries the level forward
    assert p.predict_next() == forecast  # predicting twice does not advance the filter twice


def test_kalman_log1p_and_clamping():
    p = KalmanPredictor(log1p=True, min_points=3)
    for v in (1000, 500, 100, 10, 1):
        p.add_data_point(v)
    assert p.predict_next() >= 0.0
    q = KalmanPredictor(min_points=2)
    for v in (100, 50, 1):
        q.add_data_point(v)
    assert q.predict_next() >= 0.0  # a falling raw trend never forecasts negative load


def test_kalman_tiny_noise_parameters_are_floored():
    p = KalmanPredictor(q_level=0.0, q_trend=-1.0, r=0.0, min_points=1)
    for v in (3, 3, 3):
        p.add_data_point(v)
    assert math.isfinite(p.predict_next())


def test_arima_before_min_points_and_constant_series():
    p = ArimaPredictor()
    for v in (3, 4, 5, 6):
        p.add_data_point(v)
    assert p.predict_next() == 6.0
    q = ArimaPredictor()
    for _ in range(8):
        q.add_data_point(42)
    assert q.predict_next() == 42.0
    assert q.model is None  # a constant series is never fitted


def test_arima_fits_once_then_updates():
    y = 100 + 10 * np.arange(12) + np.random.default_rng(1).normal(0, 1, 12)
    p = ArimaPredictor()
    for v in y[:8]:
        p.add_data_point(v)
    first = p.predict_next()
    model = p.model
    assert model is not None and p.n_fitted == 8
    for v in y[8:]:
        p.add_data_point(v)
    second = p.predict_next()
    assert p.model is model and p.n_fitted == 12  # updated, not refitted
    assert first > 0 and second > first


def test_arima_failure_falls_back_to_last_value(monkeypatch):
    import pmdarima

    def boom(*a, **k):
        raise ValueError("no fit")

    monkeypatch.setattr(pmdarima, "auto_arima", boom)
    p = ArimaPredictor()
    for v in (1, 5, 2, 8, 3):
        p.add_data_point(v)
    assert p.predict_next() == 3.0


def test_prophet_follows_a_ramp_and_memoises():
    cache: dict = {}
    p = ProphetPredictor(window_size=20, interval_s=180, cache=cache)
    q = ProphetPredictor(window_size=50, interval_s=180, cache=cache)
    for v in (10, 20, 30, 40):
        p.add_data_point(v)
        q.add_data_point(v)
    assert p.predict_next() == 40.0  # below 5 points: last value
    for v in (50, 60, 70):
        p.add_data_point(v)
        q.add_data_point(v)
    forecast = p.predict_next()
    assert forecast == pytest.approx(80.0, rel=0.1)
    assert len(cache) == 1
    assert q.predict_next() == forecast  # same window, same fit: served from the cache
    assert len(cache) == 1


def test_prophet_log1p_never_negative():
    p = ProphetPredictor(log1p=True, window_size=20, interval_s=60)
    for v in (100, 60, 30, 10, 3, 1):
        p.add_data_point(v)
    assert p.predict_next() >= 0.0


def test_minimum_points_per_family():
    assert minimum_points(predictor_fields("constant_last")) == 1
    assert minimum_points(predictor_fields("arima_raw")) == 5
    assert minimum_points(predictor_fields("prophet_w20_raw")) == 5
    assert minimum_points(predictor_fields("kalman_reactive_raw")) == 3
    assert minimum_points(predictor_fields({"load_predictor": "kalman", "kalman_min_points": 7})) == 7


def test_preset_and_custom_expansion():
    assert predictor_fields("prophet_w20_log1p") == {
        "load_predictor": "prophet", "load_predictor_log1p": True, "prophet_window_size": 20}
    kalman = predictor_fields({"load_predictor": "kalman", "load_predictor_log1p": True, "kalman_q_level": 3.0})
    assert kalman["kalman_q_level"] == 3.0 and kalman["kalman_min_points"] == 5
    assert kalman["kalman_q_trend"] == 0.1 and kalman["kalman_r"] == 10.0
    assert predictor_fields({"load_predictor": "prophet", "prophet_window_size": 30}) == {
        "load_predictor": "prophet", "load_predictor_log1p": False, "prophet_window_size": 30}
    assert predictor_fields("constant_last") == {"load_predictor": "constant", "load_predictor_log1p": False}


def test_unknown_family_and_preset():
    with pytest.raises(ValueError, match=r"load_predictor must be one of \[arima, constant, kalman, prophet\]"):
        predictor_fields({"load_predictor": "bogus"})
    with pytest.raises(ValueError, match="load_predictor must be one of"):
        make_predictor({"load_predictor": "bogus"}, 180)
    with pytest.raises(ValueError, match="load_predictor_candidates has invalid choice .made_up."):
        predictor_fields("made_up")


def test_labels():
    assert entry_label("kalman_default_raw", 0) == "kalman_default_raw"
    assert entry_label({"load_predictor": "constant"}, 3) == "custom_3"


def test_make_predictor_passes_knobs():
    p = make_predictor(predictor_fields("kalman_reactive_log1p"), 180)
    assert isinstance(p, KalmanPredictor) and p.log1p and p.minimum_data_points == 3
    q = make_predictor(predictor_fields("prophet_w20_raw"), 600)
    assert isinstance(q, ProphetPredictor) and q.window_size == 20 and q.interval_s == 600
