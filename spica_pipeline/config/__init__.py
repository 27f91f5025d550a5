"""The sweep config: pydantic schema, choice tables and composite presets, and the file loader."""

from spica_pipeline.config import presets
from spica_pipeline.config.goal import (
    DEFAULT_PARETO_OBJECTIVES,
    GOODPUT_KEY,
    GOODPUT_TARGETS,
    LoadTarget,
    OptimizationGoal,
    SLATarget,
    Target,
    as_target,
    objectives_for,
    planner_target,
    target_direction,
)
from spica_pipeline.config.loader import load_config, parse_yaml_text
from spica_pipeline.config.messages import render_validation_error
from spica_pipeline.config.model import SmartSearchConfig
from spica_pipeline.config.search_space import SearchSpace
from spica_pipeline.config.sweep import ALGORITHMS, SweepConfig
from spica_pipeline.config.workload import Workload

__all__ = [
    "ALGORITHMS",
    "DEFAULT_PARETO_OBJECTIVES",
    "GOODPUT_KEY",
    "GOODPUT_TARGETS",
    "LoadTarget",
    "OptimizationGoal",
    "SLATarget",
    "SearchSpace",
    "SmartSearchConfig",
    "SweepConfig",
    "Target",
    "Workload",
    "as_target",
    "load_config",
    "objectives_for",
    "parse_yaml_text",
    "planner_target",
    "presets",
    "render_validation_error",
    "target_direction",
]
