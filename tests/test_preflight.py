"""`validate` is the sweep's preflight (spica_pipeline/preflight.py): everything the sweep would refuse
before replaying fails `spica validate` with exit 2 and one line, `spica sweep` refuses it with the
same line before its first replay, and the Dagster validated_config asset fails with it too; a
Hugging Face id and a GPU alias resolve once, and the sweep replays the resolved names."""

import json
from importlib import resources
from pathlib import Path

import pytest
import yaml
from preflight_fakes import RecordingEvaluator

from spica_pipeline import cli
from spica_pipeline.config import SmartSearchConfig
from spica_pipeline.preflight import PreflightError, preflight
from spica_pipeline.report.dgd import DEPLOY_BACKENDS

pytestmark = pytest.mark.integration  # real aiconfigurator-core data, no network, no replay

BASE = {
    "search_space": {
        "model_name": "Qwen/Qwen3-32B", "hardware_sku": "h200_sxm", "gpu_budget": 2, "deployment_mode": ["agg"],
        "backend": ["vllm"], "router_mode": ["round_robin"], "planner_scaling_policy": ["disabled"],
        "agg_max_num_seqs": [256], "agg_max_num_batched_tokens": [8192],
    },
    "workload": {"isl": 512, "osl": 64, "request_rate": 4, "num_request_ratio": 10},
    "goal": {"target": "throughput_per_gpu"},
    "sweep": {"max_rounds": 1, "candidates_per_round": 2, "parallel_evals": 1, "max_eval_seconds": 60,
              "policy": "thorough", "seed": 0},
}


def config_with(space=None, workload=None, goal=None) -> dict:
    data = json.loads(json.dumps(BASE))
    data["search_space"].update(space or {})
    if workload is not None:
        data["workload"] = workload
    data["goal"].update(goal or {})
    return data


