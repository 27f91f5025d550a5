"""`spica calibrate`: fit a profile from your own measurements of the swept model, or plan which picks to measure.

    spica calibrate MEASUREMENTS... --output PROFILE.json [--deployment FILE]
    spica calibrate --plan RUN_DIR [-n 3]

MEASUREMENTS are files fidelity/readers reads (a CSV of measured points; AIPerf's
profile_export_aiperf.json, `vllm bench serve --save-result` JSON or SGLang bench_serving JSONL with the
served deployment given by --deployment), or deploy/<rank>/ folders of a sweep: every AIPerf export that
folder's bench.sh saved under it, the deployment being the folder's simulation_record.yaml. Every measured
point is replayed and the own profile fitted (spica_pipeline/calibrate.py); the profile is written to
--output. A sweep uses it with `evaluation.calibration: PROFILE.json`, or with `auto` when it lies in the
profile directory (fidelity/profile.profile_dir). Bad input: one line naming the file and line or field, exit 2.
"""

import argparse
import math
import shlex
from pathlib import Path
from typing import Any

from spica_pipeline.calibrate import BENCH_SCRIPT, RECORD, calibrate, plan
from spica_pipeline.cli.common import EXIT_OK, fail
from spica_pipeline.errors import ConfigError
from spica_pipeline.fidelity.profile import PHASES, PROFILE_DIR_ENV, deployment_text, profile_dir
from spica_pipeline.fidelity.readers import read_measurements
from spica_pipeline.storage import write_json_result

EXPORT_NAME = "profile_export_aiperf.json"  # what AIPerf writes into its artifact directory


def _pct(v: Any) -> str:
    return "–" if not isinstance(v, (int, float)) else f"{100.0 * v:.1f} %"


def measurement_files(paths: list[str], deployment: str | None) -> list[tuple[list[Path], Path | None]]:
    """(paths, deployment) groups to read: a sweep's deploy/<rank>/ folder (it holds simulation_record.yaml) is
    every AIPerf export under it with that record as the deployment; other files and folders keep --deployment.
    ConfigError naming a missing path or a deploy folder without exports."""
    groups: list[tuple[list[Path], Path | None]] = []
    loose: list[Path] = []
    for given in paths:
        path = Path(given).expanduser()
        if path.is_dir() and (path / RECORD).is_file():
            exports = sorted(path.rglob(EXPORT_NAME))
            if not exports:
                raise ConfigError(f"{path}: no {EXPORT_NAME} under it; run its bench.sh against the deployed pick "
                                  "first")
            groups.append((exports, path / RECORD))
        elif path.exists():
            loose.append(path)
        else:
            raise ConfigError(f"{path}: no such file or directory")
    if loose:
        groups.insert(0, (loose, Path(deployment).expanduser() if deployment else None))
    return groups


def read_all(paths: list[str], deployment: str | None) -> list[Any]:
    """Every measurement of the given paths (fidelity/readers.read_measurements per group)."""
    groups = measurement_files(paths, deployment)
    out: list[Any] = []
    for files, record in groups:
        out += read_measurements(files, deployment=record)
    return out


def _row_line(record: dict[str, Any]) -> str:
    if "reason" in record:
        return f"  {record['where']}: left out: {record['reason']}"
    parts = [f"  {record['id']}: c={record['concurrency']} {record['isl']}/{record['osl']}"]
    for phase in PHASES:
        measured, replayed = record["silicon"][phase], record["ours"][phase]
        parts.append(f"{phase.upper()} measured {measured:.4g} ms, replayed {replayed:.4g}")
    return ", ".join(parts)


def summary_lines(profile: dict[str, Any], output: Path) -> list[str]:
    """What the fitted profile says: the deployment, rows, own factors, leave-one-out errors, bands, how to use it."""
    own = profile["own"]
    key = f"{own['system']}/{own['backend']}"
    what = deployment_text(own["model"], own["system"], own["precision"], own["backend"])
    lines = [f"wrote {output}: own profile of {what} "
             f"from {own['rows']} measured point{'s' if own['rows'] != 1 else ''}"]
    for phase in PHASES:
        entry = profile["slices"][f"{key}/{phase}"]
        lo, hi = entry["band"]
        loo = own["leave_one_out"].get(phase) or {}
        slope = entry.get("own_slope") or 0.0
        lines.append(f"  {phase.upper()}: x{own['factors'][phase]:.3f} on the packaged correction"
                     + (f" ({slope:+.1%} per doubling of load)" if slope else "")
                     + f"; leave-one-out error median {_pct(loo.get('mdape'))}, worst {_pct(loo.get('max'))}; "
                     f"band P10-P90 x{math.exp(lo):.2f}-x{math.exp(hi):.2f}")
    here = profile_dir()
    lines.append(f"use it: `evaluation.calibration: {output}` in the sweep config, or put it in {here} "
                 f"(${PROFILE_DIR_ENV}) where `calibration: auto` finds it for this model, system and precision")
    return lines


