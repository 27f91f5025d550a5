"""Search-space encoding (spec §6.2): knobs, features, decode/encode round trip, enumeration."""

import itertools

import pytest
from branch_stub import Branch
from hypothesis import given, settings
from hypothesis import strategies as st

from spica_pipeline.optimize.encoding import CONSTANT_PARAM, build_encoding, enumerate_space, space_size
from spica_pipeline.space.shapes import DisaggShape as D
from spica_pipeline.space.shapes import RoleShape as R

AGG_POOL = (R(tp=1, replicas=4), R(tp=2, replicas=2), R(tp=2, attention_dp=2), R(tp=4, moe_ep=4))
AGG_SUPPORT = (("vllm", "sglang"), ("vllm", "sglang"), ("sglang",), ("vllm", "sglang"))
KNOBS = {
    "router_mode": ["kv_router", "round_robin", "kv_router"],  # duplicate is dropped
    "overlap_score_credit": [0.0, 0.5, 1.0],
    "agg_max_num_seqs": [256, 64, 128],
    "planner_scaling_policy": ["load_180_10", {"enable_throughput_scaling": False, "enable_load_scaling": False}],
    "planner_fpm_sampling": ["default"],
    "backend": ["vllm", "sglang"],
}


def agg_branch(**kw):
    args = dict(deployment_mode="agg", parallel_configs=AGG_POOL, supported_backends=AGG_SUPPORT,
                knob_choices=dict(KNOBS), gpu_budget=4)
    args.update(kw)
    return Branch(**args)


def test_knob_kinds():
    enc = build_encoding(agg_branch())
    assert enc.constants == {"planner_fpm_sampling": "default"}
    router = enc.param("router_mode")
    assert router.kind == "categorical" and router.values == ("kv_router", "round_robin") and router.default is None
    backend = enc.param("backend")
    assert backend.kind == "categorical" and backend.default == "vllm"
    seqs = enc.param("agg_max_num_seqs")
    assert seqs.kind == "discrete" and seqs.values == (64.0, 128.0, 256.0) and seqs.default is None
    policy = enc.param("planner_scaling_policy")
    assert policy.kind == "categorical" and policy.values == ("0", "1") and policy.indexed
    assert "planner_fpm_sampling" not in enc.param_names


def test_decode_casts_and_rounds():
    enc = build_encoding(agg_branch(float_ranges={"kv_load_ratio": (0.2, 0.9)}))
    params = {"router_mode": "kv_router", "overlap_score_credit": 0.5, "agg_max_num_seqs": 128.0,
              "planner_scaling_policy": "1", "backend": "sglang", "kv_load_ratio": 0.4,
              "used_gpu_ratio": 1.0, "agg_num_gpus_per_engine_target": 4.0, "agg_attention_mode": "dp",
              "agg_ffn_mode": "tp"}
    sel, req = enc.decode(params)
    assert sel["deployment_mode"] == "agg"
    assert sel["agg_max_num_seqs"] == 128 and isinstance(sel["agg_max_num_seqs"], int)
    assert sel["overlap_score_credit"] == 0.5 and isinstance(sel["overlap_score_credit"], float)
    assert sel["planner_scaling_policy"] == KNOBS["planner_scaling_policy"][1]
    assert sel["planner_fpm_sampling"] == "default"
    assert sel["kv_load_ratio"] == 0.4
    assert req["agg_attention_mode"] == "dp" and req["agg_num_gpus_per_engine_target"] == 4.0
    proj = enc.project(sel, req)
    assert proj.config == R(tp=2, attention_dp=2) and proj.distance == 0.0


def test_kv_load_ratio_range_and_scalar():
    enc = build_encoding(agg_branch(float_ranges={"kv_load_ratio": (0.2, 0.8)}))
    p = enc.param("kv_load_ratio")
    assert p.kind == "double" and p.bounds == (0.2, 0.8) and p.default == pytest.approx(0.5)
    assert not enc.is_finite
    with pytest.raises(ValueError, match="continuous"):
        next(enumerate_space(enc, agg_branch()))
    scalar = build_encoding(agg_branch(knob_choices={**KNOBS, "kv_load_ratio": [0.6]}))
    assert scalar.constants["kv_load_ratio"] == 0.6


def test_missing_features_take_defaults():
    enc = build_encoding(agg_branch())
    sel, req = enc.decode({"router_mode": "kv_router", "overlap_score_credit": 0.0, "agg_max_num_seqs": 64,
                           "planner_scaling_policy": "0", "backend": "vllm"})
    assert req == enc.feature_defaults
    assert isinstance(req["agg_num_gpus_per_engine_target"], float)
    assert isinstance(req["agg_attention_mode"], str)


def test_zero_parameters_gets_internal_constant():
    enc = build_encoding(Branch("agg", (R(tp=2),), (("vllm",),), {"backend": ["vllm"]}, 2))
    assert enc.param_names == (CONSTANT_PARAM,)
    p = enc.params[0]
    assert p.kind == "categorical" and p.values == ("0",) and p.default == "0"
    sel, req = enc.decode({CONSTANT_PARAM: "0"})
    assert CONSTANT_PARAM not in sel and sel["backend"] == "vllm"
    assert enc.encode(sel, R(tp=2)) == {CONSTANT_PARAM: "0"}


