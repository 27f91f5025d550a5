"""Calibration profiles: the fit (calibration split only), validation, lookup, bands, and bad files."""

import json
import math
import subprocess
import sys

import pytest

from spica_pipeline.errors import ConfigError
from spica_pipeline.fidelity import calibration as cal
from spica_pipeline.fidelity import profiles as loader


def record(i, system="h200_sxm", backend="vllm", c=8, ttft_ratio=2.0, tpot_ratio=0.5, split="calibration"):
    return {"id": f"r{i}", "split": split, "system": system, "backend": backend, "concurrency": c,
            "shape": {"agg": {"workers": 1}}, "ours": {"ttft": 100.0, "tpot": 10.0},
            "silicon": {"ttft": 100.0 * ttft_ratio * (1 + 0.01 * (i % 5)), "tpot": 10.0 * tpot_ratio}}


# a fixed method (slices in both phases), so these tests do not move with the shipped choice (cal.CHOSEN)
SLICED = cal.Method("test", cal.PhaseMethod(1.0), cal.PhaseMethod(1.0))


def profile(records=None):
    return cal.fit(records or [record(i) for i in range(10)], fitted="2026-12-04", source="test", method=SLICED)


def test_fit_recovers_a_slice_factor_and_records_provenance():
    p = profile()
    s = p["slices"]["h200_sxm/vllm/ttft"]
    assert s["rows"] == 10 and s["factor"] == pytest.approx(2.04, rel=0.02)
    assert p["slices"]["h200_sxm/vllm/tpot"]["factor"] == pytest.approx(0.5, rel=0.01)
    assert p["rows_used"] == sorted(f"r{i}" for i in range(10)) and p["fitted"] == "2026-12-04"
    assert p["method"] == SLICED.describe() and p["format"] == cal.PROFILE_FORMAT
    assert cal.validate(json.loads(json.dumps(p)))


def test_fit_refuses_held_out_rows():
    with pytest.raises(cal.ProfileError, match="held-out"):
        profile([record(1), record(2, split="heldout")])


def test_load_slope_follows_concurrency():
    rows = [record(i, c=c, ttft_ratio=1.0 + math.log2(c) * 0.5) for i, c in enumerate([1, 2, 4, 8, 16, 32, 64] * 2)]
    p = profile(rows)
    (load,) = [t for t in p["terms"]["ttft"] if t["feature"] == cal.LOAD]
    assert load["fitted"] > 0.1 and abs(p["terms"]["tpot"][0]["fitted"]) < 1e-9
    lo = cal.lookup(p, "h200_sxm", "vllm", "ttft", 1)["factor"]
    hi = cal.lookup(p, "h200_sxm", "vllm", "ttft", 64)["factor"]
    assert hi > 2 * lo


def test_slope_shrink_is_applied_as_recorded():
    """format 2 applies exp(m + s b x) with the s it records (format 1 applied s = ln 2 unsaid)."""
    rows = [record(i, c=c, ttft_ratio=2.0 ** (0.3 * math.log2(c))) for i, c in enumerate([1, 2, 4, 8, 16, 32, 64] * 2)]
    for s in (0.0, 0.5, 1.0):
        method = cal.Method("t", cal.PhaseMethod(s), cal.PhaseMethod(s))
        p = cal.fit(rows, fitted="d", source="t", method=method)
        (load,) = p["terms"]["ttft"]
        assert load["coefficient"] == pytest.approx(s * load["fitted"], abs=1e-6)
        f1 = cal.lookup(p, "h200_sxm", "vllm", "ttft", 1)["factor"]
        f64 = cal.lookup(p, "h200_sxm", "vllm", "ttft", 64)["factor"]
        assert f64 / f1 == pytest.approx(math.exp(load["coefficient"] * 6), rel=1e-6)


def test_extra_feature_term_and_its_centre_when_the_feature_is_unknown():
    rows = [{**record(i), "isl": isl, "silicon": {"ttft": 100.0 * (8192 / isl) ** 0.5, "tpot": 5.0}}
            for i, isl in enumerate([1024, 2048, 4096, 8192] * 3)]
    method = cal.Method("isl", cal.PhaseMethod(0.0, extra="log2_isl"), cal.PhaseMethod(0.0))
    p = cal.fit(rows, fitted="d", source="t", method=method)
    short = cal.lookup(p, "h200_sxm", "vllm", "ttft", 8, isl=1024)["factor"]
    long = cal.lookup(p, "h200_sxm", "vllm", "ttft", 8, isl=8192)["factor"]
    unknown = cal.lookup(p, "h200_sxm", "vllm", "ttft", 8)["factor"]
    assert short == pytest.approx(long * 8 ** 0.5, rel=0.05) and long < unknown < short


