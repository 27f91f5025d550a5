"""Names (space/model_hw.py): Hugging Face ids and aliases resolve to the model aiconfigurator-core
ships, GPU names to its system ids, a local config.json of a supported architecture is a model, and
an unknown name is refused on one line with the three closest names, closest first."""

import json
from importlib import resources

import pytest

from spica_pipeline.errors import ModelHardwareError
from spica_pipeline.space import model_hw
from spica_pipeline.space.model_hw import closest, model_facts, resolve_hardware, resolve_model

pytestmark = pytest.mark.integration  # real aiconfigurator-core data, no network


@pytest.mark.parametrize("given,shipped", [
    ("meta-llama/Llama-3.1-70B-Instruct", "meta-llama/Meta-Llama-3.1-70B"),  # the HF id of the instruct model
    ("Llama-3.1-70B-Instruct", "meta-llama/Meta-Llama-3.1-70B"),  # without the org
    ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Meta-Llama-3.1-8B"),
    ("meta-llama/Llama-3.3-70B-Instruct", "meta-llama/Meta-Llama-3.1-70B"),  # a later release, same shape
    ("meta-llama/Llama-3.1-70B-Instruct-FP8", "nvidia/Llama-3.1-70B-Instruct-FP8"),  # quantized stays quantized
    ("qwen/qwen3-32b", "Qwen/Qwen3-32B"),  # case
    ("Qwen/Qwen3-8B-Base", "Qwen/Qwen3-8B"),
    ("gpt-oss-120b", "openai/gpt-oss-120b"),
    ("deepseek-ai/DeepSeek-R1-0528", "deepseek-ai/DeepSeek-R1"),
])
def test_hugging_face_ids_and_aliases_resolve_to_the_shipped_model(given, shipped):
    resolved = resolve_model(given)
    assert resolved.name == shipped and resolved.given == given
    assert resolved.note("model") == f"model {given} -> {shipped} (aiconfigurator-core's shipped config of the same shape)"


def test_shipped_names_are_used_as_written():
    for name in ("Qwen/Qwen3-32B", "Qwen/Qwen3-32B-FP8", "nvidia/Llama-3.1-70B-Instruct-FP8"):
        resolved = resolve_model(name)
        assert resolved.name == name and resolved.how is None and resolved.note("model") is None


def test_every_shipped_model_has_its_own_key():
    """No two shipped models collapse to one alias key (an alias would then be ambiguous)."""
    assert all(len(names) == 1 for names in model_hw._models_by_key().values())
    assert all(resolve_model(name).name == name for name in model_hw.available_models())


def test_an_unknown_model_suggests_the_three_closest_on_one_line():
    with pytest.raises(ModelHardwareError) as info:
        resolve_model("Qwen/Qwen3-33B")
    message = str(info.value)
    assert "\n" not in message
    assert message == ("search_space.model_name 'Qwen/Qwen3-33B' is not a model aiconfigurator-core ships, a "
                       "Hugging Face id of one, or a local directory holding a config.json; closest: "
                       f"Qwen/Qwen3-32B, Qwen/Qwen3-8B, Qwen/Qwen3-30B-A3B ({len(model_hw.available_models())} "
                       "in all); `spica list models` prints them")


def test_closest_is_sorted_by_closeness_then_name():
    assert closest("abcd", ["abce", "abcd", "zzzz", "abzz"]) == ["abcd", "abce", "abzz"]
    assert closest("x", ["b", "a"], n=2) == ["a", "b"]  # equally far: by name
    assert closest("abc", ["abd"], n=3) == ["abd"]


@pytest.mark.parametrize("given,system", [
    ("h200_sxm", "h200_sxm"), ("H200", "h200_sxm"), ("h100", "h100_sxm"), ("H100 SXM", "h100_sxm"),
    ("a100", "a100_sxm"), ("B200", "b200_sxm"), ("GB200", "gb200"), ("nvidia-h200", "h200_sxm"),
    ("RTX PRO 6000", "rtx_pro_6000_server"),
])
def test_gpu_names_resolve_to_a_system(given, system):
    assert resolve_hardware(given).name == system


def test_an_unknown_gpu_suggests_the_three_closest():
    with pytest.raises(ModelHardwareError) as info:
        resolve_hardware("l40")
    assert str(info.value) == ("search_space.hardware_sku 'l40' is not a GPU system aiconfigurator-core knows; "
                               f"closest: l40s, l4, a30 ({len(model_hw.available_systems())} in all); "
                               "`spica list hardware` prints them")


def _local(tmp_path, config: dict, name: str = "model"):
    directory = tmp_path / name
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def _shipped(model: str) -> dict:
    path = resources.files("aiconfigurator_core") / "model_configs" / f"{model.replace('/', '--')}_config.json"
    return json.loads(path.read_text())


def test_a_local_config_json_is_a_model(tmp_path):
    directory = _local(tmp_path, _shipped("Qwen/Qwen3-32B"))
    for given in (str(directory), str(directory / "config.json")):
        resolved = resolve_model(given)
        assert resolved.name == str(directory)
        assert resolved.how == "local config.json, Qwen3ForCausalLM, aiconfigurator-core family LLAMA"
    local, shipped = model_facts(str(directory)), model_facts("Qwen/Qwen3-32B")
    assert local.weight_bytes == shipped.weight_bytes and local.max_context_length == shipped.max_context_length
    model_hw.check_model(str(directory))  # the enumeration accepts it


def test_a_local_config_of_an_unsupported_architecture_is_refused_with_the_reason(tmp_path):
    config = {**_shipped("Qwen/Qwen3-32B"), "architectures": ["MistralForCausalLM"]}
    directory = _local(tmp_path, config)
    with pytest.raises(ModelHardwareError) as info:
        resolve_model(str(directory))
    message = str(info.value)
    assert message.startswith(f"search_space.model_name: {directory / 'config.json'} is a MistralForCausalLM, "
                              "which aiconfigurator-core cannot model; closest: ")
    assert "\n" not in message


def test_a_local_config_aic_cannot_read_is_refused_with_its_words(tmp_path):
    config = {k: v for k, v in _shipped("Qwen/Qwen3-32B").items() if k != "num_hidden_layers"}
    directory = _local(tmp_path, config)
    with pytest.raises(ModelHardwareError, match=r"aiconfigurator-core cannot read .*config.json \(Qwen3ForCausalLM\)"):
        resolve_model(str(directory))


@pytest.mark.parametrize("write,words", [
    (None, "a local model is a directory holding a Hugging Face config.json"),
    ("not json", "cannot read"),
    ('{"model_type": "llama"}', "names no architectures"),
])
def test_a_path_without_a_usable_config_json_is_refused(tmp_path, write, words):
    directory = tmp_path / "m"
    directory.mkdir()
    if write is not None:
        (directory / "config.json").write_text(write)
    with pytest.raises(ModelHardwareError, match=words):
        resolve_model(str(directory))


def test_a_missing_path_is_refused_not_looked_up():
    with pytest.raises(ModelHardwareError, match="there is none there"):
        resolve_model("./models/none-here")
