"""Predicted costs for the cost-aware study loop: deterministic, so the same seed gives the same ledger.

The default cost-aware policy (`sweep.cost_aware: predicted`) decides whether an ask goes to the
model-based designer or to the cheap quasi-random fill from *predicted* seconds only: a fitted cost
of a model-based suggest (this module) and a per-trial replay estimate fixed before the branch starts
(each finished trial's from the request count its outcome records; the caller's a-priori estimate
for trials still running). No clock is read, so two fresh runs of the same
config and seed make the same choices; `cost_aware: measured` uses measured seconds instead (adapts
to the machine, not reproducible across fresh runs).

Constants and where they come from (2 cores, 2026-12-04):
  * GP-UCB-PE suggest(k), CPU seconds after the first call of its padding bucket (docs/performance.md,
    "Suggest cost for search/cost.py after this change"). Every suggest pads its trials to one
    bucket, R = max(32, next power of two of history + pending + k) (`suggest_bucket`, which
    resources/vizier.py pads to), and costs about a(R) + k x b(R): a = the ARD fit and fixed work, b = one acquisition
    optimisation. b is the k = 1, 2, 4, 8 slope measured 16:27-16:32 UTC; a puts k = 8 on the
    bench's median (`bench/bench_vizier.py --after-first --count 8 --ns 8,16,32,64,100 --objectives
    1|2`, 16:12-16:21 UTC, bench/results/vizier_after_first.json: one objective 0.91-0.99 / 1.53 /
    2.66 s at R = 32 / 64 / 128, two objectives 0.93-0.99 / 1.68 / 3.37 s), the higher of the two
    trial counts where two share a bucket. Beyond 128 rows (not measured) each doubling of R is
    charged x ASK_GROWTH_PER_DOUBLING, the steeper 64 -> 128 step (two objectives, 1.68 -> 3.37 s).
    A bucket's first suggest compiles its programs (8.7-11.1 s CPU at 64 and 128 rows, 20:11-20:16 UTC,
    the JSON's `max_suggest_cpu_s_after_first`); like the process's first call, that is not charged
    (paid once per process, not per study).
  * A replay: the exhaustive truths of bench_time_to_quality (2026-12-04, load average 2-5) took a
    median 0.20 ms per request on goodput_agg (135 replays of 240 requests, median 47 ms) and 0.32 ms
    on pareto_disagg (142 closed-loop replays, median 1,424 requests, 0.52 s); the replay notes
    give 0.13 ms (10,000 requests in 1.3 s, shared/reference replay-notes §1.11). 0.25 ms per
    request plus ~3 ms per replay (a 200-request replay took 29 ms through ReplayEvaluator,
    bench/results/evaluator_quick.json).
The first GP suggest of a process compiles its programs (11.0-11.2 s of CPU cold here, one and two
objectives, bench/results/vizier_after_first.json, 22:41-22:43 UTC); it is not charged to any branch, because it is paid once per process, not per
study, and charging it would make the choice depend on what ran before in the process.

Not refitted after resources/vizier.py's direct acquisition-step posterior (820cf87, 22:47 UTC):
suggest(8) then measured 0.57-0.77 / 1.27-1.37 s (one objective) and 0.54-0.73 / 1.29-1.30 s (two)
at R = 32-64 / 128, so the table below overestimates R = 64 and 128. A refit changes which designer
answers, so it comes with a time-to-quality rerun.
"""

# objectives -> {bucket rows R: (a, b)}: suggest(k) CPU seconds ~ a + k x b (docstring)
SUGGEST_COST: dict[int, dict[int, tuple[float, float]]] = {
    1: {32: (0.36, 0.079), 64: (0.47, 0.133), 128: (0.51, 0.269)},
    2: {32: (0.56, 0.054), 64: (0.43, 0.156), 128: (1.76, 0.201)},
}
BUCKET_FLOOR = 32
ASK_GROWTH_PER_DOUBLING = 2.0  # beyond the largest measured bucket (not measured)
REPLAY_FIXED_S = 0.003
REPLAY_PER_REQUEST_S = 0.00025
DEFAULT_REPLAY_S = 0.5  # when the caller has no request count: the middle of issue 15's 0.07-3.2 s


def suggest_bucket(rows: int, floor: int = BUCKET_FLOOR) -> int:
    """Padded trial rows of a suggest that sees `rows` trials (history + pending + batch):
    max(floor, next power of two), the bucket the GP programs are compiled for (resources/vizier.py
    pads to it)."""
    rows = max(int(rows), 1)
    return max(int(floor), 1 << (rows - 1).bit_length())


def predicted_ask_seconds(rows: int, count: int, objectives: int = 1) -> float:
    """CPU seconds of one model-based suggest of `count` with `rows` trials (history + pending)."""
    count = max(1, int(count))
    table = SUGGEST_COST[2 if objectives > 1 else 1]
    bucket = suggest_bucket(max(0, rows) + count)
    largest = max(table)
    a, b = table[min(bucket, largest)]
    growth = ASK_GROWTH_PER_DOUBLING ** max(0.0, (bucket.bit_length() - largest.bit_length()))
    return (a + count * b) * growth


def predicted_replay_seconds(requests: float | None, repeats: int = 1) -> float:
    """Seconds of one candidate's replay(s) for `requests` requests each (None: DEFAULT_REPLAY_S)."""
    if requests is None or requests <= 0:
        return DEFAULT_REPLAY_S
    return max(1, repeats) * (REPLAY_FIXED_S + REPLAY_PER_REQUEST_S * float(requests))


def outcome_replay_seconds(report: dict | None, derived: dict | None, repeats: int, fallback: float) -> float:
    """Predicted seconds of a finished trial's replay(s), from the request count its outcome
    records (`derived.request_count`, else the report's `num_requests`): a function of the outcome,
    not of how long it took, so it is the same in every run. `fallback` when neither is known."""
    requests = (derived or {}).get("request_count") or (report or {}).get("num_requests")
    if not isinstance(requests, (int, float)) or requests <= 0:
        return fallback
    return predicted_replay_seconds(float(requests), max(1, int(repeats or 1)))


def model_ask_fits(model_seconds: float, ask_seconds: float, replay_seconds: float, workers: int,
                   share: float) -> bool:
    """True when a model-based ask keeps predicted optimizer time within `share` of predicted wall
    time: (model so far + this ask) <= share x (that + `replay_seconds`, the predicted replays of
    every trial up to the end of this batch, spread over the workers)."""
    model = model_seconds + ask_seconds
    return model <= share * (model + replay_seconds / max(1, workers))


__all__ = ["model_ask_fits", "outcome_replay_seconds", "predicted_ask_seconds", "predicted_replay_seconds",
           "suggest_bucket"]
