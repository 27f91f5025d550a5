"""Generate a small seeded Mooncake-format trace (JSON Lines) for examples and tests.

Arrivals are a Poisson process whose rate swings sinusoidally over the trace, so the planner's
load predictors have a shape to learn. Some requests belong to shared-prefix groups (the same
leading hash_ids), the rest are unique. hash_ids are 512-token blocks:
len(hash_ids) == ceil(input_length / 512).

    .venv/bin/python scripts/gen_trace.py --out examples/traces/small_mooncake.jsonl
"""

import argparse
import json
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spica_pipeline.storage import atomic_write_text  # noqa: E402


def generate(
    *,
    seed: int = 0,
    num_requests: int = 400,
    duration_s: float = 240.0,
    rate_swing: float = 0.5,
    num_groups: int = 4,
    shared_fraction: float = 0.6,
    isl_range: tuple[int, int] = (1000, 6000),
    osl_range: tuple[int, int] = (50, 400),
    block_size: int = 512,
) -> list[dict]:
    """Rows sorted by timestamp (ms, the first arrival at 0)."""
    rng = random.Random(seed)
    mean_rate = num_requests / duration_s
    peak = mean_rate * (1 + rate_swing)

    def rate(t: float) -> float:
        return mean_rate * (1 + rate_swing * math.sin(2 * math.pi * t / duration_s))

    # Non-homogeneous Poisson arrivals by thinning a homogeneous process at the peak rate.
    times: list[float] = []
    t = 0.0
    while len(times) < num_requests:
        t += rng.expovariate(peak)
        if rng.random() * peak <= rate(t % duration_s):
            times.append(t)

    next_hash = 0

    def fresh(n: int) -> list[int]:
        nonlocal next_hash
        ids = list(range(next_hash, next_hash + n))
        next_hash += n
        return ids

    # A group's shared prefix (a system prompt, a document) is 2-6 blocks, capped to fit the ISL range.
    max_prefix = max(1, min(6, (isl_range[1] - 1) // block_size))
    groups = [fresh(rng.randint(min(2, max_prefix), max_prefix)) for _ in range(num_groups)]

    rows = []
    for arrival in times:
        isl = rng.randint(*isl_range)
        osl = rng.randint(*osl_range)
        prefix: list[int] = []
        if groups and rng.random() < shared_fraction:
            prefix = groups[rng.randrange(len(groups))]
            # the request carries the whole prefix plus at least one token of its own
            isl = max(isl, len(prefix) * block_size + rng.randint(1, block_size))
        blocks = math.ceil(isl / block_size)
        hash_ids = prefix + fresh(blocks - len(prefix))
        rows.append({
            "timestamp": round((arrival - times[0]) * 1000.0, 3),
            "input_length": isl,
            "output_length": osl,
            "hash_ids": hash_ids,
        })
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-requests", type=int, default=400)
    p.add_argument("--duration-s", type=float, default=240.0)
    p.add_argument("--rate-swing", type=float, default=0.5, help="0 = constant rate; < 1")
    p.add_argument("--groups", type=int, default=4, help="shared-prefix groups")
    p.add_argument("--shared-fraction", type=float, default=0.6)
    p.add_argument("--isl-min", type=int, default=1000)
    p.add_argument("--isl-max", type=int, default=6000)
    p.add_argument("--osl-min", type=int, default=50)
    p.add_argument("--osl-max", type=int, default=400)
    a = p.parse_args(argv)
    if not (0 <= a.rate_swing < 1) or a.num_requests < 1 or a.duration_s <= 0:
        p.error("need 0 <= --rate-swing < 1, --num-requests >= 1, --duration-s > 0")
    rows = generate(
        seed=a.seed, num_requests=a.num_requests, duration_s=a.duration_s, rate_swing=a.rate_swing,
        num_groups=a.groups, shared_fraction=a.shared_fraction,
        isl_range=(a.isl_min, a.isl_max), osl_range=(a.osl_min, a.osl_max),
    )
    atomic_write_text(a.out, "".join(json.dumps(r) + "\n" for r in rows))
    span = rows[-1]["timestamp"] / 1000.0
    print(f"wrote {len(rows)} requests over {span:.0f} s to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
