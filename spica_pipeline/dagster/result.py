"""Stage 6 assets: merge every branch's ledger by goal (`sweep_result`), then write the deploy output.

`sweep_result` stores the candidates table (ranked list, or the Pareto front) and carries the
blocking checks. `deploy` is downstream of it, so a failed blocking check leaves no new deploy
files: it calls `write_results` (report.md, plots, deploy/<rank>/, recommendation.json).
"""

import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping, TypeAlias

import dagster as dg
import pandas as pd

from spica_pipeline.config import SmartSearchConfig
from spica_pipeline.dagster.branches import branch_spaces_from_frame
from spica_pipeline.dagster.config import config_from_frame, fail
from spica_pipeline.dagster.io import SweepStorage
from spica_pipeline.dagster.spec import SweepSpec
from spica_pipeline.dagster.studies import SPACES_FILE, study_timings
from spica_pipeline.dagster.ui_plots import inline_plot, png_markdown
from spica_pipeline.errors import SpicaError
from spica_pipeline.evaluate import scoring
from spica_pipeline.optimize.branch_plan import BranchPlan, plan_branch
from spica_pipeline.optimize.ledger import STATUSES, TrialRecord
from spica_pipeline.optimize.trial import BranchOutcome
from spica_pipeline.optimize.timings import Timings
from spica_pipeline.report import merge_for_config
from spica_pipeline.report.plots import convergence_png, front_points, pareto_png, plot_axes_for
from spica_pipeline.report.tables import arrow_safe, candidates_frame, goal_value
from spica_pipeline.space.branches import BranchSpace
from spica_pipeline.storage import atomic_write_parquet, atomic_write_text
from spica_pipeline.sweep import ledger_frame, write_results

TABLE_ROWS = 20


_SAME_SPEC = re.compile(r"(same spec as trial )(\d+)")


def merged_ledger(config: SmartSearchConfig, ledgers: dict[str, pd.DataFrame]) -> pd.DataFrame:
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
    merged = pd.concat(frames, ignore_index=True)
    merged.attrs.clear()  # the branches' study timings are not part of the merged ledger
    return merged


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


def _cell(v: Any) -> Any:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return None
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float):
        return round(v, 4)
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


# The branch_study input of the downstream assets: {mode: ledger}, or the frame itself when the
# asset has one partition (the asset parameters stay `Any`: Dagster turns a hint into a type check).
BranchStudies: TypeAlias = "pd.DataFrame | Mapping[str, pd.DataFrame] | None"


def _sweep_inputs(spec: SweepSpec) -> dict[str, dg.AssetIn]:
    return {"filtered_config": dg.AssetIn(spec.key("filtered_config")),
            "branch_spaces": dg.AssetIn(spec.key("branch_spaces")),
            "branch_study": dg.AssetIn(spec.key("branch_study"), metadata={"allow_missing_partitions": True})}


def as_ledgers(spec: SweepSpec, branch_study: BranchStudies) -> dict[str, pd.DataFrame]:
    """The branch_study input as {mode: ledger}: Dagster hands a single-partition asset over as the
    frame itself."""
    if isinstance(branch_study, pd.DataFrame):
        return {spec.modes[0]: branch_study}
    return dict(branch_study or {})


@dataclass
class MergedInputs:
    """The stored stage outputs, rebuilt: the merged ledger, the plans and what each study did."""

    config: SmartSearchConfig
    ledger: pd.DataFrame
    plans: list[BranchPlan]
    outcomes: list[BranchOutcome]
    timings: Timings  # wall_seconds: the branch studies' own, added up over the partitions


def merged_inputs(context: dg.AssetExecutionContext, spec: SweepSpec, filtered_config: pd.DataFrame,
                  branch_spaces: pd.DataFrame, branch_study: BranchStudies) -> MergedInputs:
    """The merge's inputs rebuilt from the stored stage outputs."""

    config = config_from_frame(filtered_config)
    ledgers = as_ledgers(spec, branch_study)
    spaces = branch_spaces_from_frame(branch_spaces)
    missing = [m for m in spaces if m not in ledgers]
    if missing:
        context.log.warning(f"branch_study has no materialized partition for {missing}: merged without them")
    ledger = merged_ledger(config, ledgers)
    branches = [BranchSpace.from_dict(spaces[m]) for m in config.search_space.deployment_mode if m in spaces]
    plans = [plan_branch(b, config) for b in branches]
    outcomes = [branch_outcome(p.branch.deployment_mode, ledgers.get(p.branch.deployment_mode, ledger_frame([])))
                for p in plans]
    wall = sum(study_timings(frame).wall_seconds for frame in ledgers.values())
    return MergedInputs(config, ledger, plans, outcomes, Timings.of(outcomes, wall))


def _r(v: Any) -> float:
    return round(float(v), 4)


FULL_SIZE_DPI = 110  # 8-point labels are 12 px; with the legend below the axes, 800-950 px wide


