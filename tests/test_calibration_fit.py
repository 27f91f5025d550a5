"""Fitting a profile: calibration rows only, the offsets and their shrinkage, the load term, the overhead chosen by
leave-one-architecture-out score, the sweep fallback and the fixed-length sub-profile; and a refit from the stored
replays writes the numbers the package ships."""

import json
import math
import sys
from pathlib import Path

import pytest
from calibration_fakes import OVERHEAD, PLAIN, SLOPED, client_record, record

from spica_pipeline.fidelity import fit as ft
from spica_pipeline.fidelity import transfer
from spica_pipeline.fidelity.own import OWN_BANDS
from spica_pipeline.fidelity.profile import FIXED_LENGTHS, PACKAGED, SWEEP_FALLBACK, ProfileError

ROOT = Path(__file__).resolve().parents[1]


def test_fit_recovers_a_slice_factor_and_records_what_it_used():
    p = ft.fit([record(i) for i in range(10)], fitted="2026-12-04", source="test", method=PLAIN)
    s = p["slices"]["h200_sxm/vllm/ttft"]
    assert s["rows"] == 10 and s["factor"] == pytest.approx(2.04, rel=0.02)
    assert p["slices"]["h200_sxm/vllm/tpot"]["factor"] == pytest.approx(0.5, rel=0.01)
    assert p["rows_used"] == sorted(f"r{i}" for i in range(10)) and p["fitted"] == "2026-12-04"
    assert p["method"] == PLAIN.describe() and p["method_name"] == "test"
    assert p["band_method"]["ttft"] == {"level": "phase", "balanced": True, "spread": 1.0}


def test_fit_refuses_held_out_rows_before_it_fits_anything(monkeypatch):
    scored = []
    monkeypatch.setattr(ft, "loao_score", lambda *a, **k: scored.append(a) or 0.0)
    with pytest.raises(ProfileError, match="held-out"):
        ft.fit([record(1), record(2, split="heldout")], fitted="d", source="t", method=OVERHEAD)
    assert scored == []  # no leave-one-architecture-out score was computed with a held-out row in the pool
    with pytest.raises(ProfileError, match="held-out"):
        transfer.fit_profile([record(1), record(2, split="heldout")], fitted="d", source="t")


def test_offsets_shrink_a_slice_towards_its_backend():
    """A system with one model's rows moves a quarter of the way from its backend's offset to its own median
    (n = 1 model against K = 3 pseudo-models)."""
    rows = [record(i, ttft_ratio=2.0) for i in range(9)]
    rows += [{**record(20 + i, system="b200_sxm", model="m0"), "silicon": {"ttft": 400.0, "tpot": 5.0}}
             for i in range(3)]
    p = ft.fit(rows, fitted="d", source="t", method=PLAIN)
    b200, backend = p["slices"]["b200_sxm/vllm/ttft"]["factor"], p["backend"]["vllm/ttft"]["factor"]
    assert backend < b200 < 4.0
    assert (math.log(b200) - math.log(backend)) / (math.log(4.0) - math.log(backend)) == pytest.approx(0.25, abs=0.01)


def test_one_vote_per_architecture_not_per_row():
    """An architecture with many rows does not set the offset: the median of per-architecture medians; DeepSeek-R1
    and -V3 are one architecture, one vote."""
    rows = [record(i, ttft_ratio=1.0, model="big") for i in range(30)]
    rows += [record(100 + i, ttft_ratio=3.0, model=m) for i, m in enumerate(["a", "a", "b", "b"])]
    p = ft.fit(rows, fitted="d", source="t", method=PLAIN)
    assert p["phase"]["ttft"]["factor"] == pytest.approx(3.0, rel=0.05)  # median of (1, 3, 3)
    twins = [record(200 + i, ttft_ratio=3.0, model=m) for i, m in
             enumerate(["deepseek-ai/DeepSeek-R1", "deepseek-ai/DeepSeek-V3"] * 2)]
    rows = [record(i, ttft_ratio=1.0, model=m) for i, m in enumerate(["big", "big", "small", "small"])] + twins
    p = ft.fit(rows, fitted="d", source="t", method=PLAIN)
    assert p["phase"]["ttft"]["factor"] == pytest.approx(1.0, rel=0.05)  # median of (1, 1, 3), not (1, 1, 3, 3)


def test_the_load_slope_is_shrunk_and_centred_as_the_method_says():
    rows = [record(i, c=c, ttft_ratio=2.0 ** (0.3 * c.bit_length())) for i, c in enumerate([1, 2, 4, 8, 16, 32, 64] * 2)]
    for shrink, centred in ((0.0, False), (0.5, True), (1.0, False)):
        method = ft.Method("t", ft.PhaseMethod("client", slope_shrink=shrink, centred=centred), PLAIN.tpot)
        (load,) = ft.fit(rows, fitted="d", source="t", method=method)["terms"]["ttft"]
        assert load["coefficient"] == pytest.approx(shrink * load["fitted"], abs=1e-6)
        assert load["anchor"] == (load["centre"] if centred else 0.0)
    fitted = ft.fit(rows, fitted="d", source="t", method=SLOPED)["terms"]["ttft"][0]["fitted"]
    assert fitted == pytest.approx(0.3 * math.log(2), abs=0.01)  # ln(silicon / replayed) per doubling


