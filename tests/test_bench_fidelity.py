"""bench/bench_fidelity.py replays real silicon rows: JSON shape and finite errors (no thresholds)."""

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

pytestmark = pytest.mark.integration

ROWS = (
    "qwen_qwen3_32b_qwen_qwen3_32b_h100_sxm_vllm_agg_1024x128_c8_tp2_epnone_1",
    "qwen_qwen3_235b_a22b_fp8_qwen_qwen3_235b_a22b_fp8_h200_sxm_sglang_agg_1000x100_c3_tp2_epnone_2",
    "2026_04_06_llama_3_1_70b_b200_sxm_vllm_fp8_agg_1024x1024_c4_tp1_ep1_805",
)


TIMING = ("row_seconds", "replay_seconds", "sweep_seconds", "aic_seconds")


def _replay_three_rows(tmp_path, *extra: str) -> dict:
    import bench_fidelity

    out = tmp_path / "fidelity.json"
    code = bench_fidelity.main(["--ids", ",".join(ROWS), "--json", str(out), "--cache-dir", str(tmp_path / "c"), *extra])
    assert code == 0
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def three_rows(tmp_path_factory) -> dict:
    return _replay_three_rows(tmp_path_factory.mktemp("one"))


def test_three_silicon_rows(three_rows):
    data = three_rows
    assert set(data["splits"]) == {"calibration", "heldout", "all"}
    cal = data["splits"]["calibration"]
    assert cal["rows"] > cal["expressible"] > 0
    assert cal["evaluated"] == 3 and data["splits"]["heldout"]["evaluated"] == 0
    for side in ("ours", "aic"):
        for metric in ("ttft", "tpot"):
            stats = cal[side][metric]
            assert set(stats) >= {"mdape", "p90", "bias"}
            assert all(math.isfinite(stats[k]) for k in ("mdape", "p90", "bias")), (side, metric, stats)
    assert {r["id"] for r in data["records"]} == set(ROWS)
    for r in data["records"]:  # what a full run costs, per row and per part
        assert all(isinstance(r[k], float) and r[k] >= 0 for k in TIMING), r


def test_two_workers_give_the_records_of_one(three_rows, tmp_path):
    """--workers 2 (spawned processes, a fresh cache both build into): the same records, in the selection's
    order, as the rows replayed in this process; only the timing fields differ."""
    parallel = _replay_three_rows(tmp_path, "--workers", "2")
    assert parallel["workers"] == 2 and three_rows["workers"] == 1

    def untimed(data: dict) -> list[dict]:
        return [{k: v for k, v in r.items() if k not in TIMING} for r in data["records"]]

    assert untimed(parallel) == untimed(three_rows)
    assert parallel["splits"] == three_rows["splits"]


RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"
PROFILES = Path(__file__).resolve().parents[1] / "spica_pipeline" / "calibration"


def test_recalibrate_reproduces_a_stored_result_without_replaying(tmp_path):
    """--recalibrate: the calibrated numbers of a stored result recomputed from its records."""
    import bench_fidelity

    stored = json.loads((RESULTS / "fidelity_heldout.json").read_text())  # written with replay-v2.json
    small = tmp_path / "small.json"
    small.write_text(json.dumps({"records": stored["records"][:12]}))
    out = tmp_path / "re.json"
    assert bench_fidelity.main(["--recalibrate", str(small), "--profile", str(PROFILES / "replay-v2.json"),
                                "--json", str(out)]) == 0
    again = {r["id"]: r for r in json.loads(out.read_text())["records"]}
    assert len(again) == 12 and json.loads(out.read_text())["splits"].keys() == {"heldout"}
    for r in stored["records"][:12]:
        for metric in ("ttft", "tpot"):
            assert again[r["id"]]["calibrated"][metric] == pytest.approx(r["calibrated"][metric], rel=1e-9)
    # calibration none: no stale calibrated values from the file's profile
    assert bench_fidelity.main(["--recalibrate", str(small), "--profile", "none", "--json", str(out)]) == 0
    assert not any("calibrated" in r for r in json.loads(out.read_text())["records"])


