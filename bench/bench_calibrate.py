"""How long `spica calibrate` takes on 10 measured points, cold and with the timing cache warm.

Ten silicon rows of one benchmark campaign (aiconfigurator-core's silicon_sample.csv, calibration split: one
source file and engine version of one model, system, backend and mode) are written as the measurement CSV a user
keeps (fidelity/readers/table.py: model, system, backend, precision, shape, concurrency, ISL, OSL, TTFT, TPOT),
and the public CLI runs on it in a subprocess: `spica calibrate rows.csv --output profile.json`. The wall time
counts everything a user waits for: the interpreter, the imports, reading, replaying every point twice (the
benchmark client's replay and the sweep's) and the fit. Each repeat runs twice: with an empty timing cache
(SPICA_CACHE_DIR in a fresh directory: every timing table built) and again with the cache the first run left (what
a user has after the sweep whose picks they measured); the target is read on the median of the repeats. The rows are the campaign's first 10 in the fidelity bench's row order (a
fixed random sample), so their shapes and loads are what one campaign holds. The CPU seconds the subprocess used
are recorded beside its wall time, and the load average before: on a shared machine the wall time is the CPU time
stretched by everyone else's work.

usage:
  DYN_LOG=warn .venv/bin/python bench/bench_calibrate.py [--rows 10] [--repeats 3] [--campaign KEY]
      [--out bench/results/calibrate.json]
"""

import argparse
import csv
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

os.environ.setdefault("DYN_LOG", "warn")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from fidelity import files, rows  # noqa: E402
from fidelity.decisions import source_file  # noqa: E402

from spica_pipeline.storage import write_json_result  # noqa: E402

TARGET_SECONDS = 30.0
COLUMNS = ("model", "system", "backend", "precision", "tp", "pp", "attention_dp", "moe_tp", "moe_ep", "replicas",
           "concurrency", "isl", "osl", "ttft_ms", "tpot_ms")
DEFAULT_CAMPAIGN_MODEL = "Qwen/Qwen3-32B"  # a dense calibration model whose campaigns span shapes and loads


def campaigns() -> dict[str, list[Any]]:
    """Calibration-split agg cases of the replayed backends by campaign, each in the bench's row order."""
    silicon_rows, mapped = rows.load_cases()
    del silicon_rows
    out: dict[str, list[Any]] = defaultdict(list)
    for case in rows.select(mapped, split="calibration", modes=["agg"]):
        r = case.row
        out["|".join((r.model, r.precision, r.system, r.backend, r.mode, r.backend_version,
                      source_file(r.source)))].append(case)
    return dict(out)


def pick_campaign(found: dict[str, list[Any]], n: int, key: str | None) -> str:
    if key is not None:
        if key not in found:
            raise SystemExit(f"--campaign {key!r} is not a calibration campaign; some: {', '.join(sorted(found)[:5])}")
        return key
    eligible = [k for k, cases in found.items() if len(cases) >= n and k.startswith(DEFAULT_CAMPAIGN_MODEL + "|")]
    if not eligible:
        raise SystemExit(f"no calibration campaign of {DEFAULT_CAMPAIGN_MODEL} has {n} agg rows")
    return max(eligible, key=lambda k: (len(found[k]), k))


def write_csv(cases: list[Any], path: Path) -> list[dict[str, Any]]:
    """The rows as the measurement CSV; returns what was written."""
    written = []
    for case in cases:
        r, shape = case.row, case.roles["agg"]
        written.append({"model": case.aic_model, "system": r.system, "backend": r.backend, "precision": "",
                        "tp": shape.tp, "pp": shape.pp, "attention_dp": shape.attention_dp, "moe_tp": shape.moe_tp,
                        "moe_ep": shape.moe_ep, "replicas": shape.workers, "concurrency": r.concurrency,
                        "isl": r.isl, "osl": r.osl, "ttft_ms": r.ttft_ms, "tpot_ms": r.tpot_ms})
    with path.open("w", newline="") as fh:
        out = csv.DictWriter(fh, fieldnames=COLUMNS)
        out.writeheader()
        out.writerows(written)
    return written


