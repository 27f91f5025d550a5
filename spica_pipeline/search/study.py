"""The per-branch study loop (spec §6.4-6.6), with exhaustive mode, dedup and resume.

A branch study is a deterministic function of (branch space, seed, evaluation results): the same
inputs produce the same trials in the same order. Two calls are expensive or non-deterministic,
the optimizer's suggest and the replay, and both go through a `Journal` that memoises them. Resuming
an interrupted sweep is therefore just running the loop again with the old journal: completed
suggestions and evaluations are read back instead of recomputed, and the ledger comes out equal to
an uninterrupted run's.

No Dagster and no I/O here: the caller supplies the sampler, the candidate builder, the wave
evaluator, the scorer and the journal.
"""

import time
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol

from spica_pipeline.search.evaluation import EvalOutcome, EvalRequest, canonical_json, json_safe, spec_hash
from spica_pipeline.search.ledger import TrialRecord
from spica_pipeline.search.shapes import ParallelConfig

ATTEMPT_FACTOR = 11  # a round asks for its batch plus up to 10x replacements (spec §6.4)


@dataclass
class Proposal:
    """A suggestion decoded and projected onto a legal parallel config."""

    parameters: dict[str, Any]
    selection: dict[str, Any]
    parallel_config: ParallelConfig
    projection: dict[str, Any] | None = None
    supported: bool = True
    unsupported_reason: str | None = None


@dataclass(frozen=True)
class HistoryItem:
    """What the optimizer is told about one trial."""

    parameters: dict[str, Any]
    metrics: dict[str, float] | None
    infeasible_reason: str | None


class Sampler(Protocol):
    """Turns the optimizer's raw suggestions into proposals.

    `suggest(count, history)` is the expensive optimizer call (journalled); `propose(parameters,
    taken)` decodes and projects one suggestion (cheap, deterministic), preferring the nearest
    point whose `point_key` is not in `taken` so a suggestion that collapses onto an evaluated
    point moves to an unevaluated neighbour instead of costing a duplicate.
    """

    def suggest(self, count: int, history: list[HistoryItem]) -> list[dict[str, Any]]: ...

    def propose(self, parameters: dict[str, Any], taken: Collection[tuple[str, ParallelConfig]] = ()) -> Proposal: ...


def selection_key(selection: dict[str, Any]) -> str:
    return canonical_json(json_safe(selection))


def point_key(selection: dict[str, Any], parallel_config: ParallelConfig) -> tuple[str, ParallelConfig]:
    """Identity of a search point: a proposal whose key is taken would repeat an evaluated spec."""
    return selection_key(selection), parallel_config


class Journal(Protocol):
    """Memo of suggestions and evaluation outcomes; persisted by the caller (append-only)."""

    def get_suggestions(self, key: str) -> list[dict[str, Any]] | None: ...

    def put_suggestions(self, key: str, suggestions: list[dict[str, Any]], seconds: float) -> None: ...

    def get_outcome(self, spec_hash: str) -> tuple[int, EvalOutcome] | None: ...

    def put_outcome(self, trial: int, spec_hash: str, outcome: EvalOutcome) -> None: ...


class MemoryJournal(Journal):
    """In-memory journal: enough for tests and for a single uninterrupted run."""

    def __init__(self) -> None:
        self.suggestions: dict[str, tuple[list[dict[str, Any]], float]] = {}
        self.outcomes: dict[str, tuple[int, EvalOutcome]] = {}

    def get_suggestions(self, key):
        hit = self.suggestions.get(key)
        return None if hit is None else hit[0]

    def put_suggestions(self, key, suggestions, seconds):
        self.suggestions[key] = (suggestions, seconds)

    def get_outcome(self, spec_hash):
        return self.outcomes.get(spec_hash)

    def put_outcome(self, trial, spec_hash, outcome):
        self.outcomes.setdefault(spec_hash, (trial, outcome))


@dataclass
class Scored:
    """A feasible outcome turned into ranking terms."""

    score: float | None
    objectives: dict[str, float] | None
    told_metrics: dict[str, float] | None  # None: tell as infeasible
    reason: str | None = None


@dataclass
class StudySettings:
    per_round: int
    max_rounds: int
    workers: int = 1


@dataclass
class BranchOutcome:
    """What one branch study produced, for the ledger and the result summary."""

    branch: str
    records: list[TrialRecord] = field(default_factory=list)
    mode: str = "vizier"  # vizier | exhaustive
    stalled: bool = False
    rounds: int = 0
    optimizer_seconds: float = 0.0
    replay_seconds: float = 0.0
    counts: Counter = field(default_factory=Counter)


class TrialCounter:
    """Sweep-wide trial numbering, shared by the branches of one sweep."""

    def __init__(self, start: int = 0) -> None:
        self.value = start

    def next(self) -> int:
        self.value += 1
        return self.value


