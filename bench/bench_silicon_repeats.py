"""How far two measurements of one configuration disagree in aiconfigurator-core's silicon_sample.csv.

A configuration is everything a row states (model, precision, system, backend and its version, mode, ISL/OSL,
concurrency, parallel shape and pools). Where the file holds it more than once with different numbers, the spread is
run-to-run noise plus whatever the rows do not record (the benchmark script's version, its engine flags): a floor
under the error of any estimate that, like ours, sees only the configuration. Two numbers per phase:

* pairwise: the APE of one measurement taken as the estimate of another (every ordered pair), as MdAPE and P90;
* floor: the APE of each measurement against its configuration's geometric mean (the best single estimate).

Pairs within COPY_TOLERANCE of each other are counted as copies of one measurement (re-exports), not repeats.
Nothing here is fitted or chosen; both splits are reported, every vLLM/SGLang row with both measurements.

usage: .venv/bin/python bench/bench_silicon_repeats.py [--json bench/results/silicon_repeats.json]
"""

import argparse
import csv
import itertools
import json
import math
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from spica_pipeline.fidelity import silicon  # noqa: E402

PHASES = ("ttft", "tpot")
COPY_TOLERANCE = 0.005  # relative: 0.5 % apart is one measurement exported twice


def _quantile(xs: list[float], q: float) -> float | None:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))] if xs else None


def configuration(row: silicon.SiliconRow) -> tuple:
    return (row.model, row.precision, row.system, row.backend, row.backend_version, row.mode, row.isl, row.osl,
            row.concurrency, row.agg, row.prefill, row.decode)


def distinct(values: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The measurements of one configuration, copies (every phase within COPY_TOLERANCE) merged."""
    kept: list[tuple[float, float]] = []
    for v in sorted(values):
        if not any(all(abs(a - b) <= COPY_TOLERANCE * b for a, b in zip(v, k)) for k in kept):
            kept.append(v)
    return kept


def repeats(rows: list[silicon.SiliconRow]) -> dict[str, Any]:
    """Per split and backend: configurations measured more than once, and how far their measurements disagree."""
    groups: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    for r in rows:
        if r.backend in silicon.BENCH_BACKENDS and r.ttft_ms and r.tpot_ms:
            groups[configuration(r)].append((r.ttft_ms, r.tpot_ms))
    out: dict[str, Any] = {}
    for split in silicon.SPLITS:
        for backend in (None, *silicon.BENCH_BACKENDS):
            pairwise: dict[str, list[float]] = {p: [] for p in PHASES}
            floor: dict[str, list[float]] = {p: [] for p in PHASES}
            configs = measurements = copies = 0
            for key, values in groups.items():
                if silicon.split_of(key[0]) != split or (backend and key[3] != backend) or len(values) < 2:
                    continue
                kept = distinct(values)
                copies += len(values) > 1 and len(kept) == 1
                if len(kept) < 2:
                    continue
                configs += 1
                measurements += len(kept)
                for i, phase in enumerate(PHASES):
                    centre = math.exp(sum(math.log(v[i]) for v in kept) / len(kept))
                    floor[phase] += [abs(centre - v[i]) / v[i] for v in kept]
                    pairwise[phase] += [abs(a[i] - b[i]) / b[i] for a, b in itertools.permutations(kept, 2)]
            out[f"{split}/{backend or 'all'}"] = {
                "configurations_repeated": configs, "measurements": measurements,
                "configurations_copied_only": copies,
                **{phase: {"pairwise": {"mdape": _quantile(pairwise[phase], 0.5), "p90": _quantile(pairwise[phase], 0.9)},
                           "floor": {"mdape": _quantile(floor[phase], 0.5), "p90": _quantile(floor[phase], 0.9)}}
                   for phase in PHASES},
            }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the result here")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_fidelity import silicon_csv_path

    with open(silicon_csv_path(), newline="") as fh:
        rows = silicon.parse_rows(csv.DictReader(fh))
    result = {"bench": "silicon_repeats", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "command": "bench/bench_silicon_repeats.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "copy_tolerance": COPY_TOLERANCE, "repeats": repeats(rows)}
    for name, r in result["repeats"].items():
        if r["configurations_repeated"]:
            print(f"{name:22s} {r['configurations_repeated']:4d} configurations ({r['measurements']} measurements): "
                  + " | ".join(f"{p.upper()} pairwise {r[p]['pairwise']['mdape']:.0%} / {r[p]['pairwise']['p90']:.0%}, "
                               f"floor {r[p]['floor']['mdape']:.0%} / {r[p]['floor']['p90']:.0%}" for p in PHASES))
        else:
            print(f"{name:22s} no configuration measured twice ({r['configurations_copied_only']} copied only)")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
