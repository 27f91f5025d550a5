"""`sweep:`: run control (spec §2.8) plus our seeding, policy and algorithm choices."""

import os
from typing import Literal, get_args

from pydantic import field_validator

from spica_pipeline.config.types import NonNegInt, PosFloat, PosInt, StrictModel

# The Vizier designers a sweep may name: the one list (CLI help, Dagster launch config, the Vizier resource).
Algorithm = Literal["DEFAULT", "GAUSSIAN_PROCESS_BANDIT", "RANDOM_SEARCH", "QUASI_RANDOM_SEARCH", "NSGA2"]
ALGORITHMS: tuple[str, ...] = get_args(Algorithm)
ALGO_ENV = "SPICA_VIZIER_ALGO"


def resolve_algorithm(configured: str | None, explicit: str | None = None) -> str:
    """SPICA_VIZIER_ALGO (operator escape hatch) > explicit argument > config; an unknown name is a
    ConfigError naming where it came from (so `spica validate` refuses it, not the first study)."""
    from spica_pipeline.errors import ConfigError

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

    max_rounds: PosInt = 20
    parallel_evals: PosInt = 16
    candidates_per_round: PosInt | None = None
    max_eval_seconds: PosFloat | None = 600.0
    seed: NonNegInt = 0
    # rapid: Vizier study per branch; thorough: exhaustive enumeration of a finite space.
    policy: Literal["rapid", "thorough"] = "rapid"
    algorithm: Algorithm = "DEFAULT"
    # kv_router candidates are replayed this many times (routing ties break randomly).
    router_repeats: PosInt = 3
    # Where candidate replays run (resources/pool.py interface): spawned processes on this machine,
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
        if v > 1:
            raise ValueError(f"max_replay_memory_share must be in (0, 1], got {v}")
        return v

    @property
    def per_round(self) -> int:
        """Unique successful replays wanted per round."""
        return self.candidates_per_round if self.candidates_per_round is not None else self.parallel_evals

    @property
    def eval_workers(self) -> int:
        """Candidates evaluated at once: parallel_evals, never more than a round asks for."""
        return max(1, min(self.parallel_evals, self.per_round))
