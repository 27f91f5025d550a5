"""Record a calibration profile's held-out check in the package (every accuracy claim in the product cites a
measurement).

Reads result files of `bench/bench_fidelity.py --split heldout --calibration <profile>` and writes, for each (the
file holds these checks only: pass one result per profile the package ships), what report.md and the deploy records
show about that profile on models it was never fitted on:
TTFT and TPOT MdAPE / P90 / bias overall and per backend, AIC's own estimate on the same rows, band
coverage, the rows, models, command and UTC date. Entries are keyed by the profile file's digest
(fidelity/profile.load_profile), so a refitted or edited profile has no check until it is measured.
The raw sweep replay's numbers (what `evaluation.calibration: none` ranks on) are recorded under "none",
from the newest file given. Only the held-out split is read: this records a measurement, it chooses
nothing.

usage:
  .venv/bin/python bench/record_heldout_check.py bench/results/fidelity_heldout.json [...]
"""

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from spica_pipeline.fidelity.profile import HELDOUT_CHECKS, RAW, load_profile, resolve  # noqa: E402
from spica_pipeline.storage import write_json_result  # noqa: E402

PHASES = ("ttft", "tpot")


def _errors(block: dict[str, Any]) -> dict[str, Any]:
    """{phase: {mdape, p90, bias, n}} of one estimate (calibrated, sweep or aic) of one slice."""
    return {p: {k: block[p][k] for k in ("mdape", "p90", "bias", "n")} for p in PHASES if block.get(p)}


def check_of(result: dict[str, Any], source: str, estimate: str, profile: str = RAW) -> dict[str, Any]:
    """One recorded check from a held-out result file; `estimate` is "calibrated" (of `profile`) or "sweep" (raw)."""
    split = result["splits"]["heldout"]
    by = split.get("by", {})
    return {
        "source": source,
        "measured_utc": result["date"],
        "command": result["command"],
        "profile": profile if estimate == "calibrated" else RAW,
        "rows": split["evaluated"],
        "models": sorted(by.get("model", {})),
        "all": _errors(split[estimate]),
        "aic": _errors(split["aic"]),
        "by_backend": {b: {"rows": s["evaluated"], **_errors(s[estimate]), "aic": _errors(s["aic"])}
                       for b, s in sorted(by.get("backend", {}).items())},
        **({"band_coverage": {k: v["inside"] for k, v in split["band_coverage"].items()}}
           if estimate == "calibrated" and split.get("band_coverage") else {}),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", help="bench_fidelity.py --split heldout result files")
    ap.add_argument("--out", default=str(HELDOUT_CHECKS))
    args = ap.parse_args(argv)
    out = Path(args.out)
    checks: dict[str, Any] = {}
    newest: tuple[str, dict[str, Any], str] | None = None
    for name in args.results:
        result = json.loads(Path(name).read_text())
        source = str(Path(name).resolve().relative_to(ROOT)) if Path(name).resolve().is_relative_to(ROOT) else name
        if result.get("partial") or "heldout" not in result.get("splits", {}):
            print(f"{name}: not a complete held-out result", file=sys.stderr)
            return 2
        setting = result.get("calibration_profile")
        if setting and setting != RAW:
            path = resolve(setting) if setting == "auto" else ROOT / setting  # ROOT / an absolute path: that path
            _, digest = load_profile(str(path))
            shown = str(path.resolve().relative_to(ROOT)) if path.resolve().is_relative_to(ROOT) else str(path)
            checks[str(digest)] = check_of(result, source, "calibrated", shown)
            print(f"{shown} ({digest}): held-out TTFT MdAPE {checks[str(digest)]['all']['ttft']['mdape']:.1%}")
        if newest is None or result["date"] > newest[0]:
            newest = (result["date"], result, source)
    if newest is not None:
        checks[RAW] = check_of(newest[1], newest[2], "sweep")
    write_json_result(out, {"note": "written by bench/record_heldout_check.py; keyed by the profile file's "
                                    "sha256[:16] (fidelity/profile.load_profile), 'none' = raw sweep numbers",
                            "checks": dict(sorted(checks.items()))})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
