"""The quickstart sweep with Vizier DEFAULT and QUASI_RANDOM_SEARCH side by side, in one run.

Each algorithm runs the real `run_sweep` (spawned replay workers, journal, outputs) on
examples/configs/quickstart.yaml in a fresh output directory, so nothing is shared between them,
with --max-rounds rounds per branch (default 2, i.e. 2 x 16 candidates: below the quickstart's 60
agg and 284 disagg points, so both branches run a study; the shipped 20 rounds cover both spaces,
and a sweep then enumerates them without any study).
Reported per algorithm: optimizer vs replay seconds, the optimizer's share of wall time, duplicate
rate (trials answered from the dedup cache), distinct evaluations per minute of wall time, and the
best score; and the ratios DEFAULT / QUASI_RANDOM_SEARCH. An untimed one-round quasi-random sweep
first pays the process's one-time costs (imports, timing tables), so neither timed run carries them;
DEFAULT still pays its first GP compile, as a fresh sweep does.

usage:
  .venv/bin/python bench/bench_sweep.py [--max-rounds 2] [--config examples/configs/quickstart.yaml]
      [--algorithms DEFAULT,QUASI_RANDOM_SEARCH] [--out bench/results/sweep.json]
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("DYN_LOG", "warn")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from spica_pipeline.storage import write_json_result  # noqa: E402


def measure(config: Any, algorithm: str, workdir: Path) -> dict[str, Any]:
    from spica_pipeline.config import SmartSearchConfig
    from spica_pipeline.sweep import run_sweep

    data = config.model_dump(mode="json", exclude_unset=True)
    data.setdefault("sweep", {})["algorithm"] = algorithm
    cfg = SmartSearchConfig.from_dict(data)
    started = time.perf_counter()
    result = run_sweep(cfg, workdir / algorithm)
    wall = time.perf_counter() - started
    ledger = result.ledger
    trials = len(ledger)
    duplicates = int((ledger["status"] == "cached").sum())
    distinct = int(ledger.loc[ledger["status"] != "cached", "spec_hash"].dropna().nunique())
    t = result.timings.to_dict()
    best = result.merge.candidates[0] if result.merge.candidates else None
    return {
        "algorithm": algorithm, "trials": trials, "distinct_evaluations": distinct, "duplicates": duplicates,
        "duplicate_rate": round(duplicates / trials, 4) if trials else None,
        "optimizer_seconds": round(t["optimizer_seconds"], 2), "replay_seconds": round(t["replay_seconds"], 2),
        "wall_seconds": round(wall, 2), "optimizer_share_of_wall": round(t["optimizer_seconds"] / wall, 4),
        "evaluations_per_minute": round(distinct / (wall / 60.0), 2),
        "statuses": {k: int(v) for k, v in ledger["status"].value_counts().items()},
        "designers": {str(k): int(v) for k, v in ledger["designer"].value_counts().items()},
        "best_score": None if best is None else best.score,
        "branches": {b.branch: {"rounds": b.rounds, "stalled": b.stalled, "mode": b.mode} for b in result.branches},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-rounds", type=int, default=2, help="rounds per branch (0: the config's own)")
    parser.add_argument("--config", default=str(ROOT / "examples" / "configs" / "quickstart.yaml"))
    parser.add_argument("--algorithms", default="DEFAULT,QUASI_RANDOM_SEARCH")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    from spica_pipeline.config import SmartSearchConfig, load_config

    config = load_config(args.config)
    if args.max_rounds:
        data = config.model_dump(mode="json", exclude_unset=True)
        data.setdefault("sweep", {})["max_rounds"] = args.max_rounds
        config = SmartSearchConfig.from_dict(data)
    runs = []
    with tempfile.TemporaryDirectory(prefix="spica-bench-sweep-") as tmp:
        warm = config.model_dump(mode="json", exclude_unset=True)
        warm.setdefault("sweep", {})["max_rounds"] = 1
        measure(SmartSearchConfig.from_dict(warm), "QUASI_RANDOM_SEARCH", Path(tmp) / "warm-up")
        for algorithm in [a.strip().upper() for a in args.algorithms.split(",") if a.strip()]:
            run = measure(config, algorithm, Path(tmp))
            runs.append(run)
            print(json.dumps(run), flush=True)
    by = {r["algorithm"]: r for r in runs}
    ratios = {}
    if "DEFAULT" in by and "QUASI_RANDOM_SEARCH" in by:
        d, q = by["DEFAULT"], by["QUASI_RANDOM_SEARCH"]
        ratios = {
            "wall_default_over_quasi": round(d["wall_seconds"] / q["wall_seconds"], 3),
            "optimizer_default_over_quasi": round(d["optimizer_seconds"] / max(q["optimizer_seconds"], 1e-9), 2),
            "best_score_default_over_quasi": (round(d["best_score"] / q["best_score"], 4)
                                              if d["best_score"] and q["best_score"] else None),
        }
    result = {
        "benchmark": "sweep", "command": " ".join(["bench/bench_sweep.py", *sys.argv[1:]]),
        "config": os.path.relpath(args.config, ROOT),
        "max_rounds": config.sweep.max_rounds, "per_round": config.sweep.per_round,
        "parallel_evals": config.sweep.parallel_evals,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(),
        "runs": runs, "ratios": ratios,
    }
    out = Path(args.out) if args.out else ROOT / "bench" / "results" / "sweep.json"
    write_json_result(out, result)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
