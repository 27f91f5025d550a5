"""The Dagster code location: six sweep stages as assets, with checks, schedule and sensor.

`dagster dev` (pyproject `[tool.dagster]` or `workspace.yaml`) loads `defs`. Steps run in one
process by default: the multiprocess executor costs ~5 s per step on a small machine and would
make JAX and the replay workers compete for cores (see docs/dagster.md for parallel and cluster
executors).
"""

import os

import dagster as dg

from spica_pipeline.assets.automation import spica_nightly, spica_trace_changed, sweep_job
from spica_pipeline.assets.branches import branch_spaces
from spica_pipeline.assets.checks import ALL_CHECKS
from spica_pipeline.assets.config import validated_config
from spica_pipeline.assets.io import ParquetIOManager, SweepStorage
from spica_pipeline.assets.load_predictor import load_predictor_result
from spica_pipeline.assets.policies import filtered_config
from spica_pipeline.assets.result import sweep_result
from spica_pipeline.assets.studies import branch_study
from spica_pipeline.resources.replay import ReplayEvaluator
from spica_pipeline.resources.vizier import VizierClient

ASSETS = [validated_config, filtered_config, load_predictor_result, branch_spaces, branch_study, sweep_result]


EXECUTOR_ENV = "SPICA_DAGSTER_EXECUTOR"
EXECUTORS = {"in_process": dg.in_process_executor, "multiprocess": dg.multiprocess_executor}


def default_executor() -> dg.ExecutorDefinition:
    """in_process unless `$SPICA_DAGSTER_EXECUTOR=multiprocess` (configuration, read at load)."""
    name = os.environ.get(EXECUTOR_ENV, "").strip() or "in_process"
    if name not in EXECUTORS:
        raise ValueError(f"{EXECUTOR_ENV}={name!r}: expected one of {sorted(EXECUTORS)}")
    return EXECUTORS[name]


def default_resources() -> dict:
    return {
        "io_manager": ParquetIOManager(),
        "sweep_storage": SweepStorage(),
        "replay": ReplayEvaluator(),
        "vizier": VizierClient(),
    }


defs = dg.Definitions(
    assets=ASSETS,
    asset_checks=ALL_CHECKS,
    jobs=[sweep_job],
    schedules=[spica_nightly],
    sensors=[spica_trace_changed],
    resources=default_resources(),
    executor=default_executor(),
)