def test_format_1_profiles_still_load_and_apply_as_they_did(tmp_path):
    """replay-v2.json (format 1) keeps working: exp(m) c^b, exactly as v2 was applied."""
    from pathlib import Path

    v2_path = Path(loader.PACKAGED).with_name("replay-v2.json")
    v2, _ = loader.load_profile(str(v2_path))
    assert v2["format"] == 1
    m = v2["slices"]["h200_sxm/vllm/ttft"]["factor"]
    b = v2["load_slope"]["ttft"]
    assert cal.lookup(v2, "h200_sxm", "vllm", "ttft", 16)["factor"] == pytest.approx(m * 16 ** b)
    # the same numbers from the v2 method refitted in format 2 (s = ln 2)
    rows = [record(i, c=c, ttft_ratio=1.0 + 0.2 * math.log2(c)) for i, c in enumerate([1, 4, 16, 64] * 3)]
    old = cal.fit(rows, fitted="d", source="t", method=cal.V2_AS_APPLIED)
    (load,) = old["terms"]["ttft"]
    assert cal.lookup(old, "h200_sxm", "vllm", "ttft", 16)["factor"] == pytest.approx(
        old["slices"]["h200_sxm/vllm/ttft"]["factor"] * 16 ** load["fitted"], rel=1e-5)


def test_validate_names_a_bad_term():
    p = json.loads(json.dumps(profile()))
    p["terms"]["ttft"] = [{"feature": "log2_moon_phase", "coefficient": 1.0, "centre": 0.0}]
    with pytest.raises(cal.ProfileError, match=r"terms.ttft\[0\]"):
        cal.validate(p)


def test_backend_only_phase_offsets_are_not_fallbacks():
    method = cal.Method("b", cal.PhaseMethod(1.0, slices=False), cal.PhaseMethod(1.0))
    p = cal.fit([record(i) for i in range(6)], fitted="d", source="t", method=method)
    assert not any(k.endswith("/ttft") for k in p["slices"])
    looked = cal.lookup(p, "h200_sxm", "vllm", "ttft", 8)
    assert looked["source"] == "backend" and looked["factor"] == pytest.approx(2.04, rel=0.03)
    out = cal.calibrate({"mean_ttft_ms": 1.0}, p, system="h200_sxm", backend="vllm", concurrency=8)
    assert out["calibration_fallback"] == 0.0


def test_unknown_slice_falls_back_with_a_wider_band():
    p = profile([record(i) for i in range(6)] + [record(10 + i, system="b200_sxm", ttft_ratio=3.0)
                                                for i in range(6)])
    known = cal.lookup(p, "h200_sxm", "vllm", "ttft")
    unknown = cal.lookup(p, "gb200", "vllm", "ttft")
    assert known["source"] == "slice" and unknown["source"] == "fallback:backend" and unknown["rows"] == 0
    assert unknown["band"][1] - unknown["band"][0] >= p["backend"]["vllm/ttft"]["band"][1] - \
        p["backend"]["vllm/ttft"]["band"][0]


def test_calibrate_puts_calibrated_and_bands_beside_raw():
    p = profile()
    out = cal.calibrate({"mean_ttft_ms": 100.0, "mean_tpot_ms": 10.0, "mean_output_token_throughput_per_user": 100.0},
                        p, system="h200_sxm", backend="vllm", concurrency=8)
    assert out["calibrated_mean_ttft_ms"] == pytest.approx(204, rel=0.02)
    assert out["calibrated_mean_tpot_ms"] == pytest.approx(5.0, rel=0.01)
    assert out["calibrated_mean_output_token_throughput_per_user"] == pytest.approx(200, rel=0.01)
    assert out["band_ttft_lo"] <= 1.0 <= out["band_ttft_hi"] and out["calibration_fallback"] == 0.0
    lo, hi = cal.goal_band(out, "throughput_per_user", 200.0)
    assert lo <= 200.0 <= hi
    wider = cal.calibrate({"mean_ttft_ms": 100.0}, p, system="h200_sxm", backend="vllm", concurrency=8,
                          extra_widen=2.0)
    assert wider["band_ttft_hi"] >= out["band_ttft_hi"]


