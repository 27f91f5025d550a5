"""Measuring like a benchmark client: the ramp, the steady-state window and its rule."""

import math

import pytest

from spica_pipeline.fidelity import measurement as m


def closed_loop_records(clients=4, turns=5, cycle=100.0, ttft=10.0, itl=2.0, osl=46, start_gap=25.0):
    """Idealised ramped clients: client k starts at k*gap, each request takes `cycle` ms."""
    out = []
    for k in range(clients):
        t = k * start_gap
        for turn in range(turns):
            out.append({"session_id": f"s{k}", "turn_index": turn, "arrival_time_ms": t, "ttft_ms": ttft,
                        "itl_ms": itl, "e2e_latency_ms": cycle, "terminal_time_ms": t + cycle,
                        "input_length": 1000, "output_length": osl})
            t += cycle
    return out


def test_ramp_spreads_clients_over_one_cycle_and_floors_turns():
    loop = m.closed_loop(4, 8, cycle_ms=200.0)
    assert loop.clients == 4 and loop.interval_ms == 50.0
    assert loop.turns == m.MIN_TURNS and loop.request_count == 4 * m.MIN_TURNS
    assert m.closed_loop(4, 400, 200.0).turns == 100  # more requested than the floor: honoured
    assert m.closed_loop(4, 8, math.nan).interval_ms == 0.0


def test_cycle_estimate_is_prefill_plus_decode_steps():
    cycle = m.cycle_estimate_ms(1000, 11, 8, prefill_ms=lambda t: t / 10, decode_ms=lambda b, c: b + c / 1000)
    assert cycle == pytest.approx(100 + 10 * (8 + 1.005))


def test_closed_loop_window_drops_warm_up_and_drain():
    recs = closed_loop_records()
    w = m.steady_state(recs, "closed_loop")
    # warm-up ends when the last client (start 75) completes its first request: 175
    # drain starts when the first client completes its last request: 500
    assert (w.start_ms, w.end_ms) == (175.0, 500.0)
    assert all(175 <= r["arrival_time_ms"] and r["terminal_time_ms"] <= 500 for r in recs
               if r["arrival_time_ms"] >= 175 and r["terminal_time_ms"] <= 500)
    assert w.counted == 10 and w.total == 20
    assert w.metrics["mean_ttft_ms"] == 10.0 and w.metrics["mean_tpot_ms"] == 2.0
    # 4 clients x 46 tokens per 100 ms cycle = 1840 tok/s in the steady state
    assert w.metrics["output_throughput_tok_s"] == pytest.approx(1840, rel=0.15)
    rep = w.to_report()
    assert rep["window_counted_requests"] == 10.0 and "warm-up" in w.rule


def test_warm_up_outliers_do_not_reach_the_metrics():
    recs = closed_loop_records()
    for r in recs:
        if r["turn_index"] == 0:
            r["ttft_ms"] = 500.0  # the burst of the first wave
    assert m.steady_state(recs, "closed_loop").metrics["mean_ttft_ms"] == 10.0


def test_open_loop_trims_first_and_last_tenth_of_arrivals():
    recs = [{"arrival_time_ms": float(i), "terminal_time_ms": i + 5.0, "ttft_ms": 100.0 if i < 10 else 1.0,
             "itl_ms": 1.0, "output_length": 10} for i in range(100)]
    w = m.steady_state(recs, "open_loop")
    assert (w.start_ms, w.end_ms) == (10.0, 89.0)
    assert w.counted == 80 and w.metrics["mean_ttft_ms"] == 1.0


def test_too_short_a_run_is_measured_whole_and_says_so():
    recs = closed_loop_records(turns=1)
    w = m.steady_state(recs, "closed_loop")
    assert w.kind == "whole_run" and w.counted == len(recs)
    assert m.steady_state([], "closed_loop") is None


def test_goodput_counts_sla_requests_in_the_window():
    recs = closed_loop_records()
    for r in recs:
        if r["session_id"] == "s0":
            r["ttft_ms"] = 50.0
    w = m.steady_state(recs, "closed_loop", sla={"ttft_ms": 20.0, "itl_ms": 5.0})
    assert 0 < w.metrics["goodput_output_throughput_tok_s"] < w.metrics["output_throughput_tok_s"]


