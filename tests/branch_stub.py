"""A test stand-in for search.branches.BranchSpace: the same attribute names, but every field past
the pool optional (a missing gpu_budget exercises the 'largest total in the pool' rule)."""

from dataclasses import dataclass, field


@dataclass
class Branch:
    deployment_mode: str
    parallel_configs: tuple
    supported_backends: tuple
    knob_choices: dict = field(default_factory=dict)
    gpu_budget: int | None = None
    float_ranges: dict = field(default_factory=dict)
