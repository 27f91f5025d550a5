"""`goal:`: what a sweep optimises; pinned, never searched."""

from enum import Enum
from typing import Any, Literal, Mapping, Sequence

from pydantic import field_validator, model_validator

from spica_pipeline.config.types import Fraction, PosFloat, PosInt, StrictModel


class Target(str, Enum):
    THROUGHPUT = "throughput"
    THROUGHPUT_PER_GPU = "throughput_per_gpu"
    THROUGHPUT_PER_USER = "throughput_per_user"
    E2E_LATENCY = "e2e_latency"
    GOODPUT = "goodput"
    GOODPUT_PER_GPU = "goodput_per_gpu"
    PARETO = "pareto"
    # The smallest fleet that serves goal.load within goal.sla: the study maximises replayed
    # request throughput per GPU among SLA-passing candidates; the merge sizes each pick's fleet.
    MIN_GPUS = "min_gpus"
    # USD per million output tokens: the deployment's GPU-hours priced by goal.gpu_prices (minimised).
    COST_PER_MTOK = "cost_per_mtok"

    def __str__(self) -> str:  # "throughput", not "Target.THROUGHPUT", in messages and f-strings
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


GOODPUT_TARGETS = frozenset({Target.GOODPUT, Target.GOODPUT_PER_GPU})
DEFAULT_PARETO_OBJECTIVES = (Target.THROUGHPUT_PER_GPU, Target.THROUGHPUT_PER_USER)
# The replay report key goodput targets read: output tokens/s of requests that met the SLA.
GOODPUT_KEY = "goodput_output_throughput_tok_s"

PlannerTarget = Literal["sla", "throughput", "latency"]
# Targets whose smaller value is better; every other scalar target is maximised.
MINIMISED_TARGETS = frozenset({Target.E2E_LATENCY, Target.COST_PER_MTOK})
# The share of requests that must meet goal.sla for a pick to count as meeting it.
DEFAULT_SLA_ATTAINMENT = 0.90
# The report key that carries the GPU price a cost target reads (USD per GPU-hour).
GPU_PRICE_KEY = "gpu_usd_per_hour"
# USD per GPU-hour by GPU system, what cost_per_mtok and the report's cost columns use unless
# goal.gpu_prices says otherwise. Indicative on-demand cloud prices for comparing picks of one
# sweep (one GPU type, so the price scales every pick alike); not a quote: set goal.gpu_prices to
# what the GPUs cost you.
DEFAULT_GPU_PRICES: dict[str, float] = {
    "a100_pcie": 1.6, "a100_sxm": 1.8, "a30": 0.9, "b200_sxm": 6.0, "b300_sxm": 7.5, "b60": 0.6,
    "gb200": 7.0, "gb300": 8.5, "h100_pcie": 2.5, "h100_sxm": 3.0, "h200_sxm": 3.8, "l4": 0.8,
    "l40s": 1.2, "rtx_pro_6000_server": 1.8,
}


def as_target(target: "Target | str") -> Target:
    """A target name (or member) as the enum; unknown names are a ValueError naming them."""
    try:
        return Target(target)
    except ValueError:
        raise ValueError(f"unknown optimization target {target!r}") from None


def target_direction(target: "Target | str") -> Literal["max", "min"]:
    """Every target is maximised except e2e_latency and cost_per_mtok; pareto has no scalar direction."""
    t = as_target(target)
    if t is Target.PARETO:
        raise ValueError("'pareto' is multi-objective and has no scalar direction")
    return "min" if t in MINIMISED_TARGETS else "max"


def gpu_price(system: str | None, overrides: Mapping[str, float] | None = None) -> float | None:
    """USD per GPU-hour of a GPU system: goal.gpu_prices' entry, else DEFAULT_GPU_PRICES'; None for
    a system neither lists."""
    if not system:
        return None
    key = str(system).lower()
    for table in (overrides or {}, DEFAULT_GPU_PRICES):
        for name, price in table.items():
            if name.lower() == key:
                return float(price)
    return None


