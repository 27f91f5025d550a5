"""Time to quality: wall seconds and evaluations until the incumbent reaches 95 / 99 / 100 % of the
exhaustive optimum (or of the exhaustive front's hypervolume), per algorithm, on finite spaces.

Spaces (bench/spaces/): goodput_agg (scalar goal), pareto_disagg (Pareto goal), trace_agg (a
Mooncake trace workload), disagg_goodput and disagg_trace (the disagg branch of the first and the
third). Each space's exhaustive truth is every point replayed once; outcomes are cached by
`EvalRequest.spec_hash` in bench/.cache/<space>.<config hash>.outcomes.json, and the truth summary
next to it (keyed also by a digest of every point's spec hash, so a change to what a replay
computes rebuilds it), so reruns and every algorithm/seed reuse them (no replay twice).

Algorithms:
  ours        the sweep's default: GP-UCB-PE with compile-once programs, asynchronous dispatch
              (in-flight trials pending), cost-aware fill (optimizer <= 25 % of wall time) from the
              neighbourhood designer (optimize/neighbourhood.py) and quasi-random;
  spica       Spica-style: stock Vizier DEFAULT settings (75,000 acquisition evaluations, ARD 500
              iterations, no padding, stock classes, compile caches cleared), barrier rounds of
              candidates_per_round, duplicates re-asked, the Vizier study alone (no neighbourhood
              designer: its seed batch is the client's quasi-random batch, where stock GP-UCB-PE
              would put the search space's center first);
  RANDOM_SEARCH, QUASI_RANDOM_SEARCH  the same asynchronous loop with that designer.

Replays run from the cache on `--workers` simulated workers (parallel_evals, default 2): each
candidate sleeps its recorded replay seconds (x --replay-scale), so wall time is what the sweep
would take with those replays, and the optimizer's CPU time is real. A run stops at 100 % or at
its evaluation budget (--budget-frac of the space, at least the space's max_rounds x per_round),
or when its wall cap passes (--max-wall-s, default 120 s; --spica-max-wall-s, default 60 s, for
Spica-style, whose stock suggests take tens of seconds): no new trial starts after it, and a capped
run that did not reach a level counts its wall time, a lower bound. The process's first GP ask pays
the cold compile inside the timed runs, as a fresh sweep does; --warm-up pays it before them
("warm_up_s"), and without it a quasi-random suggest pays the one-time Vizier/JAX import first
("import_warm_up_s").

Output (--out, default bench/results/time_to_quality[_quick].json):
  {"spaces": {"<name>": {"<algorithm>": {"median_wall_s_to_99": x, "median_evals_to_99": n,
                                          "seeds_reaching_99": k, ...}}}, "details": {... runs ...}}
A run that never reached a level counts as its budget (evaluations) and its wall time for the
median; `seeds_reaching_*` says how many got there. Each run records its designers, the sequence
digest of (designer, parameters) per trial (equal digests: the same suggestions), and for ours the
cost of every ask against optimize/cost.py's prediction.

usage:
  .venv/bin/python bench/bench_time_to_quality.py [--quick] [--spaces goodput_agg,...]
      [--algorithms ours,spica,RANDOM_SEARCH,QUASI_RANDOM_SEARCH] [--seeds 5] [--first-seed 0]
      [--spica-seeds 5] [--workers 2] [--budget-frac 0.5] [--replay-scale 1.0] [--merge] [--out PATH]
Development seeds are 0-4 (bench/results/time_to_quality.json); held-out seeds start at 600
(--first-seed 600, bench/results/time_to_quality_heldout.json). --merge keeps the runs of the other
algorithms already in --out (a file built in bounded steps). --truth-only builds the truths and stops.
--quick: 2 seeds, Spica-style 1 seed on the first space only.

--simulated: the workers are a simulated clock (each replay takes its recorded seconds, the
optimizer none), so the dispatch order, and with it every evaluation count, is a function of the
seed only; wall seconds are the simulated clock's. For comparing designer settings seed by seed:
TTQ_STUDY_<NAME>, TTQ_COST_<NAME> and TTQ_NB_<NAME>=<python literal> override a module constant of
optimize/study.py, optimize/cost.py and optimize/neighbourhood.py (recorded as "overrides").

--large: the >= 10^5-point space (bench/spaces/large_disagg.yaml, 137,295 points, too large to
enumerate or cache) searched by the product itself, `spica sweep --time-budget`, with real
replays: ours (the default) for --large-budget seconds, then RANDOM_SEARCH for --random-factor x as
long (as --random-pieces independent runs, seeds 0..: random search is memoryless, so the best of
the pieces is the best of one long run); reports the evaluations each did and ours' best over
random's. Writes bench/results/time_to_quality_large.json.
"""

