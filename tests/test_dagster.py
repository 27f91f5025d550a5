"""The Dagster pipeline: one asset graph per sweep, observed sources, partitions per searched mode,
blocking checks before the deploy output, and full materializations (fake evaluator for the unit
path, the real replay for the integration path)."""

import json
import os
import re
import time
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest
from dagster_fakes import FakeEvaluator, InfeasibleEvaluator, SlowEvaluator

from spica_pipeline.dagster import checks
from spica_pipeline.dagster.config import SweepLaunchConfig, read_sweep_config
from spica_pipeline.dagster.factory import sweeps_definitions
from spica_pipeline.dagster.io import ParquetIOManager, SweepStorage
from spica_pipeline.dagster.sources import build_watch_sensor, file_sha256, watched_files
from spica_pipeline.dagster.spec import sweep_spec
from spica_pipeline.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "examples" / "traces" / "small_mooncake.jsonl"

# the shared tiny space, then this file's workload and sweep
TINY_YAML = (REPO / "tests" / "data" / "tiny_agg_space.yaml").read_text() + """\
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
# exhaustive over three agg points: no Vizier, fast
EXHAUSTIVE_YAML = TINY_YAML.replace("parallel_evals: 1", "parallel_evals: 1\n  policy: thorough").replace(
    "planner_scaling_policy: [disabled]",
    "planner_scaling_policy: [disabled]\n  agg_max_num_seqs: [256]\n  agg_max_num_batched_tokens: [8192]")


def _resources(tmp_path, evaluator=None):
    from spica_pipeline.optimize.vizier import VizierClient

    return {
        "io_manager": ParquetIOManager(base_dir=str(tmp_path / "assets")),
        "sweep_storage": SweepStorage(base_dir=str(tmp_path / "spica")),
        "replay": evaluator if evaluator is not None else FakeEvaluator(),
        "vizier": VizierClient(),
    }


def _spec(tmp_path, name, text):
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return sweep_spec(name, path)


def _run(defs, sweep, *, instance, warm_start=False, raise_on_error=True, **overrides):
    run_config = {"ops": {f"{sweep}__validated_config": {"config": overrides},
                          f"{sweep}__branch_study": {"config": {"warm_start": warm_start}}}}
    return defs.resolve_job_def(f"{sweep}_sweep").execute_in_process(
        run_config=run_config, instance=instance, raise_on_error=raise_on_error)


def _mats(result, sweep, stage):
    return result.asset_materializations_for_node(f"{sweep}__{stage}")


def _evaluations(result):
    return {e.check_name: e.passed for e in result.get_asset_check_evaluations()}


def _failure_message(result):
    failure = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"][0]
    return failure.step_failure_data.user_failure_data.description


def _failed_run_message(tmp_path, spec) -> str:
    """Run `spec`'s sweep job, which must fail; its step failure's description."""
    defs = sweeps_definitions([spec], resources=_resources(tmp_path))
    r = _run(defs, spec.name, instance=dg.DagsterInstance.ephemeral(), raise_on_error=False)
    assert not r.success
    return _failure_message(r)


# ---------------------------------------------------------------------------------------------
# the code location


def test_definitions_load_with_the_bundled_sweeps():
    from spica_pipeline.dagster.definitions import defs

    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    bundled = {p.stem for p in (REPO / "examples" / "configs").glob("*.yaml")}
    stages = ["config_file", "validated_config", "filtered_config", "load_predictor_result", "branch_spaces",
              "branch_study", "sweep_result", "deploy"]
    for name in bundled:
        assert {f"{name}/{s}" for s in stages} <= keys, name
        job = defs.resolve_job_def(f"{name}_sweep")
        assert job.tags["spica/sweep"] == name
        sched = defs.resolve_schedule_def(f"{name}_nightly")
        assert sched.cron_schedule == "0 2 * * *" and sched.default_status == dg.DefaultScheduleStatus.STOPPED
    assert "trace/trace_file" in keys and "quickstart/trace_file" not in keys
    graph = defs.resolve_asset_graph()
    # the searched modes only: quickstart and trace search agg
    study = graph.get(dg.AssetKey(["trace", "branch_study"]))
    assert study.partitions_def.get_partition_keys() == ["agg"]
    node = graph.get(dg.AssetKey(["quickstart", "sweep_result"]))
    assert node.automation_condition is not None and node.code_version and node.owners == ["team:spica"]
    blocking = {spec.name for checks_def in defs.asset_checks or [] for spec in checks_def.check_specs
                if spec.blocking and spec.asset_key == dg.AssetKey(["quickstart", "sweep_result"])}
    assert blocking == {"has_feasible_candidate", "within_gpu_budget"}
    assert defs.resolve_sensor_def("spica_automation").default_status == dg.DefaultSensorStatus.STOPPED
    assert defs.resolve_sensor_def("spica_watch_files").default_status == dg.DefaultSensorStatus.RUNNING


@pytest.mark.slow
def test_dg_loads_the_project():
    """`dg dev` (the README's dev server) loads the project the same way: one Definitions at module scope."""
    import subprocess
    import sys

    dg_cli = Path(sys.executable).with_name("dg")
    out = subprocess.run([str(dg_cli), "check", "defs"], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, DYN_LOG="warn"))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "All definitions loaded successfully" in out.stdout + out.stderr


