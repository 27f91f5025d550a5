"""Speculative decoding searched: the config knobs, which models can run a method, the candidate's flat form,
the replay arguments (draft tokens and acceptance on decoding engines), the draft layers in timing and KV,
the DGD flags, and (integration) the replayed TPOT of MTP against none on GLM-5-FP8."""

import json
from pathlib import Path

import pytest
from pydantic import ValidationError
from test_deploy import agg_candidate, disagg_candidate
from test_engine_args import SYNTH, THROUGHPUT, FakeFacts

from spica_pipeline.config import load_config
from spica_pipeline.config.messages import render_validation_error
from spica_pipeline.config.search_space import SearchSpace
from spica_pipeline.config.workload import Workload
from spica_pipeline.errors import CandidateBuildError
from spica_pipeline.evaluate.engine_args import ReplaySettings, build_replay_call
from spica_pipeline.evaluate.evaluator import EvalRequest
from spica_pipeline.report.dgd import dgd_manifest, validate_manifest
from spica_pipeline.space.candidate import Candidate, build_candidate
from spica_pipeline.space.shapes import RoleShape
from spica_pipeline.space.speculative import (
    SpeculativeChoices,
    draft_kv_layers,
    expected_tokens_per_step,
    speculative_choices,
)

GLM, QWEN = "zai-org/GLM-5-FP8", "Qwen/Qwen3-32B"


def space(**over):
    return SearchSpace.model_validate({"model_name": GLM, "hardware_sku": "h200_sxm", **over})


def refusal(model, data):
    with pytest.raises(ValidationError) as err:
        model.model_validate(data)
    return render_validation_error(err.value)


# ---- config -----------------------------------------------------------------------------------

def test_method_takes_a_string_or_a_list_and_is_off_by_default():
    assert space().speculative_method == ["none"] and not space().speculative_on
    assert space(speculative_method="mtp").speculative_method == ["mtp"]
    assert space(speculative_method="mtp").speculative_on
    assert not space(speculative_method="mtp", speculative_num_tokens=[0]).speculative_on


def test_unset_speculative_fields_leave_the_dump():
    assert not any(k.startswith("speculative") for k in space().model_dump())
    on = space(speculative_method="mtp", speculative_num_tokens=[0, 2])
    dumped = on.model_dump()
    assert dumped["speculative_method"] == ["mtp"] and dumped["speculative_num_tokens"] == [0, 2]
    assert SearchSpace.model_validate(dumped) == on


@pytest.mark.parametrize("over, expect", [
    ({"speculative_method": "medusa"}, "speculative_method: speculative_method has invalid choice 'medusa'"),
    ({"speculative_num_tokens": [6]}, "speculative_num_tokens has invalid choice 6"),
    ({"speculative_method": "eagle3"}, "needs speculative_draft_model"),
    ({"speculative_method": "mtp", "aic_nextn": 2}, "aic_nextn pins MTP draft tokens"),
])
def test_bad_speculative_space_is_one_line(over, expect):
    line = refusal(SearchSpace, {"model_name": GLM, "hardware_sku": "h200_sxm", **over})
    assert expect in line and "\n" not in line


SYN = {"isl": 100, "osl": 100, "concurrency": 4, "num_request_ratio": 2}


@pytest.mark.parametrize("value", [0, 0.0, -0.1, 1.01, True, "0.7", [0.5, 1.5], [], float("nan")])
def test_acceptance_outside_zero_one_is_refused(value):
    line = refusal(Workload, {**SYN, "speculative_acceptance": value})
    assert line.startswith("speculative_acceptance:") and "\n" not in line


def test_acceptance_rates_per_position():
    w = Workload.model_validate({**SYN, "speculative_acceptance": 0.7})
    assert w.acceptance_rates(3) == [0.7, 0.7, 0.7] and w.acceptance_rates(0) is None
    w = Workload.model_validate({**SYN, "speculative_acceptance": [0.9, 0.6, 0.3]})
    assert w.acceptance_rates(2) == [0.9, 0.6]
    with pytest.raises(ValueError, match="gives 3 draft position"):
        w.acceptance_rates(4)
    assert "speculative_acceptance" not in Workload.model_validate(SYN).model_dump()


