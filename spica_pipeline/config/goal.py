"""`goal:`: what a sweep optimises; pinned, never searched (spec §4)."""

from enum import Enum
from typing import Literal

from pydantic import model_validator

from spica_pipeline.config.types import PosFloat, StrictModel


class Target(str, Enum):
    THROUGHPUT = "throughput"
    THROUGHPUT_PER_GPU = "throughput_per_gpu"
    THROUGHPUT_PER_USER = "throughput_per_user"
    E2E_LATENCY = "e2e_latency"
    GOODPUT = "goodput"
    GOODPUT_PER_GPU = "goodput_per_gpu"
    PARETO = "pareto"

    def __str__(self) -> str:  # "throughput", not "Target.THROUGHPUT", in messages and f-strings
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


GOODPUT_TARGETS = frozenset({Target.GOODPUT, Target.GOODPUT_PER_GPU})
DEFAULT_PARETO_OBJECTIVES = (Target.THROUGHPUT_PER_GPU, Target.THROUGHPUT_PER_USER)


def _as_target(target: "Target | str") -> Target:
    try:
        return Target(target)
    except ValueError:
        raise ValueError(f"unknown optimization target {target!r}") from None


def target_direction(target: "Target | str") -> Literal["max", "min"]:
    """Every target is maximised except e2e_latency; pareto has no scalar direction."""
    t = _as_target(target)
    if t is Target.PARETO:
        raise ValueError("'pareto' is multi-objective and has no scalar direction")
    return "min" if t is Target.E2E_LATENCY else "max"


def planner_target(target: "Target | str") -> Literal["sla", "throughput", "latency"]:
    """The planner optimisation target a goal maps to (spec §1 stage 2)."""
    t = _as_target(target)
    if t in GOODPUT_TARGETS:
        return "sla"
    if t is Target.E2E_LATENCY:
        return "latency"
    return "throughput"


class SLATarget(StrictModel):
    """Per-request thresholds in ms; replay counts a request as good only if it meets all set ones."""

    ttft_ms: PosFloat | None = None
    itl_ms: PosFloat | None = None
    e2e_ms: PosFloat | None = None

    @property
    def satisfying(self) -> bool:
        """e2e_ms alone, or both ttft_ms and itl_ms: enough to judge every request."""
        return self.e2e_ms is not None or (self.ttft_ms is not None and self.itl_ms is not None)

    @property
    def has_ttft_itl(self) -> bool:
        return self.ttft_ms is not None and self.itl_ms is not None


class OptimizationGoal(StrictModel):
    target: Target = Target.THROUGHPUT
    sla: SLATarget | None = None
    pareto_objectives: list[Target] | None = None
    # "strict": a candidate whose p90 TTFT / ITL / E2E breaks a set SLA threshold is gated out
    # before ranking (recorded as infeasible); "off": the SLA acts only through goodput (Spica's rule).
    sla_gate: Literal["off", "strict"] = "off"

    @model_validator(mode="after")
    def _rules(self) -> "OptimizationGoal":
        if self.sla_gate == "strict" and self.sla is None:
            raise ValueError("sla_gate 'strict' needs goal.sla (ttft_ms, itl_ms and/or e2e_ms)")
        if self.pareto_objectives is not None:
            if self.target is not Target.PARETO:
                raise ValueError("pareto_objectives is only valid when target is 'pareto'")
            objs = self.pareto_objectives
            if len(objs) < 2:
                raise ValueError(f"pareto_objectives needs at least 2 objectives, got {len(objs)}")
            if Target.PARETO in objs:
                raise ValueError("pareto_objectives must not contain 'pareto'")
            if len(set(objs)) != len(objs):
                raise ValueError("pareto_objectives must be distinct")
        needs_sla = sorted(t.value for t in self.objectives() if t in GOODPUT_TARGETS)
        if needs_sla and (self.sla is None or not self.sla.satisfying):
            what = needs_sla[0] if self.target in GOODPUT_TARGETS else needs_sla
            raise ValueError(f"{what} require an SLA target (ttft_ms+itl_ms or e2e_ms)"
                             if isinstance(what, list) else
                             f"target {what} requires an SLA target (ttft_ms+itl_ms or e2e_ms)")
        return self

    @property
    def is_pareto(self) -> bool:
        return self.target is Target.PARETO

    def objectives(self) -> list[Target]:
        """The effective objective list: [target] for a scalar goal, else the Pareto objectives."""
        if self.target is not Target.PARETO:
            return [self.target]
        if self.pareto_objectives is None:
            return list(DEFAULT_PARETO_OBJECTIVES)
        return list(self.pareto_objectives)
