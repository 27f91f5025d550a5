"""Benchmark the load-predictor sub-sweep: one hour of traffic, 180 s windows, all 11 presets.

Times every preset inside `sweep_load_predictor` (memoised Prophet fits, the default) and checks
the result against the straightforward path (`memoize=False`) in the same run: winners and losses
must be identical.

    .venv/bin/python bench/bench_load_predictor.py                 # sine trace (default)
    .venv/bin/python bench/bench_load_predictor.py --source mooncake
"""

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spica_pipeline.space.load_predictor import LOAD_PREDICTOR_PRESETS, sweep_load_predictor  # noqa: E402

MOONCAKE = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces" / "mooncake_synthetic_trace.jsonl"


def sine_arrays(duration_s: int):
    spec = importlib.util.spec_from_file_location("gen_sine_trace", ROOT / "scripts" / "gen_sine_trace.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    rows = gen.sine_trace_rows(duration_s=duration_s)  # defaults: period 900 s, 6 +- 4 req/s, isl 4000, osl 200
    return (np.array([r["timestamp"] for r in rows], dtype=float), np.array([r["input_length"] for r in rows]),
            np.array([r["output_length"] for r in rows]))


def mooncake_arrays(duration_s: int):
    from spica_pipeline.traces import read_mooncake_trace

    trace = read_mooncake_trace(MOONCAKE)
    ts = trace.timestamp_ms - trace.timestamp_ms.min()
    stretch = duration_s * 1000.0 / max(ts.max(), 1.0)  # stretch the trace's span to the wanted duration
    return ts * stretch, trace.input_length, trace.output_length


class Arrays:
    def __init__(self, ts, isl, osl):
        self.timestamp_ms, self.input_length, self.output_length = ts, isl, osl


def timed_sweep(traffic, candidates, interval, memoize):
    """Run the sweep; per-preset seconds from the progress callback's timestamps."""
    marks: list[tuple[float, str]] = []
    policy = {"enable_throughput_scaling": True, "enable_load_scaling": False,
              "throughput_adjustment_interval_seconds": interval, "load_adjustment_interval_seconds": 5}
    start = time.perf_counter()
    result = sweep_load_predictor([policy], candidates, traffic, is_trace=True, memoize=memoize,
                                  on_progress=lambda m: marks.append((time.perf_counter(), m)))
    total = time.perf_counter() - start
    per_preset: dict[str, float] = {}
    previous = start
    for at, message in marks:
        if " loss " in message:
            label = message.split(": ", 1)[1].split(" loss ")[0]
            per_preset[label] = at - previous
            previous = at
        elif "windows, warmup" in message:
            previous = at
    return result, per_preset, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", choices=["sine", "mooncake"], default="sine")
    parser.add_argument("--duration", type=int, default=3600, help="seconds of traffic (default 3600)")
    parser.add_argument("--interval", type=int, default=180, help="window seconds (default 180)")
    args = parser.parse_args()
    if args.source == "mooncake" and not MOONCAKE.exists():
        sys.exit(f"{MOONCAKE} not found")
    t = time.perf_counter()
    import pmdarima  # noqa: F401  - import cost is paid once per process; report it separately
    import prophet  # noqa: F401
    import_s = time.perf_counter() - t
    arrays = sine_arrays(args.duration) if args.source == "sine" else mooncake_arrays(args.duration)
    traffic = Arrays(*arrays)
    candidates = list(LOAD_PREDICTOR_PRESETS)
    fast, fast_times, fast_total = timed_sweep(traffic, candidates, args.interval, memoize=True)
    plain, plain_times, plain_total = timed_sweep(traffic, candidates, args.interval, memoize=False)
    iv = args.interval
    print(f"source={args.source} requests={len(arrays[0])} duration={args.duration}s interval={iv}s "
          f"imports={import_s:.1f}s")
    print(f"{'preset':24s} {'loss':>10s} {'memo s':>8s} {'plain s':>8s}")
    for label in candidates:
        print(f"{label:24s} {fast.losses[iv][label]:10.4f} {fast_times.get(label, 0):8.2f} "
              f"{plain_times.get(label, 0):8.2f}")
    print(f"{'total':24s} {'':10s} {fast_total:8.2f} {plain_total:8.2f}")
    same = fast.to_dict() == plain.to_dict()
    print(f"winner memo={fast.best_by_interval[iv]} plain={plain.best_by_interval[iv]} identical_results={same}")
    print(json.dumps({"memo_s": round(fast_total, 2), "plain_s": round(plain_total, 2), "import_s": round(import_s, 2),
                      "winner": fast.best_by_interval[iv], "identical": same}))
    if not same:
        sys.exit("memoised and straightforward sweeps disagree")


if __name__ == "__main__":
    main()
