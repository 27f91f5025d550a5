"""A profile from a model's own measurements (fidelity/own.py): the own factor on the base profile's correction,
the band recorded for k rows, one deployment only, and the draws that measure how far such a profile is off."""

import math

import pytest

from spica_pipeline.fidelity import own
from spica_pipeline.fidelity import transfer
from spica_pipeline.fidelity.apply import calibrate
from spica_pipeline.fidelity.profile import ProfileError, validate


def row(i, model="m", ratio=2.0, system="h200_sxm", backend="vllm", campaign="c1", c=8):
    wobble = 1.0 + 0.02 * ((i % 5) - 2)
    return {"id": f"{model}-{campaign}-{i}", "split": "calibration", "model": model, "system": system,
            "backend": backend, "concurrency": c, "shape": {"agg": {"workers": 1}}, "window_rule": "benchmark_client",
            "campaign": campaign, "ours": {"ttft": 100.0, "tpot": 10.0}, "sweep": {"ttft": 50.0, "tpot": 10.0},
            "silicon": {"ttft": 100.0 * ratio * wobble, "tpot": 10.0 * ratio * wobble}}


def base():
    """A transfer profile of three architectures near 1.5x, with own bands from their campaigns."""
    rows = [row(i, m, 1.5 * (1 + 0.05 * j), campaign=f"{m}-c") for j, m in enumerate("abc") for i in range(12)]
    return transfer.fit_profile(rows, fitted="d", source="t")


def test_the_own_factor_sits_on_the_base_correction():
    b = base()
    mine = [row(i, "new", ratio=3.0) for i in range(3)]
    p = own.fit_own(mine, base=b, fitted="d", source="t")
    assert validate(p) is p and p["own"]["model"] == "new" and p["own"]["rows"] == 3
    cal = calibrate({"mean_ttft_ms": 100.0, "mean_tpot_ms": 10.0}, p, system="h200_sxm", backend="vllm",
                    concurrency=8.0, client={"ttft": 100.0, "tpot": 10.0})
    assert cal["calibrated_mean_ttft_ms"] == pytest.approx(300.0, rel=0.03)  # what the own rows measured
    base_value = own.base_value(b, mine[0], "ttft")
    assert p["own"]["factors"]["ttft"] == pytest.approx(300.0 / base_value, rel=0.03)
    assert p["slices"]["h200_sxm/vllm/ttft"]["band"] == b["own_bands"]["3"]["ttft"]
    assert set(p["own"]["leave_one_out"]) == {"ttft", "tpot"}


def test_the_band_is_the_recorded_one_for_the_largest_k_not_above_the_rows():
    b = {"own_bands": {"1": {"ttft": [-1.0, 1.0]}, "3": {"ttft": [-0.5, 0.5]}, "10": {"ttft": [-0.2, 0.2]}}}
    assert own.own_band(b, 1, "ttft") == [-1.0, 1.0] and own.own_band(b, 5, "ttft") == [-0.5, 0.5]
    assert own.own_band(b, 30, "ttft") == [-0.2, 0.2] and own.own_band({}, 3, "ttft") is None


def test_without_a_base_the_own_factor_corrects_the_raw_replay():
    p = own.fit_own([row(i, ratio=2.0) for i in range(4)], base=None, fitted="d", source="t")
    assert p["slices"]["h200_sxm/vllm/tpot"]["factor"] == pytest.approx(2.0, rel=0.03)
    assert p["sweep_fallback"]["slices"]["h200_sxm/vllm/ttft"]["factor"] == pytest.approx(4.0, rel=0.03)


def test_rows_of_several_deployments_or_none_are_refused():
    with pytest.raises(ProfileError, match="one model, system and backend"):
        own.fit_own([row(0), row(1, system="b200_sxm")], base=None, fitted="d", source="t")
    with pytest.raises(ProfileError, match="no rows"):
        own.fit_own([], base=None, fitted="d", source="t")


def test_draws_judge_each_campaign_on_the_rows_not_drawn():
    campaigns = {"c1": [row(i, ratio=2.0 * (1.1 if i % 2 else 0.9)) for i in range(8)],
                 "c2": [row(i, campaign="c2") for i in range(2)]}
    held = own.own_draws(campaigns, 3, None, "ttft", draws=5)
    assert len(held) == 5 * 5  # c1: 5 draws x its 5 other rows; c2 has too few rows
    assert all(abs(x) < math.log(1.3) for _, x in held)
    assert own.own_draws(campaigns, 3, None, "ttft", draws=5) == held  # seeded
    bands = own.own_bands([r for rows in campaigns.values() for r in rows], None)
    assert set(bands) == {"1", "3"} and bands["3"]["ttft"][0] < 0 < bands["3"]["ttft"][1]


def test_the_own_correction_follows_load_within_its_bounds():
    # silicon / replay grows 5 % per doubling of the concurrency per engine: the slope shows, shrunk towards 0
    mine = [{**row(i, ratio=2.0 * 1.05 ** i, c=2 ** i), "silicon": {"ttft": 200.0 * 1.05 ** i, "tpot": 20.0 * 1.05 ** i}}
            for i in range(1, 7)]
    p = own.fit_own(mine, base=None, fitted="d", source="t")
    slope = p["slices"]["h200_sxm/vllm/tpot"]["own_slope"]
    assert 0.0 < slope < math.log(1.05)  # shrunk, same sign
    cal = calibrate({"mean_ttft_ms": 100.0, "mean_tpot_ms": 10.0}, p, system="h200_sxm", backend="vllm",
                    concurrency=64.0, client={"ttft": 100.0, "tpot": 10.0})
    # at the highest load: nearer what was measured there than the median factor alone (shrunk: a little under)
    assert 20.0 * 1.05 ** 3.5 < cal["calibrated_mean_tpot_ms"] < 20.0 * 1.05 ** 6
    # one point, or points at one load: no slope; a steep trend is held within OWN_MAX_SLOPE
    assert own.own_fit([(3.0, 0.2)], "tpot") == (0.2, 0.0)
    assert own.own_fit([(3.0, 0.2), (3.0, 0.4)], "tpot") == (pytest.approx(0.3), 0.0)
    a, b = own.own_fit([(float(x), x * 1.0) for x in range(8)], "ttft")
    assert b == own.OWN_MAX_SLOPE


def test_an_own_profile_on_a_base_carries_the_base_for_everything_else():
    b = base()
    p = own.fit_own([row(i, "new", ratio=3.0) for i in range(3)], base=b, fitted="d", source="t",
                    precision={"weights": "fp8"}, base_sha256="abc")
    assert p["slices"]["h200_sxm/vllm/ttft"]["correction"] == "own"
    assert {k: v for k, v in p["slices"].items() if k != "h200_sxm/vllm/ttft" and k != "h200_sxm/vllm/tpot"} == \
        {k: v for k, v in b["slices"].items() if k != "h200_sxm/vllm/ttft" and k != "h200_sxm/vllm/tpot"}
    assert p["own"]["precision"] == {"weights": "fp8"} and p["own"]["base"]["sha256"] == "abc"
    assert [m["id"] for m in p["own"]["measurements"]] == [f"new-c1-{i}" for i in range(3)]
    assert "own_bands" not in p and validate(p) is p
