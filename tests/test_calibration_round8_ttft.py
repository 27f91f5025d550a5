"""Round 8 (TTFT): a ClientMix weight per attention data (native_weight) and past the pass gate (above_weight),
client_mix entries decoupled each from its own fit, ROUND8_TTFT_RULE's comparison, and replay-v7."""

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from spica_pipeline.fidelity import calibration as cal
from spica_pipeline.fidelity import profiles as loader

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

NOTE = ("sglang 0.5.16 perf data on b200_sxm has no MLA attention data (fmha fp8, kv fp8) for deepseek-ai/DeepSeek-R1; "
        "timed with the nearest available data: bf16 attention")


def rec(i, backend="sglang", client=200.0, sweep=50.0, silicon=300.0, model="m", system="h200_sxm", c=8,
        note=None, tpot=10.0):
    return {"id": f"{model}-{backend}-{system}-{i}", "split": "calibration", "model": model, "system": system,
            "backend": backend, "concurrency": c, "isl": 1024, "osl": 128, "fidelity_note": note,
            "shape": {"agg": {"workers": 1, "attention_dp": 1}}, "window_rule": "benchmark_client",
            "ours": {"ttft": client, "tpot": tpot}, "sweep": {"ttft": sweep, "tpot": tpot},
            "silicon": {"ttft": silicon, "tpot": tpot * 1.2}}


BASE = cal.Method("r8-test", cal.PhaseMethod(0.0, replay="client"), cal.PhaseMethod(0.0))


def test_the_fallback_is_read_from_the_note_perf_data_writes():
    from spica_pipeline.space import perf_data

    assert cal.attention_fallback(NOTE) and not cal.attention_fallback(None) and not cal.attention_fallback("other")

    class Ident:
        backend, version, system, model, kv_cache_dtype = "sglang", "0.5.16", "b200_sxm", "deepseek-ai/DeepSeek-R1", "fp8"

    note = perf_data.fallback_note(Ident(), Ident(), ValueError("no data"))  # type: ignore[arg-type]
    assert cal.attention_fallback(note)
    assert cal.record_attention_fallback(rec(0, note=NOTE)) and not cal.record_attention_fallback(rec(0))


def test_mix_weight_per_attention_data_and_past_the_gate():
    mix = cal.ClientMix(0.5, native_weight=1.0).entry()
    assert mix == {"weight": 0.5, "max_passes": None, "chunk_tokens": cal.CHUNK_TOKENS, "native_weight": 1.0}
    assert cal.mix_weight(mix, 8.0, True) == 0.5 and cal.mix_weight(mix, 8.0, False) == 1.0
    assert cal.mix_weight(mix, 8.0, None) == 0.5  # unknown: the entry's weight
    gate = cal.ClientMix(0.5, max_passes=1.0, above_weight=1.0).entry()
    assert cal.mix_weight(gate, 0.5) == 0.5 and cal.mix_weight(gate, 2.0) == 1.0
    assert cal.ClientMix(0.5).entry() == {"weight": 0.5, "max_passes": None, "chunk_tokens": cal.CHUNK_TOKENS}
    assert "native" in cal.ClientMix(0.5, native_weight=1.0).label()
    # the replayed value a record's correction reads: the blend with fallback data, the client replay without
    both = cal.ClientMix(0.5, native_weight=1.0)
    assert cal.mixed_replayed(rec(0, note=NOTE), "ttft", both) == pytest.approx(100.0)  # sqrt(200 x 50)
    assert cal.mixed_replayed(rec(0), "ttft", both) == pytest.approx(200.0)


def test_a_native_weight_profile_validates_and_calibrates_by_the_fallback():
    rows = [rec(i, note=NOTE, model="a") for i in range(4)] + [rec(10 + i, model="b") for i in range(4)]
    p = cal.fit(rows, fitted="d", source="t", method=replace(BASE, client_mix=(("sglang", "ttft", cal.ClientMix(
        0.5, native_weight=1.0)),)))
    assert cal.validate(json.loads(json.dumps(p)))["client_mix"]["sglang/ttft"]["native_weight"] == 1.0
    report = {"mean_ttft_ms": 50.0, "mean_tpot_ms": 10.0}
    kw = {"system": "h200_sxm", "backend": "sglang", "concurrency": 8, "client": {"ttft": 200.0, "tpot": 10.0}}
    fallback = cal.calibrate(report, p, attention_fallback=True, **kw)["calibrated_mean_ttft_ms"]
    native = cal.calibrate(report, p, attention_fallback=False, **kw)["calibrated_mean_ttft_ms"]
    assert native == pytest.approx(2 * fallback)  # client 200 against sqrt(200 x 50) = 100, same factor
    assert cal.calibrate(report, p, **kw)["calibrated_mean_ttft_ms"] == pytest.approx(fallback)
    bad = json.loads(json.dumps(p))
    bad["client_mix"]["sglang/ttft"]["native_weight"] = 2.0
    with pytest.raises(cal.ProfileError, match="native_weight"):
        cal.validate(bad)


