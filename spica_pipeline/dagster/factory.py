"""One sweep config -> one asset graph (sources, six stages, deploy, checks, job, nightly).

`build_sweep_defs` is what the `SpicaSweep` component calls for each `defs/<name>/defs.yaml`;
`code_location` adds what a code location needs once (resources, executor, sensors).
"""

import os

import dagster as dg

from spica_pipeline.dagster.automation import build_automation_sensor, build_nightly, build_sweep_job
from spica_pipeline.dagster.branches import build_branch_spaces
from spica_pipeline.dagster.checks import build_checks
from spica_pipeline.dagster.config import build_validated_config
from spica_pipeline.dagster.io import ParquetIOManager, SweepStorage
from spica_pipeline.dagster.load_predictor import build_load_predictor_result
from spica_pipeline.dagster.policies import build_filtered_config
from spica_pipeline.dagster.resources import EvaluationBackendResource
from spica_pipeline.dagster.result import build_deploy, build_sweep_result
from spica_pipeline.dagster.sources import build_sources, build_watch_sensor, watched_files
from spica_pipeline.dagster.spec import SweepSpec
from spica_pipeline.dagster.studies import build_branch_study
from spica_pipeline.evaluate.replay import ReplayEvaluator
from spica_pipeline.optimize.vizier import VizierClient

SPEC_METADATA_KEY = "spica/sweep_spec"


def build_sweep_defs(spec: SweepSpec) -> dg.Definitions:
    result = build_sweep_result(spec)
    assets = [*build_sources(spec), build_validated_config(spec), build_filtered_config(spec),
              build_load_predictor_result(spec), build_branch_spaces(spec), build_branch_study(spec),
              result, build_deploy(spec, result)]
    job = build_sweep_job(spec)
    nightly = build_nightly(spec, job)
    return dg.Definitions(assets=assets, asset_checks=build_checks(spec), jobs=[job],
                          schedules=[nightly] if nightly else [])


EXECUTOR_ENV = "SPICA_DAGSTER_EXECUTOR"
EXECUTORS = {"in_process": dg.in_process_executor, "multiprocess": dg.multiprocess_executor}


def default_executor() -> dg.ExecutorDefinition:
    """in_process unless `$SPICA_DAGSTER_EXECUTOR=multiprocess` (configuration, read at load)."""
    name = os.environ.get(EXECUTOR_ENV, "").strip() or "in_process"
    if name not in EXECUTORS:
        raise ValueError(f"{EXECUTOR_ENV}={name!r}: expected one of {sorted(EXECUTORS)}")
    return EXECUTORS[name]


def default_resources() -> dict:

    return {"io_manager": ParquetIOManager(), "sweep_storage": SweepStorage(), "replay": ReplayEvaluator(),
            "vizier": VizierClient(), "evaluation_backend": EvaluationBackendResource()}


def code_location(files: dict[dg.AssetKey, str], *, resources: dict | None = None,
                  automation_status=dg.DefaultSensorStatus.STOPPED,
                  watch_status=dg.DefaultSensorStatus.RUNNING, interval_s: int = 30) -> dg.Definitions:
    """What a code location adds once to its sweeps' graphs: resources, executor, the file watcher
    and the automation condition sensor."""
    return dg.Definitions(
        sensors=[build_watch_sensor(files, default_status=watch_status, interval_s=interval_s),
                 build_automation_sensor(default_status=automation_status, interval_s=interval_s)],
        # evaluation_backend defaults to each sweep's own sweep.executor when a caller leaves it out
        resources={"evaluation_backend": EvaluationBackendResource(),
                   **(resources if resources is not None else default_resources())},
        executor=default_executor(),
    )


def sweeps_definitions(specs: list[SweepSpec], **kw) -> dg.Definitions:
    """A whole code location from sweep specs (tests, or a location built without a defs folder)."""
    files = {k: p for s in specs for k, p in watched_files(s).items()}
    return dg.Definitions.merge(*[build_sweep_defs(s) for s in specs], code_location(files, **kw))
