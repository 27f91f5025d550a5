"""The sweep stages as plain functions, shared by the CLI and the Dagster assets.

    validate -> filter planner policies -> load-predictor sub-sweep -> enumerate branches
        -> one study per branch -> merge by goal

Each stage takes and returns plain values, so a Dagster asset is a thin wrapper around one call.
`run_sweep` chains them for the CLI, with an on-disk journal so an interrupted sweep resumes.
"""

import hashlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Collection
from typing import Any, Callable, Iterable

import pandas as pd

from spica_pipeline.config import SmartSearchConfig, target_direction
from spica_pipeline.journal import FileJournal, RunLock
from spica_pipeline.search import scoring
from spica_pipeline.search.encoding import SearchEncoding, build_encoding, enumerate_space
from spica_pipeline.search.evaluation import EvalOutcome, EvalRequest
from spica_pipeline.search.ledger import TrialRecord
from spica_pipeline.search.model_hw import latest_backend_version
from spica_pipeline.search.sample import router_repeats_for, unroll_sample
from spica_pipeline.search.shapes import ParallelConfig
from spica_pipeline.search.study import (
    BranchOutcome,
    HistoryItem,
    Journal,
    Proposal,
    Scored,
    StudySettings,
    TrialCounter,
    run_branch_study,
    selection_key,
)

log = logging.getLogger("spica_pipeline.sweep")

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
    load_predictor: Any  # LoadPredictorResult
    branches: list[Any]  # BranchSpace
    warnings: list[str]
    diagnostics: Any = None


def check_workload(config: SmartSearchConfig) -> list[str]:
    """Stage 1 workload checks: a trace is read whole once, so a malformed line or a request whose
    input + output is longer than the model's context is one error naming file and line; a synthetic
    isl + osl over the context is one error naming the fields; the resource sanity limits
    (config/limits.py) refuse what no replay can serve. Never a failure per candidate.
    Returns the trace's warnings (one line each, with a count)."""
    from spica_pipeline.config.limits import check_resource_limits
    from spica_pipeline.errors import ConfigError, SpicaError
    from spica_pipeline.search.parallel import resolve_max_seq_len
    from spica_pipeline.traces import read_mooncake_trace

    space = config.search_space
    workload = config.workload
    if not workload.trace_path:
        check_resource_limits(config)
        if workload.isl is not None and workload.osl is not None:
            try:
                context = resolve_max_seq_len(space.model_name, space.context_length)
            except SpicaError:
                return []  # an unknown model or context: stage 3 reports it with its own message
            if workload.isl + workload.osl > context:
                raise ConfigError(f"workload.isl {workload.isl} + workload.osl {workload.osl} = "
                                  f"{workload.isl + workload.osl} tokens exceeds the context length {context} "
                                  "of the model (search_space.context_length or the model's own): input and "
                                  "output must both fit")
        return []
    trace = read_mooncake_trace(config.workload.trace_path,
                                max_input_length=resolve_max_seq_len(space.model_name, space.context_length))
    check_resource_limits(config, trace)
    return list(trace.warnings)


def filter_policies(config: SmartSearchConfig):
    from spica_pipeline.search.policies import filter_scaling_policies

    return filter_scaling_policies(config)


def predict_load(config: SmartSearchConfig):
    from spica_pipeline.load_prediction import load_predictor_for_config

    return load_predictor_for_config(config)


def enumerate_branch_spaces(config: SmartSearchConfig):
    from spica_pipeline.search.branches import enumerate_branches

    return enumerate_branches(config)


def prepare(config: SmartSearchConfig) -> PreparedSweep:
    trace_warnings = check_workload(config)
    filtered = filter_policies(config)
    enumeration = enumerate_branch_spaces(filtered.config)
    load_predictor = predict_load(filtered.config)
    return PreparedSweep(
        config=filtered.config, dropped_policies=list(filtered.dropped), load_predictor=load_predictor,
        branches=list(enumeration.branches),
        warnings=trace_warnings + ([filtered.summary()] if filtered.dropped else []) + list(enumeration.warnings),
        diagnostics=enumeration.diagnostics,
    )


# --------------------------------------------------------------------------------------------
# stage 5: one study per branch
# --------------------------------------------------------------------------------------------

def objective_names(config: SmartSearchConfig) -> list[str]:
    return [t.value for t in config.goal.objectives()]