def test_expected_tokens_per_step():
    assert expected_tokens_per_step(None) == 1.0
    assert expected_tokens_per_step([0.7, 0.7, 0.7]) == pytest.approx(1 + 0.7 + 0.49 + 0.343)
    assert expected_tokens_per_step([1.0, 0.5]) == pytest.approx(2.5)


# ---- which models can run a method (real aiconfigurator-core model configs) ----------------------

@pytest.mark.integration
def test_mtp_needs_mtp_layers_and_drops_out_with_the_reason():
    glm = speculative_choices(space(speculative_method=["mtp", "none"], speculative_num_tokens=[1, 3]))
    assert glm.methods == ("mtp",) and glm.tokens == (0, 1, 3) and not glm.dropped
    assert glm.knobs() == {"speculative_method": ["mtp"], "speculative_num_tokens": [0, 1, 3]}
    qwen = speculative_choices(space(model_name=QWEN, speculative_method="mtp"))
    assert not qwen.searched and qwen.knobs() == {}
    assert "Qwen/Qwen3-32B has no MTP layers" in qwen.dropped["mtp"]
    assert any("no speculative method is left" in w for w in qwen.warnings())
    eagle = speculative_choices(space(model_name=QWEN, speculative_method="eagle3",
                                      speculative_draft_model="org/eagle3-head"))
    assert eagle.methods == ("eagle3",) and not eagle.dropped
    assert draft_kv_layers(GLM, 3) == 1 and draft_kv_layers(QWEN, 2) == 1 and draft_kv_layers(GLM, 0) == 0
    assert SpeculativeChoices().knobs() == {}


# ---- the candidate --------------------------------------------------------------------------------

def _candidate(sel, **over):
    base = {"deployment_mode": "agg", "backend": "sglang", "router_mode": "round_robin",
            "planner_scaling_policy": "disabled", "agg_max_num_seqs": 256, "agg_max_num_batched_tokens": 8192}
    sp = space(deployment_mode=["agg"], backend=["sglang"], router_mode=["round_robin"],
               planner_scaling_policy=["disabled"], agg_max_num_seqs=[256], agg_max_num_batched_tokens=[8192], **over)
    return build_candidate(sp, {**base, **sel}, RoleShape(tp=8, moe_tp=8))


def test_a_speculating_candidate_carries_method_and_tokens_only_when_on():
    off = _candidate({})
    assert off.draft_tokens == 0 and off.draft_method is None
    assert not any(k.startswith("speculative") for k in off.to_dict())
    for sel in ({"speculative_method": "mtp", "speculative_num_tokens": 0},
                {"speculative_method": "none", "speculative_num_tokens": 3}):
        assert _candidate(sel, speculative_method=["mtp", "none"]).to_dict() == off.to_dict()
    on = _candidate({"speculative_method": "mtp", "speculative_num_tokens": 3.0}, speculative_method="mtp")
    flat = on.to_dict()
    assert (flat["speculative_method"], flat["speculative_num_tokens"]) == ("mtp", 3)
    assert "speculative_draft_model" not in flat
    assert on.draft_tokens == 3 and on.draft_method == "mtp"
    assert Candidate.from_dict(flat) == on
    legacy = agg_candidate(aic_nextn=2)
    assert legacy.draft_tokens == 2 and legacy.draft_method == "mtp"


# ---- replay arguments (fake facts) ------------------------------------------------------------------

def _call(candidate, workload):
    derived: dict = {}
    facts = FakeFacts()
    call = build_replay_call(EvalRequest(candidate, workload, THROUGHPUT), ReplaySettings(), facts, derived)
    return call, derived, facts


