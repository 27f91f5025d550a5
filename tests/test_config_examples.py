"""The example trace is what scripts/gen_trace.py makes, and it has the promised shape."""

import importlib.util
import json
import math
from pathlib import Path

from shared_data import REAL_TRACE, require

from spica_pipeline import cli
from spica_pipeline.config import load_config

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "examples" / "traces" / "small_mooncake.jsonl"


def _gen_trace_module():
    spec = importlib.util.spec_from_file_location("gen_trace", REPO / "scripts" / "gen_trace.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_committed_trace_is_reproducible(tmp_path):
    out = tmp_path / "t.jsonl"
    assert _gen_trace_module().main(["--out", str(out)]) == 0
    assert out.read_bytes() == TRACE.read_bytes()


def test_trace_shape():
    rows = [json.loads(line) for line in TRACE.read_text().splitlines()]
    assert 300 <= len(rows) <= 500
    ts = [r["timestamp"] for r in rows]
    assert ts == sorted(ts) and ts[0] == 0 and 120_000 <= ts[-1] <= 400_000
    assert all(1 <= r["input_length"] <= 6000 and 50 <= r["output_length"] <= 400 for r in rows)
    assert all(len(r["hash_ids"]) == math.ceil(r["input_length"] / 512) for r in rows)
    firsts: dict[int, int] = {}
    for r in rows:
        firsts[r["hash_ids"][0]] = firsts.get(r["hash_ids"][0], 0) + 1
    shared = sorted((n for n in firsts.values() if n > 1), reverse=True)
    assert 2 <= len(shared) <= 6 and sum(shared) >= len(rows) // 3  # a few groups, a good share of traffic


def test_generator_is_seeded():
    gen = _gen_trace_module().generate
    assert gen(seed=1, num_requests=50) == gen(seed=1, num_requests=50)
    assert gen(seed=1, num_requests=50) != gen(seed=2, num_requests=50)
    flat = gen(seed=3, num_requests=200, rate_swing=0.0, num_groups=0)
    assert len({r["hash_ids"][0] for r in flat}) == 200  # no groups: no shared prefixes


def test_trace_example_reads_the_committed_trace(monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    cfg = load_config("examples/configs/trace.yaml")
    assert Path(cfg.workload.trace_path).resolve() == TRACE


def _validate_with_trace(tmp_path, trace: Path, model: str) -> int:
    cfg = tmp_path / "traced.yaml"
    cfg.write_text(f"search_space: {{model_name: {model}, hardware_sku: h200_sxm}}\n"
                   f"workload: {{trace_path: {trace}, replay_concurrency: 64}}\n")
    return cli.main(["validate", "--config", str(cfg)])


def _long_input_trace(tmp_path) -> Path:
    """Ten requests; the seventh has the real Mooncake trace's longest input, 191,378 tokens."""
    rows = [{"timestamp": 100 * i, "input_length": 2000, "output_length": 100, "hash_ids": [10 * i, 10 * i + 1,
                                                                                           10 * i + 2, 10 * i + 3]}
            for i in range(10)]
    rows[6] = {**rows[6], "input_length": 191_378, "hash_ids": list(range(1000, 1000 + math.ceil(191_378 / 512)))}
    path = tmp_path / "long_input.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_long_input_trace_validates_on_a_long_context_model(tmp_path, capsys):
    # a 256k-context model takes a 191,378-token input
    assert _validate_with_trace(tmp_path, _long_input_trace(tmp_path), "Qwen/Qwen3-VL-32B-Instruct") == 0
    assert "capped at 64 in flight" in capsys.readouterr().out


def test_trace_longer_than_the_context_is_one_line(tmp_path, capsys):
    trace = _long_input_trace(tmp_path)
    assert _validate_with_trace(tmp_path, trace, "Qwen/Qwen3-32B") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{trace}:7:" in err


def test_real_mooncake_trace_config_validates(tmp_path, capsys):
    """Optional: the real trace (../shared/data; skipped, with the reason, where it is absent)."""
    # the trace's inputs reach 191,378 tokens: a 256k-context model takes them all
    assert _validate_with_trace(tmp_path, require(REAL_TRACE), "Qwen/Qwen3-VL-32B-Instruct") == 0
    assert "capped at 64 in flight" in capsys.readouterr().out
