"""`spica export` / `spica import`: a sweep's ledger as an AI Simulate SweepResult (recommendation.json)
and back, losslessly."""

import argparse
import json
from pathlib import Path
from typing import Any

import pandas as pd

from spica_pipeline.cli.common import EXIT_OK, fail, load_or_report
from spica_pipeline.preflight import resolve_names
from spica_pipeline.report import merge_for_config
from spica_pipeline.report.sweep_result import ledger_to_sweep_result, sweep_result_to_ledger, to_json_text
from spica_pipeline.storage import atomic_write_parquet, atomic_write_text
from spica_pipeline.sweep import goal_summary


def cmd_export(args: argparse.Namespace) -> int:
    """A sweep's ledger as an AI Simulate SweepResult (recommendation.json)."""
    config = load_or_report(args.config)
    if isinstance(config, int):
        return config
    config, _ = resolve_names(config)  # the names the sweep used (a Hugging Face id -> the shipped model)
    ledger_path = Path(args.run_dir) / "ledger.parquet"
    if not ledger_path.is_file():
        return fail(f"--run-dir {args.run_dir}: no ledger.parquet there (run `spica sweep` first)")
    try:
        ledger = pd.read_parquet(ledger_path)
        merge = merge_for_config(ledger, config)
        doc = ledger_to_sweep_result(ledger, merge, config_json=config.model_dump(mode="json"),
                                     top_n=config.deploy.top_n, goal=goal_summary(config))
    except (ValueError, KeyError, OSError) as err:
        return fail(f"cannot export {ledger_path}: {type(err).__name__}: {err}")
    output = Path(args.output or Path(args.run_dir) / "recommendation.json")
    try:
        atomic_write_text(output, to_json_text(doc))
    except OSError as err:
        return fail(f"--output {output}: cannot write: {err.strerror or err}")
    c = doc["counts"]
    print(f"wrote {output}: {len(doc['candidates'])} candidates ({c['feasible']} feasible), "
          f"schema {doc['schema_version']}")
    return EXIT_OK


def cmd_import(args: argparse.Namespace) -> int:
    """A recommendation.json written by spica export back into ledger.parquet (+ config.json)."""
    try:
        doc = json.loads(Path(args.input).read_text())
    except (OSError, ValueError) as err:
        return fail(f"--input {args.input}: cannot read JSON: {err}")
    if not isinstance(doc, dict):
        return fail(f"--input {args.input}: not a SweepResult object")
    try:
        ledger = sweep_result_to_ledger(doc)
    except (ValueError, KeyError, TypeError) as err:
        return fail(f"--input {args.input}: {err}")
    out = Path(args.output_dir)
    config = (doc.get("provenance") or {}).get("config")
    try:
        atomic_write_parquet(out / "ledger.parquet", ledger)
        if config is not None:
            atomic_write_text(out / "config.json", json.dumps(config, sort_keys=True, indent=1) + "\n")
    except OSError as err:
        return fail(f"--output-dir {out}: cannot write: {err.strerror or err}")
    print(f"wrote {out / 'ledger.parquet'} ({len(ledger)} trials)")
    return EXIT_OK


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
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
