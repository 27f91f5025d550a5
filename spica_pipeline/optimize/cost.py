"""Predicted costs for the cost-aware study loop: deterministic, so the same seed gives the same ledger.

The default cost-aware policy (`sweep.cost_aware: predicted`) decides whether an ask goes to the
model-based designer or to the cheap quasi-random fill from *predicted* seconds only: a fitted cost
of a model-based suggest (this module) and a per-trial replay estimate fixed before the branch starts
(each finished trial's from the request count its outcome records; the caller's a-priori estimate
for trials still running). No clock is read, so two fresh runs of the same
config and seed make the same choices; `cost_aware: measured` uses measured seconds instead (adapts
to the machine, not reproducible across fresh runs).

Constants and where they come from (2 cores):
  * GP-UCB-PE suggest(k), CPU seconds after the first call of its padding bucket. Every suggest pads
    its trials to one bucket, R = max(32, next power of two of history + pending + k)
    (`suggest_bucket`, which optimize/vizier.py pads to), and costs about a(R) + k x b(R): a = the
    ARD fit and fixed work, b = one acquisition optimisation. Refitted 2026-12-05 to the GP step of
    820cf87 (the direct acquisition-step posterior): the level is suggest(8)'s median CPU seconds in
    bench/results/vizier_after_first.json (`bench/bench_vizier.py --after-first --algos DEFAULT
    --count 8 --ns 8,16,32,64,100 --objectives 1|2 --reps 3`, measured 2026-12-04 22:41-22:43 UTC,
    `median_suggest_cpu_s_after_first`), the higher of two trial counts that share a bucket: one
    objective 0.587 / 0.772 / 1.365 s at R = 32 / 64 / 128, two objectives 0.575 / 0.734 / 1.295 s
    (was 0.99 / 1.53 / 2.66 and 0.99 / 1.68 / 3.37). Only k = 8 was measured after 820cf87, so each
    bucket keeps the a : b split of the k = 1, 2, 4, 8 slope fit of 2026-12-04 16:27-16:32 UTC
    (docs/performance.md, "Suggest cost for optimize/cost.py after this change"): a and b are both
    scaled by (new k = 8 median) / (old a + 8 b), 0.38-0.59. (A 22:20 UTC profile of a two-objective
    128-row suggest(8) put the 8 acquisitions at ~0.43 s of ~1.3 s, so below k = 8 the true cost may
    sit ~10 % above this fit at R = 128; inside this box's +-30 % run-to-run spread.) Beyond 128 rows
    (not measured) each doubling of R is charged x ASK_GROWTH_PER_DOUBLING = 8, the GP posterior's
    cubic growth: the measured 64 -> 128 step (x 1.77 / 1.76) is mostly fixed work and, extrapolated,
    let a GP ask at ~3,450 trials fit the share and stall a 10-minute sweep (see the constant).
    A bucket's first suggest compiles its programs (5.6-6.5 s CPU at 64 and 128 rows in that file's
    `max_suggest_cpu_s_after_first`); like the process's first call, that is not charged (paid once
    per process, not per study). Measured in a sweep (round I, 2026-12-05 10:45-10:49 UTC,
    pareto_disagg, docs/performance.md): asks past the compiles 0.25-0.88 s wall against 0.45-0.99 s
    predicted (32-128 rows), so the table does not under-predict; what ran over the share were model asks left uncharged
    (study.CHARGE_MODEL_RAN).
  * A replay: the exhaustive truths of bench_time_to_quality (2026-12-04, load average 2-5) took a
    median 0.20 ms per request on goodput_agg (135 replays of 240 requests, median 47 ms) and 0.32 ms
    on pareto_disagg (142 closed-loop replays, median 1,424 requests, 0.52 s); the replay notes
    give 0.13 ms (10,000 requests in 1.3 s, shared/reference replay-notes §1.11). 0.25 ms per
    request plus ~3 ms per replay (a 200-request replay took 29 ms through ReplayEvaluator,
    bench/results/evaluator_quick.json).
The first GP suggest of a process compiles its programs (11.0-11.2 s of CPU cold here, one and two
objectives, bench/results/vizier_after_first.json, 22:41-22:43 UTC); it is not charged to any branch, because it is paid once per process, not per
study, and charging it would make the choice depend on what ran before in the process.
"""

# objectives -> {bucket rows R: (a, b)}: suggest(k) CPU seconds ~ a + k x b (docstring)
SUGGEST_COST: dict[int, dict[int, tuple[float, float]]] = {
    1: {32: (0.213, 0.0467), 64: (0.237, 0.0669), 128: (0.262, 0.1379)},
    2: {32: (0.325, 0.0313), 64: (0.188, 0.0682), 128: (0.677, 0.0773)},
}
BUCKET_FLOOR = 32
ASK_GROWTH_PER_DOUBLING = 8.0  # beyond the largest measured bucket: not measured, charged as the GP's
# cubic posterior. x1.77 (the 64 -> 128 step, mostly fixed work) let a GP ask fit at ~3,450 trials of
# the 10-minute large_disagg run (2026-12-05 03:01-03:14 UTC, 4f3cf59): the sweep stalled in it.
REPLAY_FIXED_S = 0.003
REPLAY_PER_REQUEST_S = 0.00025
DEFAULT_REPLAY_S = 0.5  # when the caller has no request count: the middle of issue 15's 0.07-3.2 s


def suggest_bucket(rows: int, floor: int = BUCKET_FLOOR) -> int:
    """Padded trial rows of a suggest that sees `rows` trials (history + pending + batch):
    max(floor, next power of two), the bucket the GP programs are compiled for (optimize/vizier.py
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
