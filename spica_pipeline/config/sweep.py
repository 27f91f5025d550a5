"""`sweep:`: run control (spec §2.8) plus our seeding, policy and algorithm choices."""

from typing import Literal, get_args

from spica_pipeline.config.types import NonNegInt, PosFloat, PosInt, StrictModel

# The Vizier designers a sweep may name: the one list (CLI help, Dagster launch config, the Vizier resource).
Algorithm = Literal["DEFAULT", "GAUSSIAN_PROCESS_BANDIT", "RANDOM_SEARCH", "QUASI_RANDOM_SEARCH", "NSGA2"]
ALGORITHMS: tuple[str, ...] = get_args(Algorithm)


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

    @property
    def per_round(self) -> int:
        """Unique successful replays wanted per round."""
        return self.candidates_per_round if self.candidates_per_round is not None else self.parallel_evals

    @property
    def eval_workers(self) -> int:
        """Candidates evaluated at once: parallel_evals, never more than a round asks for."""
        return max(1, min(self.parallel_evals, self.per_round))
