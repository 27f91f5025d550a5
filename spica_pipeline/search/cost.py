"""Predicted costs for the cost-aware study loop: deterministic, so the same seed gives the same ledger.

The default cost-aware policy (`sweep.cost_aware: predicted`) decides whether an ask goes to the
model-based designer or to the cheap quasi-random fill from *predicted* seconds only: a fitted cost
of a model-based suggest (this module) and a per-trial replay estimate fixed before the branch starts
(each finished trial's from the request count its outcome records; the caller's a-priori estimate
for trials still running). No clock is read, so two fresh runs of the same
config and seed make the same choices; `cost_aware: measured` uses measured seconds instead (adapts
to the machine, not reproducible across fresh runs).

Constants and where they come from (2 cores, 2026-12-04):
  * GP-UCB-PE suggest(8), one objective, after the process's first call (compile-once programs), CPU
    seconds, median of 3 (bench/results/vizier_after_first.json, `bench/bench_vizier.py
    --after-first --count 8 --ns 8,16,32,64,100`, load average 2-3): 1.95 at 8 history rows, 1.63 at
    16, 2.59 at 32, 10.9 at 64, 32.2 at 100. Flat up to ~32 rows, then roughly quadratic-to-cubic
    (the GP's linear algebra): max(ASK_FLOOR_S, ASK_S_AT_32 x (rows / 32) ** ASK_EXPONENT) gives
    2.0 / 2.0 / 2.6 / 11.9 / 32 s at those rows. A batch of `count` is charged
    (0.5 + 0.5 x count / 8) of the suggest(8) figure: one sequential acquisition optimisation per
    suggestion, assumed to be half of a suggest(8) (not measured separately). Crossing a padding
    bucket (32, 64, 128 rows) compiles that bucket's programs once per process (60-130 s of CPU
    here); like the first call, that is not charged.
  * Two objectives: multi-objective GP-UCB-PE is not padded (padding changed its acquisition
    values in an earlier check), so every new trial count compiles its own programs: 61 s and
    134 s of CPU at the first suggest with 8 and 16 history rows, then ~1 s for a repeat at the same
    count (bench/results/vizier_after_first.json). In a study every ask has a new count, so an
    ask is charged MULTI_OBJECTIVE_ASK_S.
  * A replay: the exhaustive truths of bench_time_to_quality (2026-12-04, load average 2-5) took a
    median 0.20 ms per request on goodput_agg (135 replays of 240 requests, median 47 ms) and 0.32 ms
    on pareto_disagg (142 closed-loop replays, median 1,424 requests, 0.52 s); the replay notes
    give 0.13 ms (10,000 requests in 1.3 s, shared/reference replay-notes §1.11). 0.25 ms per
    request plus ~3 ms per replay (a 200-request replay took 29 ms through ReplayEvaluator,
    bench/results/evaluator_quick.json).
The first GP suggest of a process compiles its programs (~77 s of CPU here, once; the persistent JAX
cache serves later processes); it is not charged to any branch, because it is paid once per process,
not per study, and charging it would make the choice depend on what ran before in the process.
"""

ASK_FLOOR_S = 2.0  # suggest(8) CPU seconds with few rows (fit above)
ASK_S_AT_32 = 2.6  # ... at 32 rows
ASK_EXPONENT = 2.2  # growth beyond: x 2 ** 2.2 = x 4.6 per doubling of the rows
ASK_REFERENCE_BATCH = 8
MULTI_OBJECTIVE_ASK_S = 100.0  # two objectives: a compile per ask (61-134 s measured)
REPLAY_FIXED_S = 0.003
REPLAY_PER_REQUEST_S = 0.00025
DEFAULT_REPLAY_S = 0.5  # when the caller has no request count: the middle of issue 15's 0.07-3.2 s


def predicted_ask_seconds(rows: int, count: int, objectives: int = 1) -> float:
    """CPU seconds of one model-based suggest of `count` with `rows` trials (history + pending)."""
    batch = 0.5 + 0.5 * max(1, count) / ASK_REFERENCE_BATCH
    if objectives > 1:
        return MULTI_OBJECTIVE_ASK_S
    return max(ASK_FLOOR_S, ASK_S_AT_32 * (max(0, rows) / 32) ** ASK_EXPONENT) * batch


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


__all__ = ["model_ask_fits", "outcome_replay_seconds", "predicted_ask_seconds", "predicted_replay_seconds"]
