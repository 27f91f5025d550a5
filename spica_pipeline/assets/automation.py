"""The sweep job, the nightly schedule and the trace-change sensor.

Which sweeps they run: `$SPICA_SWEEP_CONFIGS` (config paths separated by ',' or ':'), default the
bundled quickstart. Both start STOPPED; turn them on in the UI (Automation) or with GraphQL.
"""

import json
import os
import re
from typing import Any

import dagster as dg

from spica_pipeline.assets.config import DEFAULT_CONFIG, GROUP, resolve_path
from spica_pipeline.assets.studies import ALL_MODES_TAGS
from spica_pipeline.errors import SpicaError

NIGHTLY_CRON_ENV = "SPICA_NIGHTLY_CRON"
DEFAULT_NIGHTLY_CRON = "0 2 * * *"
SWEEP_CONFIGS_ENV = "SPICA_SWEEP_CONFIGS"
SWEEP_TAG = "spica/sweep"  # dagster.yaml limits concurrent runs with this tag (assets are shared)

sweep_job = dg.define_asset_job(
    "spica_sweep",
    selection=dg.AssetSelection.groups(GROUP),
    description="All six stages in one run; branch_study covers both mode partitions (agg..disagg).",
    tags={**ALL_MODES_TAGS, SWEEP_TAG: "1"},
)


def configured_sweeps() -> list[str]:
    raw = os.environ.get(SWEEP_CONFIGS_ENV, "").strip()
    if not raw:
        return [DEFAULT_CONFIG]
    return [p.strip() for p in re.split(r"[,:]", raw) if p.strip()]


def sweep_run_config(config_path: str, *, warm_start: bool) -> dict[str, Any]:
    return {"ops": {"validated_config": {"config": {"config_path": config_path}},
                    "branch_study": {"config": {"warm_start": warm_start}}}}


def nightly_cron() -> str:
    return os.environ.get(NIGHTLY_CRON_ENV, "").strip() or DEFAULT_NIGHTLY_CRON


def _sweep_name(path: str) -> str:
    return resolve_path(path).stem


@dg.schedule(
    name="spica_nightly",
    job=sweep_job,
    cron_schedule=nightly_cron(),
    execution_timezone="UTC",
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description="Re-runs the configured sweeps, warm-started from the previous night's trials "
    "where the branch space is unchanged.",
)
def spica_nightly(context: dg.ScheduleEvaluationContext):
    when = context.scheduled_execution_time.isoformat() if context.scheduled_execution_time else "now"
    return [
        dg.RunRequest(
            run_key=f"{_sweep_name(path)}@{when}",
            run_config=sweep_run_config(path, warm_start=True),
            tags={"spica/trigger": "nightly", "spica/config": path},
        )
        for path in configured_sweeps()
    ]


def _trace_of(path: str) -> str | None:
    """The configured sweep's trace file, or None for a synthetic workload or a bad config."""
    from spica_pipeline.config import load_config

    try:
        config = load_config(resolve_path(path))
    except SpicaError:
        return None
    trace = config.workload.trace_path
    return str(resolve_path(trace)) if trace else None


@dg.sensor(
    name="spica_trace_changed",
    job=sweep_job,
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.STOPPED,
    description="Re-materializes a configured sweep when the bytes of its trace file change "
    "(sha256 cursor: a touch that only changes the modification time does nothing).",
)
def spica_trace_changed(context: dg.SensorEvaluationContext):
    from spica_pipeline.traces import trace_content_hash

    seen: dict[str, str] = json.loads(context.cursor) if context.cursor else {}
    requests, notes = [], []
    updated = dict(seen)
    for path in configured_sweeps():
        trace = _trace_of(path)
        if trace is None:
            continue
        try:
            digest = trace_content_hash(trace)
        except SpicaError as err:
            notes.append(str(err))
            continue
        previous = seen.get(trace)
        updated[trace] = digest
        if previous is None:
            notes.append(f"{trace}: baseline recorded")
        elif previous != digest:
            requests.append(dg.RunRequest(
                run_key=f"{_sweep_name(path)}:{digest[:16]}",
                run_config=sweep_run_config(path, warm_start=False),
                tags={"spica/trigger": "trace_changed", "spica/config": path, "spica/trace_sha256": digest},
            ))
    cursor = json.dumps(updated, sort_keys=True)
    if requests:
        return dg.SensorResult(run_requests=requests, cursor=cursor)
    if not updated:
        return dg.SkipReason(f"no configured sweep uses a trace (${SWEEP_CONFIGS_ENV}: {configured_sweeps()})")
    context.update_cursor(cursor)
    return dg.SkipReason("; ".join(notes) or "trace unchanged")
