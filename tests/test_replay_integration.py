"""The evaluator against the real Dynamo Replay and AIC data (small workloads, a few hundred requests)."""

import json
import random
from pathlib import Path

import numpy as np
import pytest
from test_deploy import agg_candidate, agg_sample, as_candidate, disagg_sample

from spica_pipeline.evaluate import timing
from spica_pipeline.evaluate.evaluator import EvalRequest
from spica_pipeline.evaluate.replay import ReplayEvaluator

pytestmark = pytest.mark.integration

MODEL, SKU, BACKEND = "Qwen/Qwen3-32B", "h200_sxm", "vllm"
THROUGHPUT = {"target": "throughput", "sla": None, "pareto_objectives": None}


@pytest.fixture(scope="module")
def version():
    from spica_pipeline.space.model_hw import latest_backend_version

    return latest_backend_version(SKU, BACKEND)


@pytest.fixture(scope="module")
def evaluator(tmp_path_factory):
    return ReplayEvaluator(cache_dir=str(tmp_path_factory.mktemp("spica-cache")))


def agg(version, **over):
    return agg_candidate(backend_version=version, **over)


def single(isl, osl=8):
    return {"isl": isl, "osl": osl, "concurrency": 1, "num_request_ratio": 1}


def test_single_request_ttft_equals_aic_prefill(evaluator, version):
    out = evaluator.evaluate(EvalRequest(agg(version, tp=2, replicas=1, used_gpus=2), single(4096), THROUGHPUT))
    assert out.status == "feasible", out.reason
    # one closed-loop client sends MIN_TURNS requests one after another (fidelity/measurement.py), each alone
    from spica_pipeline.fidelity.measurement import MIN_TURNS

    assert out.report["completed_requests"] == MIN_TURNS
    ident = timing.EngineIdentity(MODEL, SKU, BACKEND, version, tp=2)
    aic = timing._AicStep(ident).prefill(4096)
    assert out.report["mean_ttft_ms"] == pytest.approx(aic, rel=0.02)
    # the evaluator's capacity is the same estimate kv_load_ratio resolution uses
    from spica_pipeline.space.kv import estimate_kv_tokens

    per_rank = estimate_kv_tokens(MODEL, SKU, BACKEND, version, (2, 1, 1, 1, 1), max_num_tokens=8192,
                                  max_batch_size=256, memory_fraction=0.9)
    assert out.derived["agg_kv_tokens_per_rank"] == per_rank
    assert out.derived["agg_num_gpu_blocks"] == per_rank // 64


def test_tp8_serves_a_long_prompt_faster_than_tp1(evaluator, version):
    ttft = {}
    for tp in (1, 8):
        s = agg(version, tp=tp, replicas=1, used_gpus=tp, agg_max_num_batched_tokens=16384)
        out = evaluator.evaluate(EvalRequest(s, single(16000), THROUGHPUT))
        assert out.status == "feasible", out.reason
        ttft[tp] = out.report["mean_ttft_ms"]
    assert ttft[8] < ttft[1] / 2, ttft


def test_more_decode_blocks_never_reduce_completed_requests(evaluator, version):
    fractions = (0.5, 0.55, 0.7, 0.9)
    ident = timing.EngineIdentity(MODEL, SKU, BACKEND, version, tp=1)
    smallest = timing.kv_capacity(ident, max_num_tokens=8192, max_batch_size=256, memory_fraction=fractions[0],
                                  cache_dir=evaluator.cache_dir).num_gpu_blocks(64) * 64
    # prompts longer than the smallest engine can ever hold, shorter than the largest
    wl = {"isl": smallest + 1000, "osl": 32, "request_rate": 1.0, "num_request_ratio": 20}
    blocks, completed = [], []
    for f in fractions:
        out = evaluator.evaluate(EvalRequest(agg(version, tp=1, replicas=1, used_gpus=1,
                                                 agg_gpu_memory_utilization=f), wl, THROUGHPUT))
        assert out.status == "feasible", out.reason
        blocks.append(out.derived["agg_num_gpu_blocks"])
        completed.append(out.report["completed_requests"])
    assert blocks == sorted(blocks) and len(set(blocks)) == len(blocks)
    assert completed == sorted(completed), (blocks, completed)
    assert completed[0] < completed[-1] == 20


def test_small_prefill_pool_saturates_under_heavy_load(evaluator, version):
    wl = {"isl": 4096, "osl": 64, "request_rate": 6.0, "num_request_ratio": 40}
    balanced = disagg_sample(backend_version=version, prefill_tp=2, prefill_attention_dp=1, prefill_replicas=2,
                             decode_tp=2, decode_attention_dp=1, decode_replicas=1, used_gpus=6)
    starved = disagg_sample(backend_version=version, prefill_tp=1, prefill_attention_dp=1, prefill_replicas=1,
                            decode_tp=2, decode_attention_dp=1, decode_replicas=2, used_gpus=5)
    good = evaluator.evaluate(EvalRequest(as_candidate(balanced), wl, THROUGHPUT))
    bad = evaluator.evaluate(EvalRequest(as_candidate(starved), wl, THROUGHPUT))
    assert good.status == bad.status == "feasible", (good.reason, bad.reason)
    assert bad.report["mean_ttft_ms"] > 5 * good.report["mean_ttft_ms"], (good.report["mean_ttft_ms"],
                                                                           bad.report["mean_ttft_ms"])
    # gpu_hours follows the GPUs per engine (tp x dp) x workers
    assert good.report["prefill_gpus_per_worker"] == 2 and bad.report["prefill_gpus_per_worker"] == 1


