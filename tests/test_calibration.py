"""Calibration profiles: the fit (calibration split only), validation, lookup, bands, and bad files."""

import json
import math
import subprocess
import sys

import pytest

from spica_pipeline.errors import ConfigError
from spica_pipeline.resources import calibration as loader
from spica_pipeline.search import calibration as cal


def record(i, system="h200_sxm", backend="vllm", c=8, ttft_ratio=2.0, tpot_ratio=0.5, split="calibration"):
    return {"id": f"r{i}", "split": split, "system": system, "backend": backend, "concurrency": c,
            "shape": {"agg": {"workers": 1}}, "ours": {"ttft": 100.0, "tpot": 10.0},
            "silicon": {"ttft": 100.0 * ttft_ratio * (1 + 0.01 * (i % 5)), "tpot": 10.0 * tpot_ratio}}


def profile(records=None):
    return cal.fit(records or [record(i) for i in range(10)], fitted="2026-12-04", source="test")


def test_fit_recovers_a_slice_factor_and_records_provenance():
    p = profile()
    s = p["slices"]["h200_sxm/vllm/ttft"]
    assert s["rows"] == 10 and s["factor"] == pytest.approx(2.04, rel=0.02)
    assert p["slices"]["h200_sxm/vllm/tpot"]["factor"] == pytest.approx(0.5, rel=0.01)
    assert p["rows_used"] == sorted(f"r{i}" for i in range(10)) and p["fitted"] == "2026-12-04"
    assert p["method"] == cal.METHOD and cal.validate(json.loads(json.dumps(p)))


def test_fit_refuses_held_out_rows():
    with pytest.raises(cal.ProfileError, match="held-out"):
        profile([record(1), record(2, split="heldout")])


def test_load_slope_follows_concurrency():
    rows = [record(i, c=c, ttft_ratio=1.0 + math.log2(c) * 0.5) for i, c in enumerate([1, 2, 4, 8, 16, 32, 64] * 2)]
    p = profile(rows)
    assert p["load_slope"]["ttft"] > 0.1 and abs(p["load_slope"]["tpot"]) < 1e-9
    lo = cal.lookup(p, "h200_sxm", "vllm", "ttft", 1)["factor"]
    hi = cal.lookup(p, "h200_sxm", "vllm", "ttft", 64)["factor"]
    assert hi > 2 * lo


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
    from spica_pipeline.search.silicon import CALIBRATION_MODELS  # noqa: F401  (the rule the fit enforces)

    p, digest = loader.load_profile("auto")
    assert p["format"] == cal.PROFILE_FORMAT and digest and p["rows_used"]
    assert set(p["phase"]) == set(cal.PHASES)


@pytest.mark.parametrize("content,why", [
    (None, "cannot read"),
    ("{not json", "not a valid calibration profile"),
    (json.dumps({"format": 99}), "not a valid calibration profile"),
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
    from spica_pipeline.report.deploy import deployment_dict
    from spica_pipeline.report.markdown import _bands
    from spica_pipeline.report.tables import candidates_frame
    from spica_pipeline.search.scoring import Candidate

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
