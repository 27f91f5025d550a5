"""Fitting corrections on calibration-split records (fidelity/records.py); held-out rows are refused.

Per phase (TTFT and TPOT are fitted independently, `PhaseMethod`):

* a row's residual is r = ln(silicon / (replayed + a)): replayed on the phase's basis (the benchmark-client
  replay or the sweep's own), a the phase's overhead for the row's backend (0 without one);
* a load slope b: the Theil-Sen (median pairwise) slope of r over x = log2(concurrency per engine), on all
  rows of the phase; the applied term is s b (x - anchor), s = `slope_shrink`, anchor = the rows' median x
  when `centred` (else 0); the offsets are fitted on r - b (x - anchor);
* offsets (unless `offsets` is off: factor 1): per phase the median over architectures of per-architecture
  medians; per (backend, phase) and per (system, backend, phase) the same, shrunk towards the parent:
  m = (n x median + K x parent) / (n + K), K = SHRINK_K, n = architectures in the slice (records.architecture).
  Medians are robust to rows where the replay is far off, one vote per architecture keeps the one with most rows
  from setting a slice, and the shrinkage keeps a slice with two rows from swinging. Nothing is fitted per
  model, so a model the profile never saw is corrected by factors it never influenced;
* an overhead (with `overhead_grid`): a in ms per backend, the grid value with the lowest
  leave-one-architecture-out score (`balanced_score`) on that backend's rows, backends in order, ties to the
  smaller.

`fit` applies one method to every entry, with bands (bands.py) from leave-one-architecture-out residuals; the
shipped profile chooses a method per entry (fidelity/transfer.py).
"""

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from spica_pipeline.fidelity.apply import factor_at, load_x
from spica_pipeline.fidelity.bands import BandMethod, Pool, band, few_rows_widen, weighted_quantile
from spica_pipeline.fidelity.profile import (
    FALLBACK_WIDEN,
    FORMAT,
    LOAD,
    PHASES,
    PLAIN_FORMAT,
    SWEEP_FALLBACK,
    ProfileError,
)
from spica_pipeline.fidelity.records import architecture, engine_concurrency, residual

SHRINK_K = 3.0
# the per-decode-step costs (ms) a TPOT overhead is chosen from, 0 first (no overhead)
TPOT_OVERHEAD_GRID_MS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0)
# a phase's score, the distance to the accuracy targets in target units: MdAPE / target + P90 / target (lower is
# better)
SCORE_TARGETS = {"ttft": (0.20, 0.50), "tpot": (0.10, 0.50)}


@dataclass(frozen=True)
class PhaseMethod:
    """How one phase is fitted (the module docstring): the replay it corrects, the load term, whether it has
    multiplicative offsets, the overheads it may choose from, and how its bands are pooled."""

    replay: str = "client"
    slope_shrink: float = 0.0
    centred: bool = False
    offsets: bool = True
    overhead_grid: tuple[float, ...] = ()
    band: BandMethod = field(default_factory=BandMethod)

    def label(self) -> str:
        corr = f"s={self.slope_shrink:g}{' centred' if self.centred else ''}" if self.offsets else "factor 1"
        over = f", + an overhead per backend from {list(self.overhead_grid)} ms" if self.overhead_grid else ""
        return (f"{self.replay} replay, {corr}{over}; band {self.band.level} pool, architecture-balanced, "
                f"x{self.band.spread:g}")


@dataclass(frozen=True)
class Method:
    name: str
    ttft: PhaseMethod
    tpot: PhaseMethod

    def phase(self, phase: str) -> PhaseMethod:
        return self.ttft if phase == "ttft" else self.tpot

    def on_sweep(self) -> "Method":
        """The same method on the sweep's own replay (a client profile's sweep_fallback)."""
        return Method(f"{self.name}-sweep", replace(self.ttft, replay="sweep"), replace(self.tpot, replay="sweep"))

    def describe(self) -> str:
        return (f"{self.name} (TTFT: {self.ttft.label()}; TPOT: {self.tpot.label()}): r = ln(silicon / (replayed + "
                "overhead)); per phase a Theil-Sen slope b of r on x = log2(concurrency per engine), applied as "
                "s b (x - anchor); offsets per (system, backend, phase) = median over architectures of per-architecture "
                f"medians of the detrended r, shrunk to (backend, phase) then (phase) with K={SHRINK_K:g} "
                "pseudo-architectures; overhead per backend by leave-one-architecture-out score; band = "
                "architecture-balanced P10-P90 of leave-one-architecture-out calibrated residuals in the pool, x "
                "spread around its median, widened "
                f"sqrt(1 + K/n); a backend or phase entry's band x{FALLBACK_WIDEN:g}")


