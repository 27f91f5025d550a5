"""The sweep stages as plain functions, shared by the CLI and the Dagster assets.

    preflight (preflight.py: every check before a replay, names resolved, planner policies
        filtered, branches enumerated) -> load-predictor sub-sweep -> one study per branch -> merge by goal

Each stage takes and returns plain values, so a Dagster asset is a thin wrapper around one call.
`run_sweep` chains them for the CLI, with an on-disk journal so an interrupted sweep resumes.
"""

import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Protocol, Sequence

import pandas as pd

from spica_pipeline.config import SmartSearchConfig
from spica_pipeline.errors import ModelHardwareError
from spica_pipeline.evaluate.evaluator import EvalOutcome, EvalRequest, Evaluator
from spica_pipeline.evaluate.pool import ENGINE_LOG, EvaluationPool
from spica_pipeline.evaluate.ray_pool import RayEvaluationPool
from spica_pipeline.evaluate.replay import ReplayEvaluator
from spica_pipeline.fidelity.profile import heldout_check, load_profile
from spica_pipeline.optimize.branch_plan import (
    BranchPlan,
    StudySampler,
    branch_seed,
    candidate_builder,
    exhaustive_points,
    local_designer,
    plan_branch,
    scorer,
    study_metrics,
    study_settings,
)
from spica_pipeline.optimize.journal import JOURNAL_NAME, FileJournal, RunLock
from spica_pipeline.optimize.ledger import TrialRecord
from spica_pipeline.optimize.study import run_branch_study
from spica_pipeline.optimize.trial import BranchOutcome, HistoryItem, Journal, Proposal, TrialCounter
from spica_pipeline.optimize.timings import Timings
from spica_pipeline.optimize.vizier import VizierClient
from spica_pipeline.preflight import check_calibration, check_workload, preflight
from spica_pipeline.report import merge_for_config, write_outputs
from spica_pipeline.report.dgd import DeployOptions
from spica_pipeline.report.tables import candidates_frame
from spica_pipeline.space.branches import BranchEnumeration, BranchSpace, enumerate_branches
from spica_pipeline.space.load_predictor.from_trace import load_predictor_for_config
from spica_pipeline.space.model_hw import hardware_facts
from spica_pipeline.space.policies import PolicyFilterResult, filter_scaling_policies
from spica_pipeline.space.shapes import ParallelConfig, parallel_config_from_dict
from spica_pipeline.storage import atomic_write_parquet, atomic_write_text, file_sha256

if TYPE_CHECKING:
    from spica_pipeline.evaluate.pool import EvaluationBackend
    from spica_pipeline.optimize.vizier import VizierClient
    from spica_pipeline.report.dgd import DeployOptions
    from spica_pipeline.report.merge import MergeResult
    from spica_pipeline.space.load_predictor import LoadPredictorResult

# Bump when anything in the evaluator changes what a replay returns for the same spec: it is part
# of every spec hash, so old journal entries stop matching instead of being reused wrongly.
EVALUATOR_FIDELITY = "replay-1.6.1/aic-0.12.0/npz-v1/window-v1"  # window-v1: ramped closed loop, steady-state window


# --------------------------------------------------------------------------------------------
# stages 2-4: policy filter, load predictor, branches
# --------------------------------------------------------------------------------------------

@dataclass
class PreparedSweep:
    """Everything the studies need, computed once per sweep."""

    config: SmartSearchConfig  # after the policy filter
    dropped_policies: list[dict[str, Any]]
    load_predictor: "LoadPredictorResult | None"
    branches: list[BranchSpace]
    warnings: list[str]
    diagnostics: dict[str, Any] = field(default_factory=dict)


def filter_policies(config: SmartSearchConfig) -> PolicyFilterResult:

    return filter_scaling_policies(config)


def predict_load(config: SmartSearchConfig) -> "LoadPredictorResult":

    return load_predictor_for_config(config)


