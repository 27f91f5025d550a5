"""P10-P90 error bands: how far silicon fell from the calibrated value on rows like a candidate's.

A band is built from calibrated residuals ln(silicon / (replayed x factor)), each row scored by a profile fitted
without its own architecture (fit.loao_residuals, transfer.held_out: the profile is used on models it never saw).
The residuals are pooled per (backend, phase) or per phase (`BandMethod.level`); every architecture weighs the
same in the pool's quantiles (weight 1 / its rows there), so the one with most rows does not set the band; the
band's distance from the pool's median is scaled by `spread`. It reads: on calibration rows like this one, 80 % of silicon values fell in
[value x exp(lo), value x exp(hi)].
"""

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from spica_pipeline.fidelity.profile import BAND_LEVELS

Pool = list[tuple[float, str]]  # (calibrated residual, architecture)


@dataclass(frozen=True)
class BandMethod:
    """level: the pool a slice's band is read from (BAND_LEVELS); spread: the band's distance from the pool's
    median x this (1 = the pool's own model-balanced P10 and P90)."""

    level: str = "phase"
    spread: float = 1.0

    def __post_init__(self) -> None:
        if self.level not in BAND_LEVELS:
            raise ValueError(f"band level {self.level!r} is not one of {list(BAND_LEVELS)}")

    def entry(self) -> dict[str, Any]:
        """The profile's band_method entry for a phase (provenance: lookups read only the bands)."""
        return {"level": self.level, "balanced": True, "spread": self.spread}


def weighted_quantile(values: list[float], weights: list[float], q: float) -> float:
    """Quantile of weighted values: each value sits at the midpoint of its cumulative weight, linear between them
    (equal weights give measurement.quantile's rule on n >= 2 values up to the ends)."""
    pairs = sorted(zip(values, weights))
    total = sum(w for _, w in pairs)
    pos, acc = [], 0.0
    for _, w in pairs:
        pos.append((acc + w / 2) / total)
        acc += w
    if q <= pos[0]:
        return pairs[0][0]
    for i in range(1, len(pairs)):
        if q <= pos[i]:
            t = (q - pos[i - 1]) / (pos[i] - pos[i - 1]) if pos[i] > pos[i - 1] else 0.0
            return pairs[i - 1][0] + t * (pairs[i][0] - pairs[i - 1][0])
    return pairs[-1][0]


def pool_band(pool: Pool, bm: BandMethod) -> tuple[float, float]:
    """(P10, P90) of a pool under a band method, model-balanced, before any widening."""
    values = [v for v, _ in pool]
    counts: dict[str, int] = defaultdict(int)
    for _, m in pool:
        counts[m] += 1
    weights = [1.0 / counts[m] for _, m in pool]
    lo, mid, hi = (weighted_quantile(values, weights, q) for q in (0.1, 0.5, 0.9))
    if bm.spread != 1.0:
        lo, hi = mid + bm.spread * (lo - mid), mid + bm.spread * (hi - mid)
    return lo, hi


def band(pool: Pool, bm: BandMethod, widen: float) -> list[float]:
    """A profile entry's band: the pool's band x `widen`, rounded ([-1, 1] for an empty pool)."""
    if not pool:
        return [-1.0, 1.0]
    lo, hi = pool_band(pool, bm)
    return [round(lo * widen, 6), round(hi * widen, 6)]


def few_rows_widen(pool: Pool, shrink_k: float) -> float:
    """sqrt(1 + K / n): a pool of few rows says less about the next model than its own spread."""
    return math.sqrt(1 + shrink_k / len(pool))