import argparse
import hashlib
import heapq
import json
import math
import os
import platform
import queue
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("DYN_LOG", "warn")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_sample_efficiency import (  # noqa: E402
    LEVELS,
    CachingEvaluator,
    OutcomeCache,
    evals_to_reach,
    exhaustive_truth,
    incumbent_series,
    prepare_space,
    with_sweep,
)

from spica_pipeline.evaluate.evaluator import EvalOutcome, EvalRequest  # noqa: E402
from spica_pipeline.jsonvalue import canonical_json, spec_hash
from spica_pipeline.evaluate.pool import Completion, EvaluationBackend  # noqa: E402
from spica_pipeline.optimize.trial import MemoryJournal, TrialCounter

# TTQ_STUDY_<NAME> / TTQ_COST_<NAME> / TTQ_NB_<NAME>=<python literal>: override a module constant of
# optimize/study.py / optimize/cost.py / optimize/neighbourhood.py; recorded in the output's "overrides"
OVERRIDES = {k: v for k, v in os.environ.items() if k.startswith(("TTQ_STUDY_", "TTQ_COST_", "TTQ_NB_"))}


def apply_overrides() -> None:
    import ast

    import spica_pipeline.optimize.cost as cost_module
    import spica_pipeline.optimize.neighbourhood as nb_module
    import spica_pipeline.optimize.study as study_module

    modules = {"STUDY": study_module, "COST": cost_module, "NB": nb_module}
    # the designer's keyword defaults were bound at import: a constant that is also one is set there too
    kw_defaults = nb_module.NeighbourhoodDesigner.__init__.__kwdefaults__ or {}
    for key, text in OVERRIDES.items():
        prefix, name = key.split("_", 2)[1:]
        module = modules[prefix]
        if not hasattr(module, name):
            raise SystemExit(f"{key}: no constant {name} in {module.__name__}")
        value = ast.literal_eval(text)
        setattr(module, name, value)
        if module is nb_module and name.lower() in kw_defaults:
            kw_defaults[name.lower()] = value


SPACES_DIR = ROOT / "bench" / "spaces"
CACHE_DIR = ROOT / "bench" / ".cache"
RESULTS = ROOT / "bench" / "results"
ALGORITHMS = ("ours", "spica", "RANDOM_SEARCH", "QUASI_RANDOM_SEARCH")
SPACES = ("goodput_agg", "pareto_disagg", "trace_agg", "disagg_goodput", "disagg_trace")


class CachedReplayBackend(EvaluationBackend):
    """`workers` threads that answer each candidate from the truth cache after sleeping its
    recorded replay seconds (sleeping costs no CPU, so the optimizer's CPU time stays real).
    A spec missing from the cache is replayed for real and cached."""

    def __init__(self, evaluator: CachingEvaluator, workers: int, scale: float = 1.0):
        super().__init__(workers, None)
        self.evaluator = evaluator
        self.scale = scale
        self.todo: "queue.Queue[tuple[int, EvalRequest] | None]" = queue.Queue()
        self.done: "queue.Queue[Completion]" = queue.Queue()
        self.threads = [threading.Thread(target=self._work, daemon=True) for _ in range(workers)]
        for t in self.threads:
            t.start()

    def _work(self) -> None:
        while True:
            item = self.todo.get()
            if item is None:
                return
            ticket, request = item
            outcome = self.evaluator.cache.get(request.spec_hash)
            if outcome is None:
                outcome = self.evaluator.evaluate(request)
            else:
                time.sleep(max(0.0, outcome.replay_seconds) * self.scale)
            self.done.put(Completion(ticket, request, outcome))

    def _submit(self, ticket, request, max_seconds):
        self.todo.put((ticket, request))

    def _wait(self, timeout):
        out = []
        try:
            out.append(self.done.get(timeout=timeout) if timeout != 0 else self.done.get_nowait())
        except queue.Empty:
            return []
        while True:
            try:
                out.append(self.done.get_nowait())
            except queue.Empty:
                return out

    def _cancel(self, ticket):
        pass

    def _close(self):
        for _ in self.threads:
            self.todo.put(None)


