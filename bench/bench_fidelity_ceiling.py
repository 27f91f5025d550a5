"""How close any correction of the replay's numbers could get to silicon, measured on the calibration split.

The shipped profile (fidelity/transfer.py) corrects a replayed TTFT or TPOT per (system, backend) with the
correction that transferred best to architectures left out. Whether some correction reaches the accuracy targets
on a model it never saw, this bench answers without a candidate, in five parts:

* in sample: for each grain a correction could key on, each group's factor is the median of ln(silicon / replayed)
  over the very rows it is scored on, about the best a factor of that grain can do there (optimistic; fine grains
  hold one or two rows per group). The grains go from the profile's own, (system, backend), to ones that know the
  model and everything a row states but its concurrency, then a concurrency slope per such configuration;
* transfer: a factor keyed on what a deployment states but not the model, from the backend to (system, backend,
  mode, ISL, OSL, concurrency), fitted without the row's architecture: the error a model the profile never saw gets
  (leave one architecture out, with each model's signed median bias);
* own model: a factor from k measurements of the model itself on the (system, backend, mode) it runs on, scored on
  that group's other rows: what someone who measured their own model a few times could reach;
* methods: whole profiles fitted the shipped way (fidelity/transfer.py) on the profile's fit rows without one
  architecture, every choice included, and scored on its rows: the correction chosen per (system, backend, phase),
  per (backend, phase) or per phase, and the uniform methods it replaces (replay-v15's, replay-v14's, the raw
  client replay). transfer.CHOICE_LEVEL is the level with the lowest score here;
* floor: bench/results/silicon_repeats.json, how far two measurements of one configuration disagree (read, not
  recomputed).

Only calibration rows are read: the held-out split stays unread (the split rule, fidelity/silicon.py). Each row is
compared on its benchmark-client replay ("ours" in the bench records), the replay the shipped profile corrects.

usage: .venv/bin/python bench/bench_fidelity_ceiling.py --from-json bench/results/fidelity_replays_calibration.json
           [--json bench/results/fidelity_ceiling.json] [--no-methods]
"""

import argparse
import json
import math
import random
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from fidelity.files import records_by_id  # noqa: E402
from fidelity.scores import error_stats, fit_records, leave_one_architecture_out  # noqa: E402

from spica_pipeline.fidelity import silicon  # noqa: E402
from spica_pipeline.fidelity.fit import SCORE_TARGETS  # noqa: E402
from spica_pipeline.fidelity.profile import PHASES  # noqa: E402
from spica_pipeline.fidelity import transfer as shipped  # noqa: E402
from spica_pipeline.fidelity.records import architecture, engine_concurrency, replayed  # noqa: E402

TARGETS = SCORE_TARGETS
REPEATS = ROOT / "bench" / "results" / "silicon_repeats.json"
MIN_SLOPE_POINTS = 3  # a concurrency slope needs three concurrencies in its configuration; fewer keep the median
OWN_MODEL_K = (1, 3, 10)  # measurements of the model itself, on the (system, backend, mode) it will run
OWN_MODEL_DRAWS = 20
OWN_MODEL_SEED = 14


def _shape(r: Mapping[str, Any]) -> str:
    """The parallel shape without its running-request cap (the bench sets it to the row's concurrency)."""
    pools = {pool: {k: v for k, v in (s or {}).items() if k != "max_num_seqs"} for pool, s in (r.get("shape") or {}).items()}
    return json.dumps(pools, sort_keys=True)


def _configuration(r: Mapping[str, Any]) -> tuple:
    """Everything a record states but its concurrency (bench_silicon_repeats.configuration, less the concurrency)."""
    return (r.get("model"), r.get("precision"), r.get("system"), r.get("backend"), r.get("silicon_backend_version"),
            r.get("mode"), r.get("isl"), r.get("osl"), _shape(r), r.get("benchmark_client"))


