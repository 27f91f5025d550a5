"""The Dagster launch form: the overrides people use (seed, budget, time budget, replays at once,
workload rate, SLA, ...), each sweep's file values as the form's defaults, and a field left at its
default keeping the file's current value."""

import dagster as dg
import pytest
from dagster_fakes import FakeEvaluator

from spica_pipeline.dagster.config import (
    LAUNCH_PATHS,
    SweepLaunchConfig,
    launch_config_for,
    overrides_of,
    read_sweep_config,
)
from spica_pipeline.dagster.factory import sweeps_definitions
from spica_pipeline.dagster.io import ParquetIOManager, SweepStorage
from spica_pipeline.dagster.spec import sweep_spec
from spica_pipeline.errors import ConfigError

SWEEP = """\
search_space:
  model_name: Qwen/Qwen3-32B
  hardware_sku: h200_sxm
  gpu_budget: 2
  deployment_mode: [agg]
  backend: [vllm]
  router_mode: [round_robin]
  planner_scaling_policy: [disabled]
workload: {isl: 512, osl: 64, request_rate: 4, num_request_ratio: 10}
goal:
  target: throughput_per_gpu
  sla: {ttft_ms: 500, itl_ms: 40}
sweep: {max_rounds: 3, candidates_per_round: 2, parallel_evals: 1, seed: 5, time_budget: 10m}
"""


def test_the_form_has_the_overrides_people_use_with_the_files_values():
    assert set(SweepLaunchConfig.model_fields) == set(LAUNCH_PATHS)
    assert {"seed", "max_rounds", "time_budget", "request_rate", "sla_ttft_ms", "sla_itl_ms"} <= set(LAUNCH_PATHS)
    form = launch_config_for("examples/configs/quickstart.yaml")
    defaults = {name: field.default for name, field in form.model_fields.items()}
    assert defaults == {"seed": 0, "max_rounds": 20, "time_budget": None, "parallel_evals": 2, "policy": "rapid",
                        "algorithm": "DEFAULT", "gpu_budget": 8, "request_rate": 8.0, "sla_ttft_ms": None,
                        "sla_itl_ms": None, "sla_e2e_ms": None}
    assert "(not set in the file)" in (form.model_fields["sla_itl_ms"].description or "")
    assert overrides_of(form()) == {}  # the defaults change nothing


def test_overrides_reach_the_validated_config(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(SWEEP)
    form = launch_config_for(path)
    assert form().time_budget == "10m" and form().sla_itl_ms == 40.0
    launch = form(seed=9, max_rounds=1, time_budget="90s", request_rate=6.5, sla_itl_ms=25.0, sla_ttft_ms=None)
    assert overrides_of(launch) == {"seed": 9, "max_rounds": 1, "time_budget": "90s", "request_rate": 6.5,
                                    "sla_itl_ms": 25.0, "sla_ttft_ms": None}
    config = read_sweep_config(path, launch)
    assert (config.sweep.seed, config.sweep.max_rounds, config.sweep.time_budget) == (9, 1, 90.0)
    assert config.workload.request_rate == 6.5
    assert (config.goal.sla.ttft_ms, config.goal.sla.itl_ms) == (None, 25.0)  # None removes a file's value
    with pytest.raises(ConfigError, match="time_budget"):
        read_sweep_config(path, form(time_budget="soon"))


def test_a_default_keeps_the_files_current_value(tmp_path):
    """The form's defaults are read at load; a run launched with them after the file changed uses the file."""
    path = tmp_path / "s.yaml"
    path.write_text(SWEEP)
    form = launch_config_for(path)
    path.write_text(SWEEP.replace("seed: 5", "seed: 6"))
    assert read_sweep_config(path, form()).sweep.seed == 6
    assert read_sweep_config(path, form(max_rounds=2)).sweep.seed == 6


def test_a_file_that_does_not_validate_gets_the_plain_form(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(SWEEP.replace("gpu_budget: 2", "gpu_budget: -1"))
    assert launch_config_for(path) is SweepLaunchConfig


def test_the_job_takes_the_form_and_runs_the_overrides(tmp_path):
    path = tmp_path / "launch.yaml"
    path.write_text(SWEEP.replace("time_budget: 10m", "policy: thorough").replace(
        "planner_scaling_policy: [disabled]",
        "planner_scaling_policy: [disabled]\n  agg_max_num_seqs: [256]\n  agg_max_num_batched_tokens: [8192]"))
    defs = sweeps_definitions([sweep_spec("launch", path)], resources={
        "io_manager": ParquetIOManager(base_dir=str(tmp_path / "assets")),
        "sweep_storage": SweepStorage(base_dir=str(tmp_path / "spica")), "replay": FakeEvaluator(),
        "vizier": None})
    job = defs.resolve_job_def("launch_sweep")
    schema = job.run_config_schema.config_type.fields["ops"].config_type.fields["launch__validated_config"]
    fields = schema.config_type.fields["config"].config_type.fields
    assert fields["seed"].default_value == 5 and fields["request_rate"].default_value == 4.0
    run_config = {"ops": {"launch__validated_config": {"config": {"seed": 11, "sla_itl_ms": 30.0}}}}
    result = job.execute_in_process(run_config=run_config, instance=dg.DagsterInstance.ephemeral(),
                                    asset_selection=[dg.AssetKey(["launch", "validated_config"])])
    meta = result.asset_materializations_for_node("launch__validated_config")[0].metadata
    assert meta["seed"].value == 11
    assert "itl_ms: 30.0" in meta["config"].value and "ttft_ms: 500.0" in meta["config"].value
