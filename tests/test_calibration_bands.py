"""How a profile's P10-P90 bands are built (fidelity/bands.py): model-balanced quantiles of leave-one-model-out
calibrated residuals, pooled per backend or per phase, scaled around the pool's median."""

import pytest
from calibration_fakes import BACKEND_BANDS, PLAIN

from spica_pipeline.fidelity import bands as bd
from spica_pipeline.fidelity.fit import fit


def row(i, model, system="h200_sxm", ratio=1.0, backend="vllm"):
    return {"id": f"{model}-{i}", "split": "calibration", "model": model, "system": system, "backend": backend,
            "concurrency": 8, "shape": {"agg": {"workers": 1}}, "ours": {"ttft": 100.0, "tpot": 10.0},
            "sweep": {"ttft": 100.0, "tpot": 10.0},
            "silicon": {"ttft": 100.0 * ratio * (1 + 0.02 * (i % 7)), "tpot": 10.0 * ratio * (1 + 0.01 * (i % 3))}}


def records():
    """One big model near 1x on two systems, two small models off by 2x and 0.6x, and an SGLang model."""
    out = [row(i, "big", system="h200_sxm" if i % 2 else "b200_sxm") for i in range(40)]
    out += [row(i, "slow", ratio=2.0) for i in range(6)] + [row(i, "fast", ratio=0.6) for i in range(6)]
    return out + [row(i, "sg", ratio=1.2 + 0.1 * (i % 4), backend="sglang") for i in range(8)]


def test_weighted_quantile_matches_the_plain_one_for_equal_weights_inside():
    values = [3.0, 1.0, 2.0, 5.0, 4.0]
    assert bd.weighted_quantile(values, [1.0] * 5, 0.5) == pytest.approx(3.0)
    assert bd.weighted_quantile(values, [1.0] * 5, 0.0) == 1.0 and bd.weighted_quantile(values, [1.0] * 5, 1.0) == 5.0
    # a value with almost all the weight is every quantile from the middle of its weight on
    assert bd.weighted_quantile([0.0, 10.0], [1e-9, 1.0], 0.6) == pytest.approx(10.0, abs=1e-6)
    assert bd.weighted_quantile([0.0, 10.0, 20.0], [1.0, 2.0, 1.0], 0.5) == pytest.approx(10.0)


def test_every_model_weighs_the_same_in_a_pool():
    pool = [(0.0, "big")] * 40 + [(1.0, "slow")] * 5 + [(-1.0, "fast")] * 5
    lo, hi = bd.pool_band(pool, bd.BandMethod())
    assert lo < -0.5 and hi > 0.5  # the big model's 40 rows do not make the band [0, 0]


def test_spread_scales_the_band_around_the_pool_median():
    pool = [(float(v), "m") for v in range(11)]  # median 5; each value at the middle of its weight: P10 0.6
    assert bd.pool_band(pool, bd.BandMethod()) == pytest.approx((0.6, 9.4))
    assert bd.pool_band(pool, bd.BandMethod(spread=1.5)) == pytest.approx((5 - 1.5 * 4.4, 5 + 1.5 * 4.4))
    assert bd.pool_band(pool, bd.BandMethod(spread=0.5)) == pytest.approx((5 - 2.2, 5 + 2.2))
    assert bd.band([], bd.BandMethod(), 2.0) == [-1.0, 1.0]


def test_an_unknown_level_is_refused():
    with pytest.raises(ValueError, match="slice"):
        bd.BandMethod("slice")


def test_slices_read_their_level_s_pool_widened_for_few_rows():
    by_phase = fit(records(), fitted="d", source="t", method=PLAIN)
    by_backend = fit(records(), fitted="d", source="t", method=BACKEND_BANDS)
    ttft = {k: v for k, v in by_phase["slices"].items() if k.endswith("/ttft")}
    assert len(ttft) == 3 and len({tuple(v["band"]) for v in ttft.values()}) == 1  # one phase pool
    assert {v["band_from"] for v in ttft.values()} == {"phase"}
    per_backend = {k: tuple(v["band"]) for k, v in by_backend["slices"].items() if k.endswith("/ttft")}
    assert per_backend["h200_sxm/vllm/ttft"] == per_backend["b200_sxm/vllm/ttft"] != per_backend["h200_sxm/sglang/ttft"]
    assert by_backend["band_method"]["ttft"] == {"level": "backend", "balanced": True, "spread": 1.0}


def test_a_parent_entry_s_band_is_wider_than_a_slice_s():
    p = fit(records(), fitted="d", source="t", method=PLAIN)
    lo, hi = p["slices"]["h200_sxm/vllm/ttft"]["band"]
    plo, phi = p["phase"]["ttft"]["band"]
    assert plo < lo and phi > hi  # x FALLBACK_WIDEN against the slice's sqrt(1 + K / n)