def test_launch_overrides_apply_to_the_sweep_file(tmp_path, monkeypatch):
    config = read_sweep_config("examples/configs/quickstart.yaml")
    assert config.search_space.gpu_budget == 8
    config = read_sweep_config("examples/configs/quickstart.yaml", SweepLaunchConfig(
        seed=7, policy="thorough", algorithm="RANDOM_SEARCH", max_rounds=2, gpu_budget=4))
    assert (config.sweep.seed, config.sweep.policy, config.sweep.algorithm, config.sweep.max_rounds,
            config.search_space.gpu_budget) == (7, "thorough", "RANDOM_SEARCH", 2, 4)
    monkeypatch.chdir(tmp_path)  # the trace resolves against the repository root from elsewhere
    config = read_sweep_config(REPO / "examples/configs/trace.yaml")
    assert Path(config.workload.trace_path).is_absolute() and Path(config.workload.trace_path).exists()
    with pytest.raises(ConfigError, match=r"sweep\.algorithm"):
        read_sweep_config("examples/configs/quickstart.yaml", SweepLaunchConfig(algorithm="ANNEALING"))


def test_bad_config_fails_the_run_with_one_line(tmp_path):
    spec = _spec(tmp_path, "bad", TINY_YAML.replace("gpu_budget: 2", "gpu_budget: -1"))
    assert spec.load_error and "gpu_budget" in spec.load_error  # the graph still loads
    message = _failed_run_message(tmp_path, spec)
    assert "search_space.gpu_budget" in message and "\n" not in message


def test_malformed_trace_fails_validated_config_naming_file_and_line(tmp_path):
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [0]}\nnot json\n')
    text = (REPO / "examples/configs/trace.yaml").read_text().replace("examples/traces/small_mooncake.jsonl",
                                                                      str(trace))
    spec = _spec(tmp_path, "badtrace", text)
    assert spec.trace_path == str(trace)
    message = _failed_run_message(tmp_path, spec)
    assert "bad.jsonl:2:" in message and "\n" not in message