def test_decoding_engines_draft_with_the_workloads_acceptance():
    c = disagg_candidate(speculative_method="mtp", speculative_num_tokens=3)
    call, derived, facts = _call(c, {**SYNTH, "speculative_acceptance": [0.8, 0.6, 0.4]})
    decode, prefill = call.kwargs["decode_engine_args"]["engine"], call.kwargs["prefill_engine_args"]["engine"]
    assert decode["aic_nextn"] == 3 and decode["aic_nextn_accept_rates"] == "0.8,0.6,0.4"
    assert "aic_nextn" not in prefill  # a prefill engine does not decode
    assert {i.nextn for i in facts.identities} == {3}  # both roles hold the draft layers (timing and KV)
    assert derived["speculative"] == {"method": "mtp", "draft_tokens": 3, "acceptance": [0.8, 0.6, 0.4],
                                      "tokens_per_step": pytest.approx(1 + 0.8 + 0.48 + 0.192)}
    assert "decode_mtp_nextn" not in derived


def test_the_ramp_counts_the_tokens_a_speculative_step_yields():
    plain, _, _ = _call(agg_candidate(), SYNTH)
    spec, _, _ = _call(agg_candidate(speculative_method="mtp", speculative_num_tokens=1),
                       {**SYNTH, "speculative_acceptance": 1.0})
    # the fake decode step is 10 ms either way; one always-accepted draft halves a request's decode time
    assert spec.derived["ramp"]["cycle_ms"] == pytest.approx(100 + 99 * 10 / 2)
    assert plain.derived["ramp"]["cycle_ms"] == pytest.approx(100 + 99 * 10)


def test_speculating_without_acceptance_fails_the_candidate_but_aic_nextn_keeps_the_replays_rates():
    with pytest.raises(CandidateBuildError, match="needs workload.speculative_acceptance"):
        _call(agg_candidate(speculative_method="mtp", speculative_num_tokens=2), SYNTH)
    call, derived, _ = _call(agg_candidate(aic_nextn=2), SYNTH)
    engine = call.kwargs["extra_engine_args"]["engine"]
    assert engine["aic_nextn"] == 2 and "aic_nextn_accept_rates" not in engine
    assert derived["agg_mtp_nextn"] == 2 and "speculative" not in derived


# ---- DGD flags --------------------------------------------------------------------------------------

def _args(doc, component):
    for comp in doc["spec"]["components"]:
        if comp["name"] == component:
            return comp["podTemplate"]["spec"]["containers"][0]["args"]
    raise KeyError(component)


def test_vllm_manifest_carries_the_speculative_config():
    c = agg_candidate(speculative_method="mtp", speculative_num_tokens=3)
    doc = dgd_manifest(c, name="spica-qwen-agg-1")
    assert validate_manifest(doc) == []
    args = _args(doc, "VllmWorker")
    assert json.loads(args[args.index("--speculative-config") + 1]) == {"method": "mtp", "num_speculative_tokens": 3}
    eagle = agg_candidate(speculative_method="eagle3", speculative_num_tokens=2, speculative_draft_model="org/head")
    args = _args(dgd_manifest(eagle, name="spica-qwen-agg-1"), "VllmWorker")
    assert json.loads(args[args.index("--speculative-config") + 1]) == {
        "method": "eagle3", "num_speculative_tokens": 2, "model": "org/head"}
    assert "--speculative-config" not in _args(dgd_manifest(agg_candidate(), name="spica-qwen-agg-1"), "VllmWorker")


