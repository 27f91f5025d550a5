"""Round 8, TPOT phase (bench_fidelity.ROUND8_TPOT_RULE): the candidate TPOT phases (raw, offsets only,
model-balanced offsets, dense/MoE, sweep x client blends) on small synthetic records; TTFT stays V6's."""

import math
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from spica_pipeline.fidelity import calibration as cal

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench_fidelity as bf  # noqa: E402

MODELS = ("dense-a", "dense-b", "moe-a", "moe-b", "moe-c", "moe-d")


def rec(i, model="m", backend="vllm", system="h200_sxm", c=8, osl=128, tpot=(10.0, 12.0, 11.0),
        ttft=(100.0, 60.0, 90.0)):
    """A bench record; tpot / ttft = (client replay, sweep replay, silicon)."""
    return {"id": f"{model}-{backend}-{system}-{i}", "split": "calibration", "model": model, "aic_model": model,
            "system": system, "backend": backend, "concurrency": c, "isl": 1024, "osl": osl,
            "window_rule": "benchmark_client", "shape": {"agg": {"workers": 1, "attention_dp": 1}},
            "ours": {"ttft": ttft[0], "tpot": tpot[0]}, "sweep": {"ttft": ttft[1], "tpot": tpot[1]},
            "silicon": {"ttft": ttft[2], "tpot": tpot[2]}}


def sample():
    """Six models on both backends; each model's TPOT off by its own factor, load and OSL varying."""
    out = []
    for k, model in enumerate(MODELS):
        for i, (c, osl) in enumerate(((1, 128), (8, 512), (32, 1024), (64, 2048))):
            for backend in ("vllm", "sglang"):
                client = 10.0 * (1 + 0.1 * i)
                out.append(rec(i, model, backend, c=c, osl=osl,
                               tpot=(client, client * 1.2, client * (0.8 + 0.1 * k) * (1 + 0.05 * i)),
                               ttft=(100.0 + 10 * k, 60.0 + i, 90.0 + 5 * i + 3 * k)))
    return out


def ttft_entries(profile):
    return ({k: v for k, v in profile["slices"].items() if "/ttft" in k},
            {k: v for k, v in profile["backend"].items() if k.endswith("/ttft")}, profile["phase"]["ttft"],
            {k: v for k, v in profile["terms"].items() if k.endswith("ttft")})


def test_a_raw_phase_has_no_correction_and_a_band_from_the_raw_residuals():
    rows = sample()
    method = replace(cal.V6, name="raw", tpot=cal.PhaseMethod(0.0, replay="client", raw=True))
    p = cal.fit(rows, fitted="d", source="t", method=method, lomo_bands=False)
    tpot = [v for k, v in p["slices"].items() if k.endswith("/tpot")] + [p["phase"]["tpot"]] + \
        [v for k, v in p["backend"].items() if k.endswith("/tpot")]
    assert tpot and all(v["factor"] == 1.0 for v in tpot)
    assert all(t["coefficient"] == 0.0 for t in p["terms"]["tpot"])
    # in sample (lomo_bands off) the phase band is the model-balanced P10-P90 of the raw residuals, x1.5 as a fallback
    residuals = [(math.log(r["silicon"]["tpot"] / r["ours"]["tpot"]), r["model"]) for r in rows]
    lo, hi = cal.pool_band(residuals, cal.V6.tpot_band)
    assert p["phase"]["tpot"]["band"] == [round(lo * cal.FALLBACK_WIDEN, 6), round(hi * cal.FALLBACK_WIDEN, 6)]
    out = cal.calibrate({"mean_ttft_ms": 60.0, "mean_tpot_ms": 12.0}, p, system="h200_sxm", backend="vllm",
                        concurrency=8, client={"ttft": 100.0, "tpot": 10.0})
    assert out["calibrated_mean_tpot_ms"] == pytest.approx(10.0)  # the client replay as it is
    assert cal.PhaseMethod(0.0, replay="client", raw=True).label() == "client raw"


