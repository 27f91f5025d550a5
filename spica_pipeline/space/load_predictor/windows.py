"""Trace -> fixed traffic windows: what the load predictors learn from.

Windows take plain arrays so the sub-sweep stays pure; reading the trace file is done elsewhere
(`spica_pipeline.space.load_predictor.from_trace`).
"""

from dataclasses import dataclass
from typing import Iterator

import numpy as np


@dataclass(frozen=True)
class Windows:
    """Per-window request count and mean ISL/OSL; empty windows inside the span hold zeros."""

    interval_s: float
    num_req: np.ndarray
    avg_isl: np.ndarray
    avg_osl: np.ndarray
    first_index: int = 0  # window index of the first row (floor(timestamp_ms / interval_ms))

    def __post_init__(self) -> None:
        n = len(self.num_req)
        if len(self.avg_isl) != n or len(self.avg_osl) != n:
            raise ValueError("windows: num_req, avg_isl and avg_osl must have the same length")

    def __len__(self) -> int:
        return len(self.num_req)

    def rows(self) -> Iterator[tuple[float, float, float]]:
        """(num_req, avg_isl, avg_osl) per window, in time order."""
        for n, i, o in zip(self.num_req, self.avg_isl, self.avg_osl):
            yield float(n), float(i), float(o)

    @classmethod
    def from_rows(cls, rows: list[tuple[float, float, float]], interval_s: float = 180.0) -> "Windows":
        """Build windows directly from (num_req, avg_isl, avg_osl) rows (tests, replayed traffic)."""
        arr = np.asarray(rows, dtype=float).reshape(-1, 3)
        return cls(float(interval_s), arr[:, 0].copy(), arr[:, 1].copy(), arr[:, 2].copy())


def build_windows(
    timestamp_ms: np.ndarray,
    input_length: np.ndarray,
    output_length: np.ndarray,
    interval_s: float,
) -> Windows:
    """Aggregate requests into `interval_s` windows, densified between the first and last active one.

    Window index = floor(timestamp_ms / (interval_s * 1000)); averages are 0 in an empty window.
    Raises ValueError for a non-positive interval, mismatched lengths, a non-finite timestamp or a
    negative / non-integer length (the trace reader reports file and line before this).
    """
    if not (interval_s > 0 and np.isfinite(interval_s)):
        raise ValueError(f"windows: interval_s must be a positive number, got {interval_s!r}")
    ts = np.asarray(timestamp_ms, dtype=float)
    isl = np.asarray(input_length)
    osl = np.asarray(output_length)
    if not (ts.ndim == isl.ndim == osl.ndim == 1 and len(ts) == len(isl) == len(osl)):
        raise ValueError("windows: timestamp_ms, input_length and output_length must be 1-D and equally long")
    if len(ts) == 0:
        return Windows(float(interval_s), np.zeros(0), np.zeros(0), np.zeros(0))
    bad = np.flatnonzero(~np.isfinite(ts))
    if bad.size:
        raise ValueError(f"windows: row {int(bad[0])} has a non-finite timestamp")
    for name, arr in (("input_length", isl), ("output_length", osl)):
        values = arr.astype(float)
        wrong = np.flatnonzero(~np.isfinite(values) | (values < 0) | (values != np.floor(values)))
        if wrong.size:
            raise ValueError(f"windows: row {int(wrong[0])} {name} must be an integer >= 0, got {arr[wrong[0]]!r}")
    index = np.floor(ts / (float(interval_s) * 1000.0)).astype(np.int64)
    first = int(index.min())
    slot = index - first
    size = int(slot.max()) + 1
    counts = np.bincount(slot, minlength=size).astype(float)
    isl_sum = np.bincount(slot, weights=isl.astype(float), minlength=size)
    osl_sum = np.bincount(slot, weights=osl.astype(float), minlength=size)
    with np.errstate(invalid="ignore", divide="ignore"):
        avg_isl = np.where(counts > 0, isl_sum / np.maximum(counts, 1), 0.0)
        avg_osl = np.where(counts > 0, osl_sum / np.maximum(counts, 1), 0.0)
    return Windows(float(interval_s), counts, avg_isl, avg_osl, first)
