"""Heterogeneous disaggregation: prefill and decode on their own GPU types (issue 45 item 2).

The config (per-role types, a budget per type), the candidate's flat form (a role's type only where it
is not hardware_sku), the enumeration on each role's own system, the replay arguments (each role's
identity on its type, the KV hand-off at the slower side's link, the budget per type), the DGD's node
selectors, the per-type price, and the example sweep."""

from pathlib import Path

import pytest
from pydantic import ValidationError
from test_deploy import disagg_sample
from test_engine_args import SYNTH, THROUGHPUT, FakeFacts

from spica_pipeline.config import load_config
from spica_pipeline.config.messages import render_validation_error
from spica_pipeline.config.search_space import SearchSpace
from spica_pipeline.evaluate.engine_args import OverTypeBudget, ReplaySettings, build_replay_call
from spica_pipeline.evaluate.evaluator import EvalRequest
from spica_pipeline.report.dgd import DeployOptions, dgd_manifest, validate_manifest
from spica_pipeline.space.candidate import Candidate, build_candidate

REPO = Path(__file__).resolve().parents[1]
SPLIT = {"model_name": "Qwen/Qwen3-32B", "hardware_sku": "h100_sxm", "decode_hardware_sku": "h200_sxm",
         "gpu_budget": {"h100_sxm": 8, "h200_sxm": 8}, "deployment_mode": ["disagg"]}


def split_candidate(**over) -> Candidate:
    """Prefill TP2 x 1 on h100_sxm, decode TP2 (attention DP 2) x 1 on h200_sxm, 8 + 8 GPUs."""
    flat = {k: v for k, v in disagg_sample().items() if k not in ("prefill_strategy", "decode_strategy", "used_gpus")}
    flat.update({"hardware_sku": "h100_sxm", "decode_hardware_sku": "h200_sxm", "gpu_budget": 16,
                 "gpu_budget_by_type": {"h100_sxm": 8, "h200_sxm": 8}, **over})
    return Candidate.from_dict(flat, extra="ignore")


# ---- config ------------------------------------------------------------------------------------------

def test_a_budget_per_type_sums_to_gpu_budget_and_dumps_as_written():
    space = SearchSpace(**SPLIT)
    assert space.gpu_budget == 16 and space.gpu_budget_by_type == {"h100_sxm": 8, "h200_sxm": 8}
    assert space.split_systems and space.role_systems("prefill") == ["h100_sxm"]
    assert space.role_systems("decode") == ["h200_sxm"] and space.type_budget("h200_sxm") == 8
    dump = space.model_dump(mode="json")
    assert dump["gpu_budget"] == {"h100_sxm": 8, "h200_sxm": 8} and "gpu_budget_by_type" not in dump
    assert SearchSpace.model_validate(dump) == space


def test_unset_role_types_leave_the_dump_as_it_was():
    space = SearchSpace(model_name="m", hardware_sku="h200_sxm", gpu_budget=8)
    dump = space.model_dump(mode="json")
    assert not {"prefill_hardware_sku", "decode_hardware_sku", "gpu_budget_by_type"} & set(dump)
    assert dump["gpu_budget"] == 8 and not space.split_systems and space.type_budget("h200_sxm") == 8


@pytest.mark.parametrize("over, expect", [
    ({"gpu_budget": {"h100_sxm": 8, "h200_sxm": 0}}, "gpu_budget.h200_sxm must be a positive number of GPUs"),
    ({"gpu_budget": {}}, "a map of GPU type to GPUs"),
    ({"gpu_budget": {"h100_sxm": 8, "h200_sxm": True}}, "gpu_budget.h200_sxm must be a positive number"),
    ({"deployment_mode": ["agg"]}, "decode_hardware_sku places a disagg role on its own GPU type"),
    ({"decode_hardware_sku": []}, "decode_hardware_sku must be a GPU type or a non-empty list"),
    ({"decode_hardware_sku": ["h200_sxm", "h200_sxm"]}, "lists 'h200_sxm' more than once"),
    ({"parallel_configs": [{"prefill": {"tp": 2}, "decode": {"tp": 2}}]}, "parallel_configs are checked on one GPU"),
])
def test_bad_split_spaces_are_one_line(over, expect):
    with pytest.raises(ValidationError) as err:
        SearchSpace(**{**SPLIT, **over})
    assert expect in render_validation_error(err.value)


# ---- the candidate -----------------------------------------------------------------------------------

