"""The bad-trace corpus (tests/data/bad_traces/): one clear error per file, naming file and line,
from the trace reader and from the command line (`spica validate`, `spica sweep`).

Both commands read the whole trace up front (`sweep.check_workload`), before any replay.
"""

import re
from pathlib import Path

import pytest
import yaml

from spica_pipeline.errors import TraceError
from spica_pipeline.traces import read_mooncake_trace

ROOT = Path(__file__).resolve().parent.parent
BAD = Path(__file__).resolve().parent / "data" / "bad_traces"

# file -> (1-based line the error must name or None for a file-level problem, words in the message)
CORPUS = {
    "truncated_json.jsonl": (3, "not valid JSON"),
    "negative_length.jsonl": (2, "'output_length' must be a non-negative integer, got -5"),
    "nonnumeric_timestamp.jsonl": (3, "'timestamp' must be a number"),
    "empty.jsonl": (None, "trace file is empty"),
    "binary_garbage.jsonl": (1, "not valid UTF-8"),
    "input_longer_than_context.jsonl": (2, "input_length 50000 exceeds the model context length"),
}
MODEL = "Qwen/Qwen3-32B"


def model_context() -> int:
    from spica_pipeline.evaluate.timing import model_context_length

    context = model_context_length(MODEL)
    assert context is not None and context < 50000, f"{MODEL} context {context}: the corpus assumes < 50000"
    return context


def expected_location(name: str) -> str:
    line, _ = CORPUS[name]
    path = str(BAD / name)
    return path if line is None else f"{path}:{line}:"


def test_corpus_is_complete():
    assert sorted(p.name for p in BAD.iterdir()) == sorted(CORPUS)
    assert (BAD / "empty.jsonl").stat().st_size == 0


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_reader_names_file_and_line(name):
    line, words = CORPUS[name]
    kwargs = {"max_input_length": model_context()} if name.startswith("input_longer") else {}
    with pytest.raises(TraceError) as info:
        read_mooncake_trace(BAD / name, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(expected_location(name)), message
    assert words in message
    if line is None:
        assert not re.match(re.escape(str(BAD / name)) + r":\d", message)


def test_longer_input_is_legal_without_a_context_limit():
    """The context rule is the model's, not the file's: without a limit the trace parses."""
    assert read_mooncake_trace(BAD / "input_longer_than_context.jsonl").n_requests == 2


def trace_config(tmp_path: Path, name: str) -> Path:
    data = {
        "search_space": {
            "model_name": MODEL, "hardware_sku": "h200_sxm", "gpu_budget": 2, "deployment_mode": ["agg"],
            "backend": ["vllm"], "router_mode": ["round_robin"], "planner_scaling_policy": ["disabled"],
        },
        "workload": {"trace_path": str(BAD / name)},
        "goal": {"target": "throughput_per_gpu"},
        "sweep": {"max_rounds": 1, "candidates_per_round": 1, "parallel_evals": 1, "max_eval_seconds": 60,
                  "algorithm": "QUASI_RANDOM_SEARCH", "seed": 0},
    }
    path = tmp_path / f"{Path(name).stem}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def assert_one_line_exit_2(code: int, captured, name: str) -> None:
    lines = captured.err.strip().splitlines()
    assert code == 2, f"exit {code}, stderr {lines[:3]}"
    assert len(lines) == 1, lines
    assert "Traceback" not in captured.err
    assert expected_location(name) in lines[0] and CORPUS[name][1] in lines[0], lines[0]


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_cli_validate_rejects_bad_trace(tmp_path, capsys, name):
    from spica_pipeline.cli import main

    code = main(["validate", "--config", str(trace_config(tmp_path, name))])
    assert_one_line_exit_2(code, capsys.readouterr(), name)


# The check runs before the lock, the enumeration and any replay, so every file is cheap here.
@pytest.mark.parametrize("name", sorted(CORPUS))
def test_cli_sweep_rejects_bad_trace(tmp_path, capsys, name):
    from spica_pipeline.cli import main

    config = trace_config(tmp_path, name)
    code = main(["sweep", "--config", str(config), "--output-dir", str(tmp_path / "out")])
    assert_one_line_exit_2(code, capsys.readouterr(), name)