def test_decode_rejects_values_outside_the_space():
    enc = build_encoding(agg_branch())
    base = {"router_mode": "kv_router", "overlap_score_credit": 0.0, "agg_max_num_seqs": 64,
            "planner_scaling_policy": "0", "backend": "vllm"}
    with pytest.raises(ValueError, match="router_mode"):
        enc.decode({**base, "router_mode": "nope"})
    with pytest.raises(ValueError, match="planner_scaling_policy"):
        enc.decode({**base, "planner_scaling_policy": "7"})
    with pytest.raises(ValueError, match="agg_max_num_seqs"):
        enc.encode({**enc.decode(base)[0], "agg_max_num_seqs": 65}, R(tp=2, replicas=2))


DISAGG_POOL = (
    D(R(tp=4, replicas=2), R(tp=8, moe_ep=8, replicas=1)),
    D(R(tp=4, replicas=1), R(tp=8, moe_tp=8, replicas=3)),
    D(R(tp=2, moe_ep=2), R(tp=1, attention_dp=4, moe_ep=4, replicas=2)),
)


def test_disagg_features():
    enc = build_encoding(Branch("disagg", DISAGG_POOL, (("sglang",),) * 3, {"backend": ["sglang"]}, 32))
    names = set(enc.param_names)
    assert {"used_gpu_ratio", "prefill_gpu_share", "prefill_num_gpus_per_engine_target",
            "decode_num_gpus_per_engine_target", "decode_attention_mode",
            "prefill_ffn_mode", "decode_ffn_mode"} <= names
    assert enc.param("decode_num_gpus_per_engine_target").values == (4.0, 8.0)
    assert "prefill_attention_mode" not in names  # every prefill engine is attention-TP
    assert enc.feature_defaults["prefill_attention_mode"] == "tp"
    f = enc.features_of(DISAGG_POOL[1])
    assert f["prefill_gpu_share"] == pytest.approx(1 / 7) and f["used_gpu_ratio"] == pytest.approx(0.875)


# ----- round trip -----------------------------------------------------------------------------
@st.composite
def branches(draw):
    mode = draw(st.sampled_from(["agg", "disagg"]))
    if mode == "agg":
        pool = draw(st.lists(st.sampled_from(AGG_POOL), min_size=1, max_size=4, unique=True))
    else:
        pool = draw(st.lists(st.sampled_from(DISAGG_POOL), min_size=1, max_size=3, unique=True))
    knobs = {}
    for name in draw(st.lists(st.sampled_from(sorted(KNOBS)), unique=True)):
        knobs[name] = KNOBS[name]
    knobs.setdefault("backend", ["vllm"])
    if "backend" in knobs:
        knobs["backend"] = draw(st.sampled_from([["vllm"], ["vllm", "sglang"]]))
    support = tuple(("vllm", "sglang") for _ in pool)
    # the budget the branch enumerated the pool under: its largest total, or a roomier one
    return Branch(mode, tuple(pool), support, knobs, draw(st.sampled_from([max(c.used_gpus for c in pool), 64])))


@settings(max_examples=60, deadline=None)
@given(branches(), st.data())
def test_encode_decode_round_trip(branch, data):
    enc = build_encoding(branch)
    points = list(enumerate_space(enc, branch))
    selection, config = data.draw(st.sampled_from(points))
    params = enc.encode(selection, config)
    assert set(params) == set(enc.param_names)
    sel2, req = enc.decode(params)
    assert sel2 == selection
    proj = enc.project(sel2, req)
    assert proj.config == config or (proj.distance == 0.0 and enc.features_of(proj.config) == enc.features_of(config))
    assert enc.encode(sel2, proj.config) == params


def test_enumerate_space_covers_every_point_once():
    branch = agg_branch()
    enc = build_encoding(branch)
    points = list(enumerate_space(enc, branch))
    keys = [(tuple(sorted((k, repr(v)) for k, v in s.items())), c) for s, c in points]
    assert len(keys) == len(set(keys))
    # expected: every knob combination x every config that supports its backend
    knob_axes = [enc.knob_entries[p.name] for p in enc.params if p.role == "knob"]
    expected = 0
    for combo in itertools.product(*knob_axes):
        backend = dict(zip([p.name for p in enc.params if p.role == "knob"], combo))["backend"]
        expected += sum(1 for sup in AGG_SUPPORT if backend in sup)
    assert len(points) == expected == space_size(enc, branch)
    assert sum(1 for _ in enumerate_space(enc, branch, supported_only=False)) == 2 * 2 * 3 * 3 * 2 * 4
    assert list(enumerate_space(enc, branch)) == points  # deterministic order


def test_bad_branch_shapes():
    with pytest.raises(ValueError, match="supported_backends"):
        build_encoding(Branch("agg", AGG_POOL, (("vllm",),), {}, 4))
    with pytest.raises(ValueError, match="min"):
        build_encoding(agg_branch(float_ranges={"kv_load_ratio": (0.9, 0.1)}))
