"""What the calibration profile costs a real sweep, and whether it changes the pick.

With `evaluation.calibration: auto` a closed-loop candidate is replayed twice: the sweep's ramped
steady state and the benchmark client the profile was fitted against (evaluate/replay.py
`_benchmark_client`). This runs the real `run_sweep` on one config three times in one process
order, `none`, `auto`, `none` (so drift on a shared box shows as the spread of the two `none`
runs), each in a fresh output directory, and reports side by side: wall and replay seconds, the
ratio auto / mean(none), and how the two rankings agree on the same configurations (Spearman of
the goal, top-k overlap, whether the pick is the same configuration, the median calibrated / raw
goal). Open-loop workloads (request_rate, traces) get no client replay, so the default config is
closed loop: bench/configs/closed_loop_goodput.yaml.

usage:
  .venv/bin/python bench/bench_calibration_cost.py [--config bench/configs/closed_loop_goodput.yaml]
      [--out bench/results/calibration_cost.json]
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

ORDER = ("none", "auto", "none")
TOP_K = (1, 10, 20)


def run(config: Any, calibration: str, workdir: Path) -> tuple[dict[str, Any], dict[str, float]]:
    """One sweep with `evaluation.calibration` set; its timings and {configuration: score}."""
    from spica_pipeline.config import SmartSearchConfig
    from spica_pipeline.sweep import run_sweep

    data = config.model_dump(mode="json", exclude_unset=True)
    data.setdefault("evaluation", {})["calibration"] = calibration
    started = time.perf_counter()
    result = run_sweep(SmartSearchConfig.from_dict(data), workdir)
    wall = time.perf_counter() - started
    ledger = result.ledger
    scores = {configuration(row.branch, row.config): float(row.score) for row in ledger.itertuples()
              if row.status == "feasible"}
    t = result.timings.to_dict()
    return {"calibration": calibration, "trials": len(ledger), "feasible": len(scores),
            "wall_seconds": round(wall, 2), "replay_seconds": round(t["replay_seconds"], 2),
            "optimizer_seconds": round(t["optimizer_seconds"], 2)}, scores


def configuration(branch: str, config: str) -> str:
    """A trial's built configuration without what the calibration setting adds (the spec hash and
    the config's `benchmark_client` replay carry it), so the two runs' trials can be matched."""
    built = {k: v for k, v in json.loads(config).items() if k != "benchmark_client"}
    return f"{branch}|{json.dumps(built, sort_keys=True)}"


def agreement(auto: dict[str, float], raw: dict[str, float]) -> dict[str, Any]:
    """How the calibrated ranking agrees with the raw one on the configurations both evaluated."""
    import numpy as np
    from scipy.stats import spearmanr  # type: ignore[import-untyped]

    keys = sorted(set(auto) & set(raw))
    a = np.array([auto[k] for k in keys])
    r = np.array([raw[k] for k in keys])

    def top(scores: Any, k: int) -> set[str]:
        cut = np.sort(scores)[::-1][min(k, len(scores)) - 1]  # ties at the cut all count
        return {key for key, s in zip(keys, scores) if s >= cut}

    both = (a > 0) & (r > 0)
    return {
        "configurations": len(keys),
        "spearman": round(float(spearmanr(a, r).correlation), 4),
        "same_pick": bool(top(a, 1) & top(r, 1)),
        "top_k_overlap": {str(k): {"auto": len(top(a, k)), "none": len(top(r, k)),
                                   "both": len(top(a, k) & top(r, k))} for k in TOP_K},
        "scoring_above_zero": {"auto": int((a > 0).sum()), "none": int((r > 0).sum())},
        "median_auto_over_none": round(float(np.median(a[both] / r[both])), 4) if both.any() else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "bench" / "configs" / "closed_loop_goodput.yaml"))
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "calibration_cost.json"))
    args = parser.parse_args(argv)

    from spica_pipeline.config import load_config

    config = load_config(args.config)
    runs, scores = [], []
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with tempfile.TemporaryDirectory(prefix="spica-bench-calibration-") as tmp:
        for i, calibration in enumerate(ORDER):
            summary, by_config = run(config, calibration, Path(tmp) / f"{i}-{calibration}")
            runs.append(summary)
            scores.append(by_config)
            print(json.dumps(summary), flush=True)
    none_wall = (runs[0]["wall_seconds"] + runs[2]["wall_seconds"]) / 2
    none_replay = (runs[0]["replay_seconds"] + runs[2]["replay_seconds"]) / 2
    result = {
        "benchmark": "calibration_cost", "config": os.path.relpath(args.config, ROOT), "order": list(ORDER),
        "command": " ".join(["bench/bench_calibration_cost.py", *(sys.argv[1:] if argv is None else argv)]),
        "date": started, "cpus": os.cpu_count(), "loadavg_at_start": os.getloadavg()[0], "runs": runs,
        "ratios": {"wall_auto_over_none": round(runs[1]["wall_seconds"] / none_wall, 3),
                   "replay_auto_over_none": round(runs[1]["replay_seconds"] / none_replay, 3),
                   "none_runs_spread": round(abs(runs[0]["wall_seconds"] - runs[2]["wall_seconds"]) / none_wall, 3)},
        "ranking": agreement(scores[1], scores[0]),
        "none_runs_equal": scores[0] == scores[2],
    }
    print(json.dumps({k: result[k] for k in ("ratios", "ranking", "none_runs_equal")}, indent=1))
    write_json_result(Path(args.out), result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
