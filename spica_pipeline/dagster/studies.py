"""Stage 5 asset: one study per deployment mode, a static partition each.

A partition runs its mode's study through `open_studies` / `StudySession.run`, the same lock,
journal and study loop as `spica sweep`: asynchronous dispatch on the evaluation backend (a free
worker gets the next suggestion), the sweep's time budget (shared equally by the searched modes,
since partitions may run in separate runs), and the anytime result (the branch's ledger and ranking
so far, rewritten atomically next to its journal after every batch). Evaluations and optimizer
suggestions go through a `FileJournal` keyed by the config hash (and the warm-start history), so a
retried or interrupted partition resumes where it stopped instead of replaying again. Only the
modes the sweep searches are partitions (read from its config at load).
"""

import hashlib
import json
import warnings
from pathlib import Path
from typing import Any

import dagster as dg
import pandas as pd
from pydantic import Field

from spica_pipeline.dagster.branches import branch_spaces_from_frame
from spica_pipeline.dagster.config import config_from_frame, fail, frame_value
from spica_pipeline.dagster.io import SweepStorage
from spica_pipeline.dagster.load_predictor import load_predictor_from_frame
from spica_pipeline.dagster.resources import EvaluationBackendResource
from spica_pipeline.dagster.spec import REPLAY_POOL, SweepSpec
from spica_pipeline.errors import SpicaError
from spica_pipeline.evaluate.evaluator import Evaluator
from spica_pipeline.jsonvalue import canonical_json, json_safe
from spica_pipeline.evaluate.pool import EvaluationBackend
from spica_pipeline.optimize.branch_plan import plan_branch
from spica_pipeline.optimize.ledger import STATUSES
from spica_pipeline.optimize.trial import BranchOutcome, HistoryItem
from spica_pipeline.optimize.timings import Timings
from spica_pipeline.optimize.vizier import VizierClient
from spica_pipeline.space.branches import BranchSpace
from spica_pipeline.sweep import AnytimeResult, RecordLog, ledger_frame, open_studies, warm_history_for

# the branch ledger's frame attribute carrying its study's Timings (Parquet keeps DataFrame.attrs),
# so the deploy asset reports the studies' real wall time, not its own
TIMINGS_ATTR = "spica_timings"

SPACES_FILE = "spaces.json"  # written next to the report: {mode: space_hash} of the last sweep


class BranchStudyConfig(dg.Config):
    """Per-run study options (the nightly schedule turns warm start on)."""

    warm_start: bool = Field(
        default=False,
        description="Seed each study with the previous sweep's trials of the same branch space, when unchanged",
    )


def previous_ledger(output_dir: Path, mode: str, space_hash: str) -> tuple[pd.DataFrame | None, str]:
    """The last sweep's ledger for warm start, only when this branch's space is unchanged."""
    ledger_path, spaces_path = output_dir / "ledger.parquet", output_dir / SPACES_FILE
    if not ledger_path.exists() or not spaces_path.exists():
        return None, f"no previous sweep in {output_dir}"
    previous = json.loads(spaces_path.read_text()).get(mode)
    if previous != space_hash:
        return None, f"the {mode} space changed since the previous sweep"
    return pd.read_parquet(ledger_path), "same space as the previous sweep"


def journal_key(config_hash: str, warm: list[HistoryItem]) -> str:
    warm_part = hashlib.sha256(canonical_json(json_safe(
        [[h.parameters, h.metrics, h.infeasible_reason] for h in warm])).encode()).hexdigest()
    return hashlib.sha256(f"{config_hash}:{warm_part if warm else ''}".encode()).hexdigest()


