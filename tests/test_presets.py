"""Composite presets and their expansion (spec §2.7, §11 items 16-17)."""

import pytest

from spica_pipeline.config import presets

LOAD_DICT = {"enable_throughput_scaling": False, "enable_load_scaling": True,
             "throughput_adjustment_interval_seconds": None, "load_adjustment_interval_seconds": 7}
TPUT_240 = {"enable_throughput_scaling": True, "enable_load_scaling": False,
            "throughput_adjustment_interval_seconds": 240, "load_adjustment_interval_seconds": 5}


def test_preset_tables_match_spec():
    assert list(presets.SCALING_POLICY_PRESETS) == [
        "disabled", "throughput_180_5", "throughput_600_5", "load_180_5", "load_180_10", "hybrid_180_5",
        "hybrid_600_5"]
    assert presets.expand_scaling_policy("hybrid_600_5") == {
        "enable_throughput_scaling": True, "enable_load_scaling": True,
        "throughput_adjustment_interval_seconds": 600, "load_adjustment_interval_seconds": 5}
    assert presets.expand_scaling_policy("load_180_10")["load_adjustment_interval_seconds"] == 10
    assert presets.expand_fpm_sampling("fine") == {"max_num_fpm_samples": 128, "fpm_sample_bucket_size": 64}
    assert presets.expand_fpm_sampling("small") == {"max_num_fpm_samples": 32, "fpm_sample_bucket_size": 4}
    assert presets.expand_load_sensitivity("conservative") == {
        "load_scaling_down_sensitivity": 90, "load_min_observations": 8}
    assert len(presets.LOAD_PREDICTOR_PRESETS) == 11


# ---- 16. predictor entries -------------------------------------------------------------------


def test_prophet_preset_expands():
    assert presets.expand_load_predictor("prophet_w20_log1p") == {
        "load_predictor": "prophet", "load_predictor_log1p": True, "prophet_window_size": 20}


def test_kalman_dict_fills_family_defaults():
    out = presets.expand_load_predictor({"load_predictor": "kalman", "load_predictor_log1p": True,
                                         "kalman_q_level": 3.0})
    assert out == {"load_predictor": "kalman", "load_predictor_log1p": True, "kalman_q_level": 3.0,
                   "kalman_q_trend": 0.1, "kalman_r": 10.0, "kalman_min_points": 5}


def test_kalman_reactive_preset():
    out = presets.expand_load_predictor("kalman_reactive_raw")
    assert (out["kalman_q_level"], out["kalman_q_trend"], out["kalman_r"], out["kalman_min_points"]) == (
        10.0, 1.0, 5.0, 3)


def test_bogus_family_rejected():
    with pytest.raises(ValueError, match="load_predictor must be one of"):
        presets.expand_load_predictor({"load_predictor": "bogus"})
    with pytest.raises(ValueError, match="invalid choice"):
        presets.expand_load_predictor("prophet_w99")


def test_expansion_keeps_only_family_fields():
    out = presets.expand_load_predictor({"load_predictor": "prophet", "prophet_window_size": 30,
                                         "kalman_r": 2.0})
    assert out == {"load_predictor": "prophet", "load_predictor_log1p": False, "prophet_window_size": 30}
    assert presets.expand_load_predictor("arima_log1p") == {"load_predictor": "arima", "load_predictor_log1p": True}
    assert presets.expand_load_predictor({"load_predictor": "prophet"})["prophet_window_size"] == 50


def test_labels():
    assert presets.composite_label("arima_raw", 0) == "arima_raw"
    assert presets.composite_label({"load_predictor": "constant"}, 3) == "custom_3"


def test_expansion_returns_copies():
    out = presets.expand_scaling_policy("disabled")
    out["enable_load_scaling"] = True
    assert presets.SCALING_POLICY_PRESETS["disabled"]["enable_load_scaling"] is False


# ---- 17. policy decoding ---------------------------------------------------------------------


def test_throughput_intervals():
    assert presets.throughput_intervals(
        ["disabled", "load_180_5", "throughput_180_5", "hybrid_600_5", "throughput_600_5"]) == [180, 600]
    assert presets.throughput_intervals(["disabled", "load_180_5", "load_180_10", LOAD_DICT]) == []
    assert presets.throughput_intervals(["hybrid_180_5", TPUT_240, LOAD_DICT, "throughput_180_5"]) == [180, 240]


def test_dict_decoding_defaults():
    # a dict's missing flag means False and a missing interval None (load-time checks are stricter)
    assert presets.expand_scaling_policy({"enable_load_scaling": True}) == {
        "enable_throughput_scaling": False, "enable_load_scaling": True,
        "throughput_adjustment_interval_seconds": None, "load_adjustment_interval_seconds": None}


def test_policy_flags():
    keep = [p for p in ["disabled", "load_180_5", LOAD_DICT, "throughput_180_5", "hybrid_600_5", TPUT_240]
            if not presets.enables_throughput_scaling(p)]
    assert keep == ["disabled", "load_180_5", LOAD_DICT]
    assert presets.enables_load_scaling("hybrid_180_5") and not presets.enables_load_scaling("throughput_600_5")
    assert presets.is_static_policy("disabled")
    assert presets.is_static_policy({**TPUT_240, "enable_throughput_scaling": False})
    assert not presets.is_static_policy(LOAD_DICT)


@pytest.mark.parametrize("field", list(presets.COMPOSITES))
def test_validate_composite_list_rules(field):
    first = next(iter(presets.COMPOSITES[field]["presets"]))
    assert presets.validate_composite_list(field, [first]) == [first]
    with pytest.raises(ValueError, match="at least one choice"):
        presets.validate_composite_list(field, [])
    with pytest.raises(ValueError, match="invalid choice"):
        presets.validate_composite_list(field, ["nope"])
    with pytest.raises(ValueError, match="unknown keys"):
        presets.validate_composite_list(field, [{"nope": 1}])
    with pytest.raises(ValueError, match="more than once"):
        presets.validate_composite_list(field, [first, first])