def enumerate_branch_spaces(config: SmartSearchConfig) -> BranchEnumeration:

    return enumerate_branches(config)


def prepare(config: SmartSearchConfig) -> PreparedSweep:
    """The preflight (every refusal before the first replay, names resolved), then the load predictor."""
    checked = preflight(config)
    filtered, enumeration = checked.filtered, checked.enumeration
    load_predictor = predict_load(filtered.config)
    return PreparedSweep(
        config=filtered.config, dropped_policies=list(filtered.dropped), load_predictor=load_predictor,
        branches=list(enumeration.branches), warnings=checked.warnings, diagnostics=enumeration.diagnostics,
    )


# --------------------------------------------------------------------------------------------
# stage 5: one study per branch
# --------------------------------------------------------------------------------------------

def evaluation_context(config: SmartSearchConfig, load_predictor: "LoadPredictorResult | None") -> dict[str, Any]:
    """What, besides the sample, changes a replay's result (part of every spec hash)."""
    context: dict[str, Any] = {"fidelity": EVALUATOR_FIDELITY}
    if load_predictor is not None:
        context["load_predictor"] = load_predictor.to_dict()
    if config.workload.trace_path:
        context["trace_sha256"] = file_sha256(config.workload.trace_path)

    check_calibration(config)  # ConfigError (exit 2) names a bad file or a profile without fixed-length factors
    profile, digest = load_profile(config.evaluation.calibration)
    if profile is not None:  # the setting, not an absolute path: the hash stays the same across machines
        context["calibration"] = {"setting": config.evaluation.calibration, "sha256": digest}
    if config.evaluation.client_lengths == "fixed":  # only then: every other sweep keeps its spec hashes
        context["client_lengths"] = "fixed"
    return context


def run_branch(
    plan: BranchPlan,
    config: SmartSearchConfig,
    load_predictor: "LoadPredictorResult | None",
    *,
    evaluate_wave: Callable[[list[EvalRequest]], list[EvalOutcome]] | None = None,
    backend: "EvaluationBackend | None" = None,
    vizier: "VizierClient",
    journal: Journal | None = None,
    counter: TrialCounter | None = None,
    warm_history: Iterable[HistoryItem] = (),
    on_record: Callable[[TrialRecord], None] | None = None,
    on_round: Callable[[BranchOutcome], None] | None = None,
    deadline: float | None = None,
    neighbourhood: bool = True,
) -> BranchOutcome:
    """One branch study: exhaustive enumeration, or a Vizier study opened here. With `backend` (an
    EvaluationBackend) dispatch is asynchronous; with only `evaluate_wave`, in rounds of waves.
    `deadline` (time.monotonic seconds): no new trial starts after it. `neighbourhood=False`: the
    Vizier study alone, without this product's neighbourhood designer (the benchmarks' stock baseline)."""
    mode = plan.branch.deployment_mode
    points: Iterable[Proposal] | None = None
    if plan.exhaustive:
        sampler = StudySampler(None, plan.encoding)
        points = exhaustive_points(plan.encoding)
    else:
        seed = branch_seed(config, mode)
        study = vizier.open_study(plan.encoding, study_metrics(config.goal), seed=seed,
                                  algorithm=config.sweep.algorithm)
        local = local_designer(config, plan.encoding, seed) if neighbourhood else None
        sampler = StudySampler(study, plan.encoding, local)
    build = candidate_builder(config, load_predictor, evaluation_context(config, load_predictor))
    return run_branch_study(
        mode, sampler, build, evaluate_wave, scorer(config.goal), study_settings(config, deadline),
        journal=journal, counter=counter, warm_history=warm_history, exhaustive_points=points,
        on_record=on_record, on_round=on_round, backend=backend,
    )


class JournalStore(Protocol):
    """Where a journal directory lives besides this disk (Dagster's SweepStorage: an object store)."""

    def pull(self, local: Path) -> None: ...

    def push(self, local: Path) -> None: ...


