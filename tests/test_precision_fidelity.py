"""Issue 14 item 3: precision as a config choice, perf-data fallbacks with a fidelity_note, cache keys
that include every input, and a backend AIC cannot time dropped before sampling."""

import json
import sys
from dataclasses import replace

import pydantic
import pytest
from test_deploy import agg_candidate, agg_sample
from test_engine_args import FakeFacts, build

from spica_pipeline.config import SmartSearchConfig
from spica_pipeline.config.precision import CHOICES, Precision, precision_of
from spica_pipeline.errors import ModelHardwareError, PerfModelError
from spica_pipeline.evaluate import timing
from spica_pipeline.space import branches as branches_mod
from spica_pipeline.space import perf_data
from spica_pipeline.space.engine import EngineIdentity

MLA_MISSING = ('perf database error: context MLA data missing for ContextKey { fmha_quant: "fp8", '
               'kv_quant: "fp8" } at /x/h200_sxm/sglang/0.5.16')


class PerfDataNotAvailableError(RuntimeError):
    """Stands in for aiconfigurator-core's error of the same name (matched by name, as AIC's is)."""


DS = EngineIdentity("deepseek-ai/DeepSeek-V3", "h200_sxm", "sglang", "0.5.16", tp=8, moe_ep=8)


# ---- precision config ----------------------------------------------------------------------------

def test_precision_choices_validated_with_the_valid_list():
    assert Precision(weights="fp8", kv_cache="bf16").kv_cache == "bfloat16"  # alias
    with pytest.raises(pydantic.ValidationError, match=r"valid choices: \['bfloat16', 'fp8', 'int8'\]"):
        Precision(kv_cache="fp4")
    p = Precision(weights="fp8", kv_cache="fp8")
    assert p.sample_fields() == {"precision_weights": "fp8", "precision_kv_cache": "fp8"}
    assert precision_of(p.sample_fields()) == {"weights": "fp8", "kv_cache": "fp8"}


def test_precision_names_are_aics():
    """Every choice is a quant mode aiconfigurator-core's KV estimator knows under that name."""
    from aiconfigurator_core.sdk import common

    enums = {"weights": common.GEMMQuantMode, "moe": common.MoEQuantMode, "attention": common.FMHAQuantMode,
             "kv_cache": common.KVCacheQuantMode}
    for field, modes in CHOICES.items():
        assert set(modes) <= {m.name for m in enums[field]}, field


@pytest.mark.integration
def test_unsupported_precision_names_field_and_choices():
    from spica_pipeline.space.model_hw import check_precision

    check_precision(Precision(weights="fp8", kv_cache="fp8"), "Qwen/Qwen3-32B", "h200_sxm")
    with pytest.raises(ModelHardwareError, match=r"search_space.precision.weights: 'nvfp4' .* valid choices: "
                                                 r"\['bfloat16', 'fp8', 'fp8_static', 'fp8_block'\]"):
        check_precision(Precision(weights="nvfp4"), "Qwen/Qwen3-32B", "h200_sxm")
    with pytest.raises(ModelHardwareError, match="search_space.precision.moe: .* has no experts"):
        check_precision(Precision(moe="fp8"), "Qwen/Qwen3-32B", "h200_sxm")


