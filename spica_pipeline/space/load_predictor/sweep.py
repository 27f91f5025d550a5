"""The load-predictor sub-sweep: pick one forecaster per throughput interval, offline.

Every candidate predicts each window one step ahead from the windows before it; the winner has
the smallest mean window loss (ties keep the earlier-listed candidate). Pure: the caller supplies
windows or already-read trace arrays.
"""

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Protocol

import numpy as np

from spica_pipeline.config.presets import expand_scaling_policy
from spica_pipeline.space.load_predictor.predictors import (
    TrafficPredictor,
    entry_label,
    make_predictor,
    minimum_points,
    predictor_fields,
)
from spica_pipeline.space.load_predictor.windows import Windows, build_windows

FALLBACK_ENTRY = "constant_last"
PredictorFactory = Callable[[dict[str, Any], float, "dict | None"], TrafficPredictor]


class TraceArrays(Protocol):
    """What the sweep needs from a trace (e.g. `spica_pipeline.traces.TraceData`)."""

    @property
    def timestamp_ms(self) -> np.ndarray: ...

    @property
    def input_length(self) -> np.ndarray: ...

    @property
    def output_length(self) -> np.ndarray: ...


def _interval_key(value: Any) -> int | float:
    v = float(value)
    return int(v) if v.is_integer() else v


@dataclass
class LoadPredictorResult:
    """Winner per throughput interval (seconds), every candidate's mean loss, and why."""

    best_by_interval: dict[int | float, str | dict[str, Any]] = field(default_factory=dict)
    losses: dict[int | float, dict[str, float]] = field(default_factory=dict)
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: interval keys as strings, infinite (or NaN) losses as null."""
        return {
            "best_by_interval": {str(k): (dict(v) if isinstance(v, dict) else v)
                                 for k, v in self.best_by_interval.items()},
            "losses": {str(k): {label: (loss if math.isfinite(loss) else None) for label, loss in row.items()}
                       for k, row in self.losses.items()},
            "reason": self.reason,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "LoadPredictorResult":
        return cls(
            best_by_interval={_interval_key(k): (dict(v) if isinstance(v, dict) else v)
                              for k, v in (d.get("best_by_interval") or {}).items()},
            losses={_interval_key(k): {label: (math.inf if loss is None else float(loss))
                                       for label, loss in row.items()}
                    for k, row in (d.get("losses") or {}).items()},
            reason=str(d.get("reason", "")),
        )

    def winner(self, interval_s: Any) -> str | dict[str, Any] | None:
        if interval_s is None:
            return None
        return self.best_by_interval.get(_interval_key(interval_s))


def winner_fields(entry: str | dict[str, Any]) -> dict[str, Any]:
    """The unrolled planner fields of a winner: family, log1p and only that family's knobs."""
    return predictor_fields(entry)


def _log_err(pred: float, actual: float) -> float:
    return abs(math.log1p(max(pred, 0.0)) - math.log1p(max(actual, 0.0)))


def window_loss(forecast: tuple[float, float, float], actual: tuple[float, float, float]) -> float:
    """0.4 prefill-token error + 0.4 decode-token error + 0.1 ISL + 0.1 OSL, all in log1p space.

    Forecasts are clamped at 0 before the products, so two negative forecasts never multiply into a
    positive load. Request count enters only through the products.
    """
    n_hat, i_hat, o_hat = (max(0.0, float(x)) for x in forecast)
    n, i, o = (max(0.0, float(x)) for x in actual)
    return (0.4 * _log_err(n_hat * i_hat, n * i) + 0.4 * _log_err(n_hat * o_hat, n * o)
            + 0.1 * _log_err(i_hat, i) + 0.1 * _log_err(o_hat, o))


def evaluate_predictors(
    predictors: tuple[TrafficPredictor, TrafficPredictor, TrafficPredictor],
    windows: Windows | Iterable[tuple[float, float, float]],
    warmup: int,
) -> float:
    """Mean window loss of one (num_req, isl, osl) predictor triple; +inf if no window is scored.

    For each window: forecast, score when the window index >= warmup, then feed the actuals.
    Exceptions from a predictor propagate (the sweep turns them into +inf).
    """
    rows = windows.rows() if isinstance(windows, Windows) else windows
    total, scored = 0.0, 0
    for t, actual in enumerate(rows):
        forecast = tuple(float(p.predict_next()) for p in predictors)
        if not all(math.isfinite(x) for x in forecast):
            raise ValueError(f"non-finite forecast {forecast} at window {t}")
        if t >= warmup:
            total += window_loss(forecast, actual)  # type: ignore[arg-type]
            scored += 1
        for p, value in zip(predictors, actual):
            p.add_data_point(value)
    return total / scored if scored else math.inf


