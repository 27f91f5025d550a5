"""`spica calibrate` (spica_pipeline/calibrate.py, cli/calibrate.py): measured points as the candidates they
measured, one deployment per profile, the own profile fitted on their replays (a stand-in evaluator here), the plan
of which picks to measure first, and bad input as one line naming the file and line."""

import json
import math
import shutil
from pathlib import Path

import pytest
import yaml

from spica_pipeline import calibrate as cal
from spica_pipeline.cli import main
from spica_pipeline.cli.calibrate import summary_lines
from spica_pipeline.errors import ConfigError
from spica_pipeline.evaluate.evaluator import EvalOutcome
from spica_pipeline.fidelity import profile as pf
from spica_pipeline.fidelity.apply import calibrate as apply_profile
from spica_pipeline.fidelity.readers.points import Deployment, Measurement
from spica_pipeline.space.shapes import RoleShape


def point(line=2, *, model="Qwen/Qwen3-32B", system="h200_sxm", backend="vllm", precision=(), mode="agg",
          sample=None, tp=2, moe_tp=1, moe_ep=1, replicas=1, **over):
    """A measured point as the readers give it (fidelity/readers: a Measurement of a Deployment)."""
    shape = RoleShape(tp=tp, moe_tp=moe_tp, moe_ep=moe_ep, replicas=replicas)
    deployment = Deployment(model=model, system=system, backend=backend, mode=mode, shape=shape, precision=precision,
                            sample=sample)
    m = {"concurrency": 16, "request_rate": None, "isl": 1024.0, "osl": 256.0, "ttft_ms": 120.0, "tpot_ms": 12.0,
         "source": "mine.csv", "where": f"line {line}", "tool": "csv", **over}
    return Measurement(deployment=deployment, **m)


class Replay:
    """A stand-in for the replay: TTFT 100 ms and TPOT 10 ms x (1 + load / 64) for the client replay, half the
    TTFT for the sweep's; candidates over `refuse_tp` are infeasible below a memory fraction of `until`."""

    def __init__(self, refuse_tp=99, until=0.98):
        self.requests = []
        self.refuse_tp, self.until = refuse_tp, until

    def evaluate(self, request):
        self.requests.append(request)
        c = request.candidate
        role = c.roles[0]
        if role.shape.tp > self.refuse_tp and role.engine.gpu_memory_utilization < self.until:
            return EvalOutcome("infeasible", reason="no KV budget at this memory fraction")
        load = 1 + request.workload["concurrency"] / 64
        together = request.context.get("closed_loop_client") == "together"
        return EvalOutcome("feasible", report={"mean_ttft_ms": 100.0 * load * (1.0 if together else 0.5),
                                               "mean_tpot_ms": 10.0 * load})


def test_a_csv_point_is_the_candidate_it_measured():
    p = cal.measured_point(point())
    c = p.candidate
    assert (c.model, c.system, c.backend, c.deployment_mode) == ("Qwen/Qwen3-32B", "h200_sxm", "vllm", "agg")
    assert c.roles[0].shape.tp == 2 and c.concurrency == 16 and c.backend_version
    assert c.roles[0].engine.max_num_seqs == 16 and c.roles[0].engine.gpu_memory_utilization == 0.9
    assert p.where == "mine.csv, line 2" and p.measured == {"ttft": 120.0, "tpot": 12.0} and not p.from_sweep


def test_a_sweep_pick_keeps_the_engine_arguments_the_sweep_replayed():
    config = cal.measured_point(point()).candidate.to_dict()
    config.update({"agg_max_num_seqs": 256, "agg_max_num_batched_tokens": 16384, "concurrency": 64,
                   "fidelity_note": "derived fields of a ledger row are ignored"})
    p = cal.measured_point(point(sample=config, replicas=3, concurrency=8))  # a fleet of 3 served the load
    assert p.from_sweep and p.candidate.concurrency == 8 and p.candidate.roles[0].replicas == 3
    engine = p.candidate.roles[0].engine
    assert engine.max_num_seqs == 256 and engine.max_num_batched_tokens == 16384