def evaluation_context(config: SmartSearchConfig, load_predictor: Any) -> dict[str, Any]:
    """What, besides the sample, changes a replay's result (part of every spec hash)."""
    context: dict[str, Any] = {"fidelity": EVALUATOR_FIDELITY}
    if load_predictor is not None and hasattr(load_predictor, "to_dict"):
        context["load_predictor"] = load_predictor.to_dict()
    if config.workload.trace_path:
        context["trace_sha256"] = _file_sha256(config.workload.trace_path)
    from spica_pipeline.resources.calibration import load_profile

    profile, digest = load_profile(config.evaluation.calibration)  # ConfigError (exit 2) names a bad file
    if profile is not None:  # the setting, not an absolute path: the hash stays the same across machines
        context["calibration"] = {"setting": config.evaluation.calibration, "sha256": digest}
    return context


def candidate_builder(config: SmartSearchConfig, load_predictor: Any) -> Callable[..., EvalRequest]:
    """Main-process candidate build: unroll, resolve the perf-DB version, attach the context."""
    workload = config.workload.model_dump(mode="json")
    goal = config.goal.model_dump(mode="json")
    context = evaluation_context(config, load_predictor)
    repeats = config.sweep.router_repeats

    def build(selection: dict[str, Any], parallel_config: ParallelConfig) -> EvalRequest:
        sample = unroll_sample(config.search_space, selection, parallel_config, load_predictor)
        sample["backend_version"] = latest_backend_version(sample["hardware_sku"], sample["backend"])
        if config.workload.concurrency is not None:
            sample["concurrency"] = config.workload.concurrency
        if "kv_load_ratio" in selection:  # searched (a range) or injected as a constant (a scalar)
            sample["kv_load_ratio"] = float(selection["kv_load_ratio"])
        ctx = dict(context, router_repeats=router_repeats_for(sample, repeats))
        return EvalRequest(sample=sample, workload=workload, goal=goal, context=ctx)

    return build


def scorer(config: SmartSearchConfig) -> Callable[[EvalOutcome], Scored]:
    """Turn a feasible report into the score, objectives and what Vizier is told."""
    goal = config.goal
    names = objective_names(config)

    sla = goal.sla.model_dump(exclude_none=True) if goal.sla else None

    def score(outcome: EvalOutcome) -> Scored:
        report = outcome.report or {}
        passes, why = scoring.sla_gate(report, sla, goal.sla_gate)
        if not passes:
            return Scored(None, None, None, reason=why)
        if goal.is_pareto:
            objectives = scoring.objective_vector(names, report)
            if not all(_finite(v) for v in objectives.values()):
                return Scored(None, objectives, None, reason="replay report lacks an objective metric")
            return Scored(objectives[names[0]], objectives, dict(objectives))
        value = scoring.score(goal.target.value, report)
        if not _finite(value):
            return Scored(None, None, None, reason=f"replay report has no value for {goal.target.value}")
        return Scored(value, None, {"objective": value})

    return score


def study_metrics(config: SmartSearchConfig) -> list[tuple[str, str]]:
    if config.goal.is_pareto:
        return [(name, target_direction(name)) for name in objective_names(config)]
    return [("objective", "max")]  # the caller pre-signs the score


class VizierSampler:
    """Study loop sampler over a Vizier study: suggest, then decode and project."""

    def __init__(self, study: Any, encoding: SearchEncoding):
        self.study = study
        self.encoding = encoding

    def suggest(self, count: int, history: list[HistoryItem]) -> list[dict[str, Any]]:
        items = [(h.parameters, h.metrics, h.infeasible_reason) for h in history]
        return [dict(p) for p in self.study.suggest(count, items)]

    def suggest_pending(self, count: int, history: list[HistoryItem], pending: list[dict[str, Any]],
                        cheap: bool) -> tuple[list[dict[str, Any]], str]:
        """The asynchronous loop's ask: in-flight trials as pending; `cheap` fills from the
        quasi-random designer (the cost-aware policy). Returns the designer that answered."""
        items = [(h.parameters, h.metrics, h.infeasible_reason) for h in history]
        out = self.study.suggest(count, items, pending, algorithm="QUASI_RANDOM_SEARCH" if cheap else None)
        return [dict(p) for p in out], self.study.last_designer

    @property
    def designer(self) -> str:
        return getattr(self.study, "last_designer", "") or "vizier"

    def propose(self, parameters: dict[str, Any], taken: Collection[tuple[str, ParallelConfig]] = ()) -> Proposal:
        return propose(self.encoding, parameters, taken)