def planner_target(target: "Target | str") -> PlannerTarget:
    """The planner optimisation target a goal maps to (it decides which scaling policies stay)."""
    t = as_target(target)
    if t in GOODPUT_TARGETS or t is Target.MIN_GPUS:
        return "sla"
    if t is Target.E2E_LATENCY:
        return "latency"
    return "throughput"


def objectives_for(target: "Target | str", pareto_objectives: "Sequence[Target | str] | None" = None) -> list[Target]:
    """The objectives a goal scores: [target] for a scalar goal, else the Pareto list (default pair)."""
    t = as_target(target)
    if t is not Target.PARETO:
        return [t]
    return [as_target(o) for o in (pareto_objectives or DEFAULT_PARETO_OBJECTIVES)]


class SLATarget(StrictModel):
    """Per-request thresholds in ms; replay counts a request as good only if it meets all set ones.

    itl_ms is the per-request mean inter-token latency, the quantity other tools call TPOT: `tpot_ms`
    is read as itl_ms."""

    ttft_ms: PosFloat | None = None
    itl_ms: PosFloat | None = None
    e2e_ms: PosFloat | None = None

    @model_validator(mode="before")
    @classmethod
    def _tpot_is_itl(cls, data: Any) -> Any:
        if isinstance(data, dict) and "tpot_ms" in data:
            if data.get("itl_ms") is not None:
                raise ValueError("goal.sla: give itl_ms or tpot_ms, not both (tpot_ms is read as itl_ms)")
            data = {("itl_ms" if k == "tpot_ms" else k): v for k, v in data.items()}
        return data

    @property
    def satisfying(self) -> bool:
        """e2e_ms alone, or both ttft_ms and itl_ms: enough to judge every request."""
        return self.e2e_ms is not None or (self.ttft_ms is not None and self.itl_ms is not None)


class LoadTarget(StrictModel):
    """The load a min_gpus fleet must carry: a request rate (req/s) or a number of requests in flight."""

    request_rate: PosFloat | None = None
    concurrency: PosInt | None = None

    @model_validator(mode="after")
    def _one(self) -> "LoadTarget":
        if (self.request_rate is None) == (self.concurrency is None):
            raise ValueError("goal.load needs exactly one of request_rate or concurrency")
        return self

    @property
    def kind(self) -> Literal["request_rate", "concurrency"]:
        return "request_rate" if self.request_rate is not None else "concurrency"

    @property
    def value(self) -> float:
        return float(self.request_rate if self.request_rate is not None else self.concurrency)  # type: ignore[arg-type]