def test_decoupled_entries_each_come_from_their_own_mix_fit():
    rows = ([rec(i, model=f"s{i % 3}", silicon=150.0 + 20 * i) for i in range(6)]
            + [rec(10 + i, backend="vllm", model=f"v{i % 3}", client=100.0, sweep=40.0, silicon=90.0 + 10 * i)
               for i in range(6)])
    s_mix, v_mix = ("sglang", "ttft", cal.ClientMix(0.5)), ("vllm", "ttft", cal.ClientMix(0.25))
    alone_s = cal.fit(rows, fitted="d", source="t", method=replace(BASE, client_mix=(s_mix,), decoupled=True))
    alone_v = cal.fit(rows, fitted="d", source="t", method=replace(BASE, client_mix=(v_mix,), decoupled=True))
    both = cal.fit(rows, fitted="d", source="t", method=replace(BASE, client_mix=(s_mix, v_mix), decoupled=True))
    for key in ("h200_sxm/sglang/ttft", "h200_sxm/sglang/tpot", "h200_sxm/vllm/tpot"):
        assert both["slices"][key] == alone_s["slices"][key]
    assert both["slices"]["h200_sxm/vllm/ttft"] == alone_v["slices"]["h200_sxm/vllm/ttft"]
    assert both["terms"]["sglang/ttft"] == alone_s["terms"]["sglang/ttft"]
    assert both["terms"]["vllm/ttft"] == alone_v["terms"]["vllm/ttft"]
    assert set(both["client_mix"]) == {"sglang/ttft", "vllm/ttft"} and cal.validate(json.loads(json.dumps(both)))


def test_round8_ttft_comparison_on_synthetic_records(monkeypatch):
    import bench_fidelity as bf

    monkeypatch.setattr(cal, "V6", replace(BASE, name="v6-test", client_mix=(("sglang", "ttft", cal.ClientMix(0.5)),),
                                           decoupled=True))
    rows = []
    for m, (backend, note) in enumerate([("sglang", NOTE), ("sglang", NOTE), ("sglang", None), ("sglang", None),
                                         ("vllm", None), ("vllm", None)]):
        for i in range(4):  # fallback rows sit on the blend, native rows on the client replay
            silicon = 100.0 * (1 + 0.1 * m) if note else 200.0 * (1 + 0.1 * i)
            rows.append(rec(i, backend=backend, model=f"m{m}", note=note, silicon=silicon, c=2 ** (i + 1)))
    out = bf.compare_round8_ttft(rows, rows)
    assert out["test_rows"] == out["training_rows"] == len(rows)
    assert [c["variant"] for c in out["candidates"]] == [label for label, _, _ in bf.round8_ttft_candidates()]
    for c in out["candidates"]:
        assert c["tpot_identical_to_reference"]  # decoupled: TPOT as the reference, bit for bit
        assert c["ttft"]["model_balanced"] == pytest.approx(sum(c["ttft"]["folds"].values()) / 6, abs=1e-3)
        ok, wins = bf._round8_qualifies(c, out["reference"], c["backend_changed"])
        assert (ok, wins) == (c["qualifies"], c["fold_wins"])
    assert out["chosen"] and out["rule"] == bf.ROUND8_TTFT_RULE
    with pytest.raises(SystemExit, match="calibration rows only"):
        bf.compare_round8_ttft([{**rows[0], "split": "heldout"}], rows)


def test_replay_v7_and_its_tpot_and_vllm_entries_are_v6s():
    v7, _ = loader.load_profile(str(loader.PACKAGED.with_name("replay-v7.json")))  # the default until v8 (round 8 TPOT)
    v6, _ = loader.load_profile(str(loader.PACKAGED.with_name("replay-v6.json")))
    assert v7 is not None and v6 is not None and v7["method_name"] == "v7" and len(v7["rows_used"]) == 465
    assert v7["client_mix"] == {"sglang/ttft": {"weight": 0.5, "max_passes": None, "chunk_tokens": 8192,
                                                "native_weight": 1.0}}
    for section in ("slices", "backend"):
        for key, entry in v6[section].items():
            if not key.endswith("sglang/ttft"):
                assert v7[section][key] == entry, key
    assert v7["terms"]["ttft"] == v6["terms"]["ttft"] and v7["terms"]["tpot"] == v6["terms"]["tpot"]
    names = ("method", "method_name", "source", "fitted")
    assert v7["phase"] == v6["phase"] and ({k: v for k, v in v7["sweep_fallback"].items() if k not in names}
                                           == {k: v for k, v in v6["sweep_fallback"].items() if k not in names})
    assert "Round 8 (TTFT)" in v7["provenance"]["client_mix_choice"]
    for old in ("v1", "v2", "v3", "v4", "v5", "v6"):  # every earlier profile still loads
        assert loader.load_profile(str(loader.PACKAGED.with_name(f"replay-{old}.json")))[0]


@pytest.mark.parametrize("native, expected", [(None, 75.0), (1.0, 300.0)])
def test_the_evaluator_passes_the_candidates_attention_fallback(monkeypatch, tmp_path, native, expected):
    from test_calibration import _fake_replay, evaluate_with_profile

    _fake_replay(monkeypatch, tmp_path, [200.0, 50.0])  # client replay first, then the sweep's
    p = cal.fit([rec(i, backend="vllm") for i in range(6)], fitted="d", source="t",
                method=replace(BASE, client_mix=(("vllm", "ttft", cal.ClientMix(1.0)),)))
    p["client_mix"]["vllm/ttft"]["weight"] = 0.0  # the sweep's value, unless native data reads the client's
    if native is not None:
        p["client_mix"]["vllm/ttft"]["native_weight"] = native
    out = evaluate_with_profile(tmp_path, p, "native.json")  # no fidelity note: the candidate's own attention data
    assert out.status == "feasible", out.reason
    assert out.report["calibrated_mean_ttft_ms"] == pytest.approx(expected)  # 200 x 1.5, or 50 x 1.5
