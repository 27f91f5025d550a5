"""Stage 6 asset: merge every branch's ledger by goal and write the report artifacts.

The stored value is the candidates table (ranked list, or the Pareto front); report.md, the
plots, the deploy/ YAML and the merged ledger are written by `write_results` under the sweep's
output folder and linked from the materialization metadata.
"""

import base64
import json
import math
import re
import time
from collections import Counter
from typing import Any

import dagster as dg
import pandas as pd

from spica_pipeline.assets.branches import branch_spaces_from_frame
from spica_pipeline.assets.config import GROUP, config_from_frame, fail, frame_value
from spica_pipeline.assets.studies import SPACES_FILE
from spica_pipeline.errors import SpicaError
from spica_pipeline.search import scoring
from spica_pipeline.search.ledger import STATUSES, TrialRecord
from spica_pipeline.search.study import BranchOutcome
from spica_pipeline.storage import atomic_write_text
from spica_pipeline.sweep import ledger_frame, plan_branch, write_results

TABLE_ROWS = 20


_SAME_SPEC = re.compile(r"(same spec as trial )(\d+)")


def merged_ledger(config: Any, ledgers: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Branch ledgers in the config's mode order, trials renumbered sweep-wide as the CLI numbers them."""
    frames, offset = [], 0
    for mode in config.search_space.deployment_mode:
        frame = ledgers.get(mode)
        if frame is None or frame.empty:
            continue
        frame = frame.copy()
        frame["trial"] = frame["trial"].astype(int) + offset
        if offset:  # cached rows point at the trial that replayed their spec: renumber that too
            shift = offset
            frame["reason"] = frame["reason"].map(
                lambda r: _SAME_SPEC.sub(lambda m: f"{m.group(1)}{int(m.group(2)) + shift}", r)
                if isinstance(r, str) else r)
        offset = int(frame["trial"].max())
        frames.append(frame)
    if not frames:
        return ledger_frame([])
    return pd.concat(frames, ignore_index=True)


def branch_outcome(mode: str, ledger: pd.DataFrame) -> BranchOutcome:
    """What the report needs from a branch study, rebuilt from its stored ledger."""
    records = [TrialRecord.from_row(r) for r in ledger.to_dict("records")] if not ledger.empty else []
    sources = {r.source for r in records}
    return BranchOutcome(
        branch=mode, records=records, mode="exhaustive" if sources == {"exhaustive"} else "vizier",
        rounds=max((r.round for r in records), default=0),
        optimizer_seconds=sum(r.optimizer_seconds for r in records),
        replay_seconds=sum(r.replay_seconds for r in records),
        counts=Counter(r.status for r in records),
    )


def _png_markdown(path: Any, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f"![{alt}](data:image/png;base64,{data})"


def _cell(v: Any) -> Any:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return None
    if hasattr(v, "item"):
        v = v.item()
    return v if isinstance(v, (int, float, str, bool)) else str(v)


def candidates_table(candidates: pd.DataFrame, objectives: list[str] | None) -> dg.TableMetadataValue:
    """The head of the ranked list / front, with the columns a person compares first."""
    wanted = ["rank", "branch", "used_gpus"]
    wanted += [f"obj.{o}" for o in objectives] if objectives else ["score"]
    wanted += ["tok_s_per_gpu", "tok_s_per_user", "cfg.backend", "cfg.router_mode"]
    cols = [c for c in wanted if c in candidates.columns]
    types = {c: ("int" if c in ("rank", "used_gpus") else "string" if c in ("branch",) or c.startswith("cfg.")
                 else "float") for c in cols}
    records = [dg.TableRecord({c: _cell(r[c]) for c in cols})
               for r in candidates.head(TABLE_ROWS).to_dict("records")]
    return dg.MetadataValue.table(records=records,
                                  schema=dg.TableSchema(columns=[dg.TableColumn(c, types[c]) for c in cols]))


@dg.asset(
    group_name=GROUP,
    kinds={"pandas", "parquet"},
    ins={"branch_study": dg.AssetIn(metadata={"allow_missing_partitions": True})},
    deps=["load_predictor_result"],  # lineage: the studies' samples carry its winners
    required_resource_keys={"sweep_storage"},
)
def sweep_result(
    context: dg.AssetExecutionContext,
    filtered_config: pd.DataFrame,
    branch_spaces: pd.DataFrame,
    branch_study: dict[str, pd.DataFrame],
) -> dg.Output[pd.DataFrame]:
    """Ranked candidates (scalar goal) or the Pareto front, plus report.md, plots and deploy YAML."""
    from spica_pipeline.search.branches import BranchSpace

    started = time.perf_counter()
    config = config_from_frame(filtered_config)
    ledgers = dict(branch_study or {})
    spaces = branch_spaces_from_frame(branch_spaces)
    missing = [m for m in spaces if m not in ledgers]
    if missing:
        context.log.warning(f"branch_study has no materialized partition for {missing}: merged without them")
    ledger = merged_ledger(config, ledgers)
    branches = [BranchSpace.from_dict(spaces[m]) for m in config.search_space.deployment_mode if m in spaces]
    plans = [plan_branch(b, config) for b in branches]
    outcomes = [branch_outcome(p.branch.deployment_mode, ledgers.get(p.branch.deployment_mode, ledger_frame([])))
                for p in plans]
    output_dir = context.resources.sweep_storage.output_dir(str(frame_value(filtered_config, "sweep_name")))
    timings = {
        "optimizer_seconds": sum(o.optimizer_seconds for o in outcomes),
        "replay_seconds": sum(o.replay_seconds for o in outcomes),
        "wall_seconds": time.perf_counter() - started,
    }
    try:
        merge, paths = write_results(output_dir, config, plans, ledger, timings)
    except SpicaError as err:
        raise fail(err) from None
    # what the next warm start compares against
    atomic_write_text(output_dir / SPACES_FILE, json.dumps(
        {str(r["deployment_mode"]): str(r["space_hash"]) for r in branch_spaces.to_dict("records")}, indent=2))
    candidates = pd.read_parquet(paths["candidates"])

    metadata: dict[str, Any] = {s: int(merge.counts.get(s, 0)) for s in STATUSES}
    metadata.update({
        "trials": int(len(ledger)),
        "candidates": int(len(candidates)),
        "duplicates": int(merge.duplicates),
        "over_budget": int(merge.over_budget),
        "goal": merge.target,
        "summary": merge.summary_line(),
    })
    if merge.is_pareto:
        metadata["hypervolume"] = float(merge.hypervolume or 0.0)
        metadata["front_size"] = len(merge.candidates)
    elif merge.candidates:
        best = merge.candidates[0]
        metadata["best_score"] = float(best.score)
        value = best.score if scoring.direction(merge.target) == "max" else -best.score
        metadata[f"best_{merge.target}"] = float(value)
    metadata["ranked" if not merge.is_pareto else "front"] = candidates_table(
        candidates, merge.objectives if merge.is_pareto else None)
    metadata["report"] = dg.MetadataValue.path(str(paths["report"]))
    metadata["output_dir"] = dg.MetadataValue.path(str(output_dir))
    if (output_dir / "deploy").exists():
        metadata["deploy_dir"] = dg.MetadataValue.path(str(output_dir / "deploy"))
    metadata["pareto_plot"] = dg.MetadataValue.md(_png_markdown(paths["pareto_png"], "pareto"))
    metadata["convergence_plot"] = dg.MetadataValue.md(_png_markdown(paths["convergence_png"], "convergence"))
    context.log.info(merge.summary_line())
    return dg.Output(candidates, metadata=metadata)
