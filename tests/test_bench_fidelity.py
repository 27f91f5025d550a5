"""bench/bench_fidelity.py and bench/compare_profiles.py: replaying silicon rows (JSON shape, finite errors, no
thresholds), and the stored replays reproducing the stored results and the packaged profile."""

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import bench_fidelity  # noqa: E402
import compare_profiles  # noqa: E402
from fidelity import files, rows, scores  # noqa: E402

RESULTS = ROOT / "bench" / "results"
REPLAYS = {split: RESULTS / f"fidelity_replays_{split}.json" for split in ("calibration", "heldout")}
ROWS = (
    "qwen_qwen3_32b_qwen_qwen3_32b_h100_sxm_vllm_agg_1024x128_c8_tp2_epnone_1",
    "qwen_qwen3_235b_a22b_fp8_qwen_qwen3_235b_a22b_fp8_h200_sxm_sglang_agg_1000x100_c3_tp2_epnone_2",
    "2026_04_06_llama_3_1_70b_b200_sxm_vllm_fp8_agg_1024x1024_c4_tp1_ep1_805",
)
TIMING = ("row_seconds", "replay_seconds", "sweep_seconds", "aic_seconds")


def _replay_three_rows(tmp_path, *extra: str) -> dict:
    out = tmp_path / "fidelity.json"
    code = bench_fidelity.main(["--ids", ",".join(ROWS), "--json", str(out), "--cache-dir", str(tmp_path / "c"), *extra])
    assert code == 0
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def three_rows(tmp_path_factory) -> dict:
    return _replay_three_rows(tmp_path_factory.mktemp("one"))


@pytest.mark.integration
def test_three_silicon_rows(three_rows):
    data = three_rows
    assert set(data["splits"]) == {"calibration", "heldout", "all"}
    cal = data["splits"]["calibration"]
    assert cal["rows"] > cal["expressible"] > 0
    assert cal["evaluated"] == 3 and data["splits"]["heldout"]["evaluated"] == 0
    for side in ("ours", "sweep", "calibrated", "aic"):
        for metric in ("ttft", "tpot"):
            stats = cal[side][metric]
            assert all(math.isfinite(stats[k]) for k in ("mdape", "p90", "bias")), (side, metric, stats)
    assert {r["id"] for r in data["records"]} == set(ROWS)
    for r in data["records"]:  # what a full run costs, per row and per part
        assert all(isinstance(r[k], float) and r[k] >= 0 for k in TIMING), r
    assert cal["outside_fit"]["rows"] == 2  # the packaged profile was fitted on the first row, not the others


@pytest.mark.integration
def test_two_workers_give_the_records_of_one(three_rows, tmp_path):
    """--workers 2 (spawned processes, a fresh cache both build into): the same records, in the selection's order,
    as the rows replayed in this process; only the timing fields differ."""
    parallel = _replay_three_rows(tmp_path, "--workers", "2")
    assert parallel["workers"] == 2 and three_rows["workers"] == 1

    def untimed(data: dict) -> list[dict]:
        return [{k: v for k, v in r.items() if k not in TIMING} for r in data["records"]]

    assert untimed(parallel) == untimed(three_rows)
    assert parallel["splits"] == three_rows["splits"]


@pytest.mark.integration
def test_rows_are_replayed_as_their_benchmark_client_drew_lengths(three_rows):
    """An InferenceMAX row draws ISL/OSL over [0.8 L, L]; AIC's runners' rows keep their nominal lengths (the client
    replay then spreads them as a sweep does); every record says how its client replay drew lengths."""
    by_id = {r["id"]: r for r in three_rows["records"]}
    imx = by_id[ROWS[2]]
    assert imx["benchmark_client"] == "inferencemax"
    assert imx["replayed_lengths"]["isl"] == imx["replayed_lengths"]["osl"] == 922
    for rid in ROWS[:2]:
        assert by_id[rid]["benchmark_client"] == "aic" and "replayed_lengths" not in by_id[rid]
    assert {r["client_lengths"] for r in three_rows["records"]} == {"spread"}


@pytest.mark.parametrize("split", ["calibration", "heldout"])
def test_the_stored_replays_reproduce_the_stored_results(tmp_path, split):
    """The calibration split's and the held-out check's numbers come from the replays file with the packaged
    profile (no replay here)."""
    out = tmp_path / "r.json"
    assert bench_fidelity.main(["--split", split, "--from-json", str(REPLAYS[split]), "--json", str(out)]) == 0
    stored = json.loads((RESULTS / f"fidelity_{split}.json").read_text())
    again = json.loads(out.read_text())
    assert again["splits"] == stored["splits"] and "records" not in again
    assert stored["command"].startswith(f"bench/bench_fidelity.py --split {split} --from-json")


def test_the_replays_files_hold_each_split_whole_and_compact():
    for split, path in REPLAYS.items():
        data = json.loads(path.read_text())
        assert data["command"].startswith("bench/bench_fidelity.py") and data["date"] and data["split"] == split
        assert {r["split"] for r in data["records"]} == {split}
        assert all(set(r) <= {*files.COMPACT_KEYS, "from"} for r in data["records"])
        assert all(0 <= r["from"] < len(data["sources"]) for r in data["records"])
    calibration = json.loads(REPLAYS["calibration"].read_text())["records"]
    assert len(calibration) == 1158 and sum(r["status"] == "feasible" for r in calibration) == 1135
    fixed = {(r["benchmark_client"], r["backend"]) for r in calibration if r["client_lengths"] == "fixed"}
    assert fixed == {("aic", "sglang")}  # AIC's SGLang runner, replayed with exactly its lengths