def study_partition(
    context: dg.AssetExecutionContext,
    mode: str,
    *,
    warm_start: bool,
    filtered_config: pd.DataFrame,
    load_predictor_result: pd.DataFrame,
    branch_spaces: pd.DataFrame,
    pool: EvaluationBackend,
    storage: SweepStorage,
    vizier: VizierClient,
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Run one branch study on `pool`; returns its ledger and the materialization metadata."""

    config = config_from_frame(filtered_config)
    spaces = branch_spaces_from_frame(branch_spaces)
    if mode not in spaces:
        reason = (f"deployment_mode '{mode}' is not searched by this config "
                  f"(deployment_mode: {list(config.search_space.deployment_mode)})"
                  if mode not in config.search_space.deployment_mode
                  else f"branch '{mode}' has no viable space (see branch_spaces warnings)")
        context.log.info(f"{mode}: {reason}; empty ledger")
        return ledger_frame([]), {"skipped": reason, "trials": 0}

    plan = plan_branch(BranchSpace.from_dict(spaces[mode]), config)
    row = branch_spaces[branch_spaces["deployment_mode"] == mode].iloc[0]
    warm: list[HistoryItem] = []
    warm_note = "off"
    if warm_start:
        output_dir = storage.output_dir(frame_value(filtered_config, "sweep_name"))
        storage.pull(output_dir)  # an object-store base_dir: last run's ledger and spaces.json
        prev, warm_note = previous_ledger(output_dir, mode, str(row["space_hash"]))
        warm = warm_history_for(prev, plan)
        if prev is not None and plan.exhaustive:
            warm_note = "exhaustive branch: warm start not used"
    key = journal_key(str(frame_value(filtered_config, "config_hash")), warm)
    journal_dir = storage.journal_dir(key, mode)
    load_predictor = load_predictor_from_frame(load_predictor_result)
    context.log.info(f"{mode}: {plan.why}; {len(warm)} warm-start trials; journal {journal_dir}")

    log = RecordLog()
    # the sweep's time budget, shared equally by the searched modes (the CLI shares it between the
    # branches as they run; partitions may run in separate runs, so each gets its share up front)
    budget = config.sweep.time_budget
    time_budget = None if budget is None else budget / max(1, len(spaces))

    anytime = AnytimeResult(journal_dir, config, log)  # the anytime result, as `spica sweep` writes it

    def on_round(result: BranchOutcome) -> None:
        context.log.info(f"{mode}: {result.evaluated} evaluated: {dict(result.counts)}")
        anytime.after_batch()

    try:
        with open_studies(journal_dir, store=storage) as session:
            for warning in session.journal.warnings:  # a torn last record cut back on open
                context.log.warning(warning)
            run = session.run([plan], config, load_predictor, backend=pool,
                              vizier=vizier, time_budget=time_budget, warm_history=lambda plan: warm,
                              on_record=log.append, on_round=on_round)
    except SpicaError as err:  # OutputDirBusy included: another run holds this journal
        raise fail(err) from None

    if anytime.pending:
        anytime.write()  # the last batches, which the write limit may have deferred
    outcome = run.outcomes[0]
    if outcome.out_of_time:
        context.log.info(f"{mode}: time budget ({time_budget:.0f} s) spent after {outcome.evaluated} evaluations")
    ledger = ledger_frame(outcome.records)
    ledger.attrs[TIMINGS_ATTR] = run.timings.to_dict()
    feasible = [r.score for r in outcome.records if r.status == "feasible" and r.score is not None]
    metadata: dict[str, Any] = {s: int(outcome.counts.get(s, 0)) for s in STATUSES}
    metadata.update({
        "trials": len(outcome.records),
        "mode": outcome.mode,
        "plan": plan.why,
        "rounds": int(outcome.rounds),
        "stalled": bool(outcome.stalled),
        "optimizer_seconds": round(float(outcome.optimizer_seconds), 2),
        "replay_seconds": round(float(outcome.replay_seconds), 2),
        "wall_seconds": round(run.timings.wall_seconds, 2),
        "resumed_journal_records": int(session.resumed_records),
        "warm_start_trials": len(warm),
        "warm_start": warm_note,
        "space_hash": str(row["space_hash"]),
        "journal": dg.MetadataValue.path(str(session.journal_path)),
        "evaluated": int(outcome.evaluated),
        "out_of_time": bool(outcome.out_of_time),
        "anytime_result": dg.MetadataValue.path(str(journal_dir / "candidates.csv")),
    })
    if time_budget is not None:
        metadata["time_budget_s"] = round(time_budget, 1)
    if feasible:
        metadata["best_score"] = round(float(max(feasible)), 4)
    return ledger, metadata


def build_branch_study(spec: SweepSpec) -> dg.AssetsDefinition:
    with warnings.catch_warnings():  # backfill_policy is beta in Dagster 1.13: quiet at every load
        warnings.simplefilter("ignore", dg.BetaWarning)

        @dg.asset(
            **spec.common("branch_study"),
            kinds={"pandas", "parquet"},
            description="Stage 5: the trial ledger of one deployment mode's study (a partition per searched mode)",
            partitions_def=dg.StaticPartitionsDefinition(list(spec.modes)),
            ins={"filtered_config": dg.AssetIn(spec.key("filtered_config")),
                 "load_predictor_result": dg.AssetIn(spec.key("load_predictor_result")),
                 "branch_spaces": dg.AssetIn(spec.key("branch_spaces"))},
            # a UI backfill runs one partition per run; the sweep job covers every mode in one run
            backfill_policy=dg.BackfillPolicy.multi_run(1),
            pool=REPLAY_POOL,
        )
        def branch_study(
            context: dg.AssetExecutionContext,
            config: BranchStudyConfig,
            filtered_config: pd.DataFrame,
            load_predictor_result: pd.DataFrame,
            branch_spaces: pd.DataFrame,
            replay: dg.ResourceParam[Evaluator],
            evaluation_backend: EvaluationBackendResource,
            vizier: dg.ResourceParam[VizierClient],
            sweep_storage: SweepStorage,
        ):
            keys = list(context.partition_keys)
            frames: dict[str, pd.DataFrame] = {}
            sweep = config_from_frame(filtered_config).sweep
            # one backend for every partition of this run: workers start on the first candidate and
            # stay warm (local spawned processes, or Ray actors: the evaluation_backend resource)
            with evaluation_backend.open(replay, sweep) as pool:
                for mode in keys:
                    frames[mode], md = study_partition(
                        context, mode, warm_start=config.warm_start, filtered_config=filtered_config,
                        load_predictor_result=load_predictor_result, branch_spaces=branch_spaces,
                        pool=pool, storage=sweep_storage, vizier=vizier)
                    md["dagster/row_count"] = len(frames[mode])
                    context.add_asset_metadata(md, partition_key=mode)
            return frames if len(keys) > 1 else frames[keys[0]]

    return branch_study


def study_timings(ledger: pd.DataFrame) -> Timings:
    """The Timings a branch_study partition stored on its ledger (zero for a skipped mode)."""
    return Timings(**ledger.attrs.get(TIMINGS_ATTR, {}))
