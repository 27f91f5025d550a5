"""The pure replay-argument builder against a fake `EngineFacts` (no AIC, no disk, no replay)."""

import pytest
from test_deploy import agg_candidate, agg_sample, as_candidate, disagg_candidate, disagg_sample

from spica_pipeline.errors import CandidateBuildError, InfeasibleKVCapacity
from spica_pipeline.evaluate.engine_args import EngineFacts, ReplaySettings, build_replay_call
from spica_pipeline.evaluate.evaluator import EvalRequest
from spica_pipeline.space.engine import EngineIdentity, KvCapacity

THROUGHPUT = {"target": "throughput", "sla": None, "pareto_objectives": None}
SYNTH = {"isl": 100, "osl": 100, "concurrency": 4, "num_request_ratio": 2}


class Table:
    speedup_ratio = 10.0

    def __init__(self, identity):
        self.identity = identity

    def timing_model(self):
        return {"type": "external", "provider": "dynamo_profile", "config": {"path": f"/t/{self.identity.tp}.npz"}}


class FakeFacts(EngineFacts):
    """Fixed capacities; records which identities were asked for."""

    def __init__(self, tokens_per_rank=64_000, context=40960):
        self.tokens_per_rank = tokens_per_rank
        self.context = context
        self.identities: list[EngineIdentity] = []
        self.traces: list[tuple] = []

    def backend_version(self, hardware_sku, backend):
        return "9.9.9"

    def kv_tokens(self, *args, **knobs):
        return self.tokens_per_rank

    def kv_capacity(self, identity, *, max_num_tokens, max_batch_size, memory_fraction):
        self.identities.append(identity)
        return KvCapacity(self.tokens_per_rank, 131072 // identity.tp)

    def timing_table(self, identity, *, max_num_batched_tokens):
        return Table(identity)

    def context_length(self, model_name):
        return self.context

    def check_trace(self, path, context, block_size):
        self.traces.append((path, context, block_size))

    def step_estimators(self, timing_model):  # prefill 100 ms, decode step 10 ms
        return (lambda tokens: 100.0), (lambda batch, context: 10.0)

    def write_trace(self, text):
        self.written = text
        return "/t/generated.jsonl"


def build(sample, workload=SYNTH, goal=THROUGHPUT, facts=None, **settings):
    derived: dict = {}
    call = build_replay_call(EvalRequest(as_candidate(sample), workload, goal), ReplaySettings(**settings),
                             facts or FakeFacts(), derived)
    return call, derived


def test_agg_synthetic_arguments():
    call, derived = build(agg_sample())
    # 4 ramped closed-loop clients (fidelity/measurement.py), MIN_TURNS requests each
    assert call.function == "synthetic" and call.args == (100, 100, 4) and call.repeats == 1
    kw = call.kwargs
    assert kw["num_workers"] == 2 and kw["replay_concurrency"] is None and kw["turns_per_session"] == 8
    assert kw["arrival_interval_ms"] == pytest.approx((100 + 99 * 10) / 4) and kw["capture_per_request"] is True
    eng = kw["extra_engine_args"]
    assert eng["engine"]["num_gpu_blocks"] == 1000 and eng["engine"]["max_model_len"] == 40960
    assert eng["tensor_parallel_size"] == 2 and eng["gpu_memory_utilization"] == 0.9
    ramp = {"clients": 4, "turns": 8, "interval_ms": 272.5, "cycle_ms": 1090.0, "request_count": 32}
    assert derived == {"concurrency": 4, "agg_num_gpu_blocks": 1000, "agg_kv_tokens_per_rank": 64_000,
                       "agg_kv_bytes_per_token": 65536, "request_count": 32, "ramp": ramp,
                       "window_rule": "closed_loop", "benchmark_granularity": 8}


def test_disagg_and_backend_version():
    facts = FakeFacts()
    call, derived = build(disagg_sample(backend_version=None), facts=facts, kv_transfer_bandwidth_gbps=10.0)
    assert derived["backend_version"] == "9.9.9" and {i.version for i in facts.identities} == {"9.9.9"}
    pre = call.kwargs["prefill_engine_args"]["engine"]
    assert pre["kv_transfer_bandwidth"] == 10.0 and "kv_transfer_bandwidth" not in \
        call.kwargs["decode_engine_args"]["engine"]


def test_router_config_stays_a_dict_and_repeats():
    call, _ = build(agg_sample(router_mode="kv_router", overlap_score_credit=0.5), router_repeats=4)
    assert call.kwargs["router_config"] == {"overlap_score_credit": 0.5} and call.repeats == 4


def test_expected_failures_are_candidate_errors():
    with pytest.raises(InfeasibleKVCapacity):
        build(agg_sample(), facts=FakeFacts(tokens_per_rank=10))
    with pytest.raises(CandidateBuildError, match="exceeds the model context length 150"):
        build(agg_sample(), facts=FakeFacts(context=150))
    with pytest.raises(CandidateBuildError, match="cannot combine e2e_ms"):
        build(agg_sample(), goal={"target": "goodput", "sla": {"ttft_ms": 1.0, "itl_ms": 1.0, "e2e_ms": 5.0}})
    with pytest.raises(ValueError, match="deployment_mode must be"):  # no such candidate: no request either
        build(agg_sample(deployment_mode="mixed"))


def test_trace_checked_through_facts(tmp_path):
    facts = FakeFacts()
    call, _ = build(agg_sample(), workload={"trace_path": "/t.jsonl"}, facts=facts, trace_block_size=256)
    assert facts.traces == [("/t.jsonl", 40960, 256)] and call.kwargs["trace_block_size"] == 256


def test_used_gpus():
    assert agg_candidate().used_gpus == 4 and disagg_candidate().used_gpus == 6


def test_benchmark_client_starts_every_client_together():
    """context closed_loop_client=together: the silicon rows' client (all at t=0, 10c requests, all counted)."""
    derived: dict = {}
    req = EvalRequest(agg_candidate(), {**SYNTH, "num_request_ratio": 10}, THROUGHPUT, {"closed_loop_client": "together"})
    call = build_replay_call(req, ReplaySettings(), FakeFacts(), derived)
    assert call.function == "synthetic" and call.args == (100, 100, 40)
    assert call.kwargs["replay_concurrency"] == 4 and call.kwargs["arrival_interval_ms"] is None
    assert "ramp" not in derived and derived["window_rule"] == "benchmark_client"
    assert derived["closed_loop_client"]["start"] == "together" and derived["closed_loop_client"]["turns"] == 10


def test_benchmark_client_gap_generates_sessions_with_delays():
    facts = FakeFacts()
    req = EvalRequest(agg_candidate(), {**SYNTH, "num_request_ratio": 10}, THROUGHPUT,
                      {"closed_loop_client": "together", "client_gap_cycles": 0.5})
    call = build_replay_call(req, ReplaySettings(), facts, {})
    assert call.function == "trace" and call.kwargs["replay_concurrency"] is None
    import json

    recs = [json.loads(line) for line in facts.written.splitlines()]
    assert len(recs) == 40 and sum("timestamp" in r for r in recs) == 4
    assert all(r["timestamp"] == 0.0 for r in recs if "timestamp" in r)
    delays = [r["delay"] for r in recs if "delay" in r]
    assert len(delays) == 36 and 0 <= min(delays) and max(delays) <= 0.5 * 1090.0


def test_unknown_client_start_is_a_candidate_error():
    req = EvalRequest(agg_candidate(), SYNTH, THROUGHPUT, {"closed_loop_client": "burst"})
    with pytest.raises(CandidateBuildError, match="closed_loop_client"):
        build_replay_call(req, ReplaySettings(), FakeFacts(), {})


def test_mtp_and_attention_dp_are_modelled_and_recorded():
    """Issue 14 item 3: MTP nextn times the table and drives the replay's draft acceptance; attention-DP
    ranks are independent replay schedulers (dp_size) with the identity of one rank; both recorded."""
    facts = FakeFacts()
    sample = agg_sample(model_name="deepseek-ai/DeepSeek-V3", tp=1, attention_dp=4, moe_tp=1, moe_ep=4,
                        aic_nextn=2, replicas=1, used_gpus=4)
    call, derived = build(sample, facts=facts)
    eng = call.kwargs["extra_engine_args"]
    assert eng["engine"]["aic_nextn"] == 2 and eng["dp_size"] == 4 and eng["tensor_parallel_size"] == 1
    assert {(i.nextn, i.attention_dp, i.moe_ep) for i in facts.identities} == {(2, 4, 4)}
    assert derived["agg_mtp_nextn"] == 2 and derived["agg_attention_dp_ranks"] == 4