def propose(encoding: SearchEncoding, parameters: dict[str, Any],
            taken: Collection[tuple[str, ParallelConfig]] = ()) -> Proposal:
    """Decode and project one suggestion, steering away from points already proposed."""
    selection, requested = encoding.decode(parameters)
    if encoding.pinned_config is not None:
        config, meta = encoding.pinned_config, None
    else:
        key = selection_key(selection)
        exclude = [c for c in encoding.parallel_configs if (key, c) in taken] if taken else []
        try:
            projection = encoding.project(selection, requested, exclude)
        except ValueError as exc:
            return Proposal(parameters, selection, encoding.parallel_configs[0], None, supported=False,
                            unsupported_reason=str(exc))
        config, meta = projection.config, projection.to_dict()
        if exclude:
            nearest = encoding.project(selection, requested).config
            meta["moved_to_unevaluated"] = nearest != config
    index = encoding.parallel_configs.index(config)
    backend = selection.get("backend")
    supported = backend is None or backend in encoding.supported_backends[index]
    return Proposal(parameters, selection, config, meta, supported=supported)


def exhaustive_points(encoding: SearchEncoding) -> Iterable[Proposal]:
    for selection, config in enumerate_space(encoding):
        yield Proposal(encoding.encode(selection, config), selection, config, None)


@dataclass
class BranchPlan:
    """How one branch will be searched, decided before any trial runs."""

    branch: Any
    encoding: SearchEncoding
    finite_size: int | None
    budget: int  # evaluations the rapid policy would spend
    exhaustive: bool
    why: str


def finite_points(encoding: SearchEncoding) -> int | None:
    """How many legal points `enumerate_space` would yield, counted without enumerating them:
    the other knobs' product times, per pool config, the selectable backends that support it."""
    if not encoding.is_finite:
        return None
    knobs = [p.name for p in encoding.params if p.role == "knob"]
    product = 1
    for name in knobs:
        if name != "backend":
            product *= len(encoding.knob_entries[name])
    backends = (encoding.knob_entries["backend"] if "backend" in knobs
                else (encoding.constants.get("backend"),))
    pairs = sum(sum(1 for b in backends if b is None or b in supported)
                for supported in encoding.supported_backends)
    return product * pairs


def plan_branch(branch: Any, config: SmartSearchConfig) -> BranchPlan:
    encoding = build_encoding(branch)
    from spica_pipeline.config.sweep import DEFAULT_MAX_ROUNDS

    # Only a time budget: a space a default trial budget would cover is still enumerated.
    budget = config.sweep.evaluation_budget or DEFAULT_MAX_ROUNDS * config.sweep.per_round
    size = finite_points(encoding)
    if config.sweep.policy == "thorough":
        return BranchPlan(branch, encoding, size, budget, True, f"policy thorough: all {size} points")
    if size is not None and size <= budget:
        return BranchPlan(branch, encoding, size, budget, True,
                          f"finite space of {size} points <= evaluation budget {budget}: enumerated exhaustively")
    why = (f"space of {size} points > evaluation budget {budget}" if size is not None
           else "continuous space")
    return BranchPlan(branch, encoding, size, budget, False, f"{why}: Vizier {config.sweep.algorithm}")


def run_branch(
    plan: BranchPlan,
    config: SmartSearchConfig,
    load_predictor: Any,
    *,
    evaluate_wave: Callable[[list[EvalRequest]], list[EvalOutcome]],
    vizier: Any,
    journal: Journal | None = None,
    counter: TrialCounter | None = None,
    warm_history: Iterable[HistoryItem] = (),
    on_record: Callable[[TrialRecord], None] | None = None,
    on_round: Callable[[BranchOutcome], None] | None = None,
    deadline: float | None = None,
    backend: Any = None,
) -> BranchOutcome:
    """One branch study. With `backend` (an EvaluationBackend) dispatch is asynchronous; with only
    `evaluate_wave`, in rounds of waves."""
    settings = StudySettings(deadline=deadline, optimizer_share=config.sweep.optimizer_share, per_round=config.sweep.per_round, max_rounds=config.sweep.max_rounds,
                             workers=max(1, min(config.sweep.parallel_evals, config.sweep.per_round)),
                             failure_breaker=config.sweep.failure_breaker)
    mode = plan.branch.deployment_mode
    if plan.exhaustive:
        sampler: Any = VizierSampler(None, plan.encoding)
        points = exhaustive_points(plan.encoding)
    else:
        study = vizier.open_study(plan.encoding, study_metrics(config), seed=_branch_seed(config, mode),
                                  algorithm=config.sweep.algorithm)
        sampler, points = VizierSampler(study, plan.encoding), None
    return run_branch_study(
        mode, sampler, candidate_builder(config, load_predictor), evaluate_wave, scorer(config), settings,
        journal=journal, counter=counter, warm_history=warm_history, exhaustive_points=points,
        on_record=on_record, on_round=on_round, backend=backend,
    )


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
    merge: Any
    outputs: dict[str, Path] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    resumed_records: int = 0


