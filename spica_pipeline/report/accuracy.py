"""How far the numbers a sweep ranked on were from real GPUs on models the calibration profile never
saw: the profile's recorded held-out check (fidelity/profile.heldout_check), shown per backend
in report.md and the deploy records, so each accuracy claim names its measurement (file and date).

With an own profile (`spica calibrate`, fidelity/own.py) the check's "own" entry says what the profile knows
of itself: which file, how many of the model's own measured points, their leave-one-out errors and the band
its own entries carry; its backend's picks are ranked on it and carry that band, the sweep's other backends
read the packaged corrections the file carries, with their held-out errors. Every pick's band is listed with
the profile it came from."""

import math
from typing import Any, Iterable, Mapping

from spica_pipeline.fidelity.silicon import split_of

# A median error above the P90 target (50 %) means most numbers of that backend and phase
# were off by more than the tail should be: the report says so in words, not only in the table.
UNRELIABLE_MDAPE = 0.5
PHASES = (("ttft", "TTFT"), ("tpot", "TPOT"))
# A P10-P90 band should hold 80 % of measurements; bench/record_heldout_check.py records how many it held.
NOMINAL_COVERAGE = 0.8
COVERAGE_NAMES = (("ttft", "TTFT"), ("tpot", "TPOT"), ("goal_e2e", "the goal's end-to-end latency"))


def _pct(v: Any) -> str:
    return "–" if not isinstance(v, (int, float)) else f"{100.0 * v:.0f} %"


def _err(e: Mapping[str, Any] | None) -> str:
    if not e:
        return "–"
    return f"{_pct(e.get('mdape'))} (P90 {_pct(e.get('p90'))}, bias {100.0 * e.get('bias', 0.0):+.0f} %)"


def _models(check: Mapping[str, Any]) -> str:
    return ", ".join(str(m).split("/")[-1] for m in check.get("models", []))


def provenance(check: Mapping[str, Any]) -> str:
    """`<n> rows of <models>; <file>, <UTC date>`: where the check's numbers come from."""
    return (f"{check.get('rows')} silicon rows of {_models(check)}; `{check.get('source')}`, "
            f"{check.get('measured_utc')}")


def backend_check(check: Mapping[str, Any] | None, backend: str | None) -> dict[str, Any] | None:
    """One backend's held-out errors with the check's provenance (None without a check or rows)."""
    found = (check or {}).get("by_backend", {}).get(str(backend))
    if not check or not found:
        return None
    return {"backend": backend, "profile": check.get("profile"), "rows": found.get("rows"),
            **{p: found.get(p) for p, _ in PHASES}, "aic_estimate": found.get("aic"),
            "models": check.get("models"), "source": check.get("source"), "measured_utc": check.get("measured_utc")}


def coverage_line(check: Mapping[str, Any]) -> str | None:
    """How often the profile's P10-P90 bands held the held-out measurements (None where not recorded): a band
    drawn from calibration models can be narrower on a new one, and the report says by how much."""
    recorded = check.get("band_coverage") or {}
    held = {key: recorded[key] for key, _ in COVERAGE_NAMES if isinstance(recorded.get(key), (int, float))}
    parts = [f"{name} on {_pct(held[key])}" for key, name in COVERAGE_NAMES if key in held]
    if not parts:
        return None
    short = any(v < NOMINAL_COVERAGE - 0.05 for v in held.values())
    return (f"On all {check.get('rows')} of those rows, every backend, the P10–P90 bands (nominal "
            f"{_pct(NOMINAL_COVERAGE)}) held the measured "
            f"{', '.join(parts)}" + (": for a model outside the calibration split, read a band as narrower than the "
                                     "error it may have." if short else "."))


def unreliable(found: Mapping[str, Any]) -> list[str]:
    """The phases whose held-out median error exceeds UNRELIABLE_MDAPE."""
    return [name for p, name in PHASES if (found.get(p) or {}).get("mdape", 0.0) > UNRELIABLE_MDAPE]


