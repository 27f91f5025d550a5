"""The Dagster pipeline: IO manager, launch config, checks, schedule, sensor, and full
materializations (fake evaluator for the unit path, the real replay for the integration path)."""

import json
import os
import time
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest

from spica_pipeline.assets import automation, checks
from spica_pipeline.assets.config import SweepLaunchConfig, read_launch_config, validated_config
from spica_pipeline.assets.io import ParquetIOManager, SweepStorage
from spica_pipeline.assets.studies import ALL_MODES_TAGS, mode_partitions
from spica_pipeline.errors import ConfigError
from spica_pipeline.search.evaluation import EvalOutcome

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "examples" / "traces" / "small_mooncake.jsonl"

TINY_YAML = """\
search_space:
  model_name: Qwen/Qwen3-32B
  hardware_sku: h200_sxm
  gpu_budget: 2
  deployment_mode: [agg]
  backend: [vllm]
  router_mode: [round_robin]
  planner_scaling_policy: [disabled]
workload:
  isl: 512
  osl: 64
  request_rate: 4
  num_request_ratio: 10
sweep:
  max_rounds: 1
  candidates_per_round: 2
  parallel_evals: 1
  algorithm: RANDOM_SEARCH
"""


class FakeEvaluator:
    """Deterministic stand-in for the replay: throughput grows with max_num_seqs, per-GPU falls with GPUs."""

    def evaluate(self, request):
        s = request.sample
        gpus = max(1, int(s.get("agg_tp", 1) or 1) * int(s.get("agg_replicas", 1) or 1))
        seqs = float(s.get("agg_max_num_seqs") or 256)
        tput = 1000.0 + seqs + 100.0 / gpus
        report = {"output_throughput_tok_s": tput * gpus, "gpu_hours": gpus / 60.0, "duration_ms": 60_000.0,
                  "mean_output_token_throughput_per_user": 5000.0 / seqs, "mean_e2e_latency_ms": 100.0 + seqs,
                  "mean_ttft_ms": 10.0, "mean_tpot_ms": 1.0}
        return EvalOutcome(status="feasible", report=report, replay_seconds=0.01, repeats=1)


def _resources(tmp_path, evaluator=None, vizier=None):
    from spica_pipeline.resources.vizier import VizierClient

    return {
        "io_manager": ParquetIOManager(base_dir=str(tmp_path / "assets")),
        "sweep_storage": SweepStorage(base_dir=str(tmp_path / "spica")),
        "replay": evaluator if evaluator is not None else FakeEvaluator(),
        "vizier": vizier if vizier is not None else VizierClient(),
    }


def _materialize(tmp_path, run_config, resources=None, instance=None, **kw):
    from spica_pipeline.definitions import ASSETS

    return dg.materialize(
        ASSETS + checks.ALL_CHECKS, resources=resources or _resources(tmp_path), run_config=run_config,
        tags=ALL_MODES_TAGS, instance=instance or dg.DagsterInstance.ephemeral(), **kw,
    )


def _launch(yaml_text, *, warm_start=False, **overrides):
    return {"ops": {"validated_config": {"config": {"config_yaml": yaml_text, "config_path": None, **overrides}},
                    "branch_study": {"config": {"warm_start": warm_start}}}}


# ---------------------------------------------------------------------------------------------
# IO manager


def test_parquet_io_manager_single_and_multi_partition(tmp_path):
    @dg.asset
    def up() -> pd.DataFrame:
        return pd.DataFrame({"x": [1, 2]})

    @dg.asset(partitions_def=mode_partitions, backfill_policy=dg.BackfillPolicy.single_run())
    def per_mode(context: dg.AssetExecutionContext, up: pd.DataFrame):
        frames = {k: up.assign(mode=k) for k in context.partition_keys}
        return frames if len(frames) > 1 else next(iter(frames.values()))

    @dg.asset(ins={"per_mode": dg.AssetIn(metadata={"allow_missing_partitions": True})})
    def merged(per_mode: dict[str, pd.DataFrame]) -> pd.DataFrame:
        return pd.concat([per_mode[k] for k in sorted(per_mode)], ignore_index=True)

    res = {"io_manager": ParquetIOManager(base_dir=str(tmp_path))}
    inst = dg.DagsterInstance.ephemeral()
    r = dg.materialize([up, per_mode, merged], resources=res, tags=ALL_MODES_TAGS, instance=inst)
    assert r.success
    assert pd.read_parquet(tmp_path / "per_mode" / "disagg.parquet")["mode"].tolist() == ["disagg"] * 2
    assert sorted(pd.read_parquet(tmp_path / "merged.parquet")["mode"].unique()) == ["agg", "disagg"]
    # one partition alone goes through the base class path
    r2 = dg.materialize([up, per_mode], selection=[per_mode], partition_key="agg", resources=res, instance=inst)
    assert r2.success
    mat = r2.asset_materializations_for_node("per_mode")[0]
    assert "path" in mat.metadata and mat.metadata["dagster/row_count"].value == 2