def test_watch_sensor_observes_content_changes_not_touches(tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_bytes(TRACE.read_bytes())
    spec = _spec(tmp_path, "traced", (REPO / "examples/configs/trace.yaml").read_text().replace(
        "examples/traces/small_mooncake.jsonl", str(trace)))
    files = watched_files(spec)
    assert set(files.values()) == {spec.config_path, str(trace)}
    sensor = build_watch_sensor(files)

    def tick(cursor):
        ctx = dg.build_sensor_context(cursor=cursor)
        result = sensor(ctx)
        if isinstance(result, dg.SensorResult):
            return list(result.asset_events), result.cursor
        return [], cursor

    events, cursor = tick(None)  # first sight: a baseline observation of each file
    assert {e.asset_key.to_user_string() for e in events} == {"traced/config_file", "traced/trace_file"}
    assert {e.tags["dagster/data_version"] for e in events} == {file_sha256(trace), file_sha256(spec.config_path)}
    os.utime(trace, (time.time() + 100, time.time() + 100))  # touch: mtime changes, bytes do not
    events, cursor2 = tick(cursor)
    assert events == [] and cursor2 == cursor
    with trace.open("a") as fh:
        fh.write(TRACE.read_text().splitlines()[0] + "\n")
    events, cursor3 = tick(cursor2)
    assert [e.asset_key.to_user_string() for e in events] == ["traced/trace_file"]
    assert tick(cursor3)[0] == []


def test_nightly_schedule_warm_starts(tmp_path):
    defs = sweeps_definitions([_spec(tmp_path, "tiny", TINY_YAML)], resources=_resources(tmp_path))
    sched = defs.resolve_schedule_def("tiny_nightly")
    assert sched.job_name == "tiny_sweep"
    request = sched.evaluate_tick(dg.build_schedule_context()).run_requests[0]
    assert request.run_config["ops"]["tiny__branch_study"]["config"]["warm_start"] is True
    dg.validate_run_config(defs.resolve_job_def("tiny_sweep"), request.run_config)  # the job takes it


# ---------------------------------------------------------------------------------------------
# full materialization


def test_sweep_a_leaves_sweep_b_unchanged_and_resumes(tmp_path):
    """The unit path: two exhaustive sweeps (fake replay) in one location, each its own assets."""
    a = _spec(tmp_path, "sweep_a", EXHAUSTIVE_YAML)
    b = _spec(tmp_path, "sweep_b", EXHAUSTIVE_YAML.replace("gpu_budget: 2", "gpu_budget: 1"))
    defs = sweeps_definitions([a, b], resources=_resources(tmp_path))
    inst = dg.DagsterInstance.ephemeral()
    rb = _run(defs, "sweep_b", instance=inst)
    assert rb.success
    b_key = dg.AssetKey(["sweep_b", "sweep_result"])
    b_before = inst.get_latest_materialization_event(b_key)
    ra = _run(defs, "sweep_a", instance=inst)
    assert ra.success
    assert {e.asset_key.path[0] for e in ra.get_asset_materialization_events()} == {"sweep_a"}
    assert inst.get_latest_materialization_event(b_key).run_id == b_before.run_id

    ledger = ra.asset_value(dg.AssetKey(["sweep_a", "branch_study"]))
    assert len(ledger) == 3 and set(ledger["status"]) == {"feasible"} and set(ledger["source"]) == {"exhaustive"}
    assert (tmp_path / "assets" / "sweep_a" / "branch_study" / "agg.parquet").exists()
    assert _evaluations(ra) == {"has_feasible_candidate": True, "within_gpu_budget": True,
                                "unique_replayed_spec_hashes": True, "front_non_dominated": True}
    md = _mats(ra, "sweep_a", "sweep_result")[0].metadata
    assert md["feasible"].value == 3 and md["best_score"].value > 0
    assert md["best_score"].value == round(md["best_score"].value, 4)
    for plot in ("tradeoff_plot", "convergence_plot"):  # small enough for the UI to render inline
        assert "data:image/png;base64," in md[plot].value and len(md[plot].value) < 1000
    out = tmp_path / "spica" / "outputs" / "sweep_a"
    assert (out / "report.md").exists() and (out / "deploy").is_dir() and (out / "recommendation.json").exists()
    assert _mats(ra, "sweep_a", "deploy")[0].metadata["deploy_files"].value >= 1
    # report.md's wall time is the branch study's own (stored with its ledger), not the merge step's
    study_wall = _mats(ra, "sweep_a", "branch_study")[0].metadata["wall_seconds"].value
    reported = re.search(r"\*\*wall_seconds\*\*: ([0-9.]+)", (out / "report.md").read_text())
    assert reported and abs(float(reported.group(1)) - study_wall) <= 0.06
    cands = ra.asset_value(dg.AssetKey(["sweep_a", "sweep_result"]))
    # the fake replays TP1 x 2 and TP2 x 1 alike: one row for both, "+1 equivalent setting"
    assert cands["score"].is_monotonic_decreasing and len(cands) == 2 and cands["equivalent_settings"].sum() == 1

    # a retried run resumes from the journal: no new replays, the same ledger
    again = _run(defs, "sweep_a", instance=inst)
    ledger2 = again.asset_value(dg.AssetKey(["sweep_a", "branch_study"]))
    assert ledger2[["spec_hash", "status", "score"]].equals(ledger[["spec_hash", "status", "score"]])
    assert _mats(again, "sweep_a", "branch_study")[0].metadata["resumed_journal_records"].value >= 3


def test_failing_blocking_check_prevents_the_deploy_asset(tmp_path):
    spec = _spec(tmp_path, "nothing", EXHAUSTIVE_YAML)
    defs = sweeps_definitions([spec], resources=_resources(tmp_path, evaluator=InfeasibleEvaluator()))
    inst = dg.DagsterInstance.ephemeral()
    r = _run(defs, "nothing", instance=inst, raise_on_error=False)
    assert not r.success  # the blocking check fails the run
    assert _evaluations(r)["has_feasible_candidate"] is False
    assert inst.get_latest_materialization_event(dg.AssetKey(["nothing", "sweep_result"])) is not None
    assert inst.get_latest_materialization_event(dg.AssetKey(["nothing", "deploy"])) is None
    out = tmp_path / "spica" / "outputs" / "nothing"
    assert not (out / "deploy").exists() and not (out / "recommendation.json").exists()


def test_dagster_studies_run_the_async_loop_within_the_time_budget_and_leave_an_anytime_result(tmp_path):
    """The same study loop as `spica sweep`: asynchronous dispatch on the evaluation backend, the
    sweep's time budget, and the branch's ranking so far written after every batch."""
    yaml = (TINY_YAML.replace("  max_rounds: 1\n", "  time_budget: 2s\n")
            .replace("parallel_evals: 1", "parallel_evals: 2")
            .replace("planner_scaling_policy: [disabled]", "planner_scaling_policy: [disabled]\n"
                     "  agg_max_num_seqs: [256, 512, 1024]\n  agg_max_num_batched_tokens: [8192, 16384, 32768]"))
    spec = _spec(tmp_path, "timed", yaml)
    defs = sweeps_definitions([spec], resources=_resources(tmp_path, SlowEvaluator(0.4)))
    r = _run(defs, "timed", instance=dg.DagsterInstance.ephemeral())
    assert r.success
    md = _mats(r, "timed", "branch_study")[0].metadata
    ledger = r.asset_value(dg.AssetKey(["timed", "branch_study"]))
    assert md["out_of_time"].value is True and md["time_budget_s"].value == 2.0
    assert 2 <= md["evaluated"].value < 27 and len(ledger) == md["trials"].value  # 27 points, not all
    anytime = Path(md["anytime_result"].value)
    assert anytime.exists() and len(pd.read_csv(anytime)) >= 1
    assert pd.read_parquet(anytime.parent / "ledger.parquet")["trial"].is_monotonic_increasing


def test_a_dagster_study_gives_the_ledger_spica_sweep_gives(tmp_path):
    """One code path: the same config and seed through the Dagster partition and through
    `spica sweep` (run_sweep) give the same ledger (timing columns aside)."""
    from spica_pipeline.config.loader import load_config
    from spica_pipeline.optimize.ledger import content_view
    from spica_pipeline.sweep import run_sweep

    yaml = (TINY_YAML.replace("max_rounds: 1", "max_rounds: 3").replace("parallel_evals: 1", "parallel_evals: 2")
            .replace("planner_scaling_policy: [disabled]", "planner_scaling_policy: [disabled]\n"
                     "  agg_max_num_seqs: [256, 512, 1024]\n  agg_max_num_batched_tokens: [8192, 16384, 32768]"))
    spec = _spec(tmp_path, "same", yaml)
    r = _run(sweeps_definitions([spec], resources=_resources(tmp_path)), "same",
             instance=dg.DagsterInstance.ephemeral())
    dagster_rows = r.asset_value(dg.AssetKey(["same", "branch_study"])).to_dict("records")
    cli = run_sweep(load_config(tmp_path / "same.yaml"), tmp_path / "cli", evaluator=FakeEvaluator())
    cli_rows = cli.ledger.to_dict("records")
    assert len(dagster_rows) == 6 and [content_view(x) for x in dagster_rows] == [content_view(x) for x in cli_rows]


def test_partitions_are_the_searched_modes_with_their_own_metadata(tmp_path):
    text = TINY_YAML.replace("deployment_mode: [agg]", "deployment_mode: [agg, disagg]").replace(
        "algorithm: RANDOM_SEARCH", "algorithm: QUASI_RANDOM_SEARCH")
    both = _spec(tmp_path, "both", text)
    assert both.modes == ("agg", "disagg")
    assert _spec(tmp_path, "agg_only", TINY_YAML).modes == ("agg",)
    defs = sweeps_definitions([both], resources=_resources(tmp_path))
    r = _run(defs, "both", instance=dg.DagsterInstance.ephemeral())
    assert r.success
    ledgers = r.asset_value(dg.AssetKey(["both", "branch_study"]))
    mats = {m.partition: m.metadata for m in _mats(r, "both", "branch_study")}
    assert set(mats) == {"agg", "disagg"}
    for mode, md in mats.items():
        assert md["dagster/row_count"].value == len(ledgers[mode]) == md["trials"].value
        assert not any(k.startswith(("agg.", "disagg.")) for k in md)  # its own numbers, no prefixes


def test_materialize_pareto_goal_reports_front_and_hypervolume(tmp_path):
    text = EXHAUSTIVE_YAML.replace("agg_max_num_seqs: [256]", "agg_max_num_seqs: [256, 1024]")
    text += "goal:\n  target: pareto\n"
    defs = sweeps_definitions([_spec(tmp_path, "front", text)], resources=_resources(tmp_path))
    r = _run(defs, "front", instance=dg.DagsterInstance.ephemeral())
    assert r.success
    md = _mats(r, "front", "sweep_result")[0].metadata
    assert md["hypervolume"].value > 0 and md["front_size"].value >= 2
    assert "front" in md and "best_score" not in md
    front = r.asset_value(dg.AssetKey(["front", "sweep_result"]))
    assert {"obj.throughput_per_gpu", "obj.throughput_per_user"} <= set(front.columns)
    assert _evaluations(r)["front_non_dominated"] is True


@pytest.mark.integration
def test_materialize_real_replay_with_warm_start(tmp_path):
    """The tiny sweep with the real replay and Vizier RANDOM_SEARCH, then a nightly-style
    warm-started rerun that sees the first run's trials."""
    from spica_pipeline.evaluate.replay import ReplayEvaluator

    os.environ.setdefault("DYN_LOG", "warn")
    defs = sweeps_definitions([_spec(tmp_path, "tiny", TINY_YAML)],
                              resources=_resources(tmp_path, evaluator=ReplayEvaluator()))
    inst = dg.DagsterInstance.ephemeral()
    r = _run(defs, "tiny", instance=inst, raise_on_error=False)
    ledger = r.asset_value(dg.AssetKey(["tiny", "branch_study"]))
    assert len(ledger) >= 2 and set(ledger["source"]) == {"vizier"}
    evals = _evaluations(r)
    assert evals["unique_replayed_spec_hashes"] and evals["within_gpu_budget"] and evals["front_non_dominated"]
    assert evals["has_feasible_candidate"] == (ledger["status"] == "feasible").any()
    assert r.success == evals["has_feasible_candidate"]

    r2 = _run(defs, "tiny", instance=inst, warm_start=True, raise_on_error=False)
    md = _mats(r2, "tiny", "branch_study")[0].metadata
    assert md["warm_start_trials"].value == len(ledger)
    assert md["warm_start"].value == "same space as the previous sweep"


def test_warm_start_only_for_an_unchanged_space(tmp_path):
    from spica_pipeline.dagster.studies import SPACES_FILE, previous_ledger

    assert previous_ledger(tmp_path, "agg", "h1")[0] is None
    pd.DataFrame({"branch": ["agg"], "trial": [1]}).to_parquet(tmp_path / "ledger.parquet")
    (tmp_path / SPACES_FILE).write_text(json.dumps({"agg": "h1"}))
    ledger, why = previous_ledger(tmp_path, "agg", "h1")
    assert len(ledger) == 1 and why == "same space as the previous sweep"
    ledger, why = previous_ledger(tmp_path, "agg", "h2")
    assert ledger is None and "changed" in why


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


def test_merged_ledger_renumbers_trials_and_their_cache_references():
    import pandas as pd

    from spica_pipeline.config import load_config
    from spica_pipeline.dagster.result import merged_ledger

    config = load_config(str(REPO / "examples" / "configs" / "quickstart.yaml"))
    agg = pd.DataFrame({"trial": [1, 2], "reason": [None, "feasible (same spec as trial 1)"]})
    disagg = pd.DataFrame({"trial": [1, 2], "reason": [None, "failed (same spec as trial 1): boom"]})
    merged = merged_ledger(config, {"agg": agg, "disagg": disagg})
    assert list(merged["trial"]) == [1, 2, 3, 4]
    reasons = [r if isinstance(r, str) else None for r in merged["reason"]]
    assert reasons == [None, "feasible (same spec as trial 1)", None, "failed (same spec as trial 3): boom"]


def test_object_store_urls_for_assets_journals_and_outputs(tmp_path):
    """An fsspec URL (here `memory://`) as every storage root: the run writes there, and a fresh
    local working folder resumes from the journal it finds there."""
    import fsspec

    fs = fsspec.filesystem("memory")
    root = "memory://spica-url-test"

    def resources(local):
        from spica_pipeline.optimize.vizier import VizierClient

        return {"io_manager": ParquetIOManager(base_dir=f"{root}/assets"),
                "sweep_storage": SweepStorage(base_dir=root, local_dir=str(local)),
                "replay": FakeEvaluator(), "vizier": VizierClient()}

    spec = _spec(tmp_path, "remote", EXHAUSTIVE_YAML)
    r = _run(sweeps_definitions([spec], resources=resources(tmp_path / "pod1")), "remote",
             instance=dg.DagsterInstance.ephemeral())
    assert r.success
    files = set(fs.find("/spica-url-test"))
    assert "/spica-url-test/assets/remote/branch_study/agg.parquet" in files
    assert "/spica-url-test/outputs/remote/report.md" in files
    assert "/spica-url-test/outputs/remote/recommendation.json" in files
    assert any(f.endswith("/agg/journal.jsonl") for f in files)
    # another pod (an empty local folder) resumes from the journal in the object store
    r2 = _run(sweeps_definitions([spec], resources=resources(tmp_path / "pod2")), "remote",
              instance=dg.DagsterInstance.ephemeral())
    assert _mats(r2, "remote", "branch_study")[0].metadata["resumed_journal_records"].value >= 3
    fs.rm("/spica-url-test", recursive=True)
