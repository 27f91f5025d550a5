"""Disk cache rules of evaluate/timing.py with the AIC calls replaced by counters."""

import json

import numpy as np
import pytest

from spica_pipeline.errors import InfeasibleKVCapacity
from spica_pipeline.evaluate import timing

IDENT = timing.EngineIdentity("m", "h200_sxm", "vllm", "0.24.0", tp=2)


@pytest.fixture
def counted(monkeypatch):
    calls = {"kv": 0, "table": 0}

    def fake_kv(identity, max_num_tokens, max_batch_size, memory_fraction):
        calls["kv"] += 1
        if identity.tp == 1:
            raise InfeasibleKVCapacity("no KV budget for backend=vllm, shape=tp1/pp1/dp1/moe_tp1/moe_ep1")
        return timing.KvCapacity(tokens_per_rank=100_000 * identity.tp, bytes_per_token=262144 // identity.tp)

    def fake_arrays(identity, top):
        calls["table"] += 1
        return {"prefill_isl": np.array([1.0, float(top)]), "prefill_ttft_ms": np.array([10.0, 20.0]),
                "decode_active_kv_tokens": np.array([1.0, 2.0]), "decode_context_length": np.array([1.0]),
                "decode_itl": np.array([[50.0], [60.0]])}

    monkeypatch.setattr(timing, "_estimate_kv", fake_kv)
    monkeypatch.setattr(timing, "build_timing_arrays", fake_arrays)
    timing._kv_memo.clear()
    timing._timing_memo.clear()
    return calls


def test_kv_capacity_cached_on_disk_and_in_process(tmp_path, counted):
    kw = dict(max_num_tokens=8192, max_batch_size=256, memory_fraction=0.9, cache_dir=tmp_path)
    cap = timing.kv_capacity(IDENT, **kw)
    assert cap == timing.KvCapacity(200_000, 131072) and cap.num_gpu_blocks(64) == 3125
    assert timing.kv_capacity(IDENT, **kw) == cap and counted["kv"] == 1
    timing._kv_memo.clear()
    assert timing.kv_capacity(IDENT, **kw) == cap and counted["kv"] == 1  # from disk
    # the candidate's own batching knobs are part of the identity
    timing.kv_capacity(IDENT, **{**kw, "memory_fraction": 0.8})
    assert counted["kv"] == 2
    files = list((tmp_path / "kv").iterdir())  # (only timing tables take a build lock)
    assert len(files) == 2 and not any(f.name.startswith(".") for f in files)  # no temp files left


def test_corrupt_cache_file_is_recomputed(tmp_path, counted):
    kw = dict(max_num_tokens=8192, max_batch_size=256, memory_fraction=0.9, cache_dir=tmp_path)
    timing.kv_capacity(IDENT, **kw)
    (path,) = (tmp_path / "kv").iterdir()
    path.write_text("{not json")
    timing._kv_memo.clear()
    assert timing.kv_capacity(IDENT, **kw).tokens_per_rank == 200_000 and counted["kv"] == 2
    assert json.loads(path.read_text())["tokens_per_rank"] == 200_000


def test_no_kv_budget_is_cached_and_reraised(tmp_path, counted):
    ident = timing.EngineIdentity("m", "h200_sxm", "vllm", "0.24.0", tp=1)
    kw = dict(max_num_tokens=8192, max_batch_size=256, memory_fraction=0.9, cache_dir=tmp_path)
    for _ in range(2):
        with pytest.raises(InfeasibleKVCapacity, match="no KV budget"):
            timing.kv_capacity(ident, **kw)
    assert counted["kv"] == 1


def test_block_size_must_be_positive():
    with pytest.raises(ValueError, match="block_size"):
        timing.KvCapacity(1000, 10).num_gpu_blocks(0)


def test_timing_table_keyed_by_identity(tmp_path, counted):
    a = timing.timing_table(IDENT, max_num_batched_tokens=8192, cache_dir=tmp_path)
    assert a.speedup_ratio == timing.TIME_SCALE and a.path.endswith(".npz")
    assert a.timing_model() == {"type": "external", "provider": "dynamo_profile", "config": {"path": a.path}}
    # the searched chunk budgets up to 32768 share one table; a larger one does not
    assert timing.timing_table(IDENT, max_num_batched_tokens=32768, cache_dir=tmp_path) == a
    big = timing.timing_table(IDENT, max_num_batched_tokens=65536, cache_dir=tmp_path)
    other = timing.timing_table(timing.EngineIdentity("m", "h200_sxm", "vllm", "0.24.0", tp=2, nextn=1),
                                cache_dir=tmp_path)
    assert len({a.path, big.path, other.path}) == 3 and counted["table"] == 3
    timing._timing_memo.clear()
    assert timing.timing_table(IDENT, cache_dir=tmp_path) == a and counted["table"] == 3
    with np.load(a.path) as npz:
        assert npz["prefill_isl"][-1] == 32768
    # another cache dir is another cache
    timing.timing_table(IDENT, cache_dir=tmp_path / "other")
    assert counted["table"] == 4


def test_format_version_changes_the_key(tmp_path, counted, monkeypatch):
    a = timing.timing_table(IDENT, cache_dir=tmp_path)
    monkeypatch.setattr(timing, "FORMAT_VERSION", timing.FORMAT_VERSION + 1)
    assert timing.timing_table(IDENT, cache_dir=tmp_path).path != a.path


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("SPICA_CACHE_DIR", str(tmp_path))
    assert timing.default_cache_dir() == tmp_path
    monkeypatch.delenv("SPICA_CACHE_DIR")
    assert timing.default_cache_dir().name == "spica-pipeline"


def test_aic_config_moe_and_nextn():
    dense = IDENT.aic_config()
    assert dense["tp_size"] == 2 and dense["moe_tp_size"] is None and dense["nextn"] is None
    moe = timing.EngineIdentity("m", "s", "sglang", "v", tp=1, attention_dp=4, moe_ep=4, nextn=2).aic_config()
    assert moe["moe_ep_size"] == 4 and moe["moe_tp_size"] == 1 and moe["attention_dp_size"] == 4 and moe["nextn"] == 2


def _build_in_process(cache_dir, queue):
    """Spawned child: build one identity's table with a slow fake builder, report the call count."""
    import time as _time

    from spica_pipeline.evaluate import timing as t

    calls = []

    def slow(identity, top):
        calls.append(1)
        _time.sleep(0.5)
        return {"prefill_isl": np.array([1.0, 2.0]), "prefill_ttft_ms": np.array([1.0, 2.0]),
                "decode_active_kv_tokens": np.array([1.0, 2.0]), "decode_context_length": np.array([1.0]),
                "decode_itl": np.array([[1.0], [2.0]])}

    t.build_timing_arrays = slow
    table = t.timing_table(IDENT, cache_dir=cache_dir)
    queue.put((len(calls), table.path))


def test_concurrent_builders_build_once(tmp_path):
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_build_in_process, args=(str(tmp_path), queue)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    assert sorted(n for n, _ in results) == [0, 1]
    assert len({path for _, path in results}) == 1
    with np.load(results[0][1]) as npz:
        assert npz["decode_itl"].shape == (2, 1)
