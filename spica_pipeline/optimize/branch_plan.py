"""How one branch is searched: the plan, the proposals, the candidate build and the score.

Pure functions of the config and the branch space, shared by the CLI sweep and the Dagster
studies (`sweep.run_branch` wires them to the Vizier study, the evaluation backend and the
journal). Nothing here opens a file, a study or a pool.
"""

import hashlib
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol, Sequence

from spica_pipeline.config import OptimizationGoal, SmartSearchConfig, target_direction
from spica_pipeline.config.limits import synthetic_requests
from spica_pipeline.config.sweep import DEFAULT_MAX_ROUNDS, MODEL_FREE_ALGORITHMS, resolve_algorithm
from spica_pipeline.config.types import is_finite_number
from spica_pipeline.evaluate import scoring
from spica_pipeline.evaluate.evaluator import EvalOutcome, EvalRequest
from spica_pipeline.optimize import cost, neighbourhood
from spica_pipeline.optimize.encoding import SearchEncoding, build_encoding, enumerate_space
from spica_pipeline.optimize.neighbourhood import NeighbourhoodDesigner
from spica_pipeline.optimize.trial import (
    HistoryItem,
    KnownPoint,
    Proposal,
    Scored,
    StudySettings,
    selection_key,
)
from spica_pipeline.space.branches import BranchSpace
from spica_pipeline.space.candidate import build_candidate, router_repeats_for
from spica_pipeline.space.model_hw import latest_backend_version
from spica_pipeline.space.shapes import ParallelConfig

if TYPE_CHECKING:
    from spica_pipeline.optimize.neighbourhood import NeighbourhoodDesigner
    from spica_pipeline.space.load_predictor import LoadPredictorResult


# --------------------------------------------------------------------------------------------
# the plan
# --------------------------------------------------------------------------------------------

@dataclass
class BranchPlan:
    """How one branch will be searched, decided before any trial runs."""

    branch: BranchSpace
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


def plan_branch(branch: BranchSpace, config: SmartSearchConfig) -> BranchPlan:
    encoding = build_encoding(branch)
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


def model_free(config: SmartSearchConfig) -> bool:
    """Whether the sweep's studies (SPICA_VIZIER_ALGO included) use a designer without a model: then
    they answer every ask themselves, with no cost-aware fill and no neighbourhood designer."""
    return resolve_algorithm(config.sweep.algorithm) in MODEL_FREE_ALGORITHMS


def study_settings(config: SmartSearchConfig, deadline: float | None = None) -> StudySettings:
    """The study loop's settings from `sweep:`; `deadline` (time.monotonic seconds) ends the branch."""
    sweep = config.sweep
    # A model-free study is already the cheap designer: the cost-aware fill must not swap it for another.
    return StudySettings(per_round=sweep.per_round, max_rounds=sweep.max_rounds, workers=sweep.eval_workers,
                         failure_breaker=sweep.failure_breaker, deadline=deadline,
                         optimizer_share=None if model_free(config) else sweep.optimizer_share, cost_aware=sweep.cost_aware,
                         replay_estimate_s=replay_estimate_s(config),
                         objectives=len(study_metrics(config.goal)))


def replay_estimate_s(config: SmartSearchConfig) -> float:
    """A-priori seconds of one candidate's replay(s) (optimize/cost.py), which the cost-aware fill uses
    for trials still running until outcomes report their own request counts: the synthetic request
    count (a trace's or a kv_load's is only known per candidate: the default estimate then)."""

    workload = config.workload
    requests = None
    if not workload.trace_path and workload.kv_load_ratio is None:
        requests = synthetic_requests(workload)[0]
    repeats = config.sweep.router_repeats if "kv_router" in config.search_space.router_mode else 1
    return cost.predicted_replay_seconds(requests, repeats)