GRAINS: dict[str, Callable[[Mapping[str, Any]], tuple]] = {
    "backend": lambda r: (r.get("backend"),),
    "system, backend (the profile's)": lambda r: (r.get("system"), r.get("backend")),
    "system, backend, mode, ISL, OSL": lambda r: (r.get("system"), r.get("backend"), r.get("mode"), r.get("isl"),
                                                  r.get("osl")),
    "system, backend, mode, ISL, OSL, concurrency": lambda r: (r.get("system"), r.get("backend"), r.get("mode"),
                                                               r.get("isl"), r.get("osl"), r.get("concurrency")),
    "model, system, backend, mode": lambda r: (r.get("model"), r.get("system"), r.get("backend"), r.get("mode")),
    "configuration but concurrency": _configuration,
}
SLOPE_GRAIN = "configuration but concurrency + a concurrency slope"


def points(records: Sequence[Mapping[str, Any]], phase: str) -> list[dict[str, Any]]:
    """(record, ln(silicon / replayed), log2 engine concurrency) of every feasible calibration record with both."""
    out = []
    for r in records:
        if silicon.split_of(str(r.get("model"))) != "calibration":
            raise ValueError(f"{r.get('id')}: a {r.get('model')} row is not in the calibration split; "
                             "this bench reads calibration rows only")
        client = replayed(r, phase, "client")
        measured = (r.get("silicon") or {}).get(phase)
        if r.get("status") != "feasible" or not client or not measured or client <= 0 or measured <= 0:
            continue
        out.append({"record": r, "y": math.log(measured / client),
                    "x": math.log2(max(engine_concurrency(r, phase), 1.0))})
    return out


def _stats(pts: list[dict[str, Any]], fitted: list[float]) -> dict[str, Any]:
    """error_stats of corrected (replayed x exp(fitted)) against silicon, overall and per backend."""
    pairs: dict[str, list[tuple[float, float]]] = defaultdict(list, {"all": []})
    for p, f in zip(pts, fitted):
        pair = (math.exp(f - p["y"]), 1.0)  # corrected / measured, as a ratio to 1
        pairs["all"].append(pair)
        pairs[str(p["record"].get("backend"))].append(pair)
    return {k: error_stats(v) for k, v in sorted(pairs.items())}


def in_sample(pts: list[dict[str, Any]], key: Callable[[Mapping[str, Any]], tuple]) -> list[float]:
    """Each point's group median of y: the best factor of that grain for these very rows."""
    groups: dict[tuple, list[float]] = defaultdict(list)
    for p in pts:
        groups[key(p["record"])].append(p["y"])
    medians = {k: statistics.median(v) for k, v in groups.items()}
    return [medians[key(p["record"])] for p in pts]


def with_slope(pts: list[dict[str, Any]]) -> list[float]:
    """Per configuration, the least-squares line of y on log2 concurrency (its median where fewer than
    MIN_SLOPE_POINTS concurrencies): a correction that knows the configuration and how its error moves with load."""
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, p in enumerate(pts):
        groups[_configuration(p["record"])].append(i)
    fitted = [0.0] * len(pts)
    for members in groups.values():
        xs, ys = [pts[i]["x"] for i in members], [pts[i]["y"] for i in members]
        if len(set(xs)) < MIN_SLOPE_POINTS:
            for i in members:
                fitted[i] = statistics.median(ys)
            continue
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        for i in members:
            fitted[i] = my + slope * (pts[i]["x"] - mx)
    return fitted


# the grains that do not name the model, coarse to fine: a correction keyed on one can reach a new model
TRANSFER_GRAINS = ("backend", "system, backend (the profile's)", "system, backend, mode, ISL, OSL",
                   "system, backend, mode, ISL, OSL, concurrency")