# ---------------------------------------------------------------------------------------------
# launch config


def test_launch_config_default_is_quickstart_with_overrides():
    config, source, name = read_launch_config(SweepLaunchConfig())
    assert source.endswith("examples/configs/quickstart.yaml") and name == "quickstart"
    assert config.search_space.gpu_budget == 8
    config, _, _ = read_launch_config(SweepLaunchConfig(seed=7, policy="thorough", algorithm="RANDOM_SEARCH"))
    assert (config.sweep.seed, config.sweep.policy, config.sweep.algorithm) == (7, "thorough", "RANDOM_SEARCH")


def test_launch_config_resolves_against_repo_root_from_elsewhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config, source, _ = read_launch_config(SweepLaunchConfig(config_path="examples/configs/trace.yaml"))
    assert Path(source) == REPO / "examples/configs/trace.yaml"
    assert Path(config.workload.trace_path).is_absolute() and Path(config.workload.trace_path).exists()


def test_warm_start_only_for_an_unchanged_space(tmp_path):
    from spica_pipeline.assets.studies import SPACES_FILE, previous_ledger

    assert previous_ledger(tmp_path, "agg", "h1")[0] is None
    pd.DataFrame({"branch": ["agg"], "trial": [1]}).to_parquet(tmp_path / "ledger.parquet")
    (tmp_path / SPACES_FILE).write_text(json.dumps({"agg": "h1"}))
    ledger, why = previous_ledger(tmp_path, "agg", "h1")
    assert len(ledger) == 1 and why == "same space as the previous sweep"
    ledger, why = previous_ledger(tmp_path, "agg", "h2")
    assert ledger is None and "changed" in why


def test_launch_config_inline_and_bad_values():
    config, source, name = read_launch_config(SweepLaunchConfig(config_yaml=TINY_YAML, name="tiny"))
    assert (source, name, config.search_space.gpu_budget) == ("inline", "tiny", 2)
    with pytest.raises(ConfigError, match=r"sweep\.algorithm"):
        read_launch_config(SweepLaunchConfig(config_yaml=TINY_YAML, algorithm="SIMULATED_ANNEALING"))
    with pytest.raises(ConfigError, match="could not read config"):
        read_launch_config(SweepLaunchConfig(config_path="no/such/file.yaml"))
    with pytest.raises(ConfigError, match="malformed YAML"):
        read_launch_config(SweepLaunchConfig(config_yaml="search_space: [1,\n"))


def test_bad_config_fails_the_run_with_one_line(tmp_path):
    bad = TINY_YAML.replace("gpu_budget: 2", "gpu_budget: -1")
    r = dg.materialize([validated_config], raise_on_error=False,
                       run_config={"ops": {"validated_config": {"config": {"config_yaml": bad}}}},
                       resources={"io_manager": ParquetIOManager(base_dir=str(tmp_path))})
    assert not r.success
    failure = [e for e in r.all_events if e.event_type_value == "STEP_FAILURE"][0]
    message = failure.step_failure_data.user_failure_data.description
    assert "search_space.gpu_budget" in message and "\n" not in message


