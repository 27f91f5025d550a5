"""`spica` command line: `spica validate|sweep --config F`, `spica export` / `spica import` (SweepResult).

Bad input ends with exit code 2 and exactly one line on stderr, never a traceback.
"""

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from spica_pipeline.errors import ConfigError, SpicaError

EXIT_OK = 0
EXIT_BAD_INPUT = 2

DESCRIPTION = (
    "[EXPERIMENTAL] spica: a replay-backed smart sweeper for NVIDIA Dynamo deployments. "
    "Searches engine, router and planner configurations and scores each candidate in Dynamo Replay."
)


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _fail(message: str) -> int:
    print(_one_line(message), file=sys.stderr)
    return EXIT_BAD_INPUT


def load_or_report(path: str) -> Any:
    """Load a config; returns the config, or an int exit code after printing one line."""
    from spica_pipeline.config import load_config

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
    """Why a list knob never reaches the study (spec §6.1 pruning), or None when it does."""
    from spica_pipeline.config import presets

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
        f"per_round {sweep.per_round}, parallel_evals {sweep.parallel_evals}, seed {sweep.seed}"
    )
    return lines


def cmd_validate(args: argparse.Namespace) -> int:
    """Validate a config file and print what it would sweep."""
    config = load_or_report(args.config)
    if isinstance(config, int):
        return config
    trace = config.workload.trace_path
    if trace is not None and not Path(trace).is_file():
        return _fail(f"invalid config {args.config}: workload.trace_path: no such file {trace!r} "
                     f"(relative paths resolve against the working directory {Path.cwd()})")
    try:
        lines = summarize(config)
    except Exception as err:  # a summary bug must not turn into a traceback either
        return _fail(f"could not summarise config {args.config}: {type(err).__name__}: {err}")
    from spica_pipeline.errors import PolicyFilterError
    from spica_pipeline.sweep import check_workload, filter_policies

    try:
        check_workload(config)
    except SpicaError as err:  # names the trace file and line
        return _fail(str(err))
    try:
        filtered = filter_policies(config)  # stage 2: a goal that leaves no usable policy is bad input
    except PolicyFilterError as err:
        return _fail(f"invalid config {args.config}: search_space.planner_scaling_policy: {err}")
    print(f"config {args.config} is valid")
    for line in lines:
        print(line)
    if filtered.dropped:
        print(filtered.summary())
    return EXIT_OK


EXIT_NOTHING_FEASIBLE = 1
EXIT_INTERRUPTED = 130


def _with_overrides(config: Any, args: argparse.Namespace) -> Any:
    """Apply --seed/--policy/--algorithm and validate again (e.g. thorough + a float range)."""
    from spica_pipeline.config import SmartSearchConfig, render_validation_error

    overrides = {k: v for k, v in (("seed", args.seed), ("policy", args.policy),
                                   ("algorithm", args.algorithm)) if v is not None}
    if not overrides:
        return config
    data = config.model_dump(mode="json", exclude_unset=True)
    data.setdefault("sweep", {}).update(overrides)
    try:
        return SmartSearchConfig.from_dict(data)
    except Exception as err:  # pydantic ValidationError
        return _fail(f"invalid config {args.config}: {render_validation_error(err) if hasattr(err, 'errors') else err}")


