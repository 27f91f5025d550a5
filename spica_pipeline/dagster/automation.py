"""Per sweep: the launchpad job (every stage, every searched mode, in one run) and the nightly
schedule (warm start). Per code location: the automation condition sensor that evaluates the
stages' `eager()` conditions."""

from typing import Any

import dagster as dg

from spica_pipeline.dagster.spec import SWEEP_TAG, SweepSpec


def sweep_run_config(spec: SweepSpec, *, warm_start: bool) -> dict[str, Any]:
    """Run config for the sweep's job: ops are named by the asset key (`<sweep>__branch_study`)."""
    return {"ops": {"__".join(spec.key("branch_study").path): {"config": {"warm_start": warm_start}}}}


def build_sweep_job(spec: SweepSpec) -> Any:
    stages = dg.AssetSelection.groups(spec.group) - dg.AssetSelection.assets(*spec.source_keys)
    return dg.define_asset_job(
        f"{spec.name}_sweep",
        selection=stages,
        description=f"Sweep {spec.name}: every stage and check in one run, all searched modes "
        f"({', '.join(spec.modes)}). Open launchpad (next to Materialize all) for the overrides: "
        "validated_config's config (seed, max_rounds, time_budget, parallel_evals, policy, algorithm, gpu_budget, "
        "request_rate, sla_ttft_ms, sla_itl_ms, sla_e2e_ms; defaults: the sweep's file); warm start: "
        "branch_study's config.",
        tags={**spec.all_modes_tags, SWEEP_TAG: spec.name},
    )


def build_nightly(spec: SweepSpec, job: Any) -> dg.ScheduleDefinition | None:
    if not spec.nightly_cron:
        return None
    return dg.ScheduleDefinition(
        name=f"{spec.name}_nightly",
        job=job,
        cron_schedule=spec.nightly_cron,
        execution_timezone="UTC",
        run_config=sweep_run_config(spec, warm_start=True),
        tags={"spica/trigger": "nightly"},
        default_status=dg.DefaultScheduleStatus.STOPPED,
        description=f"Re-runs sweep {spec.name}, warm-started from the previous run's trials where the "
        "branch space is unchanged.",
    )


def build_automation_sensor(*, default_status=dg.DefaultSensorStatus.STOPPED,
                            interval_s: int = 30) -> dg.AutomationConditionSensorDefinition:
    return dg.AutomationConditionSensorDefinition(
        "spica_automation",
        target=dg.AssetSelection.all(),
        default_status=default_status,
        minimum_interval_seconds=interval_s,
        description="Evaluates the stages' eager() conditions: a sweep whose config or trace content "
        "changed is re-materialized (that sweep only).",
    )
