"""Sample efficiency of the Vizier algorithms against an exhaustive truth, on finite spaces.

For each space in bench/spaces/ (a scalar goal and a Pareto goal, both finite so `policy: thorough`
enumerates them):

1. the exhaustive truth: every point of every branch replayed once (the thorough sweep's study
   loop, same candidate builder and scorer as a real sweep); its optimum, or its front's
   hypervolume;
2. for each algorithm and seed: the rapid study loop with that algorithm over the same branch,
   counting distinct evaluations until the incumbent reaches 95 / 99 / 100 % of the optimum (or
   of the exhaustive front's hypervolume, both from the origin), the duplicate rate (trials that
   repeated an earlier spec) and the optimizer's share of the wall time.

Every replay goes through an outcome cache keyed by `EvalRequest.spec_hash` and persisted to
bench/.cache/<space>.outcomes.json, so each spec is replayed once across the truth, all algorithms
and all seeds. The spaces use round_robin routing and no planner: replays are deterministic, so
the cache is exact. The optimizer share uses the cached replay seconds (what the evaluations cost
when they ran), since a cache hit costs nothing.

usage:
  .venv/bin/python bench/bench_sample_efficiency.py [--quick] [--spaces goodput_agg,pareto_disagg]
      [--algorithms DEFAULT,...] [--seeds 5] [--out bench/results/sample_efficiency.json]
"""

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("DYN_LOG", "warn")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from spica_pipeline.config import SmartSearchConfig, load_config  # noqa: E402
from spica_pipeline.evaluate import scoring  # noqa: E402
from spica_pipeline.evaluate.evaluator import EvalOutcome, EvalRequest  # noqa: E402
from spica_pipeline.optimize.trial import MemoryJournal, TrialCounter
from spica_pipeline.storage import write_json_result  # noqa: E402

SPACES_DIR = ROOT / "bench" / "spaces"
CACHE_DIR = ROOT / "bench" / ".cache"
RESULTS = ROOT / "bench" / "results"
ALGORITHMS = ("RANDOM_SEARCH", "QUASI_RANDOM_SEARCH", "DEFAULT", "GAUSSIAN_PROCESS_BANDIT")
LEVELS = (0.95, 0.99, 1.0)
TOL = 1e-9  # relative: "reached 100%" means equal to the optimum up to float noise


class OutcomeCache:
    """spec_hash -> EvalOutcome, loaded from and saved to one JSON file."""

    def __init__(self, path: Path):
        self.path = path
        self.outcomes: dict[str, dict[str, Any]] = {}
        if path.exists():
            self.outcomes = json.loads(path.read_text())
        self.hits = self.misses = 0

    def get(self, key: str) -> EvalOutcome | None:
        hit = self.outcomes.get(key)
        return None if hit is None else EvalOutcome.from_dict(hit)

    def put(self, key: str, outcome: EvalOutcome) -> None:
        self.outcomes[key] = outcome.to_dict()

    def save(self) -> None:
        from spica_pipeline.jsonvalue import canonical_json, json_safe

        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(canonical_json(json_safe(self.outcomes)))
        tmp.replace(self.path)


class CachingEvaluator:
    """Evaluator wrapper: a spec already in the cache is answered from it, never replayed again."""

    def __init__(self, inner: Any, cache: OutcomeCache):
        self.inner = inner
        self.cache = cache

    def evaluate(self, request: EvalRequest) -> EvalOutcome:
        key = request.spec_hash
        cached = self.cache.get(key)
        if cached is not None:
            self.cache.hits += 1
            return cached
        self.cache.misses += 1
        outcome = self.inner.evaluate(request)
        if outcome.status != "timed_out":
            self.cache.put(key, outcome)
        return outcome

    def evaluate_wave(self, requests: list[EvalRequest]) -> list[EvalOutcome]:
        return [self.evaluate(r) for r in requests]


def with_sweep(config: SmartSearchConfig, **overrides: Any) -> SmartSearchConfig:
    data = config.model_dump(mode="json", exclude_unset=True)
    data.setdefault("sweep", {}).update(overrides)
    return SmartSearchConfig.from_dict(data)


# ---------------------------------------------------------------------------------------------
# progress measures
# ---------------------------------------------------------------------------------------------

def feasible_points(records: list[Any]) -> list[tuple[int, Any]]:
    """(distinct-evaluation index, record) for every new spec, in trial order."""
    seen: set[str] = set()
    out = []
    for rec in records:
        if rec.status in ("cached", "unsupported") or rec.spec_hash is None or rec.spec_hash in seen:
            continue
        seen.add(rec.spec_hash)
        out.append((len(seen), rec))
    return out