Overheads = dict[tuple[str, str], float]  # (backend, phase) -> ms


def target_score(mdape: float, p90: float, phase: str) -> float:
    """SCORE_TARGETS' score: MdAPE / its target + P90 / its target."""
    t_md, t_p90 = SCORE_TARGETS[phase]
    return mdape / t_md + p90 / t_p90


def balanced_errors(held: Iterable[tuple[Mapping[str, Any], float]]) -> dict[str, Any]:
    """{mdape, p90, rows, architectures} of calibrated residuals ln(silicon / calibrated), each architecture
    weighing the same (weight 1 / its rows): how far off a model the correction never saw is, not how far off the
    architecture with most rows is. Empty: mdape and p90 None."""
    apes, archs = [], []
    for x, res in held:
        apes.append(abs(math.exp(-res) - 1.0))
        archs.append(str(x["arch"]))
    if not apes:
        return {"mdape": None, "p90": None, "rows": 0, "architectures": 0}
    counts: dict[str, int] = defaultdict(int)
    for a in archs:
        counts[a] += 1
    weights = [1.0 / counts[a] for a in archs]
    return {"mdape": round(weighted_quantile(apes, weights, 0.5), 6),
            "p90": round(weighted_quantile(apes, weights, 0.9), 6), "rows": len(apes), "architectures": len(counts)}


def balanced_score(held: Iterable[tuple[Mapping[str, Any], float]], phase: str) -> float:
    """target_score of balanced_errors (inf without rows)."""
    e = balanced_errors(held)
    return math.inf if e["mdape"] is None else target_score(e["mdape"], e["p90"], phase)


# ---- one phase ---------------------------------------------------------------------------------------

def residual_rows(records: Iterable[Mapping[str, Any]], phase: str, pm: PhaseMethod,
                  overheads: Overheads) -> list[dict[str, Any]]:
    """{id, model, arch, system, backend, x, residual} of every record with both values of the phase positive."""
    out = []
    for r in records:
        res = residual(r, phase, pm.replay, overheads.get((str(r.get("backend")), phase), 0.0))
        if res is not None:
            out.append({"id": r["id"], "model": r.get("model"), "arch": architecture(r.get("model")),
                        "system": r["system"], "backend": r["backend"], "x": load_x(engine_concurrency(r, phase)),
                        "residual": res})
    return out


def theil_sen(xs: list[float], ys: list[float]) -> float:
    """Median of pairwise slopes (0 when x never varies): robust to a few far-off rows."""
    slopes = [(ys[j] - ys[i]) / (xs[j] - xs[i]) for i in range(len(xs)) for j in range(i + 1, len(xs))
              if xs[j] != xs[i]]
    return statistics.median(slopes) if slopes else 0.0


def _vote_median(members: list[dict[str, Any]]) -> float:
    """Median over architectures of each architecture's median residual."""
    per: dict[Any, list[float]] = defaultdict(list)
    for m in members:
        per[m["arch"]].append(m["residual"])
    return statistics.median(statistics.median(v) for v in per.values())


def _shrunk(members: list[dict[str, Any]], parent: float) -> float:
    n = len({m["arch"] for m in members})  # evidence counts in architectures, not rows
    return (n * _vote_median(members) + SHRINK_K * parent) / (n + SHRINK_K)