def test_malformed_trace_fails_validated_config_naming_file_and_line(tmp_path):
    import spica_pipeline.sweep as sweep_stages

    if not hasattr(sweep_stages, "check_workload"):
        pytest.skip("sweep.check_workload (stage-1 trace check) is not in this tree yet")
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [0]}\nnot json\n')
    text = (REPO / "examples/configs/trace.yaml").read_text().replace("examples/traces/small_mooncake.jsonl",
                                                                      str(trace))
    r = dg.materialize([validated_config], raise_on_error=False,
                       run_config={"ops": {"validated_config": {"config": {"config_yaml": text}}}},
                       resources={"io_manager": ParquetIOManager(base_dir=str(tmp_path / "a"))})
    assert not r.success
    failure = [e for e in r.all_events if e.event_type_value == "STEP_FAILURE"][0]
    message = failure.step_failure_data.user_failure_data.description
    assert "bad.jsonl:2:" in message and "\n" not in message


# ---------------------------------------------------------------------------------------------
# checks (plain functions; each can fail)


def test_checks_pass_and_fail():
    assert not checks.feasible_candidate_check(pd.DataFrame()).passed
    assert checks.feasible_candidate_check(pd.DataFrame({"rank": [1]})).passed
    cands = pd.DataFrame({"used_gpus": [2, 4], "score": [3.0, 1.0]})
    assert checks.gpu_budget_check(cands, 4).passed
    over = checks.gpu_budget_check(cands, 2)
    assert not over.passed and over.metadata["over_budget"].value == 1
    ledger = pd.DataFrame({"status": ["feasible", "cached", "infeasible", "feasible"],
                           "spec_hash": ["a", "a", "b", "c"], "replay_seconds": [1.0, 0.0, 1.0, 1.0]})
    assert checks.unique_replays_check(ledger).passed
    ledger.loc[3, "spec_hash"] = "b"
    assert not checks.unique_replays_check(ledger).passed
    assert checks.front_check(cands, "throughput_per_gpu", ["throughput_per_gpu"]).passed
    assert not checks.front_check(cands[::-1], "throughput_per_gpu", ["throughput_per_gpu"]).passed
    front = pd.DataFrame({"obj.throughput_per_gpu": [10.0, 5.0], "obj.throughput_per_user": [1.0, 2.0]})
    objs = ["throughput_per_gpu", "throughput_per_user"]
    assert checks.front_check(front, "pareto", objs).passed
    dominated = pd.concat([front, pd.DataFrame({"obj.throughput_per_gpu": [4.0], "obj.throughput_per_user": [1.5]})])
    result = checks.front_check(dominated, "pareto", objs)
    assert not result.passed and result.metadata["dominated_points"].value == 1


# ---------------------------------------------------------------------------------------------
# schedule and sensor


def test_definitions_schedule_and_sensor_defaults():
    from spica_pipeline.definitions import defs

    defs.resolve_all_job_defs()
    job = defs.resolve_job_def("spica_sweep")
    assert job.tags["dagster/asset_partition_range_end"] == "disagg"
    sched = defs.resolve_schedule_def("spica_nightly")
    assert sched.cron_schedule == "0 2 * * *"
    assert sched.default_status == dg.DefaultScheduleStatus.STOPPED
    assert defs.resolve_sensor_def("spica_trace_changed").default_status == dg.DefaultSensorStatus.STOPPED
    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert keys == {"validated_config", "filtered_config", "load_predictor_result", "branch_spaces",
                    "branch_study", "sweep_result"}


def test_nightly_schedule_warm_starts_configured_sweeps(monkeypatch):
    monkeypatch.setenv(automation.SWEEP_CONFIGS_ENV, "examples/configs/quickstart.yaml,examples/configs/trace.yaml")
    ctx = dg.build_schedule_context(scheduled_execution_time=pd.Timestamp("2026-12-03T02:00:00Z").to_pydatetime())
    requests = automation.spica_nightly(ctx)
    assert [r.run_config["ops"]["validated_config"]["config"]["config_path"] for r in requests] == [
        "examples/configs/quickstart.yaml", "examples/configs/trace.yaml"]
    assert all(r.run_config["ops"]["branch_study"]["config"]["warm_start"] for r in requests)
    assert requests[0].run_key == "quickstart@2026-12-03T02:00:00+00:00"


def test_nightly_cron_from_env(monkeypatch):
    monkeypatch.setenv(automation.NIGHTLY_CRON_ENV, "30 3 * * 1-5")
    assert automation.nightly_cron() == "30 3 * * 1-5"
    monkeypatch.delenv(automation.NIGHTLY_CRON_ENV)
    assert automation.nightly_cron() == "0 2 * * *"


