"""Applying a profile: the factor lookup, calibrated values and bands beside the raw ones, the client replay and its
sweep fallback, overheads, the goal metrics, and what the evaluator, tables and deploy records show."""

import os
import subprocess
import sys

import pytest
from calibration_fakes import OVERHEAD, PLAIN, SLOPED, client_record, evaluate_with_profile, fake_replay, record

from spica_pipeline.fidelity import apply as ap
from spica_pipeline.fidelity.fit import fit
from spica_pipeline.fidelity.profile import FALLBACK_WIDEN, for_client, load_profile


def profile(records=None, method=PLAIN):
    return fit(records or [record(i) for i in range(10)], fitted="d", source="t", method=method)


REPORT = {"mean_ttft_ms": 120.0, "median_ttft_ms": 110.0, "p90_ttft_ms": 300.0, "mean_tpot_ms": 11.0,
          "p90_tpot_ms": 15.0, "mean_itl_ms": 11.2, "mean_output_token_throughput_per_user": 88.0,
          "mean_e2e_latency_ms": 1200.0, "p90_e2e_latency_ms": 2000.0, "output_throughput_tok_s": 5000.0,
          "request_throughput_rps": 4.0}


@pytest.mark.parametrize("system, backend, concurrency, lengths, client, widen, expected", [
    ("h200_sxm", "vllm", 16, None, {"ttft": 250.0, "tpot": 14.0}, 1.5,
     (333.2311908857976, 15.499999999999998, 0.5952707112597346, 1.934934546864854, 0.0)),
    ("b200_sxm", "sglang", {"ttft": 4, "tpot": 64}, "fixed", {"ttft": 250.0, "tpot": 14.0}, 1.5,
     (250.00000000000003, 14.0, 0.6276627682367721, 29.266462913633923, 1.0)),
    ("gb200", "vllm", 3.5, None, None, 1.0,
     (278.12236349596657, 12.500000000000002, 0.31633088778254076, 3.410351959844946, 1.0)),
    ("h100_sxm", "sglang", 200, "spread", None, 1.5,
     (120.0, 11.0, 1.5025977821900404e-05, 771.6522537253022, 1.0)),
])
def test_the_packaged_profile_gives_the_recorded_calibrated_values(system, backend, concurrency, lengths, client,
                                                                   widen, expected):
    """The shipped profile applied exactly as recorded (the values sweeps rank on): a change here moves what users
    get (tests/test_ledger_digest.py holds whole sweeps)."""
    packaged, _ = load_profile("auto")
    assert packaged is not None
    out = ap.calibrate(REPORT, for_client(packaged, lengths, backend), system=system, backend=backend,
                       concurrency=concurrency, extra_widen=widen, closed_loop=True, client=client)
    got = (out["calibrated_mean_ttft_ms"], out["calibrated_mean_tpot_ms"], out["band_ttft_lo"], out["band_ttft_hi"],
           out["calibration_fallback"])
    assert got == expected


def test_calibrate_puts_calibrated_values_and_bands_beside_raw():
    p = profile()  # TTFT ~2.04x, TPOT 0.5x on h200/vllm
    out = ap.calibrate({"mean_ttft_ms": 100.0, "mean_tpot_ms": 10.0, "mean_output_token_throughput_per_user": 100.0},
                       p, system="h200_sxm", backend="vllm", concurrency=8, client={"ttft": 100.0, "tpot": 10.0})
    assert out["calibrated_mean_ttft_ms"] == pytest.approx(204, rel=0.02)
    assert out["calibrated_mean_tpot_ms"] == pytest.approx(5.0, rel=0.01)
    assert out["calibrated_mean_output_token_throughput_per_user"] == pytest.approx(200, rel=0.01)
    assert out["band_ttft_lo"] <= 1.0 <= out["band_ttft_hi"] and out["calibration_fallback"] == 0.0
    lo, hi = ap.goal_band(out, "throughput_per_user", 200.0)
    assert lo <= 200.0 <= hi
    wider = ap.calibrate({"mean_ttft_ms": 100.0}, p, system="h200_sxm", backend="vllm", concurrency=8,
                         extra_widen=2.0, client={"ttft": 100.0})
    assert wider["band_ttft_hi"] >= out["band_ttft_hi"]


