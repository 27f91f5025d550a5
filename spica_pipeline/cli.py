"""`spica` command line: `spica validate|sweep --config F`, `spica export` / `spica import` (SweepResult).

Every failure ends with one line on stderr, never a traceback, and an exit code that tells the
truth (the README's table lists them):

    0 results; 1 nothing feasible; 2 bad input (config, trace, journal, output dir), checked before
    any replay; 3 internal error (a bug: the traceback goes to a log file, or to stderr with
    --debug); 4 environment failure mid-sweep (disk full, read-only filesystem, out of memory,
    worker processes or a Ray that cannot start or be reached), after flushing what can be
    flushed; 130 interrupted (SIGINT); 143 terminated (SIGTERM).
"""

import argparse
import contextlib
import errno
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from spica_pipeline.config import SmartSearchConfig, load_config, presets, render_validation_error
from spica_pipeline.config.sweep import ALGO_ENV, ALGORITHMS, resolve_algorithm
from spica_pipeline.errors import ConfigError, PolicyFilterError, SpicaError, TraceError, one_line
from spica_pipeline.evaluate.ray_pool import require_ray
from spica_pipeline.optimize.journal import JOURNAL_NAME, QUARANTINE_SUFFIX
from spica_pipeline.progress import ProgressPrinter
from spica_pipeline.report import merge_for_config
from spica_pipeline.report.sweep_result import ledger_to_sweep_result, sweep_result_to_ledger, to_json_text
from spica_pipeline.report.tables import describe_candidate
from spica_pipeline.space.model_hw import check_precision
from spica_pipeline.storage import atomic_write_parquet, atomic_write_text
from spica_pipeline.sweep import check_workload, filter_policies, goal_summary, run_sweep
from spica_pipeline.traces import path_problem

EXIT_OK = 0
EXIT_NOTHING_FEASIBLE = 1
EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 3
EXIT_ENVIRONMENT = 4
EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_TERMINATED = 143  # 128 + SIGTERM
ERROR_LOG_NAME = "spica-error.log"

DESCRIPTION = (
    "[EXPERIMENTAL] spica: a replay-backed smart sweeper for NVIDIA Dynamo deployments. "
    "Searches engine, router and planner configurations and scores each candidate in Dynamo Replay."
)


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> int:
    print(one_line(message), file=sys.stderr)
    return code


