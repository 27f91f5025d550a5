"""Evaluator overhead and throughput, printed side by side in one run (a script, not a test).

    DYN_LOG=warn .venv/bin/python bench/bench_evaluator.py [--requests 1000] [--repeats 7]

1. raw `dynamo._core` replay call vs `ReplayEvaluator.evaluate` on a cached identity (same kwargs);
2. timing-table build: cold in a fresh process, cold with AIC already loaded, cached in-process,
   cached on disk;
3. candidates evaluated per second with 1 and 2 spawned worker processes (workers warmed first).
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("DYN_LOG", "warn")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spica_pipeline.evaluate import timing  # noqa: E402
from spica_pipeline.evaluate.evaluator import EvalRequest  # noqa: E402
from spica_pipeline.evaluate.pool import EvaluationPool  # noqa: E402
from spica_pipeline.evaluate.replay import ReplayEvaluator  # noqa: E402
from spica_pipeline.space.candidate import Candidate  # noqa: E402

MODEL, SKU, BACKEND = "Qwen/Qwen3-32B", "h200_sxm", "vllm"
GOAL = {"target": "throughput", "sla": None, "pareto_objectives": None}


def candidate(version: str, **over) -> Candidate:
    s = {
        "deployment_mode": "agg", "backend": BACKEND, "backend_version": version, "model_name": MODEL,
        "hardware_sku": SKU, "gpu_budget": 8, "startup_time": None, "aic_nextn": None, "num_g2_blocks": 0,
        "tp": 2, "pp": 1, "attention_dp": 1, "moe_tp": 1, "moe_ep": 1, "replicas": 4, "used_gpus": 8,
        "agg_max_num_batched_tokens": 8192, "agg_max_num_seqs": 256, "agg_block_size": 64,
        "agg_gpu_memory_utilization": 0.9, "agg_enable_prefix_caching": True, "router_mode": "round_robin",
        "enable_throughput_scaling": False, "enable_load_scaling": False,
    }
    s.update(over)
    return Candidate.from_dict(s)


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


COLD_SNIPPET = """
import sys, time, os
os.environ.setdefault("DYN_LOG", "warn")
sys.path.insert(0, {root!r})
from spica_pipeline.evaluate import timing
t0 = time.perf_counter()
timing.timing_table(timing.EngineIdentity({model!r}, {sku!r}, {backend!r}, {version!r}, tp=4), cache_dir={cache!r})
print(time.perf_counter() - t0)
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--candidates", type=int, default=12)
    args = ap.parse_args()

    from spica_pipeline.space.model_hw import latest_backend_version

    version = latest_backend_version(SKU, BACKEND)
    cache = tempfile.mkdtemp(prefix="spica-bench-")
    ev = ReplayEvaluator(cache_dir=cache)
    rate = 12.0
    workload = {"isl": 3000, "osl": 250, "request_rate": rate, "num_request_ratio": args.requests / rate}
    print(f"identity {MODEL} {SKU} {BACKEND} {version}; synthetic {args.requests} requests, cache {cache}")

    # 1. wrapper overhead on a cached identity
    request = EvalRequest(candidate(version), workload, GOAL)
    assert ev.evaluate(request).status == "feasible"  # builds and caches the identity
    call = ev.prepare(request)
    import dynamo._core as core

    raw = median_time(lambda: core.run_mocker_synthetic_trace_replay(*call.args, **call.kwargs), args.repeats)
    ours = median_time(lambda: ev.evaluate(request), args.repeats)
    print("\n[1] replay wall time, median of", args.repeats)
    print(f"    raw dynamo._core call      {raw * 1000:8.1f} ms")
    print(f"    ReplayEvaluator.evaluate   {ours * 1000:8.1f} ms   ratio {ours / raw:5.3f}  "
          f"(overhead {100 * (ours / raw - 1):+.1f} %)")

    # 2. timing-table build
    fresh = tempfile.mkdtemp(prefix="spica-bench-cold-")
    code = COLD_SNIPPET.format(root=str(Path(__file__).resolve().parents[1]), model=MODEL, sku=SKU,
                               backend=BACKEND, version=version, cache=fresh)
    cold_process = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                        check=True).stdout.strip().splitlines()[-1])
    ident = timing.EngineIdentity(MODEL, SKU, BACKEND, version, tp=8)
    fresh2 = tempfile.mkdtemp(prefix="spica-bench-cold2-")
    t0 = time.perf_counter()
    timing.timing_table(ident, cache_dir=fresh2)
    cold_loaded = time.perf_counter() - t0
    memo = median_time(lambda: timing.timing_table(ident, cache_dir=fresh2), args.repeats)

    def from_disk():
        timing._timing_memo.clear()
        timing.timing_table(ident, cache_dir=fresh2)

    disk = median_time(from_disk, args.repeats)
    print("\n[2] timing table (NPZ) per identity")
    print(f"    cold, fresh process (AIC import + DB load)   {cold_process * 1000:9.1f} ms")
    print(f"    cold, AIC already loaded (new identity)       {cold_loaded * 1000:9.1f} ms")
    print(f"    cached on disk (new process / cleared memo)   {disk * 1000:9.3f} ms   "
          f"{cold_loaded / disk:8.0f}x faster than cold")
    print(f"    cached in-process                             {memo * 1000:9.3f} ms")

    # 3. candidates per second with 1 vs 2 workers
    requests = [EvalRequest(candidate(version, agg_max_num_seqs=(128, 256, 512)[i % 3], replicas=2 + i % 3,
                                      used_gpus=2 * (2 + i % 3)), workload, GOAL) for i in range(args.candidates)]
    for r in requests:  # warm the disk cache so workers only read it
        ev.prepare(r)
    rates = {}
    for workers in (1, 2):
        with EvaluationPool(ev, workers=workers, max_eval_seconds=120) as pool:
            pool.evaluate_wave(requests[:workers])  # start and warm the workers
            t0 = time.perf_counter()
            outs = pool.evaluate_wave(requests)
            elapsed = time.perf_counter() - t0
        assert all(o.status == "feasible" for o in outs), [o.reason for o in outs]
        rates[workers] = len(requests) / elapsed
        mean_replay = statistics.fmean(o.replay_seconds for o in outs)
        print(f"\n[3] {workers} worker(s): {len(requests)} candidates in {elapsed:.2f} s -> "
              f"{rates[workers]:.2f} candidates/s (mean replay {mean_replay * 1000:.0f} ms)")
    sequential = median_time(lambda: [ev.evaluate(r) for r in requests], 1)
    print(f"    in-process sequential: {len(requests) / sequential:.2f} candidates/s")
    print(f"    2 vs 1 workers: x{rates[2] / rates[1]:.2f} (machine has {os.cpu_count()} cores, shared)")


if __name__ == "__main__":
    main()
