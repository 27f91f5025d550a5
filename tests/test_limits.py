"""Resource sanity limits, trace warnings, path messages and the algorithm override, in `validate`
and `sweep` alike (issue 20 items 3 and 6). The config-file cases live in tests/data/bad_configs."""

import json
import os
import time
from pathlib import Path

import pytest
import yaml

from spica_pipeline import cli
from spica_pipeline.config import SmartSearchConfig
from spica_pipeline.config.limits import (
    MAX_REQUESTS_PER_REPLAY,
    check_resource_limits,
    replay_memory_bytes,
)
from spica_pipeline.errors import ResourceLimitError, TraceError
from spica_pipeline.traces import path_problem, read_mooncake_trace

TRACE_ROW = {"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [1, 2]}


def config(workload=None, **sweep) -> SmartSearchConfig:
    return SmartSearchConfig.from_dict({
        "search_space": {"model_name": "Qwen/Qwen3-32B", "hardware_sku": "h200_sxm", "gpu_budget": 2},
        "workload": workload or {"isl": 512, "osl": 64, "request_rate": 4, "num_request_ratio": 10},
        "sweep": {"parallel_evals": 4, **sweep},
    })


def write_trace(path: Path, rows: list) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def trace_config(tmp_path: Path, trace: Path, **sweep) -> Path:
    data = {"search_space": {"model_name": "Qwen/Qwen3-32B", "hardware_sku": "h200_sxm", "gpu_budget": 2,
                             "deployment_mode": ["agg"]},
            "workload": {"trace_path": str(trace)}, "sweep": sweep}
    path = tmp_path / "trace.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def validate(path: Path, capsys) -> tuple[int, str, list[str]]:
    code = cli.main(["validate", "--config", str(path)])
    out, err = capsys.readouterr()
    return code, out, [line for line in err.splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------------
# the limits
# ---------------------------------------------------------------------------------------------

def test_an_ordinary_config_passes():
    check_resource_limits(config(), memory_bytes=16 * 2**30)


def test_request_count_limit_names_the_fields():
    with pytest.raises(ResourceLimitError, match=r"^workload\.num_request_ratio: num_request_ratio 1e\+09 x "
                                                 r"request_rate 4 = 4,000,000,000 requests per replay, over"):
        check_resource_limits(config({"isl": 512, "osl": 64, "request_rate": 4, "num_request_ratio": 1e9}))
    with pytest.raises(ResourceLimitError, match="at least"):  # kv_load: the ratio alone is the lower bound
        check_resource_limits(config({"isl": 512, "osl": 64, "kv_load_ratio": 0.5, "num_request_ratio": 2e6}))


def test_memory_limit_uses_the_configured_share_of_this_machine():
    per_replay = replay_memory_bytes(512, 400_000)  # 400k requests: under the count limit
    assert 400_000 < MAX_REQUESTS_PER_REPLAY
    cfg = config({"isl": 512, "osl": 64, "request_rate": 4, "num_request_ratio": 100_000},
                 candidates_per_round=4)
    check_resource_limits(cfg, memory_bytes=int(4 * per_replay / 0.5) + 1)  # 4 workers fit in half
    with pytest.raises(ResourceLimitError) as info:
        check_resource_limits(cfg, memory_bytes=int(4 * per_replay / 0.5) - 1)
    message = str(info.value)
    assert message.startswith("workload.num_request_ratio:") and "x 4 parallel replays" in message
    assert "sweep.max_replay_memory_share 0.5" in message and "\n" not in message
    wider = config(cfg.workload.model_dump(exclude_none=True), candidates_per_round=4, max_replay_memory_share=1.0)
    check_resource_limits(wider, memory_bytes=int(4 * per_replay / 0.5) - 1)


def test_trace_memory_counts_every_request(tmp_path):
    trace = read_mooncake_trace(write_trace(tmp_path / "t.jsonl", [TRACE_ROW] * 10))
    cfg = config({"trace_path": str(tmp_path / "t.jsonl")}, parallel_evals=1)
    need = replay_memory_bytes(trace.input_length)
    assert need == replay_memory_bytes(1000, 10)
    check_resource_limits(cfg, trace, memory_bytes=int(2 * need) + 1)
    with pytest.raises(ResourceLimitError, match=r"^workload\.trace_path: workload\.trace_path .* has 10 requests"):
        check_resource_limits(cfg, trace, memory_bytes=int(2 * need) - 1)


@pytest.mark.parametrize("workload, expect", [
    ({"isl": 512, "osl": 64, "request_rate": 1e12, "num_request_ratio": 1e-9},
     "workload.request_rate 1e+12 req/s exceeds the limit"),
    ({"isl": 512, "osl": 64, "request_rate": 4, "num_request_ratio": 1e9}, "requests per replay"),
])
def test_sweep_refuses_the_same_limits_before_any_replay(tmp_path, capsys, workload, expect):
    data = {"search_space": {"model_name": "Qwen/Qwen3-32B", "hardware_sku": "h200_sxm", "gpu_budget": 2},
            "workload": workload}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    start = time.perf_counter()
    code = cli.main(["sweep", "--config", str(path), "--output-dir", str(tmp_path / "out")])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1 and expect in err[0], err
    assert not (tmp_path / "out" / "journal.jsonl").exists()
    assert time.perf_counter() - start < 30


# ---------------------------------------------------------------------------------------------
# traces
# ---------------------------------------------------------------------------------------------

def test_negative_hash_ids_are_refused(tmp_path):
    path = write_trace(tmp_path / "t.jsonl", [TRACE_ROW, {**TRACE_ROW, "hash_ids": [3, -1]}])
    with pytest.raises(TraceError, match=rf"^{path}:2: 'hash_ids' must be non-negative, got -1"):
        read_mooncake_trace(path)


def test_more_hash_ids_than_the_input_spans_are_refused(tmp_path):
    path = write_trace(tmp_path / "t.jsonl", [{**TRACE_ROW, "hash_ids": [1, 2, 3]}])
    with pytest.raises(TraceError, match=rf"^{path}:1: 3 hash_ids for input_length 1000, more than the 2 blocks"):
        read_mooncake_trace(path)


def test_trace_warnings_are_one_line_each_with_a_count(tmp_path, capsys):
    rows = [{**TRACE_ROW, "timestamp": t} for t in (0, 10, 5, 20, -3, 30)]
    rows.append('{"timestamp": 40, "timestamp": 41, "input_length": 1000, "output_length": 1, "hash_ids": [1, 2]}')
    trace = write_trace(tmp_path / "t.jsonl", rows)
    data = read_mooncake_trace(trace)
    assert data.warnings == (
        f"{trace}:3: timestamps go backwards on 2 line(s) (the replay sorts requests by timestamp)",
        f"{trace}:5: 1 negative timestamp(s)",
        f"{trace}:7: 1 line(s) repeat a key (the last value is used)",
    )
    code, out, err = validate(trace_config(tmp_path, trace), capsys)
    assert code == 0 and "is valid" in out
    assert err == [f"warning: {w}" for w in data.warnings]


def test_a_clean_trace_has_no_warnings(tmp_path):
    assert read_mooncake_trace(write_trace(tmp_path / "t.jsonl", [TRACE_ROW] * 3)).warnings == ()


def test_path_messages_say_what_the_path_is(tmp_path):
    assert path_problem(tmp_path / "nope") == "does not exist"
    assert path_problem(tmp_path) == "is a directory"
    assert path_problem("/dev/zero") == "is not a regular file (a character device)"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert path_problem(fifo) == "is not a regular file (a named pipe)"
    assert path_problem(write_trace(tmp_path / "ok.jsonl", [TRACE_ROW])) is None


@pytest.mark.parametrize("trace, expect", [
    ("DIR", "is a directory"),
    ("/dev/zero", "is not a regular file (a character device)"),
    ("MISSING", "does not exist"),
])
def test_validate_says_what_the_trace_path_is(tmp_path, capsys, trace, expect):
    trace = {"DIR": str(tmp_path), "MISSING": str(tmp_path / "absent.jsonl")}.get(trace, trace)
    code, out, err = validate(trace_config(tmp_path, Path(trace)), capsys)
    assert code == 2 and len(err) == 1 and "workload.trace_path" in err[0] and expect in err[0], err
    assert "no such file" not in err[0]


def test_config_path_that_is_not_a_regular_file(capsys):
    code = cli.main(["validate", "--config", "/dev/zero"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == ["could not read config /dev/zero: is not a regular file (a character device)"]


# ---------------------------------------------------------------------------------------------
# the algorithm, SPICA_VIZIER_ALGO included
# ---------------------------------------------------------------------------------------------

def test_validate_resolves_the_algorithm_override(tmp_path, capsys, monkeypatch):
    trace = write_trace(tmp_path / "t.jsonl", [TRACE_ROW])
    path = trace_config(tmp_path, trace)
    monkeypatch.setenv("SPICA_VIZIER_ALGO", "bogus")
    code, out, err = validate(path, capsys)
    assert code == 2 and len(err) == 1 and "SPICA_VIZIER_ALGO: unknown Vizier algorithm 'BOGUS'" in err[0], err
    start = time.perf_counter()
    code = cli.main(["sweep", "--config", str(path), "--output-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "SPICA_VIZIER_ALGO" in err[0]
    assert time.perf_counter() - start < 10  # refused up front, not at the first study
    monkeypatch.setenv("SPICA_VIZIER_ALGO", "random_search")
    code, out, err = validate(path, capsys)
    assert code == 0 and "algorithm RANDOM_SEARCH (from SPICA_VIZIER_ALGO" in out
