"""A profile from a few of the swept model's own measurements (`fit_own`), and how far such a profile is off.

Each architecture carries its own error from the timing data (docs/fidelity.md, "What any correction could
reach"), so a correction that does not know the model stops at what transfer allows. A handful of the model's
own benchmark runs say what that error is. `fit_own(rows, base)` takes measured rows of one (model, system,
backend), each with its replays (fidelity/records.py), and writes a profile in the format of the packaged one:

* per phase, the own correction ln(silicon / base value) = a + b x over the rows (`own_fit`), the base value
  being the row's client replay corrected by `base` (the packaged profile: its factor, load term and overhead
  for the row's (system, backend)) and x its load coordinate (log2 of the concurrency per engine of the
  phase's role, apply.load_x): b is the rows' least-squares slope shrunk towards 0 (OWN_SHRINK, a prior of that
  many squared doublings of load) and held within OWN_MAX_SLOPE, a the median of the rows' residuals less b x.
  The own entry is the base's entry with its factor x exp(a + b x0) and an own load term b (x - x0), x0 the rows'
  mean load, so a candidate of that (system, backend) reads base x exp(a + b x). With one row, or rows at one
  load, b is 0 and a the median: the own factor;
* its band: how far k-row own corrections were off on the other rows of their benchmark campaign, measured on
  the calibration split and recorded in the base ("own_bands", written by `own_bands` at fit time), for the
  largest recorded k not above the rows given (the smallest recorded k below that);
* with a base, every other entry is the base's (the file is self-contained: a sweep's other backends and systems
  read the packaged corrections it carries), and the base's fixed-length factors are dropped for the own backend
  (the own correction is fitted on the spread client replay a sweep runs);
* "own": the model, system, backend and precision, the rows it rests on ("measurements") and, with 2 rows or
  more, their leave-one-out errors.

The method and its constants were chosen on the calibration split's campaigns (k = 3 and 10 rows, 20 seeded
draws each): against the median factor alone, the shrunk load slope brings TPOT from 6.6 to 5.8 % MdAPE at 3 rows
and from 5.6 to 4.6 % at 10, and leaves TTFT about as it was (14.4 against 14.6 %, 11.8 against 12.1 %;
bench/results/fidelity_calibration.json "own", against its previous version in git).

A benchmark campaign is one source file and one engine version of one (model, precision, system, backend, mode):
the record's "campaign" key (the bench derives it from the silicon file). An own profile is judged on rows of
the campaign its rows came from, never on the rows it was fitted on.
"""

import math
import random
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from spica_pipeline.fidelity.apply import load_x, lookup
from spica_pipeline.fidelity.bands import BandMethod, band
from spica_pipeline.fidelity.profile import (
    FIXED_LENGTHS,
    LOAD,
    OWN,
    PHASES,
    SWEEP_FALLBACK,
    TRANSFER_FORMAT,
    ProfileError,
    for_client,
    replay_basis,
    validate,
)
from spica_pipeline.fidelity.records import architecture, client_lengths, engine_concurrency, replayed

OWN_KS = (1, 3, 10)  # the row counts whose bands the packaged profile records
OWN_DRAWS = 20  # seeded draws of k rows per campaign when measuring
OWN_SEED = 43
OWN_BANDS = "own_bands"
OWN_SHRINK = {"ttft": 32.0, "tpot": 8.0}  # the slope's prior, in squared doublings of load (calibration split)
OWN_MAX_SLOPE = 0.1  # |b|: at most 10 % per doubling of load, so a candidate far from the rows' loads stays near


def load_of(record: Mapping[str, Any], phase: str) -> float:
    """A record's load coordinate for a phase: log2 of the concurrency per engine of the phase's role."""
    return load_x(engine_concurrency(record, phase))