def test_balanced_offsets_weigh_every_model_the_same_in_one_median():
    members = [{"model": "a", "residual": r} for r in (0.0, 0.0, 0.0, 1.0)] + [{"model": "b", "residual": 1.0}]
    assert cal._model_median(members) == pytest.approx(0.5)  # median of the medians 0 and 1
    # weighted: a's four rows weigh 1/4 each, b's one row 1: the median sits between a's upper rows and b
    assert cal._balanced_median(members) == pytest.approx(
        cal.weighted_quantile([0.0, 0.0, 0.0, 1.0, 1.0], [0.25, 0.25, 0.25, 0.25, 1.0], 0.5))
    pm = cal.PhaseMethod(0.0, balanced_offsets=True)
    assert cal._offset_median(members, pm) == cal._balanced_median(members)
    assert cal._offset_median(members, cal.PhaseMethod(0.0)) == cal._model_median(members)


@pytest.mark.parametrize("label", [c[0] for c in bf.round8_tpot_candidates() if not c[2]])
def test_every_candidate_keeps_v6s_ttft_entries_bit_for_bit(label):
    rows = sample()
    method = next(m for lab, m, _ in bf.round8_tpot_candidates() if lab == label)
    assert method.ttft == cal.V6.ttft and method.ttft_band == cal.V6.ttft_band
    ref = cal.fit(rows, fitted="d", source="t", method=cal.V6, lomo_bands=False)
    p = cal.fit(rows, fitted="d", source="t", method=method, lomo_bands=False)
    assert ttft_entries(p) == ttft_entries(ref)
    assert p["client_mix"]["sglang/ttft"] == ref["client_mix"]["sglang/ttft"]
    assert cal.validate(p)


def test_a_tpot_blend_corrects_the_geometric_mean_on_both_backends():
    rows = sample()
    method = next(m for lab, m, _ in bf.round8_tpot_candidates() if lab == "blend 0.5")
    p = cal.fit(rows, fitted="d", source="t", method=method, lomo_bands=False)
    assert p["client_mix"]["vllm/tpot"]["weight"] == 0.5 and p["client_mix"]["sglang/tpot"]["weight"] == 0.5
    out = cal.calibrate({"mean_ttft_ms": 60.0, "mean_tpot_ms": 16.0}, p, system="h200_sxm", backend="vllm",
                        concurrency=8, osl=512, client={"ttft": 100.0, "tpot": 4.0})
    assert out["calibrated_mean_tpot_ms"] / out["calibration_factor_tpot"] == pytest.approx(16.0)
    looked = cal.lookup(p, "h200_sxm", "vllm", "tpot", 8, osl=512)
    assert out["calibrated_mean_tpot_ms"] == pytest.approx(8.0 * looked["factor"])  # sqrt(16 x 4) x factor


def test_balanced_error_stats_weigh_each_model_the_same():
    recs = [{"model": "big", "calibrated": {"tpot": 11.0}, "silicon": {"tpot": 10.0}} for _ in range(9)]
    recs.append({"model": "small", "calibrated": {"tpot": 20.0}, "silicon": {"tpot": 10.0}})
    pooled = bf.error_stats([(r["calibrated"]["tpot"], r["silicon"]["tpot"]) for r in recs])
    bal = bf.balanced_error_stats(recs, "calibrated", "tpot")
    assert pooled["mdape"] == pytest.approx(0.1) and bal["n"] == 10
    assert bal["p90"] == pytest.approx(1.0)  # the small model is half of the weight
    assert bal["mdape"] > pooled["mdape"]


