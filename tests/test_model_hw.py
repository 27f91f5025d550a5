import pytest

from spica_pipeline.errors import ModelHardwareError, NoPerfDatabase
from spica_pipeline.space import model_hw
from spica_pipeline.space.model_hw import (
    available_models,
    available_systems,
    enable_wideep,
    hardware_facts,
    latest_backend_version,
    model_facts,
    supported_backends,
)

pytestmark = pytest.mark.integration  # real aiconfigurator-core data, no network


def test_dense_and_moe_model_facts():
    dense = model_facts("Qwen/Qwen3-32B")
    assert not dense.is_moe and dense.architecture == "Qwen3ForCausalLM"
    assert dense.max_context_length == 40960
    assert 60e9 < dense.weight_bytes < 70e9  # 32.8B params in bf16
    moe = model_facts("Qwen/Qwen3-30B-A3B")
    assert moe.is_moe and moe.num_experts == 128 and moe.experts_per_token == 8
    assert not moe.is_mla  # GQA MoE allow-list
    assert model_facts("deepseek-ai/DeepSeek-V3").is_mla
    assert model_facts("Qwen/Qwen3-30B-A3B") is moe  # memoised


def test_hardware_facts_and_wideep():
    h200 = hardware_facts("h200_sxm")
    assert h200.gpus_per_node == 8 and h200.vram_bytes == 151397597184
    assert not enable_wideep(model_facts("Qwen/Qwen3-30B-A3B"), h200)
    assert enable_wideep(model_facts("deepseek-ai/DeepSeek-V3"), h200)  # 8 x 141 GiB < 2 x ~660 GiB
    assert not enable_wideep(model_facts("meta-llama/Meta-Llama-3.1-405B"), h200)  # dense


def test_supported_backends_and_latest_version_from_query_slots():
    from aiconfigurator_core.sdk.perf_database import get_supported_databases

    slots = get_supported_databases()["h200_sxm"]
    backends = supported_backends("h200_sxm")
    assert set(backends) == {"vllm", "sglang", "trtllm"}
    for backend, versions in backends.items():
        assert sorted(versions) == sorted(slots[backend])
    assert latest_backend_version("h200_sxm", "vllm") == "0.27.0"
    assert latest_backend_version("h200_sxm", "trtllm") == "1.3.0rc23"  # rc23 > rc20, not lexical
    assert latest_backend_version("a100_sxm", "sglang") == "0.5.10"


def test_no_perf_database():
    assert supported_backends("a100_pcie") == {}  # a spec without data
    with pytest.raises(NoPerfDatabase, match="backend='sglang' on hardware_sku='b60'; available there: vllm"):
        latest_backend_version("b60", "sglang")
    with pytest.raises(NoPerfDatabase, match="available there: none"):
        latest_backend_version("a100_pcie", "vllm")


def test_unknown_sku_is_one_line_with_closest_first():
    with pytest.raises(ModelHardwareError) as err:
        hardware_facts("h200")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("unknown hardware_sku 'h200'; available: h200_sxm")
    with pytest.raises(ModelHardwareError, match="unknown hardware_sku"):
        supported_backends("tpu_v5")


def test_unknown_model_is_one_line_with_the_three_closest():
    with pytest.raises(ModelHardwareError) as err:
        model_facts("Qwen/Qwen3-33B")
    msg = str(err.value)
    assert "\n" not in msg and "not one of aiconfigurator-core's shipped offline models" in msg
    assert f"closest: Qwen/Qwen3-32B, Qwen/Qwen3-8B, Qwen/Qwen3-30B-A3B ({len(available_models())} in all)" in msg
    assert len(msg) < 400


def test_available_lists():
    assert "h200_sxm" in available_systems() and "a100_pcie" in available_systems()
    assert "query_versions" not in available_systems()
    models = available_models()
    assert "Qwen/Qwen3-235B-A22B" in models and list(models) == sorted(models)


def test_one_line_choices_truncates():
    text = model_hw._one_line_choices("b", [f"n{i}" for i in range(30)], limit=4)
    assert text.endswith("(+26 more)")


def test_the_perf_database_index_is_kept_on_disk_and_read_back(monkeypatch, tmp_path):
    """aiconfigurator-core's database index costs seconds at every command's start: it is cached under
    $SPICA_CACHE_DIR per installed version, read back equal, and recomputed when the file is unreadable."""
    monkeypatch.setenv("SPICA_CACHE_DIR", str(tmp_path))
    model_hw._supported_databases.cache_clear()
    first = model_hw._supported_databases()
    (index,) = (tmp_path / "aic-databases").glob("*.json")
    model_hw._supported_databases.cache_clear()
    assert model_hw._supported_databases() == first
    index.write_text("{not json")
    model_hw._supported_databases.cache_clear()
    assert model_hw._supported_databases() == first
    assert model_hw._supported_databases()["h200_sxm"]["vllm"]
    model_hw._supported_databases.cache_clear()