@pytest.mark.parametrize("change, match", [
    ({"isl": 0.0}, r"mine.csv, line 2: isl must be a number of tokens >= 1, got 0.0"),
    ({"ttft_ms": float("nan")}, r"mine.csv, line 2: ttft_ms must be a number > 0"),
    ({"model": "no-such-model-anywhere"}, r"mine.csv, line 2: model 'no-such-model-anywhere' is not a model"),
    ({"system": "h900"}, r"mine.csv, line 2: system 'h900'"),
    ({"backend": "trtllm-x"}, r"mine.csv, line 2: .*no perf database for backend='trtllm-x'"),
    ({"concurrency": None, "request_rate": 4.0}, r"mine.csv, line 2: an open loop at 4 requests/s"),
])
def test_bad_points_are_one_line_naming_file_and_line(change, match):
    with pytest.raises(ConfigError, match=match):
        cal.measured_point(point(**change))


def test_a_moe_shape_must_cover_the_engine():
    moe = {"model": "Qwen/Qwen3-235B-A22B-FP8", "tp": 4, "moe_tp": 1}
    with pytest.raises(ConfigError, match=r"mine.csv, line 2: agg moe_tp 1 x moe_ep 2 must be the engine's tp x "
                                          r"attention_dp = 4 GPUs"):
        cal.measured_point(point(**moe, moe_ep=2))
    assert cal.measured_point(point(**moe, moe_ep=4)).candidate.roles[0].shape.moe_ep == 4


def test_points_of_two_deployments_are_refused_with_both():
    points = [cal.measured_point(point()), cal.measured_point(point(line=3, backend="sglang"))]
    with pytest.raises(ConfigError, match=r"mine.csv, line 3: Qwen/Qwen3-32B on h200_sxm with sglang differs from "
                                          r"Qwen/Qwen3-32B on h200_sxm with vllm of mine.csv, line 2"):
        cal.one_deployment(points)


def test_calibrate_fits_an_own_profile_on_the_packaged_one():
    points = [point(line=i + 2, concurrency=c, ttft_ms=150.0 * (1 + c / 64), tpot_ms=11.0 * (1 + c / 64))
              for i, c in enumerate((4, 8, 16, 32, 64))]
    replay = Replay()
    result = cal.calibrate(points, evaluator=replay)
    p = result.profile
    assert pf.validate(p) is p and not result.skipped and len(result.records) == 5
    assert len(replay.requests) == 10  # the client replay and the sweep's replay of each point
    own = p["own"]
    assert (own["model"], own["system"], own["backend"], own["precision"], own["rows"]) == \
        ("Qwen/Qwen3-32B", "h200_sxm", "vllm", {}, 5)
    assert [m["id"] for m in own["measurements"]] == [f"mine.csv, line {i}" for i in range(2, 7)]
    assert set(own["leave_one_out"]) == {"ttft", "tpot"} and own["base"]["sha256"] == pf.load_profile("auto")[1]
    # the client replay corrected by the profile lands on what was measured
    for r in result.records:
        out = apply_profile({"mean_ttft_ms": r["sweep"]["ttft"], "mean_tpot_ms": r["sweep"]["tpot"]}, p,
                            system="h200_sxm", backend="vllm", concurrency=float(r["concurrency"]),
                            client=r["ours"])
        assert out["calibrated_mean_tpot_ms"] == pytest.approx(r["silicon"]["tpot"], rel=0.05)
    # the sweep's other backends read the packaged corrections it carries
    packaged, _ = pf.load_profile("auto")
    assert p["slices"]["h200_sxm/sglang/ttft"] == packaged["slices"]["h200_sxm/sglang/ttft"]


