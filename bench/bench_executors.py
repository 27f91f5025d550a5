"""Evaluation backends side by side: the local spawned pool vs Ray (a script, not a test).

    DYN_LOG=warn .venv/bin/python bench/bench_executors.py [--quick] [--out bench/results/executors.json]

1. start-up: a backend's first candidate (processes spawned / Ray started + actors warm);
2. per-task overhead: N candidates that each sleep 10 ms, streamed through 1 and 2 workers;
   overhead per candidate = (wall - N x 10 ms / workers) x workers / N (the target for Ray: <= 50 ms);
3. candidates/s on a CPU-bound candidate (a fixed number of loop iterations, ~0.2 s on one idle
   core) with 1 and 2 workers, local pool vs a local Ray on this machine, and the scaling
   efficiency of the second worker, throughput(2) / (2 x throughput(1)); 1-3 alternate the four
   variants over rounds and report medians (other work on a shared host comes in bursts);
4. a simulated multi-node cluster (ray.cluster_utils.Cluster, 3 nodes of 1 CPU on 127.0.0.1):
   candidates/s with 1, 2, 3 workers (one per node) and the scaling efficiency of each added
   worker, throughput(n) / (n x throughput(1)).

With every CPU-bound row goes the worker utilisation: the share of each worker's wall time spent
inside a candidate (as the worker timed it). Contention slows candidates but leaves this near 1;
only the backend's own gaps (dispatch, transfer, idle workers) lower it, so it is the backend's
part of the scaling efficiency, which a crowded host cannot hide. Each row records the load
average when it finished.

Every node and server is on 127.0.0.1. What the machine can show is printed with the numbers: its
core count and load average. Nodes of a simulated cluster share this machine's cores, so worker
counts above the free cores measure contention, not Ray.
"""

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("DYN_LOG", "warn")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spica_pipeline.evaluate.evaluator import EvalOutcome, EvalRequest  # noqa: E402
from spica_pipeline.evaluate.pool import EvaluationPool  # noqa: E402
from spica_pipeline.evaluate.ray_pool import RayEvaluationPool, loopback_only  # noqa: E402
from spica_pipeline.space.candidate import Candidate, EngineArgs, Role  # noqa: E402
from spica_pipeline.space.shapes import RoleShape  # noqa: E402

SLEEP_S = 0.010
# any candidate: the bench evaluator reads its work from the request's context
CANDIDATE = Candidate(model="m", system="h200_sxm", backend="vllm",
                      roles=(Role("agg", RoleShape(), EngineArgs(8192, 256, 64, 0.9, True)),))


class BenchEvaluator:
    """sleep: wait `SLEEP_S` (no CPU: measures the backend's own cost); spin: `iterations` of a loop
    (fixed CPU work: measures how many cores the backend really uses)."""

    def __init__(self, iterations: int):
        self.iterations = iterations

    def evaluate(self, request: EvalRequest) -> EvalOutcome:
        started = time.perf_counter()
        if request.context["kind"] == "sleep":
            time.sleep(SLEEP_S)
        else:
            x = 0
            for i in range(self.iterations):
                x += i * i % 7
        return EvalOutcome("feasible", report={"i": float(request.context["i"])},
                           replay_seconds=time.perf_counter() - started)


def requests(kind: str, n: int) -> list[EvalRequest]:
    return [EvalRequest(CANDIDATE, {}, {}, {"kind": kind, "i": i}) for i in range(n)]


def stream(backend, reqs: list[EvalRequest]) -> tuple[float, float]:
    """Submit all, collect completions as they finish; (wall seconds, the candidates' own seconds
    summed, as each worker timed its candidate)."""
    t0 = time.perf_counter()
    for r in reqs:
        backend.submit(r)
    busy = [c.outcome.replay_seconds for c in backend.completions()]
    assert len(busy) == len(reqs), (len(busy), len(reqs))
    return time.perf_counter() - t0, sum(busy)


def warm(backend, workers: int) -> float:
    """Seconds until every worker has answered once (Ray: until `workers` actors are ready)."""
    t0 = time.perf_counter()
    backend.evaluate_wave(requests("sleep", workers))
    if isinstance(backend, RayEvaluationPool):
        while len(backend.workers_info()) < workers:
            backend.evaluate_wave(requests("sleep", workers))
    return time.perf_counter() - t0


