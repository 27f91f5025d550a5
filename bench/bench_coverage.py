"""Coverage: is every deployment people ran in the space? AIC's `systems/silicon_sample.csv` deployments
through the CLI's own path.

Every distinct vLLM / SGLang deployment of the file (backend, model, precision, system, mode and the shape of
each role with its worker count), agg and disagg, whose model AIC ships at the row's precision
(spica_pipeline/fidelity/silicon.py CHECKPOINTS: the headline set), is pinned as a one-candidate sweep config
(spica_pipeline/space/deployment.py: one backend, one mode, its shape as written in the CSV's columns,
gpu_budget its GPUs, context_length the longest ISL + OSL it ran) and validated and enumerated exactly as
`spica validate` / `spica sweep` do; no replay. Prints accepted / refused by rule and every refusal with its
rule, reason and the nearest accepted shape. A second set counts the deployments of a shipped model at a
precision AIC ships no checkpoint for (e.g. DeepSeek-V3 in NVFP4), pinned the way a user would: the shipped
checkpoint with `search_space.precision` set to the row's GEMM and MoE quantization.

    .venv/bin/python bench/bench_coverage.py [--out bench/results/coverage.json] [--models M,...] [--limit N]
"""

import argparse
import csv
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

os.environ.setdefault("DYN_LOG", "warn")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from spica_pipeline.fidelity.silicon import BENCH_BACKENDS, CHECKPOINTS, Role, SiliconRow, parse_rows  # noqa: E402
from spica_pipeline.space.deployment import check_deployment, deployment_config  # noqa: E402
from spica_pipeline.config.precision import CHOICES as PRECISION_CHOICES  # noqa: E402
from spica_pipeline.space.model_hw import available_models, model_facts  # noqa: E402

_SHAPE = ("tp", "pp", "attention_dp", "moe_tp", "moe_ep")


def silicon_rows() -> tuple[list[SiliconRow], dict[int, dict[str, str]]]:
    """The parsed rows, and the raw CSV row of each by file line (the quantization columns)."""
    import aiconfigurator_core

    path = Path(aiconfigurator_core.__file__).parent / "systems" / "silicon_sample.csv"
    with open(path, newline="") as f:
        raw = list(csv.DictReader(f))
    return parse_rows(raw), {i + 2: r for i, r in enumerate(raw)}


def checkpoint_of(row: SiliconRow, raw: dict[str, str], shipped: set[str]) -> tuple[str, dict[str, str] | None] | None:
    """(AIC checkpoint, precision pin or None) a user would sweep this row's model with; None: not shipped.

    The checkpoint of the row's precision when AIC ships it; else a shipped checkpoint of the same model with
    search_space.precision set to the row's GEMM / MoE quantization (where those are precision choices)."""
    native = CHECKPOINTS.get((row.model, row.precision))
    if native in shipped:
        return native, None
    base = next((c for (m, _), c in CHECKPOINTS.items() if m == row.model and c in shipped), None)
    if base is None:
        return None
    precision: dict[str, str] = {}
    if raw.get("gemm_quant_mode") in PRECISION_CHOICES["weights"]:
        precision["weights"] = raw["gemm_quant_mode"]
    if model_facts(base).is_moe and raw.get("moe_quant_mode") in PRECISION_CHOICES["moe"]:
        precision["moe"] = raw["moe_quant_mode"]
    return (base, precision) if precision else None


def _roles(row: SiliconRow) -> tuple[str, ...]:
    return ("agg",) if row.mode == "agg" else ("prefill", "decode")


def deployment_key(row: SiliconRow) -> tuple[Any, ...]:
    """What makes two rows the same deployment: who ran what where, each role's shape and workers."""
    shapes = tuple((r, *(getattr(row.role(r), k) for k in _SHAPE), row.role(r).workers) for r in _roles(row))
    return (row.backend, row.model, row.precision, row.system, row.mode, shapes)


def role_pin(role: Role) -> dict[str, int]:
    """The role's shape in the canonical keys, as the CSV states it (an unstated or 0 width left out)."""
    pin = {k: int(v) for k in _SHAPE if (v := getattr(role, k))}
    pin.setdefault("tp", 1)
    pin["replicas"] = role.workers or 1
    return pin


def _gpus(pin: dict[str, int]) -> int:
    """The role's GPUs: its engine is tp x attention_dp wide, or as wide as its experts where the row leaves
    attention_dp unstated (a dense row's MoE widths equal tp)."""
    attention = pin.get("tp", 1) * pin.get("attention_dp", 1)
    experts = pin.get("moe_tp", 1) * pin.get("moe_ep", 1)
    return max(attention, experts) * pin.get("pp", 1) * pin["replicas"]


def row_config(rows: list[SiliconRow], model: str, precision: dict[str, str] | None = None) -> dict[str, Any]:
    """The one-candidate sweep config of a deployment (its rows share the key); `model` the AIC checkpoint,
    `precision` a search_space.precision pin (None: the checkpoint's own)."""
    row = rows[0]
    if row.mode == "agg":
        pin: dict[str, Any] = role_pin(row.agg)
        gpus = _gpus(pin)
    else:
        pin = {"prefill": role_pin(row.prefill), "decode": role_pin(row.decode)}
        gpus = _gpus(pin["prefill"]) + _gpus(pin["decode"])
    context = max((r.isl or 0) + (r.osl or 0) for r in rows) or None
    return deployment_config(model=model, system=row.system, backend=row.backend, mode=row.mode, pin=pin,
                             gpus=gpus, isl=row.isl or 1024, osl=row.osl or 1024, concurrency=row.concurrency or 1,
                             context_length=context, precision=precision)


