"""`spica sweep --config F`: run a sweep (resumable) and print the ranked candidates or the front."""

import argparse
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from spica_pipeline.cli.common import (
    EXIT_ENVIRONMENT,
    EXIT_INTERRUPTED,
    EXIT_NOTHING_FEASIBLE,
    EXIT_OK,
    EXIT_SLA_NOT_MET,
    EXIT_TERMINATED,
    SweepTerminated,
    environment_failure,
    fail,
    internal_error,
    load_or_report,
    sigterm_as_interrupt,
)
from spica_pipeline.cli.validate import algorithm_of
from spica_pipeline.config import SmartSearchConfig, render_validation_error
from spica_pipeline.config.sweep import ALGORITHMS
from spica_pipeline.errors import ConfigError, SpicaError
from spica_pipeline.evaluate import scoring
from spica_pipeline.evaluate.pool import ENGINE_LOG
from spica_pipeline.evaluate.ray_pool import RAY_ADDRESS_ENV
from spica_pipeline.optimize.journal import JOURNAL_NAME, QUARANTINE_SUFFIX
from spica_pipeline.preflight import refusal_line
from spica_pipeline.progress import ProgressPrinter
from spica_pipeline.report import verdict
from spica_pipeline.report.tables import describe_candidate
from spica_pipeline.sweep import run_sweep


def _with_overrides(config: Any, args: argparse.Namespace) -> Any:
    """Apply --seed/--policy/--algorithm/--executor/--ray-address/--time-budget and validate again (e.g. thorough + a float range)."""


    overrides = {k: v for k, v in (("seed", args.seed), ("policy", args.policy),
                                   ("algorithm", args.algorithm), ("executor", args.executor),
                                   ("ray_address", args.ray_address),
                                   ("time_budget", getattr(args, "time_budget", None))) if v is not None}
    if not overrides:
        return config
    data = config.model_dump(mode="json", exclude_unset=True)
    data.setdefault("sweep", {}).update(overrides)
    try:
        return SmartSearchConfig.from_dict(data)
    except ValidationError as err:
        return fail(f"invalid config {args.config}: {render_validation_error(err)}")
    except Exception as err:
        return fail(f"invalid config {args.config}: {err}")


def progress_for(config: SmartSearchConfig, output_dir: Path) -> ProgressPrinter:
    """The console's progress: the budget it counts against, the goal whose best it shows and
    where the replay runtime's own output goes."""
    target = config.goal.target.value
    pareto = target == "pareto"
    # a Ray cluster's actors keep their output in Ray's own logs on each node (evaluate/ray_pool.py)
    cluster = config.sweep.executor == "ray" and bool(config.sweep.ray_address or os.environ.get(RAY_ADDRESS_ENV))
    return ProgressPrinter(evaluation_budget=config.sweep.evaluation_budget, time_budget=config.sweep.time_budget,
                           goal=None if pareto else target,
                           sign=1.0 if pareto or scoring.direction(target) == "max" else -1.0,
                           engine_log=None if cluster else str(output_dir / ENGINE_LOG))