def test_a_point_the_replay_cannot_build_is_retried_then_left_out():
    replay = Replay(refuse_tp=2)
    result = cal.calibrate([point(), point(line=3, tp=4, concurrency=32)], evaluator=replay)
    fractions = [r.candidate.roles[0].engine.gpu_memory_utilization for r in replay.requests
                 if r.candidate.roles[0].shape.tp == 4]
    assert fractions[:3] == [0.9, 0.95, 0.98] and result.records[1]["memory_fraction"] == 0.98
    with pytest.raises(ConfigError, match=r"no measured point could be replayed: mine.csv, line 2: the replay "
                                          r"cannot build it: no KV"):
        cal.calibrate([point()], evaluator=Replay(refuse_tp=0, until=1.0))
    kept = cal.calibrate([point(), point(line=3, tp=4)], evaluator=Replay(refuse_tp=2, until=1.0))
    assert [r["where"] for r in kept.skipped] == ["mine.csv, line 3"] and kept.profile["own"]["rows"] == 1
    with pytest.raises(ConfigError, match="no measurements"):
        cal.calibrate([], evaluator=Replay())
    with pytest.raises(ConfigError, match=r"no closed-loop measurement to fit on: mine.csv, line 2: an open loop"):
        cal.calibrate([point(concurrency=None, request_rate=4.0)], evaluator=Replay())
    mixed = cal.calibrate([point(), point(line=3, concurrency=None, request_rate=4.0)], evaluator=Replay())
    assert [s["where"] for s in mixed.skipped] == ["mine.csv, line 3"] and mixed.profile["own"]["rows"] == 1


# ---- the profile a sweep reads -------------------------------------------------------------------------------

def own_profile(tmp_path, name="mine.json", **over):
    points = [point(line=i + 2, concurrency=c, **over) for i, c in enumerate((8, 16, 32))]
    p = cal.calibrate(points, evaluator=Replay()).profile
    path = tmp_path / name
    path.write_text(json.dumps(p))
    return path


def test_auto_finds_an_own_profile_of_the_sweeps_model_system_and_precision(tmp_path, monkeypatch):
    mine = own_profile(tmp_path)
    monkeypatch.setenv(pf.PROFILE_DIR_ENV, str(tmp_path))
    assert pf.profile_dir() == tmp_path
    found, notes = pf.find_own_profile(model="Qwen/Qwen3-32B", system="h200_sxm", backends=["vllm"], precision={})
    assert found == mine and notes == []
    for other in ({"model": "Qwen/Qwen3-8B"}, {"system": "b200_sxm"}, {"precision": {"weights": "fp8"}},
                  {"backends": ["sglang"]}):
        args = {"model": "Qwen/Qwen3-32B", "system": "h200_sxm", "backends": ["vllm"], "precision": {}, **other}
        assert pf.find_own_profile(**args)[0] is None
    (tmp_path / "broken.json").write_text("{")
    found, notes = pf.find_own_profile(model="Qwen/Qwen3-32B", system="h200_sxm", backends=["vllm"], precision={})
    assert found == mine and len(notes) == 1 and "broken.json is skipped" in notes[0]


def test_the_profile_directory_defaults_to_the_xdg_config_home(monkeypatch, tmp_path):
    monkeypatch.delenv(pf.PROFILE_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert pf.profile_dir() == tmp_path / "spica" / "profiles"


def sweep_config(tmp_path, calibration, model="Qwen/Qwen3-32B"):
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({
        "search_space": {"model_name": model, "hardware_sku": "h200_sxm", "gpu_budget": 8, "deployment_mode": ["agg"],
                         "backend": ["vllm"], "router_mode": ["round_robin"], "planner_scaling_policy": ["disabled"]},
        "workload": {"isl": 1024, "osl": 256, "concurrency": 16, "num_request_ratio": 6},
        "goal": {"target": "throughput_per_gpu"}, "evaluation": {"calibration": calibration}}))
    return path


