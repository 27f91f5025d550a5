"""Peak memory of one synthetic replay against its request count and input length.

Measures what `config/limits.py` assumes (`REPLAY_BYTES_PER_REQUEST`, `REPLAY_BYTES_PER_INPUT_BLOCK`):
each point runs `dynamo._core.run_mocker_synthetic_trace_replay` in a fresh process and reads its
peak RSS, so the slope between two request counts is the per-request cost.

    DYN_LOG=warn .venv/bin/python bench/bench_replay_memory.py [--quick] [--json OUT]
"""

import argparse
import json
import subprocess
import sys
import time

CHILD = """
import resource, sys, time
import dynamo._core as c
isl, osl, n = (int(x) for x in sys.argv[1:4])
eng = {"engine": {"backend": "vllm", "num_gpu_blocks": 1 << 20, "block_size": 16,
                  "max_num_seqs": 256, "max_num_batched_tokens": 8192}}
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
c.run_mocker_synthetic_trace_replay(isl, osl, n, extra_engine_args=eng, num_workers=1, request_rate=1e6,
                                    capture_per_request=False)
print(before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter() - t)
"""


def peak(isl: int, osl: int, n: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(isl), str(osl), str(n)], capture_output=True,
                         text=True, timeout=600, env={"DYN_LOG": "warn", "PATH": "/usr/bin:/bin"})
    if out.returncode != 0:
        raise SystemExit(out.stderr[-2000:])
    before, after, wall = out.stdout.split()
    return {"isl": isl, "osl": osl, "requests": n, "rss_before_kib": int(before), "rss_peak_kib": int(after),
            "wall_s": round(float(wall), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="two request counts, one input length")
    parser.add_argument("--json", help="write the points here")
    args = parser.parse_args()
    counts = (2_000, 20_000) if args.quick else (2_000, 20_000, 60_000)
    isls = (1024,) if args.quick else (256, 1024, 8192)
    points = [peak(isl, 128, n) for isl in isls for n in counts]
    print(f"{'isl':>6} {'requests':>9} {'peak RSS MiB':>13} {'wall s':>7}")
    for p in points:
        print(f"{p['isl']:>6} {p['requests']:>9} {p['rss_peak_kib'] / 1024:>13.1f} {p['wall_s']:>7}")
    for isl in isls:
        mine = [p for p in points if p["isl"] == isl]
        lo, hi = mine[0], mine[-1]
        slope = (hi["rss_peak_kib"] - lo["rss_peak_kib"]) * 1024 / (hi["requests"] - lo["requests"])
        print(f"isl {isl}: {slope:,.0f} bytes per request ({lo['requests']} -> {hi['requests']} requests)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"command": " ".join(["bench/bench_replay_memory.py", *sys.argv[1:]]),
                       "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "points": points}, fh, indent=1)


if __name__ == "__main__":
    main()