def test_a_roles_type_is_in_the_flat_form_only_where_it_is_not_hardware_sku():
    c = split_candidate()
    flat = c.to_dict()
    assert flat["hardware_sku"] == "h100_sxm" and flat["decode_hardware_sku"] == "h200_sxm"
    assert "prefill_hardware_sku" not in flat and flat["gpu_budget_by_type"] == {"h100_sxm": 8, "h200_sxm": 8}
    assert Candidate.from_dict(flat) == c
    assert c.role("prefill").system is None and c.role_system("prefill") == "h100_sxm"
    assert c.role_system("decode") == "h200_sxm" and c.systems == ("h100_sxm", "h200_sxm")
    assert c.gpus_by_system() == {"h100_sxm": 2, "h200_sxm": 4}
    same = Candidate.from_dict({**disagg_sample(), "prefill_strategy": "tp", "decode_strategy": "mixed"},
                               extra="ignore")
    assert not {"prefill_hardware_sku", "decode_hardware_sku", "gpu_budget_by_type"} & set(same.to_dict())
    assert same.systems == ("h200_sxm",)


def test_build_candidate_takes_each_roles_type_from_the_space_or_the_selection():
    from spica_pipeline.space.shapes import DisaggShape, RoleShape

    pair = DisaggShape(RoleShape(tp=2), RoleShape(tp=1, replicas=2))
    space = SearchSpace(**{**SPLIT, "decode_hardware_sku": ["h100_sxm", "h200_sxm"], "router_mode": ["round_robin"],
                           "planner_scaling_policy": ["disabled"]})
    sel = {"deployment_mode": "disagg", "backend": "vllm", "prefill_max_num_batched_tokens": 8192,
           "prefill_max_num_seqs": 8, "decode_max_num_batched_tokens": 8192, "decode_max_num_seqs": 256}
    with pytest.raises(KeyError, match="decode_hardware_sku"):
        build_candidate(space, sel, pair)
    c = build_candidate(space, {**sel, "decode_hardware_sku": "h200_sxm"}, pair)
    assert c.role_system("decode") == "h200_sxm" and c.role("prefill").system is None
    same = build_candidate(space, {**sel, "decode_hardware_sku": "h100_sxm"}, pair)
    assert same.systems == ("h100_sxm",) and "decode_hardware_sku" not in same.to_dict()


def test_over_a_types_budget_and_the_price_by_type():
    c = split_candidate(decode_replicas=3)  # 12 GPUs of h200_sxm > 8
    assert c.over_type_budget() == "over gpu_budget for h200_sxm: 12 GPUs > 8"
    assert split_candidate().over_type_budget() is None
    prices = {"h100_sxm": 3.0, "h200_sxm": 3.8}
    assert split_candidate().gpu_usd_per_hour(prices.get) == pytest.approx((2 * 3.0 + 4 * 3.8) / 6)
    assert split_candidate().gpu_usd_per_hour({"h100_sxm": 3.0}.get) is None
    one = Candidate.from_dict({**disagg_sample(), "prefill_strategy": "tp", "decode_strategy": "mixed"},
                              extra="ignore")
    assert one.gpu_usd_per_hour(prices.get) == 3.8  # one type: its price as it is


# ---- replay arguments ------------------------------------------------------------------------------

class LinkFacts(FakeFacts):
    def __init__(self, links):
        super().__init__()
        self.links = links

    def inter_node_gbps(self, hardware_sku):
        return self.links.get(hardware_sku)


def _build(candidate, facts, **settings):
    derived: dict = {}
    call = build_replay_call(EvalRequest(candidate, SYNTH, THROUGHPUT), ReplaySettings(**settings), facts, derived)
    return call, derived


def test_each_role_is_timed_and_sized_on_its_own_type():
    facts = LinkFacts({"h100_sxm": 50.0, "h200_sxm": 50.0})
    call, derived = _build(split_candidate(), facts)
    assert [(i.system, i.tp, i.attention_dp) for i in facts.identities] == [("h100_sxm", 2, 1), ("h200_sxm", 2, 2)]
    assert call.kwargs["prefill_engine_args"]["engine"]["kv_transfer_bandwidth"] == 25.0  # the setting is slower
    assert derived["kv_transfer"] == {"bandwidth_gbps": 25.0, "link_gbps": {"h100_sxm": 50.0, "h200_sxm": 50.0},
                                      "limited_by": "kv_transfer_bandwidth_gbps"}


def test_the_kv_hand_off_between_two_types_runs_at_the_slower_sides_link():
    facts = LinkFacts({"h100_sxm": 50.0, "h200_sxm": 40.0})
    call, derived = _build(split_candidate(), facts, kv_transfer_bandwidth_gbps=100.0)
    assert call.kwargs["prefill_engine_args"]["engine"]["kv_transfer_bandwidth"] == 40.0
    assert derived["kv_transfer"]["limited_by"] == "h200_sxm"
    same = FakeFacts()  # one type: the setting as it is, and no link asked for
    call, derived = _build(Candidate.from_dict({**disagg_sample(), "prefill_strategy": "tp",
                                                "decode_strategy": "mixed"}, extra="ignore"), same,
                           kv_transfer_bandwidth_gbps=100.0)
    assert call.kwargs["prefill_engine_args"]["engine"]["kv_transfer_bandwidth"] == 100.0 and "kv_transfer" not in derived


