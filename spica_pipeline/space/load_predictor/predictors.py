"""Load predictors: constant, ARIMA, Prophet and a local-linear-trend Kalman filter.

Our own implementation with the semantics of the Dynamo Planner's predictors (whose package cannot
be imported here). Every predictor forecasts one series (request count, ISL or OSL) one interval
ahead: NaN counts as 0, leading zeros (an idle start) are skipped, and before any data the last
value is 0. Forecasts are never negative.

ARIMA (pmdarima / statsmodels) and Prophet (cmdstan) run quietly and with BLAS pinned to one
thread: on this 2-core host, multi-threaded BLAS made a 20-point auto-ARIMA ~30x slower.
"""

import contextlib
import logging
import math
import warnings
from typing import Any, Iterator, Protocol

import numpy as np

from spica_pipeline.config.presets import (
    FAMILY_DEFAULTS,
    LOAD_PREDICTOR_PRESETS,
    PREDICTOR_FAMILIES,
    expand_load_predictor,
)

FAMILIES = PREDICTOR_FAMILIES
FAMILY_ERROR = f"load_predictor must be one of [{', '.join(PREDICTOR_FAMILIES)}]"


def entry_label(entry: str | dict[str, Any], index: int) -> str:
    """The preset id, or `custom_<index>` for a dict entry (its position in the candidate list)."""
    return entry if isinstance(entry, str) else f"custom_{index}"


def predictor_fields(entry: str | dict[str, Any]) -> dict[str, Any]:
    """Expand a candidate to `load_predictor`, `load_predictor_log1p` and only its family's knobs.

    Family defaults fill the gaps; an unknown preset or family raises ValueError.
    """
    if not isinstance(entry, (str, dict)):
        raise ValueError(f"load_predictor_candidates entry {entry!r} must be a preset id or a dict")
    return expand_load_predictor(entry)


def minimum_points(fields: dict[str, Any]) -> int:
    """How many points a family needs before it forecasts anything but the last value."""
    family = fields["load_predictor"]
    if family == "kalman":
        return max(1, int(fields.get("kalman_min_points", FAMILY_DEFAULTS["kalman"]["kalman_min_points"])))
    return 1 if family == "constant" else 5


class TrafficPredictor(Protocol):
    minimum_data_points: int

    def add_data_point(self, value: float) -> None: ...

    def predict_next(self) -> float: ...

    def get_last_value(self) -> float: ...


