"""A profile from a few of the swept model's own measurements (`fit_own`), and how far such a profile is off.

Each architecture carries its own error from the timing data (docs/fidelity.md, "What any correction could
reach"), so a correction that does not know the model stops at what transfer allows. A handful of the model's
own benchmark runs say what that error is. `fit_own(rows, base)` takes measured rows of one (model, system,
backend), each with its replays (fidelity/records.py), and writes a profile in the format of the packaged one:

* per phase, the own factor f = exp(median over the rows of ln(silicon / base value)), the base value being the
  row's client replay corrected by `base` (the packaged profile: its factor, load term and overhead for the
  row's (system, backend)); the own entry is the base's entry with its factor x f, so a candidate of that
  (system, backend) reads base x f;
* its band: how far k-row own factors were off on the other rows of their benchmark campaign, measured on the
  calibration split and recorded in the base ("own_bands", written by `own_bands` at fit time), for the largest
  recorded k not above the rows given (the smallest recorded k below that);
* "own": the model, system, backend, the rows it rests on and, with 2 rows or more, their leave-one-out errors.

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

from spica_pipeline.fidelity.apply import lookup
from spica_pipeline.fidelity.bands import BandMethod, band
from spica_pipeline.fidelity.profile import (
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
    """(slices of the own profile, the own factors, leave-one-out errors) on one replay basis."""
    slices: dict[str, Any] = {}
    factors: dict[str, float] = {}
    loo: dict[str, Any] = {}
    for phase in PHASES:
        res = [x for _, x in own_residuals(rows, base, phase, replay)]
        if not res:
            raise ProfileError(f"own measurements: no row with a replayed and a measured {phase.upper()}")
        f = statistics.median(res)
        factors[phase] = round(math.exp(f), 6)
        if base is not None:
            source = for_client(base, client_lengths(rows[0]), backend)
            if replay == "sweep" and replay_basis(source, phase) == "client":
                source = source[SWEEP_FALLBACK]
            entry = source["slices"].get(f"{system}/{backend}/{phase}") or source["backend"].get(
                f"{backend}/{phase}") or source["phase"][phase]
            terms = entry["terms"] if "terms" in entry else source["terms"][phase]
            overhead = entry.get("overhead_ms", (source.get("overhead_ms") or {}).get(f"{backend}/{phase}", 0.0))
            base_factor = entry["factor"]
        else:
            terms, overhead, base_factor = [], 0.0, 1.0
        spread = band([(x - f, "own") for x in res], BandMethod("phase"), 1.0) if len(res) > 2 else [-1.0, 1.0]
        slices[f"{system}/{backend}/{phase}"] = {
            "factor": round(base_factor * math.exp(f), 6), "rows": len(res), "correction": "own", "terms": terms,
            "overhead_ms": overhead, "band": own_band(base, len(res), phase) or spread,
            "own_factor": factors[phase]}
        if len(res) > 1:
            apes = [abs(math.exp(statistics.median(res[:i] + res[i + 1:]) - x) - 1.0) for i, x in enumerate(res)]
            loo[phase] = {"mdape": round(statistics.median(apes), 6), "max": round(max(apes), 6)}
    return slices, factors, loo


def fit_own(rows: Iterable[Mapping[str, Any]], *, base: Mapping[str, Any] | None, fitted: str,
            source: str) -> dict[str, Any]:
    """A profile for the (model, system, backend) of `rows` from their own measurements (module docstring).

    base: the profile whose corrections the own factors sit on (the packaged profile; None: the raw replays,
    no recorded bands). ProfileError for rows of several deployments or without usable values."""
    rows = list(rows)
    if not rows:
        raise ProfileError("own measurements: no rows")
    model, system, backend = _one_deployment(rows)
    profile: dict[str, Any] = {
        "format": TRANSFER_FORMAT, "method_name": "own",
        "method": "own factor per phase: the median of ln(silicon / base value) over the model's own rows, on the "
                  f"base profile's correction ({(base or {}).get('method_name', 'raw replay')}); band: k-row own "
                  "factors' errors on the calibration split's campaigns",
        "fitted": fitted, "source": source, "terms": {p: [] for p in PHASES}, "replay": {p: "client" for p in PHASES},
        "rows_used": sorted(str(r.get("id")) for r in rows)}
    slices, factors, loo = _own_entries(rows, base, "client", system, backend)
    _complete(profile, slices)
    have_sweep = all(replayed(r, p, "sweep") for r in rows for p in PHASES)
    fallback = {**profile, "replay": {p: "sweep" for p in PHASES}}
    if have_sweep:
        _complete(fallback, _own_entries(rows, base, "sweep", system, backend)[0])
    elif base is not None and SWEEP_FALLBACK in base:
        fallback = {k: v for k, v in base[SWEEP_FALLBACK].items()}
    else:
        raise ProfileError("own measurements without the sweep's replay need a base with a sweep fallback")
    profile[SWEEP_FALLBACK] = fallback
    profile["own"] = {"model": model, "system": system, "backend": backend, "rows": len(rows),
                      "factors": factors, "leave_one_out": loo,
                      "base": {k: (base or {}).get(k) for k in ("method_name", "fitted")}}
    return validate(profile)


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
    draws of k of its rows, the own factor from them (fit_own's median), judged on the campaign's other rows."""
    rng = random.Random(seed)
    out: list[tuple[Mapping[str, Any], float]] = []
    for key in sorted(campaigns, key=str):
        res = own_residuals(campaigns[key], base, phase)
        if len(res) <= k:
            continue
        for _ in range(draws):
            picked = set(rng.sample(range(len(res)), k))
            f = statistics.median(res[i][1] for i in picked)
            out += [(r, x - f) for i, (r, x) in enumerate(res) if i not in picked]
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