def test_the_packaged_profile_is_valid_and_fitted_on_calibration_rows_only():
    from spica_pipeline.fidelity.silicon import CALIBRATION_MODELS

    p, digest = loader.load_profile("auto")
    overhead = any(cal.CHOSEN.phase(ph).overhead for ph in cal.PHASES)
    expected = cal.OVERHEAD_FORMAT if overhead else cal.MIX_FORMAT if cal.CHOSEN.client_mix else cal.PROFILE_FORMAT
    assert p["format"] == expected and digest and p["rows_used"]
    assert set(p["phase"]) == set(cal.PHASES)
    # the packaged profile is the shipped method's fit (bench_fidelity.py --fit-calibration)
    assert p["method_name"] == cal.CHOSEN.name and p["method"] == cal.METHOD
    assert p["provenance"]["split"] == "calibration" and set(p["provenance"]["models"]) <= set(CALIBRATION_MODELS)


@pytest.mark.parametrize("content,why", [
    (None, "cannot read"),
    ("{not json", "not a valid calibration profile"),
    (json.dumps({"format": 99}), "not a valid calibration profile"),
    (json.dumps({"format": 2, "slices": {}, "backend": {}, "phase": {}, "rows_used": [], "method": "m", "fitted": "d"}),
     "missing key 'terms'"),
])
def test_missing_or_corrupt_profile_is_a_config_error_naming_the_path(tmp_path, content, why):
    path = tmp_path / "profile.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=why) as info:
        loader.load_profile(str(path))
    assert str(path) in str(info.value)
    assert loader.load_profile("none") == (None, None)


