"""The recorded held-out check of a calibration profile: found by the profile file's digest, shown per
backend in report.md and the deploy records, and absent (said so) for a file nobody measured."""

import json
import shutil
import sys
from pathlib import Path

import yaml

from spica_pipeline.fidelity import profile as rc
from spica_pipeline.report import merge_candidates, write_outputs
from spica_pipeline.report.accuracy import UNRELIABLE_MDAPE, backend_check, header_line, report_lines
from tests.test_report import GOAL, WORKLOAD, make_ledger

ROOT = Path(__file__).resolve().parent.parent


def test_the_packaged_default_has_a_recorded_heldout_check():
    """A new default profile must be measured once on the held-out models before it ships
    (bench/record_heldout_check.py), so the report can cite its errors."""
    check = rc.heldout_check("auto")
    assert check is not None and check["profile"] == "spica_pipeline/fidelity/data/replay-v16.json"
    assert check["rows"] > 0 and check["models"] and check["source"] == "bench/results/fidelity_heldout.json"
    assert Path(ROOT / check["source"]).is_file()
    assert {"vllm", "sglang"} <= set(check["by_backend"])
    for phase in ("ttft", "tpot"):
        assert 0.0 <= check["all"][phase]["mdape"] < 10.0
    raw = rc.heldout_check("none")
    assert raw is not None and raw["profile"] == rc.RAW


def test_an_edited_or_user_profile_has_no_check(tmp_path):
    copy = tmp_path / "mine.json"
    shutil.copy(rc.PACKAGED, copy)
    assert rc.heldout_check(str(copy)) is not None  # same bytes: the same measurement applies
    doc = json.loads(copy.read_text())
    doc["source"] = f"{doc.get('source')} (edited)"
    copy.write_text(json.dumps(doc))
    assert rc.heldout_check(str(copy)) is None
    assert rc.heldout_check("auto", checks=tmp_path / "missing.json") is None


CHECK = {"profile": "spica_pipeline/fidelity/data/replay-vX.json", "rows": 30, "models": ["org/Held-Out"],
         "source": "bench/results/x.json", "measured_utc": "2026-12-05T05:21:58Z",
         "by_backend": {"vllm": {"rows": 20, "ttft": {"mdape": 0.29, "p90": 1.0, "bias": -0.09, "n": 20},
                                 "tpot": {"mdape": 0.12, "p90": 0.4, "bias": 0.01, "n": 20},
                                 "aic": {"ttft": {"mdape": 1.0}, "tpot": {"mdape": 0.13}}},
                        "sglang": {"rows": 10, "ttft": {"mdape": 1.94, "p90": 7.6, "bias": 1.9, "n": 10},
                                   "tpot": {"mdape": 0.23, "p90": 0.5, "bias": 0.0, "n": 10}}}}


def test_report_lines_flag_a_backend_off_by_more_than_the_bar():
    text = "\n".join(report_lines(CHECK, ["sglang", "vllm", "sglang"], calibrated=True,
                                   models=["Qwen/Qwen3-32B", "zhipuai/GLM-5"]))
    assert "`Qwen/Qwen3-32B` is one of the calibration models" in text
    assert "`zhipuai/GLM-5` is not a calibration model" in text
    assert "`replay-vX.json`" in text and "bench/results/x.json" in text and "2026-12-05T05:21:58Z" in text
    assert "| vllm | 20 | 29 % (P90 100 %, bias -9 %) | 12 % (P90 40 %, bias +1 %) | 100 % / 13 % |" in text
    assert "sglang TTFT was off by a median 194 %" in text
    assert "vllm TTFT was off" not in text and "TPOT was off" not in text
    assert UNRELIABLE_MDAPE == 0.5
    none = "\n".join(report_lines(None, ["vllm"], calibrated=True))
    assert "No held-out check is recorded" in none


def test_report_lines_say_how_often_the_bands_held():
    check = {**CHECK, "band_coverage": {"ttft": 0.7116, "tpot": 0.5895, "goal_e2e": 0.607}}
    text = "\n".join(report_lines(check, ["vllm"], calibrated=True))
    assert "On all 30 of those rows, every backend, the P10–P90 bands (nominal 80 %)" in text
    assert ("held the measured TTFT on 71 %, TPOT on 59 %, the goal's end-to-end latency on 61 %: for a model "
            "outside the calibration split, read a band as narrower") in text
    held = "\n".join(report_lines({**CHECK, "band_coverage": {"ttft": 0.82, "tpot": 0.79}}, ["vllm"], calibrated=True))
    assert "held the measured TTFT on 82 %, TPOT on 79 %." in held and "narrower" not in held
    odd = "\n".join(report_lines({**CHECK, "band_coverage": {"ttft": 0.82, "tpot": None}}, ["vllm"], calibrated=True))
    assert "held the measured TTFT on 82 %." in odd  # a value that is not a number is left out, not compared
    assert "held the measured" not in "\n".join(report_lines(CHECK, ["vllm"], calibrated=True))
    assert "held the measured" not in "\n".join(report_lines(check, ["vllm"], calibrated=False))


def test_backend_check_and_header_line():
    assert backend_check(CHECK, "trtllm") is None and backend_check(None, "vllm") is None
    found = backend_check(CHECK, "sglang")
    assert found["ttft"]["mdape"] == 1.94 and found["source"] == "bench/results/x.json"
    line = header_line(CHECK, "sglang")
    assert line.startswith("# held-out check of these numbers (unreliable): sglang TTFT median error 194 %")
    assert header_line(CHECK, "vllm").startswith("# held-out check of these numbers: vllm TTFT median error 29 %")


def test_write_outputs_carries_the_check_into_report_and_deploy(tmp_path):
    ledger = make_ledger(seed=5, n=45)
    m = merge_candidates(ledger, "throughput_per_gpu", gpu_budget=16)
    write_outputs(tmp_path, ledger, m, goal_summary=GOAL, workload_summary=WORKLOAD, timings={}, top_n=1,
                  heldout_check=CHECK)
    report = (tmp_path / "report.md").read_text()
    assert "## Accuracy on unseen models (held-out check)" in report and "| vllm | 20 |" in report
    record = yaml.safe_load((tmp_path / "deploy" / "1" / "simulation_record.yaml").read_text())
    assert record["heldout_check"]["backend"] == "vllm" and record["heldout_check"]["ttft"]["mdape"] == 0.29
    dgd = (tmp_path / "deploy" / "1" / "dgd.yaml").read_text()
    assert "# held-out check of these numbers: vllm TTFT median error 29 %" in dgd


def test_record_heldout_check_writes_an_entry_per_profile(tmp_path):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import record_heldout_check as rec
    finally:
        sys.path.remove(str(ROOT / "bench"))
    result = ROOT / "bench" / "results" / "fidelity_heldout.json"
    out = tmp_path / "checks.json"
    assert rec.main([str(result), "--out", str(out)]) == 0
    checks = json.loads(out.read_text())["checks"]
    _, digest = rc.load_profile(str(rc.PACKAGED))
    assert set(checks) == {digest, rc.RAW}
    packaged = json.loads(rc.HELDOUT_CHECKS.read_text())["checks"]
    assert checks == packaged  # the shipped checks are what the script writes from that file
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"partial": True, "splits": {}}))
    assert rec.main([str(partial), "--out", str(out)]) == 2
