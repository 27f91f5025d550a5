"""The pure replay-argument builder against a fake `EngineFacts` (no AIC, no disk, no replay)."""

import pytest
from test_deploy import agg_sample, disagg_sample

from spica_pipeline.errors import CandidateBuildError, InfeasibleKVCapacity
from spica_pipeline.search.engine_args import (
    EngineFacts,
    EngineIdentity,
    KvCapacity,
    ReplaySettings,
    build_replay_call,
    role_gpus,
)
from spica_pipeline.search.evaluation import EvalRequest

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
    call = build_replay_call(EvalRequest(sample, workload, goal), ReplaySettings(**settings), facts or FakeFacts(),
                             derived)
    return call, derived


def test_agg_synthetic_arguments():
    call, derived = build(agg_sample())
    # 4 ramped closed-loop clients (search/measurement.py), MIN_TURNS requests each
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
    with pytest.raises(CandidateBuildError) as info:
        build(agg_sample(deployment_mode="mixed"))
    assert info.value.detail.startswith("ValueError: deployment_mode must be")


def test_trace_checked_through_facts(tmp_path):
    facts = FakeFacts()
    call, _ = build(agg_sample(), workload={"trace_path": "/t.jsonl"}, facts=facts, trace_block_size=256)
    assert facts.traces == [("/t.jsonl", 40960, 256)] and call.kwargs["trace_block_size"] == 256


def test_role_gpus():
    assert role_gpus(agg_sample()) == 4