def calibrate(target_s: float) -> int:
    """Loop iterations that take ~target_s on one core here (median of 3)."""
    probe = 200_000
    ev = BenchEvaluator(probe)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        ev.evaluate(EvalRequest(CANDIDATE, {}, {}, {"kind": "spin", "i": 0}))
        times.append(time.perf_counter() - t0)
    return max(1, int(probe * target_s / statistics.median(times)))


def measure(backend, workers: int, n_sleep: int, n_spin: int) -> dict:
    start = warm(backend, workers)
    wall, _ = stream(backend, requests("sleep", n_sleep))
    overhead_ms = (wall - n_sleep * SLEEP_S / workers) * workers / n_sleep * 1000
    spin_wall, spin_busy = stream(backend, requests("spin", n_spin))
    # utilisation: the share of each worker's time spent inside a candidate. Slower candidates on
    # a crowded machine lower candidates/s but not this; only the backend's own gaps (dispatch,
    # transfer, idle workers) do, so it is what a backend contributes to scaling efficiency.
    return {"workers": workers, "warm_s": round(start, 2), "sleep_candidates": n_sleep,
            "overhead_ms_per_candidate": round(overhead_ms, 2), "spin_candidates": n_spin,
            "candidates_per_s": round(n_spin / spin_wall, 3),
            "worker_utilisation": round(spin_busy / (workers * spin_wall), 3), "loadavg": loadavg()}


def median_row(rows: list[dict]) -> dict:
    """Per-field median over rounds, with each round's values kept."""
    out = dict(rows[0])
    for key in ("warm_s", "overhead_ms_per_candidate", "candidates_per_s", "worker_utilisation"):
        values = [r[key] for r in rows]
        out[key] = round(statistics.median(values), 3)
        out[f"{key}_rounds"] = values
    return out


def retry(start, cleanup=None, tries: int = 3):
    """Ray gives a raylet a fixed 30 s to register; a busy host can miss it: try again."""
    for attempt in range(1, tries + 1):
        try:
            return start()
        except Exception as err:
            if cleanup:
                cleanup()
            if attempt == tries:
                raise
            print(f"Ray did not start ({str(err).splitlines()[0][:120]}); try {attempt + 1} of {tries}")
            time.sleep(10)