class SimulatedBackend(EvaluationBackend):
    """`workers` on a simulated clock: a candidate starts when a worker is free and finishes its
    recorded replay seconds (x scale) later; a blocking wait moves the clock to the next finish, a
    non-blocking one returns nothing (the clock only moves on blocking waits), and the optimizer
    takes no time. A spec missing from the cache is replayed for real first, its seconds recorded."""

    def __init__(self, evaluator: CachingEvaluator, workers: int, scale: float = 1.0):
        super().__init__(workers, None)
        self.evaluator = evaluator
        self.scale = scale
        self.clock = 0.0
        self.queued: list[tuple[int, EvalRequest]] = []
        self.running: list[tuple[float, int, int, EvalRequest, EvalOutcome]] = []
        self.started = 0

    def _start(self) -> None:
        while self.queued and len(self.running) < self.workers:
            ticket, request = self.queued.pop(0)
            outcome = self.evaluator.cache.get(request.spec_hash) or self.evaluator.evaluate(request)
            self.started += 1
            end = self.clock + max(0.0, outcome.replay_seconds) * self.scale
            heapq.heappush(self.running, (end, self.started, ticket, request, outcome))

    def _submit(self, ticket, request, max_seconds):
        self.queued.append((ticket, request))
        self._start()

    def _wait(self, timeout):
        if timeout == 0 or not self.running:
            return []
        end, _, ticket, request, outcome = heapq.heappop(self.running)
        self.clock = end
        self._start()
        return [Completion(ticket, request, outcome)]

    def _cancel(self, ticket):
        pass

    def _close(self):
        pass


def sequence_digest(records) -> str:
    """A digest of every trial's (designer, parameters), in order: equal digests, equal suggestions."""
    rows = [[r.designer or "", r.parameters] for r in records]
    return hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()[:16]


class ReachedTarget(Exception):
    """Raised from on_record once the incumbent reaches 100 %: the run has its answer."""


def space_key(config) -> str:
    """Identity of a space's truth: the config minus the sweep knobs that change how it is searched
    (seed, algorithm, budgets, cost-aware settings), so adding a sweep knob keeps the cached truth.
    The outcome cache is keyed by each request's spec hash anyway (stale specs simply miss)."""
    data = json.loads(canonical_json(config.model_dump(mode="json")))
    sweep = data.pop("sweep", {})
    data["sweep"] = {k: sweep.get(k) for k in ("router_repeats", "max_eval_seconds")}
    return spec_hash(data)


def specs_digest(config, prepared) -> str:
    """Digest of the spec hashes of every point of the space (built, not replayed): a change to what
    a replay computes (calibration profile, report fields, ...) changes the specs but not the config,
    and must not reuse a truth built from the old replays."""
    from spica_pipeline.optimize.branch_plan import candidate_builder, exhaustive_points, plan_branch
    from spica_pipeline.sweep import evaluation_context

    thorough = with_sweep(config, policy="thorough")
    plan = plan_branch(prepared.branches[0], thorough)
    build = candidate_builder(thorough, prepared.load_predictor, evaluation_context(thorough, prepared.load_predictor))
    specs = []
    for p in exhaustive_points(plan.encoding):
        try:
            specs.append(build(p.selection, p.parallel_config).spec_hash)
        except Exception:  # a point whose build fails has no replay
            continue
    return hashlib.sha256("\n".join(sorted(specs)).encode()).hexdigest()[:12]


def cached_truth(name: str, config, prepared, evaluator) -> dict[str, Any]:
    path = CACHE_DIR / f"{name}.{space_key(config)}.{specs_digest(config, prepared)}.truth.json"
    if path.exists():
        return json.loads(path.read_text())
    truth = exhaustive_truth(config, prepared, evaluator)
    evaluator.cache.save()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(truth, default=str))
    return truth


def vizier_for(algorithm: str):
    from spica_pipeline.optimize.vizier import VizierClient

    if algorithm == "spica":  # stock Vizier GP-UCB-PE settings and classes
        return stock_vizier_client()
    return VizierClient(algorithm="DEFAULT" if algorithm == "ours" else algorithm)