def _load_term(rows: list[dict[str, Any]], pm: PhaseMethod) -> dict[str, Any]:
    """The phase's load term; detrends `rows` in place (the offsets are fitted on what the term leaves)."""
    b = theil_sen([r["x"] for r in rows], [r["residual"] for r in rows]) if pm.slope_shrink and pm.offsets else 0.0
    centre = statistics.median(r["x"] for r in rows)
    anchor = centre if pm.centred else 0.0
    for r in rows:
        r["residual"] -= b * (r["x"] - anchor)
    shrink = pm.slope_shrink if pm.offsets else 0.0
    return {"feature": LOAD, "fitted": round(b, 6), "coefficient": round(shrink * b, 6), "centre": round(centre, 6),
            "anchor": round(anchor, 6)}


def fit_phase(records: list[Mapping[str, Any]], phase: str, pm: PhaseMethod, overheads: Overheads) -> dict[str, Any]:
    """{terms, slices, backend, phase, rows_used} of one phase, without bands."""
    rows = residual_rows(records, phase, pm, overheads)
    if not rows:
        raise ProfileError(f"no calibration rows with replayed and measured {phase.upper()}")
    term = _load_term(rows, pm)
    by_backend: dict[str, list[dict[str, Any]]] = defaultdict(list)
    by_slice: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_backend[r["backend"]].append(r)
        by_slice[(r["system"], r["backend"])].append(r)
    phase_m = _vote_median(rows) if pm.offsets else 0.0
    backend_m = {b: _shrunk(v, phase_m) if pm.offsets else 0.0 for b, v in by_backend.items()}
    slices = {}
    for (system, backend), members in sorted(by_slice.items()):
        m = _shrunk(members, backend_m[backend]) if pm.offsets else 0.0
        slices[f"{system}/{backend}/{phase}"] = {"factor": round(math.exp(m), 6), "rows": len(members)}
    return {"terms": [term], "slices": slices,
            "backend": {f"{b}/{phase}": {"factor": round(math.exp(m), 6), "rows": len(by_backend[b])}
                        for b, m in sorted(backend_m.items())},
            "phase": {"factor": round(math.exp(phase_m), 6), "rows": len(rows)},
            "rows_used": {r["id"] for r in rows}}


def _as_profile(phase: str, part: Mapping[str, Any]) -> dict[str, Any]:
    """A one-phase fit in the profile's shape, enough for factor_at."""
    return {"terms": {phase: part["terms"]}, "slices": part["slices"], "backend": part["backend"],
            "phase": {phase: part["phase"]}}


def loao_residuals(records: list[Mapping[str, Any]], phase: str, pm: PhaseMethod, overheads: Overheads,
                   keep: Callable[[Mapping[str, Any]], bool] = lambda r: True,
                   ) -> Iterator[tuple[dict[str, Any], float]]:
    """(residual row, calibrated residual ln(silicon / (replayed x factor))) of every kept record, its factor
    fitted without the record's architecture; an architecture without kept records costs no fit."""
    for arch in sorted({architecture(r.get("model")) for r in records}):
        train = [r for r in records if architecture(r.get("model")) != arch]
        test = [r for r in records if architecture(r.get("model")) == arch and keep(r)]
        if not train or not test:
            continue
        sub = _as_profile(phase, fit_phase(train, phase, pm, overheads))
        for x in residual_rows(test, phase, pm, overheads):
            yield x, x["residual"] - math.log(factor_at(sub, x["system"], x["backend"], phase, x["x"])[0])


def loao_score(records: list[Mapping[str, Any]], phase: str, pm: PhaseMethod, overheads: Overheads,
               backend: str) -> float:
    """The phase's balanced_score on `backend`'s rows, each row calibrated by the phase fitted without the row's
    architecture."""
    return balanced_score(loao_residuals(records, phase, pm, overheads, lambda r: r.get("backend") == backend), phase)


def choose_overheads(records: list[Mapping[str, Any]], phase: str, pm: PhaseMethod) -> Overheads:
    """Per backend (sorted; the others at their chosen value, unchosen ones 0), the grid value with the lowest
    loao_score, ties to the smaller."""
    chosen: Overheads = {}
    for backend in sorted({str(r.get("backend")) for r in records}):
        scores = []
        for ms in pm.overhead_grid:
            chosen[(backend, phase)] = ms
            scores.append((loao_score(records, phase, pm, chosen, backend), ms))
        chosen[(backend, phase)] = min(scores)[1]
    return chosen


