"""Branch enumeration time, this checkout against a baseline revision, side by side: the examples and a 64-GPU MoE
disagg space, cold (fresh process) and memoised.

Cold = the first `enumerate_branches` call in a fresh interpreter (AIC perf DBs and model built on demand, every
cache empty; imports excluded). Memoised = the same call again in that process. The baseline runs the package as
it was at `--baseline` (extracted with `git archive` into a temporary directory; the venv and AIC are shared), so
both columns come from the same machine in the same run.

The machine is shared, so each cold time is the best of --cold-runs fresh processes, baseline and this
checkout alternating.

    .venv/bin/python bench/bench_enumeration.py [--baseline REV] [--cold-runs 5] [--repeats 5] [--spaces examples,moe64]
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The revision before the space held single-GPU MoE, attention DP with TP and wide EP (the fixed 1..16 ladder).
BASELINE = "01851b4"
EXAMPLES = ("quickstart", "planner", "min_gpus", "pareto", "trace")
MOE_SPACE = {
    "search_space": {"model_name": "Qwen/Qwen3-235B-A22B", "hardware_sku": "h200_sxm", "gpu_budget": 64,
                     "deployment_mode": ["disagg"], "backend": ["vllm", "sglang"]},
    "workload": {"isl": 4000, "osl": 1000, "request_rate": 25.0, "num_request_ratio": 10.0},
}

_CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[2])
from spica_pipeline.config import SmartSearchConfig
from spica_pipeline.config.loader import load_config
from spica_pipeline.space.branches import enumerate_branches

args = json.loads(sys.argv[1])
config = load_config(args["path"]) if args.get("path") else SmartSearchConfig.from_dict(args["config"])
t0 = time.perf_counter()
first = enumerate_branches(config)
cold = time.perf_counter() - t0
memo = []
for _ in range(args["repeats"]):
    t0 = time.perf_counter()
    enumerate_branches(config)
    memo.append(time.perf_counter() - t0)
import spica_pipeline
print(json.dumps({"cold_s": cold, "memo_s": min(memo), "package": spica_pipeline.__file__,
                  "pools": {b.deployment_mode: len(b.parallel_configs) for b in first.branches}}))
"""


def _measure(code_root: Path, job: dict, repeats: int) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps({**job, "repeats": repeats}), str(code_root)],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert Path(result.pop("package")).resolve().is_relative_to(code_root.resolve()), "imported the wrong package"
    return result


def _best(runs: list[dict]) -> dict:
    best = min(runs, key=lambda r: r["cold_s"])
    return {**best, "cold_runs_s": [round(r["cold_s"], 3) for r in runs], "memo_s": min(r["memo_s"] for r in runs)}


def _extract(rev: str, into: Path) -> Path:
    """The package as it was at `rev`, in `into` (git archive: the checkout is left alone)."""
    archive = subprocess.run(["git", "archive", rev, "spica_pipeline"], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def jobs(spaces: list[str]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    if "examples" in spaces:
        out.update({name: {"path": f"examples/configs/{name}.yaml"} for name in EXAMPLES})
    if "moe64" in spaces:
        out["moe64 (Qwen3-235B-A22B, h200, 64 GPUs, disagg, vllm+sglang)"] = {"config": MOE_SPACE}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=BASELINE, help="git revision to compare with")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cold-runs", type=int, default=5, help="fresh processes per side; the best counts")
    parser.add_argument("--spaces", default="examples,moe64")
    args = parser.parse_args()
    rev = subprocess.run(["git", "rev-parse", "--short", args.baseline], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.strip()
    results = []
    with tempfile.TemporaryDirectory(prefix="spica-enum-") as tmp:
        baseline_root = _extract(rev, Path(tmp))
        print(f"cold enumeration: best of {args.cold_runs} fresh processes per side; baseline {rev} vs this "
              f"checkout; memoised: best of {args.repeats} calls")
        print(f"{'space':<58} {'baseline s':>10} {'now s':>8} {'ratio':>6}  pools baseline -> now")
        for name, job in jobs(args.spaces.split(",")).items():
            t0 = time.perf_counter()
            olds, news = [], []
            for _ in range(args.cold_runs):
                olds.append(_measure(baseline_root, job, args.repeats))
                news.append(_measure(ROOT, job, args.repeats))
            old, new = _best(olds), _best(news)
            ratio = new["cold_s"] / old["cold_s"] if old["cold_s"] else float("nan")
            results.append({"space": name, "baseline": old, "now": new, "cold_ratio": round(ratio, 3),
                            "wall_s": round(time.perf_counter() - t0, 1)})
            print(f"{name:<58} {old['cold_s']:>10.3f} {new['cold_s']:>8.3f} {ratio:>6.2f}  "
                  f"{old['pools']} -> {new['pools']}")
            print(f"{'':<58} memoised {old['memo_s'] * 1000:.2f} ms -> {new['memo_s'] * 1000:.2f} ms")
    print(json.dumps({"baseline": rev, "results": results}))


if __name__ == "__main__":
    main()
