"""evaluation.client_lengths: a benchmark client that sends exactly the workload's lengths is replayed so, and
corrected by the profile's fixed-length factors, where the profile has them (SGLang: its fixed-length clients stay
in lockstep); elsewhere the spread replay and the main factors."""

import json

import pytest
from calibration_fakes import fake_replay
from test_calibration_profile import two_client_profile

from spica_pipeline.config import SmartSearchConfig
from spica_pipeline.errors import ConfigError
from spica_pipeline.fidelity import profile as pf


def without_fixed_lengths(tmp_path):
    """A copy of the packaged profile without fixed-length factors."""
    p = json.loads(pf.PACKAGED.read_text())
    del p[pf.FIXED_LENGTHS]
    path = tmp_path / "spread-only.json"
    path.write_text(json.dumps(p))
    return str(path)


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


def test_the_sweep_context_carries_fixed_client_lengths_only_when_set(tmp_path):
    from spica_pipeline.sweep import evaluation_context

    spread = evaluation_context(SmartSearchConfig.from_dict(config()), None)
    assert "client_lengths" not in spread  # every other sweep keeps its spec hashes
    fixed = evaluation_context(SmartSearchConfig.from_dict(config(client_lengths="fixed")), None)
    assert fixed["client_lengths"] == "fixed" and fixed["calibration"] == spread["calibration"]
    with pytest.raises(ValueError, match="with evaluation.calibration 'none' there are none"):
        SmartSearchConfig.from_dict(config(client_lengths="fixed", calibration="none"))
    spread_only = without_fixed_lengths(tmp_path)
    with pytest.raises(ConfigError, match="spread-only.json' has none"):
        evaluation_context(SmartSearchConfig.from_dict(config(client_lengths="fixed", calibration=spread_only)), None)


@pytest.mark.parametrize("backend, replay, factor", [("sglang", "synthetic", 3.0), ("vllm", "trace", 1.5)])
def test_a_fixed_length_sweep_replays_sglangs_client_in_lockstep_and_corrects_it_with_its_factors(
        monkeypatch, tmp_path, backend, replay, factor):
    from test_deploy import agg_candidate
    from test_replay import THROUGHPUT

    from spica_pipeline.evaluate.evaluator import EvalRequest
    from spica_pipeline.evaluate.replay import ReplayEvaluator

    f = fake_replay(monkeypatch, tmp_path, [200.0, 50.0])  # the client replay first, then the sweep's
    path = tmp_path / "v.json"
    path.write_text(json.dumps(two_client_profile()))
    wl = {"isl": 100, "osl": 10, "concurrency": 2, "num_request_ratio": 8}
    context = {"calibration": {"setting": str(path)}, "client_lengths": "fixed"}
    out = ReplayEvaluator(cache_dir=str(tmp_path)).evaluate(EvalRequest(agg_candidate(backend=backend), wl, THROUGHPUT,
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


def test_validation_checks_the_profile_and_says_which_backends_fixed_lengths_change(tmp_path):
    from spica_pipeline.sweep import check_calibration, check_workload

    assert check_calibration(SmartSearchConfig.from_dict(config(client_lengths="fixed"))) == []  # sglang only
    both = config(client_lengths="fixed")
    both["search_space"]["backend"] = ["sglang", "vllm"]
    (warning,) = check_workload(SmartSearchConfig.from_dict(both))
    assert warning.startswith("evaluation.client_lengths 'fixed' changes nothing for backend vllm")
    spread_only = without_fixed_lengths(tmp_path)
    with pytest.raises(ConfigError, match="spread-only.json' has none"):
        check_workload(SmartSearchConfig.from_dict(config(client_lengths="fixed", calibration=spread_only)))


def test_a_fixed_length_sweep_does_not_cite_the_held_out_check_for_the_factors_it_never_measured():
    spread = pf.heldout_check("auto")
    fixed = pf.heldout_check("auto", client_lengths="fixed")
    assert spread is not None and fixed is not None and set(spread["by_backend"]) == {"sglang", "vllm"}
    assert set(fixed["by_backend"]) == {"vllm"} and fixed["all"] == spread["all"]  # sglang: not measured
    from spica_pipeline.report.accuracy import report_lines

    text = "\n".join(report_lines(fixed, ["sglang"], calibrated=True))
    assert "| sglang | 0 | not measured | not measured |" in text
    assert "Not measured: sglang: ranked with the profile's fixed-length factors" in text