@dataclass
class StudiesRun:
    """What `StudySession.run` produced: one outcome per plan, in plan order, and the time spent."""

    outcomes: list[BranchOutcome]
    timings: Timings


class StudySession:
    """The branch studies of one locked journal directory (see `open_studies`). The journal opens
    on first use, so a config refused before any study leaves no journal behind."""

    def __init__(self, directory: Path, *, repair: bool = False) -> None:
        self.directory = directory
        self.repair = repair
        self.counter = TrialCounter()  # trial numbers run on across the branches of this session
        self._journal: FileJournal | None = None

    @property
    def journal(self) -> FileJournal:
        if self._journal is None:
            self._journal = FileJournal(self.directory / JOURNAL_NAME, repair=self.repair)
        return self._journal

    @property
    def resumed_records(self) -> int:
        return self.journal.loaded_records

    @property
    def journal_path(self) -> Path:
        return self.directory / JOURNAL_NAME

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()

    def run(
        self,
        plans: Sequence[BranchPlan],
        config: SmartSearchConfig,
        load_predictor: "LoadPredictorResult | None",
        *,
        evaluate_wave: Callable[[list[EvalRequest]], list[EvalOutcome]] | None = None,
        backend: "EvaluationBackend | None" = None,
        vizier: "VizierClient",
        time_budget: float | None = None,
        warm_history: Callable[[BranchPlan], Iterable[HistoryItem]] = lambda plan: (),
        on_branch: Callable[[BranchPlan], None] | None = None,
        on_record: Callable[[TrialRecord], None] | None = None,
        on_round: Callable[[BranchOutcome], None] | None = None,
        on_done: Callable[[BranchOutcome], None] | None = None,
    ) -> StudiesRun:
        """Run each plan's study in order, journalled; the wall time covers exactly these studies.
        `time_budget` (seconds, `sweep.time_budget`): the time left is shared equally by the
        branches still to run."""
        started = time.perf_counter()
        budget_end = None if time_budget is None else time.monotonic() + time_budget
        outcomes: list[BranchOutcome] = []
        for index, plan in enumerate(plans):
            deadline = (None if budget_end is None else
                        time.monotonic() + (budget_end - time.monotonic()) / (len(plans) - index))
            if on_branch:
                on_branch(plan)
            outcome = run_branch(plan, config, load_predictor, evaluate_wave=evaluate_wave, backend=backend,
                                 vizier=vizier, journal=self.journal, counter=self.counter,
                                 warm_history=warm_history(plan), on_record=on_record, on_round=on_round,
                                 deadline=deadline)
            outcomes.append(outcome)
            if on_done:
                on_done(outcome)
        return StudiesRun(outcomes, Timings.of(outcomes, time.perf_counter() - started))


@contextmanager
def open_studies(directory: str | Path, store: JournalStore | None = None, *,
                 repair: bool = False) -> Iterator[StudySession]:
    """The one lock + journal sequence of the CLI sweep and the Dagster studies alike: lock the
    directory (a second sweep on it fails with OutputDirBusy), pull its journal from `store`, open it
    (an interrupted run resumes from it; `repair` quarantines damaged records instead of refusing
    it), and on the way out close it and push it back."""
    directory = Path(directory)
    with RunLock(directory):
        if store is not None:
            store.pull(directory)
        session = StudySession(directory, repair=repair)
        try:
            yield session
        finally:
            session.close()
            if store is not None:
                store.push(directory)


# --------------------------------------------------------------------------------------------
# the whole sweep (CLI path)
# --------------------------------------------------------------------------------------------

@dataclass
class SweepResult:
    config: SmartSearchConfig
    prepared: PreparedSweep
    plans: list[BranchPlan]
    branches: list[BranchOutcome]
    ledger: pd.DataFrame
    merge: "MergeResult"
    outputs: dict[str, Path] = field(default_factory=dict)
    timings: Timings = field(default_factory=Timings)
    resumed_records: int = 0


