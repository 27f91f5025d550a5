"""Projection onto the legal pool (spec §6.3, §11 item 26)."""

import pytest
from branch_stub import Branch

from spica_pipeline.optimize.encoding import CONSTANT_PARAM, build_encoding
from spica_pipeline.optimize.projection import attention_mode, config_features, ffn_mode, project
from spica_pipeline.space.shapes import DisaggShape as D
from spica_pipeline.space.shapes import RoleShape as R


def branch(mode, configs, backends=("vllm",), *, budget, knob_choices=None):
    return Branch(mode, tuple(configs), tuple(tuple(backends) for _ in configs), knob_choices or {}, budget)


# The 32-GPU disagg doc example: A = prefill 2x4, decode 1x8 (EP); B = prefill 1x4, decode 3x8 (TP).
DOC_A = D(R(tp=4, replicas=2), R(tp=8, moe_ep=8, replicas=1))
DOC_B = D(R(tp=4, replicas=1), R(tp=8, moe_tp=8, replicas=3))


def test_doc_example_mode_match_beats_numeric_distance():
    enc = build_encoding(branch("disagg", [DOC_A, DOC_B], budget=32))
    request = {**enc.features_of(DOC_A), "decode_ffn_mode": "tp"}
    proj = enc.project({"backend": "vllm"}, request)
    assert proj.config == DOC_B
    assert proj.actual_features["used_gpu_ratio"] == pytest.approx(0.875)
    assert proj.actual_features["prefill_gpu_share"] == pytest.approx(1 / 7)
    assert proj.mode_projected is False  # B matches every requested mode exactly
    assert proj.distance > 0


def test_exact_valid_request_projects_to_itself():
    pool = [R(tp=1, replicas=8), R(tp=2, replicas=4), R(tp=4, replicas=2), R(tp=2, attention_dp=2, replicas=1)]
    enc = build_encoding(branch("agg", pool, budget=8))
    for cfg in pool:
        proj = enc.project({"backend": "vllm"}, enc.features_of(cfg))
        assert proj.config == cfg
        assert proj.distance == 0.0
        assert proj.mode_projected is False


def test_backend_filter_wins_over_closer_config():
    near, far = R(tp=4, replicas=2), R(tp=1, replicas=2)
    pool = (near, far)
    supports = (("sglang",), ("vllm",))
    request = config_features(near, 8, False)
    proj = project(request, "vllm", pool, supports, gpu_budget=8)
    assert proj.config == far
    with pytest.raises(ValueError, match="backend 'trtllm' has no valid parallel config"):
        project(request, "trtllm", pool, supports, gpu_budget=8)


def test_missing_mode_falls_back_with_mode_projected():
    pool = [R(tp=2, replicas=2), R(tp=4, replicas=1)]  # no attention-DP config at all
    request = {"used_gpu_ratio": 1.0, "agg_num_gpus_per_engine_target": 2.0, "agg_attention_mode": "dp"}
    proj = project(request, "vllm", pool, (("vllm",), ("vllm",)), gpu_budget=4)
    assert proj.mode_projected is True
    assert proj.config == R(tp=2, replicas=2)


def test_numeric_distance_uses_log2_for_gpu_targets_and_backend_spans():
    pool = [R(tp=1, replicas=1), R(tp=2, replicas=1), R(tp=8, replicas=1)]
    sup = (("vllm",),) * 3
    # log2 midpoint of 1 and 16 is 4: log2 distance to 2 is 1, to 8 is 1 -> tie -> sort_key -> tp=2
    request = {"agg_num_gpus_per_engine_target": 4.0}
    assert project(request, "vllm", pool, sup, gpu_budget=8).config == R(tp=2)
    # 5.0 is nearer to 8 in log2 (0.68) than to 2 (1.32)
    assert project({"agg_num_gpus_per_engine_target": 5.0}, "vllm", pool, sup, gpu_budget=8).config == R(tp=8)


def test_tie_break_by_sort_key():
    pool = [R(tp=1, attention_dp=2, replicas=1), R(tp=2, replicas=1)]
    # same GPUs and ratio; ask with no modes -> tie -> smaller sort_key (tp=1 first)
    proj = project({"used_gpu_ratio": 1.0}, "vllm", pool, (("vllm",), ("vllm",)), gpu_budget=2)
    assert proj.config == R(tp=1, attention_dp=2)
    assert proj.distance == 0.0


def test_structural_defaults_for_pool_sizes_1_4_16():
    pool = [R(tp=1, replicas=1), R(tp=4, moe_ep=4, replicas=1), R(tp=16, moe_ep=16, replicas=1)]
    enc = build_encoding(branch("agg", pool, budget=16))
    d = enc.feature_defaults
    assert d["used_gpu_ratio"] == 1.0
    assert d["agg_num_gpus_per_engine_target"] == 4.0
    assert d["agg_attention_mode"] == "tp"
    assert d["agg_ffn_mode"] == "ep"
    ratio = enc.param("used_gpu_ratio")
    assert ratio.bounds == (1 / 16, 1.0) and ratio.default == 1.0
    gpe = enc.param("agg_num_gpus_per_engine_target")
    assert gpe.kind == "discrete" and gpe.scale == "log" and gpe.values == (1.0, 4.0, 16.0)
    assert "agg_attention_mode" not in enc.param_names  # one mode present -> left out