def _bands(part: dict[str, Any], calibrated: Iterable[tuple[dict[str, Any], float]], pm: PhaseMethod) -> None:
    """Each entry's band from the calibrated residuals (in place): a slice reads its level's pool widened for few
    rows, a backend or phase entry its own pool x FALLBACK_WIDEN."""
    by_slice: dict[tuple[str, str], Pool] = defaultdict(list)
    by_backend: dict[str, Pool] = defaultdict(list)
    pooled: Pool = []
    for x, res in calibrated:
        by_slice[(x["system"], x["backend"])].append((res, str(x["arch"])))
    for (system, backend), members in by_slice.items():
        by_backend[backend] += members
        pooled += members
    phase = next(iter(part["phase"]))
    for system, backend in by_slice:
        entry = part["slices"].get(f"{system}/{backend}/{phase}")
        if entry is None:
            continue
        pool = by_backend[backend] if pm.band.level == "backend" else pooled
        entry["band"] = band(pool, pm.band, few_rows_widen(pool, SHRINK_K))
        entry["band_from"] = pm.band.level
    for key, entry in part["backend"].items():
        entry["band"] = band(by_backend[key.split("/")[0]], pm.band, FALLBACK_WIDEN)
    part["phase"][phase]["band"] = band(pooled, pm.band, FALLBACK_WIDEN)


# ---- a profile ---------------------------------------------------------------------------------------

def calibration_only(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The records as a list, or ProfileError naming held-out rows: nothing is fitted or chosen on them."""
    records = list(records)
    held = sorted(str(r.get("id")) for r in records if r.get("split") != "calibration")
    if held:
        raise ProfileError(f"calibration may only use calibration-split rows; got held-out {held[:3]}")
    return records


def fit(records: Iterable[Mapping[str, Any]], *, fitted: str, source: str, method: Method,
        fallback: bool = True) -> dict[str, Any]:
    """A profile from calibration-split records, one method for every entry (every row's split is checked before
    anything is fitted).

    Bands come from leave-one-architecture-out residuals (in sample when the rows hold one architecture).
    fallback: with a client-replay phase, a sweep_fallback fitted the same way on the sweep's own replay."""
    records = calibration_only(records)
    profile: dict[str, Any] = {"format": PLAIN_FORMAT, "method": method.describe(), "method_name": method.name,
                               "fitted": fitted, "source": source, "terms": {}, "slices": {}, "backend": {},
                               "phase": {}, "replay": {}, "band_method": {}}
    rows_used: set[str] = set()
    overheads: Overheads = {}
    for phase in PHASES:
        pm = method.phase(phase)
        chosen = choose_overheads(records, phase, pm) if pm.overhead_grid else {}
        overheads.update(chosen)
        fitted_phase = fit_phase(records, phase, pm, chosen)
        rows_used |= fitted_phase["rows_used"]
        part = _as_profile(phase, fitted_phase)
        if len({architecture(r.get("model")) for r in records if r["id"] in fitted_phase["rows_used"]}) > 1:
            calibrated: Iterable[tuple[dict[str, Any], float]] = loao_residuals(records, phase, pm, chosen)
        else:
            calibrated = ((x, x["residual"] - math.log(factor_at(part, x["system"], x["backend"], phase, x["x"])[0]))
                          for x in residual_rows(records, phase, pm, chosen))
        _bands(part, calibrated, pm)
        for key in ("terms", "slices", "backend", "phase"):
            profile[key].update(part[key])
        profile["replay"][phase] = pm.replay
        profile["band_method"][phase] = pm.band.entry()
    profile["rows_used"] = sorted(rows_used)
    if overheads:
        profile["format"] = FORMAT
        profile["overhead_ms"] = {f"{b}/{p}": ms for (b, p), ms in sorted(overheads.items())}
    profile["slices"] = dict(sorted(profile["slices"].items()))
    if fallback and any(method.phase(p).replay == "client" for p in PHASES):
        profile[SWEEP_FALLBACK] = fit(records, fitted=fitted, source=source, method=method.on_sweep())
    return profile
