"""`spica validate`: every bad config exits 2 with one stderr line naming the field or file."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from spica_pipeline import cli

REPO = Path(__file__).resolve().parents[1]
BAD = REPO / "tests" / "data" / "bad_configs"
EXAMPLES = sorted((REPO / "examples" / "configs").glob("*.yaml"))
BAD_FILES = sorted(BAD.glob("*.yaml"))
# Files that cannot carry an "# expect:" header.
EXPECT_OVERRIDES = {"empty.yaml": "the file is empty"}
# Run as real subprocesses too (the rest run in-process through cli.main).
SUBPROCESS_CASES = {"alias_bomb.yaml", "invalid_utf8.yaml", "unknown_search_space_key.yaml"}


def expected_substring(path: Path) -> str:
    if path.name in EXPECT_OVERRIDES:
        return EXPECT_OVERRIDES[path.name]
    first = path.read_bytes().split(b"\n", 1)[0].decode("ascii")
    assert first.startswith("# expect: "), f"{path.name} lacks an '# expect:' header"
    return first[len("# expect: "):].strip()


def run_main(argv: list[str], capsys) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(err: str, path: Path, expect: str) -> None:
    lines = err.strip("\n").splitlines()
    assert len(lines) == 1, f"expected one stderr line, got {lines!r}"
    line = lines[0]
    assert "Traceback" not in err
    assert str(path) in line, line
    assert expect in line, f"{expect!r} not in {line!r}"
    assert line.startswith(("could not read config", "malformed YAML in", "invalid config")), line


def test_corpus_is_big_enough():
    assert len(BAD_FILES) >= 30


@pytest.mark.parametrize("path", BAD_FILES, ids=[p.name for p in BAD_FILES])
def test_bad_config_exits_2_with_one_line(path, capsys):
    expect = expected_substring(path)
    code, out, err = run_main(["validate", "--config", str(path)], capsys)
    assert code == 2
    assert out == ""
    assert_one_line_error(err, path, expect)


@pytest.mark.parametrize("name", sorted(SUBPROCESS_CASES))
def test_bad_config_as_subprocess(name):
    path = BAD / name
    env = {**os.environ, "DYN_LOG": "warn"}
    proc = subprocess.run([sys.executable, "-m", "spica_pipeline", "validate", "--config", str(path)],
                          cwd=REPO, capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert_one_line_error(proc.stderr, path, expected_substring(path))


def test_directory_and_missing_paths(tmp_path, capsys):
    code, _, err = run_main(["validate", "--config", str(tmp_path)], capsys)
    assert code == 2
    assert_one_line_error(err, tmp_path, "could not read config")
    missing = tmp_path / "nope.yaml"
    code, _, err = run_main(["validate", "--config", str(missing)], capsys)
    assert code == 2
    assert_one_line_error(err, missing, "could not read config")


def test_missing_trace_file_is_reported(tmp_path, capsys):
    cfg = tmp_path / "t.yaml"
    cfg.write_text("search_space: {model_name: m, hardware_sku: h200_sxm}\n"
                   f"workload: {{trace_path: {tmp_path / 'absent.jsonl'}}}\n")
    code, _, err = run_main(["validate", "--config", str(cfg)], capsys)
    assert code == 2
    assert_one_line_error(err, cfg, "workload.trace_path")


def test_unexpected_exception_is_one_line(monkeypatch, tmp_path, capsys):
    def boom(path):
        raise RuntimeError("kaboom\nsecond line")

    monkeypatch.setattr(cli.common, "load_config", boom)
    cfg = tmp_path / "x.yaml"
    code, _, err = run_main(["validate", "--config", str(cfg)], capsys)
    assert code == 2
    assert_one_line_error(err, cfg, "kaboom second line")


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_examples_validate(path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)  # example trace paths are relative to the repository root
    code, out, err = run_main(["validate", "--config", str(path.relative_to(REPO))], capsys)
    assert code == 0, err
    assert err == ""
    assert "is valid" in out and "branches:" in out and "goal:" in out and "workload:" in out


def test_examples_cover_the_brief():
    names = {p.name for p in EXAMPLES}
    assert {"quickstart.yaml", "pareto.yaml", "trace.yaml", "planner.yaml"} <= names


def test_validate_summary_content(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    code, out, _ = run_main(["validate", "--config", "examples/configs/quickstart.yaml"], capsys)
    assert code == 0
    assert "branches: agg, disagg" in out
    assert "agg_max_num_seqs: 2 choices [256, 512]" in out
    assert "router_mode = round_robin" in out
    assert "overlap_score_credit (router_mode is round_robin only)" in out
    assert "request_rate 8.0 req/s" in out and "goal: throughput_per_gpu" in out
    assert "per_round 16" in out


def test_help_is_marked_experimental(capsys):
    with pytest.raises(SystemExit) as info:
        cli.build_parser().parse_args(["--help"])
    assert info.value.code == 0
    assert "[EXPERIMENTAL]" in capsys.readouterr().out
    assert cli.main(["--help"]) == 0


def test_usage_errors_exit_2(capsys):
    assert cli.main(["validate"]) == 2
    assert cli.main([]) == 2
    assert "usage" in capsys.readouterr().err


POLICY_CONFIG = """search_space: {{model_name: Qwen/Qwen3-32B, hardware_sku: h200_sxm, planner_scaling_policy: {policies}}}
workload: {{isl: 100, osl: 10, request_rate: 1, num_request_ratio: 10}}
goal: {{target: throughput}}
"""


def test_validate_applies_the_policy_filter(tmp_path, capsys):
    only_throughput = tmp_path / "only.yaml"
    only_throughput.write_text(POLICY_CONFIG.format(policies="[throughput_180_5]"))
    code, _, err = run_main(["validate", "--config", str(only_throughput)], capsys)
    assert code == 2
    assert_one_line_error(err, only_throughput, "every planner_scaling_policy entry enables throughput scaling")
    mixed = tmp_path / "mixed.yaml"
    mixed.write_text(POLICY_CONFIG.format(policies="[disabled, throughput_180_5]"))
    code, out, _ = run_main(["validate", "--config", str(mixed)], capsys)
    assert code == 0 and "dropped planner_scaling_policy entries 'throughput_180_5'" in out


def test_synthetic_input_plus_output_over_the_context_is_refused(tmp_path, capsys):
    import yaml as _yaml

    cfg = {"search_space": {"model_name": "Qwen/Qwen3-32B", "hardware_sku": "h200_sxm", "gpu_budget": 8,
                            "context_length": 40960},
           "workload": {"isl": 40904, "osl": 283, "request_rate": 1.0, "num_request_ratio": 10.0}}
    path = tmp_path / "ctx.yaml"
    path.write_text(_yaml.safe_dump(cfg))
    code, out, err = run_main(["validate", "--config", str(path)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "workload.isl 40904 + workload.osl 283 = 41187 tokens exceeds the context length 40960" in err
