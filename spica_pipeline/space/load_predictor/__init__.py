"""Load-predictor sub-sweep: traffic windows, forecasters, and the per-interval grid."""

from spica_pipeline.space.load_predictor.predictors import (
    FAMILIES,
    LOAD_PREDICTOR_PRESETS,
    entry_label,
    make_predictor,
    minimum_points,
    predictor_fields,
)
from spica_pipeline.space.load_predictor.sweep import (
    LoadPredictorResult,
    evaluate_entry,
    evaluate_predictors,
    sweep_load_predictor,
    throughput_intervals,
    window_loss,
    winner_fields,
)
from spica_pipeline.space.load_predictor.windows import Windows, build_windows

__all__ = [
    "FAMILIES", "LOAD_PREDICTOR_PRESETS", "LoadPredictorResult", "Windows", "build_windows", "entry_label",
    "evaluate_entry", "evaluate_predictors", "make_predictor", "minimum_points", "predictor_fields",
    "sweep_load_predictor", "throughput_intervals", "window_loss", "winner_fields",
]
