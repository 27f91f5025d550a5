"""Fidelity round 10: the packaged profile after replaying each silicon row as its benchmark client measured it."""

import json
from dataclasses import replace

from spica_pipeline.fidelity import calibration as cal
from spica_pipeline.fidelity import profiles as loader


def test_replay_v12_is_v9s_method_without_sglangs_client_mix():
    """ROUND10_CLIENT_RULE (b): C2 qualified (v9's method without the SGLang TTFT blend); rounds 10c-12 refitted it on
    replays a sweep computes (AIC's runners' rows spread like any fixed-length workload) with a TTFT band spread of 0.9;
    TTFT corrected on the benchmark-client replay for both backends, TPOT uncorrected (the default until round 15)."""
    profile, _ = loader.load_profile(str(loader.PACKAGED.with_name("replay-v12.json")))
    assert cal.V13 == replace(cal.V12_BAND_90, name="v13") and profile is not None
    assert profile["method_name"] == "v12" and "client_mix" not in profile
    assert profile["band_method"]["ttft"] == {"level": "backend", "balanced": True, "spread": 0.9}
    assert replace(cal.V11, name="v9", client_mix=cal.V9.client_mix, decoupled=True) == cal.V9
    assert replace(cal.V11, name="v10-no-mix") == cal.V10_NO_MIX
    assert replace(cal.V12_BAND_90, name="v11", ttft_band=cal.V11.ttft_band) == cal.V11
    assert profile["replay"] == {"ttft": "client", "tpot": "client"}
    assert "round10/fidelity_round11_cal_aic.json,bench/results/round10/fidelity_round10_cal_agg.json" in profile["source"]
    assert "round 11" in profile["provenance"]["round12_choice"] and "round 12" in profile["provenance"]["round12_choice"]
    assert "ROUND10" not in profile["provenance"]["round10_choice"] and "round 10" in profile["provenance"]["round10_choice"]
    v10 = json.loads(loader.PACKAGED.with_name("replay-v10.json").read_text())
    v11 = json.loads(loader.PACKAGED.with_name("replay-v11.json").read_text())
    assert v10["method_name"] == "v10-no-mix" and v10["rows_used"] == v11["rows_used"] == profile["rows_used"]
    v9 = json.loads(loader.PACKAGED.with_name("replay-v9.json").read_text())
    assert len(set(profile["rows_used"]) & set(v9["rows_used"])) >= 460  # the same prefix, a few rows' status moved
    tpot = [v for k, v in profile["slices"].items() if k.endswith("/tpot")] + [profile["phase"]["tpot"]]
    assert tpot and all(v["factor"] == 1.0 for v in tpot)