def test_a_profile_of_another_model_is_refused_naming_both(tmp_path, capsys):
    mine = own_profile(tmp_path)
    assert main(["validate", "--config", str(sweep_config(tmp_path, str(mine), model="Qwen/Qwen3-8B"))]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"evaluation.calibration: {mine} is the own profile of Qwen/Qwen3-32B on h200_sxm with vllm" in err
    assert "this sweep is Qwen/Qwen3-8B on h200_sxm" in err


def test_validate_says_auto_took_the_own_profile(tmp_path, capsys, monkeypatch):
    mine = own_profile(tmp_path)
    monkeypatch.setenv(pf.PROFILE_DIR_ENV, str(tmp_path))
    assert main(["validate", "--config", str(sweep_config(tmp_path, "auto"))]) == 0
    assert f"calibration auto -> {mine}" in capsys.readouterr().out


def test_the_held_out_check_of_an_own_profile_is_what_it_knows_of_itself(tmp_path):
    mine = own_profile(tmp_path)
    check = pf.heldout_check(str(mine))
    assert check["own"]["rows"] == 3 and check["own"]["backend"] == "vllm" and check["own"]["kind"] == "own"
    assert "vllm" not in check["by_backend"] and "sglang" in check["by_backend"]  # the packaged ones it carries
    assert check["base_profile"].endswith("replay-v16.json")


# ---- which picks to measure first -----------------------------------------------------------------------

def write_pick(run, rank, band, tp=1, backend="vllm", value=None):
    d = run / "deploy" / str(rank)
    d.mkdir(parents=True)
    config = {"deployment_mode": "agg", "backend": backend, "model_name": "Qwen/Qwen3-32B",
              "hardware_sku": "h200_sxm", "tp": tp, "replicas": 1, "used_gpus": tp}
    lo, hi = band
    metrics = {"calibrated_output_throughput_tok_s": (lo + hi) / 2 * tp if lo else 1000.0, "used_gpus": tp}
    record = {"rank": rank, "config": config,
              "expected": {"goal": "throughput_per_gpu", "metrics": metrics,
                           **({"bands_p10_p90": {"goal": [lo, hi]}} if band[0] else {})}}
    (d / "simulation_record.yaml").write_text("# header\n" + yaml.safe_dump(record))
    (d / "bench.sh").write_text("#!/usr/bin/env bash\n")


def test_the_plan_is_the_pick_and_the_runners_up_whose_bands_overlap_it(tmp_path, capsys):
    run = tmp_path / "run"
    write_pick(run, 1, (900, 1100), tp=1)
    write_pick(run, 2, (850, 1000), tp=1)  # overlaps, same shape as the pick
    write_pick(run, 3, (800, 950), tp=2)  # overlaps, a new shape: listed before rank 2
    write_pick(run, 4, (500, 700), tp=4)  # apart
    plan = cal.plan(run, 3)
    assert [p.rank for p, _ in plan.picks] == [1, 3, 2]
    assert "overlaps" in plan.picks[1][1] and "a shape already listed" in plan.picks[2][1]
    assert [p.rank for p, _ in cal.plan(run, 2).picks] == [1, 3]
    assert main(["calibrate", "--plan", str(run), "-n", "2"]) == 0
    out = capsys.readouterr().out
    assert f"bash {run}/deploy/3/bench.sh" in out and "deploy/4" not in out.split("then:")[0]
    assert f"then: spica calibrate {run}/deploy/1 {run}/deploy/3 --output PROFILE.json" in out


def test_a_plan_without_overlap_or_without_bands_says_so(tmp_path):
    run = tmp_path / "apart"
    write_pick(run, 1, (900, 1100))
    write_pick(run, 2, (500, 700), tp=2)
    plan = cal.plan(run)
    assert [p.rank for p, _ in plan.picks] == [1] and "no runner-up's band overlaps" in plan.notes[0]
    raw = tmp_path / "raw"
    write_pick(raw, 1, (None, None))
    write_pick(raw, 2, (None, None), tp=2, backend="sglang")
    plan = cal.plan(raw)
    assert [p.rank for p, _ in plan.picks] == [1, 2] and "no goal band" in plan.notes[0]
    assert any("calibrate each backend's measurements apart" in n for n in plan.notes)


def test_plan_and_calibrate_refuse_bad_input_in_one_line(tmp_path, capsys):
    assert main(["calibrate", "--plan", str(tmp_path)]) == 2
    assert "no deploy/<rank>/simulation_record.yaml" in capsys.readouterr().err
    assert main(["calibrate"]) == 2
    assert "give measurement files" in capsys.readouterr().err
    assert main(["calibrate", str(tmp_path / "missing.csv"), "--output", str(tmp_path / "p.json")]) == 2
    assert "missing.csv: no such file or directory" in capsys.readouterr().err
    assert main(["calibrate", str(tmp_path / "x.csv")]) == 2
    assert "--output PROFILE.json is required" in capsys.readouterr().err
    empty = tmp_path / "deploy1"
    empty.mkdir()
    (empty / "simulation_record.yaml").write_text("rank: 1\n")
    assert main(["calibrate", str(empty), "--output", str(tmp_path / "p.json")]) == 2
    assert "no profile_export_aiperf.json under it" in capsys.readouterr().err


def test_summary_lines_name_the_deployment_errors_and_how_to_use_it(tmp_path):
    mine = own_profile(tmp_path)
    lines = summary_lines(json.loads(mine.read_text()), mine)
    assert lines[0].startswith(f"wrote {mine}: own profile of Qwen/Qwen3-32B on h200_sxm with vllm from 3 measured")
    assert sum("leave-one-out error median" in line for line in lines) == 2
    assert f"evaluation.calibration: {mine}" in lines[-1]


# ---- the command on the readers' fixtures (files from the real clients) -----------------------------------------

DATA = Path(__file__).parent / "data" / "measurements"


def test_calibrate_reads_aiperf_exports_of_a_deploy_folder(tmp_path, capsys):
    folder = tmp_path / "deploy" / "1"
    for run in ("c1", "c4"):
        (folder / "bench" / run).mkdir(parents=True)
        shutil.copy(DATA / "aiperf" / run / "profile_export_aiperf.json", folder / "bench" / run)
    shutil.copy(DATA / "deploy" / "agg" / "simulation_record.yaml", folder)
    out = tmp_path / "mine.json"
    assert main(["calibrate", str(folder), "--output", str(out)], evaluator=Replay()) == 0
    printed = capsys.readouterr().out
    profile = json.loads(out.read_text())
    assert pf.validate(profile)["own"]["rows"] == 2 and profile["own"]["model"] == "Qwen/Qwen3-32B"
    assert "c1/profile_export_aiperf.json: c=1" in printed and f"wrote {out}: own profile of Qwen/Qwen3-32B" in printed


def test_calibrate_takes_client_files_with_their_deployment(tmp_path, capsys):
    out = tmp_path / "mine.json"
    args = ["calibrate", str(DATA / "aiperf"), "--deployment", str(DATA / "deploy" / "agg" / "simulation_record.yaml"),
            "--output", str(out)]
    assert main(args, evaluator=Replay()) == 0
    printed = capsys.readouterr().out
    assert "rate4/profile_export_aiperf.json: left out: an open loop" in printed and "1 point left out" in printed
    assert json.loads(out.read_text())["own"]["rows"] == 2


def test_bad_measurement_files_are_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text(",".join(["model", "system", "backend", "precision", "tp", "pp", "attention_dp", "moe_tp", "moe_ep",
                             "concurrency", "isl", "osl", "ttft_ms", "tpot_ms"]) + "\n"
                   + "Qwen/Qwen3-32B,h200_sxm,vllm,,2,1,1,1,1,4,2000,200,-3,14\n")
    assert main(["calibrate", str(bad), "--output", str(tmp_path / "p.json")], evaluator=Replay()) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"{bad}, line 2: ttft_ms")
    assert main(["calibrate", str(DATA / "measurements.csv"), "--output", str(tmp_path / "p.json")],
                evaluator=Replay()) == 2
    assert "a profile corrects one model, system, backend and precision" in capsys.readouterr().err
    assert not (tmp_path / "p.json").exists()


