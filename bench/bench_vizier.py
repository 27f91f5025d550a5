"""Wall time of Study.suggest on a quickstart-sized branch (~9 parameters), in ONE process.

usage:
  .venv/bin/python bench/bench_vizier.py [--algos DEFAULT,GAUSSIAN_PROCESS_BANDIT,...] [--ns 0,4,8,16,32]
      [--count 4] [--budget 4000] [--restarts 4] [--ard-iter 50] [--cache DIR|none]
      [--gil] [--quality ROUNDS] [--acq-budgets 75000,4000,1000]

Run it twice with the same --cache DIR: the first run sees a cold persistent JAX cache (delete the
dir first), the second a warm one. Each line printed is one JSON record:
  {"algo", "n", "seconds", "cpu_s", "compiles", "compile_s", "designer", "distinct", "rss_mb"}
cpu_s (process CPU time, all threads) is the load-independent number on a shared machine.
--gil: heartbeat of the main thread while a GP suggest runs in Study.suggest_async (max gap = how
long the GIL was held), and wall time of a busy subprocess alone vs overlapped with the suggest.
--quality R: R rounds x count suggestions on the toy objective; prints the best value per round
(sample efficiency check for a budget setting).
--after-first: the compile-once check (issue 15). Per (algorithm, objectives): one study in this
process, a warm-up suggest, then --reps suggests at each N of --ns; writes (--json) the
"median_suggest_s_after_first" per (algorithm, n_trials, objectives), the first call and the RSS
growth over --rss-suggests more suggests, e.g.
  .venv/bin/python bench/bench_vizier.py --after-first --algos DEFAULT --count 8 --ns 8,16,32,64,100 \
      --objectives 1,2 --reps 3 --rss-suggests 50 --cache none --json bench/results/vizier_after_first.json

The product's numbers live in bench/results/vizier_after_first.json (--after-first, above);
cpu_s is the comparable number on a shared machine (wall times there run 2-4x the CPU times).
"""

import argparse
import json
import math
import os
import random
import resource
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from spica_pipeline.optimize.encoding import build_encoding  # noqa: E402
from spica_pipeline.optimize.vizier import VizierClient  # noqa: E402
from spica_pipeline.space.branches import BranchSpace as Branch  # noqa: E402
from spica_pipeline.space.shapes import RoleShape as R  # noqa: E402


def quickstart_branch() -> Branch:
    """An 8-GPU MoE agg branch: 4 structural + 4 knob + kv_load_ratio = 9 parameters."""
    pool = tuple(
        R(tp=t, attention_dp=d, moe_ep=t * d if t * d > 1 else 1, replicas=r)
        for t in (1, 2, 4, 8) for d in (1, 2) for r in (1, 2, 4, 8) if t * d * r <= 8
    )
    knobs = {
        "backend": ["vllm"],
        "router_mode": ["kv_router", "round_robin"],
        "overlap_score_credit": [0.0, 0.5, 1.0],
        "planner_scaling_policy": ["none", "load_180_10", "throughput_60"],
        "agg_max_num_seqs": [64, 128, 256, 512],
    }
    return Branch("agg", pool, tuple(("vllm",) for _ in pool), knobs, 8, {"kv_load_ratio": (0.2, 0.9)})


def toy_objective(enc, params: dict) -> tuple[dict | None, str | None]:
    """Deterministic stand-in for a replay: goodput-like score, infeasible when KV would overflow."""
    sel, req = enc.decode(params)
    cfg = enc.project(sel, req).config
    if sel["kv_load_ratio"] > 0.85 and cfg.gpus_per_engine == 1:
        return None, "kv capacity"
    score = cfg.used_gpus ** 0.7 * math.log2(2 * cfg.gpus_per_engine) * (1.3 if cfg.attention_dp > 1 else 1.0)
    score *= 1.0 + 0.2 * (sel["router_mode"] == "kv_router") * sel["overlap_score_credit"]
    score *= 1.0 - abs(math.log2(sel["agg_max_num_seqs"] / 256)) * 0.1
    score *= 1.0 - (sel["kv_load_ratio"] - 0.6) ** 2
    score *= {"none": 1.0, "load_180_10": 1.15, "throughput_60": 1.05}[sel["planner_scaling_policy"]]
    return {"objective": score}, None


def random_history(enc, n: int, seed: int = 0) -> list:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        params = {}
        for p in enc.params:
            if p.kind == "double":
                params[p.name] = rng.uniform(*p.bounds)
            else:
                params[p.name] = rng.choice(p.values)
        m, reason = toy_objective(enc, params)
        rows.append((params, m, reason))
    return rows