def ledger_frame(records: Iterable[TrialRecord]) -> pd.DataFrame:
    return rows_frame([r.to_row() for r in records])


def rows_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    if not rows:
        return pd.DataFrame(columns=list(TrialRecord.__dataclass_fields__))
    return pd.DataFrame(rows)


class RecordLog:
    """The trials of a running sweep, each turned into its ledger row once, when it arrives.

    The anytime result is rewritten after every batch; rebuilding every row each time would make a
    long sweep quadratic in its trials (bench/spaces/large_disagg.yaml). A record is final when it
    is emitted.
    """

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def append(self, record: TrialRecord) -> None:
        self.rows.append(record.to_row())

    def frame(self) -> pd.DataFrame:
        return rows_frame(self.rows)


def run_sweep(
    config: SmartSearchConfig,
    output_dir: str | Path,
    *,
    evaluator: "Evaluator | None" = None,
    vizier: "VizierClient | None" = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
    warm_start_ledger: pd.DataFrame | None = None,
    repair: bool = False,
) -> SweepResult:
    """Run all stages, journalling to `output_dir` so a rerun resumes, and write the outputs.
    `repair` quarantines damaged journal records instead of refusing the journal (`--repair`)."""
    output_dir = Path(output_dir)
    emit = progress or (lambda event: None)
    started = time.perf_counter()
    with open_studies(output_dir, repair=repair) as session:
        prepared = prepare(config)
        config = prepared.config
        for warning in prepared.warnings:
            emit({"event": "warning", "message": warning})
        plans = [plan_branch(branch, config) for branch in prepared.branches]
        for plan in plans:
            emit({"event": "plan", "branch": plan.branch.deployment_mode, "why": plan.why,
                  "exhaustive": plan.exhaustive, "size": plan.finite_size})
        for warning in session.journal.warnings:  # the journal opens here, once the config is good
            emit({"event": "warning", "message": warning})
        if session.resumed_records:
            emit({"event": "resume", "records": session.resumed_records})
        evaluator = evaluator if evaluator is not None else default_evaluator()
        vizier = vizier if vizier is not None else default_vizier()
        log = RecordLog()

        def on_record(rec: TrialRecord) -> None:
            log.append(rec)
            emit({"event": "trial", "record": rec})

        anytime = AnytimeResult(output_dir, config, log)

        def on_round(result: BranchOutcome) -> None:
            emit({"event": "round", "branch": result.branch, "round": result.rounds})
            anytime.after_batch()

        def on_done(outcome: BranchOutcome) -> None:
            if outcome.out_of_time:
                emit({"event": "out_of_time", "branch": outcome.branch, "evaluated": outcome.evaluated})
            if outcome.stopped:
                emit({"event": "stopped", "branch": outcome.branch, "reason": outcome.stopped})
            elif outcome.stalled:
                emit({"event": "stalled", "branch": outcome.branch, "rounds": outcome.rounds})

        try:
            with make_pool(evaluator, config.sweep.eval_workers, config.sweep.max_eval_seconds,
                           executor=config.sweep.executor, ray_address=config.sweep.ray_address,
                           log_path=output_dir / ENGINE_LOG) as pool:
                run = session.run(
                    plans, config, prepared.load_predictor, backend=pool,
                    vizier=vizier, time_budget=config.sweep.time_budget,
                    warm_history=lambda plan: warm_history_for(warm_start_ledger, plan),
                    on_branch=lambda plan: emit({"event": "branch", "branch": plan.branch.deployment_mode,
                                                 "exhaustive": plan.exhaustive}),
                    on_record=on_record, on_round=on_round, on_done=on_done,
                )
        except KeyboardInterrupt:
            if anytime.pending:
                anytime.write()  # Ctrl-C: the ranking of every finished trial, then stop
            raise
        finally:
            _write_partial_ledger(output_dir, log)

        ledger = log.frame()
        timings = replace(run.timings, wall_seconds=time.perf_counter() - started)  # prepare included
        merge, paths = write_results(output_dir, config, plans, ledger, timings)
    return SweepResult(config, prepared, plans, run.outcomes, ledger, merge, paths, timings,
                       session.resumed_records)


