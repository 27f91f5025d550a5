"""The shipped profile's method: each entry's correction chosen by its error on architectures it was not fitted on.

A profile entry is what a candidate reads for one phase: its (system, backend) slice, else its backend's entry,
else the phase's. For every entry the candidate corrections (CORRECTIONS, per phase CANDIDATES) are compared on
the entry's rows, each row corrected by the candidate fitted without the row's architecture (leave one
architecture out, records.architecture: the correction is judged as a model the profile never saw gets it):

* the score is fit.balanced_score: MdAPE / target + P90 / target (fit.SCORE_TARGETS) of those rows' errors, each
  architecture weighing the same;
* the entry takes the correction with the lowest score, ties to the earlier one in CANDIDATES, raw first: a
  correction is applied only where it transfers better than the raw replay;
* the entry's factor, load term and overhead are then the chosen correction fitted on every row (fit.fit_phase),
  and it records the choice, its leave-one-architecture-out errors and every candidate's score ("transfer");
* its band is drawn from the same leave-one-architecture-out residuals of the chosen corrections (BANDS), so a
  new architecture's band holds what it says.

Where the choice is made is CHOICE_LEVEL: per (backend, phase), every (system, backend) slice of the backend
taking its backend's correction (with its own fitted factor, and its own rows' errors recorded). A choice per
slice rests on one to three architectures' rows and transferred worse when the whole fit, choice included, was
left out by architecture on the calibration split (bench/bench_fidelity_ceiling.py, "methods" in
bench/results/fidelity_ceiling.json); per backend transferred best there.

Only calibration-split rows are read (fit.calibration_only). `fit_profile` writes the shipped profile: the
choice on the rows whose client replay drew spread lengths, its sweep_fallback (the same choice on the sweep's
own replay) and the fixed_lengths sub-profile (the same choice on the rows replayed with fixed lengths).
"""

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from spica_pipeline.fidelity.apply import factor_at
from spica_pipeline.fidelity.bands import BandMethod, Pool, band, few_rows_widen
from spica_pipeline.fidelity.fit import (
    SHRINK_K,
    TPOT_OVERHEAD_GRID_MS,
    Overheads,
    PhaseMethod,
    _as_profile,
    balanced_errors,
    balanced_score,
    calibration_only,
    choose_overheads,
    fit_phase,
    residual_rows,
)
from spica_pipeline.fidelity.own import OWN_BANDS, own_bands
from spica_pipeline.fidelity.profile import (
    FALLBACK_WIDEN,
    FIXED_LENGTHS,
    PHASES,
    SWEEP_FALLBACK,
    TRANSFER_FORMAT,
    ProfileError,
)
from spica_pipeline.fidelity.records import architecture, client_lengths

# The candidate corrections of a phase's entry, on the client replay (the sweep fallback: the same on the
# sweep's own replay), each with what it does (CORRECTION_LABELS)
CORRECTION_LABELS = {
    "raw": "the replayed value",
    "factor": "x the entry's offset (shrunk medians, one vote per architecture)",
    "factor+load": "the same with half the load slope, centred",
    "overhead": "+ a per-backend per-step cost (ms, chosen by leave-one-architecture-out score), no factor",
    "overhead+factor": "both",
}
CORRECTIONS: dict[str, PhaseMethod] = {
    "raw": PhaseMethod("client", offsets=False),
    "factor": PhaseMethod("client"),
    "factor+load": PhaseMethod("client", slope_shrink=0.5, centred=True),
    "overhead": PhaseMethod("client", offsets=False, overhead_grid=TPOT_OVERHEAD_GRID_MS),
    "overhead+factor": PhaseMethod("client", overhead_grid=TPOT_OVERHEAD_GRID_MS),
}
# per phase, in tie order: a per-step overhead is a decode cost, so TTFT does not take one
CANDIDATES: dict[str, tuple[str, ...]] = {
    "ttft": ("raw", "factor", "factor+load"),
    "tpot": ("raw", "factor", "factor+load", "overhead", "overhead+factor"),
}
# How an entry's band is pooled from the leave-one-architecture-out residuals of the chosen corrections: a slice
# reads the residuals of its backend's rows (each under its own slice's choice), a backend or phase entry those of
# its own rows under its own choice; the architecture-balanced P10 and P90, widened sqrt(1 + K / n) for n rows,
# a backend or phase entry's x FALLBACK_WIDEN when a candidate reads it.
BANDS = BandMethod("backend")
# where a correction is chosen (fit_phase_by_transfer's level); the module docstring says why per backend
LEVELS = ("slice", "backend", "phase")
CHOICE_LEVEL = "backend"

Held = tuple[dict[str, Any], float]  # (residual row, calibrated residual ln(silicon / corrected))


@dataclass(frozen=True)
class Fitted:
    """One candidate correction of one phase: fitted on every row (its entries), and left-one-architecture-out
    (each row's residual under the candidate fitted without the row's architecture, by row id)."""

    name: str
    part: dict[str, Any]
    overheads: Overheads
    held: dict[str, Held]