def result_plots(merge: Any, sla: Mapping[str, float] | None = None) -> dict[str, Any]:
    """Inline sketches of the trade-off (front squares) and the convergence curve, and each full plot
    (the report's pareto.png and convergence.png) behind the UI's "[Show Markdown]"."""

    x, y = plot_axes_for(merge)
    pts = [(goal_value(c, x), goal_value(c, y)) for c in merge.feasible]
    front = front_points(pts, (scoring.direction(x), scoring.direction(y)))
    rec = merge.recommendation
    pick = (goal_value(rec[0], x), goal_value(rec[0], y)) if rec is not None else None
    conv = merge.convergence
    merged = conv[conv["scope"] == "merged"] if not conv.empty else conv
    flip = (not merge.is_pareto) and scoring.direction(merge.target) == "min"
    curve = [(float(e), -float(v) if flip else float(v)) for e, v in zip(merged.get("evaluation", []),
                                                                           merged.get("value", []))]
    label = "hypervolume" if merge.is_pareto else f"best {merge.target}"
    return {
        "tradeoff_plot": dg.MetadataValue.md(inline_plot("trade-off", pts, highlight=front, pick=pick, x_label=x,
                                                         y_label=y)),
        "tradeoff_plot_full_size": dg.MetadataValue.md(png_markdown(
            "trade-off", pareto_png(merge, sla=sla, dpi=FULL_SIZE_DPI, legend="below"), "pareto.png of the report")),
        "convergence_plot": dg.MetadataValue.md(inline_plot("convergence", curve, x_label="evaluation",
                                                            y_label=label, line=True)),
        "convergence_plot_full_size": dg.MetadataValue.md(png_markdown(
            "convergence", convergence_png(merge, dpi=FULL_SIZE_DPI), "convergence.png of the report")),
    }


def build_sweep_result(spec: SweepSpec) -> dg.AssetsDefinition:
    @dg.asset(**spec.common("sweep_result"), kinds={"pandas", "parquet"}, ins=_sweep_inputs(spec),
              deps=[spec.key("load_predictor_result")],  # lineage: the studies' samples carry its winners
              description="Stage 6: ranked candidates (scalar goal) or the Pareto front, merged over branches "
              "by goal. Deploy files are written downstream, only after the blocking checks pass.")
    def sweep_result(context: dg.AssetExecutionContext, filtered_config: pd.DataFrame,
                     branch_spaces: pd.DataFrame, branch_study: Any,
                     sweep_storage: SweepStorage) -> dg.Output[pd.DataFrame]:

        inputs = merged_inputs(context, spec, filtered_config, branch_spaces, branch_study)
        config, ledger = inputs.config, inputs.ledger
        try:
            merge = merge_for_config(ledger, config)
        except SpicaError as err:
            raise fail(err) from None
        candidates = arrow_safe(candidates_frame(merge.candidates, merge.objectives if merge.is_pareto else None,
                                                     target=merge.target))
        # warm-start state for the next run (not deploy output): the ledger and each branch's space hash
        output_dir = sweep_storage.output_dir(spec.name)
        atomic_write_parquet(output_dir / "ledger.parquet", arrow_safe(ledger))
        atomic_write_text(output_dir / SPACES_FILE, json.dumps(
            {str(r["deployment_mode"]): str(r["space_hash"]) for r in branch_spaces.to_dict("records")}, indent=2))
        sweep_storage.push(output_dir)

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
            metadata["hypervolume"] = _r(merge.hypervolume or 0.0)
            metadata["front_size"] = len(merge.candidates)
        elif merge.candidates:
            best = merge.candidates[0]
            metadata["best_score"] = _r(best.score)
            value = best.score if scoring.direction(merge.target) == "max" else -best.score
            metadata[f"best_{merge.target}"] = _r(value)
        metadata["ranked" if not merge.is_pareto else "front"] = candidates_table(
            candidates, merge.objectives if merge.is_pareto else None)
        metadata.update(result_plots(merge, config.goal.sla_thresholds()))
        metadata["output_dir"] = dg.MetadataValue.path(str(output_dir))
        context.log.info(merge.summary_line())
        return dg.Output(candidates, metadata=metadata)

    return sweep_result


def build_deploy(spec: SweepSpec, sweep_result: dg.AssetsDefinition) -> dg.AssetsDefinition:
    @dg.asset(**spec.common("deploy"), kinds={"kubernetes", "yaml"},
              ins={**_sweep_inputs(spec), "sweep_result": dg.AssetIn(spec.key("sweep_result"))},
              description="Deploy output: report.md, plots, deploy/<rank>/ manifests and recommendation.json, "
              "written by the report package. Runs only after sweep_result's blocking checks pass.")
    def deploy(context: dg.AssetExecutionContext, filtered_config: pd.DataFrame, branch_spaces: pd.DataFrame,
               branch_study: Any, sweep_result: pd.DataFrame,
               sweep_storage: SweepStorage) -> dg.MaterializeResult:
        inputs = merged_inputs(context, spec, filtered_config, branch_spaces, branch_study)
        output_dir = sweep_storage.output_dir(spec.name)
        try:
            merge, paths = write_results(output_dir, inputs.config, inputs.plans, inputs.ledger, inputs.timings)
        except SpicaError as err:
            raise fail(err) from None
        sweep_storage.push(output_dir)
        deploy_files = sorted(str(p.relative_to(output_dir)) for k, p in paths.items() if k.startswith("deploy_"))
        metadata: dict[str, Any] = {
            "report": dg.MetadataValue.path(str(paths["report"])),
            "output_dir": dg.MetadataValue.path(str(output_dir)),
            "deploy_files": len(deploy_files),
            "pareto_png": dg.MetadataValue.path(str(paths["pareto_png"])),
            "convergence_png": dg.MetadataValue.path(str(paths["convergence_png"])),
        }
        if "recommendation" in paths:
            metadata["recommendation"] = dg.MetadataValue.path(str(paths["recommendation"]))
        if deploy_files:
            metadata["deploy_dir"] = dg.MetadataValue.path(str(output_dir / "deploy"))
        return dg.MaterializeResult(metadata=metadata)

    return deploy