def test_sglang_manifest_carries_the_speculative_algorithm_on_every_role():
    c = disagg_candidate(backend="sglang", speculative_method="mtp", speculative_num_tokens=3)
    doc = dgd_manifest(c, name="spica-glm-disagg-1")
    assert validate_manifest(doc) == []
    for component in ("SglangPrefillWorker", "SglangDecodeWorker"):
        args = _args(doc, component)
        flags = dict(zip(args[args.index("--speculative-algorithm")::2], args[args.index("--speculative-algorithm") + 1::2]))
        assert flags == {"--speculative-algorithm": "NEXTN", "--speculative-num-steps": "3",
                         "--speculative-eagle-topk": "1", "--speculative-num-draft-tokens": "4"}
    eagle = disagg_candidate(backend="sglang", speculative_method="eagle3", speculative_num_tokens=1,
                             speculative_draft_model="org/head")
    args = _args(dgd_manifest(eagle, name="spica-glm-disagg-1"), "SglangDecodeWorker")
    assert args[args.index("--speculative-algorithm") + 1] == "EAGLE3"
    assert args[args.index("--speculative-draft-model-path") + 1] == "org/head"


# ---- timing and KV with the draft layers (real aiconfigurator-core) ------------------------------

@pytest.mark.integration
def test_a_draft_table_is_aics_decode_step_with_k_plus_one_verified_tokens():
    from aiconfigurator_core.sdk.engine import EngineHandle

    from spica_pipeline.evaluate import timing
    from spica_pipeline.space.model_hw import QuietAIC, latest_backend_version

    version = latest_backend_version("h200_sxm", "vllm")
    ident = timing.EngineIdentity(QWEN, "h200_sxm", "vllm", version, tp=2, nextn=2)
    with QuietAIC():
        handle = EngineHandle.compile(QWEN, "h200_sxm", "vllm", backend_version=version, tp_size=2, nextn=2)
        aic = handle.decode_step_latency(16, 4096, 2)
    assert timing._AicStep(ident).decode(16, 4096) == pytest.approx(aic, rel=1e-3)
    plain = timing._AicStep(timing.EngineIdentity(QWEN, "h200_sxm", "vllm", version, tp=2))
    assert timing._AicStep(ident).decode(16, 4096) > plain.decode(16, 4096)
    assert timing.verify_width(ident) == 3


@pytest.mark.integration
def test_the_kv_estimate_holds_the_draft_layers():
    from spica_pipeline.space.kv import estimate_kv
    from spica_pipeline.space.model_hw import latest_backend_version, model_facts

    version = latest_backend_version("h200_sxm", "sglang")
    shape = (8, 1, 1, 8, 1)
    tokens0, per0 = estimate_kv(GLM, "h200_sxm", "sglang", version, shape)
    tokens3, per3 = estimate_kv(GLM, "h200_sxm", "sglang", version, shape, nextn=3)
    layers = model_facts(GLM).num_layers
    assert per3 == -(-per0 * (layers + 1) // layers)  # one MTP layer of KV per token
    assert tokens3 < tokens0 * layers / (layers + 1)  # and its weights out of the budget


# ---- the done-when: GLM-5-FP8 on 8 H200, TP8, acceptance 0.7 ---------------------------------------

@pytest.mark.integration
@pytest.mark.slow
def test_three_mtp_tokens_cut_glm5_tpot_to_under_three_quarters(tmp_path):
    from spica_pipeline.evaluate.replay import ReplayEvaluator
    from spica_pipeline.space.model_hw import latest_backend_version

    config = load_config(Path(__file__).resolve().parents[1] / "examples" / "configs" / "speculative.yaml")
    workload = config.workload.model_dump(mode="json")
    version = latest_backend_version("h200_sxm", "sglang")
    evaluator = ReplayEvaluator(cache_dir=str(tmp_path))
    tpot = {}
    for tokens in (0, 3):
        c = _candidate({"speculative_method": "mtp", "speculative_num_tokens": tokens}, speculative_method="mtp")
        c = Candidate.from_dict({**c.to_dict(), "backend_version": version, "concurrency": 16})
        out = evaluator.evaluate(EvalRequest(c, workload, {"target": "throughput_per_user", "sla": None,
                                                           "pareto_objectives": None}))
        assert out.status == "feasible", out.reason
        tpot[tokens] = out.report["mean_tpot_ms"]
    assert tpot[3] <= 0.75 * tpot[0], tpot
