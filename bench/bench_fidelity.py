"""Fidelity benchmark: our evaluator and AIC's own estimate against real GPU measurements.

Reads `systems/silicon_sample.csv` from the installed aiconfigurator-core, maps every row the
evaluator can express (`spica_pipeline.search.silicon`; the rest are counted with a reason),
replays each through `ReplayEvaluator` pinned to the row (1 model = the AIC checkpoint of the
row's precision, the row's system/backend/parallel shape/worker counts, round robin, closed loop at
the row's concurrency with its ISL/OSL, max_num_batched_tokens 8192) and compares mean TTFT and
mean TPOT with the measured ones. AIC's own estimate on the same rows and the same perf database:
agg = `backend.run_agg(batch = concurrency per attention-DP rank, ctx_tokens = 8192)`; disagg =
prefill `run_static(static_ctx, batch 1)` for TTFT and decode `run_static(static_gen, batch =
concurrency per decode rank)` for TPOT.

Errors are fractions: APE = |pred - silicon| / silicon; MdAPE = median APE, p90 = P90 of APE,
bias = median of (pred - silicon) / silicon (signed). Reported per split (calibration / heldout,
the binding rule in search/silicon.py), overall and by model, backend, system and mode.

usage:
  DYN_LOG=warn .venv/bin/python bench/bench_fidelity.py [--split calibration|heldout|all]
      [--models M1,M2] [--systems S1,S2] [--max-rows N] [--ids ID1,ID2] [--quick] [--json PATH]
      [--request-ratio 6] [--no-aic]
--quick: a stratified subset (one row per (model, backend, system, mode) stratum, lowest and
highest concurrency alternating, at most 24 rows, concurrency <= 256), a few minutes on 2 cores.
"""

import argparse
import csv
import json
import math
import os
import sys
import time
import zlib
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

os.environ.setdefault("DYN_LOG", "warn")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from spica_pipeline.search import silicon  # noqa: E402
from spica_pipeline.search.evaluation import EvalRequest  # noqa: E402

GOAL = {"target": "throughput", "sla": None, "pareto_objectives": None}
MNBT = 8192
QUICK_MAX_ROWS = 24
QUICK_MAX_CONCURRENCY = 256
GROUPS = ("model", "backend", "system", "mode")


def silicon_csv_path() -> Path:
    import aiconfigurator_core

    return Path(aiconfigurator_core.__file__).resolve().parent / "systems" / "silicon_sample.csv"


def load_cases() -> tuple[list[silicon.SiliconRow], list[silicon.SiliconCase | silicon.Inexpressible]]:
    from spica_pipeline.search.model_hw import _supported_databases, available_models, model_facts

    with open(silicon_csv_path(), newline="") as fh:
        rows = silicon.parse_rows(csv.DictReader(fh))
    models = available_models()
    dbs = _supported_databases()
    mapped = [silicon.map_row(r, models=models, databases=dbs, is_moe=lambda m: model_facts(m).is_moe)
              for r in rows]
    return rows, mapped


def _stable(key: str) -> int:
    return zlib.crc32(key.encode())