def cmd_sweep(args: argparse.Namespace) -> int:
    """Run a sweep; results and the resumable journal go under --output-dir."""
    from spica_pipeline.progress import ProgressPrinter
    from spica_pipeline.sweep import run_sweep

    config = load_or_report(args.config)
    if isinstance(config, int):
        return config
    config = _with_overrides(config, args)
    if isinstance(config, int):
        return config
    output_dir = Path(args.output_dir or Path("runs") / Path(args.config).stem)
    progress = ProgressPrinter()
    try:
        result = run_sweep(config, output_dir, progress=progress)
    except KeyboardInterrupt:
        progress.close()
        print(f"interrupted: finished trials are in {output_dir}/ledger.parquet; run the same command "
              "again to resume (journalled results are not recomputed)", file=sys.stderr)
        return EXIT_INTERRUPTED
    except SpicaError as err:
        progress.close()
        return _fail(str(err))
    except Exception as err:  # e.g. a worker pool that cannot start: one line, results kept
        progress.close()
        print(_one_line(f"sweep failed: {type(err).__name__}: {err}; finished trials are in "
                        f"{output_dir}/ledger.parquet and the journal resumes them"), file=sys.stderr)
        return EXIT_NOTHING_FEASIBLE
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
    from spica_pipeline.report.tables import describe_candidate

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

    from spica_pipeline.report import merge_for_config
    from spica_pipeline.report.sweep_result import ledger_to_sweep_result, to_json_text
    from spica_pipeline.storage import atomic_write_text
    from spica_pipeline.sweep import goal_summary

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
    atomic_write_text(output, to_json_text(doc))
    c = doc["counts"]
    print(f"wrote {output}: {len(doc['candidates'])} candidates ({c['feasible']} feasible), "
          f"schema {doc['schema_version']}")
    return EXIT_OK


def cmd_import(args: argparse.Namespace) -> int:
    """A recommendation.json written by spica export back into ledger.parquet (+ config.json)."""
    import json

    from spica_pipeline.report.sweep_result import sweep_result_to_ledger
    from spica_pipeline.storage import atomic_write_parquet, atomic_write_text

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
    atomic_write_parquet(out / "ledger.parquet", ledger)
    config = (doc.get("provenance") or {}).get("config")
    if config is not None:
        atomic_write_text(out / "config.json", json.dumps(config, sort_keys=True, indent=1) + "\n")
    print(f"wrote {out / 'ledger.parquet'} ({len(ledger)} trials)")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    from spica_pipeline.config.sweep import ALGORITHMS

    parser = argparse.ArgumentParser(prog="spica", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    validate = sub.add_parser(
        "validate", help="[EXPERIMENTAL] validate a sweep config and summarise it",
        description="[EXPERIMENTAL] Validate a sweep config and print a short summary.",
    )
    validate.add_argument("--config", required=True, help="path to the sweep YAML")
    validate.set_defaults(func=cmd_validate)
    sweep = sub.add_parser(
        "sweep", help="[EXPERIMENTAL] run a sweep and write ranked candidates or a Pareto front",
        description="[EXPERIMENTAL] Run a sweep: every candidate is evaluated in Dynamo Replay. "
                    "Rerunning the same command on the same --output-dir resumes an interrupted sweep.",
    )
    sweep.add_argument("--config", required=True, help="path to the sweep YAML")
    sweep.add_argument("--output-dir", help="where results and the journal go (default runs/<config name>)")
    sweep.add_argument("--seed", type=int, help="override sweep.seed")
    sweep.add_argument("--policy", choices=["rapid", "thorough"], help="override sweep.policy")
    sweep.add_argument("--algorithm", help=f"override sweep.algorithm ({', '.join(ALGORITHMS)})")
    sweep.add_argument("--show", type=int, default=10, help="candidates to print (default 10)")
    sweep.set_defaults(func=cmd_sweep)
    export = sub.add_parser(
        "export", help="[EXPERIMENTAL] write a sweep's ledger as an AI Simulate SweepResult (recommendation.json)",
        description="[EXPERIMENTAL] Export <run-dir>/ledger.parquet as a SweepResult 1.1 JSON envelope.",
    )
    export.add_argument("--config", required=True, help="the sweep YAML the run used")
    export.add_argument("--run-dir", required=True, help="the sweep's --output-dir")
    export.add_argument("--output", help="where to write (default <run-dir>/recommendation.json)")
    export.set_defaults(func=cmd_export)
    imp = sub.add_parser(
        "import", help="[EXPERIMENTAL] read a recommendation.json written by `spica export` back into a ledger",
        description="[EXPERIMENTAL] Restore ledger.parquet (and config.json) from a SweepResult we wrote.",
    )
    imp.add_argument("--input", required=True, help="recommendation.json")
    imp.add_argument("--output-dir", required=True, help="where ledger.parquet goes")
    imp.set_defaults(func=cmd_import)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed usage / help
        return int(exc.code) if isinstance(exc.code, int) else EXIT_BAD_INPUT
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
