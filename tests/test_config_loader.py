"""load_config: safe, bounded YAML and the three one-line ConfigError shapes."""

import time
from pathlib import Path

import pytest

from spica_pipeline.config import SmartSearchConfig, load_config, parse_yaml_text
from spica_pipeline.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
GOOD = """\
search_space:
  model_name: Qwen/Qwen3-32B
  hardware_sku: h200_sxm
  backend: &b [vllm]
workload: {isl: 100, osl: 10, concurrency: 4, num_request_ratio: 2}
"""


def write(tmp_path: Path, text: str | bytes, name: str = "c.yaml") -> Path:
    p = tmp_path / name
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text)
    return p


def error_of(path) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_good_file_loads_both_ways(tmp_path):
    p = write(tmp_path, GOOD)
    a, b = load_config(p), load_config(str(p))
    assert a == b and a.workload.concurrency == 4


def test_small_anchors_are_allowed():
    data = parse_yaml_text("a: &x [1, 2]\nb: *x\nc: *x\n")
    assert data == {"a": [1, 2], "b": [1, 2], "c": [1, 2]}


def test_could_not_read(tmp_path):
    assert error_of(tmp_path / "missing.yaml").startswith(f"could not read config {tmp_path / 'missing.yaml'}: ")
    assert error_of(tmp_path) == f"could not read config {tmp_path}: is a directory"
    bad = write(tmp_path, b"search_space: {model_name: caf\xe9}\n")
    assert error_of(bad) == f"could not read config {bad}: invalid UTF-8 at byte 30"


def test_unreadable_file(tmp_path):
    import os

    p = write(tmp_path, GOOD)
    p.chmod(0)
    try:
        if os.access(p, os.R_OK):
            pytest.skip("running as a user that ignores file permissions")
        assert error_of(p).startswith(f"could not read config {p}: ")
    finally:
        p.chmod(0o600)


def test_oversize_file_refused(tmp_path):
    p = write(tmp_path, "# " + "x" * (2 << 20) + "\n")
    assert "larger than" in error_of(p)


def test_malformed_yaml_names_line(tmp_path):
    p = write(tmp_path, "search_space:\n  model_name: m\n  backend: [vllm\nworkload: {}\n")
    msg = error_of(p)
    assert msg.startswith(f"malformed YAML in {p}: line ")
    assert "line 4" in msg or "line 3" in msg


def test_tabs_are_malformed(tmp_path):
    assert "malformed YAML" in error_of(write(tmp_path, "search_space:\n\tmodel_name: m\n"))


def test_duplicate_keys_rejected(tmp_path):
    msg = error_of(write(tmp_path, GOOD + "workload: {trace_path: x}\n"))
    assert msg.startswith("malformed YAML") and "duplicate key 'workload'" in msg and "line 6" in msg


def test_empty_and_non_mapping(tmp_path):
    assert "the file is empty" in error_of(write(tmp_path, ""))
    assert "the top level must be a mapping, got list" in error_of(write(tmp_path, "- 1\n- 2\n"))
    assert "got str" in error_of(write(tmp_path, "hello\n"))


def test_invalid_config_path_and_more_count(tmp_path):
    p = write(tmp_path, GOOD.replace("concurrency: 4", "concurrency: 0").replace("[vllm]", "[vllm, nope]"))
    msg = error_of(p)
    assert msg.startswith(f"invalid config {p}: search_space.backend: backend has invalid choice 'nope'")
    assert msg.endswith("(+1 more)")


def test_nested_paths_render_with_indices(tmp_path):
    p = write(tmp_path, GOOD + "goal: {target: pareto, pareto_objectives: [throughput, speed]}\n")
    msg = error_of(p)
    assert "goal.pareto_objectives[1]:" in msg


def test_extra_and_missing_wording(tmp_path):
    assert error_of(write(tmp_path, GOOD + "extra: 1\n")).endswith("extra: unknown key (not allowed here)")
    msg = error_of(write(tmp_path, "search_space: {hardware_sku: h}\nworkload: {trace_path: t}\n"))
    assert msg.endswith("search_space.model_name: field required")


@pytest.mark.parametrize("levels,width", [(9, 9), (7, 9), (30, 2)])
def test_alias_bombs_refused_fast(tmp_path, levels, width):
    lines = ['l0: &l0 ["lol", "lol"]']
    for i in range(1, levels + 1):
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]")
    p = write(tmp_path, "\n".join(lines) + "\n")
    start = time.perf_counter()
    msg = error_of(p)
    assert time.perf_counter() - start < 2.0
    assert msg.startswith(f"malformed YAML in {p}:") and "alias" in msg


def test_deep_nesting_refused(tmp_path):
    msg = error_of(write(tmp_path, "a: " + "[" * 5000 + "]" * 5000 + "\n"))
    assert msg.startswith("malformed YAML") and "nesting" in msg


def test_python_tags_refused(tmp_path):
    msg = error_of(write(tmp_path, "a: !!python/object/apply:os.system ['true']\n"))
    assert msg.startswith("malformed YAML")


def test_from_dict_and_real_trace_example():
    from spica_pipeline.config import load_config as lc

    c = lc(REPO / "examples" / "configs" / "trace.yaml")
    assert c.workload.is_trace and c.workload.trace_path == "examples/traces/small_mooncake.jsonl"
    assert SmartSearchConfig.from_dict(c.model_dump(mode="json")) == c


def test_exponent_floats_are_numbers_and_null_sections_are_defaults(tmp_path):
    text = GOOD.replace("concurrency: 4", "request_rate: 2.5e1") + "goal:\nsweep:\n"
    c = load_config(write(tmp_path, text))
    assert c.workload.request_rate == 25.0
    assert c.goal.target.value == "throughput" and c.sweep.max_rounds == 20
    assert parse_yaml_text("a: e3\nb: 1e3\nc: 12") == {"a": "e3", "b": 1000.0, "c": 12}


# ---- robustness: any mutation of a good config is either valid or one ConfigError line ------

import yaml  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_BASE = yaml.safe_load(GOOD)
_BASE["goal"] = {"target": "pareto", "sla": {"ttft_ms": 100, "itl_ms": 10}}
_BASE["sweep"] = {"max_rounds": 2}
_BASE["search_space"]["planner_scaling_policy"] = ["disabled", "load_180_5"]
_BASE["search_space"]["parallel_configs"] = []
_PATHS = [(sec, key) for sec, body in _BASE.items() for key in body] + [(sec, None) for sec in _BASE]

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 70000), st.floats(allow_nan=True),
                     st.text(max_size=8), st.sampled_from(["vllm", "agg", "pareto", "disabled", "kv_router"]))
_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(["tp", "prefill", "decode", "x"]), inner,
                                                 max_size=3)), max_leaves=8)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(_PATHS), value=_values)
def test_mutations_never_escape_as_other_exceptions(tmp_path, path, value):
    data = yaml.safe_load(yaml.safe_dump(_BASE))
    section, key = path
    if key is None:
        data[section] = value
    else:
        data[section][key] = value
    p = write(tmp_path, yaml.safe_dump(data), "m.yaml")
    try:
        load_config(p)
    except ConfigError as err:
        assert "\n" not in str(err) and str(err).startswith(("invalid config", "malformed YAML"))