def with_replay(pm: PhaseMethod, replay: str) -> PhaseMethod:
    return replace(pm, replay=replay)


def _overheads(records: list[Mapping[str, Any]], phase: str, pm: PhaseMethod) -> Overheads:
    return choose_overheads(records, phase, pm) if pm.overhead_grid else {}


def held_out(records: list[Mapping[str, Any]], phase: str, pm: PhaseMethod) -> dict[str, Held]:
    """Each row's calibrated residual under `pm` fitted without the row's architecture (its overheads chosen
    without it too); rows of an architecture alone in `records` are corrected by nothing fitted (factor 1)."""
    out: dict[str, Held] = {}
    for arch in sorted({architecture(r.get("model")) for r in records}):
        train = [r for r in records if architecture(r.get("model")) != arch]
        test = [r for r in records if architecture(r.get("model")) == arch]
        overheads = _overheads(train, phase, pm) if train else {}
        sub = _as_profile(phase, fit_phase(train, phase, pm, overheads)) if residual_rows(train, phase, pm, {}) \
            else None
        for x in residual_rows(test, phase, pm, overheads):
            f = factor_at(sub, x["system"], x["backend"], phase, x["x"])[0] if sub is not None else 1.0
            out[x["id"]] = (x, x["residual"] - math.log(f))
    return out


def fit_candidate(records: list[Mapping[str, Any]], phase: str, name: str, replay: str) -> Fitted:
    pm = with_replay(CORRECTIONS[name], replay)
    overheads = _overheads(records, phase, pm)
    return Fitted(name, fit_phase(records, phase, pm, overheads), overheads, held_out(records, phase, pm))


def choose(fitted: Mapping[str, Fitted], phase: str, keep: Callable[[Mapping[str, Any]], bool],
           ) -> tuple[str, dict[str, Any]]:
    """(the candidate with the lowest balanced_score on the kept rows, ties to the earlier; {name: score})."""
    scores = {name: balanced_score([h for h in f.held.values() if keep(h[0])], phase) for name, f in fitted.items()}
    best = min(scores, key=lambda n: (scores[n], list(fitted).index(n)))
    return best, {n: (round(s, 6) if math.isfinite(s) else None) for n, s in scores.items()}


def _entry(f: Fitted, entry: Mapping[str, Any], phase: str, backend: str | None, scores: dict[str, Any],
           held: list[Held]) -> dict[str, Any]:
    """An entry of the profile: the chosen candidate's fitted factor and rows, its own load term and overhead,
    and what the choice rests on."""
    out = {"factor": entry["factor"], "rows": entry["rows"], "correction": f.name, "terms": f.part["terms"],
           "transfer": {**balanced_errors(held), "scores": scores}}
    if CORRECTIONS[f.name].overhead_grid:
        out["overhead_ms"] = f.overheads.get((backend, phase), 0.0) if backend else 0.0
    return out


def _pool(held: Iterable[Held]) -> Pool:
    return [(res, str(x["arch"])) for x, res in held]


def fit_phase_by_transfer(records: list[Mapping[str, Any]], phase: str, replay: str,
                          candidates: tuple[str, ...] | None = None, level: str = CHOICE_LEVEL) -> dict[str, Any]:
    """{slices, backend, phase, rows_used} of one phase, every entry with its chosen correction and its band.

    level: where the choice is made (LEVELS; "slice": each entry on its own rows; "backend": a slice takes its
    backend's choice; "phase": every entry takes the phase's)."""
    fitted = {n: fit_candidate(records, phase, n, replay) for n in (candidates or CANDIDATES[phase])}
    first = next(iter(fitted.values()))
    if not first.part["rows_used"]:
        raise ProfileError(f"no calibration rows with replayed and measured {phase.upper()}")
    rows = [h[0] for h in first.held.values()]

    def chosen(keep: Callable[[Mapping[str, Any]], bool]) -> tuple[Fitted, dict[str, Any]]:
        name, scores = choose(fitted, phase, keep)
        return fitted[name], scores

    def of_backend(backend: str) -> Callable[[Mapping[str, Any]], bool]:
        return lambda x: x["backend"] == backend

    top_f, top_scores = chosen(lambda x: True)
    by_backend = {b: chosen(of_backend(b)) for b in sorted({x["backend"] for x in rows})}
    slices: dict[str, dict[str, Any]] = {}
    under_slice: dict[str, list[Held]] = defaultdict(list)  # backend -> its rows under their slices' choices
    for system, backend in sorted({(x["system"], x["backend"]) for x in rows}):
        def keep(x: Mapping[str, Any], s: str = system, b: str = backend) -> bool:
            return x["system"] == s and x["backend"] == b
        f, scores = chosen(keep) if level == "slice" else by_backend[backend] if level == "backend" \
            else (top_f, top_scores)
        held = [h for h in f.held.values() if keep(h[0])]
        key = f"{system}/{backend}/{phase}"
        slices[key] = _entry(f, f.part["slices"][key], phase, backend, scores, held)
        under_slice[backend] += held
    for key, entry in slices.items():
        pool = _pool(under_slice[key.split("/")[1]])
        entry["band"] = band(pool, BANDS, few_rows_widen(pool, SHRINK_K))
        entry["band_from"] = BANDS.level
    backends: dict[str, dict[str, Any]] = {}
    for backend, (f, scores) in by_backend.items():
        if level == "phase":
            f, scores = top_f, top_scores
        held = [h for h in f.held.values() if h[0]["backend"] == backend]
        key = f"{backend}/{phase}"
        backends[key] = {**_entry(f, f.part["backend"][key], phase, backend, scores, held),
                         "band": band(_pool(held), BANDS, FALLBACK_WIDEN)}
    held = list(top_f.held.values())
    top = {**_entry(top_f, top_f.part["phase"], phase, None, top_scores, held),
           "band": band(_pool(held), BANDS, FALLBACK_WIDEN)}
    return {"slices": slices, "backend": backends, "phase": top, "rows_used": first.part["rows_used"],
            "band_method": {**BANDS.entry(), "residuals": "leave-one-architecture-out, of the chosen corrections"}}


