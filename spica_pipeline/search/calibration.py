"""Calibration profiles and error bands: the replay's TTFT/TPOT against real GPU measurements.

Method (fitted by `bench/bench_fidelity.py --fit-calibration`, calibration split only):

* A row's residual is r = ln(silicon / replayed) for its mean TTFT and mean TPOT.
* Residuals trend with load (TTFT: x1.5 at c <= 16, x2.5 at c 32-64, x6 at 256 on the calibration
  sample; what a steady-state step model misses is queueing and burstiness in real clients), so
  each phase first gets one load slope b: the Theil-Sen (median pairwise) slope of r over
  log2(concurrency per engine), fitted on all calibration rows of that phase.
* Then one multiplicative offset per (system, backend, phase): m = median of r - b x log2(c) of
  the slice, shrunk towards its parent (backend, phase), itself shrunk towards (phase):
  m = (n x median + K x parent) / (n + K), K = 3. The correction is exp(m) x c^b.
  Why this and not a richer regression: what remains after the measurement fixes is dominated by
  per-system/backend offsets (perf-database gaps, engine overheads the step model omits) and that
  one load trend; medians are robust to the rows where the model is far off, and shrinkage keeps a
  slice with two rows from swinging. Nothing is fitted per model, so held-out models are scored by
  factors they never influenced.
* A band is the P10-P90 of the calibrated residuals ln(silicon / (replayed x factor)) of the
  slice, each row scored by a profile fitted without its own model (leave-one-model-out: the
  profile is used on unseen models), its parent's when the slice has fewer than MIN_BAND_ROWS rows, widened by
  sqrt(1 + K / n) for few rows, and by FALLBACK_WIDEN when the slice had no rows at all.
  It reads: on calibration rows like this one, 80 % of silicon values fell in [value x lo, value x hi].

Pure: fitting works on bench records (dicts), applying on report dicts; files are read elsewhere.
"""

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from spica_pipeline.search.measurement import quantile

PROFILE_FORMAT = 1
PHASES = ("ttft", "tpot")
SHRINK_K = 3.0
MIN_BAND_ROWS = 5
FALLBACK_WIDEN = 1.5
METHOD = ("r = ln(silicon/replayed); per phase a Theil-Sen slope b of r on log2(concurrency per engine); per "
          "(system, backend, phase) m = median(r - b log2 c) shrunk to (backend, phase) then (phase) with K=3 "
          "pseudo-rows; m = median over models of per-model medians; correction exp(m) c^b; band = P10-P90 of "
          "leave-one-model-out calibrated residuals, widened sqrt(1+K/n), x1.5 for a slice without rows")

# report key -> (phase, exponent): calibrated = raw x factor**exponent
CALIBRATED_KEYS: dict[str, tuple[str, int]] = {
    "mean_ttft_ms": ("ttft", 1), "median_ttft_ms": ("ttft", 1), "p90_ttft_ms": ("ttft", 1),
    "mean_tpot_ms": ("tpot", 1), "median_tpot_ms": ("tpot", 1), "p90_tpot_ms": ("tpot", 1),
    "mean_itl_ms": ("tpot", 1), "p90_itl_ms": ("tpot", 1),
    "mean_output_token_throughput_per_user": ("tpot", -1),
}
# goal metric -> the phase whose band bounds it and the direction it moves (time-like +1, rate-like -1)
GOAL_PHASE: dict[str, tuple[str, int]] = {
    "throughput": ("tpot", -1), "throughput_per_gpu": ("tpot", -1), "throughput_per_user": ("tpot", -1),
    "goodput": ("tpot", -1), "goodput_per_gpu": ("tpot", -1), "min_gpus": ("tpot", -1),
    "e2e_latency": ("tpot", 1),
}


# what a calibrated report adds (copied into Candidate.metrics so tables and deploy output see it)
REPORT_KEYS: tuple[str, ...] = (
    *(f"calibrated_{k}" for k in CALIBRATED_KEYS),
    *(f"{stem}_{p}{tail}" for p in PHASES for stem, tail in (("band", "_lo"), ("band", "_hi"), ("band", "_rows"),
                                                              ("calibration_factor", ""))),
    "calibration_fallback",
)