COMPILES = {"n": 0, "s": 0.0}


def _count_compiles() -> None:
    import jax.monitoring

    def on_event(event, duration, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            COMPILES["n"] += 1
            COMPILES["s"] += duration

    jax.monitoring.register_event_duration_secs_listener(on_event)


def rss_mb() -> int:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def busy_subprocess(seconds: float) -> subprocess.Popen:
    code = f"import time\nt=time.process_time()\nwhile time.process_time()-t<{seconds}: sum(range(1000))"
    return subprocess.Popen([sys.executable, "-c", code])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--algos", default="QUASI_RANDOM_SEARCH,RANDOM_SEARCH,GAUSSIAN_PROCESS_BANDIT,DEFAULT")
    ap.add_argument("--ns", default="0,4,8,16,32")
    ap.add_argument("--count", type=int, default=4)
    ap.add_argument("--budget", type=int, default=VizierClient.model_fields["acquisition_evaluations"].default)
    ap.add_argument("--restarts", type=int, default=4)
    ap.add_argument("--ard-iter", type=int, default=VizierClient.model_fields["ard_max_iterations"].default)
    ap.add_argument("--cache", default="~/.cache/spica-pipeline/jax-bench")
    ap.add_argument("--gil", action="store_true")
    ap.add_argument("--quality", type=int, default=0)
    ap.add_argument("--acq-budgets", default="", help="e.g. 75000,16000,4000,1000: acquisition value reached")
    ap.add_argument("--after-first", action="store_true",
                    help="series mode: per (algorithm, objectives) one study in this process; one warm-up "
                         "suggest, then --reps suggests at each N of --ns; reports median_suggest_s_after_first "
                         "per (algorithm, n_trials, objectives), the first call, and RSS over --rss-suggests")
    ap.add_argument("--objectives", default="1,2", help="series mode: objective counts to run")
    ap.add_argument("--reps", type=int, default=3, help="series mode: suggests per N")
    ap.add_argument("--rss-suggests", type=int, default=0, help="series mode: extra suggests to measure RSS growth")
    ap.add_argument("--rss-objectives", default="1", help="series mode: objective counts that get the RSS check")
    ap.add_argument("--json", dest="json_out", default="", help="series mode: write the summary JSON here")
    ap.add_argument("--first-only", action="store_true",
                    help="series mode: only the first call per (algorithm, objectives), e.g. a second run "
                         "with the same --cache DIR measures the first call with a warm persistent cache")
    ap.add_argument("--merge", action="store_true",
                    help="series mode: merge into the existing --json (keys per algorithm/N/objectives, "
                         "this run's argv/date/loadavg appended to 'invocations') instead of replacing it")
    args = ap.parse_args()
    if args.after_first:
        return after_first(args)

    enc = build_encoding(quickstart_branch())
    counting = False
    client_kw = dict(
        acquisition_evaluations=args.budget,
        ard_random_restarts=args.restarts,
        ard_max_iterations=args.ard_iter,
        jax_cache_dir="" if args.cache == "none" else args.cache,
    )
    print(json.dumps({"params": len(enc.params), "config": client_kw}), flush=True)
    ns = [int(x) for x in args.ns.split(",")]
    for algo in args.algos.split(","):
        study = VizierClient(algorithm=algo, **client_kw).open_study(enc, [("objective", "max")], seed=0)
        study.problem()  # runtime setup (imports jax) happens here
        if not counting:
            _count_compiles()
            counting = True
        for n in ns:
            hist = random_history(enc, n)
            c0 = dict(COMPILES)
            cpu0 = time.process_time()
            out = study.suggest(args.count, hist)
            print(json.dumps({
                "algo": algo, "n": n, "seconds": round(study.last_suggest_seconds, 2),
                "cpu_s": round(time.process_time() - cpu0, 2),
                "compiles": COMPILES["n"] - c0["n"], "compile_s": round(COMPILES["s"] - c0["s"], 1),
                "designer": study.last_designer, "distinct": len({json.dumps(p, sort_keys=True) for p in out}),
                "rss_mb": rss_mb(),
            }), flush=True)
        if args.quality:
            hist = []
            best = []
            for _ in range(args.quality):
                for p in study.suggest(args.count, hist):
                    m, reason = toy_objective(enc, p)
                    hist.append((p, m, reason))
                best.append(round(max((m["objective"] for _, m, _ in hist if m), default=0.0), 3))
            print(json.dumps({"algo": algo, "quality_best_per_round": best}), flush=True)

    if args.acq_budgets:
        # Same history, same seed: how good is the acquisition optimum found with a smaller budget?
        hist = random_history(enc, int(ns[-1]), seed=1)
        for budget in [int(b) for b in args.acq_budgets.split(",")]:
            kw = dict(client_kw, acquisition_evaluations=budget)
            study = VizierClient(algorithm="DEFAULT", **kw).open_study(enc, [("objective", "max")], seed=0)
            cpu0 = time.process_time()
            out = study.suggest(args.count, hist)
            print(json.dumps({"acq_budget": budget, "n": len(hist), "seconds": round(study.last_suggest_seconds, 1),
                              "cpu_s": round(time.process_time() - cpu0, 1),
                              "acquisition": [round(a, 4) for a in study.last_acquisition],
                              "first": out[0]}), flush=True)

    if args.gil:
        algo = "DEFAULT"
        study = VizierClient(algorithm=algo, **client_kw).open_study(enc, [("objective", "max")], seed=0)
        hist = random_history(enc, 12, seed=3)
        # 1) GIL: main-thread heartbeat every 5 ms while the suggest runs on the worker thread
        fut = study.suggest_async(args.count, hist)
        gaps, last, t0 = [], time.perf_counter(), time.perf_counter()
        while not fut.done():
            time.sleep(0.005)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
        fut.result()
        gaps.sort()
        print(json.dumps({"gil": {"suggest_s": round(time.perf_counter() - t0, 2), "ticks": len(gaps),
                                  "p50_gap_ms": round(1000 * gaps[len(gaps) // 2], 1),
                                  "p99_gap_ms": round(1000 * gaps[int(len(gaps) * 0.99)], 1),
                                  "max_gap_ms": round(1000 * gaps[-1], 1)}}), flush=True)
        # 2) overlap: a 15-CPU-second "replay" subprocess alone, then overlapped with a suggest
        t0 = time.perf_counter()
        busy_subprocess(15).wait()
        alone = time.perf_counter() - t0
        hist = random_history(enc, 13, seed=4)  # a new N: same padded shapes, fresh GP fit
        t0 = time.perf_counter()
        proc = busy_subprocess(15)
        fut = study.suggest_async(args.count, hist)
        fut.result()
        t_sug = time.perf_counter() - t0
        proc.wait()
        both = time.perf_counter() - t0
        t0 = time.perf_counter()
        study.suggest(args.count, random_history(enc, 14, seed=5))
        seq_sug = time.perf_counter() - t0
        print(json.dumps({"overlap": {"replay_alone_s": round(alone, 1), "suggest_alone_s": round(seq_sug, 1),
                                      "suggest_overlapped_s": round(t_sug, 1), "both_overlapped_s": round(both, 1),
                                      "sequential_sum_s": round(alone + seq_sug, 1)}}), flush=True)
    print(json.dumps({"rss_mb": rss_mb(), "threads": threading.active_count()}), flush=True)


def _history(enc, n: int, objectives: int, seed: int) -> list:
    rows = random_history(enc, n, seed=seed)
    if objectives == 1:
        return rows
    # a second, conflicting objective (minimise): more GPUs cost more
    return [(p, None if m is None else {"objective": m["objective"],
                                        "cost": enc.project(*enc.decode(p)).config.used_gpus + p["kv_load_ratio"]}, r)
            for p, m, r in rows]


def rss_now_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def after_first(args) -> None:
    """Compile-once check: the first GP suggest pays the compiles; later ones at any N reuse them."""
    import statistics

    enc = build_encoding(quickstart_branch())
    client_kw = dict(acquisition_evaluations=args.budget, ard_random_restarts=args.restarts,
                     ard_max_iterations=args.ard_iter, jax_cache_dir="" if args.cache == "none" else args.cache)
    ns = [int(x) for x in args.ns.split(",")]
    cache = client_kw["jax_cache_dir"]
    cache_state = "none" if not cache else (
        "warm" if os.path.isdir(os.path.expanduser(cache)) and os.listdir(os.path.expanduser(cache)) else "cold")
    summary: dict = {"config": client_kw, "count": args.count, "reps": args.reps, "ns": ns,
                     "median_suggest_s_after_first": {}, "median_suggest_cpu_s_after_first": {},
                     "first_call_s": {}, "rss": {}, "records": []}
    if args.merge and args.json_out and os.path.exists(args.json_out):
        with open(args.json_out) as fh:
            summary = json.load(fh)
        for k in ("median_suggest_s_after_first", "median_suggest_cpu_s_after_first", "first_call_s", "rss"):
            summary.setdefault(k, {})
        summary.setdefault("records", [])
    summary.setdefault("invocations", []).append(
        {"argv": sys.argv[1:], "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
         "loadavg_start": os.getloadavg(), "persistent_cache": cache_state, "config": client_kw})
    for algo in args.algos.split(","):
        for objectives in [int(x) for x in args.objectives.split(",")]:
            metrics = [("objective", "max")] + ([("cost", "min")] if objectives == 2 else [])
            study = VizierClient(algorithm=algo, **client_kw).open_study(enc, metrics, seed=0)
            tag = f"{algo}|objectives={objectives}"
            t0, c0 = time.perf_counter(), time.process_time()
            study.suggest(args.count, _history(enc, ns[0], objectives, seed=99))
            first = {"wall_s": round(time.perf_counter() - t0, 2), "cpu_s": round(time.process_time() - c0, 2),
                     "n": ns[0], "persistent_cache": cache_state, "loadavg": os.getloadavg()}
            summary["first_call_s"][f"{tag}|cache={cache_state}"] = first
            print(json.dumps({"first": tag, **first}), flush=True)
            if args.first_only:
                _write_summary(args, summary, complete=False)
                continue
            for n in ns:
                walls, cpus = [], []
                for rep in range(args.reps):
                    hist = _history(enc, n, objectives, seed=rep)
                    c0 = time.process_time()
                    study.suggest(args.count, hist)
                    walls.append(study.last_suggest_seconds)
                    cpus.append(time.process_time() - c0)
                    rec = {"algo": algo, "objectives": objectives, "n": n, "rep": rep,
                           "seconds": round(walls[-1], 3), "cpu_s": round(cpus[-1], 3),
                           "designer": study.last_designer, "rss_mb": round(rss_now_mb()),
                           "loadavg_1m": round(os.getloadavg()[0], 2)}
                    summary["records"].append(rec)
                    print(json.dumps(rec), flush=True)
                key = f"{algo}|n_trials={n}|objectives={objectives}"
                summary["median_suggest_s_after_first"][key] = round(statistics.median(walls), 3)
                summary["median_suggest_cpu_s_after_first"][key] = round(statistics.median(cpus), 3)
                summary.setdefault("max_suggest_cpu_s_after_first", {})[key] = round(max(cpus), 3)
                _write_summary(args, summary, complete=False)  # a bounded run keeps what it measured
            if args.rss_suggests and str(objectives) in args.rss_objectives.split(","):
                # growing trial counts, as in a study: every suggest has a new count (and so a new
                # unpadded shape), cycling through the padding buckets the series already compiled
                before = rss_now_mb()
                lo, hi = min(ns), max(ns)
                cpus = []
                for i in range(args.rss_suggests):
                    n = lo + (hi - lo) * i // max(1, args.rss_suggests - 1)
                    c0 = time.process_time()
                    study.suggest(args.count, _history(enc, n, objectives, seed=1000 + i))
                    cpus.append(time.process_time() - c0)
                summary["rss"][tag] = {"suggests": args.rss_suggests, "n_trials": [lo, hi], "before_mb": round(before),
                                       "after_mb": round(rss_now_mb()), "growth_mb": round(rss_now_mb() - before),
                                       "median_cpu_s": round(statistics.median(cpus), 3),
                                       "max_cpu_s": round(max(cpus), 3)}
                print(json.dumps({"rss": tag, **summary["rss"][tag]}), flush=True)
                _write_summary(args, summary, complete=False)
    print(json.dumps({k: summary[k] for k in ("median_suggest_s_after_first", "first_call_s", "rss")}), flush=True)
    _write_summary(args, summary, complete=True)


def _write_summary(args, summary: dict, complete: bool) -> None:
    """Atomic JSON write of the series summary (also after each N, so a stopped run is kept)."""
    if not args.json_out:
        return
    summary["invocations"][-1].update(complete=complete, loadavg_end=os.getloadavg())
    summary.update(complete=complete, argv=sys.argv[1:], loadavg=os.getloadavg(),
                   date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    tmp = args.json_out + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(summary, fh, indent=2)
    os.replace(tmp, args.json_out)


if __name__ == "__main__":
    main()
