"""Scoring replays and profiles against silicon: error statistics, a profile applied to bench records, the split
reports, and the calibration rows a profile was not fitted on.

Errors are fractions: APE = |predicted - silicon| / silicon; MdAPE = median APE, P90 = 90th percentile of APE,
bias = median of (predicted - silicon) / silicon. A phase's score is fit.target_score: MdAPE / target + P90 /
target (targets TTFT 20 % / 50 %, TPOT 10 % / 50 %; lower is better).
"""

import copy
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from fidelity.rows import row_order

from spica_pipeline.fidelity import silicon
from spica_pipeline.fidelity.apply import calibrate, goal_band
from spica_pipeline.fidelity.fit import target_score
from spica_pipeline.fidelity.measurement import quantile
from spica_pipeline.fidelity.profile import FIXED_LENGTHS, PHASES, for_client
from spica_pipeline.fidelity.records import architecture, client_lengths, engine_concurrency

GROUPS = ("model", "backend", "system", "mode", "load")
LOAD_BUCKETS = ((8, "c<=8"), (32, "c9-32"), (128, "c33-128"), (512, "c129-512"))
SIDES = ("ours", "sweep", "calibrated", "aic")
# the calibration rows a profile is fitted on: the first FIT_ROWS of the split in the bench's row order; the
# others score it
FIT_ROWS = 480


def load_bucket(concurrency: int | None) -> str:
    """The concurrency bucket a row is reported under (TTFT error depends strongly on load)."""
    for top, name in LOAD_BUCKETS:
        if (concurrency or 0) <= top:
            return name
    return "c>512"


def error_stats(pairs: list[tuple[float, float]]) -> dict[str, Any]:
    """{mdape, p90, bias, n} over (predicted, measured) pairs."""
    good = [(p, m) for p, m in pairs if p is not None and m and math.isfinite(p) and m > 0]
    if not good:
        return {"mdape": None, "p90": None, "bias": None, "n": 0}
    signed = [(p - m) / m for p, m in good]
    ape = [abs(x) for x in signed]
    return {"mdape": round(quantile(ape, 0.5), 4), "p90": round(quantile(ape, 0.9), 4),
            "bias": round(quantile(signed, 0.5), 4), "n": len(good)}