def stock_vizier_client():
    """The client with Vizier's own GP-UCB-PE for its model-based asks: the stock classes, 75,000
    acquisition evaluations, ARD 500 iterations, no padding, compile caches cleared every suggest,
    no persistent cache. Seeding, history replay and the quasi-random seed batch are the client's."""
    from spica_pipeline.optimize.vizier import Study, VizierClient, resolve_algorithm

    class StockStudy(Study):
        def _gp_designer(self, algo, problem, rng, rows):
            from vizier.jax import optimizers

            from spica_pipeline.optimize import vizier_private as vp

            ard = optimizers.JaxoptScipyLbfgsB(optimizers.LbfgsBOptions(maxiter=500, best_n=None))
            return vp.VizierGPUCBPEBandit(problem, rng=rng, ard_random_restarts=4, ard_optimizer=ard,
                                          clear_jax_cache=True)

    class StockVizierClient(VizierClient):
        def open_study(self, encoding, metrics, *, seed, algorithm=None, name=None):
            return StockStudy(self, encoding, list(metrics), seed=seed,
                              algorithm=resolve_algorithm(self.algorithm, algorithm), name=name)

    return StockVizierClient(algorithm="DEFAULT", jax_cache_dir="")


def run_one(name: str, config, prepared, evaluator, algorithm: str, seed: int, optimum: float, budget: int,
            workers: int, scale: float, max_wall_s: float | None = None, simulated: bool = False) -> dict[str, Any]:
    from spica_pipeline.optimize.branch_plan import BranchPlan, plan_branch
    from spica_pipeline.sweep import run_branch

    algo = "DEFAULT" if algorithm in ("ours", "spica") else algorithm
    overrides: dict[str, Any] = dict(algorithm=algo, seed=seed, policy="rapid", parallel_evals=workers,
                                     optimizer_share=0.25 if algorithm == "ours" else None)
    per_round = config.sweep.per_round
    overrides["max_rounds"] = max(1, math.ceil(budget / per_round))
    cfg = with_sweep(config, **overrides)
    plan = plan_branch(prepared.branches[0], cfg)
    plan = BranchPlan(plan.branch, plan.encoding, plan.finite_size, plan.budget, False, "benchmark: rapid")
    records: list[Any] = []
    reach: dict[float, tuple[int, float]] = {}
    backend: CachedReplayBackend | SimulatedBackend = (SimulatedBackend if simulated else CachedReplayBackend)(
        evaluator, workers, scale)
    started = time.perf_counter()

    def elapsed() -> float:
        return backend.clock if isinstance(backend, SimulatedBackend) else time.perf_counter() - started

    def on_record(rec) -> None:
        records.append(rec)
        series = incumbent_series(records, config)
        if not series:
            return
        for level in LEVELS:
            if level not in reach and series[-1] >= optimum * level * (1 - 1e-9):
                reach[level] = (len(series), elapsed())
        if 1.0 in reach:
            raise ReachedTarget

    outcome = None
    # a wall cap bounds a run on this shared machine (no new trial starts after it; an ask already
    # running finishes): a capped run that did not reach a level counts its wall time, a lower bound
    deadline = None if max_wall_s is None or simulated else time.monotonic() + max_wall_s
    try:
        if algorithm == "spica":  # the Vizier study alone: no neighbourhood designer
            outcome = run_branch(plan, cfg, prepared.load_predictor, evaluate_wave=backend.evaluate_wave,
                                 vizier=vizier_for(algorithm), journal=MemoryJournal(), counter=TrialCounter(),
                                 on_record=on_record, deadline=deadline, neighbourhood=False)
        else:
            outcome = run_branch(plan, cfg, prepared.load_predictor, evaluate_wave=None, backend=backend,
                                 vizier=vizier_for(algorithm), journal=MemoryJournal(), counter=TrialCounter(),
                                 on_record=on_record, deadline=deadline)
    except ReachedTarget:
        pass
    finally:
        backend.close()
    wall = elapsed()
    series = incumbent_series(records, config)
    evals = len(series)
    designers: dict[str, int] = {}
    for r in records:
        designers[r.designer or "-"] = designers.get(r.designer or "-", 0) + 1
    opt_s = sum(r.optimizer_seconds for r in records)
    run = {"algorithm": algorithm, "seed": seed, "trials": len(records), "evaluations": evals,
           "wall_s": round(wall, 2), "optimizer_s": round(opt_s, 2),
           "optimizer_share_of_wall": round(opt_s / wall, 4) if wall > 0 and not simulated else None,
           "final_ratio": round(series[-1] / optimum, 6) if series else 0.0, "designers": designers,
           "stalled": bool(outcome.stalled) if outcome is not None else False,
           "capped": bool(outcome.out_of_time) if outcome is not None else False,
           "digest": sequence_digest(records)}
    for level in LEVELS:
        pct = int(level * 100)
        hit = reach.get(level)
        run[f"evals_to_{pct}"] = hit[0] if hit else None
        run[f"wall_s_to_{pct}"] = round(hit[1], 2) if hit else None
    if algorithm == "ours":
        run.update(ask_costs(records, 2 if config.goal.is_pareto else 1))
    return run