def test_an_unknown_slice_reads_its_backend_then_its_phase_with_a_wider_band():
    p = profile([record(i) for i in range(6)] + [record(10 + i, system="b200_sxm", ttft_ratio=3.0) for i in range(6)])
    known = ap.lookup(p, "h200_sxm", "vllm", "ttft")
    unknown = ap.lookup(p, "gb200", "vllm", "ttft")
    other = ap.lookup(p, "gb200", "trtllm", "ttft")
    assert known["source"] == "slice" and unknown["source"] == "fallback:backend" and unknown["rows"] == 0
    assert other["source"] == "fallback:phase"
    assert unknown["band"] == [b * FALLBACK_WIDEN for b in p["backend"]["vllm/ttft"]["band"]]


def test_the_load_term_follows_concurrency():
    rows = [record(i, c=c, ttft_ratio=1.0 + 0.5 * c.bit_length()) for i, c in enumerate([1, 2, 4, 8, 16, 32, 64] * 2)]
    p = profile(rows, SLOPED)
    (load,) = p["terms"]["ttft"]
    assert load["fitted"] > 0.1 and load["coefficient"] == load["fitted"]
    f1 = ap.lookup(p, "h200_sxm", "vllm", "ttft", 1)["factor"]
    f64 = ap.lookup(p, "h200_sxm", "vllm", "ttft", 64)["factor"]
    assert f64 / f1 == pytest.approx(2.718281828 ** (load["coefficient"] * 6), rel=1e-6)


def test_a_client_phase_reads_the_client_replay_and_falls_back_to_the_sweep_fit_without_it():
    p = profile([client_record(i) for i in range(6)])
    report = {"mean_ttft_ms": 50.0, "p90_ttft_ms": 80.0, "mean_tpot_ms": 10.0, "mean_e2e_latency_ms": 1050.0}
    out = ap.calibrate(report, p, system="h200_sxm", backend="vllm", concurrency=8,
                       client={"ttft": 200.0, "tpot": 10.0})
    assert out["calibrated_mean_ttft_ms"] == pytest.approx(300.0)  # client 200 x 1.5
    assert out["calibration_factor_ttft"] == pytest.approx(6.0)  # over the sweep's own 50
    assert out["calibrated_p90_ttft_ms"] == pytest.approx(480.0)  # the phase's keys follow its factor
    assert out["client_mean_ttft_ms"] == 200.0 and out["calibration_client_replay"] == 1.0
    assert out["calibrated_mean_e2e_latency_ms"] == pytest.approx(300.0 + 1000.0 * 0.5)
    alone = ap.calibrate(report, p, system="h200_sxm", backend="vllm", concurrency=8)
    assert alone["calibrated_mean_ttft_ms"] == pytest.approx(300.0)  # sweep 50 x the fallback's 6
    assert alone["calibration_client_replay"] == 0.0 and alone["calibration_fallback"] == 0.0


def test_an_overhead_is_added_to_the_replayed_value_before_the_factor():
    rows = [{**record(i), "ours": {"ttft": replayed, "tpot": 10.0}, "sweep": {"ttft": replayed / 2, "tpot": 10.0},
             "silicon": {"ttft": 1.5 * (replayed + 30.0), "tpot": 5.0}}
            for i, replayed in enumerate([20.0, 60.0, 200.0, 1000.0, 5000.0] * 3)]
    p = profile(rows, OVERHEAD)
    assert p["overhead_ms"] == {"vllm/ttft": 30.0}
    out = ap.calibrate({"mean_ttft_ms": 50.0, "mean_tpot_ms": 10.0}, p, system="h200_sxm", backend="vllm",
                       concurrency=8, client={"ttft": 40.0, "tpot": 10.0})
    assert out["calibrated_mean_ttft_ms"] == pytest.approx(1.5 * (40.0 + 30.0))
    assert out["calibration_factor_ttft"] == pytest.approx(1.5 * 70.0 / 50.0)
    fb = p["sweep_fallback"]  # without the client replay: the sweep fallback's own factor and overhead
    alone = ap.calibrate({"mean_ttft_ms": 50.0, "mean_tpot_ms": 10.0}, p, system="h200_sxm", backend="vllm",
                         concurrency=8)
    a, f = fb["overhead_ms"]["vllm/ttft"], fb["slices"]["h200_sxm/vllm/ttft"]["factor"]
    assert alone["calibrated_mean_ttft_ms"] == pytest.approx(f * (50.0 + a))