def write_results(output_dir: Path, config: SmartSearchConfig, plans: list[BranchPlan], ledger: pd.DataFrame,
                  timings: Timings) -> tuple["MergeResult", dict[str, Path]]:
    """Stage 6: merge the branch ledgers by goal and write every artifact; returns (merge, paths)."""

    merge = merge_for_config(ledger, config)
    paths = write_outputs(
        output_dir, ledger, merge,
        goal_summary=goal_summary(config),
        workload_summary=workload_summary(config),
        timings=timings.to_dict(),
        branch_notes=branch_notes(plans, ledger),
        top_n=config.deploy.top_n,
        deploy_options=deploy_options(config),
        config_json=config.model_dump(mode="json"),
        heldout_check=heldout_check(config.evaluation.calibration, client_lengths=config.evaluation.client_lengths),
    )
    return merge, paths


def branch_notes(plans: list[BranchPlan], ledger: pd.DataFrame) -> dict[str, str]:
    """Per branch: how it was searched, how many points its space has and how many were evaluated
    (trials that reused an earlier trial's outcome are not counted)."""
    notes = {}
    for plan in plans:
        mode = plan.branch.deployment_mode
        rows = ledger[ledger["branch"] == mode] if not ledger.empty else ledger
        evaluated = int((rows["status"] != "cached").sum()) if not rows.empty else 0
        if plan.finite_size:
            seen = f"evaluated {evaluated:,} of {plan.finite_size:,} points ({evaluated / plan.finite_size:.2%})"
        else:
            seen = f"evaluated {evaluated:,} points of a continuous space"
        notes[mode] = f"{plan.why}; {seen}"
    return notes


def deploy_options(config: SmartSearchConfig) -> "DeployOptions":
    """DGD rendering options from `deploy:`; the node size defaults to the hardware's AIC system spec."""

    d = config.deploy
    gpus_per_node = d.gpus_per_node
    if gpus_per_node is None:

        try:
            gpus_per_node = hardware_facts(config.search_space.hardware_sku).gpus_per_node
        except ModelHardwareError:
            gpus_per_node = None
    return DeployOptions(api_version=d.api_version, image=d.image, planner_image=d.planner_image,
                         gpus_per_node=gpus_per_node, hf_token_secret=d.hf_token_secret,
                         served_model=d.served_model)


def goal_summary(config: SmartSearchConfig) -> dict[str, Any]:
    goal = config.goal
    return {
        "target": goal.target.value,
        "objectives": goal.objective_names(),
        "sla": goal.sla_thresholds(),
        "gpu_budget": dict(config.search_space.gpu_budget_by_type or {}) or config.search_space.gpu_budget,
        "model": config.search_space.model_name,
        "hardware": hardware_text(config.search_space),
    }


def hardware_text(space: Any) -> str:
    """The GPU type(s) a sweep runs on, as report.md states them: hardware_sku, or with disagg roles on their
    own types each role's ('h100_sxm (prefill), h200_sxm (decode)'; a searched list joined by ' or ')."""
    if not getattr(space, "split_systems", False):
        return str(space.hardware_sku)
    roles = {role: " or ".join(space.role_systems(role)) for role in ("prefill", "decode")}
    text = f"{roles['prefill']} (prefill), {roles['decode']} (decode)"
    return f"{space.hardware_sku} (agg), {text}" if "agg" in space.deployment_mode else text


def workload_summary(config: SmartSearchConfig) -> dict[str, Any]:
    """The workload as the report states it, with the benchmark client's lengths when they are not the default."""
    fixed = {"client_lengths": "fixed"} if config.evaluation.client_lengths == "fixed" else {}
    return {"shape": config.workload.shape, **config.workload.model_dump(mode="json", exclude_none=True), **fixed}


