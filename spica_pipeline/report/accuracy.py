"""How far the numbers a sweep ranked on were from real GPUs on models the calibration profile never
saw: the profile's recorded held-out check (fidelity/profile.heldout_check), shown per backend
in report.md and the deploy records, so each accuracy claim names its measurement (file and date)."""

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


def report_lines(check: Mapping[str, Any] | None, backends: Iterable[Any], calibrated: bool,
                 models: Iterable[Any] = ()) -> list[str]:
    """report.md's section: the held-out errors of the numbers ranked on, for the backends shown;
    `models`: the sweep's model names, said to be in the calibration split or not."""

    shown = sorted({str(b) for b in backends if b})
    lines = ["## Accuracy on unseen models (held-out check)", ""]
    if check is None:
        what = "calibration profile (a user file or an edited copy)" if calibrated else "replay"
        return lines + [f"No held-out check is recorded for this {what}: how far its numbers are from real "
                        "GPUs on a model outside the calibration split is not measured.", ""]
    subject = (f"The calibration profile `{str(check.get('profile') or '').split('/')[-1]}`" if calibrated
               else "The raw replay (`evaluation.calibration: none`)")
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
    return lines + (warnings + [""] if warnings else [])


def header_line(check: Mapping[str, Any] | None, backend: str | None) -> str | None:
    """One comment line for dgd.yaml: this backend's held-out median errors and their file."""
    found = backend_check(check, backend)
    if found is None:
        return None
    t, p = (found.get("ttft") or {}).get("mdape"), (found.get("tpot") or {}).get("mdape")
    flag = " (unreliable)" if unreliable(found) else ""
    return (f"# held-out check of these numbers{flag}: {backend} TTFT median error {_pct(t)}, TPOT {_pct(p)} "
            f"on {found.get('rows')} rows of unseen models ({found.get('source')}, {found.get('measured_utc')})")
