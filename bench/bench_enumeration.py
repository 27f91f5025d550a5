"""Branch enumeration time for a 64-GPU MoE disagg space: cold (fresh process) vs memoised.

Cold = the first `enumerate_branches` call in a fresh interpreter (AIC perf DBs and model built on
demand, every cache empty; imports excluded). Memoised = the same call again in that process.

    .venv/bin/python bench/bench_enumeration.py [--model Qwen/Qwen3-235B-A22B] [--budget 64]
"""

import argparse
import json
import subprocess
import sys
import time

_CHILD = r"""
import json, sys, time
from spica_pipeline.config import SmartSearchConfig
from spica_pipeline.space.branches import enumerate_branches

args = json.loads(sys.argv[1])
config = SmartSearchConfig.from_dict({
    "search_space": {"model_name": args["model"], "hardware_sku": args["sku"], "gpu_budget": args["budget"],
                     "deployment_mode": args["modes"], "backend": args["backends"]},
    "workload": {"isl": 4000, "osl": 1000, "request_rate": 25.0, "num_request_ratio": 10.0},
})
t0 = time.perf_counter()
first = enumerate_branches(config)
cold = time.perf_counter() - t0
memo = []
for _ in range(args["repeats"]):
    t0 = time.perf_counter()
    enumerate_branches(config)
    memo.append(time.perf_counter() - t0)
print(json.dumps({"cold_s": cold, "memo_s": min(memo),
                  "pools": {b.deployment_mode: len(b.parallel_configs) for b in first.branches},
                  "warnings": first.warnings}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="Qwen/Qwen3-235B-A22B")
    parser.add_argument("--sku", default="h200_sxm")
    parser.add_argument("--budget", type=int, default=64)
    parser.add_argument("--modes", nargs="+", default=["disagg"])
    parser.add_argument("--backends", nargs="+", default=["vllm", "sglang"])
    parser.add_argument("--repeats", type=int, default=5)
    args = vars(parser.parse_args())
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(args)],
                         capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    r = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"space: {args['model']} on {args['sku']}, gpu_budget={args['budget']}, modes={args['modes']}, "
          f"backends={args['backends']}; pool sizes {r['pools']}")
    print(f"cold (fresh process, caches empty): {r['cold_s']:.3f} s "
          f"(process wall incl. imports {wall:.1f} s)")
    print(f"memoised (same call again, best of {args['repeats']}): {r['memo_s'] * 1000:.2f} ms")
    print(f"ratio cold/memoised: {r['cold_s'] / r['memo_s']:.0f}x")


if __name__ == "__main__":
    main()