def own_fit(points: Sequence[tuple[float, float]], phase: str) -> tuple[float, float]:
    """(a, b) of the own correction a + b x from (load x, residual) points (module docstring)."""
    if not points:
        raise ValueError("own_fit needs at least one point")
    xs = [x for x, _ in points]
    mean_x = sum(xs) / len(xs)
    mean_y = sum(y for _, y in points) / len(points)
    spread = sum((x - mean_x) ** 2 for x in xs)
    b = sum((x - mean_x) * (y - mean_y) for x, y in points) / (spread + OWN_SHRINK[phase]) if spread > 0 else 0.0
    b = max(-OWN_MAX_SLOPE, min(OWN_MAX_SLOPE, b))
    return statistics.median(y - b * x for x, y in points), b


def base_value(base: Mapping[str, Any] | None, record: Mapping[str, Any], phase: str,
               replay: str = "client") -> float | None:
    """The record's replayed value corrected by `base` as a sweep applies it (its fixed-length factors for a
    fixed-length record where it has them); the replayed value itself without a base."""
    if base is None:
        return replayed(record, phase, replay)
    profile = for_client(base, client_lengths(record), str(record.get("backend")))
    if replay == "sweep" and replay_basis(profile, phase) == "client":
        profile = profile[SWEEP_FALLBACK]
    value = replayed(record, phase, replay_basis(profile, phase))
    if value is None:
        return None
    info = lookup(profile, str(record["system"]), str(record["backend"]), phase, engine_concurrency(record, phase))
    return info["factor"] * (value + info["overhead_ms"])


def own_residuals(records: Iterable[Mapping[str, Any]], base: Mapping[str, Any] | None, phase: str,
                  replay: str = "client") -> list[tuple[Mapping[str, Any], float]]:
    """(record, ln(silicon / base value)) of every record with both values positive."""
    out = []
    for r in records:
        v, s = base_value(base, r, phase, replay), (r.get("silicon") or {}).get(phase)
        if v and s and v > 0 and s > 0:
            out.append((r, math.log(s / v)))
    return out


def _one_deployment(rows: Sequence[Mapping[str, Any]]) -> tuple[str, str, str]:
    keys = {(str(r.get("model")), str(r.get("system")), str(r.get("backend"))) for r in rows}
    if len(keys) != 1:
        raise ProfileError(f"own measurements must be of one model, system and backend; got {sorted(keys)}")
    return next(iter(keys))


def own_band(base: Mapping[str, Any] | None, k: int, phase: str) -> list[float] | None:
    """The base's recorded own band for k rows (the largest recorded k <= k, else the smallest recorded)."""
    recorded = (base or {}).get(OWN_BANDS) or {}
    ks = sorted(int(n) for n in recorded)
    if not ks:
        return None
    fit_k = max([n for n in ks if n <= k], default=ks[0])
    return list(recorded[str(fit_k)][phase])