def _silence_loggers() -> None:
    """Prophet's import installs an INFO handler on cmdstanpy; lower both after any import."""
    for name in ("cmdstanpy", "prophet", "prophet.plot", "pmdarima"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


@contextlib.contextmanager
def quiet_numerics() -> Iterator[None]:
    """Silence statsmodels/pmdarima/prophet warnings and pin BLAS/OpenMP to one thread."""
    from threadpoolctl import threadpool_limits

    _silence_loggers()
    with warnings.catch_warnings(), threadpool_limits(limits=1), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        yield


class BasePredictor:
    """Shared buffer semantics: NaN -> 0, leading zeros skipped, last value 0 before any data."""

    minimum_data_points = 1

    def __init__(self, log1p: bool = False) -> None:
        self.log1p = bool(log1p)
        self.data: list[float] = []

    def add_data_point(self, value: float) -> None:
        v = float(value)
        if not math.isfinite(v):
            v = 0.0
        if not self.data and v == 0.0:
            return  # still idle: the series starts at the first non-zero value
        self.data.append(v)
        self._observed(v)

    def _observed(self, value: float) -> None:
        """Hook for stateful predictors."""

    def get_last_value(self) -> float:
        return self.data[-1] if self.data else 0.0

    def _to_space(self, values: Any) -> np.ndarray:
        arr = np.asarray(values, dtype=float)
        return np.log1p(np.maximum(arr, 0.0)) if self.log1p else arr

    def _from_space(self, value: float) -> float:
        v = float(np.expm1(value)) if self.log1p else float(value)
        if not math.isfinite(v):
            return self.get_last_value()
        return max(0.0, v)

    def predict_next(self) -> float:
        raise NotImplementedError


class ConstantPredictor(BasePredictor):
    """Next = last value."""

    def predict_next(self) -> float:
        return max(0.0, self.get_last_value())


class ArimaPredictor(BasePredictor):
    """pmdarima auto-ARIMA fitted once at `minimum_data_points`, then updated with each new point.

    Raw mode refits in log1p space when the raw fit collapses to (p, q) = (0, 0); any fitting
    error falls back to the last value.
    """

    minimum_data_points = 5

    def __init__(self, log1p: bool = False) -> None:
        super().__init__(log1p)
        self.model: Any = None
        self.space_log1p = self.log1p
        self.n_fitted = 0

    def _space(self, values: Any) -> np.ndarray:
        arr = np.asarray(values, dtype=float)
        return np.log1p(np.maximum(arr, 0.0)) if self.space_log1p else arr

    def predict_next(self) -> float:
        if len(self.data) < self.minimum_data_points:
            return max(0.0, self.get_last_value())
        if self.model is None and len(set(self.data)) == 1:
            return max(0.0, self.data[0])
        try:
            with quiet_numerics():
                import pmdarima

                if self.model is None:
                    self.model = pmdarima.auto_arima(self._space(self.data), error_action="ignore",
                                                     suppress_warnings=True)
                    p, _, q = self.model.order
                    if not self.space_log1p and p == 0 and q == 0:
                        self.space_log1p = True
                        self.model = pmdarima.auto_arima(self._space(self.data), error_action="ignore",
                                                         suppress_warnings=True)
                    self.n_fitted = len(self.data)
                elif len(self.data) > self.n_fitted:
                    self.model.update(self._space(self.data[self.n_fitted:]))
                    self.n_fitted = len(self.data)
                forecast = float(np.asarray(self.model.predict(n_periods=1))[0])
        except Exception:  # noqa: BLE001 - upstream semantics: a failed fit forecasts the last value
            return max(0.0, self.get_last_value())
        v = float(np.expm1(forecast)) if self.space_log1p else forecast
        return max(0.0, v) if math.isfinite(v) else max(0.0, self.get_last_value())


class ProphetPredictor(BasePredictor):
    """Prophet refitted on the last `window_size` points at every forecast (synthetic timestamps
    one interval apart; no seasonality, no uncertainty sampling: only the point forecast is used).

    `cache` (optional, shared across predictors of one sweep) memoises forecasts by (log1p, step,
    window values): a refit on identical inputs is deterministic, e.g. w20 and w50 share every fit
    while the history is at most 20 points long.
    """

    minimum_data_points = 5

    def __init__(self, log1p: bool = False, window_size: int = 50, interval_s: float = 180.0,
                 cache: dict | None = None) -> None:
        super().__init__(log1p)
        if int(window_size) < 1:
            raise ValueError(f"prophet_window_size must be a positive integer, got {window_size!r}")
        self.window_size = int(window_size)
        self.interval_s = float(interval_s)
        self.cache = cache

    def predict_next(self) -> float:
        if len(self.data) < self.minimum_data_points:
            return max(0.0, self.get_last_value())
        window = tuple(self.data[-self.window_size:])
        key = ("prophet", self.log1p, self.interval_s, window)
        if self.cache is not None and key in self.cache:
            return self.cache[key]
        with quiet_numerics():
            import pandas as pd
            from cmdstanpy.utils import get_logger
            from prophet import Prophet

            get_logger()  # its one-time setup lowers the level to DEBUG: run it before silencing
            _silence_loggers()
            start = pd.Timestamp("2000-01-01")
            step = pd.Timedelta(seconds=self.interval_s)
            ds = [start + k * step for k in range(len(window))]
            frame = pd.DataFrame({"ds": ds, "y": self._to_space(window)})
            model = Prophet(yearly_seasonality=False, weekly_seasonality=False, daily_seasonality=False,
                            uncertainty_samples=0)
            model.fit(frame)
            future = pd.DataFrame({"ds": [ds[-1] + step]})
            yhat = float(model.predict(future)["yhat"].iloc[0])
        value = self._from_space(yhat)
        if self.cache is not None:
            self.cache[key] = value
        return value


class KalmanPredictor(BasePredictor):
    """Local-linear-trend Kalman filter on [level, trend], numpy only.

    F = [[1, 1], [0, 1]], H = [1, 0], P0 = 1000 I, R = max(1e-9, r),
    Q = diag(max(1e-12, q_level), max(1e-12, q_trend)); initialised from the first observation.
    `predict_next` advances the filter once and caches the forecast; the next observation then
    skips its own predict step.
    """

    F = np.array([[1.0, 1.0], [0.0, 1.0]])
    H = np.array([[1.0, 0.0]])

    def __init__(self, log1p: bool = False, q_level: float = 1.0, q_trend: float = 0.1, r: float = 10.0,
                 min_points: int = 5) -> None:
        super().__init__(log1p)
        self.minimum_data_points = max(1, int(min_points))
        self.Q = np.diag([max(1e-12, float(q_level)), max(1e-12, float(q_trend))])
        self.R = max(1e-9, float(r))
        self.x: np.ndarray | None = None
        self.P = np.eye(2) * 1000.0
        self._advanced = False
        self._forecast: float | None = None

    def _advance(self) -> None:
        assert self.x is not None
        self.x = self.F @ self.x
        self.P = self.F @ self.P @ self.F.T + self.Q
        self._advanced = True

    def _observed(self, value: float) -> None:
        z = float(self._to_space(value))
        if self.x is None:
            self.x = np.array([z, 0.0])
            return
        if not self._advanced:
            self._advance()
        y = z - float((self.H @ self.x)[0])
        s = float((self.H @ self.P @ self.H.T)[0, 0]) + self.R
        k = (self.P @ self.H.T)[:, 0] / s
        self.x = self.x + k * y
        self.P = (np.eye(2) - np.outer(k, self.H[0])) @ self.P
        self._advanced = False
        self._forecast = None

    def predict_next(self) -> float:
        if self.x is None or len(self.data) < self.minimum_data_points:
            return max(0.0, self.get_last_value())
        if self._forecast is None:
            if not self._advanced:
                self._advance()
            self._forecast = self._from_space(float(self.x[0]))
        return self._forecast


def make_predictor(fields: dict[str, Any], interval_s: float, cache: dict | None = None) -> BasePredictor:
    """One predictor for one series from expanded fields (see `predictor_fields`)."""
    family = fields.get("load_predictor")
    log1p = bool(fields.get("load_predictor_log1p", False))
    if family == "constant":
        return ConstantPredictor(log1p)
    if family == "arima":
        return ArimaPredictor(log1p)
    if family == "prophet":
        return ProphetPredictor(log1p, int(fields.get("prophet_window_size", 50)), interval_s, cache)
    if family == "kalman":
        d = FAMILY_DEFAULTS["kalman"]
        return KalmanPredictor(
            log1p,
            fields.get("kalman_q_level", d["kalman_q_level"]),
            fields.get("kalman_q_trend", d["kalman_q_trend"]),
            fields.get("kalman_r", d["kalman_r"]),
            fields.get("kalman_min_points", d["kalman_min_points"]),
        )
    raise ValueError(f"{FAMILY_ERROR}, got {family!r}")
