"""How a profile's P10-P90 bands are built (calibration.BandMethod, bench_fidelity BAND_RULE)."""

import json
import sys
from pathlib import Path

import pytest

from spica_pipeline.errors import ConfigError
from spica_pipeline.fidelity import calibration as cal
from spica_pipeline.fidelity import profiles as loader

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))


def row(i, model, system="h200_sxm", ratio=1.0):
    return {"id": f"{model}-{i}", "split": "calibration", "model": model, "system": system, "backend": "vllm",
            "concurrency": 8, "shape": {"agg": {"workers": 1}}, "ours": {"ttft": 100.0, "tpot": 10.0},
            "silicon": {"ttft": 100.0 * ratio * (1 + 0.02 * (i % 7)), "tpot": 10.0 * ratio * (1 + 0.01 * (i % 3))}}


def records():
    """One big model near 1x on two systems, and two small models off by 2x and 0.6x."""
    out = [row(i, "big", system="h200_sxm" if i % 2 else "b200_sxm") for i in range(40)]
    out += [row(i, "slow", ratio=2.0) for i in range(6)] + [row(i, "fast", ratio=0.6) for i in range(6)]
    return out


def method(band):
    return cal.Method("t", cal.PhaseMethod(0.0), cal.PhaseMethod(0.0), ttft_band=band, tpot_band=band)


def test_the_default_band_method_is_v4s_and_writes_no_band_method_key():
    assert cal.V4.ttft_band == cal.V4.tpot_band == cal.BandMethod() and cal.band_options()[0] == cal.BandMethod()
    p = cal.fit(records(), fitted="d", source="t", method=method(cal.BandMethod()))
    assert "band_method" not in p and p["method"] == method(cal.BandMethod()).describe()
    assert len(cal.band_options()) == len(set(cal.band_options())) == 24


def test_weighted_quantile_matches_the_plain_one_for_equal_weights_inside():
    values = [3.0, 1.0, 2.0, 5.0, 4.0]
    assert cal.weighted_quantile(values, [1.0] * 5, 0.5) == pytest.approx(3.0)
    assert cal.weighted_quantile(values, [1.0] * 5, 0.0) == 1.0 and cal.weighted_quantile(values, [1.0] * 5, 1.0) == 5.0
    # a value with almost all the weight is every quantile from the middle of its weight on
    assert cal.weighted_quantile([0.0, 10.0], [1e-9, 1.0], 0.6) == pytest.approx(10.0, abs=1e-6)
    assert cal.weighted_quantile([0.0, 10.0, 20.0], [1.0, 2.0, 1.0], 0.5) == pytest.approx(10.0)


def test_balanced_pools_let_every_model_weigh_the_same():
    pool = [(0.0, "big")] * 40 + [(1.0, "slow")] * 5 + [(-1.0, "fast")] * 5
    plain = cal.pool_band(pool, cal.BandMethod())
    balanced = cal.pool_band(pool, cal.BandMethod(balanced=True))
    assert plain == pytest.approx((0.0, 0.0), abs=0.2)  # the big model's rows are the P10-P90
    assert balanced[0] < -0.5 and balanced[1] > 0.5


def test_spread_widens_around_the_pool_median():
    pool = [(float(v), "m") for v in range(11)]  # median 5, P10 1, P90 9
    assert cal.pool_band(pool, cal.BandMethod(spread=1.5)) == pytest.approx((-1.0, 11.0))


def test_backend_and_phase_levels_give_every_slice_the_pools_band():
    for level in ("backend", "phase"):
        p = cal.fit(records(), fitted="d", source="t", method=method(cal.BandMethod(level=level)))
        bands = {k: v["band"] for k, v in p["slices"].items() if k.endswith("/ttft")}
        assert len(bands) == 2 and len({tuple(b) for b in bands.values()}) == 1
        assert all(v["band_from"] == level for v in p["slices"].values())
        assert p["band_method"]["ttft"] == {"level": level, "balanced": False, "spread": 1.0}
        assert cal.validate(json.loads(json.dumps(p)))
        assert p["sweep_fallback"]["band_method"] == p["band_method"] if "sweep_fallback" in p else True


