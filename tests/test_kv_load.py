import pytest

from spica_pipeline.errors import InfeasibleKVCapacity
from spica_pipeline.space.candidate import Candidate
from spica_pipeline.space.kv_load import resolve_kv_load, role_kv_capacity_tokens


class FakeEstimate:
    """Per-rank tokens by (max_num_tokens) so each role can get its own capacity; records calls."""

    def __init__(self, tokens_by_batched):
        self.tokens_by_batched = tokens_by_batched
        self.calls = []

    def __call__(self, model, sku, backend, version, shape, *, max_num_tokens, max_batch_size, memory_fraction,
                 nextn):
        self.calls.append(dict(model=model, sku=sku, backend=backend, version=version, shape=shape,
                               max_num_tokens=max_num_tokens, max_batch_size=max_batch_size,
                               memory_fraction=memory_fraction, nextn=nextn))
        value = self.tokens_by_batched[max_num_tokens]
        if isinstance(value, Exception):
            raise value
        return value


BASE = {"model_name": "m", "hardware_sku": "h200_sxm", "backend": "vllm", "backend_version": "0.24.0",
        "aic_nextn": None}


def agg(**over):
    s = dict(BASE, deployment_mode="agg", tp=1, pp=1, attention_dp=2, moe_tp=1, moe_ep=1, replicas=3,
             agg_max_num_batched_tokens=8192, agg_max_num_seqs=256, agg_block_size=64,
             agg_gpu_memory_utilization=0.9, agg_enable_prefix_caching=True)
    s.update(over)
    return Candidate.from_dict(s)


def disagg(**over):
    s = dict(BASE, deployment_mode="disagg",
             prefill_tp=2, prefill_pp=1, prefill_attention_dp=1, prefill_moe_tp=1, prefill_moe_ep=1,
             prefill_replicas=1, decode_tp=4, decode_pp=1, decode_attention_dp=1, decode_moe_tp=1,
             decode_moe_ep=1, decode_replicas=1,
             prefill_max_num_batched_tokens=16384, prefill_max_num_seqs=8, prefill_block_size=1,
             prefill_gpu_memory_utilization=0.9, decode_max_num_batched_tokens=8192, decode_max_num_seqs=512,
             decode_block_size=1, decode_gpu_memory_utilization=0.8, prefill_enable_prefix_caching=True,
             decode_enable_prefix_caching=False)
    s.update(over)
    return Candidate.from_dict(s)


def test_agg_worked_example():
    est = FakeEstimate({8192: 10_000})
    out = resolve_kv_load(agg(aic_nextn=2), 100, 100, 0.5, estimate=est)
    assert out == {"kv_load_ratio": 0.5, "concurrency": 199, "kv_load_concurrency_capacity": 399,
                   "kv_load_capacity_tokens": 59_904, "agg_kv_capacity_tokens": 59_904}
    (call,) = est.calls
    assert call["shape"] == (1, 1, 2, 1, 1) and call["max_batch_size"] == 256
    assert call["memory_fraction"] == 0.9 and call["nextn"] == 2 and call["version"] == "0.24.0"


def test_disagg_both_roles_prefill_first_decode_is_load_role():
    est = FakeEstimate({16384: 100_000, 8192: 300_000})
    out = resolve_kv_load(disagg(), 1000, 1000, 1.0, estimate=est)
    assert [c["max_num_tokens"] for c in est.calls] == [16384, 8192]
    assert est.calls[0]["shape"] == (2, 1, 1, 1, 1) and est.calls[1]["shape"] == (4, 1, 1, 1, 1)
    assert est.calls[1]["memory_fraction"] == 0.8 and est.calls[1]["nextn"] == 0
    assert out["kv_load_concurrency_capacity"] == 200 and out["concurrency"] == 200
    assert out["prefill_kv_capacity_tokens"] == 100_000 and out["decode_kv_capacity_tokens"] == 300_000
    assert out["kv_load_capacity_tokens"] == 300_000


def test_infeasible_prefill_still_fails_candidate():
    est = FakeEstimate({16384: InfeasibleKVCapacity("no KV budget for backend=vllm, shape=tp2"), 8192: 300_000})
    with pytest.raises(InfeasibleKVCapacity, match="no KV budget"):
        resolve_kv_load(disagg(), 1000, 1000, 1.0, estimate=est)


def test_ratio_zero_gives_one():
    assert resolve_kv_load(agg(), 100, 100, 0.0, estimate=FakeEstimate({8192: 10_000}))["concurrency"] == 1


def test_cannot_hold_one_request():
    est = FakeEstimate({8192: 100})
    with pytest.raises(InfeasibleKVCapacity, match="cannot hold the estimated 150 tokens"):
        resolve_kv_load(agg(attention_dp=1, replicas=1, agg_block_size=1), 100, 100, 1.0, estimate=est)


def test_zero_block_size():
    with pytest.raises(ValueError, match="agg_block_size must be greater than zero"):
        resolve_kv_load(agg(agg_block_size=0), 100, 100, 1.0, estimate=FakeEstimate({8192: 10_000}))


def test_zero_lengths():
    with pytest.raises(InfeasibleKVCapacity, match="positive average tokens per request"):
        resolve_kv_load(agg(), 0, 0, 1.0, estimate=FakeEstimate({8192: 10_000}))


def test_oversubscription_ratio():
    out = resolve_kv_load(agg(), 100, 100, 2.0, estimate=FakeEstimate({8192: 10_000}))
    assert out["concurrency"] == 798


@pytest.mark.integration
def test_real_estimator_capacity():
    s = agg(model_name="Qwen/Qwen3-32B", tp=2, attention_dp=1, replicas=1, agg_block_size=16)
    tokens = role_kv_capacity_tokens(s, "agg")
    assert 600_000 < tokens < 900_000 and tokens % 16 == 0