# ---- what the report says, and bench.sh -------------------------------------------------------------------

def test_the_report_names_the_own_profile_its_errors_and_every_picks_band(tmp_path):
    from spica_pipeline.evaluate.scoring import Candidate
    from spica_pipeline.report import accuracy
    from spica_pipeline.report.deploy import deployment_dict

    mine = own_profile(tmp_path)
    check = pf.heldout_check(str(mine))
    packaged, _ = pf.load_profile("auto")
    cands = []
    for backend in ("vllm", "sglang"):
        profile = json.loads(mine.read_text())
        report = {"mean_ttft_ms": 100.0, "mean_tpot_ms": 10.0, "output_throughput_tok_s": 1000.0}
        report.update(apply_profile(report, profile, system="h200_sxm", backend=backend, concurrency=8.0))
        config = {"used_gpus": 2, "deployment_mode": "agg", "backend": backend, "hardware_sku": "h200_sxm",
                  "model_name": "Qwen/Qwen3-32B"}
        cands.append(Candidate.from_report(config, report, "throughput", branch="agg", spec_hash=backend))
    text = "\n".join(accuracy.report_lines(check, ["vllm", "sglang"], True, models=["Qwen/Qwen3-32B"],
                                           picks=list(enumerate(cands, 1))))
    assert "## Accuracy: your own measurements, and the held-out check" in text
    assert f"the own profile `{mine}`" in text and "on 3 measured points of Qwen/Qwen3-32B on h200_sxm with vllm" in text
    assert "| TTFT | x" in text and "leave-one-out" in text
    assert "For sglang, the packaged calibration profile `replay-v16.json`" in text and "| sglang |" in text
    assert "| vllm |" not in text.split("| backend | rows |")[1].split("\n\n")[0]  # no held-out row for the own backend
    assert "| 1 | vllm | own |" in text and "| 2 | sglang | packaged |" in text
    own_band = profile["slices"]["h200_sxm/vllm/ttft"]["band"]
    assert f"x{math.exp(own_band[0]):.2f}–x{math.exp(own_band[1]):.2f}" in text
    record = deployment_dict(cands[0], 1, target="throughput", heldout_check=check)
    assert record["calibration_profile"]["kind"] == "own" and record["calibration_profile"]["rows"] == 3
    assert "heldout_check" not in record
    assert "calibration_profile" not in deployment_dict(cands[1], 2, target="throughput", heldout_check=check)
    assert accuracy.header_line(check, "vllm").startswith(f"# calibrated by your own measurements: {mine} (3 points)")
    assert accuracy.header_line(check, "sglang").startswith("# held-out check of these numbers")