def test_an_overhead_is_chosen_per_backend_and_zero_where_none_helps():
    vllm = [{**record(i), "ours": {"ttft": v, "tpot": 10.0}, "silicon": {"ttft": 1.5 * (v + 30.0), "tpot": 5.0}}
            for i, v in enumerate([20.0, 60.0, 200.0, 1000.0, 5000.0] * 3)]
    sglang = [{**record(50 + i, backend="sglang"), "ours": {"ttft": v, "tpot": 10.0},
               "silicon": {"ttft": 1.5 * v, "tpot": 5.0}} for i, v in enumerate([25.0, 70.0, 300.0, 2000.0] * 3)]
    p = ft.fit(vllm + sglang, fitted="d", source="t", method=OVERHEAD)
    assert p["overhead_ms"] == {"sglang/ttft": 0.0, "vllm/ttft": 30.0}
    assert p["slices"]["h200_sxm/vllm/ttft"]["factor"] == pytest.approx(1.5)
    assert "overhead_ms" in p[SWEEP_FALLBACK]  # chosen again on the sweep replay's own values


def test_a_phase_without_offsets_keeps_factor_1_and_adds_its_overhead():
    method = ft.Method("tpot", PLAIN.ttft, ft.PhaseMethod("client", offsets=False, overhead_grid=(0.0, 0.5, 1.5)))
    rows = []
    for i, step in enumerate((4.0, 5.0, 8.0, 9.0, 16.0, 40.0) * 2):
        r = record(i)
        r["ours"]["tpot"], r["silicon"]["tpot"] = step, step + 1.5
        rows.append(r)
    p = ft.fit(rows, fitted="d", source="t", method=method)
    assert p["overhead_ms"] == {"vllm/tpot": 1.5}
    assert {e["factor"] for k, e in p["slices"].items() if k.endswith("/tpot")} == {1.0}
    assert p["phase"]["tpot"]["factor"] == 1.0 and p["terms"]["tpot"][0]["coefficient"] == 0.0


def test_a_client_method_gets_a_sweep_fallback_fitted_on_the_sweep_replay():
    p = ft.fit([client_record(i) for i in range(6)], fitted="d", source="t", method=PLAIN)
    assert p["slices"]["h200_sxm/vllm/ttft"]["factor"] == pytest.approx(1.5)  # 300 / 200
    fallback = p[SWEEP_FALLBACK]
    assert fallback["replay"] == {"ttft": "sweep", "tpot": "sweep"} and fallback["method_name"] == "test-sweep"
    assert fallback["slices"]["h200_sxm/vllm/ttft"]["factor"] == pytest.approx(6.0)  # 300 / 50
    assert SWEEP_FALLBACK not in ft.fit([client_record(i) for i in range(6)], fitted="d", source="t", method=PLAIN,
                                        fallback=False)


def test_fit_profile_puts_the_fixed_length_rows_in_their_own_sub_profile():
    spread = [client_record(i) for i in range(6)]
    fixed = [{**client_record(10 + i, ttft_client=100.0), "backend": "sglang", "client_lengths": "fixed"}
             for i in range(6)]
    p = transfer.fit_profile(spread + fixed, fitted="d", source="t")
    assert set(p["rows_used"]) == {r["id"] for r in spread}
    assert set(p[FIXED_LENGTHS]["rows_used"]) == {r["id"] for r in fixed}
    assert p[FIXED_LENGTHS]["method_name"] == "transfer" and FIXED_LENGTHS not in p[FIXED_LENGTHS]
    assert FIXED_LENGTHS not in transfer.fit_profile(spread, fitted="d", source="t")


def _numbers(profile: dict) -> dict:
    """What a profile applies: every entry with its choice, term, overhead and basis, the rows it was fitted on and
    the bands of own profiles."""
    return {k: profile.get(k) for k in ("slices", "backend", "phase", "terms", "overhead_ms", "replay", "rows_used",
                                        "band_method", OWN_BANDS)}


def test_a_refit_from_the_stored_replays_writes_the_numbers_that_ship():
    """bench_fidelity.py --fit-calibration on bench/results/fidelity_replays_calibration.json: the packaged
    profile, its sweep fallback, its fixed-length factors and its own bands, entry for entry."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from fidelity.decisions import attach_campaigns
        from fidelity.files import records_by_id
        from fidelity.rows import load_cases
        from fidelity.scores import fit_records
    finally:
        sys.path.remove(str(ROOT / "bench"))
    records = list(records_by_id(str(ROOT / "bench/results/fidelity_replays_calibration.json")).values())
    attach_campaigns(records, {r.id: r.source for r in load_cases()[0]})
    refit = transfer.fit_profile(fit_records(records), fitted="d", source="t")
    packaged = json.loads(PACKAGED.read_text())
    assert _numbers(refit) == _numbers(packaged)
    assert _numbers(refit[SWEEP_FALLBACK]) == _numbers(packaged[SWEEP_FALLBACK])
    assert _numbers(refit[FIXED_LENGTHS]) == _numbers(packaged[FIXED_LENGTHS])
    assert _numbers(refit[FIXED_LENGTHS][SWEEP_FALLBACK]) == _numbers(packaged[FIXED_LENGTHS][SWEEP_FALLBACK])