def test_window_metrics_do_not_depend_on_the_order_records_arrive_in():
    """A multi-replica replay lists completions in an order that can change between runs; the
    same requests must give bit-identical metrics (same config and seed, same ledger)."""
    import random

    recs = closed_loop_records(clients=16, turns=6, cycle=97.3, ttft=10.7, itl=1.9, start_gap=6.1)
    for i, r in enumerate(recs):  # uneven latencies, so partial window overlaps are non-trivial floats
        r["ttft_ms"] += (i % 7) * 0.37
        r["terminal_time_ms"] += (i % 5) * 1.13
    sla = {"ttft_ms": 12.0, "itl_ms": 5.0}
    first = m.steady_state(recs, "closed_loop", sla=sla).metrics
    for seed in range(5):
        shuffled = list(recs)
        random.Random(seed).shuffle(shuffled)
        assert m.steady_state(shuffled, "closed_loop", sla=sla).metrics == first
        start, end = 150.0, 420.0
        assert m.sla_token_share(shuffled, start, end, sla) == m.sla_token_share(recs, start, end, sla)


def test_jittered_trace_closed_loop_sessions_and_bounds():
    loop = m.closed_loop(3, 6, cycle_ms=90.0)
    recs = m.jittered_trace(isl=1000, osl=100, isl_jitter=0.2, osl_jitter=0.1, seed=7, loop=loop)
    assert recs == m.jittered_trace(isl=1000, osl=100, isl_jitter=0.2, osl_jitter=0.1, seed=7, loop=loop)
    assert len(recs) == loop.request_count
    assert all(800 <= r["input_length"] <= 1200 and 90 <= r["output_length"] <= 110 for r in recs)
    assert len({r["input_length"] for r in recs}) > 1
    firsts = [r for r in recs if "timestamp" in r]
    assert [r["timestamp"] for r in firsts] == [0.0, 30.0, 60.0] and len({r["session_id"] for r in recs}) == 3
    assert all(len(r["hash_ids"]) == -(-r["input_length"] // 512) for r in recs)
    ids = [h for r in recs for h in r["hash_ids"]]
    assert len(ids) == len(set(ids))  # no prefix sharing unless asked


def test_jittered_trace_open_loop_shares_group_prefixes():
    recs = m.jittered_trace(isl=2048, osl=10, isl_jitter=0.0, osl_jitter=0.5, seed=1, request_count=4,
                            interval_ms=25.0, shared_prefix_ratio=0.5, num_prefix_groups=2)
    assert [r["timestamp"] for r in recs] == [0.0, 25.0, 50.0, 75.0]
    assert recs[0]["hash_ids"][:2] == recs[2]["hash_ids"][:2] != recs[1]["hash_ids"][:2]
    assert recs[0]["hash_ids"][2:] != recs[2]["hash_ids"][2:]


def test_benchmark_client_window_counts_every_request():
    recs = [{"arrival_time_ms": float(i), "ttft_ms": 10.0 * i, "terminal_time_ms": 100.0 + i, "itl_ms": 1.0,
             "output_length": 4, "session_id": f"c{i % 2}", "turn_index": i // 2} for i in range(6)]
    w = m.steady_state(recs, "benchmark_client")
    assert w.kind == "benchmark_client" and w.counted == 6 and w.metrics["mean_ttft_ms"] == pytest.approx(25.0)
    assert "t=0" in w.rule


def test_p90_itl_is_over_window_requests_so_the_gate_agrees_with_goodput():
    recs = closed_loop_records(clients=10, turns=6)
    for i, r in enumerate(recs):
        r["itl_ms"] = 2.0 + (i % 10)  # per-request mean ITLs 2..11 ms
    w = m.steady_state(recs, "closed_loop", sla={"itl_ms": 10.0})
    itls = [r["itl_ms"] for r in recs
            if r["arrival_time_ms"] >= w.start_ms and r["terminal_time_ms"] <= w.end_ms]
    assert w.metrics["p90_itl_ms"] == pytest.approx(m.quantile(itls, 0.9))
    assert w.metrics["p90_itl_ms"] > 10.0 > w.metrics["median_tpot_ms"]  # ~10 % of requests miss
    summary = m.windowed_summary({"p90_itl_ms": 0.5}, recs, "closed_loop")
    assert summary["full_run_p90_itl_ms"] == 0.5 and summary["p90_itl_ms"] == w.metrics["p90_itl_ms"]


def test_stored_columns_are_described_including_prefixed_ones():
    from spica_pipeline.dagster.io import column_description

    assert "window" in column_description("window_counted_requests")
    assert column_description("calibrated_p90_itl_ms").startswith("calibrated")
    assert "inter-token" in column_description("calibrated_p90_itl_ms")
    assert "whole replay" in column_description("full_run_mean_ttft_ms")