def deployments(rows: list[SiliconRow]) -> dict[tuple[Any, ...], list[SiliconRow]]:
    out: dict[tuple[Any, ...], list[SiliconRow]] = {}
    for row in rows:
        if row.backend in BENCH_BACKENDS and row.mode in ("agg", "disagg"):
            out.setdefault(deployment_key(row), []).append(row)
    return out


def _label(key: tuple[Any, ...]) -> str:
    backend, model, precision, system, mode, shapes = key
    roles = " + ".join(f"{s[0]} tp{s[1]}/pp{s[2]}/dp{s[3]}/moe_tp{s[4]}/moe_ep{s[5]}"
                       + (f" x{s[6]}" if s[6] else "") for s in shapes)
    return f"{backend} {model} {precision} {system} {mode}: {roles}"


def run(args: argparse.Namespace) -> dict[str, Any]:
    shipped = set(available_models())
    rows, raw = silicon_rows()
    groups = deployments(rows)
    wanted = set(args.models.split(",")) if args.models else None
    records: list[dict[str, Any]] = []
    not_shipped: Counter = Counter()
    started = time.perf_counter()
    for key, group in groups.items():
        backend, model, precision, system, mode, _ = key
        if wanted and model not in wanted:
            continue
        found = checkpoint_of(group[0], raw[group[0].line], shipped)
        if found is None or (found[1] and not args.precision_pins):
            not_shipped[f"{model} {precision}"] += 1
            continue
        if args.limit and len(records) >= args.limit:
            break
        checkpoint, precision_pin = found
        config = row_config(group, checkpoint, precision_pin)
        t0 = time.perf_counter()
        verdict = check_deployment(config)
        record = {"deployment": _label(key), "set": "precision_pin" if precision_pin else "checkpoint",
                  "backend": backend, "model": model, "checkpoint": checkpoint, "precision": precision,
                  "precision_pin": precision_pin, "system": system, "mode": mode, "rows": len(group),
                  "gpus": config["search_space"]["gpu_budget"],
                  "context_length": config["search_space"].get("context_length"),
                  "pin": config["search_space"]["parallel_configs"][0], **verdict.to_dict(),
                  "seconds": round(time.perf_counter() - t0, 2)}
        records.append(record)
        mark = "ok     " if verdict.accepted else f"REFUSED [{verdict.rule}]"
        print(f"{mark} {record['deployment']} ({record['gpus']} GPUs"
              + (f", precision {precision_pin}" if precision_pin else "") + f") {record['seconds']:.1f}s", flush=True)
    return summarize(records, not_shipped, time.perf_counter() - started)


def _tally(records: list[dict[str, Any]]) -> dict[str, Any]:
    by_mode: dict[str, dict[str, int]] = {}
    for r in records:
        mode = by_mode.setdefault(r["mode"], {"deployments": 0, "accepted": 0})
        mode["deployments"] += 1
        mode["accepted"] += int(r["accepted"])
    total = len(records)
    accepted = sum(int(r["accepted"]) for r in records)
    refused = [r for r in records if not r["accepted"]]
    return {"deployments": total, "accepted": accepted,
            "accepted_share": round(accepted / total, 4) if total else None, "by_mode": by_mode,
            "refused_by_rule": dict(Counter(r["rule"] for r in refused)),
            "refused": [{k: r[k] for k in ("deployment", "precision_pin", "gpus", "rule", "message", "nearest")}
                        for r in refused]}


def summarize(records: list[dict[str, Any]], not_shipped: Counter, seconds: float) -> dict[str, Any]:
    return {
        "benchmark": "coverage",
        "question": "how many distinct silicon deployments of shipped models does the CLI accept, agg and disagg?",
        **_tally([r for r in records if r["set"] == "checkpoint"]),
        "precision_pinned": _tally([r for r in records if r["set"] == "precision_pin"]),
        "not_shipped": dict(not_shipped),
        "seconds": round(seconds, 1),
        "records": records,
    }


def _report_set(title: str, tally: dict[str, Any]) -> None:
    print()
    print(f"{title}: accepted {tally['accepted']} / {tally['deployments']} distinct deployments "
          f"({100 * (tally['accepted_share'] or 0):.1f} %)")
    for mode, counts in tally["by_mode"].items():
        print(f"  {mode}: {counts['accepted']} / {counts['deployments']}")
    print(f"  refused by rule: {tally['refused_by_rule'] or 'none'}")
    for r in tally["refused"]:
        print(f"  [{r['rule']}] {r['deployment']} ({r['gpus']} GPUs"
              + (f", precision {r['precision_pin']}" if r["precision_pin"] else "") + ")")
        print(f"      why: {r['message']}")


def report(result: dict[str, Any]) -> None:
    _report_set("shipped checkpoints", result)
    if result["precision_pinned"]["deployments"]:
        _report_set("shipped models at a pinned precision", result["precision_pinned"])
    print(f"\nnot shipped (no AIC checkpoint of the model): {sum(result['not_shipped'].values())} deployments: "
          f"{result['not_shipped']}")
    print(f"{result['seconds']:.0f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write the result JSON here (bench/results/coverage.json)")
    parser.add_argument("--models", default=None, help="only these silicon model names (comma-separated)")
    parser.add_argument("--limit", type=int, default=0, help="stop after this many shipped deployments")
    parser.add_argument("--no-precision-pins", dest="precision_pins", action="store_false",
                        help="leave out the deployments that need a precision pin")
    args = parser.parse_args(argv)
    result = run(args)
    result["command"] = "bench/bench_coverage.py " + " ".join(argv if argv is not None else sys.argv[1:])
    result["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    report(result)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