def describe(replay: str, level: str) -> str:
    where = {"slice": "per (system, backend, phase) slice", "backend": "per (backend, phase), every slice of the "
             "backend taking it", "phase": "per phase"}[level]
    return (f"transfer choice on the {replay} replay, {where} (a backend or phase entry by its own rows): the "
            f"correction among {dict(CANDIDATES)} with the lowest leave-one-architecture-out score "
            "(MdAPE / target + P90 / target, each architecture weighing the same), ties to the earlier; "
            + "; ".join(f"{n}: {label}" for n, label in CORRECTION_LABELS.items())
            + f"; bands: the chosen corrections' leave-one-architecture-out residuals, {BANDS.level} pool, "
            f"architecture-balanced P10-P90, widened sqrt(1 + {SHRINK_K:g}/n), a backend or phase entry's x"
            f"{FALLBACK_WIDEN:g}")


def fit(records: Iterable[Mapping[str, Any]], *, fitted: str, source: str, replay: str = "client",
        candidates: Mapping[str, tuple[str, ...]] | None = None, fallback: bool = True,
        level: str = CHOICE_LEVEL) -> dict[str, Any]:
    """A profile (TRANSFER_FORMAT) from calibration-split records, every entry's correction chosen by transfer.

    candidates: per phase the names to choose from (CANDIDATES when absent; one name: that correction
    everywhere, a uniform method to compare with). fallback: with the client replay, a sweep_fallback chosen the
    same way on the sweep's own replay."""
    if level not in LEVELS:
        raise ValueError(f"choice level {level!r} is not one of {list(LEVELS)}")
    records = calibration_only(records)
    name = "transfer" if candidates is None else "uniform " + ", ".join(
        f"{p} {'/'.join(candidates[p])}" for p in PHASES)
    profile: dict[str, Any] = {"format": TRANSFER_FORMAT, "method": describe(replay, level), "method_name": name,
                               "fitted": fitted, "source": source, "terms": {}, "slices": {}, "backend": {},
                               "phase": {}, "replay": {}, "band_method": {}}
    rows_used: set[str] = set()
    for phase in PHASES:
        part = fit_phase_by_transfer(records, phase, replay, (candidates or {}).get(phase), level)
        profile["terms"][phase] = []  # every entry carries its own
        profile["slices"].update(part["slices"])
        profile["backend"].update(part["backend"])
        profile["phase"][phase] = part["phase"]
        profile["replay"][phase] = replay
        profile["band_method"][phase] = part["band_method"]
        rows_used |= part["rows_used"]
    profile["rows_used"] = sorted(rows_used)
    profile["slices"] = dict(sorted(profile["slices"].items()))
    if fallback and replay == "client":
        profile[SWEEP_FALLBACK] = fit(records, fitted=fitted, source=source, replay="sweep", candidates=candidates,
                                      level=level)
    return profile


def fit_profile(records: Iterable[Mapping[str, Any]], *, fitted: str, source: str,
                candidates: Mapping[str, tuple[str, ...]] | None = None, level: str = CHOICE_LEVEL) -> dict[str, Any]:
    """The shipped profile: `fit` on the rows whose client replay drew spread lengths, and beside it the
    FIXED_LENGTHS sub-profile, `fit` on the rows replayed with fixed lengths (when there are any); with records
    that name their benchmark campaign, the bands of profiles fitted on a model's own measurements
    (own.own_bands)."""
    records = calibration_only(records)
    profile = fit([r for r in records if client_lengths(r) == "spread"], fitted=fitted, source=source,
                  candidates=candidates, level=level)
    fixed = [r for r in records if client_lengths(r) == "fixed"]
    if fixed:
        profile[FIXED_LENGTHS] = fit(fixed, fitted=fitted, source=source, candidates=candidates, level=level)
    if any(r.get("campaign") for r in records):
        profile[OWN_BANDS] = own_bands(records, profile)
    return profile
