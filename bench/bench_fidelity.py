"""Fidelity benchmark: the replay, the calibrated replay and AIC's own estimate against real GPU measurements.

Reads `systems/silicon_sample.csv` from the installed aiconfigurator-core, maps every row the evaluator can
express (spica_pipeline/fidelity/silicon.py; the rest are counted with a reason), replays each as its benchmark
client and as a sweep (bench/fidelity/rows.py), and reports TTFT and TPOT errors per split (calibration /
heldout, the rule in fidelity/silicon.py), overall and by model, backend, system, mode and load
(bench/fidelity/scores.py). What a maintainer runs (docs/fidelity.md has the full commands):

  replay:   DYN_LOG=warn .venv/bin/python bench/bench_fidelity.py [--split S] [--quick] [--workers N] --json OUT
  compact:  bench_fidelity.py --split S --from-json A.json,B.json --compact --json bench/results/fidelity_replays_S.json
  fit:      bench_fidelity.py --split calibration --from-json bench/results/fidelity_replays_calibration.json \\
                --fit-calibration PROFILE.json [--json OUT]
  score:    bench_fidelity.py --split calibration --from-json ... --calibration auto|none|PROFILE --json OUT
  held out: bench_fidelity.py --split heldout --from-json bench/results/fidelity_replays_heldout.json \\
                --calibration auto --json bench/results/fidelity_heldout.json   (once per profile, then
            bench/record_heldout_check.py records it in the package)

--from-json reads replays of earlier runs instead of replaying (several files: joined by row id, the first file
wins; REV:PATH reads a file as it was at a git revision). A fit uses calibration rows only: the first 480 of the
split in the bench's row order (scores.FIT_ROWS); with a profile, the calibration split's report adds its scores on
the other rows ("outside_fit"). With a profile each split's report also holds its decision fidelity (the
configuration picked on predicted numbers against silicon's best, fidelity/decisions.py) and the errors of
profiles fitted on k of a model's own measurements ("own", fidelity/own.py), each row's benchmark campaign read
from the silicon file.
"""

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("DYN_LOG", "warn")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from fidelity import decisions, files, rows, scores  # noqa: E402

from spica_pipeline.errors import ConfigError  # noqa: E402
from spica_pipeline.fidelity.measurement import CLIENT_LENGTH_SPREAD  # noqa: E402
from spica_pipeline.fidelity.profile import FIXED_LENGTHS, PHASES, load_profile, validate  # noqa: E402
from spica_pipeline.fidelity.records import client_lengths  # noqa: E402
from spica_pipeline.fidelity.transfer import CHOICE_LEVEL, describe, fit_profile  # noqa: E402

SILICON_CSV = "aiconfigurator_core/systems/silicon_sample.csv"


def _list(value: str | None) -> list[str] | None:
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


