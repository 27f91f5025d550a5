"""Two or more calibration profiles on the same calibration rows: the rows none of them was fitted on.

Each profile is a path or REV:PATH, a profile as it was at a git revision (e.g. an earlier version the package
no longer ships: `git log -- spica_pipeline/fidelity/data/` lists them). Per profile and phase: calibrated MdAPE,
P90, bias, the score (MdAPE / target + P90 / target, per backend too) and the P10-P90 band coverage. Calibration
rows only; nothing is chosen here.

usage: .venv/bin/python bench/compare_profiles.py PROFILE PROFILE [...]
           [--from-json bench/results/fidelity_replays_calibration.json] [--json OUT]
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from fidelity import files, scores  # noqa: E402

from spica_pipeline.errors import ConfigError  # noqa: E402
from spica_pipeline.fidelity.profile import PHASES, load_profile  # noqa: E402

REPLAYS = "bench/results/fidelity_replays_calibration.json"


def read_profile(name: str) -> dict[str, Any]:
    """A validated profile from a path or REV:PATH (validated as a user's file would be)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / Path(name.rpartition(":")[2]).name
        path.write_text(json.dumps(files.read_json(name)))
        profile, _ = load_profile(str(path))
    assert profile is not None
    return profile


def compare(records: list[dict[str, Any]], profiles: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each profile's scores on the calibration rows outside every profile's fit."""
    fitted = set().union(*(scores.fitted_ids(p) for p in profiles.values()))
    return {name: scores.outside_fit(records, p, fitted) for name, p in profiles.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profiles", nargs="+", help="profile files: PATH or REV:PATH")
    ap.add_argument("--from-json", default=REPLAYS, help="the calibration replays (PATH or REV:PATH, comma-separated)")
    ap.add_argument("--json", help="write the result here")
    args = ap.parse_args(argv)
    try:
        profiles = {name: read_profile(name) for name in args.profiles}
        records = list(files.records_by_id(args.from_json, "calibration").values())
    except (OSError, ValueError, ConfigError) as exc:
        print(f"compare_profiles: {exc}", file=sys.stderr)
        return 2
    result = {"bench": "compare_profiles", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "command": "bench/compare_profiles.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "replays": args.from_json, "profiles": compare(records, profiles)}
    for name, s in result["profiles"].items():
        print(f"{name} ({s['rows']} rows): " + " | ".join(
            f"{p.upper()} {100 * s[p]['mdape']:.1f} / {100 * s[p]['p90']:.1f} % score {s[p]['score']} "
            f"band {100 * s[p]['band_coverage']:.0f} %" for p in PHASES))
    if args.json:
        files.write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