def ask_costs(records, objectives: int) -> dict[str, Any]:
    """Per model-answered ask of a run (optimize/study.py `_model_answered`): [position of its first
    trial, batch size, measured seconds, optimize/cost.py's predicted seconds, padding bucket], in
    order; plus the seconds of the other asks (neighbourhood / quasi-random). The position is the
    ask's history + pending rows (the driver asks suggestion k with k earlier trials). Judged from
    the recorded designers: a model ask whose every suggestion was replaced by the neighbourhood
    designer (charged all the same: study.CHARGE_MODEL_RAN) counts under "other" here.
    "asks": every ask, [position, batch, seconds, first letter of each trial's designer]."""
    from spica_pipeline.optimize import cost
    from spica_pipeline.optimize.study import _model_answered

    asks: dict[int, list[tuple[int, Any]]] = {}
    for index, r in enumerate(records):
        asks.setdefault(r.round, []).append((index, r))
    model, every, other = [], [], 0.0
    for rows in asks.values():
        position, count = rows[0][0], len(rows)
        seconds = sum(r.optimizer_seconds or 0.0 for _, r in rows)
        designers = [r.designer or "" for _, r in rows]
        every.append([position, count, round(seconds, 3), "".join(d[:1] for d in designers)])
        if _model_answered(designers):
            model.append([position, count, round(seconds, 3),
                          round(cost.predicted_ask_seconds(position, count, objectives), 3),
                          cost.suggest_bucket(position + count)])
        else:
            other += seconds
    return {"model_asks": model, "model_ask_s": round(sum(a[2] for a in model), 3),
            "model_ask_predicted_s": round(sum(a[3] for a in model), 3), "other_ask_s": round(other, 3),
            "asks": every}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for algo in dict.fromkeys(r["algorithm"] for r in runs):
        mine = [r for r in runs if r["algorithm"] == algo]
        row: dict[str, Any] = {"seeds": len(mine)}
        for level in LEVELS:
            pct = int(level * 100)
            row[f"median_evals_to_{pct}"] = statistics.median(
                r[f"evals_to_{pct}"] if r[f"evals_to_{pct}"] is not None else r["evaluations"] for r in mine)
            row[f"median_wall_s_to_{pct}"] = round(statistics.median(
                r[f"wall_s_to_{pct}"] if r[f"wall_s_to_{pct}"] is not None else r["wall_s"] for r in mine), 2)
            row[f"seeds_reaching_{pct}"] = sum(1 for r in mine if r[f"evals_to_{pct}"] is not None)
        shares = [r["optimizer_share_of_wall"] for r in mine if r["optimizer_share_of_wall"] is not None]
        row["median_optimizer_share_of_wall"] = statistics.median(shares) if shares else None
        row["runs_capped"] = sum(1 for r in mine if r.get("capped"))
        out[algo] = row
    return out


def warm_up(config, prepared) -> float:
    """One GP suggest with a small history (pays the compiles), outside the timed runs."""
    from spica_pipeline.optimize.branch_plan import plan_branch, study_metrics

    plan = plan_branch(prepared.branches[0], config)
    study = vizier_for("ours").open_study(plan.encoding, study_metrics(config.goal), seed=12345)
    first = study.suggest(3, [])
    if config.goal.is_pareto:
        names = [m for m, _ in study_metrics(config.goal)]
        hist = [(p, {n: 1.0 + i + j for j, n in enumerate(names)}, None) for i, p in enumerate(first)]
    else:
        hist = [(p, {"objective": float(i + 1)}, None) for i, p in enumerate(first)]
    t0 = time.perf_counter()
    study.suggest(config.sweep.per_round, hist)
    return time.perf_counter() - t0


def import_warm_up(config, prepared) -> float:
    """One quasi-random suggest, outside the timed runs: pays the process's one-time Vizier/JAX
    import and the designer's first call, which would otherwise land on whichever run comes first
    (ours, seed 0, first space), without compiling any GP program."""
    from spica_pipeline.optimize.branch_plan import plan_branch, study_metrics

    t0 = time.perf_counter()
    plan = plan_branch(prepared.branches[0], config)
    study = vizier_for("QUASI_RANDOM_SEARCH").open_study(plan.encoding, study_metrics(config.goal), seed=12345,
                                                         algorithm="QUASI_RANDOM_SEARCH")
    study.suggest(config.sweep.per_round, [])
    return time.perf_counter() - t0