def test_cli_exits_2_naming_a_corrupt_profile(tmp_path):
    import yaml

    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    config = {
        "search_space": {"model_name": "Qwen/Qwen3-32B", "hardware_sku": "h200_sxm", "gpu_budget": 1,
                         "deployment_mode": ["agg"], "backend": ["vllm"]},
        "workload": {"isl": 128, "osl": 16, "concurrency": 1, "num_request_ratio": 1},
        "evaluation": {"calibration": str(bad)},
        "sweep": {"max_rounds": 1},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.run([sys.executable, "-m", "spica_pipeline", "sweep", "--config", str(path), "--output-dir",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert str(bad) in proc.stderr and "Traceback" not in proc.stderr


def test_bands_reach_candidates_csv_report_and_deploy_output():
    from spica_pipeline.evaluate.scoring import Candidate
    from spica_pipeline.report.deploy import deployment_dict
    from spica_pipeline.report.markdown import _bands
    from spica_pipeline.report.tables import candidates_frame

    report = {"output_throughput_tok_s": 1000.0, "mean_ttft_ms": 100.0, "mean_tpot_ms": 10.0,
              "mean_output_token_throughput_per_user": 100.0}
    report.update(cal.calibrate(report, profile(), system="h200_sxm", backend="vllm", concurrency=8))
    c = Candidate.from_report({"used_gpus": 2, "deployment_mode": "agg"}, report, "throughput_per_user",
                              branch="agg", spec_hash="x")
    assert c.metrics["calibrated_mean_ttft_ms"] == report["calibrated_mean_ttft_ms"]
    frame = candidates_frame([c], target="throughput_per_user")
    for name in ("ttft_ms", "tpot_ms", "goal"):
        lo, hi = frame.loc[0, f"band.{name}.p10"], frame.loc[0, f"band.{name}.p90"]
        assert 0 < lo <= hi
    cells = _bands(c, "throughput_per_user")
    assert all("[" in cell for cell in cells)
    expected = deployment_dict(c, 1, target="throughput_per_user")["expected"]
    assert set(expected["bands_p10_p90"]) == {"ttft_ms", "tpot_ms", "goal"}
    # without calibration there is nothing to show, and nothing breaks
    raw = Candidate.from_report({"used_gpus": 2}, {"mean_ttft_ms": 1.0}, "throughput", branch="agg")
    assert "bands_p10_p90" not in deployment_dict(raw, 1, target="throughput")["expected"]
    assert _bands(raw, "throughput") == ["–", "–", "–"]


def _requests(n=10, ttft=100.0, itl=10.0, osl=11):
    """Closed-loop-like per-request records inside a [0, 10 000] ms window."""
    out = []
    for i in range(n):
        start = 1000.0 + 500.0 * i
        end = start + ttft + itl * (osl - 1)
        out.append({"arrival_time_ms": start, "ttft_ms": ttft + 10.0 * i, "itl_ms": itl, "output_length": osl,
                    "first_token_ms": start + ttft + 10.0 * i, "terminal_time_ms": end, "e2e_latency_ms": end - start})
    return out


def test_goal_metrics_are_calibrated_from_the_phases():
    p = profile()  # TTFT x ~2.04, TPOT x 0.5 on h200/vllm
    report = {"mean_ttft_ms": 100.0, "mean_tpot_ms": 10.0, "mean_e2e_latency_ms": 200.0, "p90_e2e_latency_ms": 300.0,
              "output_throughput_tok_s": 1000.0, "request_throughput_rps": 10.0}
    closed = cal.calibrate(report, p, system="h200_sxm", backend="vllm", concurrency=8, closed_loop=True)
    f_ttft, f_tpot = closed["calibration_factor_ttft"], closed["calibration_factor_tpot"]
    e2e = 100.0 * f_ttft + 100.0 * f_tpot
    assert closed["calibrated_mean_e2e_latency_ms"] == pytest.approx(e2e)
    assert closed["calibrated_p90_e2e_latency_ms"] == pytest.approx(300.0 * e2e / 200.0)
    assert closed["calibrated_output_throughput_tok_s"] == pytest.approx(1000.0 * 200.0 / e2e)
    assert closed["calibrated_request_throughput_rps"] == pytest.approx(10.0 * 200.0 / e2e)
    opened = cal.calibrate(report, p, system="h200_sxm", backend="vllm", concurrency=8, closed_loop=False)
    assert opened["calibrated_output_throughput_tok_s"] == 1000.0  # arrivals are fixed in an open loop


def test_calibrated_goodput_retests_each_request_against_the_sla():
    from spica_pipeline.config.goal import GOODPUT_KEY

    p = profile()  # TTFT x ~2.04: requests with raw TTFT 100-190 ms all pass 250 ms raw, few calibrated
    report = {"mean_ttft_ms": 145.0, "mean_tpot_ms": 10.0, "mean_e2e_latency_ms": 245.0,
              "output_throughput_tok_s": 1000.0, "window_start_ms": 0.0, "window_end_ms": 10_000.0}
    out = cal.calibrate(report, p, system="h200_sxm", backend="vllm", concurrency=8, closed_loop=True,
                        per_request=_requests(), sla={"ttft_ms": 250.0})
    f = out["calibration_factor_ttft"]
    meets = sum(1 for r in _requests() if r["ttft_ms"] * f <= 250.0)
    assert 0 < meets < 10
    assert out["calibrated_goodput_completed_requests"] == meets
    assert out["calibrated_sla_token_share"] == pytest.approx(meets / 10)
    assert out[f"calibrated_{GOODPUT_KEY}"] == pytest.approx(out["calibrated_output_throughput_tok_s"] * meets / 10)
    # no SLA or no per-request data: no calibrated goodput (ranking falls back to the raw key)
    assert f"calibrated_{GOODPUT_KEY}" not in cal.calibrate(report, p, system="h200_sxm", backend="vllm",
                                                             concurrency=8, closed_loop=True)


@pytest.mark.integration
def test_a_calibrated_sweep_ranks_on_calibrated_goodput_and_says_so(tmp_path):
    """evaluation.calibration auto (the default): the goal value is the calibrated one, the raw one
    stays beside it in the ledger, and report.md says which numbers ranked."""
    import os

    import pandas as pd
    import yaml

    config = {
        "search_space": {"model_name": "Qwen/Qwen3-32B", "hardware_sku": "h200_sxm", "gpu_budget": 2,
                         "deployment_mode": ["agg"], "backend": ["vllm"], "router_mode": ["round_robin"],
                         "planner_scaling_policy": ["disabled"], "agg_max_num_seqs": [256],
                         "agg_max_num_batched_tokens": [8192]},
        "workload": {"isl": 512, "osl": 32, "concurrency": 8, "num_request_ratio": 4},
        "goal": {"target": "goodput", "sla": {"ttft_ms": 400.0, "itl_ms": 40.0}},
        "sweep": {"max_rounds": 1, "candidates_per_round": 3, "parallel_evals": 1},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "spica_pipeline", "sweep", "--config", str(path), "--output-dir",
                           str(out)], capture_output=True, text=True, timeout=300, env={**os.environ, "DYN_LOG": "warn"})
    assert proc.returncode == 0, proc.stderr
    candidates = pd.read_parquet(out / "candidates.parquet")
    assert list(candidates["score"]) == pytest.approx(list(candidates["calibrated_goodput_output_throughput_tok_s"]))
    assert (candidates["goodput_output_throughput_tok_s"] != candidates["score"]).any()  # raw beside it
    report = (out / "report.md").read_text()
    assert "Ranked on **calibrated** numbers" in report
    # the packaged profile's recorded held-out check, for the shown backend (tests/test_heldout_check.py)
    assert "## Accuracy on unseen models (held-out check)" in report and "`replay-v15.json`" in report
    assert "| vllm | 429 |" in report and "| sglang |" not in report
    assert "# held-out check of these numbers: vllm TTFT median error" in (out / "deploy" / "1" / "dgd.yaml").read_text()


def test_sla_attainment_is_a_share_of_the_window_it_was_counted_in():
    """goodput_completed_requests counts the steady-state window's requests, so the share is of those."""
    from spica_pipeline.evaluate.scoring import Candidate
    from spica_pipeline.report.tables import sla_attainment

    report = {"completed_requests": 64.0, "window_counted_requests": 42.0, "goodput_completed_requests": 42.0,
              "calibrated_goodput_completed_requests": 21.0}
    c = Candidate.from_report({"used_gpus": 1}, report, "throughput")
    assert sla_attainment(c) == pytest.approx(0.5)  # calibrated, out of the window's 42
    raw = Candidate.from_report({"used_gpus": 1}, {"completed_requests": 200.0, "goodput_completed_requests": 180.0},
                                "throughput")
    assert sla_attainment(raw) == pytest.approx(0.9)  # unwindowed (whole run) reports as before


# ---- a phase fitted on the benchmark-client replay ("replay": "client") ----------------------------

def client_record(i, ttft_client=200.0, ttft_sweep=50.0, silicon_ttft=300.0):
    r = record(i)
    r["ours"] = {"ttft": ttft_client, "tpot": 10.0}  # the benchmark-client replay
    r["sweep"] = {"ttft": ttft_sweep, "tpot": 10.0}
    r["silicon"] = {"ttft": silicon_ttft, "tpot": 5.0}
    return r


CLIENT = cal.Method("client-test", cal.PhaseMethod(0.0, replay="client"), cal.PhaseMethod(0.0))


def test_a_client_phase_is_fitted_on_the_client_replay_with_a_sweep_fallback():
    p = cal.fit([client_record(i) for i in range(6)], fitted="d", source="t", method=CLIENT)
    assert p["replay"] == {"ttft": "client", "tpot": "sweep"} and cal.needs_client(p)
    assert p["slices"]["h200_sxm/vllm/ttft"]["factor"] == pytest.approx(1.5)  # 300 / 200
    assert p["slices"]["h200_sxm/vllm/tpot"]["factor"] == pytest.approx(0.5)
    fallback = p["sweep_fallback"]
    assert not cal.needs_client(fallback) and fallback["slices"]["h200_sxm/vllm/ttft"]["factor"] == pytest.approx(6.0)
    assert cal.validate(json.loads(json.dumps(p)))
    broken = {k: v for k, v in p.items() if k != "sweep_fallback"}
    with pytest.raises(cal.ProfileError, match="sweep_fallback"):
        cal.validate(broken)
    with pytest.raises(cal.ProfileError, match="replay"):
        cal.validate({**p, "replay": {"ttft": "lockstep", "tpot": "sweep"}})


def test_calibrate_reads_the_client_replay_and_falls_back_to_the_sweep_fit_without_it():
    p = cal.fit([client_record(i) for i in range(6)], fitted="d", source="t", method=CLIENT)
    report = {"mean_ttft_ms": 50.0, "p90_ttft_ms": 80.0, "mean_tpot_ms": 10.0, "mean_e2e_latency_ms": 1050.0}
    out = cal.calibrate(report, p, system="h200_sxm", backend="vllm", concurrency=8,
                        client={"ttft": 200.0, "tpot": 12.0})
    assert out["calibrated_mean_ttft_ms"] == pytest.approx(300.0)  # client 200 x 1.5
    assert out["calibration_factor_ttft"] == pytest.approx(6.0)  # over the sweep's own 50
    assert out["calibrated_p90_ttft_ms"] == pytest.approx(480.0)  # the phase's keys follow its factor
    assert out["calibrated_mean_tpot_ms"] == pytest.approx(5.0)  # TPOT stays on the sweep basis
    assert out["client_mean_ttft_ms"] == 200.0 and out["calibration_client_replay"] == 1.0
    assert out["calibrated_mean_e2e_latency_ms"] == pytest.approx(300.0 + 1000.0 * 0.5)
    alone = cal.calibrate(report, p, system="h200_sxm", backend="vllm", concurrency=8)
    assert alone["calibrated_mean_ttft_ms"] == pytest.approx(300.0)  # sweep 50 x the fallback's 6
    assert alone["calibration_client_replay"] == 0.0 and alone["calibration_fallback"] == 0.0


def test_benchmark_client_request_is_the_bench_replay():
    from spica_pipeline.evaluate.evaluator import EvalRequest
    from spica_pipeline.fidelity import measurement

    req = EvalRequest({"backend": "vllm"}, {"isl": 100, "osl": 10, "concurrency": 4, "num_request_ratio": 6},
                      {"target": "throughput"}, {"calibration": {"setting": "auto"}, "router_repeats": 2})
    out = measurement.benchmark_client_request(req)
    assert out.context == {"router_repeats": 2, "closed_loop_client": "together"}
    assert out.workload["num_request_ratio"] == measurement.CLIENT_REQUEST_RATIO
    spread = measurement.CLIENT_LENGTH_SPREAD
    assert out.workload["isl_jitter"] == out.workload["osl_jitter"] == spread == 1 / 9  # InferenceMAX's spread
    sglang = measurement.benchmark_client_request(EvalRequest({"backend": "sglang"}, req.workload, req.goal))
    assert sglang.workload["isl_jitter"] == sglang.workload["osl_jitter"] == spread  # both backends alike
    own = measurement.benchmark_client_request(EvalRequest({"backend": "vllm"}, {**req.workload, "osl_jitter": 0.3},
                                                           req.goal))
    assert own.workload["osl_jitter"] == 0.3 and "isl_jitter" not in own.workload  # the workload's own spread wins
    fixed = measurement.benchmark_client_request(EvalRequest({"backend": "vllm"}, req.workload, req.goal,
                                                             {"client_lengths": "fixed"}), fixed_lengths=True)
    assert "osl_jitter" not in fixed.workload and "client_lengths" not in fixed.context  # a fixed-length client
    turns = measurement.benchmark_client_request(EvalRequest({"backend": "vllm"}, {**req.workload,
                                                                                   "turns_per_session": 3}, req.goal))
    assert "osl_jitter" not in turns.workload  # multi-turn sessions cannot take per-request lengths
    assert req.workload["num_request_ratio"] == 6 and "calibration" in req.context  # the original is untouched


def _fake_replay(monkeypatch, tmp_path, vary):
    """The replay and its timing/KV inputs stubbed, so ReplayEvaluator runs without perf data; the
    FakeReplay records each replay call (client before sweep)."""
    import dynamo._core as core
    from test_replay import FakeReplay

    from spica_pipeline.evaluate import timing
    from spica_pipeline.space import kv as kv_mod

    f = FakeReplay(vary=vary)
    monkeypatch.setattr(core, "run_mocker_trace_replay", f.trace)
    monkeypatch.setattr(core, "run_mocker_synthetic_trace_replay", f.synthetic)
    monkeypatch.setattr(timing, "kv_capacity", lambda ident, **kw: timing.KvCapacity(
        tokens_per_rank=64_000 * ident.tp, bytes_per_token=131072 // ident.tp))
    monkeypatch.setattr(timing, "timing_table", lambda ident, **kw: timing.TimingTable(
        path=str(tmp_path / f"tp{ident.tp}.npz"), speedup_ratio=10.0, key="k"))
    monkeypatch.setattr(timing, "model_context_length", lambda model: 40960)
    monkeypatch.setattr(timing, "table_estimators", lambda path: (lambda t: 100.0, lambda b, c: 10.0))
    monkeypatch.setattr(kv_mod, "estimate_kv_tokens", lambda *a, **k: 1216)
    return f


def evaluate_with_profile(tmp_path, profile, name):
    """A small agg h200 candidate evaluated with `profile` (written to tmp_path / name) as its calibration."""
    from test_deploy import agg_sample
    from test_replay import THROUGHPUT

    from spica_pipeline.evaluate.evaluator import EvalRequest
    from spica_pipeline.evaluate.replay import ReplayEvaluator

    path = tmp_path / name
    path.write_text(json.dumps(profile))
    wl = {"isl": 100, "osl": 10, "concurrency": 2, "num_request_ratio": 8}
    req = EvalRequest(agg_sample(hardware_sku="h200_sxm"), wl, THROUGHPUT, {"calibration": {"setting": str(path)}})
    return ReplayEvaluator(cache_dir=str(tmp_path)).evaluate(req)


def test_a_client_profile_makes_the_evaluator_replay_the_benchmark_client(monkeypatch, tmp_path):
    from test_deploy import agg_sample
    from test_replay import THROUGHPUT

    from spica_pipeline.evaluate.evaluator import EvalRequest
    from spica_pipeline.evaluate.replay import ReplayEvaluator

    f = _fake_replay(monkeypatch, tmp_path, [200.0, 50.0])  # the first call is the client replay, the second the sweep's
    path = tmp_path / "client.json"
    path.write_text(json.dumps(cal.fit([client_record(i) for i in range(6)], fitted="d", source="t", method=CLIENT)))
    wl = {"isl": 100, "osl": 10, "concurrency": 2, "num_request_ratio": 8}
    req = EvalRequest(agg_sample(hardware_sku="h200_sxm"), wl, THROUGHPUT, {"calibration": {"setting": str(path)}})
    out = ReplayEvaluator(cache_dir=str(tmp_path)).evaluate(req)
    assert out.status == "feasible", out.reason
    (client_fn, _, client_kw), (sweep_fn, sweep_args, _) = f.calls
    assert client_fn == "trace" and sweep_fn == "synthetic"  # vLLM: the client replay's OSL spread needs a trace
    assert out.derived["benchmark_client"]["mean_ttft_ms"] == 200.0
    assert out.derived["benchmark_client"]["window_rule"] == "benchmark_client"
    assert out.derived["benchmark_client"]["request_count"] == 20  # 10 x c
    assert out.report["client_mean_ttft_ms"] == 200.0
    assert out.report["calibrated_mean_ttft_ms"] == pytest.approx(300.0)
    # without a calibration profile there is no second replay
    f.calls.clear()
    plain = ReplayEvaluator(cache_dir=str(tmp_path)).evaluate(EvalRequest(agg_sample(), wl, THROUGHPUT))
    assert plain.status == "feasible" and len(f.calls) == 1 and "benchmark_client" not in plain.derived


# ---- format 3: a (backend, phase) fitted on its own rows with its own replay basis ------------------

def mixed_records():
    """vLLM rows whose client replay is right (x1.5), SGLang rows whose sweep replay is (x2)."""
    rows = [client_record(i) for i in range(6)]  # vllm: silicon 300, client 200, sweep 50
    for i in range(6, 12):
        r = client_record(i, ttft_client=900.0, ttft_sweep=150.0, silicon_ttft=300.0)
        r["backend"], r["model"] = "sglang", f"m{i % 3}"
        rows.append(r)
    for i, r in enumerate(rows[:6]):
        r["model"] = f"m{i % 3}"
    return rows


PER_BACKEND = cal.Method("pb-test", cal.PhaseMethod(0.0, replay="client"), cal.PhaseMethod(0.0),
                         per_backend=(("vllm", "ttft", cal.PhaseMethod(0.0, replay="client")),
                                      ("sglang", "ttft", cal.PhaseMethod(0.0))))


def test_a_per_backend_override_is_fitted_on_its_rows_with_its_own_basis():
    p = cal.fit(mixed_records(), fitted="d", source="t", method=PER_BACKEND)
    assert p["format"] == cal.PER_BACKEND_FORMAT and p["method_name"] == "pb-test"
    assert p["replay"] == {"ttft": "client", "tpot": "sweep", "vllm/ttft": "client", "sglang/ttft": "sweep"}
    assert "sglang/ttft" in p["terms"] and "(own fit)" in p["method"]
    assert p["slices"]["h200_sxm/vllm/ttft"]["factor"] == pytest.approx(1.5)  # client basis
    assert p["slices"]["h200_sxm/sglang/ttft"]["factor"] == pytest.approx(2.0)  # sweep basis: 300 / 150
    assert cal.needs_client(p) and cal.needs_client(p, "vllm") and not cal.needs_client(p, "sglang")
    assert cal.replay_basis(p, "ttft", "sglang") == "sweep" and cal.replay_basis(p, "ttft", "trtllm") == "client"
    fallback = p["sweep_fallback"]
    assert not cal.needs_client(fallback) and fallback["slices"]["h200_sxm/sglang/ttft"]["factor"] == pytest.approx(2.0)
    assert len(p["rows_used"]) == 12
    assert cal.validate(json.loads(json.dumps(p)))
    report = {"mean_ttft_ms": 150.0, "mean_tpot_ms": 10.0}
    sg = cal.calibrate(report, p, system="h200_sxm", backend="sglang", concurrency=8, client={"ttft": 900.0})
    assert sg["calibrated_mean_ttft_ms"] == pytest.approx(300.0) and "client_mean_ttft_ms" not in sg
    assert "calibration_client_replay" not in sg  # nothing on SGLang reads the client replay
    vl = cal.calibrate({**report, "mean_ttft_ms": 50.0}, p, system="h200_sxm", backend="vllm", concurrency=8,
                       client={"ttft": 200.0})
    assert vl["calibrated_mean_ttft_ms"] == pytest.approx(300.0) and vl["calibration_client_replay"] == 1.0


def test_format_3_keys_are_validated():
    p = cal.fit(mixed_records(), fitted="d", source="t", method=PER_BACKEND)
    with pytest.raises(cal.ProfileError, match="format 3"):
        cal.validate({**p, "format": 2})  # a format-2 reader would ignore the override silently
    with pytest.raises(cal.ProfileError, match="per-backend keys"):
        cal.validate({**p, "replay": {**p["replay"], "sglang/e2e": "sweep"}})
    with pytest.raises(cal.ProfileError, match="replay.sglang/ttft"):
        cal.validate({**p, "replay": {**p["replay"], "sglang/ttft": "lockstep"}})
    with pytest.raises(cal.ProfileError, match="terms.sglang/ttft"):
        cal.validate({**p, "terms": {**p["terms"], "sglang/ttft": [{"feature": "nope"}]}})


def test_a_format_3_file_loads_and_a_bad_one_names_its_path(tmp_path):
    good = tmp_path / "v5.json"
    good.write_text(json.dumps(cal.fit(mixed_records(), fitted="d", source="t", method=PER_BACKEND)))
    profile, digest = loader.load_profile(str(good))
    assert profile is not None and profile["format"] == 3 and digest
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**profile, "replay": {**profile["replay"], "x/y/ttft": "sweep"}}))
    with pytest.raises(ConfigError, match=str(bad)):
        loader.load_profile(str(bad))


def test_within_model_slopes_ignore_between_model_offsets():
    """Two models, each flat in load, the slower one measured only at high load: the pooled Theil-Sen
    slope sees a trend, the within-model slope none."""
    rows = []
    for i, c in enumerate([1, 2, 4, 8]):
        rows.append({**record(i, c=c, ttft_ratio=1.0), "model": "a"})
    for i, c in enumerate([16, 32, 64, 128], 4):
        rows.append({**record(i, c=c, ttft_ratio=4.0), "model": "b"})
    pooled = cal.fit(rows, fitted="d", source="t", method=cal.Method("p", cal.PhaseMethod(1.0), cal.PhaseMethod(1.0)))
    within = cal.fit(rows, fitted="d", source="t",
                     method=cal.Method("w", cal.PhaseMethod(1.0, within=True), cal.PhaseMethod(1.0, within=True)))
    assert pooled["terms"]["ttft"][0]["fitted"] > 0.1
    assert abs(within["terms"]["ttft"][0]["fitted"]) < 0.02
    assert "within-model" in cal.PhaseMethod(1.0, within=True).label()


def test_a_backend_whose_phases_are_on_the_sweep_basis_gets_no_client_replay(monkeypatch, tmp_path):
    f = _fake_replay(monkeypatch, tmp_path, [50.0])
    method = cal.Method("pb", cal.PhaseMethod(0.0, replay="client"), cal.PhaseMethod(0.0),
                        per_backend=(("vllm", "ttft", cal.PhaseMethod(0.0)),))
    p = cal.fit(mixed_records(), fitted="d", source="t", method=method)
    assert cal.needs_client(p) and not cal.needs_client(p, "vllm")
    out = evaluate_with_profile(tmp_path, p, "pb.json")
    assert out.status == "feasible", out.reason
    assert len(f.calls) == 1 and "benchmark_client" not in out.derived  # the sweep's own replay only
    assert out.report["calibrated_mean_ttft_ms"] == pytest.approx(out.report["mean_ttft_ms"] * 6.0)  # 300 / 50