def test_picks_with_the_same_band_share_a_row():
    from types import SimpleNamespace

    band = {"band_ttft_lo": 0.7, "band_ttft_hi": 1.5, "band_tpot_lo": 0.8, "band_tpot_hi": 1.3}
    picks = [(i, SimpleNamespace(metrics=band, config={"backend": "vllm"})) for i in (1, 2, 3)]
    lines = accuracy_lines(None, picks)
    assert "| 1, 2, 3 | vllm | packaged | x0.70–x1.50 | x0.80–x1.30 |" in lines
    assert accuracy_lines(None, [(1, SimpleNamespace(metrics={}, config={}))]) == []


def accuracy_lines(check, picks):
    from spica_pipeline.report.accuracy import pick_band_lines

    return pick_band_lines(check, picks)


@pytest.mark.parametrize("workload, has", [
    ({"shape": "concurrency", "isl": 1024, "osl": 256, "concurrency": 32},
     ["--concurrency \"$C\"", "--request-count $((10 * C))", "--synthetic-input-tokens-mean 1024",
      "--output-tokens-mean 256", "min_tokens:256", 'CONCURRENCIES="${CONCURRENCIES:-32}"', "/bench/c$C"]),
    ({"shape": "request_rate", "isl": 2000, "osl": 200, "request_rate": 8, "num_request_ratio": 30},
     ["--request-rate 8 --request-count 240", "/bench/rate8"]),
    ({"shape": "trace", "trace_path": "traces/t.jsonl", "replay_concurrency": 16},
     ['--input-file "$TRACE"', "--custom-dataset-type mooncake_trace --fixed-schedule", "--concurrency 16"]),
    ({"shape": "sessions"}, ["has no one AIPerf command"]),
])
def test_bench_sh_measures_the_pick_at_the_sweeps_workload(workload, has, tmp_path):
    import subprocess

    from spica_pipeline.report.bench_script import bench_script

    config = {"model_name": "Qwen/Qwen3-32B", "deployment_mode": "agg", "concurrency": 32}
    text = bench_script(config, 3, workload)
    for piece in has:
        assert piece in text, piece
    assert "kubectl port-forward svc/spica-qwen3-32b-agg-3-frontend 8000:8000" in text
    assert 'MODEL="${MODEL:-Qwen/Qwen3-32B}"' in text
    path = tmp_path / "bench.sh"
    path.write_text(text)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
