"""Agentic sessions as a workload: the config, the generated Mooncake-delta trace, the replay arguments, traces
with session ids, and (integration) the prefix-cache hit rate of the KV router against round robin."""

import json
import re
from pathlib import Path

import pytest
from pydantic import ValidationError
from test_deploy import agg_candidate
from test_engine_args import THROUGHPUT, FakeFacts

from spica_pipeline.config import load_config
from spica_pipeline.config.messages import render_validation_error
from spica_pipeline.config.workload import Workload
from spica_pipeline.errors import CandidateBuildError, TraceError
from spica_pipeline.evaluate.engine_args import ReplaySettings, build_replay_call
from spica_pipeline.evaluate.evaluator import EvalRequest
from spica_pipeline.traces import read_mooncake_trace, session_records

REPO = Path(__file__).resolve().parents[1]
SESSIONS = {"count": 6, "session_rate": 2.0, "turns": [2, 4], "first_isl": [1000, 3000], "turn_isl": [50, 400],
            "osl": [20, 80], "think_time_s": [1, 3]}


def refusal(data):
    with pytest.raises(ValidationError) as err:
        Workload.model_validate(data)
    return render_validation_error(err.value)


def test_a_sessions_workload_is_its_own_shape():
    w = Workload.model_validate({"sessions": SESSIONS})
    assert w.shape == "sessions" and w.is_sessions and not w.is_trace
    assert w.sessions.bounds("turns") == (2, 4) and w.sessions.bounds("think_time_s") == (1, 3)
    assert w.sessions.max_history() == 3000 + 3 * (80 + 400) + 80
    assert Workload.model_validate(w.model_dump(mode="json")) == w
    assert "sessions" not in Workload.model_validate({"isl": 1, "osl": 1, "concurrency": 1,
                                                      "num_request_ratio": 1}).model_dump()


@pytest.mark.parametrize("over, expect", [
    ({"turns": 0}, "sessions.turns: must be >= 1, got 0"),
    ({"turns": [0, 3]}, "sessions.turns: must be >= 1, got 0"),
    ({"turns": 2.5}, "sessions.turns: must be an integer, got 2.5"),
    ({"turns": [3, 2]}, "sessions.turns: a range needs min <= max, got [3, 2]"),
    ({"osl": [1, 2, 3]}, "sessions.osl: takes one number or a [min, max] range"),
    ({"think_time_s": -1}, "sessions.think_time_s: must be >= 0, got -1"),
    ({"session_rate": 0}, "sessions.session_rate"),
    ({"count": 0}, "sessions.count"),
])
def test_bad_sessions_are_one_line(over, expect):
    line = refusal({"sessions": {**SESSIONS, **over}})
    assert expect in line and "\n" not in line


def test_sessions_exclude_the_other_load_fields():
    line = refusal({"sessions": SESSIONS, "concurrency": 4, "isl_jitter": 0.1})
    assert "must not set ['concurrency', 'isl_jitter']" in line
    assert "must not set ['trace_path']" in refusal({"sessions": SESSIONS, "trace_path": "t.jsonl"})


def test_session_records_are_seeded_multi_turn_deltas():
    records = session_records(**SESSIONS, seed=7, block_size=512)
    assert records == session_records(**SESSIONS, seed=7, block_size=512)
    assert records != session_records(**SESSIONS, seed=8, block_size=512)
    by_session: dict[str, list] = {}
    for r in records:
        by_session.setdefault(r["session_id"], []).append(r)
    assert len(by_session) == 6 and all(2 <= len(t) <= 4 for t in by_session.values())
    starts = [turns[0]["timestamp"] for turns in by_session.values()]
    assert starts[0] == 0 and starts == sorted(starts)
    ids = [h for r in records for h in r["hash_ids"]]
    assert len(ids) == len(set(ids))  # every turn's new tokens are new blocks; the history is what repeats
    for turns in by_session.values():
        first, *later = turns
        assert 1000 <= first["input_length"] <= 3000 and "delay" not in first
        for t in later:
            assert 50 <= t["input_length"] <= 400 and 1000 <= t["delay"] <= 3000
            assert t["timestamp"] == first["timestamp"]
        for t in turns:
            assert 20 <= t["output_length"] <= 80 and len(t["hash_ids"]) == -(-t["input_length"] // 512)


def test_the_replay_gets_the_session_trace():
    facts = FakeFacts()
    derived: dict = {}
    call = build_replay_call(EvalRequest(agg_candidate(), {"sessions": SESSIONS}, THROUGHPUT), ReplaySettings(),
                             facts, derived)
    assert call.function == "trace" and call.args == (["/t/generated.jsonl"],)
    assert call.kwargs["trace_format"] == "mooncake-delta" and call.kwargs["trace_block_size"] == 512
    assert "replay_concurrency" not in call.kwargs and "arrival_interval_ms" not in call.kwargs
    written = [json.loads(line) for line in facts.written.splitlines()]
    assert derived["sessions"]["requests"] == len(written) == derived["request_count"]
    assert derived["window_rule"] == "open_loop"
    small = FakeFacts(context=3000)
    with pytest.raises(CandidateBuildError, match="over the model context length 3000"):
        build_replay_call(EvalRequest(agg_candidate(), {"sessions": SESSIONS}, THROUGHPUT), ReplaySettings(), small)


def test_trace_lines_name_sessions_and_think_time(tmp_path):
    path = tmp_path / "t.jsonl"
    lines = [{"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [1, 2], "session_id": "a"},
             {"timestamp": 0, "input_length": 900, "output_length": 10, "hash_ids": [1, 2], "session_id": "a",
              "delay": 500}]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert read_mooncake_trace(path).n_requests == 2
    for bad, expect in (({"delay": -1}, "'delay' (ms after the session's previous answer)"),
                        ({"delay": "soon"}, "'delay'"), ({"session_id": [1]}, "'session_id' must be")):
        path.write_text(json.dumps({**lines[1], **bad}) + "\n")
        with pytest.raises(TraceError, match=re.escape(expect)):
            read_mooncake_trace(path)


# ---- the done-when: a sessions sweep over both routers reports the hit rate, higher with the KV router ----

@pytest.mark.integration
@pytest.mark.slow
def test_the_kv_router_hits_the_prefix_cache_more_than_round_robin(tmp_path, monkeypatch):
    from spica_pipeline.sweep import run_sweep

    monkeypatch.chdir(REPO)
    monkeypatch.setenv("SPICA_CACHE_DIR", str(tmp_path / "cache"))
    config = load_config(REPO / "examples" / "configs" / "sessions.yaml")
    run_sweep(config, tmp_path / "run")
    import pandas as pd

    frame = pd.read_csv(tmp_path / "run" / "candidates.csv")
    hits = dict(zip(frame["cfg.router_mode"], frame["prefix_cache_reused_ratio"]))
    assert set(hits) == {"kv_router", "round_robin"}
    assert hits["kv_router"] > hits["round_robin"] > 0
    report = (tmp_path / "run" / "report.md").read_text()
    assert "prefix hit" in report
