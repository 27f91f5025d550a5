"""What a branch study is made of: proposals and history items, the study's settings and outcome, and the
interfaces of its sampler, evaluation backend and journal (with the in-memory journal)."""

import time
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence, get_args

from spica_pipeline.config.sweep import CostAware
from spica_pipeline.evaluate.evaluator import EvalOutcome, EvalRequest
from spica_pipeline.jsonvalue import canonical_json, json_safe
from spica_pipeline.optimize import cost
from spica_pipeline.optimize.ledger import TrialRecord
from spica_pipeline.space.shapes import ParallelConfig

COST_AWARE_MODES: tuple[str, ...] = get_args(CostAware)


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


# One trial a local (neighbourhood) fill learns from: (selection, parallel config, told metrics or None).
KnownPoint = tuple[dict[str, Any], ParallelConfig, dict[str, float] | None]


class Finished(Protocol):
    """One finished evaluation as `Backend.wait` hands it back (resources.pool's Completion)."""

    @property
    def ticket(self) -> int: ...

    @property
    def outcome(self) -> EvalOutcome: ...


class Backend(Protocol):
    """What the asynchronous driver needs from an evaluation backend (resources.pool's
    EvaluationBackend): `submit` returns a ticket, `wait` returns finished (ticket, outcome)s."""

    workers: int

    def submit(self, request: EvalRequest) -> int: ...

    def wait(self, timeout: float | None = None) -> Sequence[Finished]: ...


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
    """`per_round` x `max_rounds` is the branch's evaluation budget. It counts every trial whatever
    its outcome (feasible, infeasible, failed, timed out, unsupported); only a trial that reuses an
    earlier trial's outcome (a cache hit or a duplicate in the batch) is free. `failure_breaker`:
    stop the branch when its first N counted trials all failed for the same reason (0: off)."""

    per_round: int
    max_rounds: int | None  # None: until `deadline` (or a stall)
    workers: int = 1
    failure_breaker: int = 5
    deadline: float | None = None  # in `clock` seconds: no new trial starts after it
    clock: Callable[[], float] = time.monotonic
    # Asynchronous dispatch: suggestion k is asked with trials < k - lag as history and the
    # trials in [k - lag, k) as pending (None: 2 x workers). Fixed by position, never by timing.
    lag: int | None = None
    # Keep model-based suggestions at most this share of the branch's wall time by filling asks
    # from the cheap designer while over it (None: always the configured designer).
    optimizer_share: float | None = 0.25
    # How that share is judged. "predicted" (default): from predicted seconds only (optimize/cost.py:
    # fitted suggest cost by history size and batch, `replay_estimate_s` per trial), so the same seed
    # gives the same ledger. "measured": from the seconds the suggests and the branch actually took
    # (adapts to the machine; two fresh runs may differ; a resume still repeats the journal).
    # "off": always the configured designer.
    cost_aware: str = "predicted"
    # a-priori predicted seconds of one trial's replay(s), for trials whose outcome is not in yet
    # (finished trials are predicted from the request count their outcome records)
    replay_estimate_s: float = cost.DEFAULT_REPLAY_S
    objectives: int = 1  # metrics the designer models (two objectives cost more per suggest)

    def __post_init__(self) -> None:
        if self.cost_aware not in COST_AWARE_MODES:
            raise ValueError(f"cost_aware: expected one of {list(COST_AWARE_MODES)}, got {self.cost_aware!r}")

    def out_of_time(self) -> bool:
        return self.deadline is not None and self.clock() >= self.deadline


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
    evaluated: int = 0  # trials counted against the budget
    out_of_time: bool = False  # the time budget ended the branch
    stopped: str | None = None  # why the branch stopped early (circuit breaker), else None


class TrialCounter:
    """Sweep-wide trial numbering, shared by the branches of one sweep."""

    def __init__(self, start: int = 0) -> None:
        self.value = start

    def next(self) -> int:
        self.value += 1
        return self.value