PACKAGED = ROOT / "spica_pipeline/fidelity/data/replay-v16.json"
# the previous packaged profile, as git history keeps it
V15 = "cd4ddf5:spica_pipeline/fidelity/data/replay-v15.json"


def test_fit_calibration_writes_the_packaged_numbers_and_scores_the_other_rows(tmp_path):
    profile_path, out = tmp_path / "p.json", tmp_path / "fit.json"
    assert bench_fidelity.main(["--split", "calibration", "--from-json", str(REPLAYS["calibration"]),
                                "--fit-calibration", str(profile_path), "--json", str(out)]) == 0
    fitted = json.loads(profile_path.read_text())
    packaged = json.loads(PACKAGED.read_text())
    assert fitted["slices"] == packaged["slices"] and fitted["own_bands"] == packaged["own_bands"]
    assert fitted["provenance"]["split"] == "calibration" and len(fitted["rows_used"]) == 431
    result = json.loads(out.read_text())
    cal = result["splits"]["calibration"]
    assert cal["outside_fit"]["rows"] == 664 and cal["outside_fit"]["tpot"]["score"] < cal["outside_fit"]["ttft"]["score"]
    assert cal["decisions"]["by_prediction"]["calibrated"]["questions"] > 0 and set(cal["own"]) >= {"1", "3", "10"}


def test_a_fit_refuses_held_out_rows_and_a_missing_file_is_one_line(tmp_path, capsys):
    held = json.loads(REPLAYS["heldout"].read_text())["records"][:5]
    with pytest.raises(SystemExit, match="held-out"):
        scores.outside_fit(held, json.loads(PACKAGED.read_text()))
    with pytest.raises(SystemExit, match="held-out"):
        scores.leave_one_architecture_out(held, lambda train: {})
    assert bench_fidelity.main(["--from-json", str(tmp_path / "missing.json"), "--split", "heldout"]) == 2
    assert "missing.json" in capsys.readouterr().err


def test_compact_keeps_what_fitting_reads_and_the_source(tmp_path):
    source = tmp_path / "run.json"
    record = {"id": "a", "split": "calibration", "model": "m", "system": "s", "backend": "vllm", "status": "feasible",
              "ours": {"ttft": 1.0, "tpot": 2.0}, "sweep": {"ttft": 3.0, "tpot": 4.0, "window_rule": "x"},
              "silicon": {"ttft": 5.0, "tpot": 6.0}, "row_seconds": 9.0, "replayed_lengths": {"isl": 1}}
    source.write_text(json.dumps({"command": "bench/bench_fidelity.py --fixed-lengths", "records": [record]}))
    (read,) = files.records_by_id(str(source)).values()
    assert read["client_lengths"] == "fixed"  # a --fixed-lengths run whose records do not say
    small = files.compact(read, 0)
    assert small["sweep"] == {"ttft": 3.0, "tpot": 4.0} and "row_seconds" not in small and small["from"] == 0
    out = tmp_path / "replays.json"
    files.write_replays(str(out), [small], [str(source)], "cmd", "calibration")
    data = json.loads(out.read_text())
    assert data["records"] == [small] and data["sources"][0]["command"] == "bench/bench_fidelity.py --fixed-lengths"


def test_a_file_is_read_from_git_history():
    data = files.read_json(V15)
    assert data["method_name"] == "v15"
    with pytest.raises(OSError, match="no-such-file"):
        files.read_json("HEAD:no-such-file.json")


def test_compare_profiles_scores_each_on_the_rows_outside_every_fit(tmp_path, capsys):
    out = tmp_path / "c.json"
    assert compare_profiles.main([str(PACKAGED), V15, "--json", str(out)]) == 0
    result = json.loads(out.read_text())["profiles"]
    v16, v15 = result.values()
    assert v16["rows"] == v15["rows"] == 664 and v15["ttft"]["score"] == 1.7307  # fitted on the same rows
    assert v16["profile"] == "transfer" and v15["profile"] == "v15"
    assert compare_profiles.main([str(tmp_path / "missing.json")]) == 2


def test_a_scripts_receive_interval_adds_the_mean_polling_wait_to_ttft():
    """(N - 1) / 2 decode steps of the replay's own mean TPOT; the replayed TTFT kept beside it."""
    from spica_pipeline.fidelity import silicon

    rec: dict = {}
    report = {"mean_ttft_ms": 100.0, "mean_tpot_ms": 10.0}
    polled = silicon.ScriptFlags(32768, 128, 0.82, 30, "dsr1_fp8_b200.sh TP8")
    assert rows.with_recv_wait(rec, "ours", report, polled) == {"ttft": 245.0, "tpot": 10.0}
    assert rec == {"recv_wait_ms": {"ours": 145.0}, "replayed_ttft": {"ours": 100.0}}
    every_step = silicon.ScriptFlags(32768, 512, 0.82, 1, "dsr1_fp8_h200.sh TP8")
    for flags in (every_step, None):
        kept: dict = {}
        assert rows.with_recv_wait(kept, "ours", report, flags) == {"ttft": 100.0, "tpot": 10.0}
        assert kept == {}


def test_the_fit_rows_are_a_prefix_in_the_bench_s_row_order():
    records = [{"id": f"row{i}", "split": "calibration", "sweep": {"ttft": 1.0}, "window_rule": "benchmark_client"}
               for i in range(600)]
    records.append({**records[0], "id": "held", "split": "heldout"})
    picked = scores.fit_records(records)
    assert len(picked) == scores.FIT_ROWS and all(r["split"] == "calibration" for r in picked)
    order = sorted(rows.row_order(r["id"]) for r in records if r["split"] == "calibration")
    assert max(rows.row_order(r["id"]) for r in picked) == order[scores.FIT_ROWS - 1]