def own_of(check: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The own profile's summary in a check (fidelity/profile.own_summary), or None."""
    own = (check or {}).get("own")
    return own if isinstance(own, Mapping) else None


def is_own(check: Mapping[str, Any] | None, config: Mapping[str, Any]) -> bool:
    """Whether a candidate (its flat config) is corrected by the check's own profile: its backend and system."""
    own = own_of(check)
    return own is not None and config.get("backend") == own.get("backend") \
        and config.get("hardware_sku") == own.get("system")


def _loo(own: Mapping[str, Any], phase: str) -> str:
    e = (own.get("leave_one_out") or {}).get(phase) or {}
    return f"{_pct(e.get('mdape'))} (worst {_pct(e.get('max'))})" if e else "– (one point)"


def _multipliers(band: Any) -> str:
    if not isinstance(band, (list, tuple)) or len(band) != 2:
        return "–"
    return f"x{math.exp(band[0]):.2f}–x{math.exp(band[1]):.2f}"


def own_lines(own: Mapping[str, Any], base_profile: Any = None) -> list[str]:
    """report.md's paragraph on an own profile: file, deployment, rows, leave-one-out errors, band; `base_profile`:
    the packaged profile it was fitted on (the check's "base_profile")."""
    precision = ", ".join(f"{k} {v}" for k, v in sorted((own.get("precision") or {}).items())) or "checkpoint default"
    base = f"`{str(base_profile).split('/')[-1]}`" if base_profile else "it was fitted on"
    rows = own.get("rows")
    return [f"Calibrated by **your own measurements**: the own profile `{own.get('profile')}` (fitted "
            f"{own.get('fitted')}) on {rows} measured point{'s' if rows != 1 else ''} of {own.get('model')} on "
            f"{own.get('system')} with {own.get('backend')} (precision {precision}), on top of the packaged profile "
            f"{base} (fitted {(own.get('base') or {}).get('fitted')}).", "",
            "| phase | own factor | leave-one-out error, median (worst) | band on its picks (P10–P90) |",
            "|---|---|---|---|",
            *[f"| {name} | x{(own.get('factors') or {}).get(p, float('nan')):.3f} | {_loo(own, p)} | "
              f"{_multipliers((own.get('band') or {}).get(p))} |" for p, name in PHASES], "",
            f"Each leave-one-out error is one measured point predicted from the others. The band is how far "
            f"profiles fitted on as many of a model's own points were off on the other points of their benchmark "
            f"campaign (calibration split; docs/fidelity.md, \"With the model's own measurements\"). "
            f"{own.get('backend')} candidates on {own.get('system')} are ranked on this profile and carry its band; "
            "the sweep's other backends read the packaged corrections the file carries.", ""]


def pick_band_lines(check: Mapping[str, Any] | None, picks: Iterable[tuple[Any, Any]]) -> list[str]:
    """A table of the shown picks' P10–P90 band multipliers and the profile they come from (own or packaged), picks
    with the same band on one row; empty when no pick has a band (calibration off)."""
    rows: dict[tuple[str, ...], list[str]] = {}
    for rank, c in picks:
        m = c.metrics
        if m.get("band_ttft_lo") is None or m.get("band_tpot_lo") is None:
            continue
        source = "own" if is_own(check, c.config) else "packaged"
        if source == "packaged" and m.get("calibration_fallback"):
            source = "packaged (fallback entry, widened)"
        key = (str(c.config.get("backend")), source, f"x{m['band_ttft_lo']:.2f}–x{m['band_ttft_hi']:.2f}",
               f"x{m['band_tpot_lo']:.2f}–x{m['band_tpot_hi']:.2f}")
        rows.setdefault(key, []).append(str(rank))
    if not rows:
        return []
    return ["The band on every pick (P10–P90 multipliers of its calibrated TTFT and TPOT) and the profile it "
            "comes from:", "", "| ranks | backend | profile | TTFT band | TPOT band |", "|---|---|---|---|---|",
            *[f"| {', '.join(ranks)} | {' | '.join(key)} |" for key, ranks in rows.items()], ""]


def report_lines(check: Mapping[str, Any] | None, backends: Iterable[Any], calibrated: bool,
                 models: Iterable[Any] = (), picks: Iterable[tuple[Any, Any]] = ()) -> list[str]:
    """report.md's section: the held-out errors of the numbers ranked on, for the backends shown, the own
    profile where one was used, and the band on every pick; `models`: the sweep's model names, said to be in the
    calibration split or not; `picks`: (rank, candidate) of the shown picks."""

    lines = ["## Accuracy on unseen models (held-out check)", ""]
    own = own_of(check)
    if own is not None:
        lines = ["## Accuracy: your own measurements, and the held-out check", "",
                 *own_lines(own, (check or {}).get("base_profile"))]
        backends = [b for b in backends if str(b) != own.get("backend")]
        if not backends:
            return lines + pick_band_lines(check, picks)
        if not (check or {}).get("source"):
            return lines + [f"No held-out check is recorded for the corrections the own profile carries for "
                            f"{', '.join(sorted({str(b) for b in backends}))}.", ""] + pick_band_lines(check, picks)
    shown = sorted({str(b) for b in backends if b})
    if check is None:
        what = "calibration profile (a user file or an edited copy)" if calibrated else "replay"
        return lines + [f"No held-out check is recorded for this {what}: how far its numbers are from real "
                        "GPUs on a model outside the calibration split is not measured.", ""]
    profile = str(check.get('base_profile') or check.get('profile') or '').split('/')[-1]
    subject = (f"The packaged calibration profile `{profile}`" if calibrated
               else "The raw replay (`evaluation.calibration: none`)")
    if own is not None:
        subject = f"For {', '.join(shown)}, the packaged calibration profile `{profile}` the own profile carries"
    lines += [f"{subject}, checked once against aiconfigurator-core's silicon measurements of models outside "
              f"the calibration split ({provenance(check)}). Median absolute error, P90 and signed median "
              "bias:", ""]
    rows, warnings = [], []
    for b in shown:
        found = backend_check(check, b)
        if found is None:
            rows.append([b, "0", "not measured", "not measured", "–"])
            continue
        aic = found.get("aic_estimate") or {}
        rows.append([b, str(found["rows"]), _err(found.get("ttft")), _err(found.get("tpot")),
                     f"{_pct((aic.get('ttft') or {}).get('mdape'))} / {_pct((aic.get('tpot') or {}).get('mdape'))}"])
        for phase in unreliable(found):
            key = phase.lower()
            warnings.append(f"- **{b} {phase} was off by a median {_pct(found[key]['mdape'])} on those models**: "
                            f"treat the {b} {phase} numbers above (and the SLA gate and goodput that read them) "
                            "as unreliable for a model outside the calibration split (docs/fidelity.md, "
                            "\"Current state\").")
    lines += ["| backend | rows | TTFT | TPOT | AIC's own estimate, TTFT / TPOT MdAPE |", "|---|---|---|---|---|",
              *["| " + " | ".join(r) + " |" for r in rows], ""]
    if check.get("note"):
        lines += [f"Not measured: {check['note']}.", ""]
    if calibrated and (held := coverage_line(check)):
        lines += [held, ""]
    for model in sorted({str(m) for m in models if m}):
        where = ("one of the calibration models the profile was fitted on (its leave-one-model-out errors "
                 "are in docs/fidelity.md)" if split_of(model) == "calibration" else
                 "not a calibration model: the errors above are the measured ones for such a model")
        lines += [f"`{model}` is {where}.", ""]
    return lines + (warnings + [""] if warnings else []) + pick_band_lines(check, picks)


def own_entry(check: Mapping[str, Any] | None, config: Mapping[str, Any]) -> dict[str, Any] | None:
    """simulation_record.yaml's "calibration_profile" for a pick corrected by an own profile, else None."""
    own = own_of(check)
    if own is None or not is_own(check, config):
        return None
    return {"kind": "own", "profile": own.get("profile"), "fitted": own.get("fitted"), "rows": own.get("rows"),
            "leave_one_out": own.get("leave_one_out"), "band_log_p10_p90": own.get("band"),
            "note": "calibrated by the model's own measured points (spica calibrate); the bands are the own "
                    "profile's (docs/fidelity.md)"}


def header_line(check: Mapping[str, Any] | None, backend: str | None) -> str | None:
    """One comment line for dgd.yaml: this backend's held-out median errors and their file, or the own profile's
    leave-one-out errors for its backend."""
    own = own_of(check)
    if own is not None and own.get("backend") == backend:
        loo = own.get("leave_one_out") or {}
        return (f"# calibrated by your own measurements: {own.get('profile')} ({own.get('rows')} points); "
                f"leave-one-out median error TTFT {_pct((loo.get('ttft') or {}).get('mdape'))}, "
                f"TPOT {_pct((loo.get('tpot') or {}).get('mdape'))}")
    found = backend_check(check, backend)
    if found is None:
        return None
    t, p = (found.get("ttft") or {}).get("mdape"), (found.get("tpot") or {}).get("mdape")
    flag = " (unreliable)" if unreliable(found) else ""
    return (f"# held-out check of these numbers{flag}: {backend} TTFT median error {_pct(t)}, TPOT {_pct(p)} "
            f"on {found.get('rows')} rows of unseen models ({found.get('source')}, {found.get('measured_utc')})")
