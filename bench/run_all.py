"""Run the benchmarks one after the other, each writing its result into bench/results/.

Each benchmark runs as its own subprocess (spawned worker pools need a fresh `__main__`) with
DYN_LOG=warn, from the repository root. The ones that write their own JSON get their result path;
for the others the JSON is their captured output (every stdout line that parses as JSON is kept as
a record, with the tail of stdout) plus the command, date and machine. bench/README.md says which
question each benchmark answers and which file holds its latest result. The machine is shared:
each benchmark compares its variants side by side in one run, so read ratios, not absolute seconds.

usage:
  .venv/bin/python bench/run_all.py [--quick] [--only NAME,...] [--list]
--quick: the reduced version of each benchmark that has one (minutes each; the others are skipped).
--list: print every benchmark's command and result file, run nothing.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path("bench") / "results"  # relative to ROOT, so the recorded commands are too
PY = sys.executable


@dataclass(frozen=True)
class Mode:
    args: tuple[str, ...]
    result: str  # file name under bench/results/
    out_flag: str | None = None  # the script's own output option; None: its stdout is captured


@dataclass(frozen=True)
class Bench:
    script: str
    full: Mode
    quick: Mode | None  # None: no reduced version (skipped by --quick)
    timeout_s: int


HOUR = 3600
VIZIER_SERIES = ("--after-first", "--algos", "DEFAULT", "--count", "8", "--ns", "8,16,32,64,100", "--objectives",
                 "1,2", "--reps", "3", "--rss-suggests", "50", "--rss-objectives", "1,2", "--cache", "none")
BENCHES: dict[str, Bench] = {
    "time_to_quality": Bench("bench_time_to_quality.py", Mode((), "time_to_quality.json", "--out"),
                             Mode(("--quick",), "time_to_quality_quick.json", "--out"), 2 * HOUR),
    "time_to_quality_heldout": Bench("bench_time_to_quality.py",
                                     Mode(("--first-seed", "600"), "time_to_quality_heldout.json", "--out"),
                                     None, 2 * HOUR),
    "time_to_quality_large": Bench("bench_time_to_quality.py",
                                   Mode(("--large", "--random-pieces", "4"), "time_to_quality_large.json", "--out"),
                                   None, 2 * HOUR),
    "sample_efficiency": Bench("bench_sample_efficiency.py", Mode((), "sample_efficiency.json", "--out"),
                               Mode(("--quick",), "sample_efficiency_quick.json", "--out"), 3 * HOUR),
    "sweep": Bench("bench_sweep.py", Mode((), "sweep.json", "--out"), Mode((), "sweep.json", "--out"), HOUR),
    "vizier": Bench("bench_vizier.py", Mode(VIZIER_SERIES, "vizier_after_first.json", "--json"),
                    Mode(("--algos", "QUASI_RANDOM_SEARCH,DEFAULT", "--ns", "0,8"), "vizier_quick.json"), HOUR),
    "executors": Bench("bench_executors.py", Mode((), "executors.json", "--out"),
                       Mode(("--quick",), "executors_quick.json", "--out"), HOUR),
    "evaluator": Bench("bench_evaluator.py", Mode((), "evaluator.json"),
                       Mode(("--requests", "200", "--repeats", "2", "--candidates", "4"), "evaluator_quick.json"),
                       HOUR),
    "enumeration": Bench("bench_enumeration.py", Mode((), "enumeration.json"),
                         Mode(("--repeats", "2"), "enumeration_quick.json"), HOUR),
    "coverage": Bench("bench_coverage.py", Mode((), "coverage.json", "--out"), Mode((), "coverage.json", "--out"),
                      HOUR),
    "load_predictor": Bench("bench_load_predictor.py", Mode((), "load_predictor.json"),
                            Mode((), "load_predictor.json"), HOUR),
    "replay_memory": Bench("bench_replay_memory.py", Mode((), "replay_memory.json", "--json"),
                           Mode(("--quick",), "replay_memory_quick.json", "--json"), HOUR),
    "dagster": Bench("bench_dagster.py", Mode(("--repeats", "3"), "dagster.json"), Mode((), "dagster_quick.json"),
                     HOUR),
    "peer_aic": Bench("bench_peer_aic.py", Mode((), "peer_aic.json", "--out"),
                      Mode(("--quick",), "peer_aic_quick.json", "--out"), HOUR),
    "fidelity": Bench("bench_fidelity.py", Mode(("--split", "all"), "fidelity_replays.json", "--json"),
                      Mode(("--split", "all", "--quick"), "fidelity_quick.json", "--json"), 4 * HOUR),
    "silicon_repeats": Bench("bench_silicon_repeats.py", Mode((), "silicon_repeats.json", "--json"),
                             Mode((), "silicon_repeats.json", "--json"), HOUR),
    "calibration_cost": Bench("bench_calibration_cost.py", Mode((), "calibration_cost.json", "--out"),
                              Mode((), "calibration_cost.json", "--out"), HOUR),
    "calibrate": Bench("bench_calibrate.py", Mode((), "calibrate.json", "--out"),
                       Mode(("--repeats", "1"), "calibrate_quick.json", "--out"), HOUR),
}


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"nproc": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                info["ram_gib"] = round(int(line.split()[1]) / 2**20, 1)
                break
        info["loadavg_at_start"] = Path("/proc/loadavg").read_text().split()[:3]
    except OSError:
        pass
    return info


def command(bench: Bench, mode: Mode) -> list[str]:
    cmd = [f"bench/{bench.script}", *mode.args]
    if mode.out_flag:
        cmd += [mode.out_flag, str(RESULTS / mode.result)]
    return cmd


def run_one(name: str, quick: bool, host: dict[str, Any]) -> dict[str, Any]:
    bench = BENCHES[name]
    mode = bench.quick if quick else bench.full
    assert mode is not None
    cmd = command(bench, mode)
    out = ROOT / RESULTS / mode.result
    env = {**os.environ, "DYN_LOG": "warn", "PYTHONUNBUFFERED": "1"}
    started = time.perf_counter()
    print(f"== {name}: {' '.join(cmd)}", flush=True)
    try:
        done = subprocess.run([PY, *cmd], cwd=ROOT, env=env, capture_output=True, text=True, timeout=bench.timeout_s)
        code: int | str = done.returncode
        stdout, stderr = done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        code = "timeout"
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        stderr = f"timed out after {bench.timeout_s}s"
    seconds = round(time.perf_counter() - started, 1)
    status: dict[str, Any] = {"benchmark": name, "command": " ".join(cmd), "returncode": code, "seconds": seconds,
              "quick": quick,
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": host}
    if mode.out_flag is None:  # the captured output is the result
        records = []
        for line in stdout.splitlines():
            if line.strip().startswith("{"):
                try:
                    records.append(json.loads(line))
                except ValueError:
                    pass
        status.update(records=records, stdout_tail=stdout.splitlines()[-40:],
                      stderr_tail=[line for line in stderr.splitlines() if "Warning" not in line][-10:])
        out.write_text(json.dumps(status, indent=2, default=str) + "\n")
    elif code != 0:
        print("\n".join(["   stderr:", *stderr.splitlines()[-10:]]), flush=True)
    print(f"   {name}: exit {code} in {seconds}s -> {RESULTS / mode.result}", flush=True)
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default=None, help=f"comma-separated subset of {list(BENCHES)}")
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.only.split(",")] if args.only else list(BENCHES)
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        print(f"--only: unknown benchmark(s) {', '.join(unknown)}; expected some of {', '.join(BENCHES)}",
              file=sys.stderr)
        return 2
    todo = [n for n in names if not args.quick or BENCHES[n].quick is not None]
    if args.list:
        for name in todo:
            bench = BENCHES[name]
            mode = bench.quick if args.quick else bench.full
            assert mode is not None
            captured = "" if mode.out_flag else f"  (stdout -> {RESULTS / mode.result})"
            print(f"{name:24s} {' '.join(command(bench, mode))}{captured}")
        return 0
    skipped = sorted(set(names) - set(todo))
    if skipped:
        print(f"no quick version, skipped: {', '.join(skipped)}")
    (ROOT / RESULTS).mkdir(parents=True, exist_ok=True)
    host = machine()
    failed = [n for n in todo if run_one(n, args.quick, host)["returncode"] != 0]
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
