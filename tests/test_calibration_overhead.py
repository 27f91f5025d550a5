"""The overhead term (rounds 18-19): silicon = factor x (replayed + a), a chosen per backend by leave-one-model-out."""

import json
from dataclasses import replace

import pytest

from spica_pipeline.fidelity import calibration as cal

OVERHEAD = cal.Method("overhead-test", cal.PhaseMethod(0.0, replay="client", overhead=True), cal.PhaseMethod(0.0))


def rec(i, model, replayed, overhead=30.0, factor=1.5, backend="vllm"):
    """A calibration row whose silicon TTFT is factor x (replayed + overhead) exactly."""
    return {"id": f"{model}-{i}", "split": "calibration", "model": model, "system": "h200_sxm", "backend": backend,
            "concurrency": 8, "shape": {"agg": {"workers": 1}},
            "ours": {"ttft": replayed, "tpot": 10.0}, "sweep": {"ttft": replayed * 0.5, "tpot": 10.0},
            "silicon": {"ttft": factor * (replayed + overhead), "tpot": 10.0}}


def rows(backend="vllm"):
    return [rec(i, f"m{m}", replayed, backend=backend)
            for m in range(3) for i, replayed in enumerate((20.0 + 10 * m, 60.0, 200.0, 1000.0, 5000.0))]


def test_the_fit_finds_the_overhead_and_the_factor_on_top_of_it():
    p = cal.fit(rows(), fitted="d", source="t", method=OVERHEAD)
    assert p["format"] == cal.OVERHEAD_FORMAT and p["overhead_ms"] == {"vllm/ttft": 30.0}
    assert p["slices"]["h200_sxm/vllm/ttft"]["factor"] == pytest.approx(1.5)
    assert "overhead_ms" in p["sweep_fallback"]  # fitted again on the sweep replay's own values
    assert cal.validate(json.loads(json.dumps(p)))
    assert "+overhead" in p["method"] and "replayed + a" in p["method"]


def test_calibrate_corrects_the_replayed_value_plus_the_overhead():
    p = cal.fit(rows(), fitted="d", source="t", method=OVERHEAD)
    out = cal.calibrate({"mean_ttft_ms": 50.0, "mean_tpot_ms": 10.0}, p, system="h200_sxm", backend="vllm",
                        concurrency=8, client={"ttft": 40.0, "tpot": 10.0})
    assert out["calibrated_mean_ttft_ms"] == pytest.approx(1.5 * (40.0 + 30.0))
    assert out["calibration_factor_ttft"] == pytest.approx(1.5 * 70.0 / 50.0)
    # without the client replay: the sweep fallback's factor and overhead on the sweep's own value
    fb = p["sweep_fallback"]
    alone = cal.calibrate({"mean_ttft_ms": 50.0, "mean_tpot_ms": 10.0}, p, system="h200_sxm", backend="vllm",
                          concurrency=8)
    a, f = fb["overhead_ms"]["vllm/ttft"], fb["slices"]["h200_sxm/vllm/ttft"]["factor"]
    assert alone["calibrated_mean_ttft_ms"] == pytest.approx(f * (50.0 + a))


def test_an_overhead_is_chosen_per_backend_and_zero_when_none_helps():
    none = [rec(i, f"s{m}", replayed, overhead=0.0, backend="sglang")
            for m in range(3) for i, replayed in enumerate((25.0 + m, 70.0, 300.0, 2000.0))]
    p = cal.fit(rows() + none, fitted="d", source="t", method=OVERHEAD)
    assert p["overhead_ms"] == {"sglang/ttft": 0.0, "vllm/ttft": 30.0}


def test_a_method_without_overhead_writes_the_profile_it_wrote_before():
    plain = replace(OVERHEAD, ttft=replace(OVERHEAD.ttft, overhead=False))
    p = cal.fit(rows(), fitted="d", source="t", method=plain)
    assert "overhead_ms" not in p and p["format"] == cal.PROFILE_FORMAT
    assert "sweep_fallback" not in cal.fit(rows(), fitted="d", source="t", method=plain, fallback=False)


@pytest.mark.parametrize("change, match", [
    ({"overhead_ms": {"vllm/ttft": -1.0}}, "overhead_ms.vllm/ttft"),
    ({"overhead_ms": {"vllm": 5.0}}, "overhead_ms.vllm"),
    ({"overhead_ms": {}}, "overhead_ms"),
    ({"format": cal.PROFILE_FORMAT}, "overhead_ms"),
])
def test_a_bad_overhead_entry_is_refused(change, match):
    p = cal.fit(rows(), fitted="d", source="t", method=OVERHEAD)
    with pytest.raises(cal.ProfileError, match=match):
        cal.validate({**p, **change})


def test_a_raw_phase_with_an_overhead_corrects_by_adding_it_only():
    method = cal.Method("tpot-overhead", cal.PhaseMethod(0.0, replay="client"),
                        cal.PhaseMethod(0.0, replay="client", raw=True, overhead=True))
    records = []
    for m in range(3):
        for i, step in enumerate((4.0 + m, 8.0, 16.0, 40.0)):
            r = rec(i, f"m{m}", 100.0)
            r["ours"]["tpot"], r["silicon"]["tpot"] = step, step + 1.5
            records.append(r)
    p = cal.fit(records, fitted="d", source="t", method=method)
    assert p["overhead_ms"] == {"vllm/tpot": 1.5} and p["slices"]["h200_sxm/vllm/tpot"]["factor"] == 1.0
    out = cal.calibrate({"mean_ttft_ms": 100.0, "mean_tpot_ms": 5.0, "mean_output_token_throughput_per_user": 200.0},
                        p, system="h200_sxm", backend="vllm", concurrency=8, client={"ttft": 100.0, "tpot": 6.0})
    assert out["calibrated_mean_tpot_ms"] == pytest.approx(7.5)  # the client's 6 ms + 1.5 ms
    assert out["calibrated_mean_output_token_throughput_per_user"] == pytest.approx(200.0 * 5.0 / 7.5)


def test_held_out_rows_are_refused_before_an_overhead_is_chosen_on_them(monkeypatch):
    chosen = []
    monkeypatch.setattr(cal, "lomo_score", lambda *a, **k: chosen.append(a) or 0.0)
    held = [{**r, "split": "heldout"} for r in rows()[:5]]
    with pytest.raises(cal.ProfileError, match="held-out"):
        cal.fit(rows()[5:] + held, fitted="d", source="t", method=OVERHEAD)
    assert chosen == []  # no leave-one-model-out score was computed with a held-out row in the pool