def quick_subset(cases: list[silicon.SiliconCase], limit: int = QUICK_MAX_ROWS) -> list[silicon.SiliconCase]:
    """One row per (model, backend, system, mode) stratum, deterministic, cheap concurrencies first."""
    strata: dict[tuple, list[silicon.SiliconCase]] = defaultdict(list)
    for c in cases:
        if c.row.concurrency <= QUICK_MAX_CONCURRENCY:
            strata[(c.row.model, c.row.backend, c.row.system, c.row.mode)].append(c)
    picked = []
    for i, key in enumerate(sorted(strata)):
        group = sorted(strata[key], key=lambda c: (c.row.concurrency, _stable(c.row.id)))
        picked.append(group[0] if i % 2 == 0 else group[len(group) // 2])
    picked.sort(key=lambda c: _stable(c.row.id))
    return picked[:limit]


# ---- AIC's own estimate ------------------------------------------------------------------------

_aic_models: dict[tuple, Any] = {}


def aic_estimate(case: silicon.SiliconCase, version: str) -> tuple[float, float]:
    """(TTFT ms, TPOT ms) from aiconfigurator-core's own agg/static estimators for the row."""
    from aiconfigurator_core.sdk.backends.factory import get_backend
    from aiconfigurator_core.sdk.config import RuntimeConfig
    from aiconfigurator_core.sdk.config_builders import build_model_config
    from aiconfigurator_core.sdk.models import get_model
    from aiconfigurator_core.sdk.perf_database import get_database

    from spica_pipeline.search.model_hw import QuietAIC

    r = case.row

    def model(shape: silicon.Shape):
        key = (case.aic_model, r.backend, shape.tp, shape.pp, shape.attention_dp, shape.moe_tp, shape.moe_ep)
        if key not in _aic_models:
            cfg = build_model_config(tp_size=shape.tp, pp_size=shape.pp, attention_dp_size=shape.attention_dp,
                                     moe_tp_size=shape.moe_tp, moe_ep_size=shape.moe_ep)
            _aic_models[key] = get_model(case.aic_model, cfg, r.backend)
        return _aic_models[key]

    with QuietAIC():
        db = get_database(r.system, r.backend, version)
        backend = get_backend(r.backend)
        if r.mode == "agg":
            shape = case.roles["agg"]
            bs = max(1, math.ceil(r.concurrency / (shape.workers * shape.attention_dp)))
            out = backend.run_agg(model(shape), db, RuntimeConfig(batch_size=bs, isl=r.isl, osl=r.osl),
                                  ctx_tokens=MNBT).get_summary_df()
            return float(out.loc[0, "ttft"]), float(out.loc[0, "tpot"])
        p, d = case.roles["prefill"], case.roles["decode"]
        ctx = backend.run_static(model(p), db, RuntimeConfig(batch_size=1, isl=r.isl, osl=r.osl),
                                 mode="static_ctx").get_summary_df()
        bs = max(1, math.ceil(r.concurrency / (d.workers * d.attention_dp)))
        gen = backend.run_static(model(d), db, RuntimeConfig(batch_size=bs, isl=r.isl, osl=r.osl),
                                 mode="static_gen").get_summary_df()
        return float(ctx.loc[0, "ttft"]), float(gen.loc[0, "tpot"])


# ---- one row -----------------------------------------------------------------------------------


def evaluate_case(evaluator, case: silicon.SiliconCase, version: str, request_ratio: float,
                  with_aic: bool) -> dict[str, Any]:
    r = case.row
    rec: dict[str, Any] = {
        "id": r.id, "line": r.line, "split": case.split, "model": r.model, "aic_model": case.aic_model,
        "precision": r.precision, "backend": r.backend, "silicon_backend_version": r.backend_version,
        "db_version": version, "system": r.system, "mode": r.mode, "isl": r.isl, "osl": r.osl,
        "concurrency": r.concurrency, "shape": {k: vars(v) for k, v in case.roles.items()},
        "silicon": {"ttft": r.ttft_ms, "tpot": r.tpot_ms},
    }
    started = time.perf_counter()
    out = evaluator.evaluate(EvalRequest(case.sample(version, max_num_batched_tokens=MNBT),
                                         case.workload(request_ratio), GOAL))
    rec["replay_seconds"] = round(time.perf_counter() - started, 3)
    rec["status"] = out.status
    if out.status == "feasible" and out.report:
        rec["ours"] = {"ttft": out.report.get("mean_ttft_ms"), "tpot": out.report.get("mean_tpot_ms")}
        rec["requests"] = out.report.get("completed_requests")
    else:
        rec["reason"] = out.reason
    if with_aic:
        try:
            ttft, tpot = aic_estimate(case, version)
            rec["aic"] = {"ttft": ttft, "tpot": tpot}
        except Exception as exc:  # AIC's own failure is data, not a bench crash
            rec["aic_reason"] = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
    return rec


# ---- statistics ----------------------------------------------------------------------------------


def _quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return math.nan
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def error_stats(pairs: list[tuple[float, float]]) -> dict[str, Any]:
    """{mdape, p90, bias, n} over (predicted, measured) pairs; fractions."""
    good = [(p, m) for p, m in pairs if p is not None and m and math.isfinite(p) and m > 0]
    if not good:
        return {"mdape": None, "p90": None, "bias": None, "n": 0}
    signed = [(p - m) / m for p, m in good]
    ape = [abs(x) for x in signed]
    return {"mdape": round(_quantile(ape, 0.5), 4), "p90": round(_quantile(ape, 0.9), 4),
            "bias": round(_quantile(signed, 0.5), 4), "n": len(good)}


def summarise(records: list[dict[str, Any]]) -> dict[str, Any]:
    """ours / aic error stats for TTFT and TPOT over records where both sides have numbers."""
    out: dict[str, Any] = {}
    for side in ("ours", "aic"):
        out[side] = {}
        for metric in ("ttft", "tpot"):
            pairs = [(r[side][metric], r["silicon"][metric]) for r in records
                     if isinstance(r.get(side), dict) and r[side].get(metric) is not None]
            out[side][metric] = error_stats(pairs)
    return out


def split_report(name: str, rows: list[silicon.SiliconRow], mapped: list, selected: list[silicon.SiliconCase],
                 records: list[dict[str, Any]]) -> dict[str, Any]:
    in_split = [m for m in mapped if name == "all" or m.row.split == name]
    reasons = Counter(silicon.reason_kind(m.reason) for m in in_split if isinstance(m, silicon.Inexpressible))
    recs = [r for r in records if name == "all" or r["split"] == name]
    evaluated = [r for r in recs if r.get("ours")]
    failures = Counter((r.get("reason") or r["status"])[:160] for r in recs if not r.get("ours"))
    report: dict[str, Any] = {
        "rows": len(in_split),
        "expressible": sum(isinstance(m, silicon.SiliconCase) for m in in_split),
        "selected": len(recs),
        "evaluated": len(evaluated),
        **summarise(evaluated),
        "inexpressible_reasons": dict(reasons.most_common()),
        "failures": dict(failures.most_common()),
        "by": {},
    }
    for g in GROUPS:
        buckets: dict[str, list] = defaultdict(list)
        for r in evaluated:
            buckets[str(r[g])].append(r)
        report["by"][g] = {k: {"evaluated": len(v), **summarise(v)} for k, v in sorted(buckets.items())}
    return report


def _fmt(stats: dict[str, Any]) -> str:
    if stats.get("mdape") is None:
        return "   n/a"
    return f"{100 * stats['mdape']:5.0f}% p90 {100 * stats['p90']:4.0f}% bias {100 * stats['bias']:+4.0f}%"


def print_report(name: str, rep: dict[str, Any]) -> None:
    print(f"== split {name}: rows {rep['rows']}, expressible {rep['expressible']}, selected {rep['selected']}, "
          f"evaluated {rep['evaluated']}")
    for metric in ("ttft", "tpot"):
        print(f"   {metric.upper():4s} ours {_fmt(rep['ours'][metric])} | aic {_fmt(rep['aic'][metric])}")
    for g in GROUPS:
        for k, v in rep["by"][g].items():
            print(f"   {g}={k} (n={v['evaluated']}): TTFT ours {_fmt(v['ours']['ttft'])} aic {_fmt(v['aic']['ttft'])}"
                  f" | TPOT ours {_fmt(v['ours']['tpot'])} aic {_fmt(v['aic']['tpot'])}")
    if rep["failures"]:
        print(f"   failures: {rep['failures']}")


# ---- main ----------------------------------------------------------------------------------------


def select(mapped: list, *, split: str, models: list[str] | None, systems: list[str] | None,
           quick: bool, max_rows: int | None, ids: list[str] | None = None) -> list[silicon.SiliconCase]:
    cases = [m for m in mapped if isinstance(m, silicon.SiliconCase)]
    if ids:
        cases = [c for c in cases if c.row.id in ids]
    if split != "all":
        cases = [c for c in cases if c.split == split]
    if models:
        cases = [c for c in cases if c.row.model in models or c.aic_model in models]
    if systems:
        cases = [c for c in cases if c.row.system in systems]
    if quick:
        cases = quick_subset(cases)
    else:
        cases.sort(key=lambda c: _stable(c.row.id))  # a --max-rows prefix is a random sample
    if max_rows is not None:
        cases = cases[:max_rows]
    return cases


def run(args: argparse.Namespace, argv: list[str] | None = None) -> dict[str, Any]:
    from spica_pipeline.resources.replay import ReplayEvaluator
    from spica_pipeline.search.model_hw import latest_backend_version

    rows, mapped = load_cases()
    models = [m.strip() for m in args.models.split(",")] if args.models else None
    systems = [s.strip() for s in args.systems.split(",")] if args.systems else None
    ids = [i.strip() for i in args.ids.split(",")] if args.ids else None
    cases = select(mapped, split=args.split, models=models, systems=systems, quick=args.quick,
                   max_rows=args.max_rows, ids=ids)
    evaluator = ReplayEvaluator(cache_dir=args.cache_dir)
    records: list[dict[str, Any]] = []
    started = time.perf_counter()

    def result(partial: bool) -> dict[str, Any]:
        splits = ["calibration", "heldout", "all"] if args.split == "all" else [args.split]
        return {
            "bench": "fidelity",
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": "bench/bench_fidelity.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "silicon_csv": "aiconfigurator_core/systems/silicon_sample.csv",
            "aiconfigurator_core": _version("aiconfigurator-core"),
            "ai_dynamo_runtime": _version("ai-dynamo-runtime"),
            "request_ratio": args.request_ratio,
            "quick": bool(args.quick),
            "partial": partial,
            "wall_seconds": round(time.perf_counter() - started, 1),
            "splits": {s: split_report(s, rows, mapped, cases, records) for s in splits},
            "records": records,
        }

    for i, case in enumerate(cases, 1):
        version = latest_backend_version(case.row.system, case.row.backend)
        rec = evaluate_case(evaluator, case, version, args.request_ratio, not args.no_aic)
        records.append(rec)
        ours = rec.get("ours") or {}
        print(f"[{i}/{len(cases)}] {case.row.id} c={case.row.concurrency} {rec['status']} "
              f"ttft {ours.get('ttft') or float('nan'):.1f}/{case.row.ttft_ms:.1f} "
              f"tpot {ours.get('tpot') or float('nan'):.2f}/{case.row.tpot_ms:.2f} ms "
              f"({rec['replay_seconds']:.1f}s)", flush=True)
        if args.json and i % 50 == 0 and i < len(cases):  # a killed long run keeps what it measured
            write_json(args.json, result(partial=True))
    return result(partial=False)


def write_json(path: str, data: dict[str, Any]) -> None:
    from spica_pipeline.storage import atomic_write_text

    atomic_write_text(Path(path), json.dumps(data, indent=1, sort_keys=True, allow_nan=False,
                                             default=lambda o: None) + "\n")


def _version(dist: str) -> str:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return "unknown"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", choices=("calibration", "heldout", "all"), default="all")
    ap.add_argument("--models", help="comma-separated silicon or AIC model names")
    ap.add_argument("--systems", help="comma-separated systems, e.g. h200_sxm,b200_sxm")
    ap.add_argument("--max-rows", type=int, default=None)
    ap.add_argument("--ids", help="comma-separated silicon row ids (reproduce single rows)")
    ap.add_argument("--quick", action="store_true", help="stratified subset, a few minutes on 2 cores")
    ap.add_argument("--json", help="write the result JSON here")
    ap.add_argument("--request-ratio", type=float, default=6.0, help="requests per unit of concurrency")
    ap.add_argument("--no-aic", action="store_true", help="skip AIC's own estimate")
    ap.add_argument("--cache-dir", default=None, help="timing/KV cache (default $SPICA_CACHE_DIR)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args, argv)
    for name, rep in result["splits"].items():
        print_report(name, rep)
    if args.json:
        write_json(args.json, result)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