class SweepTerminated(KeyboardInterrupt):
    """SIGTERM (Kubernetes, Dagster, systemd) turned into the same unwinding as Ctrl-C: the sweep
    stops dispatching, the journal and partial ledger are flushed, the resume hint is printed."""


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Raise `SweepTerminated` in the main thread on the first SIGTERM; a second SIGTERM during
    the flush is ignored so the flush completes (SIGKILL still stops everything)."""
    fired = False

    def handler(signum: int, frame: Any) -> None:
        nonlocal fired
        if not fired:
            fired = True
            raise SweepTerminated()

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals to whoever owns it
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# errno -> (what happened, what to do); the advice must be true for that case
_ENVIRONMENT_ERRNOS = {
    errno.ENOSPC: ("no space left on device", "free space on the filesystem holding {dir}"),
    errno.EDQUOT: ("disk quota exceeded", "free space or raise the quota on the filesystem holding {dir}"),
    errno.EROFS: ("the filesystem is read-only", "make {dir} writable again (remount, or copy it to a "
                                                 "writable place and pass that as --output-dir)"),
    errno.EFBIG: ("file too large for this process's file-size limit", "raise the limit (ulimit -f)"),
    errno.EIO: ("I/O error", "check the disk holding {dir} (dmesg)"),
    errno.EMFILE: ("too many open files", "raise the open-file limit (ulimit -n) or lower sweep.parallel_evals"),
    errno.ENFILE: ("too many open files on this machine", "close other programs or lower sweep.parallel_evals"),
    errno.ENOMEM: ("out of memory", "free memory or lower sweep.parallel_evals"),
}


def environment_failure(err: BaseException, output_dir: Path | None) -> str | None:
    """The one-line message for a machine failure mid-sweep (exit 4), or None when `err` is not one."""
    place = str(output_dir) if output_dir is not None else "the output directory"
    if isinstance(err, MemoryError):
        what, todo = _ENVIRONMENT_ERRNOS[errno.ENOMEM]
    elif isinstance(err, OSError) and err.errno in _ENVIRONMENT_ERRNOS:
        what, todo = _ENVIRONMENT_ERRNOS[err.errno]
    elif (isinstance(err, PermissionError) and output_dir is not None and err.filename
          and _inside(Path(str(err.filename)), output_dir)):
        what, todo = "permission denied", "restore write permission on {dir}"
    else:
        return None
    name = getattr(err, "filename", None)
    where = f" writing {name}" if name else ""
    resume = (f"; finished trials are journalled in {output_dir}/{JOURNAL_NAME} and are not recomputed"
              if output_dir is not None else "")
    return f"environment failure: {what}{where}; {todo.format(dir=place)}, then run the same command again{resume}"


def _inside(path: Path, directory: Path) -> bool:
    try:
        path.resolve().relative_to(directory.resolve())
        return True
    except (ValueError, OSError):
        return False


def internal_error(err: BaseException, debug: bool, log_dir: Path | None = None) -> int:
    """A bug: one line on stderr naming where the traceback went; `--debug` prints it too."""
    text = traceback.format_exc()
    if debug:
        sys.stderr.write(text)
    where = "rerun with --debug to print the traceback"
    if log_dir is not None:
        log = log_dir / ERROR_LOG_NAME
        try:
            with open(log, "a") as fh:
                fh.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S%z')} spica {' '.join(sys.argv[1:])}\n{text}")
            where = f"traceback in {log} (or rerun with --debug to print it)"
        except OSError:
            pass
    message = one_line(f"{type(err).__name__}: {err}")
    if len(message) > 300:
        message = message[:297] + "..."
    print(one_line(f"internal error (a bug in spica, please report it): {message}; {where}"), file=sys.stderr)
    return EXIT_INTERNAL


def load_or_report(path: str) -> Any:
    """Load a config; returns the config, or an int exit code after printing one line."""

    try:
        return load_config(path)
    except ConfigError as err:
        return _fail(str(err))
    except Exception as err:  # a bug must still not print a traceback at the user
        return _fail(f"invalid config {path}: unexpected {type(err).__name__}: {err}")


def _choices_text(values: list[Any]) -> str:
    shown = [v if isinstance(v, str) else (f"custom_{i}" if isinstance(v, dict) else repr(v))
             for i, v in enumerate(values)]
    return ", ".join(shown)


def _inert_reason(space: Any, name: str) -> str | None:
    """Why a list knob never reaches the study (pruned as a dependent knob or swept elsewhere), or None."""

    if name == "load_predictor_candidates":
        return f"{len(space.load_predictor_candidates)} entries, swept by the load-predictor sub-sweep"
    if name in presets.ROUTER_CHOICES and space.round_robin_only:
        return "router_mode is round_robin only"
    if name in presets.OFFLOAD_ROUTER_KNOBS and not space.offload_enabled:
        return "num_g2_blocks is 0"
    if name in ("planner_fpm_sampling", "planner_load_sensitivity") and all(
        presets.is_static_policy(p) for p in space.planner_scaling_policy
    ):
        return "every scaling policy is static"
    modes = set(space.deployment_mode)
    if name.startswith(("prefill_", "decode_")) and name in presets.ENGINE_CHOICES and "disagg" not in modes:
        return "no disagg branch"
    if name.startswith("agg_") and "agg" not in modes:
        return "no agg branch"
    return None


def summarize(config: Any) -> list[str]:
    """A short human summary: branches, searched knobs, pins, workload and goal."""
    space, workload, goal, sweep = config.search_space, config.workload, config.goal, config.sweep
    lines = [f"model {space.model_name} on {space.hardware_sku}, gpu_budget {space.gpu_budget}"
             + (f" (min {space.min_gpu_budget})" if space.min_gpu_budget else "")]
    lines.append(f"branches: {', '.join(dict.fromkeys(space.deployment_mode))}")
    searched, pinned, inert = [], [], []
    for name, values in space.choice_lists().items():
        if name in ("deployment_mode",):
            continue
        why = _inert_reason(space, name)
        if why:
            inert.append(f"  {name} ({why})")
        elif len(values) > 1:
            searched.append(f"  {name}: {len(values)} choices [{_choices_text(values)}]")
        else:
            pinned.append(f"  {name} = {_choices_text(values)}")
    lines.append(f"searched knobs ({len(searched)}):")
    lines += searched or ["  (none)"]
    lines.append(f"pinned knobs ({len(pinned)}):")
    lines += pinned
    if inert:
        lines.append(f"inactive knobs ({len(inert)}):")
        lines += inert
    if space.parallel_configs:
        lines.append(f"parallel_configs: {len(space.parallel_configs)} pinned shape(s)")
    else:
        lines.append("parallel_configs: derived by enumeration")
    shape = workload.shape
    if workload.is_trace:
        wl = f"trace {workload.trace_path} (speedup {workload.arrival_speedup_ratio})"
        if workload.replay_concurrency is not None:
            wl += f", capped at {workload.replay_concurrency} in flight"
    else:
        load = {
            "request_rate": f"request_rate {workload.request_rate} req/s",
            "concurrency": f"concurrency {workload.concurrency}",
            "kv_load": f"kv_load_ratio {workload.kv_load_ratio}",
        }[shape]
        wl = f"synthetic isl {workload.isl} osl {workload.osl}, {load}, num_request_ratio {workload.num_request_ratio}"
    lines.append(f"workload: {wl}")
    objectives = ", ".join(t.value for t in goal.objectives())
    g = f"goal: {goal.target.value}" + (f" [{objectives}]" if goal.is_pareto else "")
    if goal.sla is not None:
        sla = {k: v for k, v in goal.sla.model_dump().items() if v is not None}
        g += f", sla {sla}"
    if getattr(goal, "load", None) is not None:
        g += f", load {goal.load.kind} {goal.load.value:g}"
    lines.append(g)
    lines.append(
        f"sweep: policy {sweep.policy}, algorithm {sweep.algorithm}, max_rounds {sweep.max_rounds}, "
        f"time_budget {'-' if sweep.time_budget is None else f'{sweep.time_budget:g}s'}, "
        f"per_round {sweep.per_round}, parallel_evals {sweep.parallel_evals}, seed {sweep.seed}"
    )
    return lines


def cmd_validate(args: argparse.Namespace) -> int:
    """Validate a config file and print what it would sweep."""
    config = load_or_report(args.config)
    if isinstance(config, int):
        return config
    trace = config.workload.trace_path

    problem = path_problem(trace) if trace is not None else None
    if problem is not None:
        hint = (f" (relative paths resolve against the working directory {Path.cwd()})"
                if problem.startswith("does not exist") and not Path(trace).is_absolute() else "")
        return _fail(f"invalid config {args.config}: workload.trace_path {trace!r} {problem}{hint}")
    try:
        algorithm = _resolve_algorithm(config)
    except ConfigError as err:
        return _fail(f"invalid config {args.config}: {err}")
    try:
        lines = summarize(config)
    except Exception as err:  # a summary bug must not turn into a traceback either
        return _fail(f"could not summarise config {args.config}: {type(err).__name__}: {err}")

    try:
        trace_warnings = check_workload(config)
        space = config.search_space
        check_precision(space.precision, space.model_name, space.hardware_sku)  # names field + choices
        if config.sweep.executor == "ray":  # the [ray] extra must be installed: exit 2 now, not at sweep start

            require_ray()
    except TraceError as err:  # names the trace file and line
        return _fail(str(err))
    except SpicaError as err:  # names the field and the limit
        return _fail(f"invalid config {args.config}: {err}")
    try:
        filtered = filter_policies(config)  # stage 2: a goal that leaves no usable policy is bad input
    except PolicyFilterError as err:
        return _fail(f"invalid config {args.config}: search_space.planner_scaling_policy: {err}")
    for warning in trace_warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"config {args.config} is valid")
    for line in lines:
        print(line)
    if algorithm != config.sweep.algorithm:

        print(f"algorithm {algorithm} (from {ALGO_ENV}, overriding sweep.algorithm {config.sweep.algorithm})")
    if filtered.dropped:
        print(filtered.summary())
    return EXIT_OK


def _resolve_algorithm(config: Any) -> str:
    """The Vizier algorithm a study would use, SPICA_VIZIER_ALGO included (ConfigError if unknown)."""

    return resolve_algorithm(config.sweep.algorithm)


def _with_overrides(config: Any, args: argparse.Namespace) -> Any:
    """Apply --seed/--policy/--algorithm/--executor/--ray-address/--time-budget and validate again (e.g. thorough + a float range)."""
    from pydantic import ValidationError


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
        return _fail(f"invalid config {args.config}: {render_validation_error(err)}")
    except Exception as err:
        return _fail(f"invalid config {args.config}: {err}")


def cmd_sweep(args: argparse.Namespace) -> int:
    """Run a sweep; results and the resumable journal go under --output-dir."""

    config = load_or_report(args.config)
    if isinstance(config, int):
        return config
    config = _with_overrides(config, args)
    if isinstance(config, int):
        return config
    try:
        _resolve_algorithm(config)  # an unknown SPICA_VIZIER_ALGO is bad input now, not at the first study
    except ConfigError as err:
        return _fail(f"invalid config {args.config}: {err}")
    output_dir = Path(args.output_dir or Path("runs") / Path(args.config).stem)
    progress = ProgressPrinter()
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
        return _fail(str(err), err.exit_code)
    except Exception as err:  # a full disk mid-sweep (4), or a bug (3): one line either way
        progress.close()
        message = environment_failure(err, output_dir)
        if message is None:
            return internal_error(err, args.debug, output_dir if output_dir.is_dir() else None)
        if args.debug:
            traceback.print_exc()
        return _fail(message, EXIT_ENVIRONMENT)
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

    lines = merge.cli_lines()
    if merge.is_pareto:
        print(lines.pop(0))
    for line, cand in list(zip(lines, merge.candidates))[: args.show]:
        print(f"{line}  | {describe_candidate(cand, merge.target, merge.objectives, with_value=False)}")
    if len(merge.candidates) > args.show:
        print(f"... {len(merge.candidates) - args.show} more in {output_dir}/candidates.csv")
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    """A sweep's ledger as an AI Simulate SweepResult (recommendation.json)."""
    import pandas as pd


    config = load_or_report(args.config)
    if isinstance(config, int):
        return config
    ledger_path = Path(args.run_dir) / "ledger.parquet"
    if not ledger_path.is_file():
        return _fail(f"--run-dir {args.run_dir}: no ledger.parquet there (run `spica sweep` first)")
    try:
        ledger = pd.read_parquet(ledger_path)
        merge = merge_for_config(ledger, config)
        doc = ledger_to_sweep_result(ledger, merge, config_json=config.model_dump(mode="json"),
                                     top_n=config.deploy.top_n, goal=goal_summary(config))
    except (ValueError, KeyError, OSError) as err:
        return _fail(f"cannot export {ledger_path}: {type(err).__name__}: {err}")
    output = Path(args.output or Path(args.run_dir) / "recommendation.json")
    try:
        atomic_write_text(output, to_json_text(doc))
    except OSError as err:
        return _fail(f"--output {output}: cannot write: {err.strerror or err}")
    c = doc["counts"]
    print(f"wrote {output}: {len(doc['candidates'])} candidates ({c['feasible']} feasible), "
          f"schema {doc['schema_version']}")
    return EXIT_OK


