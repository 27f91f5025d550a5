"""Calibration profiles as files: the packaged profile, validation of the format, the fixed-length sub-profile, and a
missing or corrupt file as one line naming it (exit 2)."""

import json
import subprocess
import sys

import pytest
from calibration_fakes import OVERHEAD, PLAIN, client_record, record

from spica_pipeline.errors import ConfigError
from spica_pipeline.fidelity import profile as pf
from spica_pipeline.fidelity import transfer
from spica_pipeline.fidelity.fit import fit
from spica_pipeline.fidelity.silicon import CALIBRATION_MODELS


def plain_profile():
    return fit([client_record(i) for i in range(6)], fitted="d", source="t", method=PLAIN)


def test_the_packaged_profile_is_valid_and_fitted_on_calibration_rows_only():
    p, digest = pf.load_profile("auto")
    assert p is not None and digest and pf.PACKAGED.name == "replay-v16.json"
    assert p["format"] == pf.TRANSFER_FORMAT and p["method_name"] == "transfer" and p["rows_used"]
    assert set(p["phase"]) == set(pf.PHASES) and p["replay"] == {"ttft": "client", "tpot": "client"}
    assert p["provenance"]["split"] == "calibration" and set(p["provenance"]["models"]) <= set(CALIBRATION_MODELS)
    assert pf.fixed_length_backends(p) == {"sglang"} and not pf.needs_client(p[pf.SWEEP_FALLBACK])
    for entry in [*p["slices"].values(), *p["backend"].values(), *p["phase"].values()]:
        assert entry["correction"] in transfer.CORRECTIONS and isinstance(entry["terms"], list)
        assert entry["transfer"]["scores"][entry["correction"]] is not None  # what the choice rests on
    assert sorted(p["own_bands"]) == sorted(str(k) for k in (1, 3, 10))


def test_the_package_ships_one_profile_and_its_checks():
    shipped = sorted(f.name for f in pf.PACKAGED.parent.iterdir())
    assert shipped == ["heldout_checks.json", "replay-v16.json"]


def test_a_fitted_profile_round_trips_through_validation():
    p = plain_profile()
    assert pf.validate(json.loads(json.dumps(p))) == p
    assert p["format"] == pf.PLAIN_FORMAT and "overhead_ms" not in p
    assert pf.needs_client(p) and pf.replay_basis(p, "ttft") == "client"


@pytest.mark.parametrize("change, match", [
    ({"format": 3}, r"format 3 is not one of \[2, 5, 6\]"),
    ({"terms": {"ttft": [{"feature": "log2_isl", "coefficient": 1.0, "centre": 0.0}], "tpot": []}},
     r"terms.ttft\[0\]"),
    ({"terms": {"ttft": [], "tpot": [], "vllm/ttft": []}}, "terms must map phases"),
    ({"replay": {"ttft": "lockstep", "tpot": "client"}}, "replay must map"),
    ({"replay": {"ttft": "client", "tpot": "client", "sglang/ttft": "sweep"}}, "replay must map"),
    ({"slices": {"x": {"factor": -1, "band": [0, 1]}}}, "slices.x.factor"),
    ({"phase": {"ttft": {"factor": 1.0, "band": [1, 0]}, "tpot": {"factor": 1.0, "band": [0, 1]}}}, "phase.ttft.band"),
    ({"overhead_ms": {"vllm/ttft": 5.0}}, "overhead_ms .* and format 5 go together"),
    ({"format": 5}, "overhead_ms .* and format 5 go together"),
    ({"format": 5, "overhead_ms": {"vllm": 5.0}}, "overhead_ms.vllm"),
    ({"format": 5, "overhead_ms": {"vllm/ttft": -1.0}}, "overhead_ms.vllm/ttft"),
    ({"band_method": {"ttft": {"level": "slice", "balanced": True, "spread": 1.0}}}, "band_method"),
    ({"band_method": {"ttft": {"level": "galaxy", "balanced": True, "spread": 1.0},
                      "tpot": {"level": "phase", "balanced": True, "spread": 1.0}}}, "band_method.ttft"),
    ({"band_method": {"ttft": {"level": "phase", "balanced": True, "spread": 0},
                      "tpot": {"level": "phase", "balanced": True, "spread": 1.0}}}, "band_method.ttft"),
    ({"sweep_fallback": None}, "needs 'sweep_fallback'"),
])
def test_validation_names_what_is_wrong(change, match):
    with pytest.raises(pf.ProfileError, match=match):
        pf.validate({**plain_profile(), **change})


def test_a_sweep_fallback_must_correct_the_sweep_replay():
    p = plain_profile()
    with pytest.raises(pf.ProfileError, match="sweep_fallback must correct the sweep replay only"):
        pf.validate({**p, "sweep_fallback": {**p, "sweep_fallback": p["sweep_fallback"]}})
    with pytest.raises(pf.ProfileError, match=r"^sweep_fallback: slices"):
        pf.validate({**p, "sweep_fallback": {**p["sweep_fallback"], "slices": {"x": {"factor": 0, "band": [0, 1]}}}})


