"""Write a sine-wave Mooncake trace: the workload that exercises predictive and load scaling.

rate(t) = base + amplitude * sin(2*pi*t / period) requests/s, clamped at 0; round(rate) requests
in each second, spread evenly within it; constant ISL/OSL; unique hash_ids (no shared prefixes).

    .venv/bin/python scripts/gen_sine_trace.py out.jsonl --duration 5400 --period 900 --base 6 --amplitude 4
"""

import argparse
import json
import math
from pathlib import Path
from typing import Any


def sine_trace_rows(duration_s: int = 5400, period_s: float = 900.0, base_rps: float = 6.0,
                    amplitude_rps: float = 4.0, isl: int = 4000, osl: int = 200,
                    block_size: int = 512) -> list[dict[str, Any]]:
    """The trace as Mooncake rows (timestamp ms, input_length, output_length, hash_ids)."""
    if duration_s <= 0 or period_s <= 0 or isl < 1 or osl < 1 or block_size < 1:
        raise ValueError("duration, period, isl, osl and block_size must be positive")
    blocks = math.ceil(isl / block_size)
    rows: list[dict[str, Any]] = []
    next_id = 0
    for second in range(int(duration_s)):
        rate = max(0.0, base_rps + amplitude_rps * math.sin(2.0 * math.pi * second / period_s))
        n = int(round(rate))
        for k in range(n):
            rows.append({
                "timestamp": round(second * 1000.0 + k * 1000.0 / n, 3),
                "input_length": int(isl),
                "output_length": int(osl),
                "hash_ids": list(range(next_id, next_id + blocks)),
            })
            next_id += blocks
    return rows


def write_sine_trace(path: str | Path, **kwargs: Any) -> Path:
    """Write `sine_trace_rows(**kwargs)` as JSON Lines; returns the path."""
    path = Path(path)
    path.write_text("".join(json.dumps(row) + "\n" for row in sine_trace_rows(**kwargs)))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--duration", type=int, default=5400, help="seconds (default 5400)")
    parser.add_argument("--period", type=float, default=900.0, help="seconds (default 900)")
    parser.add_argument("--base", type=float, default=6.0, help="req/s (default 6)")
    parser.add_argument("--amplitude", type=float, default=4.0, help="req/s (default 4)")
    parser.add_argument("--isl", type=int, default=4000)
    parser.add_argument("--osl", type=int, default=200)
    args = parser.parse_args()
    path = write_sine_trace(args.out, duration_s=args.duration, period_s=args.period, base_rps=args.base,
                            amplitude_rps=args.amplitude, isl=args.isl, osl=args.osl)
    print(path)


if __name__ == "__main__":
    main()
