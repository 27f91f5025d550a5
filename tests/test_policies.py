import pytest

from spica_pipeline.config import SmartSearchConfig
from spica_pipeline.errors import PolicyFilterError
from spica_pipeline.space.policies import (
    filter_policies,
    filter_scaling_policies,
    is_static,
    policy_flags,
    throughput_intervals,
)

TPUT_DICT = {"enable_throughput_scaling": True, "enable_load_scaling": False,
             "throughput_adjustment_interval_seconds": 240, "load_adjustment_interval_seconds": 5}
LOAD_DICT = {"enable_throughput_scaling": False, "enable_load_scaling": True,
             "throughput_adjustment_interval_seconds": None, "load_adjustment_interval_seconds": 7}


def config(policies, goal=None):
    data = {"search_space": {"model_name": "Qwen/Qwen3-32B", "hardware_sku": "h200_sxm",
                             "planner_scaling_policy": policies},
            "workload": {"isl": 100, "osl": 10, "request_rate": 1.0, "num_request_ratio": 2.0}}
    if goal is not None:
        data["goal"] = goal
    return SmartSearchConfig.from_dict(data)


def test_policy_flags_presets_and_dicts():
    assert policy_flags("disabled") == (False, False, None, None)
    assert policy_flags("hybrid_600_5") == (True, True, 600, 5)
    assert policy_flags("load_180_10") == (False, True, 180, 10)
    assert policy_flags(TPUT_DICT) == (True, False, 240, 5)
    # decoding a dict: a missing flag is False, a missing interval None
    assert policy_flags({"enable_load_scaling": True}) == (False, True, None, None)
    assert is_static({"enable_throughput_scaling": False, "enable_load_scaling": False})
    with pytest.raises(PolicyFilterError, match="made_up"):
        policy_flags("made_up")


def test_throughput_intervals_spec_item_17():
    assert throughput_intervals(["disabled", "load_180_5", "throughput_180_5", "hybrid_600_5",
                                 "throughput_600_5"]) == [180, 600]
    assert throughput_intervals(["disabled", "load_180_5", "load_180_10"]) == []
    assert throughput_intervals(["throughput_180_5", TPUT_DICT, LOAD_DICT]) == [180, 240]


def test_throughput_disallowed_keeps_static_and_load_only():
    entries = ["disabled", "load_180_5", "throughput_180_5", "hybrid_600_5", TPUT_DICT, LOAD_DICT]
    kept, dropped = filter_policies(entries, "throughput")
    assert kept == ["disabled", "load_180_5", LOAD_DICT]
    assert [d["policy"] for d in dropped] == ["throughput_180_5", "hybrid_600_5", TPUT_DICT]
    assert all("SLA" in d["reason"] for d in dropped)


def test_throughput_allowed_under_sla_target_keeps_everything():
    entries = ["disabled", "load_180_5", "throughput_180_5", "hybrid_600_5", TPUT_DICT, LOAD_DICT]
    kept, dropped = filter_policies(entries, "goodput", sla_ttft_ms=500, sla_itl_ms=20, sla_set=True)
    assert kept == entries and dropped == []


@pytest.mark.parametrize("target", ["throughput", "pareto", "e2e_latency", "throughput_per_user"])
def test_all_throughput_policies_raise_2a(target):
    with pytest.raises(PolicyFilterError) as err:
        filter_policies(["throughput_180_5", "hybrid_600_5"], target)
    msg = str(err.value)
    assert "every planner_scaling_policy entry enables throughput scaling" in msg
    assert f"'{target}' sweep cannot use (it has no SLA)" in msg
    assert "goodput target" in msg and "'disabled' / a load_* policy" in msg
    assert "\n" not in msg


def test_e2e_only_sla_drops_scaling_policies_2b():
    kept, dropped = filter_policies(["disabled", "load_180_5", "hybrid_180_5"], "goodput_per_gpu",
                                    sla_ttft_ms=None, sla_itl_ms=None, sla_set=True)
    assert kept == ["disabled"]
    assert [d["policy"] for d in dropped] == ["load_180_5", "hybrid_180_5"]
    with pytest.raises(PolicyFilterError, match="e2e-only SLA cannot seed the planner's ttft/itl target; "
                                                "use ttft_ms\\+itl_ms or include 'disabled'"):
        filter_policies(["load_180_5", "throughput_600_5"], "goodput", sla_set=True)


def test_2b_does_not_apply_without_sla_target_or_with_ttft_itl():
    # a throughput goal with an e2e SLA: only 2a applies, load policies stay
    kept, _ = filter_policies(["load_180_5", "throughput_180_5"], "throughput", sla_set=True)
    assert kept == ["load_180_5"]
    kept, dropped = filter_policies(["load_180_5"], "goodput", sla_ttft_ms=1, sla_itl_ms=1, sla_set=True)
    assert kept == ["load_180_5"] and not dropped


def test_filter_scaling_policies_on_config_copies():
    cfg = config(["disabled", "throughput_180_5", LOAD_DICT])
    result = filter_scaling_policies(cfg)
    assert result.kept == ["disabled", LOAD_DICT]
    assert [d["policy"] for d in result.dropped] == ["throughput_180_5"]
    assert cfg.search_space.planner_scaling_policy == ["disabled", "throughput_180_5", LOAD_DICT]
    assert "throughput_180_5" in result.summary()
    assert result.config.workload == cfg.workload


def test_filter_scaling_policies_config_goodput_e2e_and_unchanged():
    cfg = config(["disabled", "hybrid_180_5"], goal={"target": "goodput", "sla": {"e2e_ms": 3000}})
    assert filter_scaling_policies(cfg).kept == ["disabled"]
    ok = config(["hybrid_180_5"], goal={"target": "goodput", "sla": {"ttft_ms": 500, "itl_ms": 30}})
    result = filter_scaling_policies(ok)
    assert result.config is ok and result.dropped == [] and result.summary() == ""
    with pytest.raises(PolicyFilterError):
        filter_scaling_policies(config(["hybrid_600_5"], goal={"target": "pareto"}))
