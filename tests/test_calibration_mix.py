"""Round 7: a client-basis phase's replayed value between the sweep and the benchmark-client replay
(calibration.ClientMix, profile format 4 "client_mix"; bench_fidelity ROUND7_RULE)."""

import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from spica_pipeline.fidelity import calibration as cal
from spica_pipeline.fidelity import profiles as loader

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))


def rec(i, backend="sglang", client=200.0, sweep=50.0, silicon=300.0, c=8, isl=1024, adp=1, model="m"):
    return {"id": f"{model}-{backend}-{i}", "split": "calibration", "model": model, "system": "h200_sxm",
            "backend": backend, "concurrency": c, "isl": isl, "osl": 128,
            "shape": {"agg": {"workers": 1, "attention_dp": adp}},
            "ours": {"ttft": client, "tpot": 10.0}, "sweep": {"ttft": sweep, "tpot": 10.0},
            "silicon": {"ttft": silicon, "tpot": 10.0}}


BASE = cal.Method("mix-test", cal.PhaseMethod(0.0, replay="client"), cal.PhaseMethod(0.0))


def mixed(mix):
    return replace(BASE, client_mix=(("sglang", "ttft", mix),))


def test_prefill_passes_and_the_gate():
    assert cal.prefill_passes(8, 8192) == pytest.approx(8.0)
    assert cal.prefill_passes(8, 1024, attention_dp=8) == pytest.approx(0.125)
    assert cal.prefill_passes(8, 1024, chunk_tokens=2048) == pytest.approx(4.0)
    assert cal.prefill_passes(None, 1024) is None and cal.prefill_passes(8, None) is None
    gate = {"weight": 1.0, "max_passes": 4.0}
    assert cal.mix_weight(gate, 4.0) == 1.0 and cal.mix_weight(gate, 4.5) == 0.0
    assert cal.mix_weight(gate, None) == 1.0  # unknown passes: the weight
    assert cal.record_passes(rec(0, c=16, isl=4096, adp=2)) == pytest.approx(4.0)


def test_a_blend_is_fitted_on_the_geometric_mean_and_written_as_format_4():
    p = cal.fit([rec(i) for i in range(6)], fitted="d", source="t", method=mixed(cal.ClientMix(0.5)))
    assert p["format"] == cal.MIX_FORMAT and p["client_mix"] == {
        "sglang/ttft": {"weight": 0.5, "max_passes": None, "chunk_tokens": cal.CHUNK_TOKENS}}
    assert p["slices"]["h200_sxm/sglang/ttft"]["factor"] == pytest.approx(3.0)  # 300 / sqrt(200 x 50)
    assert "client_mix" not in p["sweep_fallback"] and p["sweep_fallback"]["format"] == cal.PROFILE_FORMAT
    assert cal.validate(json.loads(json.dumps(p)))
    out = cal.calibrate({"mean_ttft_ms": 50.0, "mean_tpot_ms": 10.0}, p, system="h200_sxm", backend="sglang",
                        concurrency=8, client={"ttft": 200.0, "tpot": 10.0})
    assert out["calibrated_mean_ttft_ms"] == pytest.approx(300.0)
    # another backend's client phase reads the client replay as before
    other = cal.calibrate({"mean_ttft_ms": 50.0, "mean_tpot_ms": 10.0}, p, system="h200_sxm", backend="vllm",
                          concurrency=8, client={"ttft": 200.0, "tpot": 10.0})
    assert other["calibrated_mean_ttft_ms"] == pytest.approx(200.0 * p["phase"]["ttft"]["factor"])


def test_a_gate_reads_the_sweep_above_its_passes():
    rows = [rec(i, isl=1024) for i in range(4)] + [rec(10 + i, isl=8192 * 4, silicon=150.0) for i in range(4)]
    p = cal.fit(rows, fitted="d", source="t", method=mixed(cal.ClientMix(1.0, max_passes=8.0)))
    # c=8 x 1k = 1 pass reads the client (300/200), c=8 x 32k = 32 passes the sweep (150/50): one factor 1.5 vs 3
    assert p["client_mix"]["sglang/ttft"]["max_passes"] == 8.0
    few = cal.calibrate({"mean_ttft_ms": 50.0, "mean_tpot_ms": 10.0}, p, system="h200_sxm", backend="sglang",
                        concurrency=8, client={"ttft": 200.0, "tpot": 10.0}, prefill_passes=1.0)
    many = cal.calibrate({"mean_ttft_ms": 50.0, "mean_tpot_ms": 10.0}, p, system="h200_sxm", backend="sglang",
                         concurrency=8, client={"ttft": 200.0, "tpot": 10.0}, prefill_passes=32.0)
    f = p["slices"]["h200_sxm/sglang/ttft"]["factor"]
    assert few["calibrated_mean_ttft_ms"] == pytest.approx(200.0 * f)
    assert many["calibrated_mean_ttft_ms"] == pytest.approx(50.0 * f)


def test_a_fitted_weight_is_the_slope_of_the_silicon_on_the_replays_gap():
    rows = [rec(i, client=50.0 * 2 ** k, sweep=50.0, silicon=50.0 * 2 ** (0.4 * k)) for i, k in enumerate(range(1, 7))]
    assert cal.fitted_mix_weight(rows, "sglang", "ttft") == pytest.approx(0.4)
    assert cal.fitted_mix_weight(rows, "vllm", "ttft") == 1.0  # no rows: the client replay
    resolved = cal.resolve_mix(rows, mixed(cal.ClientMix(None)))
    assert resolved.client_mix[0][2].weight == pytest.approx(0.4)
    p = cal.fit(rows, fitted="d", source="t", method=mixed(cal.ClientMix(None)))
    assert p["client_mix"]["sglang/ttft"]["weight"] == pytest.approx(0.4)
    with pytest.raises(ValueError, match="resolve"):
        cal.mixed_replayed(rows[0], "ttft", cal.ClientMix(None))