def test_goal_metrics_are_calibrated_from_the_phases():
    p = profile()
    report = {"mean_ttft_ms": 100.0, "mean_tpot_ms": 10.0, "mean_e2e_latency_ms": 200.0, "p90_e2e_latency_ms": 300.0,
              "output_throughput_tok_s": 1000.0, "request_throughput_rps": 10.0}
    closed = ap.calibrate(report, p, system="h200_sxm", backend="vllm", concurrency=8, closed_loop=True,
                          client={"ttft": 100.0, "tpot": 10.0})
    f_ttft, f_tpot = closed["calibration_factor_ttft"], closed["calibration_factor_tpot"]
    e2e = 100.0 * f_ttft + 100.0 * f_tpot
    assert closed["calibrated_mean_e2e_latency_ms"] == pytest.approx(e2e)
    assert closed["calibrated_p90_e2e_latency_ms"] == pytest.approx(300.0 * e2e / 200.0)
    assert closed["calibrated_output_throughput_tok_s"] == pytest.approx(1000.0 * 200.0 / e2e)
    assert closed["calibrated_request_throughput_rps"] == pytest.approx(10.0 * 200.0 / e2e)
    opened = ap.calibrate(report, p, system="h200_sxm", backend="vllm", concurrency=8, closed_loop=False,
                          client={"ttft": 100.0, "tpot": 10.0})
    assert opened["calibrated_output_throughput_tok_s"] == 1000.0  # arrivals are fixed in an open loop


def _requests(n=10, ttft=100.0, itl=10.0, osl=11):
    """Closed-loop-like per-request records inside a [0, 10 000] ms window."""
    out = []
    for i in range(n):
        start = 1000.0 + 500.0 * i
        end = start + ttft + itl * (osl - 1)
        out.append({"arrival_time_ms": start, "ttft_ms": ttft + 10.0 * i, "itl_ms": itl, "output_length": osl,
                    "first_token_ms": start + ttft + 10.0 * i, "terminal_time_ms": end, "e2e_latency_ms": end - start})
    return out


def test_calibrated_goodput_retests_each_request_against_the_sla():
    from spica_pipeline.config.goal import GOODPUT_KEY

    p = profile()  # TTFT x ~2.04: requests with raw TTFT 100-190 ms all pass 250 ms raw, few calibrated
    report = {"mean_ttft_ms": 145.0, "mean_tpot_ms": 10.0, "mean_e2e_latency_ms": 245.0,
              "output_throughput_tok_s": 1000.0, "window_start_ms": 0.0, "window_end_ms": 10_000.0}
    client = {"ttft": 145.0, "tpot": 10.0}
    out = ap.calibrate(report, p, system="h200_sxm", backend="vllm", concurrency=8, closed_loop=True,
                       per_request=_requests(), sla={"ttft_ms": 250.0}, client=client)
    f = out["calibration_factor_ttft"]
    meets = sum(1 for r in _requests() if r["ttft_ms"] * f <= 250.0)
    assert 0 < meets < 10
    assert out["calibrated_goodput_completed_requests"] == meets
    assert out["calibrated_sla_token_share"] == pytest.approx(meets / 10)
    assert out[f"calibrated_{GOODPUT_KEY}"] == pytest.approx(out["calibrated_output_throughput_tok_s"] * meets / 10)
    # no SLA or no per-request data: no calibrated goodput (ranking falls back to the raw key)
    assert f"calibrated_{GOODPUT_KEY}" not in ap.calibrate(report, p, system="h200_sxm", backend="vllm",
                                                            concurrency=8, closed_loop=True, client=client)


def test_bands_reach_candidates_csv_report_and_deploy_output():
    from spica_pipeline.evaluate.scoring import Candidate
    from spica_pipeline.report.deploy import deployment_dict
    from spica_pipeline.report.markdown import _bands
    from spica_pipeline.report.tables import candidates_frame

    report = {"output_throughput_tok_s": 1000.0, "mean_ttft_ms": 100.0, "mean_tpot_ms": 10.0,
              "mean_output_token_throughput_per_user": 100.0}
    report.update(ap.calibrate(report, profile(), system="h200_sxm", backend="vllm", concurrency=8))
    c = Candidate.from_report({"used_gpus": 2, "deployment_mode": "agg"}, report, "throughput_per_user",
                              branch="agg", spec_hash="x")
    assert c.metrics["calibrated_mean_ttft_ms"] == report["calibrated_mean_ttft_ms"]
    frame = candidates_frame([c], target="throughput_per_user")
    for name in ("ttft_ms", "tpot_ms", "goal"):
        lo, hi = frame.loc[0, f"band.{name}.p10"], frame.loc[0, f"band.{name}.p90"]
        assert 0 < lo <= hi
    assert all("[" in cell for cell in _bands(c, "throughput_per_user"))
    expected = deployment_dict(c, 1, target="throughput_per_user")["expected"]
    assert set(expected["bands_p10_p90"]) == {"ttft_ms", "tpot_ms", "goal"}
    # without calibration there is nothing to show, and nothing breaks
    raw = Candidate.from_report({"used_gpus": 2}, {"mean_ttft_ms": 1.0}, "throughput", branch="agg")
    assert "bands_p10_p90" not in deployment_dict(raw, 1, target="throughput")["expected"]
    assert _bands(raw, "throughput") == ["–", "–", "–"]


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