def test_a_candidate_over_a_types_budget_is_infeasible_before_any_replay():
    with pytest.raises(OverTypeBudget, match="over gpu_budget for h200_sxm: 12 GPUs > 8"):
        _build(split_candidate(decode_replicas=3), LinkFacts({}))


# ---- the manifest ---------------------------------------------------------------------------------

@pytest.mark.parametrize("api", ["v1beta1", "v1alpha1"])
def test_each_worker_selects_its_gpu_types_nodes(api):
    doc = dgd_manifest(split_candidate(), name="spica-qwen3-32b-disagg-1",
                       options=DeployOptions(api_version=api, gpus_per_node=8))
    assert validate_manifest(doc) == []
    if api == "v1beta1":
        pods = {c["name"]: c["podTemplate"]["spec"] for c in doc["spec"]["components"]}
    else:
        pods = {n: s["extraPodSpec"] for n, s in doc["spec"]["services"].items()}
    assert pods["VllmPrefillWorker"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pods["VllmDecodeWorker"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    assert "nodeSelector" not in pods["Frontend"]
    one = Candidate.from_dict({**disagg_sample(), "prefill_strategy": "tp", "decode_strategy": "mixed"},
                              extra="ignore")
    assert "nodeSelector" not in str(dgd_manifest(one, name="x-disagg-1", options=DeployOptions(api_version=api)))


# ---- the enumeration and the done-when ---------------------------------------------------------------

@pytest.mark.integration
def test_each_role_is_enumerated_on_its_own_system_within_its_types_budget():
    from spica_pipeline.space.branches import knob_choices_for, split_pair_pool

    space = SearchSpace(**SPLIT)
    pool, diag = split_pair_pool(space, "vllm", "h100_sxm", "h200_sxm", 40960, None)
    prefills = {c.prefill for c in pool}
    decodes = {c.decode for c in pool}
    # Qwen3-32B's bf16 weights leave a TP1 engine no room for a 40,960-token request on 80 GB, but on 141 GB
    assert min(p.tp for p in prefills) == 2 and min(d.tp for d in decodes) == 1
    assert max(p.used_gpus for p in prefills) <= 8 and max(d.used_gpus for d in decodes) <= 8
    assert diag["prefill"]["hardware_sku"] == "h100_sxm" and diag["decode"]["hardware_sku"] == "h200_sxm"
    assert len(pool) == len(prefills) * len(decodes)  # 8 + 8 GPUs: every prefill with every decode
    listed = SearchSpace(**{**SPLIT, "decode_hardware_sku": ["h100_sxm", "h200_sxm"]})
    knobs, _ = knob_choices_for(listed, "disagg", ["vllm"], None)
    assert knobs["decode_hardware_sku"] == ["h100_sxm", "h200_sxm"] and "prefill_hardware_sku" not in knobs
    assert "decode_hardware_sku" not in knob_choices_for(space, "disagg", ["vllm"], None)[0]


@pytest.mark.integration
@pytest.mark.slow
def test_the_example_sweeps_and_its_pick_names_both_gpu_types(tmp_path, monkeypatch):
    from spica_pipeline.sweep import run_sweep

    monkeypatch.chdir(REPO)
    monkeypatch.setenv("SPICA_CACHE_DIR", str(tmp_path / "cache"))
    config = load_config(REPO / "examples" / "configs" / "hetero_disagg.yaml")
    run_sweep(config, tmp_path / "run")
    dgd = (tmp_path / "run" / "deploy" / "1" / "dgd.yaml").read_text()
    assert "nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3" in dgd and "nvidia.com/gpu.product: NVIDIA-H200" in dgd
    assert "# GPU types: prefill on h100_sxm" in dgd
    report = (tmp_path / "run" / "report.md").read_text()
    assert "h100_sxm (prefill), h200_sxm (decode)" in report and " on h200_sxm" in report
    assert "the mean over its GPUs of h100_sxm 3, h200_sxm 3.8" in report


def test_the_dagster_launch_form_shows_and_takes_the_total_of_a_budget_per_type():
    from spica_pipeline.dagster.config import launch_config_for, read_sweep_config

    path = REPO / "examples" / "configs" / "hetero_disagg.yaml"
    form = launch_config_for(path)
    assert form.model_fields["gpu_budget"].default == 16
    assert read_sweep_config(path, form()).search_space.gpu_budget_by_type == {"h100_sxm": 8, "h200_sxm": 8}
    changed = read_sweep_config(path, form(gpu_budget=12)).search_space  # one number: the total over both types
    assert changed.gpu_budget == 12 and changed.gpu_budget_by_type is None
