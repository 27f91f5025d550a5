"""Choosing each entry's correction by leave-one-architecture-out error (fidelity/transfer.py): a correction is
applied only where it transfers, the entry records its choice and errors, bands come from the same left-out
residuals, and the choice level decides which rows choose."""

import math

import pytest

from spica_pipeline.fidelity import transfer
from spica_pipeline.fidelity.apply import lookup
from spica_pipeline.fidelity.profile import SWEEP_FALLBACK, TRANSFER_FORMAT, ProfileError, validate


def row(i, model, ratio, system="h200_sxm", backend="vllm", tpot_ratio=1.0, c=8):
    """A row whose silicon is `ratio` x its client replay (TTFT; TPOT x tpot_ratio), a little spread."""
    wobble = 1.0 + 0.03 * ((i % 5) - 2)
    return {"id": f"{model}-{system}-{i}", "split": "calibration", "model": model, "system": system,
            "backend": backend, "concurrency": c, "shape": {"agg": {"workers": 1}}, "window_rule": "benchmark_client",
            "ours": {"ttft": 100.0, "tpot": 10.0}, "sweep": {"ttft": 50.0, "tpot": 10.0},
            "silicon": {"ttft": 100.0 * ratio * wobble, "tpot": 10.0 * tpot_ratio * wobble}}


def rows_for(ratios, **kw):
    return [row(i, m, r, **kw) for m, r in ratios.items() for i in range(6)]


def test_a_factor_every_architecture_shares_is_applied():
    p = transfer.fit(rows_for({"a": 2.0, "b": 2.1, "c": 1.9}), fitted="d", source="t")
    entry = p["slices"]["h200_sxm/vllm/ttft"]
    assert entry["correction"] != "raw" and entry["factor"] == pytest.approx(2.0, rel=0.06)
    assert entry["transfer"]["scores"]["raw"] > entry["transfer"]["scores"][entry["correction"]]
    assert entry["transfer"]["architectures"] == 3 and entry["transfer"]["rows"] == 18
    assert validate(p)["format"] == TRANSFER_FORMAT


def test_a_factor_that_does_not_transfer_is_not_applied():
    """One architecture 3x slow, one 3x fast, one right: any factor fitted on two of them misses the third by more
    than the raw replay does."""
    p = transfer.fit(rows_for({"slow": 3.0, "fast": 1 / 3, "right": 1.0}), fitted="d", source="t")
    entry = p["slices"]["h200_sxm/vllm/ttft"]
    assert entry["correction"] == "raw" and entry["factor"] == 1.0 and entry["terms"][0]["coefficient"] == 0.0


def test_twins_are_left_out_together():
    """DeepSeek-R1 and -V3 are one architecture: with the other model, there is one other architecture to learn
    from, not two."""
    rows = rows_for({"deepseek-ai/DeepSeek-R1": 2.0, "deepseek-ai/DeepSeek-V3": 2.0, "other": 1.0})
    p = transfer.fit(rows, fitted="d", source="t")
    assert p["slices"]["h200_sxm/vllm/ttft"]["transfer"]["architectures"] == 2


def test_an_overhead_choice_records_its_ms_in_the_entry():
    rows = []
    for m, extra in (("a", 1.5), ("b", 1.5), ("c", 1.4)):
        for i, step in enumerate((4.0, 6.0, 9.0, 14.0, 20.0, 30.0)):
            r = row(i, m, 1.0)
            r["ours"]["tpot"], r["sweep"]["tpot"], r["silicon"]["tpot"] = step, step, step + extra
            rows.append(r)
    p = transfer.fit(rows, fitted="d", source="t")
    entry = p["slices"]["h200_sxm/vllm/tpot"]
    assert entry["correction"] == "overhead" and entry["overhead_ms"] == 1.5 and entry["factor"] == 1.0
    info = lookup(p, "h200_sxm", "vllm", "tpot", 8)
    assert info["overhead_ms"] == 1.5 and info["factor"] == 1.0
    assert "overhead_ms" not in p["slices"]["h200_sxm/vllm/ttft"]


def test_the_choice_level_decides_which_rows_choose():
    """Per backend, both systems take the backend's choice (with their own factors); per slice each its own."""
    rows = rows_for({"a": 2.0, "b": 2.0, "c": 2.0})
    rows += rows_for({"a": 3.0, "b": 1 / 3, "c": 1.0}, system="b200_sxm")
    per_slice = transfer.fit(rows, fitted="d", source="t", level="slice", fallback=False)
    per_backend = transfer.fit(rows, fitted="d", source="t", level="backend", fallback=False)
    assert per_slice["slices"]["h200_sxm/vllm/ttft"]["correction"] != "raw"
    assert per_slice["slices"]["b200_sxm/vllm/ttft"]["correction"] == "raw"
    chosen = {per_backend["slices"][f"{s}/vllm/ttft"]["correction"] for s in ("h200_sxm", "b200_sxm")}
    assert chosen == {per_backend["backend"]["vllm/ttft"]["correction"]}
    with pytest.raises(ValueError, match="choice level"):
        transfer.fit(rows, fitted="d", source="t", level="model")


def test_bands_come_from_the_left_out_residuals():
    """Architectures off by +-20 % around a shared factor: the band spans their spread, which a factor fitted in
    sample on one architecture would not show."""
    p = transfer.fit(rows_for({"a": 2.4, "b": 2.0, "c": 1.6, "d": 2.0}), fitted="d", source="t")
    lo, hi = p["slices"]["h200_sxm/vllm/ttft"]["band"]
    assert lo < math.log(1.6 / 2.0) < 0 < math.log(2.4 / 2.0) < hi
    assert p["band_method"]["ttft"]["level"] == transfer.BANDS.level


def test_a_uniform_method_and_the_sweep_fallback():
    rows = rows_for({"a": 2.0, "b": 2.0, "c": 2.0})
    raw = transfer.fit(rows, fitted="d", source="t", candidates={"ttft": ("raw",), "tpot": ("raw",)})
    assert {e["correction"] for e in raw["slices"].values()} == {"raw"} and raw["method_name"].startswith("uniform")
    p = transfer.fit(rows, fitted="d", source="t")
    assert p[SWEEP_FALLBACK]["replay"] == {"ttft": "sweep", "tpot": "sweep"}
    assert p[SWEEP_FALLBACK]["slices"]["h200_sxm/vllm/ttft"]["factor"] == pytest.approx(4.0, rel=0.06)  # 200 / 50


def test_no_rows_of_a_phase_is_an_error():
    with pytest.raises(ProfileError, match="no calibration rows"):
        transfer.fit([{**row(0, "a", 1.0), "silicon": {"ttft": None, "tpot": None}}], fitted="d", source="t")