def cmd_calibrate(args: argparse.Namespace) -> int:
    if args.plan:
        if args.measurements:
            return fail("spica calibrate: give measurements or --plan RUN_DIR, not both")
        return _cmd_plan(args)
    if not args.measurements:
        return fail("spica calibrate: give measurement files (or deploy/<rank>/ folders), or --plan RUN_DIR")
    if not args.output:
        return fail(f"spica calibrate: --output PROFILE.json is required (the profile directory `auto` reads is "
                    f"{profile_dir()})")
    output = Path(args.output).expanduser()
    if output.is_dir():
        return fail(f"--output {output}: is a directory; name the profile file (e.g. {output}/my-model.json)")
    measurements = read_all(args.measurements, args.deployment)
    given = [*args.measurements, *(["--deployment", args.deployment] if args.deployment else []),
             "--output", str(output)]
    command = "spica calibrate " + " ".join(shlex.quote(a) for a in given)
    print(f"replaying {len(measurements)} measured point{'s' if len(measurements) != 1 else ''}", flush=True)
    result = calibrate(measurements, evaluator=args.evaluator, source=command,
                       on_record=lambda r: print(_row_line(r), flush=True))
    try:
        write_json_result(output, result.profile)
    except OSError as exc:
        return fail(f"--output {output}: cannot write it: {exc.strerror or exc}")
    for line in summary_lines(result.profile, output):
        print(line)
    if result.skipped:
        print(f"{len(result.skipped)} point{'s' if len(result.skipped) != 1 else ''} left out (above)")
    print(f"calibrated in {result.seconds:.1f} s")
    return EXIT_OK


def _cmd_plan(args: argparse.Namespace) -> int:
    run_dir = Path(args.plan).expanduser()
    result = plan(run_dir, args.n)
    goal = result.target or "the goal"
    print(f"measure first: {len(result.picks)} of the {result.considered} picks in {run_dir / 'deploy'} "
          f"(the ones whose {goal} bands decide the ranking)")
    for pick, why in result.picks:
        value = "" if pick.value is None else f", {goal} {pick.value:,.4g}"
        band = "" if pick.band is None else f" [P10-P90 {pick.band[0]:,.4g}-{pick.band[1]:,.4g}]"
        script = pick.folder / BENCH_SCRIPT
        print(f"  rank {pick.rank}: {pick.backend} {pick.shape}{value}{band}: {why}")
        print(f"    deploy: kubectl apply -f {shlex.quote(str(pick.folder / 'dgd.yaml'))}")
        print(f"    measure: bash {shlex.quote(str(script))}"
              + ("" if script.is_file() else "  (no bench.sh in this folder: rerun the sweep to write one)"))
    for note in result.notes:
        print(f"note: {note}")
    folders = " ".join(shlex.quote(str(p.folder)) for p, _ in result.picks)
    print(f"then: spica calibrate {folders} --output PROFILE.json, and sweep again with "
          "`evaluation.calibration: PROFILE.json`")
    return EXIT_OK


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    cal = sub.add_parser(
        "calibrate", parents=[common],
        help="[EXPERIMENTAL] fit a calibration profile from your own measurements, or plan which picks to measure",
        description="[EXPERIMENTAL] Replay every measured point of MEASUREMENTS and fit a calibration profile for "
                    "that model, system, backend and precision (its leave-one-out error and rows inside); or, with "
                    "--plan, list the picks of a finished sweep to measure first, with their bench commands.",
    )
    cal.add_argument("measurements", nargs="*", metavar="MEASUREMENTS",
                     help="measurement files (CSV, AIPerf profile_export_aiperf.json, vllm bench serve JSON, "
                          "SGLang bench_serving JSONL) or a sweep's deploy/<rank>/ folders")
    cal.add_argument("--output", "-o", metavar="PROFILE.json", help="where to write the profile")
    cal.add_argument("--deployment", metavar="FILE",
                     help="the served deployment of benchmark-client files: a dgd.yaml or simulation_record.yaml "
                          "spica sweep wrote, or a one-candidate sweep config")
    cal.add_argument("--plan", metavar="RUN_DIR", help="a finished sweep's output directory: which picks to measure")
    cal.add_argument("-n", type=int, default=3, help="with --plan: how many picks at most (default 3)")
    cal.set_defaults(func=cmd_calibrate)