def incumbent_series(records: list[Any], config: SmartSearchConfig) -> list[float]:
    """Best-so-far value after each distinct evaluation: the score, or the front's hypervolume."""
    goal = config.goal
    series: list[float] = []
    if goal.is_pareto:
        names = [t.value for t in goal.objectives()]
        dirs = {n: scoring.direction(n) for n in names}
        reference = [0.0 if d == "max" else None for d in dirs.values()]
        if any(r is None for r in reference):
            raise ValueError("benchmark Pareto spaces use maximised objectives (origin reference)")
        front: list[dict[str, float]] = []
        hv = 0.0
        for _, rec in feasible_points(records):
            if rec.status == "feasible" and rec.objectives:
                front = scoring.pareto_front(front + [dict(rec.objectives)], dirs)
                hv = scoring.hypervolume(front, dirs, reference)
            series.append(hv)
        return series
    best = -math.inf
    for _, rec in feasible_points(records):
        if rec.status == "feasible" and rec.score is not None and math.isfinite(rec.score):
            best = max(best, rec.score)
        series.append(best)
    return series


def evals_to_reach(series: list[float], optimum: float, level: float) -> int | None:
    """First distinct evaluation whose incumbent is >= level x optimum (positive optimum)."""
    if optimum <= 0:
        raise ValueError(f"optimum must be positive for ratio levels, got {optimum}")
    target = optimum * level * (1 - TOL)
    for i, value in enumerate(series, start=1):
        if value >= target:
            return i
    return None


# ---------------------------------------------------------------------------------------------
# truth and runs
# ---------------------------------------------------------------------------------------------

def prepare_space(path: Path) -> tuple[SmartSearchConfig, Any]:
    from spica_pipeline.sweep import prepare

    config = load_config(path)
    prepared = prepare(config)
    if len(prepared.branches) != 1:
        raise SystemExit(f"{path}: benchmark spaces must have exactly one branch "
                         f"(got {[b.deployment_mode for b in prepared.branches]})")
    return prepared.config, prepared


def exhaustive_truth(config: SmartSearchConfig, prepared: Any, evaluator: CachingEvaluator) -> dict[str, Any]:
    from spica_pipeline.optimize.branch_plan import plan_branch
    from spica_pipeline.sweep import run_branch

    thorough = with_sweep(config, policy="thorough")
    plan = plan_branch(prepared.branches[0], thorough)
    started = time.perf_counter()
    outcome = run_branch(plan, thorough, prepared.load_predictor, evaluate_wave=evaluator.evaluate_wave,
                         vizier=None, journal=MemoryJournal(), counter=TrialCounter())
    seconds = time.perf_counter() - started
    records = outcome.records
    series = incumbent_series(records, config)
    feasible = [r for r in records if r.status == "feasible"]
    truth: dict[str, Any] = {
        "points": plan.finite_size, "records": len(records), "distinct": len(series),
        "feasible": len(feasible), "statuses": dict(outcome.counts), "seconds": round(seconds, 2),
        "replay_seconds": round(sum(evaluator.cache.get(r.spec_hash).replay_seconds
                                    for _, r in feasible_points(records)), 2),
        "optimum": series[-1] if series else None,
    }
    if config.goal.is_pareto:
        names = [t.value for t in config.goal.objectives()]
        dirs = {n: scoring.direction(n) for n in names}
        front = scoring.pareto_front([dict(r.objectives) for r in feasible if r.objectives], dirs)
        truth.update(measure="hypervolume (origin reference)", front_size=len(front), front=front)
    else:
        best = max(feasible, key=lambda r: r.score)
        optimum = truth["optimum"]
        # How many points are good enough: picking uniformly without replacement, the expected
        # number of draws to hit one of k good points among N is (N + 1) / (k + 1).
        near = {f"points_within_{int(level * 100)}pct": sum(1 for r in feasible
                                                            if r.score >= optimum * level * (1 - TOL))
                for level in LEVELS}
        expected = {f"uniform_random_expected_evals_to_{k[len('points_within_'):]}":
                    round((len(feasible) + 1) / (v + 1), 2) for k, v in near.items()}
        truth.update(measure=config.goal.target.value, best_config=_short_config(best), **near, **expected)
    return truth


