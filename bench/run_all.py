"""Run every benchmark, one after the other, and write bench/results/<name>.json + SUMMARY.md.

Each benchmark runs as its own subprocess (spawned worker pools need a fresh `__main__`). The ones
that write their own JSON get `--out bench/results/<name>[_quick].json`; for the others the JSON is
their captured output (every stdout line that parses as JSON is kept as a record). SUMMARY.md
quotes the headline numbers, with the date and the machine (nproc, CPU model, RAM, load average).
The machine is 2 shared cores: each benchmark compares its variants side by side in one run, so
read ratios, not absolute seconds.

usage:
  .venv/bin/python bench/run_all.py [--quick] [--only sample_efficiency,sweep,...] [--summary-only]
--quick: reduced versions (a few minutes each); results go to <name>_quick.json.
--summary-only: rewrite SUMMARY.md from the JSON already in bench/results/.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
PY = sys.executable

# name -> (script, full args, quick args, writes its own JSON via --out, timeout seconds)
BENCHES: dict[str, tuple[str, list[str], list[str], bool, int]] = {
    "sample_efficiency": ("bench_sample_efficiency.py", [], ["--quick"], True, 3 * 3600),
    "sweep": ("bench_sweep.py", [], ["--quick"], True, 3600),
    "peer_aic": ("bench_peer_aic.py", [], ["--quick"], True, 3600),
    "evaluator": ("bench_evaluator.py", [], ["--requests", "200", "--repeats", "2", "--candidates", "4"], False, 1800),
    "enumeration": ("bench_enumeration.py", [], ["--repeats", "2"], False, 1800),
    "load_predictor": ("bench_load_predictor.py", [], [], False, 1800),
    "vizier": ("bench_vizier.py", [], ["--algos", "QUASI_RANDOM_SEARCH,DEFAULT", "--ns", "0,8"], False, 1800),
    "dagster": ("bench_dagster.py", [], [], False, 1800),
    "executors": ("bench_executors.py", [], ["--quick"], True, 1800),
    "time_to_quality": ("bench_time_to_quality.py", [], ["--quick"], True, 4 * 3600),
    "fidelity": ("bench_fidelity.py", ["--split", "all"], ["--quick"], True, 3 * 3600),
    "calibration_cost": ("bench_calibration_cost.py", [], [], True, 1800),
}


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"nproc": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}
    try:
        info["nproc"] = int(subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip())
    except (OSError, ValueError):
        pass
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


def result_path(name: str, quick: bool) -> Path:
    return RESULTS / (f"{name}_quick.json" if quick else f"{name}.json")


def run_one(name: str, quick: bool, host: dict[str, Any]) -> dict[str, Any]:
    script, full, reduced, own_json, timeout = BENCHES[name]
    out = result_path(name, quick)
    cmd = [PY, str(ROOT / "bench" / script), *(reduced if quick else full)]
    if own_json:
        cmd += ["--out", str(out)]
    env = {**os.environ, "DYN_LOG": "warn", "PYTHONUNBUFFERED": "1"}
    started = time.perf_counter()
    print(f"== {name}: {' '.join(Path(c).name if i < 2 else c for i, c in enumerate(cmd))}", flush=True)
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        code, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        code = "timeout"
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        stderr = f"timed out after {timeout}s"
    seconds = round(time.perf_counter() - started, 1)
    status = {"benchmark": name, "command": " ".join(cmd[1:]).replace(str(ROOT) + "/", ""),
              "returncode": code, "seconds": seconds, "quick": quick,
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": host}
    if own_json and code == 0 and out.exists():
        data = json.loads(out.read_text())
        data["run_all"] = status
        out.write_text(json.dumps(data, indent=2, default=str) + "\n")
    else:
        records = []
        for line in stdout.splitlines():
            line = line.strip()
            if line.startswith("{"):
                try:
                    records.append(json.loads(line))
                except ValueError:
                    pass
        status.update(records=records, stdout_tail=stdout.splitlines()[-40:],
                      stderr_tail=[l for l in stderr.splitlines() if "Warning" not in l][-10:])
        out.write_text(json.dumps(status, indent=2, default=str) + "\n")
    print(f"   {name}: exit {code} in {seconds}s -> {out.relative_to(ROOT)}", flush=True)
    return status


# ---------------------------------------------------------------------------------------------
# SUMMARY.md
# ---------------------------------------------------------------------------------------------

def _load(name: str) -> tuple[dict[str, Any] | None, str | None]:
    for quick in (False, True):
        path = result_path(name, quick)
        if path.exists():
            return json.loads(path.read_text()), path.name
    return None, None


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


def summary_sample_efficiency(data: dict[str, Any]) -> list[str]:
    lines = []
    for name, space in data.get("spaces", {}).items():
        truth = space["truth"]
        extra = ""
        if "points_within_99pct" in truth:
            extra = (f" {truth['points_within_95pct']}/{truth['points_within_99pct']}/{truth['points_within_100pct']} "
                     f"points are within 95/99/100% of it (uniform random without replacement needs "
                     f"{truth['uniform_random_expected_evals_to_100pct']} evaluations on average to hit the optimum).")
        elif "front_size" in truth:
            extra = f" The exhaustive front has {truth['front_size']} points."
        lines += [f"**{name}** (`{space['config']}`, goal {space['goal']}): {truth['points']} points, exhaustive "
                  f"optimum {_fmt(truth['optimum'])} ({truth['measure']}); budget {space['budget']} evaluations "
                  f"({space['max_rounds']} rounds x {space['per_round']}).{extra}", "",
                  "| algorithm | seeds | evals to 95% (median, reached) | 99% | 100% | final / optimum | "
                  "duplicate rate | optimizer share |", "|---|---|---|---|---|---|---|---|"]
        for algo, row in space["summary"].items():
            cells = [f"{_fmt(row[f'evals_to_{p}pct_median'])} ({row[f'evals_to_{p}pct_reached']})" for p in (95, 99, 100)]
            lines.append(f"| {algo} | {row['seeds']} | {' | '.join(cells)} | {_fmt(row['final_ratio_median'])} | "
                         f"{_fmt(row['duplicate_rate_mean'])} | {_fmt(row['optimizer_share_mean'])} |")
        lines.append("")
    lines.append("A run that never reached a level counts as budget + 1 in the median; 'reached' is seeds that got "
                 "there. Optimizer share = suggest seconds / (suggest + replay seconds of the distinct evaluations).")
    if not data.get("complete", True):
        lines.append("*Partial: the process was stopped before every space, algorithm and seed had run; the seeds "
                     "column says what each median covers.*")
    return lines


def summary_sweep(data: dict[str, Any]) -> list[str]:
    lines = [f"`{data['config']}`, {data['max_rounds']} rounds x {data['per_round']} per branch, "
             f"{data['parallel_evals']} replay workers.", "",
             "| algorithm | trials | distinct evals | duplicate rate | optimizer s | replay s | wall s | "
             "evals/min | best |", "|---|---|---|---|---|---|---|---|---|"]
    for r in data["runs"]:
        lines.append(f"| {r['algorithm']} | {r['trials']} | {r['distinct_evaluations']} | {_fmt(r['duplicate_rate'])} | "
                     f"{_fmt(r['optimizer_seconds'])} | {_fmt(r['replay_seconds'])} | {_fmt(r['wall_seconds'])} | "
                     f"{_fmt(r['evaluations_per_minute'])} | {_fmt(r['best_score'])} |")
    if data.get("ratios"):
        lines += ["", "Ratios: " + ", ".join(f"{k} = {_fmt(v)}" for k, v in data["ratios"].items())]
    return lines


def summary_peer(data: dict[str, Any]) -> list[str]:
    if data.get("status") != "ok":
        return [f"Not measured: {data.get('reason')}"]
    ours = (f"policy thorough: every point of our space, {data['our_trials']} trials"
            if data.get("our_policy") == "thorough" else
            f"{data['our_algorithm']}, {data['our_max_rounds']} rounds/branch, {data['our_trials']} trials")
    lines = [f"AI Configurator {data['aic_version']} (`{data['aic_command']}`, {data['aic_seconds']} s) vs our sweep "
             f"({ours}, {data['our_sweep_seconds']} s); metric: {data['metric']}.", "",
             "| pick | replayed goodput/GPU | AIC's own tokens/s/GPU estimate | status |", "|---|---|---|---|"]
    for p in data["aic_picks"]:
        lines.append(f"| AIC {p['mode']} top{p['rank']} {json.dumps(p['roles'])} | {_fmt(p['replayed_goodput_per_gpu'])} "
                     f"| {_fmt(p['aic_tokens_per_s_per_gpu'])} | {p['status']} |")
    best = data.get("ours_best") or {}
    lines.append(f"| ours {json.dumps(best.get('config'))} | {_fmt(best.get('goodput_per_gpu'))} | - | feasible |")
    lines += ["", f"**Ratio ours / AIC best (replayed goodput per GPU): {_fmt(data.get('ratio_ours_over_aic'))}**"]
    return lines


def summary_fidelity(data: dict[str, Any]) -> list[str]:
    def cell(stats: dict[str, Any] | None) -> str:
        if not stats or stats.get("mdape") is None:
            return "-"
        return f"{100 * stats['mdape']:.0f}% / {100 * stats['p90']:.0f}% / {100 * stats['bias']:+.0f}%"

    lines = ["MdAPE / P90 / bias against silicon_sample.csv (docs/fidelity.md).", "",
             "| split | evaluated / expressible | TTFT ours | TTFT calibrated | TTFT AIC | TPOT ours | TPOT calibrated "
             "| TPOT AIC |", "|---|---|---|---|---|---|---|---|"]
    for name, rep in data["splits"].items():
        lines.append(f"| {name} | {rep['evaluated']} / {rep['expressible']} | " + " | ".join(
            cell((rep.get(side) or {}).get(m)) for m in ("ttft", "tpot") for side in ("ours", "calibrated", "aic"))
            + " |")
    return lines


def summary_executors(data: dict[str, Any]) -> list[str]:
    lines = [f"`{data['command']}`; {data['machine']['nproc']} cores, load average "
             f"{' '.join(data['machine'].get('loadavg_at_start', []))} at start.", "",
             "| backend | workers | overhead ms/candidate | candidates/s (CPU-bound) |", "|---|---|---|---|"]
    for name in ("local", "ray"):
        for row in data[name]:
            lines.append(f"| {name} | {row['workers']} | {_fmt(row['overhead_ms_per_candidate'])} | "
                         f"{_fmt(row['candidates_per_s'])} |")
    lines += ["", f"Simulated cluster ({data['cluster']['nodes']} nodes x 1 CPU on 127.0.0.1):", "",
              "| workers | nodes used | candidates/s | scaling efficiency |", "|---|---|---|---|"]
    if data["cluster"].get("error"):
        lines.append(f"Not measured: {data['cluster']['error']}.")
    for row in data["cluster"]["rows"]:
        lines.append(f"| {row['workers']} | {row['nodes_used']} | {_fmt(row['candidates_per_s'])} | "
                     f"{_fmt(row['scaling_efficiency'])} |")
    return lines


def summary_captured(data: dict[str, Any]) -> list[str]:
    lines = [f"`{data['command']}`: exit {data['returncode']} in {data['seconds']} s."]
    tail = [l for l in data.get("stdout_tail", []) if l.strip()][-12:]
    if tail:
        lines += ["", "```", *tail, "```"]
    return lines


def write_summary(host: dict[str, Any] | None = None) -> Path:
    host = host or machine()
    lines = ["# Benchmark summary", "",
             f"Written {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `bench/run_all.py`. Machine: "
             f"nproc {host.get('nproc')}, {host.get('cpu_model', 'unknown CPU')}, {host.get('ram_gib', '?')} GiB RAM, "
             f"load average {' '.join(host.get('loadavg_at_start', []))} (the cores are shared with other work: "
             "compare the ratios within one benchmark, not absolute seconds across runs).", ""]
    sections = [("sample_efficiency", "Sample efficiency against the exhaustive truth", summary_sample_efficiency),
                ("sweep", "Quickstart sweep: DEFAULT vs QUASI_RANDOM_SEARCH", summary_sweep),
                ("peer_aic", "Peer comparison: AI Configurator default search, replayed", summary_peer),
                ("executors", "Executors: local pool vs Ray", summary_executors),
                ("fidelity", "Fidelity against real GPU measurements", summary_fidelity)]
    sections += [(n, f"{n} (captured output)", summary_captured) for n in BENCHES if n not in
                 ("sample_efficiency", "sweep", "peer_aic", "executors", "fidelity")]
    for name, title, render in sections:
        data, file = _load(name)
        lines += [f"## {title}", ""]
        if data is None:
            lines += ["Not run yet.", ""]
            continue
        sources = [(data, file)]
        if name == "sample_efficiency":  # one space per file when spaces ran as separate processes
            sources += [(json.loads(p.read_text()), p.name) for p in sorted(RESULTS.glob("sample_efficiency_*.json"))
                        if p.name != f"{name}_quick.json" and p.name != file]
        for data, file in sources:
            when = data.get("date") or (data.get("run_all") or {}).get("date")
            lines += [f"Source: `bench/results/{file}` ({'quick' if data.get('quick') else 'full'} run, {when}).", ""]
            try:
                lines += render(data)
            except (KeyError, TypeError) as exc:
                lines.append(f"(could not summarise {file}: {type(exc).__name__}: {exc})")
            lines.append("")
    path = RESULTS / "SUMMARY.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines).rstrip() + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default=None, help=f"comma-separated subset of {list(BENCHES)}")
    parser.add_argument("--summary-only", action="store_true")
    args = parser.parse_args(argv)
    host = machine()
    if not args.summary_only:
        names = [n.strip() for n in args.only.split(",")] if args.only else list(BENCHES)
        unknown = [n for n in names if n not in BENCHES]
        if unknown:
            parser.error(f"unknown benchmark(s) {unknown}; expected some of {list(BENCHES)}")
        RESULTS.mkdir(parents=True, exist_ok=True)
        failed = [n for n in names if run_one(n, args.quick, host)["returncode"] != 0]
        if failed:
            print(f"failed: {failed}")
    print(f"wrote {write_summary(host).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