def large_run(algorithm: str, budget_s: float, out_dir: Path, seed: int = 0) -> dict[str, Any]:
    """One `spica sweep --time-budget` on the large space (the product path, real replays)."""
    import subprocess

    cmd = [sys.executable, "-m", "spica_pipeline.cli", "sweep", "--config", str(SPACES_DIR / "large_disagg.yaml"),
           "--output-dir", str(out_dir), "--time-budget", f"{budget_s:g}s", "--seed", str(seed)]
    if algorithm != "ours":
        cmd += ["--algorithm", algorithm]
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "DYN_LOG": "warn", "SPICA_VIZIER_ALGO": ""})
    wall = time.perf_counter() - started
    run: dict[str, Any] = {"algorithm": algorithm, "budget_s": budget_s, "returncode": proc.returncode,
                           "wall_s": round(wall, 1), "command": " ".join(cmd[1:]),
                           "stderr_tail": proc.stderr.strip().splitlines()[-3:]}
    run.update(ledger_stats(out_dir))
    return run


def ledger_stats(out_dir: Path) -> dict[str, Any]:
    """A large run's counts from its ledger, with the evaluations it took to first reach its best."""
    import pandas as pd

    ledger_path = out_dir / "ledger.parquet"
    if not ledger_path.exists():
        return {}
    ledger = pd.read_parquet(ledger_path)
    counted = ledger[ledger["status"] != "cached"]
    feasible = ledger[ledger["status"] == "feasible"]
    best = float(feasible["score"].max()) if len(feasible) else None
    reached = [i for i, (status, score) in enumerate(zip(counted["status"], counted["score"]))
               if best is not None and status == "feasible" and score >= best - 1e-9]
    return dict(trials=len(ledger), evaluations=len(counted), feasible=len(feasible), best=best,
                evals_to_best=reached[0] + 1 if reached else None, ledger=str(ledger_path),
                optimizer_s=round(float(ledger["optimizer_seconds"].sum()), 1),
                replay_s=round(float(ledger["replay_seconds"].sum()), 1),
                designers=ledger["designer"].value_counts().to_dict() if "designer" in ledger else {})


def large(args) -> int:
    out = Path(args.out) if args.out else RESULTS / "time_to_quality_large.json"
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"spica-ttq-large-{os.getpid()}"
    result: dict[str, Any] = {"benchmark": "time_to_quality_large",
                              "command": " ".join(["bench/bench_time_to_quality.py", *sys.argv[1:]]),
                              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                              "cpus": os.cpu_count(), "loadavg_at_start": os.getloadavg(),
                              "space": "bench/spaces/large_disagg.yaml", "runs": []}
    if args.merge and out.exists():  # e.g. ours in one bounded invocation, random in the next
        previous = json.loads(out.read_text())
        result["runs"] = previous.get("runs", [])
        result["invocations"] = previous.get("invocations", []) + [
            {"command": previous.get("command") or previous.get("argv"), "date": previous.get("date")}]
    if args.large_restat:  # recount every recorded run from its ledger (e.g. after adding a statistic)
        for run in result["runs"]:
            if run.get("ledger"):
                run.update(ledger_stats(Path(run["ledger"]).parent))
        result["summary"] = summarise_large(result["runs"])
        out.write_text(json.dumps(result, indent=2, default=str) + "\n")
        print(json.dumps(result["summary"]))
        return 0
    todo = [a.strip() for a in args.algorithms.split(",") if a.strip() in ("ours", "RANDOM_SEARCH")]
    for algorithm in todo:
        # Random search is memoryless, so "random for 4x as long" can run as --random-pieces runs of
        # 1/pieces of that time with seeds 0.. (best = the best of all pieces, evaluations summed): each
        # piece then fits a bounded slot on a shared machine. Ours is always one run.
        pieces = 1 if algorithm == "ours" else args.random_pieces
        budget = args.large_budget * (1.0 if algorithm == "ours" else args.random_factor / pieces)
        seeds = [args.large_seed] if args.large_seed is not None else list(range(pieces))
        for seed in seeds:
            result["runs"] = [r for r in result["runs"]
                              if not (r["algorithm"] == algorithm and r.get("seed", 0) == seed)]
            run = large_run(algorithm, budget, work / f"{algorithm}-{seed}", seed=seed)
            run.update(seed=seed, loadavg_at_end=os.getloadavg())
            result["runs"].append(run)
            print(json.dumps(run), flush=True)
            result["summary"] = summarise_large(result["runs"])
            out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return 0