def run_algorithm(config: SmartSearchConfig, prepared: Any, evaluator: CachingEvaluator, algorithm: str,
                  seed: int, optimum: float, vizier: Any) -> dict[str, Any]:
    from spica_pipeline.optimize.branch_plan import BranchPlan, plan_branch
    from spica_pipeline.sweep import run_branch

    cfg = with_sweep(config, algorithm=algorithm, seed=seed, policy="rapid")
    plan = plan_branch(prepared.branches[0], cfg)
    plan = BranchPlan(plan.branch, plan.encoding, plan.finite_size, plan.budget, False, "benchmark: rapid")
    started = time.perf_counter()

    def on_round(result: Any) -> None:
        print(f"    {algorithm} seed {seed} round {result.rounds}: {len(result.records)} trials, "
              f"optimizer {result.optimizer_seconds:.1f}s, {time.perf_counter() - started:.0f}s", flush=True)

    # the product's neighbourhood designer serves the default only: a baseline algorithm runs alone,
    # as in bench_time_to_quality.py
    outcome = run_branch(plan, cfg, prepared.load_predictor, evaluate_wave=evaluator.evaluate_wave, vizier=vizier,
                         journal=MemoryJournal(), counter=TrialCounter(), on_round=on_round,
                         neighbourhood=algorithm == "DEFAULT")
    wall = time.perf_counter() - started
    records = outcome.records
    series = incumbent_series(records, config)
    distinct = feasible_points(records)
    replay = sum(evaluator.cache.get(r.spec_hash).replay_seconds for _, r in distinct
                 if evaluator.cache.get(r.spec_hash) is not None)
    duplicates = sum(1 for r in records if r.status == "cached")
    opt = outcome.optimizer_seconds
    return {
        "algorithm": algorithm, "seed": seed, "trials": len(records), "distinct_evaluations": len(series),
        "duplicates": duplicates, "duplicate_rate": round(duplicates / len(records), 4) if records else None,
        "rounds": outcome.rounds, "stalled": outcome.stalled,
        "final_ratio": round(series[-1] / optimum, 6) if series else 0.0,
        **{f"evals_to_{int(level * 100)}pct": evals_to_reach(series, optimum, level) for level in LEVELS},
        "optimizer_seconds": round(opt, 2), "replay_seconds": round(replay, 2),
        "optimizer_share": round(opt / (opt + replay), 4) if opt + replay > 0 else None,
        "wall_seconds": round(wall, 2),
    }


def summarise(runs: list[dict[str, Any]], budget: int) -> dict[str, Any]:
    """Per algorithm: median evaluations to each level (a run that never got there counts as the
    budget + 1, i.e. 'not within budget'), how many seeds got there, and mean rates."""
    out: dict[str, Any] = {}
    for algo in dict.fromkeys(r["algorithm"] for r in runs):
        mine = [r for r in runs if r["algorithm"] == algo]
        row: dict[str, Any] = {"seeds": len(mine)}
        for level in LEVELS:
            key = f"evals_to_{int(level * 100)}pct"
            values = [r[key] for r in mine]
            reached = [v for v in values if v is not None]
            row[f"{key}_median"] = statistics.median(v if v is not None else budget + 1 for v in values)
            row[f"{key}_reached"] = f"{len(reached)}/{len(mine)}"
        row["duplicate_rate_mean"] = round(statistics.fmean(r["duplicate_rate"] or 0 for r in mine), 4)
        row["optimizer_share_mean"] = round(statistics.fmean(r["optimizer_share"] or 0 for r in mine), 4)
        row["optimizer_seconds_mean"] = round(statistics.fmean(r["optimizer_seconds"] for r in mine), 2)
        row["final_ratio_median"] = statistics.median(r["final_ratio"] for r in mine)
        out[algo] = row
    return out


def _short_config(rec: Any) -> dict[str, Any]:
    keys = ("deployment_mode", "used_gpus", "agg_tp", "agg_workers", "prefill_tp", "prefill_workers", "decode_tp",
            "decode_workers", "agg_max_num_seqs", "agg_max_num_batched_tokens", "decode_max_num_seqs")
    cfg = {k: rec.config.get(k) for k in keys if rec.config.get(k) is not None}
    cfg["parallel_config"] = rec.parallel_config
    cfg["score"] = rec.score
    return cfg


