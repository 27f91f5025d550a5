"""`sweep:`: run control (rounds, batch size, budgets) plus our seeding, policy and algorithm choices."""

import os
import re
from typing import Literal, get_args

from pydantic import field_validator, model_validator

from spica_pipeline.config.types import Fraction, NonNegInt, PosFloat, PosInt, StrictModel, at_most_one
from spica_pipeline.errors import ConfigError

DEFAULT_MAX_ROUNDS = 20
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h)?\s*$")
_UNIT_S = {None: 1.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_duration(value: "str | int | float") -> float:
    """'90', '90s', '10m', '1.5h' or a number of seconds -> seconds (> 0)."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as '10m', '90s' or '1h'")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ValueError(f"{value!r} is not a duration; use e.g. '10m', '90s' or '1h'")
        seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"a duration must be > 0 seconds, got {value!r}")
    return seconds

# The Vizier designers a sweep may name: the one list (CLI help, Dagster launch config, the Vizier resource).
# how the cost-aware fill judges the optimizer share (optimize/study.py, optimize/cost.py)
CostAware = Literal["predicted", "measured", "off"]
Algorithm = Literal["DEFAULT", "GAUSSIAN_PROCESS_BANDIT", "RANDOM_SEARCH", "QUASI_RANDOM_SEARCH", "NSGA2"]
ALGORITHMS: tuple[str, ...] = get_args(Algorithm)
# Designers without a model: nothing to save by filling their asks from a cheaper one (cost-aware off).
MODEL_FREE_ALGORITHMS: tuple[str, ...] = ("RANDOM_SEARCH", "QUASI_RANDOM_SEARCH")
ALGO_ENV = "SPICA_VIZIER_ALGO"


def resolve_algorithm(configured: str | None, explicit: str | None = None) -> str:
    """SPICA_VIZIER_ALGO (operator escape hatch) > explicit argument > config; an unknown name is a
    ConfigError naming where it came from (so `spica validate` refuses it, not the first study)."""

    env = os.environ.get(ALGO_ENV, "").strip()
    name, source = (env, ALGO_ENV) if env else ((explicit, "algorithm") if explicit else (configured, "algorithm"))
    name = (name or "DEFAULT").strip().upper()
    if name in ("GP_UCB_PE", "ALGORITHM_UNSPECIFIED"):
        name = "DEFAULT"
    if name not in ALGORITHMS:
        raise ConfigError(f"{source}: unknown Vizier algorithm {name!r}; expected one of {list(ALGORITHMS)}")
    return name


class SweepConfig(StrictModel):
    """How long and how wide a sweep runs; every random choice derives from `seed`."""

    # Rounds of `per_round` trials per branch (the evaluation budget). Optional with a time budget:
    # then the sweep evaluates until the time is spent; without either, 20.
    max_rounds: PosInt | None = None
    # Wall-clock budget for the studies, e.g. "10m" (seconds as a number); split over the branches.
    time_budget: float | None = None
    # Stop a branch when its first N trials all failed for the same reason (0: never).
    failure_breaker: NonNegInt = 5
    # Cost-aware asks: while model-based suggestions would take more than `optimizer_share` of a
    # branch's wall time, fill asks from the cheap designers: the neighbourhood designer
    # (optimize/neighbourhood.py), then quasi-random (recorded per trial).
    # predicted (default): judged from predicted seconds (optimize/cost.py), so the same seed gives
    # the same ledger; measured: from measured seconds (adapts to the machine, but two fresh runs
    # can differ); off (or optimizer_share: null): the configured algorithm answers every ask.
    cost_aware: CostAware = "predicted"
    optimizer_share: Fraction | None = 0.25
    parallel_evals: PosInt = 16
    candidates_per_round: PosInt | None = None
    max_eval_seconds: PosFloat | None = 600.0
    seed: NonNegInt = 0
    # rapid: Vizier study per branch; thorough: exhaustive enumeration of a finite space.
    policy: Literal["rapid", "thorough"] = "rapid"
    algorithm: Algorithm = "DEFAULT"
    # kv_router candidates are replayed this many times (routing ties break randomly).
    router_repeats: PosInt = 3
    # Where candidate replays run (evaluate/pool.py interface): spawned processes on this machine,
    # or warm actors on a Ray cluster (docs/ray.md). Neither changes a result, only where it runs.
    executor: Literal["local", "ray"] = "local"
    # Ray cluster address; None reads RAY_ADDRESS, and with neither a local Ray is started.
    ray_address: str | None = None
    # refuse a sweep whose parallel replays would need more than this share of the machine's
    # memory (estimated by config/limits.py): better exit 2 up front than every worker aborting
    max_replay_memory_share: PosFloat = 0.5

    @field_validator("max_replay_memory_share")
    @classmethod
    def _share(cls, v: float) -> float:
        return at_most_one("max_replay_memory_share", v, zero_allowed=False)

    @field_validator("time_budget", mode="before")
    @classmethod
    def _duration(cls, value):
        return None if value is None else parse_duration(value)

    @model_validator(mode="after")
    def _default_rounds(self):
        if self.max_rounds is None and self.time_budget is None:
            object.__setattr__(self, "max_rounds", DEFAULT_MAX_ROUNDS)
        return self

    @property
    def evaluation_budget(self) -> int | None:
        """Trials per branch (every outcome counts), or None when only the time budget bounds it."""
        return None if self.max_rounds is None else self.max_rounds * self.per_round

    @property
    def per_round(self) -> int:
        """Unique successful replays wanted per round."""
        return self.candidates_per_round if self.candidates_per_round is not None else self.parallel_evals

    @property
    def eval_workers(self) -> int:
        """Candidates evaluated at once: parallel_evals, never more than a round asks for."""
        return max(1, min(self.parallel_evals, self.per_round))