class OptimizationGoal(StrictModel):
    target: Target = Target.THROUGHPUT
    sla: SLATarget | None = None
    # min_gpus only: the load the fleet must serve within the SLA.
    load: LoadTarget | None = None
    pareto_objectives: list[Target] | None = None
    # "strict": a candidate whose p90 TTFT / ITL / E2E breaks a set SLA threshold is gated out
    # before ranking (recorded as infeasible); "off": the SLA acts only through goodput (Spica's rule).
    sla_gate: Literal["off", "strict"] = "off"
    # With goal.sla: the share of requests a pick must serve within it (calibrated latencies when a
    # calibration profile is on); candidates below it rank after those that reach it.
    sla_attainment: Fraction | None = None
    # "required": a candidate that does not carry the offered request rate in steady state ranks after
    # every candidate that does; "report": it is only marked. Open-loop workloads (request_rate, trace).
    offered_load: Literal["required", "report"] = "required"
    # USD per GPU-hour by GPU system (e.g. h200_sxm: 3.5), over DEFAULT_GPU_PRICES: cost_per_mtok and
    # the report's cost columns.
    gpu_prices: dict[str, PosFloat] | None = None

    @field_validator("gpu_prices")
    @classmethod
    def _known_systems(cls, prices: dict[str, float] | None) -> dict[str, float] | None:
        unknown = sorted(k for k in prices or {} if k.lower() not in DEFAULT_GPU_PRICES)
        if unknown:
            raise ValueError(f"goal.gpu_prices: unknown GPU system(s) {unknown} (known: "
                             f"{', '.join(sorted(DEFAULT_GPU_PRICES))})")
        return prices

    @model_validator(mode="before")
    @classmethod
    def _min_gpus_gates_the_sla(cls, data: Any) -> Any:
        """min_gpus judges 'meets the SLA' by the p90 gate, so its gate is strict unless said otherwise."""
        if isinstance(data, dict) and str(data.get("target")) in ("min_gpus", "Target.MIN_GPUS") \
                and data.get("sla_gate") is None:
            data = {**data, "sla_gate": "strict"}
        return data

    @model_validator(mode="after")
    def _rules(self) -> "OptimizationGoal":
        if self.target is Target.MIN_GPUS:
            if self.load is None:
                raise ValueError("target min_gpus needs goal.load (request_rate or concurrency) to size the fleet for")
            if self.sla is None:
                raise ValueError("target min_gpus needs goal.sla (ttft_ms+itl_ms or e2e_ms): the load must be "
                                 "served within it")
            if self.sla_gate != "strict":
                raise ValueError("target min_gpus needs sla_gate 'strict' (a candidate either meets the SLA or "
                                 "cannot be part of the fleet)")
        elif self.load is not None:
            raise ValueError(f"goal.load is only used by target min_gpus (target is {self.target.value!r})")
        if self.sla_gate == "strict" and self.sla is None:
            raise ValueError("sla_gate 'strict' needs goal.sla (ttft_ms, itl_ms and/or e2e_ms)")
        if self.sla_attainment is not None and self.sla is None:
            raise ValueError("goal.sla_attainment needs goal.sla (the thresholds requests are judged by)")
        if self.pareto_objectives is not None:
            if self.target is not Target.PARETO:
                raise ValueError("pareto_objectives is only valid when target is 'pareto'")
            objs = self.pareto_objectives
            if len(objs) < 2:
                raise ValueError(f"pareto_objectives needs at least 2 objectives, got {len(objs)}")
            if Target.PARETO in objs:
                raise ValueError("pareto_objectives must not contain 'pareto'")
            if Target.MIN_GPUS in objs:
                raise ValueError("pareto_objectives must not contain 'min_gpus' (it needs a load target; use "
                                 "target min_gpus)")
            if len(set(objs)) != len(objs):
                raise ValueError("pareto_objectives must be distinct")
        needs_sla = self.goodput_objectives()
        if needs_sla and (self.sla is None or not self.sla.satisfying):
            what = needs_sla[0] if self.target in GOODPUT_TARGETS else needs_sla
            raise ValueError(f"{what} require an SLA target (ttft_ms+itl_ms or e2e_ms)"
                             if isinstance(what, list) else
                             f"target {what} requires an SLA target (ttft_ms+itl_ms or e2e_ms)")
        return self

    @property
    def is_pareto(self) -> bool:
        return self.target is Target.PARETO

    def required_attainment(self) -> float | None:
        """The share of requests a pick must serve within goal.sla; None without an SLA."""
        if self.sla is None:
            return None
        return self.sla_attainment if self.sla_attainment is not None else DEFAULT_SLA_ATTAINMENT

    def gpu_usd_per_hour(self, system: str | None) -> float | None:
        """The price of one GPU-hour of `system` under this goal (gpu_prices, else the default table)."""
        return gpu_price(system, self.gpu_prices)

    def scores_cost(self) -> bool:
        """Whether an objective of this goal reads the GPU price (cost_per_mtok)."""
        return Target.COST_PER_MTOK in self.objectives()

    def sla_thresholds(self) -> dict[str, float] | None:
        """The set SLA thresholds (ms) by name, or None without an SLA: what the gate and the
        steady-state window's goodput read."""
        return self.sla.model_dump(exclude_none=True) if self.sla is not None else None

    @property
    def planner_target(self) -> PlannerTarget:
        return planner_target(self.target)

    def objectives(self) -> list[Target]:
        """The effective objective list: [target] for a scalar goal, else the Pareto objectives."""
        return objectives_for(self.target, self.pareto_objectives)

    def objective_names(self) -> list[str]:
        return [t.value for t in self.objectives()]

    def goodput_objectives(self) -> list[str]:
        """The active objectives that read GOODPUT_KEY (each needs the SLA and the replay's goodput)."""
        return sorted(t.value for t in self.objectives() if t in GOODPUT_TARGETS)