def test_compare_methods_scores_every_variant_on_calibration_rows(tmp_path):
    import bench_fidelity

    from spica_pipeline.fidelity import calibration

    records = [r for r in json.loads((RESULTS / "fidelity_calibration.json").read_text())["records"]
               if (r.get("sweep") or {}).get("ttft")][:80]
    result = bench_fidelity.compare_methods(records)
    assert len(result["variants"]) == len(calibration.phase_options(calibration.REPLAYS))
    assert set(result["chosen"]) == {"ttft", "tpot"}
    assert {v["variant"] for v in result["variants"]} >= set(result["chosen"].values())
    assert all(math.isfinite(v[p]["score"]) for v in result["variants"] for p in ("ttft", "tpot"))
    assert all(len(v["ttft"]["folds"]) == len(result["models"]) for v in result["variants"])
    with pytest.raises(SystemExit, match="held-out"):
        bench_fidelity.compare_methods([{**records[0], "split": "heldout"}, *records[1:]])


def test_the_choice_rule_needs_a_pooled_win_and_four_of_six_folds():
    import bench_fidelity

    from spica_pipeline.fidelity import calibration

    def row(option, score, folds):
        return {"variant": option.label(), "option": vars(option),
                "ttft": {"score": score, "folds": dict(zip("abcdef", folds))}}

    ref = row(calibration.PhaseMethod(0.0), 5.0, [5] * 6)
    pooled_only = row(calibration.PhaseMethod(0.5), 4.0, [1, 1, 1, 9, 9, 9])  # lower pooled, 3 folds
    consistent = row(calibration.PhaseMethod(1.0), 4.5, [4, 4, 4, 4, 6, 6])  # lower pooled, 4 folds
    assert bench_fidelity.choose([ref, pooled_only], "ttft") is ref
    assert bench_fidelity.choose([ref, pooled_only, consistent], "ttft") is consistent
    client = row(calibration.PhaseMethod(0.0, replay="client"), 3.0, [3, 3, 3, 6, 6, 6])
    assert bench_fidelity.choose([ref, client], "ttft") is ref  # the client basis must win 4 folds too
    better = row(calibration.PhaseMethod(0.0, replay="client"), 3.0, [3, 3, 3, 3, 6, 6])
    assert bench_fidelity.choose([ref, better], "ttft") is better


def test_with_four_folds_a_challenger_must_win_three():
    import bench_fidelity

    from spica_pipeline.fidelity import calibration

    def row(option, score, folds):
        return {"variant": option.label(), "option": vars(option),
                "ttft": {"score": score, "folds": dict(zip("abcd", folds))}}

    ref = row(calibration.PhaseMethod(0.0), 5.0, [5] * 4)
    two = row(calibration.PhaseMethod(0.0, replay="client"), 3.0, [1, 1, 9, 9])  # lower pooled, 2 of 4
    three = row(calibration.PhaseMethod(0.0, replay="client"), 4.0, [4, 4, 4, 9])  # lower pooled, 3 of 4
    assert bench_fidelity.choose([ref, two], "ttft") is ref
    assert bench_fidelity.choose([ref, three], "ttft") is three


def test_per_backend_and_within_comparisons_use_calibration_rows_only():
    import bench_fidelity

    records = [r for r in json.loads((RESULTS / "fidelity_calibration.json").read_text())["records"]
               if (r.get("sweep") or {}).get("ttft")]
    records = bench_fidelity.fit_records(records)[:90]
    within = bench_fidelity.compare_within(records)
    assert set(within["chosen"]) == {"ttft", "tpot"} and within["rule"] == bench_fidelity.CHOICE_RULE_V5_ROUND2
    assert all(math.isfinite(within["steps"][p][k]["score"]) for p in ("ttft", "tpot") for k in ("within", "v4"))
    with pytest.raises(SystemExit, match="held-out"):
        bench_fidelity.compare_within([{**records[0], "split": "heldout"}, *records[1:]])
    with pytest.raises(SystemExit, match="held-out"):
        bench_fidelity.compare_per_backend([{**records[0], "split": "heldout"}, *records[1:]])


def test_v4_on_the_same_replays_does_not_qualify_and_refuses_held_out_rows():
    import bench_fidelity

    records = bench_fidelity.fit_records([r for r in json.loads((RESULTS / "fidelity_calibration.json").read_text())
                                          ["records"] if (r.get("sweep") or {}).get("ttft")])[:90]
    same = bench_fidelity.compare_v4_on(records, records)
    assert not same["qualifies"] and same["steps"]["ttft"]["fold_wins"] == 0  # a tie wins nothing
    assert same["rule"] == bench_fidelity.CHOICE_RULE_V5_ROUND3
    with pytest.raises(SystemExit, match="held-out"):
        bench_fidelity.compare_v4_on([{**records[0], "split": "heldout"}, *records[1:]], records)