def cmd_sweep(args: argparse.Namespace) -> int:
    """Run a sweep; results and the resumable journal go under --output-dir."""
    config = load_or_report(args.config)
    if isinstance(config, int):
        return config
    config = _with_overrides(config, args)
    if isinstance(config, int):
        return config
    try:
        algorithm_of(config)  # an unknown SPICA_VIZIER_ALGO is bad input now, not at the first study
    except ConfigError as err:
        return fail(f"invalid config {args.config}: {err}")
    output_dir = Path(args.output_dir or Path("runs") / Path(args.config).stem)
    progress = progress_for(config, output_dir)
    try:
        with sigterm_as_interrupt():
            result = run_sweep(config, output_dir, progress=progress, repair=args.repair,
                               evaluator=getattr(args, "evaluator", None))
    except KeyboardInterrupt as err:
        progress.close()
        what, code = (("terminated (SIGTERM)", EXIT_TERMINATED) if isinstance(err, SweepTerminated)
                      else ("interrupted", EXIT_INTERRUPTED))
        print(f"{what}: finished trials are in {output_dir}/ledger.parquet; run the same command "
              "again to resume (journalled results are not recomputed)", file=sys.stderr)
        return code
    except SpicaError as err:  # bad input (2) or an environment failure already worded (4)
        progress.close()
        if args.debug and err.exit_code == EXIT_ENVIRONMENT:
            traceback.print_exc()
            debug_text = getattr(err, "debug_text", None)  # e.g. a pool worker's start-up traceback
            if debug_text:
                sys.stderr.write(debug_text)
        return fail(refusal_line(err, args.config), err.exit_code)  # a preflight refusal: validate's line
    except Exception as err:  # a full disk mid-sweep (4), or a bug (3): one line either way
        progress.close()
        message = environment_failure(err, output_dir)
        if message is None:
            return internal_error(err, args.debug, output_dir if output_dir.is_dir() else None)
        if args.debug:
            traceback.print_exc()
        return fail(message, EXIT_ENVIRONMENT)
    progress.close()
    merge = result.merge
    print(merge.summary_line())
    for line in merge.failure_summary():
        print(f"  {line}")
    t = result.timings
    print(f"optimizer {t.optimizer_seconds:.1f}s, replay {t.replay_seconds:.1f}s, "
          f"wall {t.wall_seconds:.1f}s; outputs in {output_dir}/ (report.md, candidates.csv, ledger.parquet)")
    if not merge.candidates:
        print("no feasible candidate found (check backends / SLA / gpu_budget / replay errors)", file=sys.stderr)
        for line in merge.failure_summary():
            print(f"  {line}", file=sys.stderr)
        return EXIT_NOTHING_FEASIBLE

    for line in verdict.headline(merge):  # offered load and SLA, in plain sentences, before the ranking
        print(line)
    lines = merge.cli_lines()
    if merge.is_pareto:
        print(lines.pop(0))
    for line, cand in list(zip(lines, merge.candidates))[: args.show]:
        notes = "".join(f" [{m}]" for m in verdict.marks(cand, merge))
        print(f"{line}{notes}  | {describe_candidate(cand, merge.target, merge.objectives, with_value=False)}")
    if len(merge.candidates) > args.show:
        print(f"... {len(merge.candidates) - args.show} more in {output_dir}/candidates.csv")
    return EXIT_SLA_NOT_MET if verdict.sla_unmet(merge) else EXIT_OK


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    sweep = sub.add_parser(
        "sweep", parents=[common], help="[EXPERIMENTAL] run a sweep and write ranked candidates or a Pareto front",
        description="[EXPERIMENTAL] Run a sweep: every candidate is evaluated in Dynamo Replay. "
                    "Rerunning the same command on the same --output-dir resumes an interrupted sweep.",
    )
    sweep.add_argument("--config", required=True, help="path to the sweep YAML")
    sweep.add_argument("--output-dir", help="where results and the journal go (default runs/<config name>)")
    sweep.add_argument("--seed", type=int, help="override sweep.seed")
    sweep.add_argument("--policy", choices=["rapid", "thorough"], help="override sweep.policy")
    sweep.add_argument("--algorithm", help=f"override sweep.algorithm ({', '.join(ALGORITHMS)})")
    sweep.add_argument("--executor", choices=["local", "ray"],
                       help="override sweep.executor: where replays run (ray: see docs/ray.md)")
    sweep.add_argument("--ray-address", help="override sweep.ray_address (default $RAY_ADDRESS, else a local Ray)")
    sweep.add_argument("--time-budget", help="override sweep.time_budget, e.g. 10m, 90s, 1h: evaluate until it "
                       "is spent (max_rounds, when also set, still caps the trials)")
    sweep.add_argument("--show", type=int, default=10, help="candidates to print (default 10)")
    sweep.add_argument("--repair", action="store_true",
                       help=f"move damaged journal records to {JOURNAL_NAME}{QUARANTINE_SUFFIX} and continue "
                            "(without it a damaged journal is refused with exit 2)")
    sweep.set_defaults(func=cmd_sweep)