@pytest.mark.integration
def test_cli_validate_unsupported_precision_exit_2(tmp_path, capsys):
    from spica_pipeline.cli import main

    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps({
        "search_space": {"model_name": "Qwen/Qwen3-32B", "hardware_sku": "h200_sxm", "gpu_budget": 8,
                         "precision": {"weights": "nvfp4"}},
        "workload": {"isl": 100, "osl": 10, "request_rate": 1.0, "num_request_ratio": 2.0}}))
    assert main(["validate", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "search_space.precision.weights" in err[0] and "valid choices" in err[0]


def test_precision_travels_in_sample_identity_and_deploy_flags():
    from spica_pipeline.report.dgd import sglang_args, vllm_args
    from spica_pipeline.space.candidate import build_candidate
    from spica_pipeline.space.shapes import RoleShape

    space = SmartSearchConfig.from_dict({
        "search_space": {"model_name": "Qwen/Qwen3-32B", "hardware_sku": "h200_sxm", "deployment_mode": ["agg"],
                         "precision": {"weights": "fp8", "kv_cache": "fp8"}},
        "workload": {"isl": 100, "osl": 10, "request_rate": 1.0, "num_request_ratio": 2.0}}).search_space
    selection = {k: v[0] for k, v in space.choice_lists().items() if v}
    candidate = build_candidate(space, selection, RoleShape(tp=2))
    assert candidate.precision == {"weights": "fp8", "kv_cache": "fp8"}
    sample = candidate.to_dict()
    assert sample["precision_weights"] == "fp8" and sample["precision_kv_cache"] == "fp8"
    facts = FakeFacts()
    build({**agg_sample(), **precision_of_fields(sample)}, facts=facts)
    assert {(i.weight_dtype, i.kv_cache_dtype, i.attention_dtype) for i in facts.identities} == {("fp8", "fp8", None)}
    fp8 = agg_candidate(**precision_of_fields(sample))
    assert vllm_args(fp8, fp8.role("agg"))[-4:] == ["--quantization", "fp8", "--kv-cache-dtype", "fp8"]
    fp8_sglang = agg_candidate(backend="sglang", **precision_of_fields(sample))
    assert sglang_args(fp8_sglang, fp8_sglang.role("agg"))[-4:] == ["--quantization", "fp8", "--kv-cache-dtype",
                                                                     "fp8_e4m3"]
    plain = agg_candidate()
    assert "--quantization" not in vllm_args(plain, plain.role("agg"))


def precision_of_fields(sample):
    return {k: v for k, v in sample.items() if k.startswith("precision_")}


def test_unset_precision_leaves_the_sample_unchanged():
    from spica_pipeline.space.candidate import build_candidate
    from spica_pipeline.space.shapes import RoleShape

    space = SmartSearchConfig.from_dict({
        "search_space": {"model_name": "Qwen/Qwen3-32B", "hardware_sku": "h200_sxm", "deployment_mode": ["agg"]},
        "workload": {"isl": 100, "osl": 10, "request_rate": 1.0, "num_request_ratio": 2.0}}).search_space
    selection = {k: v[0] for k, v in space.choice_lists().items() if v}
    assert not any(k.startswith("precision_") for k in build_candidate(space, selection, RoleShape(tp=2)).to_dict())


# ---- fallback notes ------------------------------------------------------------------------------

def _fake_aic(missing_for):
    """build/probe pair: an identity whose (attention, kv) dtypes are in `missing_for` has no data."""
    built = []

    def build(identity):
        built.append(identity)
        return identity

    def probe(identity):
        if (identity.attention_dtype, identity.kv_cache_dtype) in missing_for:
            raise PerfDataNotAvailableError(MLA_MISSING)

    return build, probe, built


def test_missing_mla_data_falls_back_to_bf16_attention_with_a_note():
    build, probe, built = _fake_aic({(None, None)})
    model, note = perf_data.timed_model(DS, build, probe)
    assert model.attention_dtype == "bfloat16" and model.kv_cache_dtype is None  # nearest: attention only
    assert note == ("sglang 0.5.16 perf data on h200_sxm has no MLA attention data (fmha fp8, kv fp8) for "
                    "deepseek-ai/DeepSeek-V3; timed with the nearest available data: bf16 attention")
    build, probe, built = _fake_aic({(None, None), ("bfloat16", None)})
    model, note = perf_data.timed_model(DS, build, probe)
    assert (model.attention_dtype, model.kv_cache_dtype) == ("bfloat16", "bfloat16")
    assert note.endswith("bf16 attention and bf16 KV")


def test_exact_data_has_no_note_and_other_errors_are_not_substituted():
    build, probe, built = _fake_aic(set())
    assert perf_data.timed_model(DS, build, probe) == (DS, None) and built == [DS]

    def other(identity):
        raise PerfDataNotAvailableError("perf database error: gemm data missing for fp8")

    with pytest.raises(PerfDataNotAvailableError, match="gemm data missing"):
        perf_data.timed_model(DS, lambda i: i, other)
    everything = {(a, k) for a in (None, "bfloat16") for k in (None, "bfloat16")}
    build, probe, built = _fake_aic(everything)
    with pytest.raises(PerfDataNotAvailableError):  # no fallback serves it: the original error
        perf_data.timed_model(DS, build, probe)


def test_floored_fp8_block_gemm_data_is_timed_with_per_tensor_data_and_noted(monkeypatch):
    """Round 9: vLLM's fp8_block GEMM data on the chosen systems is a flat floor; dense GEMMs use fp8 data."""
    monkeypatch.setattr(perf_data, "GEMM_PER_TENSOR", frozenset({("vllm", "b200_sxm")}))
    monkeypatch.setattr(perf_data, "checkpoint_quant", lambda model: {"block": "fp8_block", "fp4": "nvfp4"}.get(model))
    block = EngineIdentity("block", "b200_sxm", "vllm", "0.24.0", tp=4, moe_tp=4)
    build, probe, built = _fake_aic(set())
    model, note = perf_data.timed_model(block, build, probe)
    assert model == replace(block, weight_dtype="fp8") and model.moe_dtype is None  # the MoE keeps its data
    assert note == ("vllm 0.24.0 fp8_block GEMM data on b200_sxm is flat in the token count (a measurement "
                    "floor); dense GEMMs timed with the per-tensor fp8 data")
    for exact in (replace(block, model="fp4"), replace(block, system="h200_sxm"), replace(block, backend="sglang"),
                  replace(block, weight_dtype="bfloat16")):
        assert perf_data.gemm_substitute(exact) is None and perf_data.timed_model(exact, build, probe) == (exact, None)
    assert perf_data.gemm_substitute(replace(block, model="fp4", weight_dtype="fp8_block")) is not None  # pinned


def test_timing_key_names_the_gemm_data(no_aic_tables, tmp_path, monkeypatch):
    block = EngineIdentity("block", "b200_sxm", "vllm", "1")
    monkeypatch.setattr(perf_data, "checkpoint_quant", lambda model: "fp8_block")
    first = timing.timing_table(block, cache_dir=tmp_path).key
    monkeypatch.setattr(perf_data, "GEMM_PER_TENSOR", frozenset())
    assert timing.timing_table(block, cache_dir=tmp_path).key != first


def test_fidelity_note_reaches_derived():
    class NotedFacts(FakeFacts):
        def timing_table(self, identity, *, max_num_batched_tokens):
            table = super().timing_table(identity, max_num_batched_tokens=max_num_batched_tokens)
            table.fidelity_note = "no fp8 MLA data; bf16 attention"
            return table

    _, derived = build(agg_sample(), facts=NotedFacts())
    assert derived["fidelity_note"] == "no fp8 MLA data; bf16 attention"
    _, derived = build(agg_sample())
    assert "fidelity_note" not in derived  # exact data: nothing recorded, the ledger is unchanged


@pytest.mark.integration
def test_deepseek_on_sglang_is_timed_with_a_note():
    """The real case from the issue: SGLang's H200 data has only bf16 MLA."""
    note = perf_data.check_timing(DS)
    assert note is not None and "MLA attention" in note and "bf16 attention" in note


# ---- cache keys ----------------------------------------------------------------------------------

@pytest.fixture
def no_aic_tables(monkeypatch):
    calls = []

    def fake_build(identity, top):
        calls.append(identity)
        return {"prefill_isl": timing.np.array([1.0])}

    monkeypatch.setattr(timing, "build_timing_arrays", fake_build)
    monkeypatch.setattr(timing, "fidelity_note_of", lambda identity: "substitute data"
                        if identity.attention_dtype is None else None)
    monkeypatch.setattr(timing, "_timing_memo", {})
    return calls


def test_timing_key_includes_every_dtype(no_aic_tables, tmp_path):
    base = EngineIdentity("m", "s", "vllm", "1")
    keys = {timing.timing_table(base, cache_dir=tmp_path).key}
    for field in ("weight_dtype", "moe_dtype", "attention_dtype", "kv_cache_dtype"):
        keys.add(timing.timing_table(EngineIdentity("m", "s", "vllm", "1", **{field: "fp8"}), cache_dir=tmp_path).key)
    assert len(keys) == 5 and len(no_aic_tables) == 5
    assert timing.timing_table(base, cache_dir=tmp_path).key in keys and len(no_aic_tables) == 5  # cached


def test_timing_key_includes_the_grid(no_aic_tables, tmp_path, monkeypatch):
    base = EngineIdentity("m", "s", "vllm", "1")
    first = timing.timing_table(base, cache_dir=tmp_path).key
    monkeypatch.setattr(timing, "TIME_SCALE", 100.0)
    assert timing.timing_table(base, cache_dir=tmp_path).key != first


def test_fidelity_note_survives_the_disk_cache(no_aic_tables, tmp_path, monkeypatch):
    base = EngineIdentity("m", "s", "vllm", "1")
    assert timing.timing_table(base, cache_dir=tmp_path).fidelity_note == "substitute data"
    monkeypatch.setattr(timing, "_timing_memo", {})  # a new process: read back from disk
    again = timing.timing_table(base, cache_dir=tmp_path)
    assert again.fidelity_note == "substitute data" and len(no_aic_tables) == 1


def test_kv_key_includes_every_dtype(monkeypatch, tmp_path):
    seen = []

    def fake_estimate(identity, *args):
        seen.append(identity)
        return timing.KvCapacity(1000, 10)

    monkeypatch.setattr(timing, "_estimate_kv", fake_estimate)
    monkeypatch.setattr(timing, "_kv_memo", {})
    knobs = dict(max_num_tokens=8192, max_batch_size=256, memory_fraction=0.9, cache_dir=tmp_path)
    for field in (None, "weight_dtype", "moe_dtype", "attention_dtype", "kv_cache_dtype"):
        timing.kv_capacity(EngineIdentity("m", "s", "vllm", "1", **({field: "fp8"} if field else {})), **knobs)
    assert len(seen) == 5


def test_kv_estimate_passes_the_precision(monkeypatch):
    from spica_pipeline.space import kv

    got = {}

    def fake(*args, **kwargs):
        got.update(kwargs)
        return {"total_kv_size_tokens": 10, "kv_size_per_token_bytes": 2}

    monkeypatch.setitem(sys.modules, "aiconfigurator_core.sdk.memory", type(sys)("fake_memory"))
    sys.modules["aiconfigurator_core.sdk.memory"].estimate_kv_cache = fake
    kv._estimate.cache_clear()
    kv.estimate_kv("m", "s", "vllm", "1", (1, 1, 1, 1, 1), precision=("fp8", None, "fp8", "bfloat16"))
    kv._estimate.cache_clear()
    assert (got["gemm_quant_mode"], got["kvcache_quant_mode"], got["fmha_quant_mode"]) == ("fp8", "fp8", "bfloat16")


# ---- a backend AIC cannot time is dropped before sampling -----------------------------------------

@pytest.mark.integration
def test_backend_without_perf_data_dropped_with_one_warning(monkeypatch):
    def check(space, backend, config, system=None):
        if backend == "sglang":
            raise PerfModelError.wrap(PerfDataNotAvailableError("perf database error: context MLA data missing"))
        return None

    monkeypatch.setattr(branches_mod, "timing_check", check)
    monkeypatch.setattr(branches_mod, "_timing_may_lack_data", lambda space: True)
    cfg = SmartSearchConfig.from_dict({
        "search_space": {"model_name": "Qwen/Qwen3-32B", "hardware_sku": "h200_sxm", "gpu_budget": 4,
                         "backend": ["sglang", "vllm"], "deployment_mode": ["agg", "disagg"],
                         "router_mode": ["round_robin"], "planner_scaling_policy": ["disabled"]},
        "workload": {"isl": 100, "osl": 10, "request_rate": 1.0, "num_request_ratio": 2.0}})
    result = branches_mod.enumerate_branches(cfg)
    assert all(b.knob_choices["backend"] == ["vllm"] for b in result.branches) and len(result.branches) == 2
    dropped = [w for w in result.warnings if "'sglang'" in w]
    assert dropped == ["smart-sweep: backend 'sglang' dropped: aiconfigurator-core's perf data cannot time "
                       "Qwen/Qwen3-32B on h200_sxm: PerfDataNotAvailableError: perf database error: context MLA "
                       "data missing"]
    assert all("no perf data" in result.diagnostics[m]["sglang"]["error"] for m in ("agg", "disagg"))


@pytest.mark.integration
def test_a_shape_refusal_does_not_drop_the_backend(monkeypatch):
    def check(space, backend, config, system=None):
        raise PerfModelError.wrap(ValueError("Parallelism width mismatch"))

    monkeypatch.setattr(branches_mod, "timing_check", check)
    monkeypatch.setattr(branches_mod, "_timing_may_lack_data", lambda space: True)
    cfg = SmartSearchConfig.from_dict({
        "search_space": {"model_name": "Qwen/Qwen3-32B", "hardware_sku": "h200_sxm", "gpu_budget": 4,
                         "backend": ["vllm"], "deployment_mode": ["agg"], "router_mode": ["round_robin"],
                         "planner_scaling_policy": ["disabled"]},
        "workload": {"isl": 100, "osl": 10, "request_rate": 1.0, "num_request_ratio": 2.0}})
    result = branches_mod.enumerate_branches(cfg)
    assert result.branches[0].knob_choices["backend"] == ["vllm"] and not any("vllm" in w for w in result.warnings)


@pytest.mark.integration
def test_probe_only_where_attention_data_has_gaps():
    def space(model, precision=None):
        data = {"model_name": model, "hardware_sku": "h200_sxm", **({"precision": precision} if precision else {})}
        return SmartSearchConfig.from_dict({"search_space": data, "workload": {
            "isl": 100, "osl": 10, "request_rate": 1.0, "num_request_ratio": 2.0}}).search_space

    assert branches_mod._timing_may_lack_data(space("deepseek-ai/DeepSeek-V3"))  # MLA
    assert not branches_mod._timing_may_lack_data(space("Qwen/Qwen3-32B"))  # dense GQA: default path
    assert branches_mod._timing_may_lack_data(space("Qwen/Qwen3-32B", {"kv_cache": "fp8"}))