def _signature_record(model: str, ttft: float, tpot: float, i: int) -> dict:
    return {"id": f"{model}-{i}", "split": "calibration", "backend": "sglang", "mode": "agg", "model": model,
            "window_rule": "benchmark_client", "silicon": {"ttft": 100.0, "tpot": 10.0},
            "ours": {"ttft": ttft, "tpot": tpot}, "sweep": {"ttft": 50.0, "tpot": 10.0}}


def test_sglang_signature_needs_ttft_over_and_tpot_under_pooled_and_in_half_the_models():
    import bench_fidelity

    over_under = [_signature_record("a", 130.0, 8.0, i) for i in range(5)]
    both_over = [_signature_record("b", 130.0, 12.0, i) for i in range(5)]
    tiny = [_signature_record("c", 50.0, 8.0, i) for i in range(2)]  # under SIGNATURE_MIN_ROWS: not counted
    vllm = [{**_signature_record("d", 50.0, 12.0, i), "backend": "vllm"} for i in range(9)]  # not SGLang
    out = bench_fidelity.sglang_signature(over_under + both_over + tiny + vllm)
    assert out["by_model"]["a"]["signature"] and not out["by_model"]["b"]["signature"]
    assert out["models_counted"] == ["a", "b"] and out["models_with_signature"] == ["a"]
    assert out["pooled"]["rows"] == 12 and "d" not in out["by_model"]
    assert out["present"] and out["rule"] == bench_fidelity.SGLANG_SIGNATURE_RULE  # pooled +30 % / -20 %, 1 of 2 models
    absent = bench_fidelity.sglang_signature(both_over + tiny)
    assert not absent["present"] and absent["models_with_signature"] == []
    with pytest.raises(SystemExit, match="held-out"):
        bench_fidelity.sglang_signature([{**over_under[0], "split": "heldout"}, *over_under[1:]])


def _r9(id_, system, ttft, tpot, cal_ttft=None, silicon=(100.0, 10.0)):
    return {"id": id_, "split": "calibration", "status": "feasible", "system": system, "aic_model": "MiniMaxAI/MiniMax-M2.5", "backend": "vllm",
            "silicon": {"ttft": silicon[0], "tpot": silicon[1]}, "ours": {"ttft": ttft, "tpot": tpot},
            "calibrated": {"ttft": cal_ttft or ttft, "tpot": tpot}, "shape": {"agg": {"attention_dp": 1}}}


def test_round9_gemm_rule_needs_a_tpot_gain_and_no_ttft_loss_per_system():
    """ROUND9_GEMM_RULE per system: >= 20 rows, TPOT MdAPE -5 points, neither TTFT MdAPE +5 points."""
    import bench_fidelity as bf

    base = [_r9(f"a{i}", "b300_sxm", 100, 30) for i in range(20)] + [_r9(f"b{i}", "b200_sxm", 100, 30) for i in range(20)]
    cand = ([_r9(f"a{i}", "b300_sxm", 104, 10) for i in range(20)]  # TTFT +4 points: still adopted
            + [_r9(f"b{i}", "b200_sxm", 112, 10, cal_ttft=100) for i in range(20)])  # raw TTFT +12: not
    out = bf.compare_round9(base, cand, rows=lambda r: True, group=lambda r: r["system"])
    assert out["b300_sxm"]["adopted"] and not out["b200_sxm"]["adopted"]
    assert out["b200_sxm"]["delta_mdape"]["ours_tpot"] == pytest.approx(-2.0)
    few = bf.compare_round9(base[:19], cand[:19], rows=lambda r: True, group=lambda r: r["system"])
    assert not few["b300_sxm"]["adopted"]  # 19 rows


def test_round9_comparisons_refuse_held_out_rows():
    import bench_fidelity as bf

    rows = [_r9("a", "b300_sxm", 100, 30), {**_r9("h", "b300_sxm", 100, 30), "split": "heldout"}]
    with pytest.raises(SystemExit, match="calibration rows only"):
        bf.compare_round9(rows, rows, rows=lambda r: True, group=lambda r: r["system"])
    with pytest.raises(SystemExit, match="calibration rows only"):
        bf.compare_refit(rows, {"rows_used": []}, {"rows_used": []})


