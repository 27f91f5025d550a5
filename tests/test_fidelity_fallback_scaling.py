"""Round 5: the bf16-attention fallback's prefill attention scaled by a perf-database dtype ratio."""

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from spica_pipeline.evaluate import attention_scaling, timing
from spica_pipeline.space.engine import EngineIdentity

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

DS = EngineIdentity("deepseek-ai/DeepSeek-V3", "h200_sxm", "sglang", "0.5.14", tp=8, moe_ep=8)


def test_matched_ratio_pairs_same_kernel_and_shape_at_fp8_kv():
    rows = []
    for isl, fp8, bf16 in [(1024, 0.7, 1.0), (2048, 1.6, 2.0), (4096, 3.0, 4.0)]:
        rows += [{"kernel_source": "k", "isl": isl, "batch_size": 1, "attn_dtype": "fp8", "kv_cache_dtype": "fp8",
                  "latency": fp8},
                 {"kernel_source": "k", "isl": isl, "batch_size": 1, "attn_dtype": "bfloat16",
                  "kv_cache_dtype": "fp8", "latency": bf16},
                 {"kernel_source": "k", "isl": isl, "batch_size": 1, "attn_dtype": "bfloat16",  # other KV: ignored
                  "kv_cache_dtype": "bfloat16", "latency": 100.0}]
    rows.append({"kernel_source": "other", "isl": 1024, "batch_size": 1, "attn_dtype": "fp8",  # no bf16 partner
                 "kv_cache_dtype": "fp8", "latency": 0.01})
    ratio, n = attention_scaling.matched_dtype_ratio(pd.DataFrame(rows), "attn_dtype")
    assert n == 3 and ratio == pytest.approx(0.75)
    assert attention_scaling.matched_dtype_ratio(pd.DataFrame(rows[:1]), "attn_dtype") is None


def test_scaling_subtracts_the_attention_share_only():
    s = attention_scaling.FallbackScaling(0.7, "src", 61, np.array([1.0, 1000.0]), np.array([0.0, 1.0]))
    assert s.saving_ms(1000) == pytest.approx(0.3 * 61 * 1.0)
    assert s.saving_ms(500) == pytest.approx(0.3 * 61 * 499 / 999)
    assert s.saving_ms(10_000) == pytest.approx(0.3 * 61)  # clamped at the data's last shape
    assert "x0.700" in s.note() and "src" in s.note()


def test_scaling_is_off_by_default_and_needs_a_kept_kv_dtype(monkeypatch):
    monkeypatch.delenv(attention_scaling.FALLBACK_SCALING_ENV, raising=False)
    used = EngineIdentity(**{**DS.__dict__, "attention_dtype": "bfloat16"})
    assert not attention_scaling.fallback_scaling_enabled() and attention_scaling.fallback_scaling(DS, used) is None
    assert attention_scaling.fallback_scaling_key(DS) == "off"
    monkeypatch.setenv(attention_scaling.FALLBACK_SCALING_ENV, "1")
    both = EngineIdentity(**{**DS.__dict__, "attention_dtype": "bfloat16", "kv_cache_dtype": "bfloat16"})
    assert attention_scaling.fallback_scaling(DS, both) is None  # bf16 KV too: not the substitution the ratio measures


def test_timing_key_changes_with_the_scaling(monkeypatch, tmp_path):
    monkeypatch.setattr(timing, "build_timing_arrays", lambda identity, top: {"prefill_isl": np.array([1.0])})
    monkeypatch.setattr(timing, "fidelity_note_of", lambda identity: None)
    monkeypatch.setattr(timing, "_timing_memo", {})
    monkeypatch.setattr(attention_scaling, "attention_dtype_ratio", lambda system: (0.7, "src"))
    monkeypatch.setattr("spica_pipeline.space.model_hw.model_facts",
                        lambda model: type("F", (), {"is_mla": model.startswith("deepseek")})())
    monkeypatch.delenv(attention_scaling.FALLBACK_SCALING_ENV, raising=False)
    qwen = EngineIdentity("Qwen/Qwen3-32B", "h200_sxm", "sglang", "0.5.14", tp=2)
    off = timing.timing_table(DS, cache_dir=tmp_path).key
    qwen_off = timing.timing_table(qwen, cache_dir=tmp_path).key
    monkeypatch.setenv(attention_scaling.FALLBACK_SCALING_ENV, "1")
    on = timing.timing_table(DS, cache_dir=tmp_path).key
    assert on != off
    assert timing.timing_table(qwen, cache_dir=tmp_path).key == qwen_off  # not an MLA fallback: unchanged
    monkeypatch.setattr(attention_scaling, "attention_dtype_ratio", lambda system: (0.8, "src"))
    assert timing.timing_table(DS, cache_dir=tmp_path).key not in (on, off)  # another ratio: another table


def _rec(model, fallback, ttft, tpot, i, split="calibration"):
    note = "x; timed with the nearest available data: bf16 attention" if fallback else None
    return {"id": f"{model}-{i}", "split": split, "backend": "sglang", "mode": "agg", "model": model,
            "system": "h200_sxm", "window_rule": "benchmark_client", "fidelity_note": note,
            "silicon": {"ttft": 100.0, "tpot": 10.0}, "ours": {"ttft": ttft, "tpot": tpot}}


def test_fallback_effect_compares_fallback_with_native_rows():
    import bench_fidelity

    over = [_rec("ds", True, 150.0, 12.0, i) for i in range(4)] + [_rec("qwen", False, 95.0, 9.0, i) for i in range(4)]
    out = bench_fidelity.fallback_effect(over)
    assert out["overshoot"] == {"sglang": True} and out["proceed"]
    assert out["pooled"]["sglang/fallback"]["rows"] == 4 and "ds/sglang/h200_sxm/agg/fallback" in out["slices"]
    under = [_rec("ds", True, 150.0, 9.0, i) for i in range(4)] + [_rec("qwen", False, 95.0, 9.0, i) for i in range(4)]
    assert not bench_fidelity.fallback_effect(under)["proceed"]  # TPOT not over: no fallback effect
    with pytest.raises(SystemExit, match="held-out"):
        bench_fidelity.fallback_effect([_rec("glm", True, 150.0, 12.0, 0, split="heldout"), *over])


def test_fallback_scaling_choice_rule():
    import bench_fidelity

    def row(ttft, tpot):
        return {"ttft": {"mdape": ttft}, "tpot": {"mdape": tpot}}

    ref = row(0.26, 0.24)
    assert bench_fidelity.fallback_scaling_choice(row(0.255, 0.25), ref)["adopt"]  # 0.5 pt better, TPOT +1 pt
    assert not bench_fidelity.fallback_scaling_choice(row(0.257, 0.24), ref)["adopt"]  # gain under 0.5 pt
    assert not bench_fidelity.fallback_scaling_choice(row(0.20, 0.251), ref)["adopt"]  # TPOT worse by > 1 pt
    assert bench_fidelity.fallback_scaling_choice(row(0.2, 0.2), ref)["rule"] == bench_fidelity.FALLBACK_SCALING_RULE