def branch_seed(config: SmartSearchConfig, mode: str) -> int:
    """The branch study's seed: derived from the sweep seed, different per deployment mode."""
    digest = hashlib.sha256(f"{config.sweep.seed}:{mode}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


# --------------------------------------------------------------------------------------------
# proposals
# --------------------------------------------------------------------------------------------

class SuggestingStudy(Protocol):
    """The optimizer side of a study (resources/vizier.Study): parameter dicts for `count` trials."""

    last_designer: str  # the designer that answered the last `suggest`

    def suggest(self, count: int, history: Sequence[Any] = ..., pending: Sequence[dict[str, Any]] = ...,
                algorithm: str | None = ...) -> list[dict[str, Any]]: ...


SEED_BATCH = "QUASI_RANDOM_SEARCH"  # the designer a model-based study names on its seed batches (optimize/vizier.py)


class StudySampler:
    """Study loop sampler over an optimizer study: suggest, then decode and project.

    `study` is None for an exhaustive branch (only `propose` is used there). `local`: the
    cost-aware fill's neighbourhood designer (optimize/neighbourhood.py), asked before the
    quasi-random fill; None: the fill is quasi-random only."""

    def __init__(self, study: SuggestingStudy | None, encoding: SearchEncoding,
                 local: "NeighbourhoodDesigner | None" = None):
        self.study = study
        self.encoding = encoding
        self.local = local
        self.look_alikes_seen = 0  # model-based suggestions found to be look-alikes (diagnostics)
        self.last_model_ran = False  # whether the last `suggest_pending` ran a model-based designer

    def suggest(self, count: int, history: list[HistoryItem]) -> list[dict[str, Any]]:
        if self.study is None:
            raise RuntimeError("an exhaustive branch has no optimizer study to ask")
        items = [(h.parameters, h.metrics, h.infeasible_reason) for h in history]
        return [dict(p) for p in self.study.suggest(count, items)]

    def suggest_pending(self, count: int, history: list[HistoryItem], pending: list[dict[str, Any]],
                        cheap: bool) -> tuple[list[dict[str, Any]], list[str]]:
        """The asynchronous loop's ask: in-flight trials as pending; `cheap` fills from the
        quasi-random designer (the cost-aware policy). Returns the suggestions and the designer
        that proposed each (a batch may mix the model's and the neighbourhood designer's)."""
        if self.study is None:
            raise RuntimeError("an exhaustive branch has no optimizer study to ask")
        items = [(h.parameters, h.metrics, h.infeasible_reason) for h in history]
        out = [dict(p) for p in self.study.suggest(count, items, pending,
                                                   algorithm="QUASI_RANDOM_SEARCH" if cheap else None)]
        designer = self.study.last_designer
        # a seed batch (SEED_BATCH, quasi-random) and the model-free designers run no model
        self.last_model_ran = bool(out) and not cheap and designer not in MODEL_FREE_ALGORITHMS
        if not cheap and self.local is not None and out and designer == SEED_BATCH:
            if neighbourhood.SEED_BATCH_TO_LOCAL:
                return self._seed_batch_to_local(history, pending, out, designer)
        if cheap or self.local is None or designer in MODEL_FREE_ALGORITHMS or not out:
            return out, [designer] * len(out)
        return self._route_look_alikes(history, pending, out, designer)

    def _projected(self, history: Sequence[HistoryItem], pending: Sequence[dict[str, Any]]):
        """(known, proposed, taken): the history's and the pending trials' projections, in trial
        order, as the study loop projected them (supported trials only, as its cheap path tells
        the local designer)."""
        taken: set[tuple[str, ParallelConfig]] = set()
        known = [(p.selection, p.parallel_config, h.metrics)
                 for p, h in ((self._project(h.parameters, taken), h) for h in history) if p.supported]
        proposed = [(p.selection, p.parallel_config) for p in (self._project(q, taken) for q in pending)
                    if p.supported]
        return known, proposed, taken

    def _project(self, parameters: dict[str, Any], taken: set[tuple[str, ParallelConfig]]) -> Proposal:
        """The study loop's projection of one trial, marking its (selection, parallel config) taken."""
        proposal = self.propose(parameters, taken)
        taken.add((selection_key(proposal.selection), proposal.parallel_config))
        return proposal

    def _seed_batch_to_local(self, history: Sequence[HistoryItem], pending: Sequence[dict[str, Any]],
                             out: list[dict[str, Any]], designer: str) -> tuple[list[dict[str, Any]], list[str]]:
        """The model's seed batch (quasi-random: too few feasible trials for a model) answered by
        the local designer instead (neighbourhood.SEED_BATCH_TO_LOCAL): its exploration keeps to
        unused parallel configs and never proposes a look-alike; the seed batch fills what it
        cannot. Deterministic, as `_route_look_alikes`."""
        assert self.local is not None
        known, proposed, taken = self._projected(history, pending)
        near = [dict(p) for p in self.local.suggest(len(out), known, proposed, frozenset(taken))]
        return near + out[len(near):], [self.local.name] * len(near) + [designer] * (len(out) - len(near))

    def _route_look_alikes(self, history: Sequence[HistoryItem], pending: Sequence[dict[str, Any]],
                           out: list[dict[str, Any]], designer: str) -> tuple[list[dict[str, Any]], list[str]]:
        """A model-based batch with a look-alike (a point equal to a proposed one but for knobs the
        local designer believes inert: likely a known outcome again, a wasted evaluation) has each
        look-alike swapped in place for one local point, the model's other suggestions kept (a
        used-up neighbourhood: the model's point stays; neighbourhood.py says why this rule).
        Returns the designer of each trial. A function of the history, pending and suggestions
        only: the trials are re-projected in trial order, as the study loop projected them, so it
        is deterministic and a resume repeats it."""
        assert self.local is not None
        known, proposed, taken = self._projected(history, pending)
        projected = [self._project(p, taken) for p in out]
        flags = self.local.look_alikes([(p.selection, p.parallel_config) for p in projected], known, proposed)
        self.look_alikes_seen += sum(flags)
        if not any(flags):
            return out, [designer] * len(out)
        kept = [(p.selection, p.parallel_config) for p, alike in zip(projected, flags) if not alike and p.supported]
        near = iter(self.local.suggest(sum(flags), known, proposed + kept, frozenset(taken)))
        result: list[dict[str, Any]] = []
        names: list[str] = []
        for parameters, alike in zip(out, flags):
            local = next(near, None) if alike else None
            if local is None:  # not a look-alike, or a used-up neighbourhood: the model's point
                result.append(parameters)
                names.append(designer)
            else:
                result.append(dict(local))
                names.append(self.local.name)
        return result, names

    def suggest_local(self, count: int, known: Sequence[KnownPoint], pending: Sequence[tuple[dict[str, Any], ParallelConfig]],
                      taken: Collection[tuple[str, ParallelConfig]]) -> tuple[list[dict[str, Any]], str]:
        """The cost-aware fill's local part: up to `count` unevaluated neighbours of the best
        known trials (none without a local designer), and the designer's name."""
        if self.local is None:
            return [], ""
        return self.local.suggest(count, known, pending, taken), self.local.name

    @property
    def designer(self) -> str:
        return getattr(self.study, "last_designer", "") or "vizier"

    def propose(self, parameters: dict[str, Any], taken: Collection[tuple[str, ParallelConfig]] = ()) -> Proposal:
        return propose(self.encoding, parameters, taken)


def propose(encoding: SearchEncoding, parameters: dict[str, Any],
            taken: Collection[tuple[str, ParallelConfig]] = ()) -> Proposal:
    """Decode and project one suggestion, steering away from points already proposed."""
    selection, requested = encoding.decode(parameters)
    meta: dict[str, Any] | None
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
    return Proposal(parameters, selection, config, meta, supported=encoding.supports(selection, config))


def exhaustive_points(encoding: SearchEncoding) -> Iterable[Proposal]:
    for selection, config in enumerate_space(encoding):
        yield Proposal(encoding.encode(selection, config), selection, config, None)


# --------------------------------------------------------------------------------------------
# candidates and scores
# --------------------------------------------------------------------------------------------

def candidate_builder(config: SmartSearchConfig, load_predictor: "LoadPredictorResult | None",
                      context: dict[str, Any]) -> Callable[[dict[str, Any], ParallelConfig], EvalRequest]:
    """Main-process candidate build: build the candidate, resolve its perf-DB version and load,
    attach `context` (what, besides the candidate, changes a replay's result:
    `sweep.evaluation_context`)."""
    workload = config.workload.model_dump(mode="json")
    goal = config.goal
    repeats = config.sweep.router_repeats

    def build(selection: dict[str, Any], parallel_config: ParallelConfig) -> EvalRequest:
        candidate = build_candidate(config.search_space, selection, parallel_config, load_predictor)
        candidate = replace(
            candidate, backend_version=latest_backend_version(candidate.system, candidate.backend),
            concurrency=config.workload.concurrency,
            # searched (a range) or injected as a constant (a scalar)
            kv_load_ratio=float(selection["kv_load_ratio"]) if "kv_load_ratio" in selection else None)
        ctx = dict(context, router_repeats=router_repeats_for(candidate, repeats))
        return EvalRequest(candidate=candidate, workload=workload, goal=goal, context=ctx)

    return build


def local_designer(config: SmartSearchConfig, encoding: SearchEncoding,
                   seed: int) -> "NeighbourhoodDesigner | None":
    """The cost-aware fill's neighbourhood designer, for a model-based algorithm (whose asks the
    fill replaces); None for the cheap designers, which answer every ask themselves."""

    if model_free(config):
        return None
    return NeighbourhoodDesigner(encoding, study_metrics(config.goal), seed=seed)


def study_metrics(goal: OptimizationGoal) -> list[tuple[str, str]]:
    """What the optimizer study maximises or minimises: the Pareto objectives, or the signed score."""
    if goal.is_pareto:
        return [(name, target_direction(name)) for name in goal.objective_names()]
    return [("objective", "max")]  # the scorer pre-signs the score


def scorer(goal: OptimizationGoal) -> Callable[[EvalOutcome], Scored]:
    """Turn a feasible report into the score, objectives and what the optimizer is told."""
    names = goal.objective_names()
    sla = goal.sla_thresholds()

    def score(outcome: EvalOutcome) -> Scored:
        report = outcome.report or {}
        passes, why = scoring.sla_gate(report, sla, goal.sla_gate)
        if not passes:
            return Scored(None, None, None, reason=why)
        if goal.is_pareto:
            objectives = scoring.objective_vector(names, report)
            if not all(is_finite_number(v) for v in objectives.values()):
                return Scored(None, objectives, None, reason="replay report lacks an objective metric")
            return Scored(objectives[names[0]], objectives, dict(objectives))
        value = scoring.score(goal.target.value, report)
        if not is_finite_number(value):
            return Scored(None, None, None, reason=f"replay report has no value for {goal.target.value}")
        return Scored(value, None, {"objective": value})

    return score


__all__ = [
    "BranchPlan", "StudySampler", "SuggestingStudy", "branch_seed", "candidate_builder", "exhaustive_points",
    "finite_points", "local_designer", "plan_branch", "propose", "scorer", "study_metrics", "study_settings",
]
