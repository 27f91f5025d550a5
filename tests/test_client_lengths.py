"""Round 15: replay-v13 and evaluation.client_lengths (fixed-length factors where a fixed-length client stays in
lockstep: SGLang), docs/fidelity.md "Round 15"."""

import json
from pathlib import Path

import pytest
from test_calibration import CLIENT, _fake_replay, client_record

from spica_pipeline.config import SmartSearchConfig
from spica_pipeline.errors import ConfigError
from spica_pipeline.fidelity import calibration as cal
from spica_pipeline.fidelity import profiles as loader

ROOT = Path(__file__).resolve().parent.parent


def with_fixed(main, fixed):
    return {**main, cal.FIXED_LENGTHS: fixed}


def sglang_records(silicon_ttft=300.0, client_ttft=100.0):
    rows = []
    for i in range(6):
        r = client_record(i, ttft_client=client_ttft, silicon_ttft=silicon_ttft)
        r["backend"], r["id"] = "sglang", f"s{i}"
        rows.append(r)
    return rows


def two_client_profile():
    """Main factors 1.5 on both backends' client replays, fixed-length factors 3 fitted on SGLang rows only."""
    main = cal.fit([client_record(i) for i in range(6)] + sglang_records(client_ttft=200.0), fitted="d", source="t",
                   method=CLIENT)
    fixed = cal.fit(sglang_records(), fitted="d", source="t", method=CLIENT)
    return with_fixed(main, fixed)


def test_the_packaged_profile_is_v14_with_sglang_fixed_length_factors():
    profile, _ = loader.load_profile("auto")
    assert loader.PACKAGED.name == "replay-v15.json" and cal.CHOSEN is cal.V15 and profile is not None
    assert profile["method_name"] == "v15" and cal.fixed_length_backends(profile) == {"sglang"}
    v13, _ = loader.load_profile(str(loader.PACKAGED.with_name("replay-v13.json")))
    assert v13 is not None and profile[cal.FIXED_LENGTHS] == v13[cal.FIXED_LENGTHS]  # round 16 kept them
    fixed = profile[cal.FIXED_LENGTHS]
    # every calibration row of AIC's SGLang runner, replayed with fixed lengths (the rows the fixed factors saw)
    replayed = json.loads((ROOT / "bench/results/round14/fidelity_round15_cal_aic_sglang_fixed.json").read_text())
    lockstep = {r["id"] for r in replayed["records"]}
    assert len(lockstep) == 108 and {r["benchmark_client"] for r in replayed["records"]} == {"aic"}
    assert not lockstep & set(profile["rows_used"])  # the main factors never saw that lockstep client
    assert fixed["rows_used"] and set(fixed["rows_used"]) <= lockstep
    assert "round 15" in profile["provenance"]["round15_choice"] and "sglang" in profile["provenance"]["fixed_lengths"]
    assert "round 16" in profile["provenance"]["round16_choice"]
    v12, _ = loader.load_profile(str(loader.PACKAGED.with_name("replay-v12.json")))
    assert v12 is not None and cal.fixed_length_backends(v12) == frozenset()


def test_for_client_picks_the_fixed_length_factors_only_where_they_were_fitted():
    p = two_client_profile()
    assert cal.fixed_length_backends(p) == {"sglang"}
    assert cal.for_client(p, "fixed", "sglang") is p[cal.FIXED_LENGTHS]
    assert cal.for_client(p, "fixed", "vllm") is p  # vLLM's fixed-length clients drift apart: spread replay, main
    assert cal.for_client(p, "spread", "sglang") is p and cal.for_client(p, None, "sglang") is p
    assert cal.uses_fixed_lengths(p, "fixed", "sglang") and not cal.uses_fixed_lengths(p, "fixed", "vllm")
    plain = {k: v for k, v in p.items() if k != cal.FIXED_LENGTHS}
    assert cal.for_client(plain, "fixed", "sglang") is plain


def test_a_bad_fixed_length_entry_names_itself(tmp_path):
    p = two_client_profile()
    bad = with_fixed(p, {**p[cal.FIXED_LENGTHS], "slices": {"x": {"factor": -1, "band": [0, 1]}}})
    with pytest.raises(cal.ProfileError, match=f"^{cal.FIXED_LENGTHS}: slices.x.factor"):
        cal.validate(bad)
    with pytest.raises(cal.ProfileError, match="without a fixed_lengths of its own"):
        cal.validate(with_fixed(p, p))
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ConfigError, match=f"{path} is not a valid calibration profile: {cal.FIXED_LENGTHS}"):
        loader.load_profile(str(path))


def config(**evaluation):
    return {"search_space": {"model_name": "Qwen/Qwen3-32B", "hardware_sku": "h200_sxm", "gpu_budget": 8,
                             "backend": ["sglang"]},
            "workload": {"isl": 1024, "osl": 128, "concurrency": 16, "num_request_ratio": 4},
            "goal": {"target": "throughput"}, "evaluation": evaluation}