def bands(metrics: Mapping[str, Any], goal_metric: str | None = None,
          goal_value: float | None = None) -> dict[str, tuple[float, float]]:
    """P10-P90 ranges of calibrated mean TTFT, mean TPOT and (when given) the goal value."""
    out: dict[str, tuple[float, float]] = {}
    for phase, key in (("ttft", "calibrated_mean_ttft_ms"), ("tpot", "calibrated_mean_tpot_ms")):
        v, lo, hi = metrics.get(key), metrics.get(f"band_{phase}_lo"), metrics.get(f"band_{phase}_hi")
        if v is not None and lo is not None and hi is not None:
            out[f"{phase}_ms"] = (v * lo, v * hi)
    if goal_metric is not None:
        band = goal_band(metrics, goal_metric, goal_value)
        if band is not None:
            out["goal"] = band
    return out


class ProfileError(ValueError):
    """A calibration profile that is not a valid profile (the caller names the file)."""


def _model_median(members: list[dict[str, Any]]) -> float:
    """Median over models of each model's median residual: a model with many rows (MiniMax-M2.5 is
    over half of the calibration sample) cannot set a slice's correction for the others."""
    per: dict[Any, list[float]] = defaultdict(list)
    for m in members:
        per[m.get("model")].append(m["residual"])
    return statistics.median(statistics.median(v) for v in per.values())


def _shrunk(members: list[dict[str, Any]], parent: float) -> float:
    if not members:
        return parent
    n = len({m.get("model") for m in members})  # evidence counts in models, not rows
    return (n * _model_median(members) + SHRINK_K * parent) / (n + SHRINK_K)


def load_x(concurrency_per_engine: float | None) -> float:
    """The load coordinate of the slope: log2 of concurrency per engine (1 when unknown)."""
    c = concurrency_per_engine if concurrency_per_engine and concurrency_per_engine > 0 else 1.0
    return math.log2(max(1.0, float(c)))


def engine_concurrency(record: Mapping[str, Any], phase: str) -> float:
    """A bench record's concurrency per engine of the role that serves the phase."""
    shape = record.get("shape") or {}
    role = "agg" if "agg" in shape else ("prefill" if phase == "ttft" else "decode")
    workers = (shape.get(role) or {}).get("workers") or 1
    return float(record.get("concurrency") or 1) / float(workers)


