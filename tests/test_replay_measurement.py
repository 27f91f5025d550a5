"""The evaluator measures like a benchmark client: ramped closed loop, window, jitter (fake replay)."""

import json
import types

from test_deploy import agg_candidate
from test_replay import THROUGHPUT, FakeReplay, ev, fake  # noqa: F401  (fixture)

from spica_pipeline.evaluate.evaluator import EvalRequest
from spica_pipeline.evaluate.replay import ReplayEvaluator

WL = {"isl": 100, "osl": 10, "concurrency": 2, "num_request_ratio": 8}


def per_request(clients=2, turns=8, cycle=100.0):
    out = []
    for k in range(clients):
        t = k * cycle / clients
        for turn in range(turns):
            ttft = 500.0 if turn == 0 else 20.0  # a slow first wave, then steady
            out.append({"session_id": f"s{k}", "turn_index": turn, "arrival_time_ms": t, "ttft_ms": ttft,
                        "first_token_ms": t + ttft, "last_token_ms": t + cycle, "terminal_time_ms": t + cycle,
                        "itl_ms": 8.0, "e2e_latency_ms": cycle, "input_length": 100, "output_length": 10})
            t += cycle
    return out


class WithPerRequest(FakeReplay):
    def _result(self):
        res = super()._result()
        return types.SimpleNamespace(summary=res.summary, per_request=per_request())


def test_metrics_come_from_the_steady_state_window(fake, monkeypatch):  # noqa: F811
    import dynamo._core as core

    f = WithPerRequest()
    monkeypatch.setattr(core, "run_mocker_synthetic_trace_replay", f.synthetic)
    out = ev().evaluate(EvalRequest(agg_candidate(), WL, THROUGHPUT))
    assert out.status == "feasible", out.reason
    rep = out.report
    assert rep["mean_ttft_ms"] == 20.0 and rep["full_run_mean_ttft_ms"] == 50.0  # the fake summary's value
    assert 0 < rep["window_counted_requests"] < rep["window_total_requests"] == 16
    assert out.derived["window_rule"] == "closed_loop" and f.calls[0][2]["capture_per_request"] is True


def test_jitter_replays_a_generated_trace_of_ramped_sessions(fake, tmp_path):  # noqa: F811
    wl = {**WL, "isl_jitter": 0.2, "osl_jitter": 0.2}
    out = ReplayEvaluator(cache_dir=str(tmp_path)).evaluate(EvalRequest(agg_candidate(), wl, THROUGHPUT))
    assert out.status == "feasible", out.reason
    fn, args, kw = fake.calls[0]
    assert fn == "trace" and kw["replay_concurrency"] is None and kw["trace_format"] == "mooncake"
    lines = [json.loads(x) for x in open(args[0][0])]
    assert len(lines) == out.derived["request_count"] == 16 and len({x["session_id"] for x in lines}) == 2
    assert all(80 <= x["input_length"] <= 120 for x in lines)
    # the same workload gives the same requests (every candidate of a sweep sees one trace)
    again = ReplayEvaluator(cache_dir=str(tmp_path)).evaluate(EvalRequest(agg_candidate(tp=4), wl, THROUGHPUT))
    assert fake.calls[1][1] == args and again.derived["jitter_seed"] == out.derived["jitter_seed"]


def test_the_replays_own_summary_drops_its_summation_order_noise():
    """The mocker sums in a hash map's order: two replays of one spec can differ in the last bits of a mean."""
    from spica_pipeline.evaluate.replay import order_free

    a = order_free({"mean_tpot_ms": 18.265402285714288, "num_requests": 8, "policy": "lru", "power_w": None,
                    "inf": float("inf")})
    b = order_free({"mean_tpot_ms": 18.26540228571429, "num_requests": 8, "policy": "lru", "power_w": None,
                    "inf": float("inf")})
    assert a == b and a["mean_tpot_ms"] == 18.2654022857 and a["num_requests"] == 8 and a["policy"] == "lru"
    assert a["inf"] == float("inf")
