"""The contract between the study loop and an evaluator (the real replay or a test fake).

An `EvalRequest` is the full evaluation spec: everything that can change a replay's result. Its
canonical JSON hash is the dedup/cache key, so an identical spec is never replayed twice.
"""

import abc
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from spica_pipeline.config.goal import OptimizationGoal
from spica_pipeline.jsonvalue import spec_hash
from spica_pipeline.space.candidate import Candidate

Status = Literal["feasible", "infeasible", "failed", "timed_out"]


@dataclass(frozen=True)
class EvalRequest:
    """One candidate to evaluate.

    candidate: the deployment (space/candidate.py), its perf-database version resolved; hashed as
        its flat form `candidate.to_dict()` under the key "sample".
    workload: `model_dump(mode="json")` of the validated workload section.
    goal: the validated `OptimizationGoal`, the one source of the goal rules downstream (a plain
        dict, as tests and plain-dict callers pass it, is validated once here); hashed as its JSON dump.
    context: anything else that changes the result (load-predictor result, evaluator fidelity
        version, router repeats); part of the hash.
    """

    candidate: Candidate
    workload: dict[str, Any]
    goal: OptimizationGoal
    context: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.candidate, Candidate):
            raise TypeError(f"EvalRequest.candidate must be a Candidate, got {type(self.candidate).__name__} "
                            "(Candidate.from_dict reads a flat candidate dict)")
        if not isinstance(self.goal, OptimizationGoal):
            goal: Mapping[str, Any] | None = self.goal
            object.__setattr__(self, "goal", OptimizationGoal.model_validate(goal or {}))

    def to_dict(self) -> dict[str, Any]:
        return {"sample": self.candidate.to_dict(), "workload": self.workload,
                "goal": self.goal.model_dump(mode="json"), "context": self.context}

    @property
    def spec_hash(self) -> str:
        return spec_hash(self.to_dict())


@dataclass
class EvalOutcome:
    """What evaluating one request produced.

    report: the flat replay summary (mean over repeats for a stochastic router), or None.
    spread: per-metric {"std": ..., "min": ..., "max": ...} across repeats (kv_router), else {}.
    derived: fields computed while building the candidate (concurrency, KV capacities,
        num_gpu_blocks per role) to record on the candidate config.
    """

    status: Status
    reason: str | None = None
    report: dict[str, float] | None = None
    spread: dict[str, dict[str, float]] = field(default_factory=dict)
    derived: dict[str, Any] = field(default_factory=dict)
    replay_seconds: float = 0.0
    repeats: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status, "reason": self.reason, "report": self.report, "spread": self.spread,
            "derived": self.derived, "replay_seconds": self.replay_seconds, "repeats": self.repeats,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "EvalOutcome":
        return cls(**d)


class Evaluator(abc.ABC):
    """Turns a request into an outcome; must never raise for a bad candidate. The real replay
    (`resources.replay.ReplayEvaluator`) and every test fake subclass it, and one contract suite
    (tests/test_contracts.py) runs over all of them."""

    @abc.abstractmethod
    def evaluate(self, request: EvalRequest) -> EvalOutcome: ...