def warm_history_for(ledger: pd.DataFrame | None, plan: BranchPlan) -> list[HistoryItem]:
    """Trials of an earlier sweep of the same branch space, re-encoded for this study."""
    if ledger is None or ledger.empty or plan.exhaustive:
        return []
    items = []
    for row in ledger[ledger["branch"] == plan.branch.deployment_mode].to_dict("records"):
        rec = TrialRecord.from_row(row)
        try:
            parameters = plan.encoding.encode(rec.selection, _config_of(rec))
        except (ValueError, KeyError, TypeError):
            continue  # the space changed: this trial has no place in the new study
        items.append(HistoryItem(parameters, rec.told_metrics, None if rec.told_metrics else rec.reason))
    return items


def _config_of(rec: TrialRecord) -> ParallelConfig:

    return parallel_config_from_dict(rec.parallel_config)


def default_evaluator() -> Evaluator:

    return ReplayEvaluator()


def default_vizier() -> "VizierClient":

    return VizierClient()


def make_pool(evaluator: Evaluator, workers: int, max_eval_seconds: float | None, *, executor: str = "local",
              ray_address: str | None = None, log_path: Path | None = None) -> "EvaluationBackend":
    """The evaluation backend `sweep.executor` names (the `EvaluationBackend` of evaluate/pool.py);
    `log_path`: where its workers' replay-runtime output goes (see evaluate/pool.send_engine_output)."""
    if executor == "ray":

        return RayEvaluationPool(evaluator, workers, max_eval_seconds, address=ray_address, log_path=log_path)

    return EvaluationPool(evaluator, workers=workers, max_eval_seconds=max_eval_seconds, log_path=log_path)


def write_anytime(output_dir: Path, config: SmartSearchConfig, log: RecordLog) -> None:
    """The anytime result, after every batch: the ledger and the ranking (or front) so far, each
    replaced atomically, so a deadline or Ctrl-C always leaves a valid, current result."""

    ledger = log.frame()
    atomic_write_parquet(output_dir / "ledger.parquet", ledger)
    merge = merge_for_config(ledger, config)
    table = candidates_frame(merge.candidates, merge.objectives if merge.is_pareto else None)
    atomic_write_parquet(output_dir / "candidates.parquet", table)
    atomic_write_text(output_dir / "candidates.csv", table.to_csv(index=False))


class AnytimeResult:
    """When to rewrite the anytime result: after every batch, unless the last write cost more than
    `share` of the time since it ended (a long sweep's ranking grows with every trial; without the
    limit the rewrites take a large share of the main thread on bench/spaces/large_disagg.yaml).
    The ledger is also written when the sweep stops for any reason,
    and the ranking on Ctrl-C, so both are current whenever the sweep ends.
    """

    def __init__(self, output_dir: Path, config: SmartSearchConfig, log: RecordLog, share: float = 0.1,
                 clock: Callable[[], float] = time.perf_counter):
        self.output_dir, self.config, self.log, self.share, self.clock = output_dir, config, log, share, clock
        self.pending = False
        self._ready_at = 0.0

    def after_batch(self) -> None:
        self.pending = True
        if self.clock() >= self._ready_at:
            self.write()

    def write(self) -> None:
        started = self.clock()
        write_anytime(self.output_dir, self.config, self.log)
        ended = self.clock()
        self.pending, self._ready_at = False, ended + (ended - started) / self.share


def _write_partial_ledger(output_dir: Path, log: RecordLog) -> None:

    atomic_write_parquet(output_dir / "ledger.parquet", log.frame())


__all__ = [
    "AnytimeResult", "JournalStore", "PreparedSweep", "RecordLog", "StudiesRun", "StudySession", "SweepResult",
    "check_calibration", "check_workload", "enumerate_branch_spaces", "preflight",
    "evaluation_context", "filter_policies", "ledger_frame", "open_studies", "predict_load", "prepare",
    "run_branch", "run_sweep",
]
