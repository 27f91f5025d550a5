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
    ARD fit and fixed work, b = one acquisition optimisation. The level of each bucket is suggest(8)'s
    median CPU seconds in bench/results/vizier_after_first.json (`bench/bench_vizier.py --after-first
    --algos DEFAULT --count 8 --ns 8,16,32,64,100 --objectives 1|2 --reps 3`,
    `median_suggest_cpu_s_after_first`), the higher of the two trial counts that share a bucket: one
    objective 0.587 / 0.772 / 1.365 s at R = 32 / 64 / 128, two objectives 0.575 / 0.734 / 1.295 s.
    That file measures k = 8 only, so the a : b split inside each bucket comes from a k = 1, 2, 4, 8
    slope fit (docs/performance.md, "Suggest cost for optimize/cost.py"), with a and b scaled together
    until a + 8 b equals the k = 8 median. The acquisitions are a minority of a 128-row suggest(8), so
    below k = 8 the true cost may sit somewhat above this fit at R = 128, inside this machine's
    run-to-run spread. Beyond 128 rows (not measured) each doubling of R is charged
    x ASK_GROWTH_PER_DOUBLING = 8, the GP posterior's cubic growth: the measured 64 -> 128 step is
    mostly fixed work and, extrapolated, would let a GP ask fit the share at thousands of trials and
    stall a 10-minute sweep (see the constant). A bucket's first suggest compiles its programs
    (5.6-6.5 s CPU at 64 and 128 rows, that file's `max_suggest_cpu_s_after_first`); like the
    process's first call, that is not charged (paid once per process, not per study). In a
    pareto_disagg sweep, asks past the compiles take less wall time than this table predicts (32-128
    rows), so it does not under-predict; a model ask whose suggestions were all replaced still ran
    the GP, which is why the study charges every ask the model answered (study.CHARGE_MODEL_RAN).
  * A replay: 0.25 ms per request plus ~3 ms per replay. The per-request rate sits between the
    small synthetic spaces and the long closed-loop disaggregated replays of bench_time_to_quality;
    the fixed part is the evaluator's overhead over the raw replay call (a 200-request replay takes
    about 26 ms through ReplayEvaluator, bench/results/evaluator_quick.json).
The first GP suggest of a process compiles its programs (11.0-11.2 s of CPU cold, one and two
objectives, bench/results/vizier_after_first.json `first_call_s`); it is not charged to any branch,
because it is paid once per process, not per study, and charging it would make the choice depend
on what ran before in the process.
"""

# objectives -> {bucket rows R: (a, b)}: suggest(k) CPU seconds ~ a + k x b (docstring)
SUGGEST_COST: dict[int, dict[int, tuple[float, float]]] = {
    1: {32: (0.213, 0.0467), 64: (0.237, 0.0669), 128: (0.262, 0.1379)},
    2: {32: (0.325, 0.0313), 64: (0.188, 0.0682), 128: (0.677, 0.0773)},
}
BUCKET_FLOOR = 32
ASK_GROWTH_PER_DOUBLING = 8.0  # beyond the largest measured bucket: not measured, charged as the GP's
# cubic posterior. The measured 64 -> 128 step (x1.77, mostly fixed work) would let a GP ask fit the
# share at thousands of trials, where one ask outlasts a 10-minute large_disagg sweep.
REPLAY_FIXED_S = 0.003
REPLAY_PER_REQUEST_S = 0.00025
DEFAULT_REPLAY_S = 0.5  # when the caller has no request count: between short synthetic and long trace replays


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