def transfer(pts: list[dict[str, Any]], grain: str) -> tuple[list[float], dict[str, float]]:
    """Each point's group median of y over the rows of other architectures, at `grain` or, where none has a row
    there, the finest coarser grain of TRANSFER_GRAINS that has one (0 where none has); and each model's signed
    median bias under it (leave one architecture out)."""
    chain = [GRAINS[g] for g in reversed(TRANSFER_GRAINS[:TRANSFER_GRAINS.index(grain) + 1])]
    pools: dict[tuple, dict[str, list[float]]] = {}
    for level, key in enumerate(chain):
        for p in pts:
            pools.setdefault((level, key(p["record"])), defaultdict(list))[architecture(p["record"].get("model"))].append(p["y"])
    fitted = []
    for p in pts:
        model, found = architecture(p["record"].get("model")), 0.0
        for level, key in enumerate(chain):
            others = [y for m, ys in pools[(level, key(p["record"]))].items() if m != model for y in ys]
            if others:
                found = statistics.median(others)
                break
        fitted.append(found)
    by_model: dict[str, list[float]] = defaultdict(list)
    for p, f in zip(pts, fitted):
        by_model[str(p["record"].get("model"))].append(math.exp(f - p["y"]) - 1.0)
    return fitted, {m: round(statistics.median(v), 4) for m, v in sorted(by_model.items())}


def own_model(pts: list[dict[str, Any]], k: int, seed: int = OWN_MODEL_SEED) -> dict[str, Any]:
    """A factor from k measurements of the model itself on one (system, backend, mode), the median of their y,
    scored on that group's other rows; OWN_MODEL_DRAWS seeded draws per group, pooled. Groups with k rows or fewer
    are left out (n says how many scored rows remain)."""
    key = GRAINS["model, system, backend, mode"]
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for p in pts:
        groups[key(p["record"])].append(p)
    rng = random.Random(seed)
    scored, fitted = [], []
    for key in sorted(groups, key=str):
        members = groups[key]
        if len(members) <= k:
            continue
        for _ in range(OWN_MODEL_DRAWS):
            picked = set(rng.sample(range(len(members)), k))
            f = statistics.median(members[i]["y"] for i in picked)
            rest = [m for i, m in enumerate(members) if i not in picked]
            scored += rest
            fitted += [f] * len(rest)
    return {"k": k, "draws": OWN_MODEL_DRAWS, "seed": seed, **_stats(scored, fitted)}


# one correction for every entry, for comparison with the shipped choice: the methods it replaces (replay-v15 and
# replay-v14 chose these on other grounds; raw is the uncorrected client replay)
UNIFORM: dict[str, dict[str, tuple[str, ...]]] = {
    "v15": {"ttft": ("factor+load",), "tpot": ("overhead",)},
    "v14": {"ttft": ("factor+load",), "tpot": ("raw",)},
    "raw": {"ttft": ("raw",), "tpot": ("raw",)},
}