def loadavg() -> list[str]:
    try:
        return Path("/proc/loadavg").read_text().split()[:3]
    except OSError:
        return []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer candidates (about 3 minutes here)")
    parser.add_argument("--spin-seconds", type=float, default=0.2, help="CPU work per spin candidate")
    parser.add_argument("--nodes", type=int, default=3, help="nodes of the simulated cluster (1 CPU each)")
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 3, quick 2)")
    parser.add_argument("--out", help="write the results as JSON")
    args = parser.parse_args()
    n_sleep, n_spin = (40, 12) if args.quick else (200, 40)
    args.rounds = args.rounds or (2 if args.quick else 3)

    import ray
    from ray.cluster_utils import Cluster

    loopback_only()
    machine = {"nproc": os.cpu_count(), "loadavg_at_start": loadavg()}
    iterations = calibrate(args.spin_seconds)
    ev = BenchEvaluator(iterations)
    print(f"machine: {machine['nproc']} cores, load average {' '.join(machine['loadavg_at_start'])}; "
          f"spin candidate = {iterations} iterations (~{args.spin_seconds:g} s on one core when calibrated)")
    results: dict = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                     "command": " ".join(["bench/bench_executors.py", *sys.argv[1:]]),
                     "machine": machine, "spin_iterations": iterations, "sleep_s": SLEEP_S}

    # 1-3: local pool vs a local Ray on this machine, 1 and 2 workers, alternated over rounds so a
    # burst of load from other work hits both (the median of the rounds is reported)
    t0 = time.perf_counter()
    retry(lambda: ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
                           object_store_memory=256 * 1024 * 1024, logging_level="warning"), ray.shutdown)
    results["ray_init_s"] = round(time.perf_counter() - t0, 2)
    runs: dict[tuple[str, int], list[dict]] = {}
    for round_no in range(1, args.rounds + 1):
        for name, make in (("local", lambda w: EvaluationPool(ev, workers=w, max_eval_seconds=120)),
                           ("ray", lambda w: RayEvaluationPool(ev, workers=w, max_eval_seconds=120))):
            for workers in (1, 2):
                with make(workers) as pool:
                    row = measure(pool, workers, n_sleep, n_spin)
                runs.setdefault((name, workers), []).append(row)
                print(f"round {round_no} {name} {workers} worker(s): {row}")
    ray.shutdown()
    for name in ("local", "ray"):
        results[name] = [median_row(runs[(name, w)]) for w in (1, 2)]
        one, two = results[name]
        two["scaling_efficiency"] = round(two["candidates_per_s"] / (2 * one["candidates_per_s"]), 3)
    local, on_ray = results["local"], results["ray"]
    if args.out:  # keep these even if the cluster part cannot start
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    for lo, ra in zip(local, on_ray):
        print(f"{lo['workers']} worker(s): overhead ms/candidate local {lo['overhead_ms_per_candidate']:.2f} | "
              f"ray {ra['overhead_ms_per_candidate']:.2f}; candidates/s local {lo['candidates_per_s']:.2f} | "
              f"ray {ra['candidates_per_s']:.2f} (ray/local {ra['candidates_per_s'] / lo['candidates_per_s']:.2f})"
              + (f"; scaling efficiency local {lo['scaling_efficiency']:.2f} | ray {ra['scaling_efficiency']:.2f}"
                 if "scaling_efficiency" in lo else "")
              + f"; worker utilisation local {lo['worker_utilisation']:.2f} | ray {ra['worker_utilisation']:.2f}")

    # 4: a simulated cluster of 1-CPU nodes on 127.0.0.1
    node = dict(num_cpus=1, object_store_memory=80 * 1024 * 1024, include_dashboard=False)
    t0 = time.perf_counter()

    def start_cluster():
        c = Cluster(initialize_head=False)
        try:
            for _ in range(args.nodes):
                c.add_node(**node)
            c.wait_for_nodes()
            c.connect()
        except Exception:
            c.shutdown()
            raise
        return c

    scaling: list[dict] = []
    results["cluster"] = {"nodes": args.nodes, "cpus_per_node": 1, "rows": scaling}
    try:
        cluster = retry(start_cluster)
    except Exception as err:  # keep the numbers above; say why this part is missing
        results["cluster"]["error"] = f"the simulated cluster did not start: {str(err).splitlines()[0][:200]}"
        print(results["cluster"]["error"])
        return finish(results, machine, args.out)
    results["cluster_start_s"] = round(time.perf_counter() - t0, 2)
    try:
        for workers in range(1, args.nodes + 1):
            with RayEvaluationPool(ev, workers=workers, max_eval_seconds=120) as pool:
                row = measure(pool, workers, n_sleep, n_spin * workers)
                row["nodes_used"] = len({i["node_id"] for i in pool.workers_info()})
            base = scaling[0]["candidates_per_s"] if scaling else row["candidates_per_s"]
            row["scaling_efficiency"] = round(row["candidates_per_s"] / (workers * base), 3)
            scaling.append(row)
            print(f"cluster {workers} worker(s) on {row['nodes_used']} node(s): {row['candidates_per_s']:.2f}/s, "
                  f"efficiency {row['scaling_efficiency']:.2f}, utilisation {row['worker_utilisation']:.2f}, "
                  f"overhead {row['overhead_ms_per_candidate']:.2f} ms, load {' '.join(row['loadavg'])}")
    finally:
        ray.shutdown()
        cluster.shutdown()
    return finish(results, machine, args.out)


def finish(results: dict, machine: dict, out: str | None) -> int:
    machine["loadavg_at_end"] = loadavg()
    print(f"load average at end {' '.join(machine['loadavg_at_end'])}: this machine has {machine['nproc']} cores "
          "shared with other work; efficiency beyond the free cores measures contention, not Ray")
    if out:
        Path(out).write_text(json.dumps(results, indent=1) + "\n")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