def test_wider_band_options_give_wider_bands():
    narrow = cal.fit(records(), fitted="d", source="t", method=method(cal.BandMethod()))
    wide = cal.fit(records(), fitted="d", source="t", method=method(cal.BandMethod(level="phase", balanced=True,
                                                                                      spread=2.0)))
    for key in narrow["slices"]:
        (lo1, hi1), (lo2, hi2) = narrow["slices"][key]["band"], wide["slices"][key]["band"]
        assert hi2 - lo2 >= hi1 - lo1


@pytest.mark.parametrize("band_method", [
    {"ttft": {"level": "slice", "balanced": False, "spread": 1.0}},
    {"ttft": {"level": "galaxy", "balanced": False, "spread": 1.0},
     "tpot": {"level": "slice", "balanced": False, "spread": 1.0}},
    {"ttft": {"level": "slice", "balanced": "no", "spread": 1.0},
     "tpot": {"level": "slice", "balanced": False, "spread": 1.0}},
    {"ttft": {"level": "slice", "balanced": False, "spread": 0},
     "tpot": {"level": "slice", "balanced": False, "spread": 1.0}},
])
def test_a_bad_band_method_is_refused_naming_the_path(tmp_path, band_method):
    p = cal.fit(records(), fitted="d", source="t", method=method(cal.BandMethod(level="phase")))
    p["band_method"] = band_method
    with pytest.raises(cal.ProfileError, match="band_method"):
        cal.validate(p)
    path = tmp_path / "bad-bands.json"
    path.write_text(json.dumps(p))
    with pytest.raises(ConfigError, match="bad-bands.json"):
        loader.load_profile(str(path))


def test_choose_band_takes_the_closest_coverage_then_the_narrowest_within_the_tie():
    import bench_fidelity as bf

    def r(name, cov, width):
        return {"variant": name, "ttft": {"coverage": cov, "width": width}}

    rows = [r("a", 0.60, 0.5), r("b", 0.79, 2.0), r("c", 0.83, 1.5), r("d", 0.95, 0.1)]
    assert bf.choose_band(rows, "ttft")["variant"] == "c"  # 0.03 is within 0.02 of the closest 0.01
    assert bf.choose_band(rows[:2], "ttft")["variant"] == "b"
    assert bf.choose_band([r("x", 0.8, 1.0), r("y", 0.8, 1.0)], "ttft")["variant"] == "x"


def test_balanced_slopes_let_every_model_weigh_the_same():
    """A big model flat in load and a small one with a steep within-model trend: pooled pairs follow the
    big model; balanced pairs give the small one an equal say; within-balanced pairs ignore the offset."""
    rows = [{**row(i, "big"), "concurrency": c} for i, c in enumerate([1, 2, 4, 8, 16, 32, 64, 128] * 5)]
    rows += [{**row(100 + i, "small", ratio=1.0 * 1.5 ** k), "concurrency": 2 ** k} for i, k in enumerate(range(8))]
    fitted = {}
    for name, pm in (("pooled", cal.PhaseMethod(1.0)), ("balanced", cal.PhaseMethod(1.0, balanced=True)),
                     ("within", cal.PhaseMethod(1.0, balanced=True, within=True))):
        p = cal.fit(rows, fitted="d", source="t", method=cal.Method(name, pm, pm))
        fitted[name] = p["terms"]["ttft"][0]["fitted"]
    assert abs(fitted["pooled"]) < 0.05
    assert fitted["balanced"] > fitted["pooled"] + 0.05 and fitted["within"] > 0.05
    assert "balanced" in cal.PhaseMethod(1.0, balanced=True).label()