def ledger_frame(records: Iterable[TrialRecord]) -> pd.DataFrame:
    rows = [r.to_row() for r in records]
    if not rows:
        return pd.DataFrame(columns=list(TrialRecord.__dataclass_fields__))
    return pd.DataFrame(rows)


def run_sweep(
    config: SmartSearchConfig,
    output_dir: str | Path,
    *,
    evaluator: Any = None,
    vizier: Any = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
    warm_start_ledger: pd.DataFrame | None = None,
    repair: bool = False,
) -> SweepResult:
    """Run all stages, journalling to `output_dir` so a rerun resumes, and write the outputs.
    `repair` quarantines damaged journal records instead of refusing the journal (`--repair`)."""
    output_dir = Path(output_dir)
    emit = progress or (lambda event: None)
    started = time.perf_counter()
    with RunLock(output_dir):
        prepared = prepare(config)
        config = prepared.config
        for warning in prepared.warnings:
            emit({"event": "warning", "message": warning})
        plans = [plan_branch(branch, config) for branch in prepared.branches]
        for plan in plans:
            emit({"event": "plan", "branch": plan.branch.deployment_mode, "why": plan.why,
                  "exhaustive": plan.exhaustive, "size": plan.finite_size})
        journal = FileJournal(output_dir / "journal.jsonl", repair=repair)
        for warning in journal.warnings:
            emit({"event": "warning", "message": warning})
        resumed = journal.loaded_records
        if resumed:
            emit({"event": "resume", "records": resumed})
        evaluator = evaluator if evaluator is not None else default_evaluator()
        vizier = vizier if vizier is not None else default_vizier()
        outcomes: list[BranchOutcome] = []
        counter = TrialCounter()
        workers = max(1, min(config.sweep.parallel_evals, config.sweep.per_round))
        records: list[TrialRecord] = []

        def on_record(rec: TrialRecord) -> None:
            records.append(rec)
            emit({"event": "trial", "record": rec})

        try:
            with make_pool(evaluator, workers, config.sweep.max_eval_seconds, executor=config.sweep.executor,
                           ray_address=config.sweep.ray_address) as pool:
                budget_end = (None if config.sweep.time_budget is None
                              else time.monotonic() + config.sweep.time_budget)
                for index, plan in enumerate(plans):
                    mode = plan.branch.deployment_mode
                    # the time left is shared equally by the branches still to run
                    deadline = (None if budget_end is None else
                                time.monotonic() + (budget_end - time.monotonic()) / (len(plans) - index))
                    emit({"event": "branch", "branch": mode, "exhaustive": plan.exhaustive})
                    outcome = run_branch(
                        plan, config, prepared.load_predictor, evaluate_wave=pool.evaluate_wave, backend=pool,
                        vizier=vizier, journal=journal, counter=counter,
                        warm_history=warm_history_for(warm_start_ledger, plan),
                        on_record=on_record, deadline=deadline,
                        on_round=lambda result: (emit({"event": "round", "branch": result.branch,
                                                       "round": result.rounds}),
                                                 write_anytime(output_dir, config, records)),
                    )
                    outcomes.append(outcome)
                    if outcome.out_of_time:
                        emit({"event": "out_of_time", "branch": mode, "evaluated": outcome.evaluated})
                    if outcome.stopped:
                        emit({"event": "stopped", "branch": mode, "reason": outcome.stopped})
                    elif outcome.stalled:
                        emit({"event": "stalled", "branch": mode, "rounds": outcome.rounds})
        finally:
            journal.close()
            _write_partial_ledger(output_dir, records)

        ledger = ledger_frame(records)
        timings = {
            "optimizer_seconds": sum(o.optimizer_seconds for o in outcomes),
            "replay_seconds": sum(o.replay_seconds for o in outcomes),
            "wall_seconds": time.perf_counter() - started,
        }
        merge, paths = write_results(output_dir, config, plans, ledger, timings)
    return SweepResult(config, prepared, plans, outcomes, ledger, merge, paths, timings, resumed)