def test_format_6_entries_carry_their_own_terms_and_overhead():
    p = pf.validate(json.loads(json.dumps(transfer.fit([client_record(i) for i in range(6)], fitted="d", source="t"))))
    assert p["format"] == pf.TRANSFER_FORMAT and p["terms"] == {"ttft": [], "tpot": []}
    entry = p["slices"]["h200_sxm/vllm/ttft"]
    with pytest.raises(pf.ProfileError, match="carries its own terms"):
        pf.validate({**p, "slices": {"x": {k: v for k, v in entry.items() if k != "terms"}}})
    with pytest.raises(pf.ProfileError, match=r"slices.x.overhead_ms must be a number >= 0"):
        pf.validate({**p, "slices": {"x": {**entry, "overhead_ms": -1.0}}})
    plain = plain_profile()
    with pytest.raises(pf.ProfileError, match="own \\['terms'\\] needs format 6"):
        pf.validate({**plain, "slices": {"x": entry}})
    with pytest.raises(pf.ProfileError, match="own_bands.3.ttft"):
        pf.validate({**p, "own_bands": {"3": {"ttft": [1.0, 0.0], "tpot": [0.0, 1.0]}}})


def test_an_overhead_profile_validates_as_format_5():
    p = fit([record(i) for i in range(9)], fitted="d", source="t", method=OVERHEAD)
    assert p["format"] == pf.FORMAT and set(p["overhead_ms"]) == {"vllm/ttft"}
    assert pf.validate(json.loads(json.dumps(p)))


def two_client_profile():
    """Main factors 1.5 on both backends' client replays, fixed-length factors 3 fitted on SGLang rows only."""
    sglang = [{**client_record(i, ttft_client=200.0), "backend": "sglang", "id": f"s{i}"} for i in range(6)]
    main = fit([client_record(i) for i in range(6)] + sglang, fitted="d", source="t", method=PLAIN)
    fixed = fit([{**client_record(i, ttft_client=100.0), "backend": "sglang", "id": f"s{i}"} for i in range(6)],
                fitted="d", source="t", method=PLAIN)
    return {**main, pf.FIXED_LENGTHS: fixed}


def test_for_client_picks_the_fixed_length_factors_only_where_they_were_fitted():
    p = two_client_profile()
    assert pf.fixed_length_backends(p) == {"sglang"}
    assert pf.for_client(p, "fixed", "sglang") is p[pf.FIXED_LENGTHS]
    assert pf.for_client(p, "fixed", "vllm") is p  # vLLM's fixed-length clients drift apart: spread replay, main
    assert pf.for_client(p, "spread", "sglang") is p and pf.for_client(p, None, "sglang") is p
    assert pf.uses_fixed_lengths(p, "fixed", "sglang") and not pf.uses_fixed_lengths(p, "fixed", "vllm")
    plain = {k: v for k, v in p.items() if k != pf.FIXED_LENGTHS}
    assert pf.for_client(plain, "fixed", "sglang") is plain


def test_a_bad_fixed_length_entry_names_itself(tmp_path):
    p = two_client_profile()
    bad = {**p, pf.FIXED_LENGTHS: {**p[pf.FIXED_LENGTHS], "slices": {"x": {"factor": -1, "band": [0, 1]}}}}
    with pytest.raises(pf.ProfileError, match=f"^{pf.FIXED_LENGTHS}: slices.x.factor"):
        pf.validate(bad)
    with pytest.raises(pf.ProfileError, match="without a fixed_lengths of its own"):
        pf.validate({**p, pf.FIXED_LENGTHS: p})
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ConfigError, match=f"{path} is not a valid calibration profile: {pf.FIXED_LENGTHS}"):
        pf.load_profile(str(path))


@pytest.mark.parametrize("content,why", [
    (None, "cannot read"),
    ("{not json", "not a valid calibration profile"),
    (json.dumps({"format": 99}), "not a valid calibration profile"),
    (json.dumps({"format": 2, "slices": {}, "backend": {}, "phase": {}, "rows_used": [], "method": "m", "fitted": "d"}),
     "missing key 'terms'"),
])
def test_missing_or_corrupt_profile_is_a_config_error_naming_the_path(tmp_path, content, why):
    path = tmp_path / "profile.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=why) as info:
        pf.load_profile(str(path))
    assert str(path) in str(info.value)
    assert pf.load_profile("none") == (None, None)


def test_cli_exits_2_naming_a_corrupt_profile(tmp_path):
    import yaml

    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    config = {
        "search_space": {"model_name": "Qwen/Qwen3-32B", "hardware_sku": "h200_sxm", "gpu_budget": 1,
                         "deployment_mode": ["agg"], "backend": ["vllm"]},
        "workload": {"isl": 128, "osl": 16, "concurrency": 1, "num_request_ratio": 1},
        "evaluation": {"calibration": str(bad)},
        "sweep": {"max_rounds": 1},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.run([sys.executable, "-m", "spica_pipeline", "sweep", "--config", str(path), "--output-dir",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert str(bad) in proc.stderr and "Traceback" not in proc.stderr
