"""Short construction of a real `search.branches.BranchSpace` for the encoding, projection and Vizier
tests: the stand-in is the production type itself, so `gpu_budget` is required as it is there."""

from typing import Any

from spica_pipeline.space.branches import BranchSpace


def Branch(deployment_mode: str, parallel_configs: tuple, supported_backends: tuple,
           knob_choices: dict[str, list[Any]], gpu_budget: int,
           float_ranges: dict[str, tuple[float, float]] | None = None) -> BranchSpace:
    return BranchSpace(deployment_mode, tuple(parallel_configs), tuple(supported_backends), dict(knob_choices),
                       gpu_budget, dict(float_ranges or {}))