@pytest.mark.parametrize("workload, why", [
    ({"trace_path": "t.jsonl"}, "needs a synthetic workload"),
    ({"isl": 1024, "osl": 128, "concurrency": 16, "num_request_ratio": 4, "osl_jitter": 0.1}, "without isl_jitter"),
])
def test_fixed_client_lengths_need_a_fixed_length_synthetic_workload(workload, why):
    with pytest.raises(ValueError, match=why):
        SmartSearchConfig.from_dict({**config(client_lengths="fixed"), "workload": workload})
    with pytest.raises(ValueError, match="client_lengths"):
        SmartSearchConfig.from_dict(config(client_lengths="lockstep"))


def test_the_sweep_context_carries_fixed_client_lengths_only_when_set():
    from spica_pipeline.sweep import evaluation_context

    spread = evaluation_context(SmartSearchConfig.from_dict(config()), None)
    assert "client_lengths" not in spread  # every other sweep keeps its spec hashes
    fixed = evaluation_context(SmartSearchConfig.from_dict(config(client_lengths="fixed")), None)
    assert fixed["client_lengths"] == "fixed" and fixed["calibration"] == spread["calibration"]
    with pytest.raises(ValueError, match="with evaluation.calibration 'none' there are none"):
        SmartSearchConfig.from_dict(config(client_lengths="fixed", calibration="none"))
    v12 = str(loader.PACKAGED.with_name("replay-v12.json"))
    with pytest.raises(ConfigError, match="replay-v12.json' has none"):
        evaluation_context(SmartSearchConfig.from_dict(config(client_lengths="fixed", calibration=v12)), None)


@pytest.mark.parametrize("backend, replay, factor", [("sglang", "synthetic", 3.0), ("vllm", "trace", 1.5)])
def test_a_fixed_length_sweep_replays_sglangs_client_in_lockstep_and_corrects_it_with_its_factors(
        monkeypatch, tmp_path, backend, replay, factor):
    from test_deploy import agg_sample
    from test_replay import THROUGHPUT

    from spica_pipeline.evaluate.evaluator import EvalRequest
    from spica_pipeline.evaluate.replay import ReplayEvaluator

    f = _fake_replay(monkeypatch, tmp_path, [200.0, 50.0])  # the client replay first, then the sweep's
    path = tmp_path / "v.json"
    path.write_text(json.dumps(two_client_profile()))
    wl = {"isl": 100, "osl": 10, "concurrency": 2, "num_request_ratio": 8}
    context = {"calibration": {"setting": str(path)}, "client_lengths": "fixed"}
    out = ReplayEvaluator(cache_dir=str(tmp_path)).evaluate(EvalRequest(agg_sample(backend=backend), wl, THROUGHPUT,
                                                                        context))
    assert out.status == "feasible", out.reason
    assert f.calls[0][0] == replay  # fixed lengths: a plain synthetic replay; the 1/9 spread needs a trace
    spread = out.derived["benchmark_client"]["isl_jitter"]
    assert (spread is None) == (backend == "sglang")
    assert out.report["calibrated_mean_ttft_ms"] == pytest.approx(200.0 * factor)


def test_the_report_states_a_fixed_length_client():
    from spica_pipeline.sweep import workload_summary

    assert "client_lengths" not in workload_summary(SmartSearchConfig.from_dict(config()))
    assert workload_summary(SmartSearchConfig.from_dict(config(client_lengths="fixed")))["client_lengths"] == "fixed"


def test_validation_checks_the_profile_and_says_which_backends_fixed_lengths_change():
    from spica_pipeline.sweep import check_calibration, check_workload

    assert check_calibration(SmartSearchConfig.from_dict(config(client_lengths="fixed"))) == []  # sglang only
    both = config(client_lengths="fixed")
    both["search_space"]["backend"] = ["sglang", "vllm"]
    (warning,) = check_workload(SmartSearchConfig.from_dict(both))
    assert warning.startswith("evaluation.client_lengths 'fixed' changes nothing for backend vllm")
    v12 = str(loader.PACKAGED.with_name("replay-v12.json"))
    with pytest.raises(ConfigError, match="replay-v12.json' has none"):
        check_workload(SmartSearchConfig.from_dict(config(client_lengths="fixed", calibration=v12)))


def test_a_fixed_length_sweep_does_not_cite_the_held_out_check_for_the_factors_it_never_measured():
    spread = loader.heldout_check("auto")
    fixed = loader.heldout_check("auto", client_lengths="fixed")
    assert spread is not None and fixed is not None and set(spread["by_backend"]) == {"sglang", "vllm"}
    assert set(fixed["by_backend"]) == {"vllm"} and fixed["all"] == spread["all"]  # sglang: not measured
    from spica_pipeline.report.accuracy import report_lines

    text = "\n".join(report_lines(fixed, ["sglang"], calibrated=True))
    assert "| sglang | 0 | not measured | not measured |" in text
    assert "Not measured: sglang: ranked with the profile's fixed-length factors" in text
