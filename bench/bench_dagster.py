"""The same sweep materialized through Dagster vs run by `run_sweep` (the CLI path), side by side.

    DYN_LOG=warn .venv/bin/python bench/bench_dagster.py [--config examples/configs/quickstart.yaml]
        [--algorithm RANDOM_SEARCH] [--repeats 1]

Both sides get the same validated config (launch overrides applied once), the real replay and
Vizier resources, and a fresh output folder / journal each time, so neither resumes the other.
Dagster runs the sweep's job in-process on an ephemeral instance (every stage, the four checks and
the deploy asset, all searched modes), which is what a launchpad or scheduled run does minus the
run-worker start. It also times the code location's load (all bundled sweeps) in a fresh interpreter.
Target: Dagster / run_sweep <= 1.15x. Module imports are paid before timing on both sides, and an
untimed warm-up sweep pays the first-use costs (AIC, Vizier, timing tables) before either is timed.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("DYN_LOG", "warn")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dagster as dg  # noqa: E402

from spica_pipeline.dagster.config import SweepLaunchConfig, read_sweep_config  # noqa: E402
from spica_pipeline.dagster.factory import sweeps_definitions  # noqa: E402
from spica_pipeline.dagster.io import ParquetIOManager, SweepStorage  # noqa: E402
from spica_pipeline.dagster.spec import sweep_spec  # noqa: E402
from spica_pipeline.evaluate.replay import ReplayEvaluator  # noqa: E402
from spica_pipeline.optimize.vizier import VizierClient  # noqa: E402
from spica_pipeline.sweep import run_sweep  # noqa: E402


def code_location_load_seconds() -> float:
    """A fresh interpreter importing the code location with every bundled sweep (what the code
    server does at start and at each reload)."""
    import subprocess

    code = ("import time; t=time.perf_counter(); import spica_pipeline.dagster.definitions as d; "
            "d.defs.resolve_asset_graph(); print(time.perf_counter()-t)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    return float(out.stdout.strip().splitlines()[-1])


def run_cli(config_path: str, launch: SweepLaunchConfig, root: Path) -> tuple[float, dict]:
    config = read_sweep_config(config_path, launch)
    t0 = time.perf_counter()
    result = run_sweep(config, root / "cli", evaluator=ReplayEvaluator(), vizier=VizierClient())
    seconds = time.perf_counter() - t0
    return seconds, {"trials": len(result.ledger), "summary": result.merge.summary_line()}


def run_dagster(config_path: str, launch: SweepLaunchConfig, root: Path) -> tuple[float, dict]:
    resources = {
        "io_manager": ParquetIOManager(base_dir=str(root / "assets")),
        "sweep_storage": SweepStorage(base_dir=str(root / "spica")),
        "replay": ReplayEvaluator(),
        "vizier": VizierClient(),
    }
    spec = sweep_spec("bench", config_path)
    defs = sweeps_definitions([spec], resources=resources)
    job = defs.resolve_job_def("bench_sweep")
    run_config = {"ops": {"bench__validated_config": {"config": launch.model_dump()}}}
    t0 = time.perf_counter()
    result = job.execute_in_process(run_config=run_config, instance=dg.DagsterInstance.ephemeral(),
                                    raise_on_error=False)
    seconds = time.perf_counter() - t0
    md = result.asset_materializations_for_node("bench__sweep_result")[0].metadata
    checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    return seconds, {"trials": md["trials"].value, "summary": md["summary"].value, "checks": checks}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="examples/configs/quickstart.yaml")
    ap.add_argument("--algorithm", default="RANDOM_SEARCH",
                    help="sweep.algorithm override (default RANDOM_SEARCH: no GP on a small CPU box)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--no-warmup", action="store_true",
                    help="skip the untimed run_sweep that first pays the in-process imports (AIC, Vizier) "
                         "and fills the timing-table disk cache")
    ap.add_argument("--json", help="also write the numbers to this JSON file")
    args = ap.parse_args()
    load = code_location_load_seconds()
    print(f"code location load (all bundled sweeps, fresh interpreter): {load:.1f} s  (target <= 10 s)",
          flush=True)
    launch = SweepLaunchConfig(algorithm=args.algorithm or None)
    if not args.no_warmup:
        with tempfile.TemporaryDirectory(prefix="bench-dagster-warmup-") as tmp:
            seconds, _ = run_cli(args.config, launch, Path(tmp))
        print(f"[warm-up] run_sweep {seconds:7.1f} s (untimed)", flush=True)

    cli_times, dag_times = [], []
    for i in range(args.repeats):
        # alternate the order so disk caches warmed by one side help both equally over repeats
        order = [("run_sweep", run_cli, cli_times), ("dagster", run_dagster, dag_times)]
        if i % 2:
            order.reverse()
        for name, fn, sink in order:
            with tempfile.TemporaryDirectory(prefix=f"bench-dagster-{name}-") as tmp:
                seconds, info = fn(args.config, launch, Path(tmp))
            sink.append(seconds)
            print(f"[{i + 1}/{args.repeats}] {name:9s} {seconds:7.1f} s  trials={info['trials']}  {info['summary']}"
                  + (f"  checks={info['checks']}" if "checks" in info else ""), flush=True)
    cli, dag = statistics.median(cli_times), statistics.median(dag_times)
    print(f"\nconfig {args.config} (algorithm {args.algorithm}), median of {args.repeats}:")
    print(f"  run_sweep : {cli:7.1f} s")
    print(f"  dagster   : {dag:7.1f} s")
    print(f"  ratio     : {dag / cli:.3f}x  (target <= 1.15x)")
    if args.json:
        import json

        Path(args.json).write_text(json.dumps({
            "benchmark": "bench_dagster", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "config": args.config, "algorithm": args.algorithm, "repeats": args.repeats, "nproc": os.cpu_count(),
            "code_location_load_s": round(load, 2), "run_sweep_s": [round(t, 2) for t in cli_times],
            "dagster_s": [round(t, 2) for t in dag_times], "ratio_of_medians": round(dag / cli, 3),
        }, indent=2) + "\n")


if __name__ == "__main__":
    main()