def summarise_large(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per algorithm: wall, evaluations and best summed/maxed over its runs, and ours' best over random's."""
    summary: dict[str, Any] = {}
    for algorithm in ("ours", "RANDOM_SEARCH"):
        mine = [r for r in runs if r["algorithm"] == algorithm]
        if not mine:
            continue
        bests = [r["best"] for r in mine if r.get("best") is not None]
        summary[algorithm] = {"runs": len(mine), "budget_s": sum(r["budget_s"] for r in mine),
                              "evaluations": sum(r.get("evaluations", 0) for r in mine),
                              "optimizer_s": round(sum(r.get("optimizer_s", 0.0) for r in mine), 1),
                              "wall_s": round(sum(r["wall_s"] for r in mine), 1),
                              "best": max(bests) if bests else None,
                              "evals_to_best": [r.get("evals_to_best") for r in mine]}
    if summary.get("ours", {}).get("best") and summary.get("RANDOM_SEARCH", {}).get("best"):
        summary["best_ours_over_random"] = round(summary["ours"]["best"] / summary["RANDOM_SEARCH"]["best"], 4)
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--spaces", default=",".join(SPACES))
    ap.add_argument("--algorithms", default=",".join(ALGORITHMS))
    ap.add_argument("--seeds", type=int, default=None)
    ap.add_argument("--first-seed", type=int, default=0,
                    help="seeds first-seed .. first-seed + seeds - 1 (600 for the held-out seeds)")
    ap.add_argument("--spica-seeds", type=int, default=None)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--budget-frac", type=float, default=0.5)
    ap.add_argument("--replay-scale", type=float, default=1.0)
    ap.add_argument("--max-wall-s", type=float, default=120.0,
                    help="wall cap per run (bounded runs on a shared machine); capped runs are counted")
    ap.add_argument("--spica-max-wall-s", type=float, default=60.0, help="Spica-style's wall cap per run")
    ap.add_argument("--out", default=None)
    ap.add_argument("--warm-up", dest="warm_up", action="store_true",
                    help="pay the first GP compile before the timed runs (warm_up_s); by default the process's "
                         "first GP ask pays it, as a fresh sweep does")
    ap.add_argument("--no-warm-up", dest="warm_up", action="store_false", help="the default")
    ap.add_argument("--simulated", action="store_true",
                    help="a simulated clock instead of sleeping workers: evaluation counts depend on the seed only")
    ap.add_argument("--merge", action="store_true",
                    help="keep the runs of other algorithms already in --out (results built in bounded steps)")
    ap.add_argument("--truth-only", action="store_true", help="compute (or read) the cached truths and stop")
    ap.add_argument("--large", action="store_true", help="the >= 10^5-point time-budget comparison only")
    ap.add_argument("--large-budget", type=float, default=600.0, help="--large: ours' time budget (s)")
    ap.add_argument("--random-factor", type=float, default=4.0, help="--large: random runs this many x as long")
    ap.add_argument("--random-pieces", type=int, default=1,
                    help="--large: run random's time as this many independent runs (seeds 0..), best of all")
    ap.add_argument("--large-restat", action="store_true",
                    help="--large --merge: recount the recorded runs from their ledgers, run nothing")
    ap.add_argument("--large-seed", type=int, default=None, help="--large: run only this seed (one piece)")
    args = ap.parse_args(argv)
    apply_overrides()
    if args.large:
        return large(args)
    seeds = args.seeds if args.seeds is not None else (2 if args.quick else 5)
    spica_seeds = args.spica_seeds if args.spica_seeds is not None else (1 if args.quick else seeds)
    # Spica-style runs last in each space: its stock client clears the process's compile caches
    algorithms = sorted((a.strip() for a in args.algorithms.split(",") if a.strip()), key=lambda a: a == "spica")
    spaces = [s.strip() for s in args.spaces.split(",") if s.strip()]
    out = Path(args.out) if args.out else RESULTS / ("time_to_quality_quick.json" if args.quick
                                                      else "time_to_quality.json")
    from spica_pipeline.evaluate.replay import ReplayEvaluator

    result: dict[str, Any] = {
        "benchmark": "time_to_quality", "command": " ".join(["bench/bench_time_to_quality.py", *sys.argv[1:]]),
        "quick": args.quick, "simulated": args.simulated, "argv": sys.argv[1:],
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": platform.node(),
        "cpus": os.cpu_count(), "loadavg_at_start": os.getloadavg(), "workers": args.workers,
        "replay_scale": args.replay_scale, "budget_frac": args.budget_frac, "seeds": seeds,
        "first_seed": args.first_seed,
        "spica_seeds": spica_seeds, "max_wall_s": args.max_wall_s, "spica_max_wall_s": args.spica_max_wall_s,
        "spaces": {}, "details": {},
    }
    if OVERRIDES:
        result["overrides"] = OVERRIDES
    previous: dict[str, Any] = {}
    if args.merge and out.exists():  # one results file built by several bounded invocations
        previous = json.loads(out.read_text())
        result["spaces"] = previous.get("spaces", {})
        result["details"] = previous.get("details", {})
        result["invocations"] = previous.get("invocations", []) + [
            {k: previous.get(k) for k in ("command", "date", "loadavg_at_start", "wall_seconds", "complete")}]
    started = time.perf_counter()

    def write(complete: bool) -> None:
        result["complete"] = complete
        result["wall_seconds"] = round(time.perf_counter() - started, 1)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=2, default=str) + "\n")
        tmp.replace(out)

    for index, name in enumerate(spaces):
        config, prepared = prepare_space(SPACES_DIR / f"{name}.yaml")
        cache = OutcomeCache(CACHE_DIR / f"{name}.{space_key(config)}.outcomes.json")
        evaluator = CachingEvaluator(ReplayEvaluator(), cache)
        print(f"[{name}] exhaustive truth ...", flush=True)
        truth = cached_truth(name, config, prepared, evaluator)
        if args.truth_only:
            print(f"[{name}] {truth['points']} points, optimum {truth['optimum']}, replay {truth.get('replay_seconds')} s")
            continue
        optimum = truth["optimum"]
        budget = max(config.sweep.max_rounds * config.sweep.per_round,
                     math.ceil(args.budget_frac * truth["points"]))
        print(f"[{name}] {truth['points']} points, optimum {optimum:.6g} ({truth['measure']}), "
              f"budget {budget} evaluations", flush=True)
        if not args.warm_up and "ours" in algorithms:
            warm = None
            if index == 0:
                result["import_warm_up_s"] = round(import_warm_up(config, prepared), 2)
        else:
            warm = warm_up(config, prepared) if "ours" in algorithms else (
                previous.get("details", {}).get(name, {}).get("warm_up_s"))  # only ours uses the compiled GP
        runs: list[dict[str, Any]] = []
        if args.merge and name in previous.get("details", {}):  # keep the other algorithms' runs
            runs = [r for r in previous["details"][name]["runs"] if r["algorithm"] not in algorithms]
            result["spaces"][name] = summarise(runs) if runs else {}
        detail = {"points": truth["points"], "optimum": optimum, "measure": truth["measure"], "budget": budget,
                  "truth_replay_seconds": truth.get("replay_seconds"), "warm_up_s": warm, "runs": runs}
        result["details"][name] = detail
        for algorithm in algorithms:
            for seed in range(args.first_seed, args.first_seed + seeds):
                if algorithm == "spica" and (seed - args.first_seed >= spica_seeds or (args.quick and index > 0)):
                    continue
                cap = args.spica_max_wall_s if algorithm == "spica" else args.max_wall_s
                run = run_one(name, config, prepared, evaluator, algorithm, seed, optimum, budget, args.workers,
                              args.replay_scale, cap, simulated=args.simulated)
                cache.save()
                runs.append(run)
                print(f"[{name}] {algorithm} seed {seed}: evals to 95/99/100% = {run['evals_to_95']}/"
                      f"{run['evals_to_99']}/{run['evals_to_100']} (of {run['evaluations']}), wall to 99% "
                      f"{run['wall_s_to_99']}s, optimizer share {run['optimizer_share_of_wall']}", flush=True)
                result["spaces"][name] = summarise(runs)
                write(False)
    if args.truth_only:
        return 0
    write(True)
    print(json.dumps(result["spaces"], indent=1))
    print(f"wrote {out} in {result['wall_seconds']}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