@pytest.mark.parametrize("change, why", [
    ({"format": 2}, "format 4"),
    ({"client_mix": {}}, "format 4"),
    ({"client_mix": {"sglang/ttft": {"weight": 1.5, "max_passes": None}}}, "weight"),
    ({"client_mix": {"sglang/tpot": {"weight": 0.5, "max_passes": None}}}, "client-basis"),
    ({"client_mix": {"ttft": {"weight": 0.5, "max_passes": None}}}, "backend"),
])
def test_client_mix_is_validated(change, why):
    p = cal.fit([rec(i) for i in range(6)], fitted="d", source="t", method=mixed(cal.ClientMix(0.5)))
    with pytest.raises(cal.ProfileError, match=why):
        cal.validate({**p, **change})


def test_a_format_4_file_loads(tmp_path):
    p = cal.fit([rec(i) for i in range(6)], fitted="d", source="t", method=mixed(cal.ClientMix(0.75, 8.0)))
    path = tmp_path / "v.json"
    path.write_text(json.dumps(p))
    profile, sha = loader.load_profile(str(path))
    assert profile is not None and profile["client_mix"]["sglang/ttft"]["weight"] == 0.75 and sha


def test_round7_rule_and_candidates():
    import bench_fidelity as bf

    labels = [label for label, _ in bf.round7_candidates()]
    assert labels[0] == "sweep" and len(labels) == len(set(labels)) == 1 + len(bf.ROUND7_BLENDS) + 1 + len(
        bf.ROUND7_PASSES)
    assert "02:02Z" in bf.ROUND7_RULE and "no held-out" in bf.ROUND7_RULE.replace("no held-out row", "no held-out")
    sweep = dict(bf.round7_candidates())["sweep"]
    assert cal.mixed_replayed(rec(0), "ttft", sweep) == 50.0
    assert math.isclose(cal.mixed_replayed(rec(0), "ttft", cal.ClientMix(0.5)), 100.0)


def test_decoupled_keeps_every_other_entry_of_the_fit_without_the_mix():
    rows = [rec(i) for i in range(6)] + [rec(10 + i, backend="vllm", silicon=260.0, model="v") for i in range(6)]
    plain = cal.fit(rows, fitted="d", source="t", method=BASE)
    coupled = cal.fit(rows, fitted="d", source="t", method=mixed(cal.ClientMix(0.5)))
    p = cal.fit(rows, fitted="d", source="t", method=replace(mixed(cal.ClientMix(0.5)), decoupled=True))
    assert p["format"] == cal.MIX_FORMAT and "sglang/ttft" in p["terms"] and cal.validate(json.loads(json.dumps(p)))
    for key in ("h200_sxm/vllm/ttft", "h200_sxm/vllm/tpot", "h200_sxm/sglang/tpot"):
        assert p["slices"][key] == plain["slices"][key]
    assert p["slices"]["h200_sxm/sglang/ttft"] == coupled["slices"]["h200_sxm/sglang/ttft"]
    assert p["phase"] == plain["phase"] and p["sweep_fallback"] == plain["sweep_fallback"]


def test_replay_v6_has_sglang_ttft_on_the_blend():
    profile, _ = loader.load_profile(str(loader.PACKAGED.with_name("replay-v6.json")))  # the default until round 8
    assert profile is not None and profile["format"] == cal.MIX_FORMAT and profile["method_name"] == "v6"
    assert profile["client_mix"] == {"sglang/ttft": {"weight": 0.5, "max_passes": None, "chunk_tokens": 8192}}
    assert "ROUND7B_RULE" not in profile["provenance"]["client_mix_choice"]  # the rule's text, not its name
    assert "round 7b" in profile["provenance"]["client_mix_choice"] and len(profile["rows_used"]) == 465
    for old in ("v1", "v2", "v3", "v4", "v5"):  # every earlier profile still loads
        assert loader.load_profile(str(loader.PACKAGED.with_name(f"replay-{old}.json")))[0]


@pytest.mark.parametrize("cap, expected", [(None, 300.0), (1e9, 300.0), (1e-6, 75.0)])
def test_the_evaluator_passes_the_candidates_prefill_passes(monkeypatch, tmp_path, cap, expected):
    from test_calibration import _fake_replay, evaluate_with_profile

    _fake_replay(monkeypatch, tmp_path, [200.0, 50.0])  # client replay first, then the sweep's
    p = cal.fit([rec(i, backend="vllm") for i in range(6)], fitted="d", source="t",
                method=replace(BASE, client_mix=(("vllm", "ttft", cal.ClientMix(1.0)),)))
    p["client_mix"]["vllm/ttft"]["max_passes"] = cap  # above the cap the sweep's own value is corrected
    out = evaluate_with_profile(tmp_path, p, "gate.json")
    assert out.status == "feasible", out.reason
    assert out.report["calibrated_mean_ttft_ms"] == pytest.approx(expected)  # 200 x 1.5, or 50 x 1.5