def test_trace_sensor_fires_once_per_content_change_not_on_touch(tmp_path, monkeypatch):
    if not TRACE.exists():
        pytest.skip(f"bundled trace {TRACE} is absent")
    trace = tmp_path / "trace.jsonl"
    trace.write_bytes(TRACE.read_bytes())
    cfg = tmp_path / "traced.yaml"
    cfg.write_text((REPO / "examples/configs/trace.yaml").read_text().replace(
        "examples/traces/small_mooncake.jsonl", str(trace)))
    monkeypatch.setenv(automation.SWEEP_CONFIGS_ENV, str(cfg))
    inst = dg.DagsterInstance.ephemeral()

    def tick(cursor):
        ctx = dg.build_sensor_context(instance=inst, cursor=cursor)
        result = automation.spica_trace_changed(ctx)
        if isinstance(result, dg.SensorResult):
            return list(result.run_requests), result.cursor
        return [], ctx.cursor

    runs, cursor = tick(None)  # first sight: baseline only
    assert runs == [] and json.loads(cursor)[str(trace)]
    os.utime(trace, (time.time() + 100, time.time() + 100))  # touch: mtime changes, bytes do not
    runs, cursor2 = tick(cursor)
    assert runs == [] and cursor2 == cursor
    with trace.open("a") as fh:
        fh.write(TRACE.read_text().splitlines()[0] + "\n")
    runs, cursor3 = tick(cursor2)
    assert len(runs) == 1 and cursor3 != cursor2
    assert runs[0].run_config["ops"]["validated_config"]["config"]["config_path"] == str(cfg)
    assert runs[0].tags["spica/trigger"] == "trace_changed"
    runs, _ = tick(cursor3)  # same content again: no second run
    assert runs == []


def test_trace_sensor_skips_without_trace_configs(monkeypatch):
    monkeypatch.setenv(automation.SWEEP_CONFIGS_ENV, "examples/configs/quickstart.yaml")
    result = automation.spica_trace_changed(dg.build_sensor_context(instance=dg.DagsterInstance.ephemeral()))
    assert isinstance(result, dg.SkipReason) and "no configured sweep uses a trace" in result.skip_message


# ---------------------------------------------------------------------------------------------
# full materialization


def _evaluations(result):
    return {e.check_name: e.passed for e in result.get_asset_check_evaluations()}


def test_materialize_all_assets_fake_evaluator_exhaustive(tmp_path):
    """The unit path: real stages 1-4, exhaustive study (no Vizier), a fake replay."""
    text = TINY_YAML.replace("parallel_evals: 1", "parallel_evals: 1\n  policy: thorough") + \
        "  # small space\n"
    text = text.replace("planner_scaling_policy: [disabled]",
                        "planner_scaling_policy: [disabled]\n  agg_max_num_seqs: [256]\n"
                        "  agg_max_num_batched_tokens: [8192]")
    r = _materialize(tmp_path, _launch(text, name="tiny"))
    assert r.success
    ledgers = r.asset_value("branch_study")  # dict of both partitions, through the Parquet files
    assert set(ledgers) == {"agg", "disagg"} and ledgers["disagg"].empty
    assert (tmp_path / "assets" / "branch_study" / "agg.parquet").exists()
    agg = ledgers["agg"]
    assert len(agg) == 3 and set(agg["status"]) == {"feasible"} and set(agg["source"]) == {"exhaustive"}
    mats = {m.partition: m.metadata for m in r.asset_materializations_for_node("branch_study")}
    assert "not searched by this config" in mats["disagg"]["disagg.skipped"].value
    assert _evaluations(r) == {"has_feasible_candidate": True, "within_gpu_budget": True,
                               "unique_replayed_spec_hashes": True, "front_non_dominated": True}
    result_md = r.asset_materializations_for_node("sweep_result")[0].metadata
    assert result_md["feasible"].value == 3 and result_md["best_score"].value > 0
    assert result_md["pareto_plot"].value.startswith("![pareto](data:image/png;base64,")
    out = tmp_path / "spica" / "outputs" / "tiny"
    assert (out / "report.md").exists() and (out / "pareto.png").exists() and (out / "deploy").is_dir()
    cands = r.asset_value("sweep_result")
    assert cands["score"].is_monotonic_decreasing and len(cands) == 3

    # a retried run resumes from the journal: no new replays, the same ledger
    r2 = _materialize(tmp_path, _launch(text, name="tiny"))
    again = r2.asset_value("branch_study")["agg"]
    assert again[["spec_hash", "status", "score"]].equals(agg[["spec_hash", "status", "score"]])
    mats2 = {m.partition: m.metadata for m in r2.asset_materializations_for_node("branch_study")}
    assert mats2["agg"]["agg.resumed_journal_records"].value >= 3