def test_a_client_profile_makes_the_evaluator_replay_the_benchmark_client(monkeypatch, tmp_path):
    from test_deploy import agg_candidate
    from test_replay import THROUGHPUT

    from spica_pipeline.evaluate.evaluator import EvalRequest
    from spica_pipeline.evaluate.replay import ReplayEvaluator

    f = fake_replay(monkeypatch, tmp_path, [200.0, 50.0])  # the client replay first, then the sweep's
    out = evaluate_with_profile(tmp_path, profile([client_record(i) for i in range(6)]))
    assert out.status == "feasible", out.reason
    (client_fn, _, _), (sweep_fn, _, _) = f.calls
    assert client_fn == "trace" and sweep_fn == "synthetic"  # the client replay's length spread needs a trace
    assert out.derived["benchmark_client"]["mean_ttft_ms"] == 200.0
    assert out.derived["benchmark_client"]["window_rule"] == "benchmark_client"
    assert out.derived["benchmark_client"]["request_count"] == 20  # 10 x c
    assert out.report["client_mean_ttft_ms"] == 200.0
    assert out.report["calibrated_mean_ttft_ms"] == pytest.approx(300.0)
    f.calls.clear()  # without a calibration profile there is no second replay
    wl = {"isl": 100, "osl": 10, "concurrency": 2, "num_request_ratio": 8}
    plain = ReplayEvaluator(cache_dir=str(tmp_path)).evaluate(EvalRequest(agg_candidate(), wl, THROUGHPUT))
    assert plain.status == "feasible" and len(f.calls) == 1 and "benchmark_client" not in plain.derived


def test_a_sweep_profile_needs_no_client_replay(monkeypatch, tmp_path):
    f = fake_replay(monkeypatch, tmp_path, [50.0])
    sweep_only = fit([client_record(i) for i in range(6)], fitted="d", source="t", method=PLAIN.on_sweep())
    out = evaluate_with_profile(tmp_path, sweep_only)
    assert out.status == "feasible", out.reason
    assert len(f.calls) == 1 and "benchmark_client" not in out.derived
    assert out.report["calibrated_mean_ttft_ms"] == pytest.approx(out.report["mean_ttft_ms"] * 6.0)  # 300 / 50


@pytest.mark.integration
def test_a_calibrated_sweep_ranks_on_calibrated_goodput_and_says_so(tmp_path):
    """evaluation.calibration auto (the default): the goal value is the calibrated one, the raw one stays beside it
    in the ledger, and report.md says which numbers ranked and cites the profile's held-out check."""
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
    assert "## Accuracy on unseen models (held-out check)" in report and "`replay-v16.json`" in report
    assert "| vllm | 429 |" in report and "| sglang |" not in report
    assert "# held-out check of these numbers: vllm TTFT median error" in (out / "deploy" / "1" / "dgd.yaml").read_text()


def test_each_phase_reads_the_system_that_runs_it():
    """Prefill on H100 and decode on H200: TTFT takes h100_sxm's correction, TPOT h200_sxm's, each as a
    one-system candidate on that GPU would get it."""
    packaged, _ = load_profile("auto")
    assert packaged is not None
    prof = for_client(packaged, None, "vllm")
    split = ap.calibrate(REPORT, prof, system={"ttft": "h100_sxm", "tpot": "h200_sxm"}, backend="vllm",
                         concurrency=16, closed_loop=True)
    for phase, system in (("ttft", "h100_sxm"), ("tpot", "h200_sxm")):
        alone = ap.calibrate(REPORT, prof, system=system, backend="vllm", concurrency=16, closed_loop=True)
        assert split[f"calibration_factor_{phase}"] == alone[f"calibration_factor_{phase}"]
        assert split[f"calibrated_mean_{phase}_ms"] == alone[f"calibrated_mean_{phase}_ms"]
    on_h200 = ap.calibrate(REPORT, prof, system="h200_sxm", backend="vllm", concurrency=16, closed_loop=True)
    assert split["calibration_factor_ttft"] != on_h200["calibration_factor_ttft"]  # the two GPUs' TTFT slices differ