def test_the_comparison_scores_every_candidate_and_applies_the_rule(monkeypatch):
    import spica_pipeline.space.model_hw as model_hw

    monkeypatch.setattr(model_hw, "model_facts", lambda m: SimpleNamespace(is_moe=m.startswith("moe")))
    rows = bf.fit_records(sample())
    out = bf.compare_round8_tpot(rows, [r for r in rows if r["id"].endswith(("-0", "-1", "-2"))])
    assert out["A_rows"] == len(rows) and out["P_rows"] == len(rows) * 3 // 4
    labels = [c["variant"] for c in out["candidates"]]
    assert labels == [c[0] for c in bf.round8_tpot_candidates()]
    ref = out["reference"]
    assert set(ref["tpot"]["folds"]) == set(MODELS) and ref["band_coverage"]["tpot"]["rows"] == len(rows)
    for c in out["candidates"]:
        assert c["ttft_equals_v6"] or c["moe_split"]
        expect = (c["tpot"]["score"] < ref["tpot"]["score"] and c["balanced"]["score"] <= ref["balanced"]["score"]
                  and c["fold_wins"] >= bf.MIN_FOLD_WINS)
        assert c["qualifies"] is expect
    qualifying = [c for c in out["candidates"] if c["qualifies"]]
    assert out["chosen"] == (min(qualifying, key=lambda c: c["tpot"]["score"])["variant"] if qualifying else "v6")


def test_the_comparison_refuses_held_out_rows():
    rows = bf.fit_records(sample())
    held = [{**rows[0], "split": "heldout"}]
    with pytest.raises(SystemExit, match="calibration rows only"):
        bf.compare_round8_tpot(rows + held, rows)


def test_the_shipped_v8_is_v7s_ttft_and_an_uncorrected_tpot():
    import json

    from spica_pipeline.fidelity import profiles as loader

    profile, _ = loader.load_profile(str(loader.PACKAGED.with_name("replay-v8.json")))
    v7 = json.loads(loader.PACKAGED.with_name("replay-v7.json").read_text())  # the default when round 8 TPOT landed
    assert profile is not None
    assert cal.V8.ttft == cal.V7.ttft and cal.V8.client_mix == cal.V7.client_mix
    assert profile["method_name"] == "v8" and profile["rows_used"] == v7["rows_used"]
    assert ttft_entries(profile) == ttft_entries(v7) and profile["client_mix"] == v7["client_mix"]
    assert ttft_entries(profile["sweep_fallback"]) == ttft_entries(v7["sweep_fallback"])
    tpot = [v for k, v in profile["slices"].items() if k.endswith("/tpot")] + [profile["phase"]["tpot"]]
    assert tpot and all(v["factor"] == 1.0 for v in tpot)
    assert all(t["coefficient"] == 0.0 for t in profile["terms"]["tpot"])
    assert "round 8 (TPOT)" in profile["provenance"]["tpot_choice"]
    out = cal.calibrate({"mean_ttft_ms": 60.0, "mean_tpot_ms": 12.0}, profile, system="h200_sxm", backend="vllm",
                        concurrency=8, osl=512, client={"ttft": 100.0, "tpot": 10.0})
    assert out["calibrated_mean_tpot_ms"] == pytest.approx(10.0)  # the client replay's TPOT, band around it
    assert out["band_tpot_lo"] < 1.0 < out["band_tpot_hi"]


def test_replay_v9_is_v8s_method_refitted_on_round_9s_replays():
    """Round 9c: v9 (the default until round 10) is v8's method unchanged, fitted on v8's rows (plus one the twin
    mapping made feasible) with the round-9 replays."""
    import json

    from spica_pipeline.fidelity import profiles as loader

    profile, _ = loader.load_profile(str(loader.PACKAGED.with_name("replay-v9.json")))
    v8 = json.loads(loader.PACKAGED.with_name("replay-v8.json").read_text())
    assert profile is not None
    assert replace(cal.V9, name="v8") == cal.V8 and profile["method_name"] == "v9"
    assert set(v8["rows_used"]) <= set(profile["rows_used"]) and len(profile["rows_used"]) == len(v8["rows_used"]) + 1
    assert "round9/fidelity_round9_final.json" in profile["source"]
    tpot = [v for k, v in profile["slices"].items() if k.endswith("/tpot")] + [profile["phase"]["tpot"]]
    assert tpot and all(v["factor"] == 1.0 for v in tpot)