def write_results(output_dir: Path, config: SmartSearchConfig, plans: list[BranchPlan], ledger: pd.DataFrame,
                  timings: dict[str, float]):
    """Stage 6: merge the branch ledgers by goal and write every artifact; returns (merge, paths)."""
    from spica_pipeline.report import merge_for_config, write_outputs

    merge = merge_for_config(ledger, config)
    paths = write_outputs(
        output_dir, ledger, merge,
        goal_summary=goal_summary(config),
        workload_summary=workload_summary(config),
        timings=timings,
        branch_notes=branch_notes(plans, ledger),
        top_n=config.deploy.top_n,
        deploy_options=deploy_options(config),
        config_json=config.model_dump(mode="json"),
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


def deploy_options(config: SmartSearchConfig):
    """DGD rendering options from `deploy:`; the node size defaults to the hardware's AIC system spec."""
    from spica_pipeline.report.dgd import DeployOptions

    d = config.deploy
    gpus_per_node = d.gpus_per_node
    if gpus_per_node is None:
        from spica_pipeline.errors import ModelHardwareError
        from spica_pipeline.search.model_hw import hardware_facts

        try:
            gpus_per_node = hardware_facts(config.search_space.hardware_sku).gpus_per_node
        except ModelHardwareError:
            gpus_per_node = None
    return DeployOptions(api_version=d.api_version, image=d.image, planner_image=d.planner_image,
                         gpus_per_node=gpus_per_node, hf_token_secret=d.hf_token_secret)


def goal_summary(config: SmartSearchConfig) -> dict[str, Any]:
    goal = config.goal
    return {
        "target": goal.target.value,
        "objectives": objective_names(config),
        "sla": goal.sla.model_dump(exclude_none=True) if goal.sla else None,
        "gpu_budget": config.search_space.gpu_budget,
        "model": config.search_space.model_name,
        "hardware": config.search_space.hardware_sku,
    }


def workload_summary(config: SmartSearchConfig) -> dict[str, Any]:
    return {"shape": config.workload.shape, **config.workload.model_dump(mode="json", exclude_none=True)}


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
    from spica_pipeline.search.shapes import parallel_config_from_dict

    return parallel_config_from_dict(rec.parallel_config)


def default_evaluator():
    from spica_pipeline.resources.replay import ReplayEvaluator

    return ReplayEvaluator()


def default_vizier():
    from spica_pipeline.resources.vizier import VizierClient

    return VizierClient()


def make_pool(evaluator: Any, workers: int, max_eval_seconds: float | None, *, executor: str = "local",
              ray_address: str | None = None):
    """The evaluation backend `sweep.executor` names (the `EvaluationBackend` of resources/pool.py)."""
    if executor == "ray":
        from spica_pipeline.resources.ray_pool import RayEvaluationPool

        return RayEvaluationPool(evaluator, workers, max_eval_seconds, address=ray_address)
    from spica_pipeline.resources.pool import EvaluationPool

    return EvaluationPool(evaluator, workers=workers, max_eval_seconds=max_eval_seconds)


def write_anytime(output_dir: Path, config: SmartSearchConfig, records: list[TrialRecord]) -> None:
    """The anytime result, after every batch: the ledger and the ranking (or front) so far, each
    replaced atomically, so a deadline or Ctrl-C always leaves a valid, current result."""
    from spica_pipeline.report import merge_for_config
    from spica_pipeline.report.tables import candidates_frame
    from spica_pipeline.storage import atomic_write_parquet, atomic_write_text

    _write_partial_ledger(output_dir, records)
    merge = merge_for_config(ledger_frame(records), config)
    table = candidates_frame(merge.candidates, merge.objectives if merge.is_pareto else None)
    atomic_write_parquet(output_dir / "candidates.parquet", table)
    atomic_write_text(output_dir / "candidates.csv", table.to_csv(index=False))


def _write_partial_ledger(output_dir: Path, records: list[TrialRecord]) -> None:
    from spica_pipeline.storage import atomic_write_parquet

    atomic_write_parquet(output_dir / "ledger.parquet", ledger_frame(records))


def _branch_seed(config: SmartSearchConfig, mode: str) -> int:
    digest = hashlib.sha256(f"{config.sweep.seed}:{mode}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def _file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and x == x and abs(x) != float("inf")


__all__ = [
    "BranchPlan", "PreparedSweep", "SweepResult", "candidate_builder", "enumerate_branch_spaces",
    "filter_policies", "ledger_frame", "plan_branch", "predict_load", "prepare", "run_branch", "run_sweep",
    "scorer",
]