def test_rows_are_replayed_as_their_benchmark_client_drew_lengths(three_rows):
    """Round 10: the InferenceMAX row draws ISL/OSL over [0.8 L, L]; AIC's runners' rows keep their nominal lengths
    (a sweep's client replay then spreads them, round 11)."""
    by_id = {r["id"]: r for r in three_rows["records"]}
    imx = by_id[ROWS[2]]
    assert imx["benchmark_client"] == "inferencemax"
    assert imx["replayed_lengths"]["isl"] == imx["replayed_lengths"]["osl"] == 922
    for rid in ROWS[:2]:
        assert by_id[rid]["benchmark_client"] == "aic" and "replayed_lengths" not in by_id[rid]


def test_round10_comparisons_refuse_held_out_rows():
    import bench_fidelity as bf

    rows = [_r9("a", "b300_sxm", 100, 30), {**_r9("h", "b300_sxm", 100, 30), "split": "heldout"}]
    with pytest.raises(SystemExit, match="calibration rows only"):
        bf.compare_round10(rows, rows)
    with pytest.raises(SystemExit, match="calibration rows only"):
        bf.compare_refit(rows, {"rows_used": []}, {"rows_used": []}, band_tolerance=0.1)


def test_fit_skip_leaves_a_clients_rows_out_of_the_fit(tmp_path):
    """ROUND13_FIT_ROWS_RULE: --fit-skip CLIENT/BACKEND drops those rows from the profile's fit (stored records)."""
    import bench_fidelity

    stored = RESULTS / "round10" / "fidelity_round11_cal_aic.json"
    profiles = {}
    for skip in (None, "aic/sglang"):
        out = tmp_path / f"p{skip is None}.json"
        argv = ["--split", "calibration", "--from-json", str(stored), "--fit-calibration", str(out), "--json",
                str(tmp_path / "r.json")] + (["--fit-skip", skip] if skip else [])
        assert bench_fidelity.main(argv) == 0
        profiles[skip] = json.loads(out.read_text())["rows_used"]
    backend = {r["id"]: r["backend"] for r in json.loads(stored.read_text())["records"]}
    assert any(backend[i] == "sglang" for i in profiles[None])
    assert profiles["aic/sglang"] and not any(backend[i] == "sglang" for i in profiles["aic/sglang"])


def test_a_scripts_receive_interval_adds_the_mean_polling_wait_to_ttft():
    """ROUND16_SCRIPT_FLAGS_RULE: (N - 1) / 2 decode steps of the replay's own mean TPOT; the replayed TTFT kept."""
    import bench_fidelity

    from spica_pipeline.fidelity import silicon

    rec: dict = {}
    report = {"mean_ttft_ms": 100.0, "mean_tpot_ms": 10.0}
    polled = silicon.ScriptFlags(32768, 128, 0.82, 30, "dsr1_fp8_b200.sh TP8")
    assert bench_fidelity._with_recv_wait(rec, "ours", report, polled) == {"ttft": 245.0, "tpot": 10.0}
    assert rec == {"recv_wait_ms": {"ours": 145.0}, "replayed_ttft": {"ours": 100.0}}
    every_step = silicon.ScriptFlags(32768, 512, 0.82, 1, "dsr1_fp8_h200.sh TP8")
    for flags in (every_step, None):
        kept: dict = {}
        assert bench_fidelity._with_recv_wait(kept, "ours", report, flags) == {"ttft": 100.0, "tpot": 10.0}
        assert kept == {}


def test_a_shipped_profile_carries_every_adoption_round_up_to_its_version():
    import bench_fidelity

    from spica_pipeline.fidelity import profiles as loader

    packaged = json.loads(loader.PACKAGED.read_text())
    rounds = {k: v for k, v in packaged["provenance"].items() if k.startswith("round")}
    assert bench_fidelity.round_choices(packaged["method_name"]) == rounds  # a refit writes what ships
    assert set(bench_fidelity.round_choices("v14-tpot-overhead")) == {"round10_choice"}  # a candidate: round 10 only
    assert bench_fidelity.round_choices("test") == {}
