"""`spica list models|hardware|backends`: the names a config may use, from aiconfigurator-core's shipped data.

models: every shipped model with its architecture, AIC model family, experts and context (and how
else a model may be named); hardware: every GPU system with GPUs per node, memory per GPU and the
backends with perf data there; backends: per system and backend, the perf-data versions (the sweep
uses the latest) and whether the picks can be written as a DynamoGraphDeployment. `--json` prints
the same as one JSON document.
"""

import argparse
import json
from typing import Any

from spica_pipeline.cli.common import EXIT_OK
from spica_pipeline.report.dgd import DEPLOY_BACKENDS
from spica_pipeline.space.model_hw import (
    SAME_SHAPE,
    available_systems,
    hardware_facts,
    model_catalogue,
    perf_databases,
    supported_architectures,
)

GIB = 2**30


def models() -> list[dict[str, Any]]:
    return [{"name": m.name, "architecture": m.architecture, "family": m.family, "experts": m.num_experts,
             "context": m.max_context_length} for m in model_catalogue()]


def architectures() -> list[dict[str, Any]]:
    """What a local config.json may be: each architecture aiconfigurator-core models, with its family."""
    return [{"architecture": a, "family": f} for a, f in supported_architectures().items()]


def hardware() -> list[dict[str, Any]]:
    databases = perf_databases()
    rows = []
    for sku in available_systems():
        facts = hardware_facts(sku)
        rows.append({"name": sku, "gpus_per_node": facts.gpus_per_node,
                     "memory_gib": round(facts.vram_bytes / GIB, 1), "backends": sorted(databases.get(sku, {}))})
    return rows


def backends() -> list[dict[str, Any]]:
    return [{"system": sku, "backend": backend, "versions": versions, "latest": versions[-1],
             "deploy_writer": backend in DEPLOY_BACKENDS}
            for sku, by_backend in perf_databases().items() for backend, versions in by_backend.items()]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows)]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *rows]]


def _text(what: str, rows: list[dict[str, Any]]) -> list[str]:
    if what == "models":
        lines = _table(["model", "architecture", "family", "experts", "context"],
                       [[r["name"], r["architecture"], r["family"], str(r["experts"] or "-"),
                         f"{r['context']:,}" if r["context"] else "-"] for r in rows])
        same = [f"  {k} -> {v}" for k, v in sorted(SAME_SHAPE.items())]
        local = _table(["  architecture", "family"], [[f"  {r['architecture']}", r["family"]] for r in architectures()])
        return lines + [
            "",
            f"{len(rows)} models. search_space.model_name also takes:",
            "- the Hugging Face id of a checkpoint of one of these shapes, in any case, without the org or with",
            "  -Instruct/-Chat/-IT/-Base/-HF (meta-llama/Llama-3.1-70B-Instruct -> meta-llama/Meta-Llama-3.1-70B);",
            "- a later release of the same shape:", *same,
            "- a local directory holding a Hugging Face config.json (or that file) of one of these architectures:",
            *local,
        ]
    if what == "hardware":
        lines = _table(["hardware_sku", "gpus/node", "GiB/GPU", "backends with perf data"],
                       [[r["name"], str(r["gpus_per_node"]), f"{r['memory_gib']:g}",
                         ", ".join(r["backends"]) or "none (no perf data: cannot be swept)"] for r in rows])
        return lines + ["", f"{len(rows)} systems. search_space.hardware_sku also takes a GPU name that begins one "
                            "system with perf data (H200 -> h200_sxm, H100 -> h100_sxm), in any case."]
    lines = _table(["hardware_sku", "backend", "perf-data versions (latest used)", "deploy writer"],
                   [[r["system"], r["backend"], ", ".join(r["versions"]),
                     "yes" if r["deploy_writer"] else "no: refused by validate and sweep"] for r in rows])
    return lines + ["", f"{len(rows)} system/backend pairs with perf data; picks are deployed for "
                        f"{', '.join(DEPLOY_BACKENDS)}."]


LISTS = {"models": models, "hardware": hardware, "backends": backends}


def cmd_list(args: argparse.Namespace) -> int:
    """Print one catalogue as a table (or JSON with --json)."""
    rows = LISTS[args.what]()
    if args.json:
        doc: Any = {"models": rows, "local_architectures": architectures()} if args.what == "models" else rows
        text = json.dumps(doc, indent=1)
    else:
        text = "\n".join(_text(args.what, rows))
    print(text, flush=True)  # a reader that stops early (`| head`) is main's BrokenPipeError
    return EXIT_OK


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    listing = sub.add_parser(
        "list", parents=[common], help="[EXPERIMENTAL] list the models, GPU systems or backends with perf data",
        description="[EXPERIMENTAL] List what aiconfigurator-core ships: models (with their architecture family), "
                    "hardware (GPUs per node, memory, backends with perf data) or backends (perf-data versions per "
                    "system, and which have a deploy writer).",
    )
    listing.add_argument("what", choices=sorted(LISTS), help="which catalogue to print")
    listing.add_argument("--json", action="store_true", help="print the catalogue as JSON")
    listing.set_defaults(func=cmd_list)