def run_cli(csv_path: Path, profile: Path, cache: Path) -> dict[str, Any]:
    """One `spica calibrate` in a subprocess: exit code, wall seconds, what it printed."""
    env = {**os.environ, "SPICA_CACHE_DIR": str(cache), "DYN_LOG": "warn"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([str(ROOT / ".venv" / "bin" / "spica"), "calibrate", str(csv_path), "--output", str(profile)],
                          capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"exit_code": done.returncode, "wall_seconds": round(wall, 2), "cpu_seconds": round(cpu, 2),
            "stdout": done.stdout.splitlines(), "stderr": done.stderr.splitlines()[-5:]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10, help="measured points (default 10)")
    ap.add_argument("--repeats", type=int, default=3, help="cold + warm pairs, each with a fresh cache (default 3)")
    ap.add_argument("--campaign", help="a campaign key (default: the largest Qwen3-32B agg campaign)")
    ap.add_argument("--out", help="write the result JSON here (bench/results/calibrate.json)")
    args = ap.parse_args(argv)
    command = "bench/bench_calibrate.py " + " ".join(sys.argv[1:] if argv is None else argv)
    found = campaigns()
    key = pick_campaign(found, args.rows, args.campaign)
    cases = found[key][:args.rows]
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {"cold": [], "warm": []}
    written: list[dict[str, Any]] = []
    for repeat in range(args.repeats):  # each repeat: a fresh cache, then the same cache again
        with tempfile.TemporaryDirectory(prefix="bench-calibrate-") as tmp:
            work = Path(tmp)
            written = write_csv(cases, work / "rows.csv")
            for name in ("cold", "warm"):
                run = run_cli(work / "rows.csv", work / f"{name}.json", work / "cache")
                print(f"{name} {repeat + 1}: exit {run['exit_code']}, {run['wall_seconds']:.1f} s wall, "
                      f"{run['cpu_seconds']:.1f} s CPU", flush=True)
                if run["exit_code"] == 0:
                    profile = json.loads((work / f"{name}.json").read_text())
                    run["own"] = {k: profile["own"][k] for k in ("rows", "factors", "leave_one_out")}
                if repeat:
                    run.pop("stdout")  # the first repeat's output shows what a user sees
                runs[name].append(run)
    median = {name: statistics.median(r["wall_seconds"] for r in rs) for name, rs in runs.items()}
    shapes = sorted({f"tp{w['tp']} x{w['replicas']}" for w in written})
    result = {
        "bench": "calibrate", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": command,
        "cores": os.cpu_count(), "load_average_before": [round(x, 2) for x in load_before],
        "aiconfigurator_core": files.version("aiconfigurator-core"),
        "ai_dynamo_runtime": files.version("ai-dynamo-runtime"),
        "campaign": key, "points": len(written), "shapes": shapes,
        "concurrencies": sorted({int(w["concurrency"]) for w in written}),
        "target_seconds": TARGET_SECONDS, "median_wall_seconds": median, "runs": runs,
        "met": {name: all(r["exit_code"] == 0 for r in rs) and median[name] <= TARGET_SECONDS
                for name, rs in runs.items()},
    }
    print(f"{len(written)} points of {key} ({', '.join(shapes)}; concurrency {result['concurrencies']}), "
          f"load average {load_before[0]:.1f} on {os.cpu_count()} cores")
    for name, rs in runs.items():
        walls = ", ".join(f"{r['wall_seconds']:.1f}" for r in rs)
        cpus = ", ".join(f"{r['cpu_seconds']:.1f}" for r in rs)
        print(f"  {name}: median {median[name]:.1f} s wall ({walls}; CPU {cpus}) (target <= {TARGET_SECONDS:.0f} s "
              f"wall: {'met' if result['met'][name] else 'missed'})")
    if args.out:
        write_json_result(args.out, result)
        print(f"wrote {args.out}")
    return 0 if all(r["exit_code"] == 0 for rs in runs.values() for r in rs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