def test_materialize_pareto_goal_reports_front_and_hypervolume(tmp_path):
    """Pareto goal through Dagster (exhaustive, fake replay): front table, hypervolume, front check."""
    text = TINY_YAML.replace("parallel_evals: 1", "parallel_evals: 1\n  policy: thorough")
    text = text.replace("planner_scaling_policy: [disabled]",
                        "planner_scaling_policy: [disabled]\n  agg_max_num_seqs: [256, 1024]\n"
                        "  agg_max_num_batched_tokens: [8192]")
    text += "goal:\n  target: pareto\n"
    r = _materialize(tmp_path, _launch(text, name="front"))
    assert r.success
    md = r.asset_materializations_for_node("sweep_result")[0].metadata
    assert md["hypervolume"].value > 0 and md["front_size"].value >= 2
    assert "front" in md and "best_score" not in md
    front = r.asset_value("sweep_result")
    assert {"obj.throughput_per_gpu", "obj.throughput_per_user"} <= set(front.columns)
    assert _evaluations(r)["front_non_dominated"] is True


@pytest.mark.integration
def test_materialize_all_assets_real_replay_with_warm_start(tmp_path):
    """The tiny sweep through Dagster with the real replay and Vizier RANDOM_SEARCH, then a
    nightly-style warm-started rerun that sees the first run's trials."""
    from spica_pipeline.resources.replay import ReplayEvaluator

    os.environ.setdefault("DYN_LOG", "warn")
    resources = _resources(tmp_path, evaluator=ReplayEvaluator())
    inst = dg.DagsterInstance.ephemeral()
    r = _materialize(tmp_path, _launch(TINY_YAML, name="tiny"), resources=resources, instance=inst)
    assert r.success
    ledger = r.asset_value("branch_study")["agg"]
    assert len(ledger) >= 2 and set(ledger["source"]) == {"vizier"}
    evals = _evaluations(r)
    assert evals["unique_replayed_spec_hashes"] and evals["within_gpu_budget"] and evals["front_non_dominated"]
    assert evals["has_feasible_candidate"] == (ledger["status"] == "feasible").any()
    md = r.asset_materializations_for_node("sweep_result")[0].metadata
    assert md["trials"].value == len(ledger)

    r2 = _materialize(tmp_path, _launch(TINY_YAML, name="tiny", warm_start=True), resources=resources,
                      instance=inst)
    assert r2.success
    mats = {m.partition: m.metadata for m in r2.asset_materializations_for_node("branch_study")}
    assert mats["agg"]["agg.warm_start_trials"].value == len(ledger)
    assert mats["agg"]["agg.warm_start"].value == "same space as the previous sweep"


def test_merged_ledger_renumbers_trials_and_their_cache_references():
    import pandas as pd

    from spica_pipeline.assets.result import merged_ledger
    from spica_pipeline.config import load_config

    config = load_config(str(REPO / "examples" / "configs" / "quickstart.yaml"))
    agg = pd.DataFrame({"trial": [1, 2], "reason": [None, "feasible (same spec as trial 1)"]})
    disagg = pd.DataFrame({"trial": [1, 2], "reason": [None, "failed (same spec as trial 1): boom"]})
    merged = merged_ledger(config, {"agg": agg, "disagg": disagg})
    assert list(merged["trial"]) == [1, 2, 3, 4]
    reasons = [r if isinstance(r, str) else None for r in merged["reason"]]
    assert reasons == [None, "feasible (same spec as trial 1)", None, "failed (same spec as trial 3): boom"]