def _own_entries(rows: Sequence[Mapping[str, Any]], base: Mapping[str, Any] | None, replay: str,
                 system: str, backend: str) -> tuple[dict[str, Any], dict[str, float], dict[str, Any]]:
    """(slices of the own profile, the own factors at the rows' mean load, leave-one-out errors) on one replay
    basis."""
    slices: dict[str, Any] = {}
    factors: dict[str, float] = {}
    loo: dict[str, Any] = {}
    for phase in PHASES:
        points = [(load_of(r, phase), x) for r, x in own_residuals(rows, base, phase, replay)]
        if not points:
            raise ProfileError(f"own measurements: no row with a replayed and a measured {phase.upper()}")
        a, b = own_fit(points, phase)
        x0 = round(sum(x for x, _ in points) / len(points), 6)
        factors[phase] = round(math.exp(a + b * x0), 6)
        if base is not None:
            source = for_client(base, client_lengths(rows[0]), backend)
            if replay == "sweep" and replay_basis(source, phase) == "client":
                source = source[SWEEP_FALLBACK]
            entry = source["slices"].get(f"{system}/{backend}/{phase}") or source["backend"].get(
                f"{backend}/{phase}") or source["phase"][phase]
            terms = list(entry["terms"] if "terms" in entry else source["terms"][phase])
            overhead = entry.get("overhead_ms", (source.get("overhead_ms") or {}).get(f"{backend}/{phase}", 0.0))
            base_factor = entry["factor"]
        else:
            terms, overhead, base_factor = [], 0.0, 1.0
        if b:
            terms.append({"feature": LOAD, "coefficient": round(b, 6), "anchor": x0, "centre": x0,
                          "fitted": round(b, 6), "own": True})
        residuals = [y - (a + b * x) for x, y in points]
        spread = band([(x, "own") for x in residuals], BandMethod("phase"), 1.0) if len(points) > 2 else [-1.0, 1.0]
        slices[f"{system}/{backend}/{phase}"] = {
            "factor": round(base_factor * factors[phase], 6), "rows": len(points), "correction": "own",
            "terms": terms, "overhead_ms": overhead, "band": own_band(base, len(points), phase) or spread,
            "own_factor": factors[phase], "own_slope": round(b, 6)}
        if len(points) > 1:
            apes = []
            for i, (x, y) in enumerate(points):
                a_i, b_i = own_fit(points[:i] + points[i + 1:], phase)
                apes.append(abs(math.exp(a_i + b_i * x - y) - 1.0))
            loo[phase] = {"mdape": round(statistics.median(apes), 6), "max": round(max(apes), 6)}
    return slices, factors, loo


MEASUREMENT_KEYS = ("id", "source", "line", "concurrency", "isl", "osl", "mode", "shape", "silicon", "ours", "sweep")


def fit_own(rows: Iterable[Mapping[str, Any]], *, base: Mapping[str, Any] | None, fitted: str,
            source: str, precision: Mapping[str, str] | None = None,
            base_sha256: str | None = None) -> dict[str, Any]:
    """A profile for the (model, system, backend) of `rows` from their own measurements (module docstring).

    base: the profile whose corrections the own entries sit on and carry for everything else (the packaged
    profile; None: the raw replays, no recorded bands, a profile of the own entries alone); base_sha256: its
    file's digest, recorded so a report finds its held-out check. precision: the measured deployment's precision
    fields (empty: the checkpoint's own). ProfileError for rows of several deployments or without usable values."""
    rows = list(rows)
    if not rows:
        raise ProfileError("own measurements: no rows")
    model, system, backend = _one_deployment(rows)
    slices, factors, loo = _own_entries(rows, base, "client", system, backend)
    have_sweep = all(replayed(r, p, "sweep") for r in rows for p in PHASES)
    if not have_sweep and (base is None or SWEEP_FALLBACK not in base):
        raise ProfileError("own measurements without the sweep's replay need a base with a sweep fallback")
    fallback_slices = _own_entries(rows, base, "sweep", system, backend)[0] if have_sweep else {}
    head = {
        "format": TRANSFER_FORMAT, "method_name": OWN,
        "method": "own correction per phase: ln(silicon / base value) = a + b x over the model's own rows (x: log2 of "
                  "the concurrency per engine; b shrunk towards 0), on the base profile's correction "
                  f"({(base or {}).get('method_name', 'raw replay')}); band: k-row own corrections' errors on the "
                  "calibration split's campaigns",
        "fitted": fitted, "source": source, "rows_used": sorted(str(r.get("id")) for r in rows)}
    if base is None:
        profile: dict[str, Any] = {**head, "terms": {p: [] for p in PHASES}, "replay": {p: "client" for p in PHASES}}
        _complete(profile, slices)
        fallback = {**profile, "replay": {p: "sweep" for p in PHASES}}
        _complete(fallback, fallback_slices)
    else:
        profile = _overlay(base, slices, backend)
        profile.update(head)
        fallback = _overlay(base[SWEEP_FALLBACK], fallback_slices, backend)
    profile[SWEEP_FALLBACK] = fallback
    profile[OWN] = {"model": model, "system": system, "backend": backend, "precision": dict(precision or {}),
                    "rows": len(rows), "factors": factors, "leave_one_out": loo,
                    "measurements": [{k: r[k] for k in MEASUREMENT_KEYS if k in r} for r in rows],
                    "base": {**{k: (base or {}).get(k) for k in ("method_name", "fitted")},
                             **({"sha256": base_sha256} if base_sha256 else {})}}
    return validate(profile)