def run(args: argparse.Namespace, argv: list[str] | None = None) -> dict[str, Any]:
    command = "bench/bench_fidelity.py " + " ".join(sys.argv[1:] if argv is None else argv)
    silicon_rows, mapped = rows.load_cases()
    sources = {r.id: r.source for r in silicon_rows}
    cases = rows.select(mapped, split=args.split, models=_list(args.models), systems=_list(args.systems),
                        quick=args.quick, max_rows=args.max_rows, ids=_list(args.ids),
                        max_concurrency=args.max_concurrency, backends=_list(args.backends),
                        clients=_list(args.clients), modes=_list(args.modes))
    job = rows.RowJob(args.cache_dir, with_aic=not args.no_aic, fixed_lengths=args.fixed_lengths,
                      script_flags=args.script_flags)
    records: list[dict[str, Any]] = []
    started = time.perf_counter()
    profile: dict[str, Any] | None = None

    def split_report(name: str) -> dict[str, Any]:
        report = scores.split_report(name, mapped, records)
        if profile is not None and name != "all":
            in_split = [r for r in records if r["split"] == name and r.get("calibrated")]
            report["decisions"] = decisions.decisions(in_split, profile)
            report["own"] = decisions.own_errors(in_split, profile)
        return report

    def result(partial: bool) -> dict[str, Any]:
        splits = ["calibration", "heldout", "all"] if args.split == "all" else [args.split]
        return {
            "bench": "fidelity", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": command,
            "silicon_csv": SILICON_CSV, "aiconfigurator_core": files.version("aiconfigurator-core"),
            "ai_dynamo_runtime": files.version("ai-dynamo-runtime"),
            "client_lengths": "fixed" if args.fixed_lengths else "the row's benchmark client (silicon.benchmark_client)",
            "client_length_spread": None if args.fixed_lengths else CLIENT_LENGTH_SPREAD,
            "script_flags": args.script_flags, "replays_from": args.from_json,
            "calibration_profile": args.fit_calibration or args.calibration, "quick": bool(args.quick),
            "workers": args.workers, "partial": partial, "wall_seconds": round(time.perf_counter() - started, 1),
            "splits": {s: split_report(s) for s in splits},
            # a result read from stored replays is a report on them: the records stay in the replays file
            **({} if args.from_json else {"records": records}),
        }

    if args.from_json:  # the replays of earlier runs, in the selection's order, without any profile's values
        previous = files.records_by_id(args.from_json)
        records.extend({k: v for k, v in previous[c.row.id].items() if k not in ("calibrated", "band")}
                       for c in cases if c.row.id in previous)
        cases = []
    done: dict[int, dict[str, Any]] = {}  # selection index -> record, in whatever order rows finish
    for i, rec in rows.replay_rows(cases, job, args.workers):
        case = cases[i]
        done[i] = rec
        records[:] = [done[k] for k in sorted(done)]
        ours = rec.get("ours") or {}
        print(f"[{len(done)}/{len(cases)}] {case.row.id} {rec['status']} c={case.row.concurrency} "
              f"ttft {ours.get('ttft') or float('nan'):.1f}/{case.row.ttft_ms:.1f} "
              f"tpot {ours.get('tpot') or float('nan'):.2f}/{case.row.tpot_ms:.2f} ms ({rec['row_seconds']:.1f}s)",
              flush=True)
        if args.json and len(done) % 10 == 0 and len(done) < len(cases):  # a killed run keeps what it measured
            files.write_json(args.json, result(partial=True))
    if args.compact:
        return {"compact": [files.compact(r, _source_of(r["id"], args.from_json)) for r in records]}
    decisions.attach_campaigns(records, sources)
    if args.fit_calibration:
        fit_rows = scores.fit_records(records)
        profile = fit_profile(fit_rows, fitted=time.strftime("%Y-%m-%d", time.gmtime()), source=command)
        profile["provenance"] = provenance(fit_rows, args)
        validate(profile)
        files.write_json(args.fit_calibration, profile)
        print(f"wrote calibration profile {args.fit_calibration} ({len(profile['rows_used'])} rows, "
              f"{len((profile.get(FIXED_LENGTHS) or {}).get('rows_used', ()))} with fixed lengths)")
        print_choices(profile)
    elif args.calibration != "none":
        profile, _ = load_profile(args.calibration)
    if profile is not None:
        scores.apply_profile(records, profile)
    final = result(partial=False)
    if profile is not None:
        final["calibration"] = {"fitted": profile["fitted"], "rows_used": len(profile["rows_used"]),
                                "format": profile["format"], "method": profile.get("method_name"),
                                "profile": args.fit_calibration or args.calibration, "in_sample_split": "calibration"}
        if "calibration" in final["splits"]:
            cal = [r for r in records if r["split"] == "calibration"]
            final["splits"]["calibration"]["outside_fit"] = scores.outside_fit(cal, profile)
    return final


def print_choices(profile: dict[str, Any]) -> None:
    """Each entry's chosen correction and its leave-one-architecture-out errors."""
    for section in ("slices", "backend"):
        for key, e in profile[section].items():
            t = e["transfer"]
            print(f"  {key:26s} {e['correction']:16s} factor {e['factor']:.3f}"
                  f"{' + %.2f ms' % e['overhead_ms'] if 'overhead_ms' in e else ''}: left out by architecture "
                  f"{100 * (t['mdape'] or 0):.0f} / {100 * (t['p90'] or 0):.0f} % on {t['rows']} rows of "
                  f"{t['architectures']} architecture(s)")


_sources: dict[str, set[str]] = {}


def _source_of(row_id: str, paths: str | None) -> int:
    """The index in --from-json of the first file holding the row (what --compact records as 'from')."""
    for i, name in enumerate((paths or "").split(",")):
        if name not in _sources:
            _sources[name] = set(files.records_by_id(name))
        if row_id in _sources[name]:
            return i
    return -1


def print_decisions(rep: dict[str, Any]) -> None:
    d, own = rep.get("decisions"), rep.get("own")
    if d:
        print(f"   decisions ({d['questions_asked']} questions; {d['rule']}):")
        for name, v in d["by_prediction"].items():
            if v["questions"]:
                print(f"     {name:20s} within 5 % {100 * v['within_5pct']:3.0f} %, SLA broken "
                      f"{100 * v['sla_broken']:3.0f} %, no pick {100 * v['no_pick']:3.0f} % ({v['questions']} questions)")
        for name, v in (d.get("same_questions") or {}).items():
            if v["questions"]:
                print(f"     within one campaign, {name:20s} within 5 % {100 * v['within_5pct']:3.0f} %, SLA broken "
                      f"{100 * v['sla_broken']:3.0f} % ({v['questions']} questions)")
    if own:
        for k, e in own.items():
            if isinstance(e, dict):
                print(f"   own {k:>2s}: " + " | ".join(
                    f"{p.upper()} {scores._fmt(e[p])} band {100 * (e[p]['band_coverage'] or 0):.0f} % "
                    f"({e[p]['campaigns']} campaigns)" for p in PHASES))