def methods(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Each method left out by architecture on the profile's fit rows (scores.leave_one_architecture_out): the
    transfer choice at each of shipped.LEVELS, then the uniform methods; "score" sums the phases' target scores
    (lower is better)."""
    rows = fit_records([dict(r) for r in records])
    out: dict[str, Any] = {"rows": "the profile's fit rows (scores.fit_records) with spread client lengths"}
    if len({architecture(r.get("model")) for r in rows}) < 2:
        return {**out, "note": "fewer than two architectures among the fit rows: nothing to leave out"}
    for level in shipped.LEVELS:
        out[f"choice per {level}"] = leave_one_architecture_out(
            rows, lambda train, lv=level: shipped.fit(train, fitted="-", source="-", level=lv, fallback=False))
    for name, candidates in UNIFORM.items():
        out[f"uniform {name}"] = leave_one_architecture_out(
            rows, lambda train, c=candidates: shipped.fit(train, fitted="-", source="-", candidates=c, fallback=False))
    return out


def meets(stats: Mapping[str, Any], phase: str) -> bool:
    md, p90 = TARGETS[phase]
    return stats.get("n", 0) > 0 and stats["mdape"] <= md and stats["p90"] <= p90


def ceiling(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for phase in PHASES:
        pts = points(records, phase)
        levels = {"raw replay": _stats(pts, [0.0] * len(pts))}
        levels |= {name: _stats(pts, in_sample(pts, key)) for name, key in GRAINS.items()}
        levels[SLOPE_GRAIN] = _stats(pts, with_slope(pts))
        transfers = {}
        for grain in TRANSFER_GRAINS:
            fitted, bias = transfer(pts, grain)
            transfers[grain] = {**_stats(pts, fitted), "bias_by_model": bias}
        out[phase] = {"rows": len(pts), "in_sample": levels,
                      "own_model": [own_model(pts, k) for k in OWN_MODEL_K],
                      "transfer": transfers,
                      "target": {"mdape": TARGETS[phase][0], "p90": TARGETS[phase][1]}}
    return out


def _line(name: str, stats: Mapping[str, Any], phase: str) -> str:
    cells = [f"{k} {100 * s['mdape']:.0f}/{100 * s['p90']:.0f} %" for k, s in stats.items()
             if isinstance(s, dict) and s.get("n")]
    return f"  {name:54s} {'meets' if meets(stats['all'], phase) else '     '}  " + " | ".join(cells)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--from-json", required=True,
                    help="comma-separated bench_fidelity replay files (PATH or REV:PATH), first wins per row")
    ap.add_argument("--json", help="write the result here")
    ap.add_argument("--no-methods", action="store_true", help="skip the whole-method check (about two minutes)")
    args = ap.parse_args(argv)
    try:
        records = list(records_by_id(args.from_json, "calibration").values())
        result: dict[str, Any] = {"bench": "fidelity_ceiling", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "command": "bench/bench_fidelity_ceiling.py " + " ".join(sys.argv[1:] if argv is None else argv),
                  "split": "calibration", "phases": ceiling(records)}
        if not args.no_methods:
            result["methods"] = methods(records)
    except (OSError, ValueError, KeyError) as e:  # json.JSONDecodeError is a ValueError
        print(f"error: {args.from_json}: {e}", file=sys.stderr)
        return 2
    if REPEATS.exists():
        floor = json.loads(REPEATS.read_text())["repeats"]
        result["floor"] = {"source": str(REPEATS.relative_to(ROOT)),
                           **{k: {p: v[p]["floor"] for p in PHASES} for k, v in floor.items()
                              if k.startswith("calibration/") and v["configurations_repeated"]}}
    for phase, r in result["phases"].items():
        print(f"{phase.upper()} ({r['rows']} calibration rows; MdAPE/P90, target {100 * TARGETS[phase][0]:.0f}/"
              f"{100 * TARGETS[phase][1]:.0f} %)")
        for name, stats in r["in_sample"].items():
            print(_line(name, stats, phase))
        for grain, t in r["transfer"].items():
            print(_line(f"transfer (new architecture): {grain.split(' (')[0]}", t, phase))
            print("    " + ", ".join(f"{m.split('/')[-1]} {100 * b:+.0f} %" for m, b in t["bias_by_model"].items()))
        for own in r["own_model"]:
            print(_line(f"own model: {own['k']} measurement(s) on its (system, backend, mode)", own, phase))
    for name, m in (result.get("methods") or {}).items():
        if isinstance(m, dict):
            c = m["calibrated"]
            print(f"  {name:22s} left out by architecture ({m['rows']} rows): score {m['score']:.3f}  " + " | ".join(
                f"{p.upper()} {100 * c[p]['mdape']:.0f}/{100 * c[p]['p90']:.0f} % band "
                f"{100 * m['band_coverage'][p]['inside']:.0f} %" for p in PHASES))
    for k, v in (result.get("floor") or {}).items():
        if isinstance(v, dict):
            print(f"floor {k}: " + " | ".join(f"{p.upper()} {100 * v[p]['mdape']:.0f}/{100 * v[p]['p90']:.0f} %"
                                             for p in PHASES))
    if args.json:
        from spica_pipeline.storage import atomic_write_text

        atomic_write_text(Path(args.json), json.dumps(result, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