def write(tmp_path: Path, data: dict, name: str = "c.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def validate(path: Path, capsys) -> tuple[int, str, list[str]]:
    code = cli.main(["validate", "--config", str(path)])
    out, err = capsys.readouterr()
    return code, out, [line for line in err.splitlines() if line.strip()]


def sweep(path: Path, tmp_path: Path, capsys) -> tuple[int, list[str], list[dict]]:
    calls = tmp_path / "calls.jsonl"
    code = cli.main(["sweep", "--config", str(path), "--output-dir", str(tmp_path / "out")],
                    evaluator=RecordingEvaluator(str(calls)))
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    replays = [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []
    return code, err, replays


def shipped_config(model: str) -> bytes:
    """The config.json aiconfigurator-core ships for `model` (data installed with the project)."""
    return (resources.files("aiconfigurator_core") / "model_configs" / f"{model.replace('/', '--')}_config.json"
            ).read_bytes()


def bad_trace(tmp_path: Path) -> str:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2}\n{"timestamp": 5, "input_length"\n')
    return str(path)


# (id, how the base config changes, words the one line must hold)
REFUSALS = [
    ("trtllm", {"space": {"backend": ["trtllm"]}},
     "search_space.backend: no DynamoGraphDeployment writer for 'trtllm'"),
    ("trtllm-beside-vllm", {"space": {"backend": ["vllm", "trtllm"]}},
     "search_space.backend: no DynamoGraphDeployment writer for 'trtllm'"),
    ("unknown-model", {"space": {"model_name": "acme/secret-70b"}},
     "search_space.model_name 'acme/secret-70b' is not a model aiconfigurator-core ships"),
    ("unknown-gpu", {"space": {"hardware_sku": "tpu_v5"}},
     "search_space.hardware_sku 'tpu_v5' is not a GPU system aiconfigurator-core knows"),
    ("no-perf-data", {"space": {"hardware_sku": "a100_pcie"}},
     "no perf database for backend='vllm' on hardware_sku='a100_pcie'"),
    ("precision", {"space": {"precision": {"weights": "nvfp4"}}},
     "search_space.precision.weights: 'nvfp4' is not supported for Qwen/Qwen3-32B on h200_sxm"),
    ("weights-do-not-fit", {"space": {"model_name": "deepseek-ai/DeepSeek-V3"}},
     "no deployment_mode has a viable parallel config"),
    ("gpu-limit", {"space": {"gpu_budget": 4096}}, "search_space.gpu_budget 4096 exceeds the limit of 1024 GPUs"),
    ("context", {"workload": {"isl": 40904, "osl": 283, "request_rate": 1, "num_request_ratio": 10}},
     "= 41187 tokens exceeds the context length 40960"),
    ("policies", {"space": {"planner_scaling_policy": ["throughput_180_5"]}, "goal": {"target": "throughput"}},
     "search_space.planner_scaling_policy: every planner_scaling_policy entry enables throughput scaling"),
    ("missing-trace", {"workload": {"trace_path": "/nonexistent/trace.jsonl"}},
     "workload.trace_path '/nonexistent/trace.jsonl' does not exist"),
]


@pytest.mark.parametrize("changes,words", [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_validate_and_sweep_refuse_with_the_same_line_before_any_replay(tmp_path, capsys, changes, words):
    path = write(tmp_path, config_with(**changes))
    code, out, err = validate(path, capsys)
    assert code == 2 and out == "" and len(err) == 1, err
    assert err[0].startswith(f"invalid config {path}: ") and words in err[0], err[0]
    sweep_code, sweep_err, replays = sweep(path, tmp_path, capsys)
    assert (sweep_code, sweep_err) == (2, err)
    assert replays == [], "the sweep replayed before refusing"


def test_a_bad_trace_is_the_same_line_naming_the_file_and_line(tmp_path, capsys):
    path = write(tmp_path, config_with(workload={"trace_path": bad_trace(tmp_path)}))
    code, _, err = validate(path, capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith(f"{tmp_path / 'bad.jsonl'}:2: "), err
    assert sweep(path, tmp_path, capsys) == (2, err, [])


def test_an_unknown_algorithm_is_the_same_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SPICA_VIZIER_ALGO", "BOGUS")
    path = write(tmp_path, config_with())
    code, _, err = validate(path, capsys)
    assert code == 2 and len(err) == 1 and "SPICA_VIZIER_ALGO: unknown Vizier algorithm 'BOGUS'" in err[0]
    assert sweep(path, tmp_path, capsys) == (2, err, [])


def test_the_deploy_rule_asks_the_writer():
    assert "trtllm" not in DEPLOY_BACKENDS and set(DEPLOY_BACKENDS) == {"vllm", "sglang"}


HF_SPACE = {"model_name": "meta-llama/Llama-3.1-70B-Instruct", "hardware_sku": "H200", "gpu_budget": 4}
RESOLVED = {"model_name": "meta-llama/Meta-Llama-3.1-70B", "hardware_sku": "h200_sxm", "backend": "vllm"}


def test_a_hugging_face_id_and_a_gpu_alias_validate_and_sweep_as_the_shipped_names(tmp_path, capsys):
    path = write(tmp_path, config_with(space=HF_SPACE))
    code, out, err = validate(path, capsys)
    assert code == 0 and err == [], err
    assert ("model meta-llama/Llama-3.1-70B-Instruct -> meta-llama/Meta-Llama-3.1-70B (aiconfigurator-core's "
            "shipped config of the same shape)") in out
    assert "hardware H200 -> h200_sxm (aiconfigurator-core system with perf data)" in out
    assert "model meta-llama/Meta-Llama-3.1-70B on h200_sxm, gpu_budget 4" in out

    code, err, replays = sweep(path, tmp_path, capsys)
    assert code == 0, err
    assert "warning: model meta-llama/Llama-3.1-70B-Instruct -> meta-llama/Meta-Llama-3.1-70B " \
           "(aiconfigurator-core's shipped config of the same shape)" in err
    assert replays and all(r == RESOLVED for r in replays), replays
    # `spica export` reads the config the same way: the sweep's own recommendation.json again
    again = tmp_path / "again.json"
    assert cli.main(["export", "--config", str(path), "--run-dir", str(tmp_path / "out"), "--output", str(again)]) == 0
    assert again.read_text() == (tmp_path / "out" / "recommendation.json").read_text()


def test_preflight_returns_the_resolved_config_for_every_later_stage():
    checked = preflight(SmartSearchConfig.from_dict(config_with(space=HF_SPACE)))
    space = checked.config.search_space
    assert (space.model_name, space.hardware_sku) == ("meta-llama/Meta-Llama-3.1-70B", "h200_sxm")
    assert checked.filtered.config.search_space.model_name == "meta-llama/Meta-Llama-3.1-70B"
    assert checked.warnings[:3] == checked.renamed and len(checked.renamed) == 3
    assert checked.config.deploy.served_model == "meta-llama/Llama-3.1-70B-Instruct"  # what dgd.yaml serves
    unchanged = SmartSearchConfig.from_dict(config_with())
    assert preflight(unchanged).config is unchanged  # shipped names: the very same config, same hashes


def test_a_preflight_refusal_names_the_config_file_once():
    with pytest.raises(PreflightError) as info:
        preflight(SmartSearchConfig.from_dict(config_with(space={"backend": ["trtllm"]})))
    assert info.value.line("c.yaml").startswith("invalid config c.yaml: search_space.backend: ")
    assert info.value.exit_code == 2


def test_a_local_config_json_validates_as_its_directory(tmp_path, capsys):
    model_dir = tmp_path / "my-qwen"
    model_dir.mkdir()
    (model_dir / "config.json").write_bytes(shipped_config("Qwen/Qwen3-32B"))
    path = write(tmp_path, config_with(space={"model_name": str(model_dir / "config.json")}))
    code, out, err = validate(path, capsys)
    assert code == 0 and err == [], err
    assert (f"model {model_dir / 'config.json'} -> {model_dir} (local config.json, Qwen3ForCausalLM, "
            "aiconfigurator-core family LLAMA)") in out


def test_dagster_validated_config_refuses_with_the_cli_line(tmp_path, capsys):
    from test_dagster import TINY_YAML, _failed_run_message, _spec

    spec = _spec(tmp_path, "trt", TINY_YAML.replace("backend: [vllm]", "backend: [trtllm]"))
    code, _, err = validate(Path(spec.config_path), capsys)
    assert code == 2
    assert _failed_run_message(tmp_path, spec) == err[0]
