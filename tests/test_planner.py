"""The planner scaling_policy (evaluate/planner.py): unit checks on fake snapshots, then the real replay."""

import importlib.util
import math
from pathlib import Path

import pytest

from spica_pipeline.evaluate.planner import EngineModel, build_scaling_policy
from spica_pipeline.space.candidate import Candidate

ROOT = Path(__file__).resolve().parents[1]
SLA_GOAL = {"target": "goodput", "sla": {"ttft_ms": 500.0, "itl_ms": 50.0}}
TPUT_GOAL = {"target": "throughput", "sla": None}
KEYS = {"target_prefill", "target_decode", "next_tick_ms"}


def agg_sample(**kw):
    s = {"deployment_mode": "agg", "tp": 1, "pp": 1, "attention_dp": 1, "replicas": 1, "gpu_budget": 8,
         "min_gpu_budget": None, "min_endpoint": 1, "agg_max_num_seqs": 256, "agg_max_num_batched_tokens": 8192,
         "planner_scaling_policy": "load_180_5", "enable_throughput_scaling": False, "enable_load_scaling": True,
         "throughput_adjustment_interval_seconds": 180, "load_adjustment_interval_seconds": 5,
         "max_num_fpm_samples": 64, "fpm_sample_bucket_size": 16, "load_scaling_down_sensitivity": 80,
         "load_min_observations": 3}
    s.update(kw)
    return s


IDENTITY = {"model_name": "Qwen/Qwen3-32B", "hardware_sku": "h200_sxm", "backend": "vllm"}
PINNED_ENGINE = {"block_size": 64, "gpu_memory_utilization": 0.9, "enable_prefix_caching": True}


def candidate(flat):
    """The Candidate of a planner test's flat dict, with model, system, backend and the pinned engine knobs
    filled in; the planner fields of a static dict are left out, as a static candidate has none."""
    roles = ("agg",) if flat.get("deployment_mode") == "agg" else ("prefill", "decode")
    pinned = {f"{r}_{k}": v for r in roles for k, v in PINNED_ENGINE.items()}
    return Candidate.from_dict({**IDENTITY, **pinned, **flat}, extra="ignore")


def fpm(worker, decode=10, queued_tokens=0, prefill_tokens=0, wall=0.006):
    return {"worker_id": worker, "dp_rank": 0, "wall_time": wall, "num_prefill_requests": 0,
            "sum_prefill_tokens": prefill_tokens, "num_decode_requests": decode, "num_queued_prefill": 0,
            "sum_queued_prefill_tokens": queued_tokens, "num_queued_decode": 0}