def test_goodput_never_exceeds_throughput(evaluator, version):
    goal = {"target": "goodput", "sla": {"ttft_ms": 300.0, "itl_ms": 25.0}, "pareto_objectives": None}
    # a load the engine sustains: at 8 req/s TPOT settles near 90 ms, so the steady-state window
    # (fidelity/measurement.py) rightly has no goodput at all (only the first requests met the SLA)
    wl = {"isl": 2048, "osl": 128, "request_rate": 4.0, "num_request_ratio": 30}
    out = evaluator.evaluate(EvalRequest(agg(version, tp=2, replicas=1, used_gpus=2), wl, goal))
    assert out.status == "feasible", out.reason
    r = out.report
    assert 0 < r["goodput_output_throughput_tok_s"] <= r["output_throughput_tok_s"]
    assert r["goodput_completed_requests"] <= r["completed_requests"]


def test_kv_router_repeats_produce_a_spread(evaluator, version):
    s = agg(version, tp=1, replicas=4, used_gpus=4, router_mode="kv_router", overlap_score_credit=1.0,
            prefill_load_scale=1.0, router_temperature=0.0)
    wl = {"isl": 3000, "osl": 200, "request_rate": 30.0, "num_request_ratio": 10, "shared_prefix_ratio": 0.5,
          "num_prefix_groups": 8}
    out = evaluator.evaluate(EvalRequest(s, wl, THROUGHPUT, {"router_repeats": 4}))
    assert out.status == "feasible", out.reason
    assert out.repeats == 4
    sp = out.spread["mean_ttft_ms"]
    assert sp["min"] < sp["max"] and sp["std"] > 0
    assert sp["min"] <= out.report["mean_ttft_ms"] <= sp["max"]


def test_trace_workload_with_shared_prefixes(evaluator, version, tmp_path):
    rng = random.Random(0)
    lines, t = [], 0.0
    for i in range(300):
        t += rng.expovariate(10.0) * 1000
        group = rng.randrange(6)
        prefix = [group * 100 + k for k in range(4)]
        tail = [10_000 + i * 10 + k for k in range(2)]
        lines.append({"timestamp": round(t, 3), "input_length": 6 * 512 - 100, "output_length": 100,
                      "hash_ids": prefix + tail})
    path = tmp_path / "mc.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    s = agg(version, tp=2, replicas=2, used_gpus=4, router_mode="kv_router", overlap_score_credit=1.0,
            prefill_load_scale=1.0, router_temperature=0.0)
    out = evaluator.evaluate(EvalRequest(s, {"trace_path": str(path)}, THROUGHPUT, {"router_repeats": 2}))
    assert out.status == "feasible", out.reason
    assert out.report["num_requests"] == out.report["completed_requests"] == 300
    assert out.report["prefix_cache_reused_ratio"] > 0.3


def test_cached_identity_is_reused_the_second_time(tmp_path, version):
    ident = timing.EngineIdentity(MODEL, SKU, BACKEND, version, tp=8)  # model built earlier: tabulation only
    cold = timing.timing_table(ident, cache_dir=tmp_path)
    mtime = Path(cold.path).stat().st_mtime_ns
    warm = timing.timing_table(ident, cache_dir=tmp_path)  # the in-process memo
    timing._timing_memo.clear()
    disk = timing.timing_table(ident, cache_dir=tmp_path)  # read back from disk, not rebuilt
    assert cold == warm == disk
    assert Path(disk.path).stat().st_mtime_ns == mtime
    with np.load(cold.path) as npz:
        assert npz["prefill_isl"][-1] >= 32768
        assert npz["decode_itl"].shape == (len(npz["decode_active_kv_tokens"]), len(npz["decode_context_length"]))
        assert (npz["decode_itl"] > 1.0).all()  # stored x TIME_SCALE: clear of the replay's 1 ms floor
    ev = ReplayEvaluator(cache_dir=str(tmp_path))
    request = EvalRequest(agg_candidate(backend_version=version, tp=8, replicas=1, used_gpus=8), single(1024), THROUGHPUT)
    first = ev.evaluate(request)
    again = ev.evaluate(request)
    for key in ("mean_ttft_ms", "mean_itl_ms", "duration_ms", "gpu_hours"):  # round robin is deterministic
        assert first.report[key] == again.report[key]


def test_pool_worker_runs_the_real_evaluator(evaluator, version):
    """The Dagster resource survives the spawn round trip and gives the in-process result."""
    from spica_pipeline.evaluate.pool import EvaluationPool

    request = EvalRequest(agg(version, tp=2, replicas=2, used_gpus=4),
                          {"isl": 1024, "osl": 64, "request_rate": 5.0, "num_request_ratio": 20}, THROUGHPUT)
    local = evaluator.evaluate(request)
    with EvaluationPool(evaluator, workers=1, max_eval_seconds=120) as pool:
        (remote,) = pool.evaluate_wave([request])
    assert remote.status == local.status == "feasible", remote.reason
    for key in ("mean_ttft_ms", "mean_itl_ms", "duration_ms", "gpu_hours", "completed_requests"):
        assert remote.report[key] == local.report[key]
    assert remote.derived == local.derived