def plan_runs(quick: bool, algorithms: list[str], seeds: int, gp_spaces: list[str], space: str
              ) -> list[tuple[str, int]]:
    """(algorithm, seed) pairs. Quick: RANDOM and QUASI on 2 seeds, and a single GP run in all
    (DEFAULT, what the sweep uses, seed 0, on the first space): a GP suggest takes a minute on 2
    busy cores."""
    pairs = []
    for seed in range(seeds):  # seed-major: a run stopped early still has every algorithm
        for algo in algorithms:
            gp = algo in ("DEFAULT", "GAUSSIAN_PROCESS_BANDIT")
            if quick and gp and (algo != "DEFAULT" or space not in gp_spaces):
                continue
            if seed < ((1 if gp else 2) if quick else seeds):
                pairs.append((algo, seed))
    return pairs


def warm_up(vizier: Any, config: SmartSearchConfig, prepared: Any) -> None:
    """Import Vizier/JAX once before any timed run, so the first algorithm is not charged for it."""
    from spica_pipeline.optimize.branch_plan import plan_branch, study_metrics

    plan = plan_branch(prepared.branches[0], config)
    study = vizier.open_study(plan.encoding, study_metrics(config.goal), seed=0, algorithm="QUASI_RANDOM_SEARCH")
    study.suggest(1, [])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 seeds of RANDOM/QUASI and 1 DEFAULT seed")
    parser.add_argument("--spaces", default="goodput_agg,pareto_disagg")
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    from spica_pipeline.evaluate.replay import ReplayEvaluator
    from spica_pipeline.optimize.vizier import VizierClient

    vizier = VizierClient()
    algorithms = [a.strip().upper() for a in args.algorithms.split(",") if a.strip()]
    result: dict[str, Any] = {
        "benchmark": "sample_efficiency", "command": " ".join(["bench/bench_sample_efficiency.py", *sys.argv[1:]]),
        "quick": args.quick,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": platform.node(),
        "cpus": os.cpu_count(), "levels": list(LEVELS), "spaces": {},
    }
    started = time.perf_counter()
    out = Path(args.out) if args.out else RESULTS / ("sample_efficiency_quick.json" if args.quick
                                                      else "sample_efficiency.json")

    def write(result: dict[str, Any], started: float, complete: bool) -> None:
        result["complete"] = complete
        result["wall_seconds"] = round(time.perf_counter() - started, 1)
        write_json_result(out, result)

    spaces = [s.strip() for s in args.spaces.split(",") if s.strip()]
    gp_spaces = spaces[:1] if args.quick else spaces
    for name in spaces:
        path = SPACES_DIR / f"{name}.yaml"
        config, prepared = prepare_space(path)
        cache = OutcomeCache(CACHE_DIR / f"{name}.outcomes.json")
        evaluator = CachingEvaluator(ReplayEvaluator(), cache)
        print(f"[{name}] exhaustive truth ...", flush=True)
        truth = exhaustive_truth(config, prepared, evaluator)
        cache.save()
        optimum = truth["optimum"]
        print(f"[{name}] {truth['points']} points, {truth['feasible']} feasible, optimum {optimum:.6g} "
              f"({truth['measure']}), {truth['seconds']}s", flush=True)
        budget = config.sweep.max_rounds * config.sweep.per_round
        runs = []
        warm_up(vizier, config, prepared)
        for algo, seed in plan_runs(args.quick, algorithms, args.seeds, gp_spaces, name):
            run = run_algorithm(config, prepared, evaluator, algo, seed, optimum, vizier)
            cache.save()
            runs.append(run)
            print(f"[{name}] {algo} seed {seed}: evals to 95/99/100% = {run['evals_to_95pct']}/"
                  f"{run['evals_to_99pct']}/{run['evals_to_100pct']} of {run['distinct_evaluations']}, "
                  f"dup {run['duplicate_rate']}, optimizer {run['optimizer_seconds']}s "
                  f"({run['optimizer_share']}), wall {run['wall_seconds']}s", flush=True)
            result["spaces"][name] = {
                "config": str(path.relative_to(ROOT)), "goal": config.goal.target.value,
                "budget": budget, "max_rounds": config.sweep.max_rounds, "per_round": config.sweep.per_round,
                "truth": truth, "summary": summarise(runs, budget), "runs": runs,
                "cache": {"entries": len(cache.outcomes), "hits": cache.hits, "misses": cache.misses},
            }
            write(result, started, complete=False)  # partial results survive an interrupted run
    write(result, started, complete=True)
    print(f"wrote {out} in {result['wall_seconds']}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