def _overlay(base: Mapping[str, Any], slices: Mapping[str, Any], backend: str) -> dict[str, Any]:
    """A copy of `base` with the own slices in place of its own, and without its fixed-length factors for
    `backend` (every other entry is the base's)."""
    out = {k: v for k, v in base.items() if k not in (OWN_BANDS, "provenance", SWEEP_FALLBACK, OWN)}
    out["slices"] = {**base["slices"], **slices}
    fixed = base.get(FIXED_LENGTHS)
    if fixed is not None:
        kept = {**fixed, "slices": {k: v for k, v in fixed["slices"].items() if k.split("/")[1] != backend},
                "backend": {k: v for k, v in fixed["backend"].items() if k.split("/")[0] != backend}}
        out[FIXED_LENGTHS] = kept
    return out


def _complete(profile: dict[str, Any], slices: dict[str, Any]) -> None:
    """Slices, and the backend and phase entries a lookup needs (the same numbers: the profile knows one
    deployment)."""
    profile["slices"] = slices
    profile["backend"] = {key.split("/", 1)[1]: dict(e) for key, e in slices.items()}
    profile["phase"] = {key.rsplit("/", 1)[1]: dict(e) for key, e in slices.items()}


# ---- how far own factors are off (calibration split: the bands; any split: the bench's report) ----------------

def own_draws(campaigns: Mapping[Any, Sequence[Mapping[str, Any]]], k: int, base: Mapping[str, Any] | None,
              phase: str, draws: int = OWN_DRAWS, seed: int = OWN_SEED) -> list[tuple[Mapping[str, Any], float]]:
    """(judged record, ln(silicon / own-corrected value)) of every campaign with more than k rows: `draws` seeded
    draws of k of its rows, the own correction from them (fit_own's `own_fit`), judged on the campaign's other
    rows."""
    rng = random.Random(seed)
    out: list[tuple[Mapping[str, Any], float]] = []
    for key in sorted(campaigns, key=str):
        res = own_residuals(campaigns[key], base, phase)
        if len(res) <= k:
            continue
        loads = [load_of(r, phase) for r, _ in res]
        for _ in range(draws):
            picked = set(rng.sample(range(len(res)), k))
            a, b = own_fit([(loads[i], res[i][1]) for i in sorted(picked)], phase)
            out += [(r, x - (a + b * loads[i])) for i, (r, x) in enumerate(res) if i not in picked]
    return out


def campaigns_of(records: Iterable[Mapping[str, Any]]) -> dict[Any, list[Mapping[str, Any]]]:
    """Records grouped by their "campaign" key (records without one are left out)."""
    out: dict[Any, list[Mapping[str, Any]]] = defaultdict(list)
    for r in records:
        if r.get("campaign"):
            out[str(r["campaign"])].append(r)
    return dict(out)


def own_bands(records: Iterable[Mapping[str, Any]], base: Mapping[str, Any]) -> dict[str, Any]:
    """{str(k): {phase: [lo, hi]}} for k in OWN_KS: the architecture-balanced P10 and P90 of own_draws'
    residuals on the calibration campaigns of `records`, the k-row own profile's band."""
    by_campaign = campaigns_of(records)
    out: dict[str, Any] = {}
    for k in OWN_KS:
        entry = {}
        for phase in PHASES:
            pool = [(x, architecture(r.get("model"))) for r, x in own_draws(by_campaign, k, base, phase)]
            if not pool:
                break
            entry[phase] = band(pool, BandMethod("phase"), 1.0)
        if len(entry) == len(PHASES):
            out[str(k)] = entry
    return out