def test_engine_default_tie_goes_to_smaller():
    pool = [R(tp=1), R(tp=2), R(tp=8)]  # sqrt(1*8)=2.83: log-distance to 2 is 0.5, to 8 is 1.5 -> 2
    assert build_encoding(branch("agg", pool, budget=8)).feature_defaults["agg_num_gpus_per_engine_target"] == 2.0
    pool = [R(tp=1), R(tp=2), R(tp=8), R(tp=16)]  # sqrt(16)=4: 2 and 8 tie in log -> the smaller
    assert build_encoding(branch("agg", pool, budget=16)).feature_defaults["agg_num_gpus_per_engine_target"] == 2.0


def test_single_config_makes_everything_constant_and_bypasses_projection():
    only = D(R(tp=2, replicas=1), R(tp=4, replicas=1))
    enc = build_encoding(branch("disagg", [only], budget=8, knob_choices={"backend": ["sglang"]}))
    assert enc.param_names == (CONSTANT_PARAM,)
    assert enc.constants == {"backend": "sglang"}
    sel, req = enc.decode({CONSTANT_PARAM: "0"})
    assert req == {}
    # even a backend the config does not list: a strict pin is never filtered here
    proj = enc.project({"backend": "vllm"}, req)
    assert proj.config == only and proj.distance == 0.0


def test_dense_pool_has_no_ffn_param():
    pool = [R(tp=1, replicas=4), R(tp=2, replicas=2), R(tp=2, attention_dp=2, replicas=1)]
    enc = build_encoding(branch("agg", pool, budget=4))
    assert not any(n.endswith("_ffn_mode") for n in enc.param_names)
    assert "agg_attention_mode" in enc.param_names
    assert not any(k.endswith("_ffn_mode") for k in enc.feature_defaults)


def test_one_gpu_shape_is_canonical_tp():
    one = R(tp=1, attention_dp=1, moe_ep=1)
    assert attention_mode(one) == "tp" and ffn_mode(one) == "tp"
    assert attention_mode(R(tp=1, attention_dp=4, moe_ep=4)) == "dp"
    assert ffn_mode(R(tp=1, attention_dp=4, moe_ep=4)) == "ep"


def test_projection_to_dict_is_metadata_ready():
    enc = build_encoding(branch("disagg", [DOC_A, DOC_B], budget=32))
    proj = enc.project({"backend": "vllm"}, enc.features_of(DOC_A))
    d = proj.to_dict()
    assert set(d) == {"requested_features", "actual_features", "projection_distance", "mode_projected",
                      "actual_parallel_config"}
    assert d["actual_parallel_config"] == DOC_A.to_dict()
    assert list(d["actual_features"]) == sorted(d["actual_features"])
    assert proj.to_json().startswith("{")


def test_projection_is_deterministic_and_history_independent():
    pool = [R(tp=t, attention_dp=a, replicas=r) for t in (1, 2, 4) for a in (1, 2) for r in (1, 2)]
    enc = build_encoding(branch("agg", pool, budget=16))
    req = {"used_gpu_ratio": 0.3, "agg_num_gpus_per_engine_target": 3.0, "agg_attention_mode": "dp"}
    first = enc.project({"backend": "vllm"}, req)
    for _ in range(3):
        assert enc.project({"backend": "vllm"}, req) == first


def _reference_project(requested, backend, pool, supported, budget, exclude=()):
    """Spec §6.3 written as a plain loop over the pool: the oracle for the indexed projection."""
    from spica_pipeline.optimize.projection import (
        _transform,
        is_categorical_feature,
        pool_budget,
        pool_is_moe,
    )

    b, moe = pool_budget(pool, budget), pool_is_moe(pool)
    cands = [c for c, sup in zip(pool, supported) if backend in sup]
    feats = {c: config_features(c, b, moe) for c in cands}
    numeric = [k for k in requested if not is_categorical_feature(k) and k in feats[cands[0]]]
    span = {k: max(_transform(k, float(feats[c][k])) for c in cands) - min(_transform(k, float(feats[c][k])) for c in cands)
            for k in numeric}
    cands = [c for c in cands if c not in set(exclude)] or cands
    miss = {c: sum(feats[c].get(k) != str(v) for k, v in requested.items() if is_categorical_feature(k)) for c in cands}
    cands = [c for c in cands if miss[c] == min(miss.values())]

    def dist(c):
        return sum(((_transform(k, float(feats[c][k])) - _transform(k, float(requested[k]))) / span[k]) ** 2
                   for k in numeric if span[k] > 0)
    return min(cands, key=lambda c: (round(dist(c), 12), c.sort_key()))


def test_indexed_projection_matches_a_plain_loop_on_random_requests():
    import random

    rng = random.Random(7)
    pool = [D(R(tp=p, moe_ep=e, replicas=r), R(tp=d, moe_tp=d, replicas=q))
            for p in (1, 2, 4) for e in (1, 2) for r in (1, 2, 3) for d in (2, 4, 8) for q in (1, 2)
            if (p == 1 or e in (1, p)) and p * r + d * q <= 32]
    supported = [("vllm", "sglang") if i % 3 else ("sglang",) for i in range(len(pool))]
    enc = build_encoding(Branch("disagg", tuple(pool), tuple(supported), {}, 32))
    for _ in range(300):
        base = enc.features_of(rng.choice(pool))
        requested = {k: (v if rng.random() < 0.7 else rng.choice(["tp", "ep", "dp"])) if isinstance(v, str)
                     else v * rng.choice([1.0, 0.5, 2.0, 1.3]) for k, v in base.items()}
        exclude = rng.sample(pool, rng.choice([0, 1, 8]))
        backend = rng.choice(["vllm", "sglang"])
        got = enc.project({"backend": backend}, requested, exclude).config
        assert got == _reference_project(requested, backend, pool, supported, 32, exclude)