def run_branch_study(
    branch: str,
    sampler: Sampler,
    build: Callable[[dict[str, Any], ParallelConfig], EvalRequest],
    evaluate_wave: Callable[[list[EvalRequest]], list[EvalOutcome]],
    score: Callable[[EvalOutcome], Scored],
    settings: StudySettings,
    *,
    journal: Journal | None = None,
    counter: TrialCounter | None = None,
    warm_history: Iterable[HistoryItem] = (),
    exhaustive_points: Iterable[Proposal] | None = None,
    on_record: Callable[[TrialRecord], None] | None = None,
    on_round: Callable[[BranchOutcome], None] | None = None,
) -> BranchOutcome:
    """Run one branch: Vizier rounds, or every point of `exhaustive_points` when given."""
    loop = _BranchLoop(branch, sampler, build, evaluate_wave, score, settings,
                       journal or MemoryJournal(), counter or TrialCounter(), on_record)
    loop.history.extend(warm_history)
    if exhaustive_points is not None:
        loop.result.mode = "exhaustive"
        loop.run_exhaustive(iter(exhaustive_points), on_round)
    else:
        loop.run_rounds(on_round)
    return loop.result


class _BranchLoop:
    def __init__(self, branch, sampler, build, evaluate_wave, score, settings, journal, counter, on_record):
        self.branch = branch
        self.sampler = sampler
        self.build = build
        self.evaluate_wave = evaluate_wave
        self.score = score
        self.settings = settings
        self.journal = journal
        self.counter = counter
        self.on_record = on_record
        self.history: list[HistoryItem] = []
        self.result = BranchOutcome(branch=branch)
        # spec_hash -> the record that first produced it in this run (the dedup cache)
        self.seen: dict[str, TrialRecord] = {}
        self.taken: set[tuple[str, ParallelConfig]] = set()  # point keys already proposed in this branch

    # -- the two drivers ---------------------------------------------------------------------

    def run_rounds(self, on_round) -> None:
        per_round = self.settings.per_round
        cap = ATTEMPT_FACTOR * per_round
        for round_no in range(1, self.settings.max_rounds + 1):
            unique = attempts = 0
            asks = 0
            while unique < per_round and attempts < cap:
                count = min(per_round - unique, cap - attempts)
                parameters, seconds = self._suggest(round_no, asks, count)
                asks += 1
                if not parameters:
                    break
                attempts += len(parameters)
                proposals = []
                for p in parameters:
                    proposal = self.sampler.propose(p, self.taken)
                    self.taken.add(point_key(proposal.selection, proposal.parallel_config))
                    proposals.append(proposal)
                share = seconds / len(proposals)
                unique += self._run_batch(round_no, "vizier", proposals, share)
            self.result.rounds = round_no
            if on_round:
                on_round(self.result)
            if unique < per_round:
                self.result.stalled = True
                break

    def run_exhaustive(self, points, on_round) -> None:
        per_round = max(1, self.settings.per_round)
        round_no = 0
        while True:
            batch = [p for _, p in zip(range(per_round), points)]
            if not batch:
                break
            round_no += 1
            self._run_batch(round_no, "exhaustive", batch, 0.0)
            self.result.rounds = round_no
            if on_round:
                on_round(self.result)

    # -- one ask batch -----------------------------------------------------------------------

    def _suggest(self, round_no: int, ask_no: int, count: int) -> tuple[list[dict[str, Any]], float]:
        """Ask the optimizer, or read the answer back from the journal on resume."""
        key = spec_hash(json_safe({
            "branch": self.branch, "round": round_no, "ask": ask_no, "count": count,
            "history": [[h.parameters, h.metrics, h.infeasible_reason] for h in self.history],
        }))
        cached = self.journal.get_suggestions(key)
        if cached is not None:
            return cached, 0.0
        start = time.perf_counter()
        suggestions = list(self.sampler.suggest(count, list(self.history)))
        seconds = time.perf_counter() - start
        self.journal.put_suggestions(key, suggestions, seconds)
        self.result.optimizer_seconds += seconds
        return suggestions, seconds

    def _run_batch(self, round_no: int, source: str, proposals: list[Proposal], opt_share: float) -> int:
        """Triage, evaluate and record one batch; returns the number of new feasible replays."""
        records: list[TrialRecord] = []
        primaries: dict[str, int] = {}  # spec_hash -> index of its first record in this batch
        todo: list[tuple[int, EvalRequest]] = []
        duplicates: list[tuple[int, int]] = []  # (record index, primary index)
        for proposal in proposals:
            rec = TrialRecord(
                branch=self.branch, trial=self.counter.next(), round=round_no, source=source,
                status="pending", reason=None, spec_hash=None, parameters=proposal.parameters,
                selection=proposal.selection, parallel_config=proposal.parallel_config.to_dict(),
                used_gpus=proposal.parallel_config.used_gpus, projection=proposal.projection,
                optimizer_seconds=opt_share,
            )
            records.append(rec)
            if not proposal.supported:
                self._finish(rec, "unsupported", proposal.unsupported_reason
                             or f"backend '{proposal.selection.get('backend')}' does not support this "
                                "parallel config")
                continue
            try:
                request = self.build(proposal.selection, proposal.parallel_config)
            except Exception as exc:  # a bad candidate never aborts the sweep
                self._finish(rec, "failed", f"candidate build failed: {type(exc).__name__}: {_one_line(exc)}")
                continue
            rec.spec_hash = request.spec_hash
            rec.config = dict(request.sample)
            earlier = self.seen.get(rec.spec_hash)
            if earlier is not None:
                self._copy_cached(rec, earlier)
            elif rec.spec_hash in primaries:
                duplicates.append((len(records) - 1, primaries[rec.spec_hash]))
            else:
                primaries[rec.spec_hash] = len(records) - 1
                todo.append((len(records) - 1, request))

        unique = self._evaluate(records, todo)
        for index, primary in duplicates:
            self._copy_cached(records[index], records[primary])
        for rec in records:
            self._emit(rec)
        return unique

    def _evaluate(self, records: list[TrialRecord], todo: list[tuple[int, EvalRequest]]) -> int:
        unique = 0
        pending: list[tuple[int, EvalRequest]] = []
        for index, request in todo:
            rec = records[index]
            journalled = self.journal.get_outcome(rec.spec_hash)
            if journalled is not None:
                trial, outcome = journalled
                if trial == rec.trial:  # resume: the very same trial finished before the interruption
                    unique += self._apply(rec, outcome)
                else:  # an earlier sweep in this directory already replayed this exact spec
                    self._apply(rec, outcome)
                    rec.status, rec.reason = "cached", _cached_reason(outcome.status, trial)
                    rec.replay_seconds = 0.0
                self.seen[rec.spec_hash] = rec
            else:
                pending.append((index, request))
        wave_size = max(1, self.settings.workers)
        for start in range(0, len(pending), wave_size):
            wave = pending[start:start + wave_size]
            outcomes = self.evaluate_wave([request for _, request in wave])
            for (index, _), outcome in zip(wave, outcomes):
                rec = records[index]
                if outcome.status != "timed_out":  # a timeout may pass on a quieter machine
                    self.journal.put_outcome(rec.trial, rec.spec_hash, outcome)
                self.result.replay_seconds += outcome.replay_seconds
                unique += self._apply(rec, outcome)
                self.seen[rec.spec_hash] = rec
        return unique

    def _apply(self, rec: TrialRecord, outcome: EvalOutcome) -> int:
        rec.replay_seconds = outcome.replay_seconds
        rec.report = outcome.report
        rec.spread = outcome.spread or {}
        if outcome.derived:
            rec.config = {**rec.config, **outcome.derived}
        if outcome.status != "feasible":
            self._finish(rec, outcome.status, outcome.reason or outcome.status)
            return 0
        scored = self.score(outcome)
        rec.score, rec.objectives = scored.score, scored.objectives
        if scored.told_metrics is None:
            self._finish(rec, "infeasible", scored.reason or "no usable objective in the replay report")
            return 0
        rec.told_metrics = scored.told_metrics
        self._finish(rec, "feasible", None)
        return 1

    def _copy_cached(self, rec: TrialRecord, earlier: TrialRecord) -> None:
        rec.report, rec.spread = earlier.report, earlier.spread
        rec.config = earlier.config
        rec.score, rec.objectives, rec.told_metrics = earlier.score, earlier.objectives, earlier.told_metrics
        rec.replay_seconds = 0.0
        rec.status, rec.reason = "cached", _cached_reason(earlier.status, earlier.trial, earlier.reason)

    def _finish(self, rec: TrialRecord, status: str, reason: str | None) -> None:
        rec.status, rec.reason = status, reason

    def _emit(self, rec: TrialRecord) -> None:
        told_ok = rec.told_metrics is not None  # set only for feasible results (and their cache hits)
        self.history.append(HistoryItem(
            parameters=rec.parameters,
            metrics=rec.told_metrics if told_ok else None,
            infeasible_reason=None if told_ok else (rec.reason or rec.status),
        ))
        self.result.records.append(rec)
        self.result.counts[rec.status] += 1
        if self.on_record:
            self.on_record(rec)


def _cached_reason(status: str, trial: int, reason: str | None = None) -> str:
    base = f"{status} (same spec as trial {trial})"
    if status == "cached" and reason:
        return reason
    return base if status == "feasible" or not reason else f"{base}: {reason}"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:500]


__all__ = [
    "BranchOutcome", "HistoryItem", "Journal", "MemoryJournal", "Proposal", "Sampler", "Scored",
    "StudySettings", "TrialCounter", "point_key", "run_branch_study", "selection_key",
]