def cmd_import(args: argparse.Namespace) -> int:
    """A recommendation.json written by spica export back into ledger.parquet (+ config.json)."""
    import json


    try:
        doc = json.loads(Path(args.input).read_text())
    except (OSError, ValueError) as err:
        return _fail(f"--input {args.input}: cannot read JSON: {err}")
    if not isinstance(doc, dict):
        return _fail(f"--input {args.input}: not a SweepResult object")
    try:
        ledger = sweep_result_to_ledger(doc)
    except (ValueError, KeyError, TypeError) as err:
        return _fail(f"--input {args.input}: {err}")
    out = Path(args.output_dir)
    config = (doc.get("provenance") or {}).get("config")
    try:
        atomic_write_parquet(out / "ledger.parquet", ledger)
        if config is not None:
            atomic_write_text(out / "config.json", json.dumps(config, sort_keys=True, indent=1) + "\n")
    except OSError as err:
        return _fail(f"--output-dir {out}: cannot write: {err.strerror or err}")
    print(f"wrote {out / 'ledger.parquet'} ({len(ledger)} trials)")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:

    parser = argparse.ArgumentParser(prog="spica", description=DESCRIPTION)
    parser.add_argument("--debug", action="store_true", default=False,
                        help="print the traceback of an internal error (exit 3) to stderr")
    # --debug is accepted after the command too; SUPPRESS keeps the subparser from resetting it
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="print the traceback of an internal error (exit 3) to stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    validate = sub.add_parser(
        "validate", parents=[common], help="[EXPERIMENTAL] validate a sweep config and summarise it",
        description="[EXPERIMENTAL] Validate a sweep config and print a short summary.",
    )
    validate.add_argument("--config", required=True, help="path to the sweep YAML")
    validate.set_defaults(func=cmd_validate)
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
    export = sub.add_parser(
        "export", parents=[common], help="[EXPERIMENTAL] write a sweep's ledger as an AI Simulate SweepResult (recommendation.json)",
        description="[EXPERIMENTAL] Export <run-dir>/ledger.parquet as a SweepResult 1.1 JSON envelope.",
    )
    export.add_argument("--config", required=True, help="the sweep YAML the run used")
    export.add_argument("--run-dir", required=True, help="the sweep's --output-dir")
    export.add_argument("--output", help="where to write (default <run-dir>/recommendation.json)")
    export.set_defaults(func=cmd_export)
    imp = sub.add_parser(
        "import", parents=[common], help="[EXPERIMENTAL] read a recommendation.json written by `spica export` back into a ledger",
        description="[EXPERIMENTAL] Restore ledger.parquet (and config.json) from a SweepResult we wrote.",
    )
    imp.add_argument("--input", required=True, help="recommendation.json")
    imp.add_argument("--output-dir", required=True, help="where ledger.parquet goes")
    imp.set_defaults(func=cmd_import)
    return parser


def main(argv: Sequence[str] | None = None, *, evaluator: Any = None) -> int:
    """Run one command; returns its exit code. `evaluator` replaces the replay for `sweep`
    (tests drive the real CLI with a fault-injecting stand-in)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed usage / help
        return int(exc.code) if isinstance(exc.code, int) else EXIT_BAD_INPUT
    args.evaluator = evaluator
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except SpicaError as err:
        return _fail(str(err), err.exit_code)
    except Exception as err:  # a bug in any command: one line, the traceback only with --debug
        return internal_error(err, args.debug)


if __name__ == "__main__":
    sys.exit(main())
