"""`SmartSearchConfig`: the validated sweep input and its cross-section rules."""

from typing import Any

from pydantic import Field, model_validator

from spica_pipeline.config.deploy import DeploySettings
from spica_pipeline.config.evaluation import EvaluationSettings
from spica_pipeline.config.goal import OptimizationGoal, Target
from spica_pipeline.config.search_space import SearchSpace
from spica_pipeline.config.sweep import SweepConfig
from spica_pipeline.config.types import StrictModel
from spica_pipeline.config.workload import LOAD_FIELDS, Workload

DEFAULT_PARETO_LOAD = [0.0, 1.0]


def _goal_is_pareto(goal: Any) -> bool:
    target = goal.target if isinstance(goal, OptimizationGoal) else (
        goal.get("target") if isinstance(goal, dict) else None
    )
    return target == Target.PARETO  # a str enum: the member and "pareto" alike


class SmartSearchConfig(StrictModel):
    search_space: SearchSpace
    workload: Workload
    goal: OptimizationGoal = Field(default_factory=OptimizationGoal)
    sweep: SweepConfig = Field(default_factory=SweepConfig)
    deploy: DeploySettings = Field(default_factory=DeploySettings)
    evaluation: EvaluationSettings = Field(default_factory=EvaluationSettings)

    @model_validator(mode="before")
    @classmethod
    def _default_pareto_load(cls, data: Any) -> Any:
        """A synthetic Pareto sweep with no load field sweeps kv_load_ratio over [0, 1]."""
        if not isinstance(data, dict):
            return data
        # An empty `goal:` or `sweep:` section (YAML null) means "all defaults".
        data = {k: v for k, v in data.items() if not (k in ("goal", "sweep", "deploy", "evaluation") and v is None)}
        workload = data.get("workload")
        if (
            _goal_is_pareto(data.get("goal"))
            and isinstance(workload, dict)
            and workload.get("trace_path") is None
            and workload.get("sessions") is None
            and all(workload.get(f) is None for f in LOAD_FIELDS)
        ):
            data = {**data, "workload": {**workload, "kv_load_ratio": list(DEFAULT_PARETO_LOAD)}}
        return data

    @model_validator(mode="after")
    def _cross_section(self) -> "SmartSearchConfig":
        ranged = self.workload.kv_load_range() is not None
        if ranged and not self.goal.is_pareto:
            raise ValueError(
                f"a ranged workload.kv_load_ratio is only allowed when goal.target is 'pareto' "
                f"(got {self.goal.target.value!r}); use one scalar kv_load_ratio"
            )
        if ranged and self.sweep.policy == "thorough":
            raise ValueError(
                "sweep.policy 'thorough' enumerates a finite space, but workload.kv_load_ratio is a "
                f"continuous range {self.workload.kv_load_ratio} (a synthetic pareto goal without a load "
                "field defaults to [0.0, 1.0]); use one scalar kv_load_ratio or policy 'rapid'"
            )
        if self.evaluation.client_lengths == "fixed" and (
                self.workload.is_trace or self.workload.has_jitter or self.workload.turns_per_session > 1):
            raise ValueError(
                "evaluation.client_lengths 'fixed' describes a benchmark client that sends exactly the workload's "
                "isl and osl: it needs a synthetic workload without isl_jitter/osl_jitter and with turns_per_session 1"
            )
        if self.evaluation.client_lengths == "fixed" and self.evaluation.calibration == "none":
            raise ValueError("evaluation.client_lengths 'fixed' selects a calibration profile's fixed-length factors; "
                             "with evaluation.calibration 'none' there are none (use 'auto')")
        return self

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SmartSearchConfig":
        """Validate a plain dict (raises pydantic.ValidationError; load_config renders it)."""
        return cls.model_validate(data)