def summarise(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Error stats of each side (the two replays, the calibrated value, AIC's estimate) for TTFT and TPOT."""
    out: dict[str, Any] = {}
    for side in SIDES:
        out[side] = {}
        for metric in PHASES:
            pairs = [(r[side][metric], r["silicon"][metric]) for r in records
                     if isinstance(r.get(side), dict) and r[side].get(metric) is not None]
            out[side][metric] = error_stats(pairs)
    return out


def band_coverage(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Share of rows whose silicon value lies inside the calibrated P10-P90 band (nominal 0.8)."""
    out: dict[str, Any] = {}
    for metric in ("ttft", "tpot", "goal_e2e"):
        hits = [r["band"][metric]["inside"] for r in records if r.get("band") and metric in r["band"]]
        if hits:
            out[metric] = {"rows": len(hits), "inside": round(sum(hits) / len(hits), 4)}
    return out or None


def apply_profile(records: list[dict[str, Any]], profile: dict[str, Any]) -> None:
    """Add calibrated values and the band check to every replayed record (in place), as a sweep applies the
    profile: on the client replay ("ours"), a record replayed with fixed lengths with the profile's fixed-length
    factors where it has them."""
    for rec in records:
        raw = rec.get("sweep") or {}
        if not raw.get("ttft") or not raw.get("tpot"):
            continue
        factors = for_client(profile, client_lengths(rec), rec["backend"])
        client = rec.get("ours") if rec.get("window_rule") == "benchmark_client" else None
        cal = calibrate({"mean_ttft_ms": raw["ttft"], "mean_tpot_ms": raw["tpot"]}, factors, system=rec["system"],
                        backend=rec["backend"], concurrency={p: engine_concurrency(rec, p) for p in PHASES},
                        client=client)
        rec["calibrated"] = {"ttft": cal.get("calibrated_mean_ttft_ms"), "tpot": cal.get("calibrated_mean_tpot_ms")}
        rec["band"] = {}
        for metric in PHASES:
            value = rec["calibrated"][metric]
            lo, hi = value * cal[f"band_{metric}_lo"], value * cal[f"band_{metric}_hi"]
            rec["band"][metric] = {"lo": lo, "hi": hi, "inside": lo <= rec["silicon"][metric] <= hi}
        # the goal band as a sweep shows it (E2E latency, and throughput at fixed concurrency, read the TPOT
        # band) against the row's mean E2E ~ TTFT + (OSL - 1) x TPOT
        osl = rec.get("osl")
        if osl and rec["calibrated"]["ttft"] and rec["calibrated"]["tpot"]:
            e2e = rec["calibrated"]["ttft"] + (osl - 1) * rec["calibrated"]["tpot"]
            band = goal_band(cal, "e2e_latency", e2e)
            measured = rec["silicon"]["ttft"] + (osl - 1) * rec["silicon"]["tpot"]
            if band is not None:
                rec["band"]["goal_e2e"] = {"lo": band[0], "hi": band[1], "inside": band[0] <= measured <= band[1]}


def split_report(name: str, mapped: list, records: list[dict[str, Any]]) -> dict[str, Any]:
    """One split's rows, how many the evaluator expresses and replays, and the errors overall and by group."""
    in_split = [m for m in mapped if name == "all" or m.row.split == name]
    reasons = Counter(silicon.reason_kind(m.reason) for m in in_split if isinstance(m, silicon.Inexpressible))
    recs = [r for r in records if name == "all" or r["split"] == name]
    evaluated = [r for r in recs if r.get("ours")]
    failures = Counter(silicon.reason_kind((r.get("reason") or r["status"]).split(" at /")[0])[:160]
                       for r in recs if not r.get("ours"))
    report: dict[str, Any] = {
        "rows": len(in_split),
        "expressible": sum(isinstance(m, silicon.SiliconCase) for m in in_split),
        "selected": len(recs),
        "evaluated": len(evaluated),
        "fidelity_notes": sum(1 for r in recs if r.get("fidelity_note")),
        **summarise(evaluated),
        # ours and AIC's own estimate on exactly the same rows
        "same_rows_as_aic": {k: v for k, v in summarise([r for r in evaluated if r.get("aic")]).items()
                             if k in ("ours", "calibrated", "aic")},
        "band_coverage": band_coverage(evaluated),
        "inexpressible_reasons": dict(reasons.most_common()),
        "failures": dict(failures.most_common()),
        "by": {},
    }
    for g in GROUPS:
        buckets: dict[str, list] = defaultdict(list)
        for r in evaluated:
            buckets[load_bucket(r.get("concurrency")) if g == "load" else str(r[g])].append(r)
        report["by"][g] = {k: {"evaluated": len(v), **summarise(v)} for k, v in sorted(buckets.items())}
    return report


def _fmt(stats: dict[str, Any]) -> str:
    if stats.get("mdape") is None:
        return "   n/a"
    return f"{100 * stats['mdape']:5.0f}% p90 {100 * stats['p90']:4.0f}% bias {100 * stats['bias']:+4.0f}%"


def print_report(name: str, rep: dict[str, Any]) -> None:
    print(f"== split {name}: rows {rep['rows']}, expressible {rep['expressible']}, selected {rep['selected']}, "
          f"evaluated {rep['evaluated']}, with a fidelity_note {rep['fidelity_notes']}")
    for metric in PHASES:
        print(f"   {metric.upper():4s} ours {_fmt(rep['ours'][metric])} | sweep {_fmt(rep['sweep'][metric])}"
              f" | calibrated {_fmt(rep['calibrated'][metric])} | aic {_fmt(rep['aic'][metric])}")
    if rep.get("band_coverage"):
        print("   P10-P90 band coverage (nominal 80 %): " + ", ".join(
            f"{m.upper()} {100 * v['inside']:.0f}% of {v['rows']}" for m, v in rep["band_coverage"].items()))
    outside = rep.get("outside_fit")
    if outside:
        print(f"   the {outside['rows']} calibration rows outside the fit: " + " | ".join(
            f"{p.upper()} {_fmt(outside[p])} score {outside[p]['score']}" for p in PHASES))
    for g in GROUPS:
        for k, v in rep["by"][g].items():
            print(f"   {g}={k} (n={v['evaluated']}): TTFT ours {_fmt(v['ours']['ttft'])} aic {_fmt(v['aic']['ttft'])}"
                  f" | TPOT ours {_fmt(v['ours']['tpot'])} aic {_fmt(v['aic']['tpot'])}")
    if rep["failures"]:
        print(f"   failures: {rep['failures']}")


# ---- fitting and scoring a profile on the calibration split -----------------------------------------

def calibration_rows_only(records: list[dict[str, Any]], what: str) -> None:
    """SystemExit naming `what` when a held-out row would reach it (the split rule: nothing is fitted or
    chosen on held-out rows)."""
    held = sorted({r["id"] for r in records if r.get("split") != "calibration"})
    if held:
        raise SystemExit(f"{what} reads calibration rows only; got {len(held)} held-out rows, e.g. {held[0]}")


def fit_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The calibration records a profile is fitted on: the first FIT_ROWS calibration rows in the bench's row
    order (every expressible row counts, replayed or not), those with both replays."""
    cal = sorted((r for r in records if r["split"] == "calibration"), key=lambda r: row_order(r["id"]))[:FIT_ROWS]
    return [r for r in cal if (r.get("sweep") or {}).get("ttft") and r.get("window_rule") == "benchmark_client"]


def fitted_ids(profile: dict[str, Any]) -> set[str]:
    """Every row id a profile (or its fixed-length sub-profile) was fitted on."""
    return {i for p in (profile, profile.get(FIXED_LENGTHS) or {}) for i in p.get("rows_used", ())}


def phase_scores(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Calibrated error stats, score and band coverage per phase, with each backend's score (rows already
    calibrated by apply_profile)."""
    out: dict[str, Any] = {"rows": len(rows)}
    for phase in PHASES:
        st = error_stats([(r["calibrated"][phase], r["silicon"][phase]) for r in rows])
        out[phase] = {**st, "score": round(target_score(st["mdape"], st["p90"], phase), 4) if st["n"] else None,
                      "band_coverage": round(sum(r["band"][phase]["inside"] for r in rows) / len(rows), 4)
                      if rows else None}
        for backend in sorted({r["backend"] for r in rows}):
            bst = error_stats([(r["calibrated"][phase], r["silicon"][phase]) for r in rows if r["backend"] == backend])
            out[phase][f"score_{backend}"] = round(target_score(bst["mdape"], bst["p90"], phase), 4)
    return out


def outside_fit(records: list[dict[str, Any]], profile: dict[str, Any],
                also_fitted: Iterable[str] = ()) -> dict[str, Any]:
    """The profile's scores on the calibration rows neither it nor `also_fitted` was fitted on (the rows that
    choose between profiles); records are copied, not changed."""
    calibration_rows_only(records, "a score outside the fit")
    skip = fitted_ids(profile) | set(also_fitted)
    rows = [copy.deepcopy(r) for r in records if r.get("status") == "feasible" and r["id"] not in skip]
    apply_profile(rows, profile)
    return {"profile": profile.get("method_name"), **phase_scores([r for r in rows if r.get("calibrated")])}


def leave_one_architecture_out(records: list[dict[str, Any]],
                                fit_fn: Callable[[list[dict[str, Any]]], dict[str, Any]]) -> dict[str, Any]:
    """Calibrated errors on each calibration architecture's rows (records.architecture) with the whole profile,
    every choice included, fitted by `fit_fn` without it: the calibration split's own estimate of how a method does
    on a model it never saw. Rows with spread client lengths (the main factors)."""
    calibration_rows_only(records, "leave one architecture out")
    scored: list[dict[str, Any]] = []
    by_arch: dict[str, Any] = {}
    spread = [r for r in records if client_lengths(r) == "spread"]
    for arch in sorted({architecture(r["model"]) for r in spread}):
        train = [r for r in spread if architecture(r["model"]) != arch]
        test = [copy.deepcopy(r) for r in spread if architecture(r["model"]) == arch]
        apply_profile(test, fit_fn(train))
        scored += test
        by_arch[arch] = {"rows": len(test), **summarise(test)["calibrated"], "band_coverage": band_coverage(test)}
    out: dict[str, Any] = {"rows": len(scored), "calibrated": summarise(scored)["calibrated"],
                           "band_coverage": band_coverage(scored), "by_architecture": by_arch}
    out["score"] = round(sum(target_score(out["calibrated"][p]["mdape"], out["calibrated"][p]["p90"], p)
                             for p in PHASES), 4)
    return out
