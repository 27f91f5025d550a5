"""`spica list models|hardware|backends`: the shipped names a config may use, from aiconfigurator-core."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from spica_pipeline import cli
from spica_pipeline.space.model_hw import available_models, available_systems

pytestmark = pytest.mark.integration  # real aiconfigurator-core data, no network

REPO = Path(__file__).resolve().parents[1]


def listing(capsys, *args: str) -> str:
    assert cli.main(["list", *args]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    return out


def test_list_models_prints_every_shipped_model_with_its_family(capsys):
    out = listing(capsys, "models")
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if "/" in line.split(" ")[0]}
    assert set(available_models()) <= set(rows)
    assert rows["meta-llama/Meta-Llama-3.1-70B"][:2] == ["LlamaForCausalLM", "LLAMA"]
    assert rows["deepseek-ai/DeepSeek-V3"][:3] == ["DeepseekV3ForCausalLM", "DEEPSEEK", "256"]
    assert f"{len(available_models())} models." in out
    assert "meta-llama/Llama-3.1-70B-Instruct -> meta-llama/Meta-Llama-3.1-70B" in out
    assert "MixtralForCausalLM" in out  # a local config.json may have it though no shipped model does


def test_list_hardware_gives_node_size_memory_and_backends(capsys):
    out = listing(capsys, "hardware")
    rows = {line.split()[0]: line for line in out.splitlines() if line and line.split()[0] in available_systems()}
    assert set(rows) == set(available_systems())
    assert rows["h200_sxm"].split()[1:4] == ["8", "141", "sglang,"]
    assert "none (no perf data" in rows["a100_pcie"]


def test_list_backends_names_versions_and_the_deploy_writer(capsys):
    data = json.loads(listing(capsys, "backends", "--json"))
    h200 = {row["backend"]: row for row in data if row["system"] == "h200_sxm"}
    assert set(h200) == {"vllm", "sglang", "trtllm"}
    assert h200["trtllm"]["latest"] == "1.3.0rc23" and not h200["trtllm"]["deploy_writer"]
    assert h200["vllm"]["deploy_writer"] and h200["vllm"]["latest"] == h200["vllm"]["versions"][-1]
    text = listing(capsys, "backends")
    assert "no: refused by validate and sweep" in text


def test_list_models_json(capsys):
    data = json.loads(listing(capsys, "models", "--json"))
    assert [m["name"] for m in data["models"]] == sorted(available_models(), key=str.lower)
    assert {"architecture": "LlamaForCausalLM", "family": "LLAMA"} in data["local_architectures"]


def test_an_unknown_list_is_a_usage_error(capsys):
    assert cli.main(["list", "gpus"]) == 2
    assert "invalid choice" in capsys.readouterr().err


def test_a_closed_pipe_is_not_an_error():
    proc = subprocess.run(f"{sys.executable} -m spica_pipeline list models --json | head -1", shell=True, cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout == "{\n" and proc.stderr == "", proc.stderr