def evaluate_entry(
    entry: str | dict[str, Any],
    windows: Windows,
    warmup: int,
    *,
    factory: PredictorFactory = make_predictor,
    cache: dict | None = None,
) -> float:
    """Mean loss of one candidate entry on `windows` (three fresh predictors)."""
    fields = predictor_fields(entry)
    triple = tuple(factory(fields, windows.interval_s, cache) for _ in range(3))
    return evaluate_predictors(triple, windows, warmup)  # type: ignore[arg-type]


def throughput_intervals(policies: Iterable[str | dict[str, Any]]) -> list[int | float]:
    """Sorted distinct throughput intervals among policies that enable throughput scaling."""
    found: set[int | float] = set()
    for entry in policies:
        policy = expand_scaling_policy(entry)
        interval = policy.get("throughput_adjustment_interval_seconds")
        if policy.get("enable_throughput_scaling") and interval is not None:
            found.add(_interval_key(interval))
    return sorted(found)


def _windows_for(traffic: Any, interval: int | float) -> Windows:
    if isinstance(traffic, Mapping):
        found = traffic.get(interval, traffic.get(str(interval)))
        if found is None:
            raise ValueError(f"load-predictor sweep: no windows given for interval {interval}s")
        return found if isinstance(found, Windows) else Windows.from_rows(list(found), float(interval))
    return build_windows(traffic.timestamp_ms, traffic.input_length, traffic.output_length, float(interval))


def sweep_load_predictor(
    policies: Iterable[str | dict[str, Any]],
    candidates: list[str | dict[str, Any]],
    traffic: "TraceArrays | Mapping[Any, Windows] | None",
    *,
    is_trace: bool,
    factory: PredictorFactory = make_predictor,
    memoize: bool = True,
    on_progress: Callable[[str], None] | None = None,
) -> LoadPredictorResult:
    """Pick the forecaster per throughput interval: windows per interval, one-step-ahead loss, best mean.

    policies: the kept `planner_scaling_policy` entries; candidates: `load_predictor_candidates`;
    traffic: trace arrays (windows are built per interval) or ready windows keyed by interval;
    is_trace: False for a synthetic workload (no series to learn from -> `constant_last`).
    A candidate that raises while forecasting scores +inf (disqualified); an unknown family in a
    candidate raises ValueError. `memoize` shares deterministic Prophet fits between candidates.
    """
    fields = [predictor_fields(entry) for entry in candidates]  # fail fast on a bad family
    labels = [entry_label(entry, i) for i, entry in enumerate(candidates)]
    intervals = throughput_intervals(policies)
    if not intervals:
        return LoadPredictorResult({}, {}, "no_throughput_scaling_candidate")
    if not is_trace:
        return LoadPredictorResult({iv: FALLBACK_ENTRY for iv in intervals}, {}, "static_workload_constant")
    if traffic is None:
        raise ValueError("load-predictor sweep: a trace workload needs its trace arrays or windows")
    warmup = max((minimum_points(f) for f in fields), default=1)
    cache: dict | None = {} if memoize else None
    best: dict[int | float, str | dict[str, Any]] = {}
    losses: dict[int | float, dict[str, float]] = {}
    no_winner: list[int | float] = []
    for interval in intervals:
        windows = _windows_for(traffic, interval)
        if on_progress:
            on_progress(f"load-predictor @ {interval}s ({len(windows)} windows, warmup {warmup})")
        row: dict[str, float] = {}
        for entry, label in zip(candidates, labels):
            try:
                loss = evaluate_entry(entry, windows, warmup, factory=factory, cache=cache)
            except Exception as exc:  # noqa: BLE001 - a failing forecaster is disqualified, not fatal
                if on_progress:
                    on_progress(f"load-predictor @ {interval}s: {label} disqualified ({type(exc).__name__}: {exc})")
                loss = math.inf
            row[label] = loss
            if on_progress:
                on_progress(f"load-predictor @ {interval}s: {label} loss {loss:.4f}")
        losses[interval] = row
        winner_index = None
        for i, label in enumerate(labels):
            if math.isfinite(row[label]) and (winner_index is None or row[label] < row[labels[winner_index]]):
                winner_index = i
        if winner_index is None:
            best[interval] = FALLBACK_ENTRY
            no_winner.append(interval)
        else:
            entry = candidates[winner_index]
            best[interval] = dict(entry) if isinstance(entry, dict) else entry
    reason = "swept"
    if no_winner:
        reason += f"; no_winner_fallback_constant_last@{no_winner}"
    return LoadPredictorResult(best, losses, reason)