def snap(now_ms, n, *, starting=0, ttft=50.0, itl=10.0, decode=10, queued_tokens=0, num_req=50, isl=1000.0,
         osl=100.0, prefill=None, wall=0.006):
    s = {"tick_ordinal": int(now_ms // 5000), "now_ms": now_ms, "active_prefill_count": 0,
         "active_decode_count": n - starting, "starting_prefill_count": 0, "starting_decode_count": starting,
         "non_draining_prefill_count": 0, "non_draining_decode_count": n,
         "prefill_fpm_snapshots": [], "decode_fpm_snapshots": [fpm(i, decode, queued_tokens, wall=wall)
                                                               for i in range(n - starting)],
         "traffic": {"duration_s": 5.0, "num_req": num_req, "avg_isl": isl, "avg_osl": osl, "avg_ttft_ms": ttft,
                     "avg_itl_ms": itl, "shape_count": num_req, "ttft_count": num_req, "itl_count": num_req}}
    if prefill is not None:
        s["non_draining_prefill_count"] = prefill
        s["active_prefill_count"] = prefill
        s["prefill_fpm_snapshots"] = [fpm(100 + i, 0, queued_tokens, prefill_tokens=2000, wall=0.05)
                                      for i in range(prefill)]
    return s


def test_static_candidates_get_no_policy():
    assert build_scaling_policy(candidate(agg_sample(enable_load_scaling=False)), SLA_GOAL, {}) is None
    assert build_scaling_policy(candidate(agg_sample()), SLA_GOAL, {}) is not None


def test_the_policy_takes_its_target_and_sla_from_the_goal():
    sla = build_scaling_policy(candidate(agg_sample()), SLA_GOAL, {})
    assert (sla.target, sla.sla_ttft_ms, sla.sla_itl_ms) == ("sla", 500.0, 50.0)
    tput = build_scaling_policy(candidate(agg_sample()), TPUT_GOAL, {})
    assert (tput.target, tput.sla_ttft_ms, tput.sla_itl_ms) == ("throughput", None, None)
    min_gpus = {"target": "min_gpus", "sla": {"ttft_ms": 400.0, "itl_ms": 40.0}, "load": {"request_rate": 10}}
    assert build_scaling_policy(candidate(agg_sample()), min_gpus, {}).target == "sla"  # as its deployed planner runs
    latency = build_scaling_policy(candidate(agg_sample()), {"target": "e2e_latency", "sla": {"ttft_ms": 400.0}}, {})
    assert (latency.target, latency.sla_ttft_ms) == ("latency", None)  # the SLA steers only an sla planner


def test_load_scaling_up_on_sla_violation_then_down_after_calm_observations():
    p = build_scaling_policy(candidate(agg_sample()), SLA_GOAL, {})
    assert p.initial_tick_ms() == 5000.0
    out = p.on_tick(snap(5000.0, 2, ttft=1500.0))  # TTFT 3x the SLA
    assert set(out) == KEYS and out["target_decode"] == 4 and out["target_prefill"] is None
    assert out["next_tick_ms"] == 10000.0
    # while the new workers start, nothing changes
    assert p.on_tick(snap(10000.0, 4, starting=2, ttft=1500.0))["target_decode"] is None
    # calm: utilisation projected on one worker fewer is low; the third calm tick removes one
    outs = [p.on_tick(snap(15000.0 + 5000.0 * k, 4, ttft=40.0, itl=8.0, decode=5))["target_decode"] for k in range(3)]
    assert outs == [None, None, 3]


def test_scale_down_respects_sensitivity():
    p = build_scaling_policy(candidate(agg_sample(load_scaling_down_sensitivity=70)), SLA_GOAL, {})
    # pressure 0.4 -> projected 0.4 * 2 / 1 = 80% >= 70%: never calm
    outs = [p.on_tick(snap(5000.0 * (k + 1), 2, ttft=200.0, itl=10.0))["target_decode"] for k in range(6)]
    assert outs == [None] * 6


def test_queue_signal_without_sla():
    p = build_scaling_policy(candidate(agg_sample()), TPUT_GOAL, {})
    assert p.on_tick(snap(5000.0, 1, ttft=5000.0))["target_decode"] is None  # no SLA: latency alone is no signal
    out = p.on_tick(snap(10000.0, 1, queued_tokens=3 * 8192))
    assert out["target_decode"] == 2  # step capped at doubling


def test_budget_min_endpoint_and_min_gpu_budget():
    # tp=2 engines, budget 8 GPUs -> at most 4 workers
    p = build_scaling_policy(candidate(agg_sample(tp=2, gpu_budget=8)), SLA_GOAL, {})
    assert p.on_tick(snap(5000.0, 3, ttft=5000.0))["target_decode"] == 4
    for k in range(20):
        out = p.on_tick(snap(10000.0 + 5000.0 * k, 4, ttft=5000.0))
        assert out["target_decode"] is None
        assert p.history[-1]["gpus"] <= 8
    q = build_scaling_policy(candidate(agg_sample(min_endpoint=2, min_gpu_budget=6, tp=2, load_min_observations=1)),
                             SLA_GOAL, {})
    outs = [q.on_tick(snap(5000.0 * (k + 1), n, ttft=10.0, itl=1.0, decode=0))["target_decode"]
            for k, n in enumerate((4, 3, 3))]
    assert outs == [3, None, None]  # 4 -> 3 workers (6 GPUs), then min_gpu_budget holds


def test_disagg_roles_scale_separately():
    s = {"deployment_mode": "disagg", "prefill_tp": 2, "decode_tp": 1, "prefill_replicas": 1, "decode_replicas": 1,
         "gpu_budget": 5, "min_endpoint": 1, "prefill_max_num_seqs": 16, "prefill_max_num_batched_tokens": 8192,
         "decode_max_num_seqs": 256, "decode_max_num_batched_tokens": 8192, "enable_throughput_scaling": False,
         "enable_load_scaling": True, "load_adjustment_interval_seconds": 5, "load_scaling_down_sensitivity": 80,
         "load_min_observations": 3}
    p = build_scaling_policy(candidate(s), SLA_GOAL, {})
    out = p.on_tick(snap(5000.0, 1, prefill=1, ttft=1000.0, itl=10.0))
    assert out["target_prefill"] == 2 and out["target_decode"] is None  # TTFT is the prefill pool's signal
    out = p.on_tick(snap(10000.0, 1, prefill=2, ttft=100.0, itl=200.0))
    # decode wants more, but 2 prefill x 2 GPUs + 2 decode = 6 > budget 5: the grown role is trimmed
    assert out["target_decode"] is None and p.history[-1]["gpus"] <= 5


def test_engine_model_fit_and_capacity():
    m = EngineModel(max_num_seqs=256, max_num_batched_tokens=8192, max_samples=64, bucket_size=64)
    assert m.capacity_rps(1000, 100, "agg", None) is None
    m.observe([fpm(0, decode=d, wall=0.005 + 1e-4 * d) for d in (1, 40, 120, 250)])
    a, b, c = m._fit()
    assert a == pytest.approx(0.005) and c == pytest.approx(1e-4) and b is None
    assert m.capacity_rps(1000, 100, "agg", None) is None  # prefill cost still unknown
    m.observe_ttft(avg_ttft_ms=25.0, avg_isl=1000)  # (0.025 - 0.005) / 1000 s per token
    m.observe_ttft(avg_ttft_ms=900.0, avg_isl=1000)  # a queued window does not raise the estimate
    assert m.prefill_cost_hint == pytest.approx(2e-5)
    k = 2e-5 * 1000 + 1e-4 * 100
    assert m.capacity_rps(1000, 100, "agg", None) == pytest.approx(256 / (100 * 0.005 + 256 * k))
    assert m.capacity_rps(1000, 100, "agg", 0.010) == pytest.approx((1 - 0.5) / k)  # the SLA binds
    assert m.capacity_rps(1000, 100, "decode", None) == pytest.approx(256 / (100 * 0.005 + 256 * 1e-4 * 100))


def test_throughput_scaling_follows_the_forecast():
    s = agg_sample(enable_throughput_scaling=True, enable_load_scaling=False, throughput_adjustment_interval_seconds=10,
                   load_predictor="constant", load_predictor_log1p=False)
    p = build_scaling_policy(candidate(s), TPUT_GOAL, {"isl": 1000, "osl": 100})
    assert p.initial_tick_ms() == 10000.0
    # engine: 5 ms + 0.1 ms per decode request, prefill 20 us per token -> ~31 req/s per engine
    samples = [fpm(0, decode=d, wall=0.005 + 1e-4 * d) for d in (1, 40, 120, 250)]
    first = snap(10000.0, 1, ttft=25.0, num_req=1000)
    first["decode_fpm_snapshots"] = samples
    out = p.on_tick(first)  # 1000 requests in 10 s = 100 req/s
    cap = p.roles["agg"].model.capacity_rps(1000, 100, "agg", None)
    assert cap == pytest.approx(256 / (100 * 0.005 + 256 * (2e-5 * 1000 + 1e-4 * 100)), rel=1e-6)
    assert out["target_decode"] == math.ceil(100.0 / (cap * 0.85)) == 4
    assert out["next_tick_ms"] == 20000.0
    low = snap(20000.0, out["target_decode"], ttft=25.0, num_req=2)
    low["decode_fpm_snapshots"] = samples
    assert p.on_tick(low)["target_decode"] == 1  # throughput-only scaling also scales down
    dp = build_scaling_policy(candidate(dict(s, attention_dp=2, gpu_budget=16)), TPUT_GOAL, {"isl": 1000, "osl": 100})
    assert dp.on_tick(first)["target_decode"] == math.ceil(100.0 / (2 * cap * 0.85)) == 2  # two ranks per engine


def test_raising_forecaster_falls_back_to_last_value(monkeypatch):
    from spica_pipeline.space.load_predictor import predictors

    s = agg_sample(enable_throughput_scaling=True, throughput_adjustment_interval_seconds=10,
                   load_predictor="constant", load_predictor_log1p=False)

    def plan() -> dict:
        p = build_scaling_policy(candidate(s), SLA_GOAL, {"isl": 1000, "osl": 100})
        first = snap(5000.0, 1, ttft=25.0)
        first["decode_fpm_snapshots"] = [fpm(0, decode=d, wall=0.005 + 1e-4 * d) for d in (1, 40, 120)]
        p.on_tick(first)
        return p.on_tick(snap(10000.0, 1, ttft=25.0, num_req=400))

    last_value = plan()  # the constant predictor forecasts the last observed rate

    def boom(self):
        raise RuntimeError("forecast failed")

    monkeypatch.setattr(predictors.ConstantPredictor, "predict_next", boom)
    out = plan()
    assert set(out) == KEYS
    assert isinstance(out["target_decode"], int) and out["target_decode"] >= 1
    assert out["target_decode"] == last_value["target_decode"]  # planned from the last observed value


# ---- the real replay -------------------------------------------------------------------------

def _sine_trace(tmp_path):
    spec = importlib.util.spec_from_file_location("gen_sine_trace", ROOT / "scripts" / "gen_sine_trace.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    # 4 minutes, two peaks of 26 req/s and two troughs of 2 req/s, ISL 3000: ~3400 requests
    return gen.write_sine_trace(tmp_path / "sine.jsonl", duration_s=240, period_s=120, base_rps=14,
                                amplitude_rps=12, isl=3000, osl=150)


ENGINE = {"engine": {"backend": "vllm", "num_gpu_blocks": 20000, "block_size": 64, "max_num_seqs": 256,
                     "max_num_batched_tokens": 8192}, "tensor_parallel_size": 1, "startup_time": 5.0}


@pytest.mark.integration
@pytest.mark.parametrize("policy", ["load_180_5", "hybrid"])
def test_replay_scales_with_the_sine_wave(tmp_path, policy):
    import dynamo._core as dynamo_core  # in the lock: a missing replay is a failure, not a skip

    trace = str(_sine_trace(tmp_path))
    budget = 6
    extra = {} if policy == "load_180_5" else {"enable_throughput_scaling": True,
                                               "throughput_adjustment_interval_seconds": 30,
                                               "load_predictor": "kalman", "load_predictor_log1p": False,
                                               "kalman_q_level": 10.0, "kalman_q_trend": 1.0, "kalman_r": 5.0,
                                               "kalman_min_points": 3}
    sample = agg_sample(gpu_budget=budget, **extra)
    planner = build_scaling_policy(candidate(sample), SLA_GOAL, {})
    scaled = dynamo_core.run_mocker_trace_replay([trace], extra_engine_args=ENGINE, num_workers=1,
                                                 scaling_policy=planner, sla_ttft_ms=500, sla_itl_ms=50)
    static = dynamo_core.run_mocker_trace_replay([trace], extra_engine_args=ENGINE, num_workers=budget,
                                                 sla_ttft_ms=500, sla_itl_ms=50)
    s = scaled.summary
    assert s["completed_requests"] == s["num_requests"] > 3000
    avg_gpus = s["gpu_hours"] / (s["duration_ms"] / 3.6e6)
    static_gpus = static.summary["gpu_hours"] / (static.summary["duration_ms"] / 3.6e6)
    assert static_gpus == pytest.approx(budget, rel=0.01)
    assert 1.0 < avg_gpus < 0.8 * budget
    # no tick ever asked for more than the budget, and the fleet really moved both ways
    assert max(h["gpus"] for h in planner.history) <= budget
    ops = scaled.lifecycle_operations
    started = [op for op in ops if any(t["transition"] == "worker_starting" for t in op["transitions"])]
    drained = [op for op in ops if any(t["transition"] == "worker_draining" for t in op["transitions"])]
    assert started and drained
    # scale-up happens around the peaks (0-60 s and 120-180 s), scale-down in the troughs
    assert any(op["at_ms"] < 60_000 for op in started) and any(120_000 <= op["at_ms"] < 180_000 for op in started)
    assert any(60_000 <= op["at_ms"] < 120_000 for op in drained)
    peak = max(len(op["state_after_batch"]["active"]) + len(op["state_after_batch"]["starting"]) for op in ops)
    assert 2 <= peak <= budget
    # the planner keeps goodput well above a single static worker's (which serves almost nothing in time)
    one = dynamo_core.run_mocker_trace_replay([trace], extra_engine_args=ENGINE, num_workers=1,
                                              sla_ttft_ms=500, sla_itl_ms=50)
    assert s["goodput_request_throughput_rps"] > 5 * one.summary["goodput_request_throughput_rps"] + 1