def provenance(fit_rows: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """What a fitted profile rests on, for people reading the file."""
    fixed = sorted({r["model"] for r in fit_rows if client_lengths(r) == "fixed"})
    return {
        "split": "calibration", "models": sorted({r["model"] for r in fit_rows}),
        "rows": f"the first {scores.FIT_ROWS} calibration rows in the bench's row order (crc32 of the row id) with "
                "both replays; the others score the profile",
        "method": describe("client", CHOICE_LEVEL),
        "fixed_lengths": f"the same choice on the rows replayed with fixed lengths ({', '.join(fixed)})"
                         if fixed else None,
        "own_bands": "own.own_bands on the fit rows' benchmark campaigns (the silicon file's source column)",
        "replays": args.from_json, "results": args.json, "silicon_csv": SILICON_CSV,
        "aiconfigurator_core": files.version("aiconfigurator-core"),
        "ai_dynamo_runtime": files.version("ai-dynamo-runtime"),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", choices=("calibration", "heldout", "all"), default="all")
    ap.add_argument("--models", help="comma-separated silicon or AIC model names")
    ap.add_argument("--systems", help="comma-separated systems, e.g. h200_sxm,b200_sxm")
    ap.add_argument("--ids", help="comma-separated silicon row ids (reproduce single rows)")
    ap.add_argument("--max-rows", type=int, default=None, help="the first N rows in the bench's row order")
    ap.add_argument("--max-concurrency", type=int, default=None, help="leave out rows above this concurrency")
    ap.add_argument("--backends", help="comma-separated backends (vllm, sglang), applied after --max-rows")
    ap.add_argument("--clients", help="comma-separated benchmark clients (inferencemax, aic: "
                                      "silicon.benchmark_client), applied after --max-rows")
    ap.add_argument("--modes", help="comma-separated modes (agg, disagg), applied after --max-rows")
    ap.add_argument("--quick", action="store_true", help="one row per (model, backend, system, mode), at most 24 "
                                                         "rows at concurrency <= 256: a few minutes on 2 cores")
    ap.add_argument("--fixed-lengths", action="store_true",
                    help="replay every row's benchmark client with exactly its ISL and OSL")
    ap.add_argument("--script-flags", nargs="?", const=rows.SCRIPT_FLAGS,
                    choices=(rows.SCRIPT_FLAGS, rows.WITH_MEMORY_FRACTION),
                    help="replay each InferenceMAX SGLang row with its script's engine flags (silicon.script_flags); "
                         f"'{rows.WITH_MEMORY_FRACTION}': also the script's memory fraction as the replay's")
    ap.add_argument("--no-aic", action="store_true", help="skip AIC's own estimate")
    ap.add_argument("--workers", type=int, default=1, help="replay rows on N spawned processes")
    ap.add_argument("--cache-dir", default=None, help="timing/KV cache (default $SPICA_CACHE_DIR)")
    ap.add_argument("--from-json", metavar="PATH[,PATH]", help="stored replays instead of replaying (PATH or REV:PATH)")
    ap.add_argument("--compact", action="store_true", help="with --from-json: write the compact replays file")
    ap.add_argument("--calibration", default="auto", help="the profile to apply: auto, none or a path")
    ap.add_argument("--fit-calibration", metavar="PATH", help="fit a profile on the calibration rows and write it")
    ap.add_argument("--json", "--out", dest="json", help="write the result JSON here (--out: run_all.py's name)")
    args = ap.parse_args(argv)
    if args.compact and not (args.from_json and args.json):
        ap.error("--compact needs --from-json and --json")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        result = run(args, argv)
    except (OSError, ValueError, ConfigError) as exc:  # a missing or unreadable file, a held-out row in a fit
        print(f"bench_fidelity: {exc}", file=sys.stderr)
        return 2
    if args.compact:
        files.write_replays(args.json, result["compact"], (args.from_json or "").split(","),
                            "bench/bench_fidelity.py " + " ".join(sys.argv[1:] if argv is None else argv), args.split)
        print(f"wrote {args.json} ({len(result['compact'])} rows)")
        return 0
    if args.json:
        files.write_json(args.json, result)
    for name, rep in result["splits"].items():
        scores.print_report(name, rep)
        print_decisions(rep)
    if args.json:
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
