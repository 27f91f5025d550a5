"""Time to quality on a simulated clock: evaluations to 95 / 99 / 100 % per (space, algorithm, seed),
deterministic, for tuning the cost-aware fill without the timed bench.

Same spaces, cached truths (bench/.cache, built by `bench_time_to_quality.py --truth-only`), study
loop and budgets as bench_time_to_quality.py, but the 2 workers are a simulated clock (each replay
takes its recorded replay seconds; the optimizer takes none), so the dispatch order, and with it
every evaluation count, is a function of the seed only. It reproduces the timed bench's evaluation
counts (e.g. disagg_goodput seeds 0-4 at 2026-12-04 09:31 UTC: ours 61, 81, 71, 13, 25); wall
seconds are the timed bench's job.

usage: .venv/bin/python bench/sim_time_to_quality.py SPACES ALGORITHMS SEEDS
  e.g. goodput_agg,pareto_disagg ours,QUASI_RANDOM_SEARCH 0,1,2,3,4,10,11,12,13,14
"""
import heapq, json, math, os, sys, statistics, time
from pathlib import Path
os.environ.setdefault("DYN_LOG", "warn")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT / "bench"))
import bench_time_to_quality as B
from bench_sample_efficiency import LEVELS, CachingEvaluator, OutcomeCache, incumbent_series, prepare_space, with_sweep
from spica_pipeline.resources.pool import Completion, EvaluationBackend
from spica_pipeline.search.study import MemoryJournal, TrialCounter

class SimBackend(EvaluationBackend):
    def __init__(self, cache, workers):
        super().__init__(workers, None)
        self.cache = cache; self.clock = 0.0; self.queue = []; self.running = []; self.seq = 0
    def _start(self):
        while self.queue and len(self.running) < self.workers:
            t, r = self.queue.pop(0); o = self.cache.get(r.spec_hash)
            assert o is not None, "cache miss"
            self.seq += 1
            heapq.heappush(self.running, (self.clock + max(0.0, o.replay_seconds), self.seq, t, r, o))
    def _submit(self, ticket, request, max_seconds):
        self.queue.append((ticket, request)); self._start()
    def _wait(self, timeout):
        if timeout == 0 or not self.running:
            # non-blocking: return whatever finished by now (nothing: clock only moves on blocking waits)
            return []
        end, _, t, r, o = heapq.heappop(self.running); self.clock = end
        out = [Completion(t, r, o)]
        self._start(); return out
    def _cancel(self, t): pass
    def _close(self): pass

# SIM_NB_<NAME>=<python literal>: override search/neighbourhood.py's module constant NAME (A/B trials)
import ast
import spica_pipeline.search.neighbourhood as NB
# (the designer's keyword defaults were bound at import, so they are overridden too: before this,
# SIM_NB_EXPLORE_SHARE / GAP_WEIGHT / EXPLORED_WEIGHT changed nothing)
_KW_DEFAULTS = NB.NeighbourhoodDesigner.__init__.__kwdefaults__ or {}
for _k, _v in os.environ.items():
    if _k.startswith("SIM_NB_"):
        _name = _k[len("SIM_NB_"):]
        setattr(NB, _name, ast.literal_eval(_v))
        if _name.lower() in _KW_DEFAULTS:
            _KW_DEFAULTS[_name.lower()] = ast.literal_eval(_v)

SPACES = {}
def space(name):
    if name not in SPACES:
        config, prepared = prepare_space(B.SPACES_DIR / f"{name}.yaml")
        cache = OutcomeCache(B.CACHE_DIR / f"{name}.{B.space_key(config)}.outcomes.json")
        # the truth of the current replays (keyed by every point's spec hash, as the timed bench keys it)
        path = B.CACHE_DIR / f"{name}.{B.space_key(config)}.{B.specs_digest(config, prepared)}.truth.json"
        if not path.exists():
            raise SystemExit(f"{path} missing: build it with bench_time_to_quality.py --truth-only --spaces {name}")
        truth = json.loads(path.read_text())
        SPACES[name] = (config, prepared, cache, truth)
    return SPACES[name]

def run(name, algorithm, seed, workers=2):
    from spica_pipeline.search.branch_plan import BranchPlan, plan_branch
    from spica_pipeline.sweep import run_branch
    config, prepared, cache, truth = space(name)
    optimum = truth["optimum"]
    budget = max(config.sweep.max_rounds * config.sweep.per_round, math.ceil(0.5 * truth["points"]))
    algo = "DEFAULT" if algorithm == "ours" else algorithm
    cfg = with_sweep(config, algorithm=algo, seed=seed, policy="rapid", parallel_evals=workers,
                     optimizer_share=(float(os.environ.get("SIM_OPTIMIZER_SHARE", 0.25))
                                      if algorithm == "ours" else None),
                     max_rounds=max(1, math.ceil(budget / config.sweep.per_round)))
    plan = plan_branch(prepared.branches[0], cfg)
    plan = BranchPlan(plan.branch, plan.encoding, plan.finite_size, plan.budget, False, "benchmark: rapid")
    records, reach = [], {}
    backend = SimBackend(cache, workers)
    def on_record(rec):
        records.append(rec)
        s = incumbent_series(records, config)
        if not s: return
        for lv in LEVELS:
            if lv not in reach and s[-1] >= optimum * lv * (1 - 1e-9):
                reach[lv] = (len(s), backend.clock)
        if 1.0 in reach: raise B.ReachedTarget
    try:
        run_branch(plan, cfg, prepared.load_predictor, evaluate_wave=None, backend=backend,
                   vizier=B.vizier_for(algorithm), journal=MemoryJournal(), counter=TrialCounter(), on_record=on_record)
    except B.ReachedTarget:
        pass
    n = len(incumbent_series(records, config))
    return {lv: reach.get(lv, (None, None)) for lv in LEVELS}, n, records

if __name__ == "__main__":
    spaces = sys.argv[1].split(","); algos = sys.argv[2].split(","); seeds = [int(s) for s in sys.argv[3].split(",")]
    out = {}
    for name in spaces:
        for a in algos:
            e99 = []; e95 = []; clk = []; reached = 0
            for s in seeds:
                reach, n, _ = run(name, a, s)
                e, c = reach[0.99]
                reached += e is not None
                e99.append(e if e is not None else n); e95.append(reach[0.95][0] or n)
            out[(name, a)] = (statistics.median(e99), reached, e99)
            print(f"{name:15s} {a:20s} med99={statistics.median(e99):5.1f} mean99={statistics.mean(e99):5.1f} reached={reached}/{len(seeds)} e99={e99} e95={e95}", flush=True)