def residual_rows(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Bench records -> {id, system, backend, phase, x, residual} for rows with both numbers positive."""
    out = []
    for r in records:
        ours, silicon = r.get("ours") or {}, r.get("silicon") or {}
        for phase in PHASES:
            o, s = ours.get(phase), silicon.get(phase)
            if o and s and o > 0 and s > 0 and math.isfinite(o) and math.isfinite(s):
                out.append({"id": r["id"], "model": r.get("model"), "system": r["system"], "backend": r["backend"],
                            "phase": phase,
                            "split": r.get("split"), "x": load_x(engine_concurrency(r, phase)),
                            "residual": math.log(s / o)})
    return out


def theil_sen(xs: list[float], ys: list[float]) -> float:
    """Median of pairwise slopes (0 when x never varies): robust to a few far-off rows."""
    slopes = [(ys[j] - ys[i]) / (xs[j] - xs[i]) for i in range(len(xs)) for j in range(i + 1, len(xs))
              if xs[j] != xs[i]]
    return statistics.median(slopes) if slopes else 0.0


def fit(records: Iterable[Mapping[str, Any]], *, fitted: str, source: str, lomo_bands: bool = True) -> dict[str, Any]:
    """A profile (JSON-able) from calibration-split bench records; refuses held-out rows.

    lomo_bands: bands from leave-one-model-out residuals (each row scored by a profile fitted
    without its model), because the profile is used on models it never saw; in-sample residuals
    covered only 58 % (TTFT) / 42 % (TPOT) of unseen-model rows with a nominal 80 % band.
    """
    records = list(records)
    rows = residual_rows(records)
    held = sorted({r["id"] for r in rows if r["split"] != "calibration"})
    if held:
        raise ProfileError(f"calibration may only use calibration-split rows; got held-out {held[:3]}")
    if not rows:
        raise ProfileError("no calibration rows with replayed and measured TTFT/TPOT")
    slopes = {}
    for phase in PHASES:
        members = [r for r in rows if r["phase"] == phase]
        slopes[phase] = theil_sen([r["x"] for r in members], [r["residual"] for r in members])
    for r in rows:  # offsets are fitted on the load-detrended residuals
        r["residual"] -= slopes[r["phase"]] * r["x"]
    by_phase: dict[str, list[dict[str, Any]]] = defaultdict(list)
    by_backend: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    by_slice: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_phase[r["phase"]].append(r)
        by_backend[(r["backend"], r["phase"])].append(r)
        by_slice[(r["system"], r["backend"], r["phase"])].append(r)
    phase_m = {p: _model_median(v) for p, v in by_phase.items()}
    backend_m = {k: _shrunk(v, phase_m[k[1]]) for k, v in by_backend.items()}
    slices: dict[str, Any] = {}
    for (system, backend, phase), members in sorted(by_slice.items()):
        m = _shrunk(members, backend_m[(backend, phase)])
        slices[f"{system}/{backend}/{phase}"] = {"factor": round(math.exp(m), 6), "rows": len(members)}
    # bands from calibrated residuals (each row corrected by its own slice's factor, or by a
    # profile fitted without the row's model)
    calibrated: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    models = sorted({str(r.get("model")) for r in rows})
    if lomo_bands and len(models) > 1:
        for model in models:
            sub = fit([r for r in records if str(r.get("model")) != model], fitted=fitted, source=source,
                      lomo_bands=False)
            for x in residual_rows(r for r in records if str(r.get("model")) == model):
                f = lookup(sub, x["system"], x["backend"], x["phase"], 2 ** x["x"])["factor"]
                calibrated[(x["system"], x["backend"], x["phase"])].append(x["residual"] - math.log(f))
    else:
        for (system, backend, phase), members in by_slice.items():
            log_f = math.log(slices[f"{system}/{backend}/{phase}"]["factor"])
            calibrated[(system, backend, phase)] = [x["residual"] - log_f for x in members]
    backend_res: dict[tuple[str, str], list[float]] = defaultdict(list)
    phase_res: dict[str, list[float]] = defaultdict(list)
    for (system, backend, phase), res in calibrated.items():
        backend_res[(backend, phase)] += res
        phase_res[phase] += res
    for (system, backend, phase), res in calibrated.items():
        entry = slices[f"{system}/{backend}/{phase}"]
        pool, source_rows = res, "slice"
        if len(pool) < MIN_BAND_ROWS:
            pool, source_rows = backend_res[(backend, phase)], "backend"
        if len(pool) < MIN_BAND_ROWS:
            pool, source_rows = phase_res[phase], "phase"
        widen = math.sqrt(1 + SHRINK_K / len(res))
        entry["band"] = [round(quantile(pool, 0.1) * widen, 6), round(quantile(pool, 0.9) * widen, 6)]
        entry["band_from"] = source_rows
    parents = {
        "backend": {f"{b}/{p}": {"factor": round(math.exp(m), 6), "rows": len(by_backend[(b, p)]),
                                 "band": _band(backend_res[(b, p)], FALLBACK_WIDEN)}
                    for (b, p), m in sorted(backend_m.items())},
        "phase": {p: {"factor": round(math.exp(m), 6), "rows": len(by_phase[p]),
                      "band": _band(phase_res[p], FALLBACK_WIDEN)} for p, m in sorted(phase_m.items())},
    }
    return {
        "format": PROFILE_FORMAT, "method": METHOD, "fitted": fitted, "source": source,
        "rows_used": sorted({r["id"] for r in rows}), "load_slope": {p: round(b, 6) for p, b in slopes.items()},
        "slices": slices, **parents,
    }


def _band(res: list[float], widen: float) -> list[float]:
    if not res:
        return [-1.0, 1.0]
    return [round(quantile(res, 0.1) * widen, 6), round(quantile(res, 0.9) * widen, 6)]


def validate(profile: Any) -> dict[str, Any]:
    """Raise ProfileError unless `profile` is a usable profile of this format."""
    if not isinstance(profile, dict):
        raise ProfileError("not a JSON object")
    if profile.get("format") != PROFILE_FORMAT:
        raise ProfileError(f"format {profile.get('format')!r} is not {PROFILE_FORMAT}")
    for key in ("slices", "backend", "phase", "rows_used", "method", "fitted", "load_slope"):
        if key not in profile:
            raise ProfileError(f"missing key {key!r}")
    for section in ("slices", "backend", "phase"):
        for name, entry in profile[section].items():
            f = entry.get("factor") if isinstance(entry, dict) else None
            band = entry.get("band") if isinstance(entry, dict) else None
            if not isinstance(f, (int, float)) or not math.isfinite(f) or f <= 0:
                raise ProfileError(f"{section}.{name}.factor must be a positive number, got {f!r}")
            if (not isinstance(band, list) or len(band) != 2
                    or not all(isinstance(x, (int, float)) and math.isfinite(x) for x in band) or band[0] > band[1]):
                raise ProfileError(f"{section}.{name}.band must be [lo, hi] with lo <= hi, got {band!r}")
    if set(profile["phase"]) != set(PHASES):
        raise ProfileError(f"phase must cover {list(PHASES)}")
    for phase in PHASES:
        b = profile["load_slope"].get(phase) if isinstance(profile["load_slope"], dict) else None
        if not isinstance(b, (int, float)) or not math.isfinite(b):
            raise ProfileError(f"load_slope.{phase} must be a number, got {b!r}")
    return profile


def lookup(profile: Mapping[str, Any], system: str, backend: str, phase: str,
           concurrency_per_engine: float | None = None) -> dict[str, Any]:
    """{factor, band: [lo, hi] (log), rows, source}: the slice, else its backend, else the phase."""
    load = math.exp(profile["load_slope"][phase] * math.log(2) * load_x(concurrency_per_engine))
    entry = profile["slices"].get(f"{system}/{backend}/{phase}")
    if entry is not None:
        return {"factor": entry["factor"] * load, "band": list(entry["band"]), "rows": entry["rows"],
                "source": "slice"}
    parent = profile["backend"].get(f"{backend}/{phase}")
    source = "backend"
    if parent is None:
        parent, source = profile["phase"][phase], "phase"
    lo, hi = parent["band"]
    return {"factor": parent["factor"] * load, "band": [lo * FALLBACK_WIDEN, hi * FALLBACK_WIDEN], "rows": 0,
            "source": f"fallback:{source}"}


def calibrate(report: Mapping[str, Any], profile: Mapping[str, Any], *, system: str, backend: str,
              concurrency: Mapping[str, float] | float | None = None, extra_widen: float = 1.0) -> dict[str, Any]:
    """`calibrated_<key>` for every calibrated key present, and `band_<phase>_lo/hi` multipliers.

    concurrency: per-engine concurrency, one number or {"ttft": prefill-side, "tpot": decode-side}.
    A disagg candidate's TTFT is prefill-bound and its TPOT decode-bound; both use the
    (system, backend) slices (the measured rows have no finer split). `extra_widen` > 1 widens the
    bands further (e.g. a fidelity fallback was used for this candidate).
    """
    out: dict[str, Any] = {}
    per_phase = concurrency if isinstance(concurrency, Mapping) else {p: concurrency for p in PHASES}
    looked = {p: lookup(profile, system, backend, p, per_phase.get(p)) for p in PHASES}
    for key, (phase, exponent) in CALIBRATED_KEYS.items():
        v = report.get(key)
        if isinstance(v, (int, float)) and math.isfinite(v):
            out[f"calibrated_{key}"] = float(v) * looked[phase]["factor"] ** exponent
    for phase, info in looked.items():
        lo, hi = info["band"]
        out[f"calibration_factor_{phase}"] = info["factor"]
        out[f"band_{phase}_lo"] = math.exp(lo * extra_widen)
        out[f"band_{phase}_hi"] = math.exp(hi * extra_widen)
        out[f"band_{phase}_rows"] = float(info["rows"])
    out["calibration_fallback"] = float(any(i["source"] != "slice" for i in looked.values()))
    return out


def goal_band(report: Mapping[str, Any], goal_metric: str, value: float | None) -> tuple[float, float] | None:
    """P10-P90 range for a goal metric's value from the band of the phase that bounds it."""
    if value is None or not math.isfinite(value) or goal_metric not in GOAL_PHASE:
        return None
    phase, direction = GOAL_PHASE[goal_metric]
    lo, hi = report.get(f"band_{phase}_lo"), report.get(f"band_{phase}_hi")
    if lo is None or hi is None:
        return None
    if direction > 0:
        return (value * lo, value * hi)
    return (value / hi, value / lo)
