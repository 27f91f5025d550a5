"""ReplayEvaluator dispatch rules (spec §7.4, §11 item 20) against a recording fake replay."""

import json
import pickle
import sys
import types

import dynamo._core as core
import pytest
from test_deploy import agg_candidate, agg_sample, as_candidate, disagg_candidate

from spica_pipeline.errors import InfeasibleKVCapacity
from spica_pipeline.evaluate import replay as replay_mod
from spica_pipeline.evaluate import timing
from spica_pipeline.evaluate.evaluator import EvalRequest
from spica_pipeline.evaluate.replay import ReplayEvaluator, summarise_repeats
from spica_pipeline.space import kv as kv_mod

THROUGHPUT = {"target": "throughput", "sla": None, "pareto_objectives": None}
GOODPUT = {"target": "goodput", "sla": {"ttft_ms": 500.0, "itl_ms": 30.0, "e2e_ms": None}, "pareto_objectives": None}
SUMMARY = {"num_requests": 10, "completed_requests": 10, "output_throughput_tok_s": 1000.0, "mean_ttft_ms": 50.0,
           "gpu_hours": 0.1, "duration_ms": 1000.0, "kv_eviction_policy": "lru", "power_coverage": None}


class FakeReplay:
    """Records every replay call; returns a summary object like the offline result."""

    def __init__(self, summary=None, raises=None, vary=None):
        self.calls = []
        self.summary = dict(SUMMARY if summary is None else summary)
        self.raises = raises
        self.vary = vary

    def _result(self):
        if self.raises:
            raise self.raises
        s = dict(self.summary)
        if self.vary:
            s["mean_ttft_ms"] = self.vary[len(self.calls) - 1]
        return types.SimpleNamespace(summary=s)

    def trace(self, *args, **kwargs):
        self.calls.append(("trace", args, kwargs))
        return self._result()

    def synthetic(self, *args, **kwargs):
        self.calls.append(("synthetic", args, kwargs))
        return self._result()


@pytest.fixture
def fake(monkeypatch, tmp_path):
    f = FakeReplay()
    monkeypatch.setattr(core, "run_mocker_trace_replay", f.trace)
    monkeypatch.setattr(core, "run_mocker_synthetic_trace_replay", f.synthetic)
    monkeypatch.setattr(timing, "kv_capacity",
                        lambda ident, **kw: timing.KvCapacity(tokens_per_rank=64_000 * ident.tp, bytes_per_token=131072 // ident.tp))
    monkeypatch.setattr(timing, "timing_table", lambda ident, **kw: timing.TimingTable(
        path=str(tmp_path / f"tp{ident.tp}.npz"), speedup_ratio=10.0, key="k"))
    monkeypatch.setattr(timing, "model_context_length", lambda model: 40960)
    # a closed loop's ramp reads its request-cycle estimate from the (here fake) timing table
    monkeypatch.setattr(timing, "table_estimators", lambda path: (lambda t: 100.0, lambda b, c: 10.0))
    monkeypatch.setattr(kv_mod, "estimate_kv_tokens", lambda *a, **k: 1216)
    return f


def trace_file(tmp_path, n=3, isl=1000):
    p = tmp_path / "trace.jsonl"
    p.write_text("".join(json.dumps({"timestamp": i * 100, "input_length": isl, "output_length": 10,
                                     "hash_ids": list(range(-(-isl // 512)))}) + "\n" for i in range(n)))
    return str(p)


def ev(**kw):
    return ReplayEvaluator(cache_dir="/nonexistent-unused", **kw)


def test_static_agg_trace(fake, tmp_path):
    path = trace_file(tmp_path)
    out = ev().evaluate(EvalRequest(agg_candidate(), {"trace_path": path, "arrival_speedup_ratio": 2.0}, THROUGHPUT))
    assert out.status == "feasible", out.reason
    ((fn, args, kw),) = fake.calls
    assert fn == "trace" and args == ([path],)
    assert kw["num_workers"] == 2 and kw["capture_per_request"] is True
    assert kw["trace_block_size"] == 512 and kw["arrival_speedup_ratio"] == 2.0
    assert kw["replay_concurrency"] is None
    assert not any(k.startswith("sla_") for k in kw)
    assert "prefill_engine_args" not in kw and kw["router_mode"] == "round_robin" and kw["router_config"] is None
    eng = kw["extra_engine_args"]
    assert eng["tensor_parallel_size"] == 2 and eng["dp_size"] == 1
    e = eng["engine"]
    assert e["num_gpu_blocks"] == 128_000 // 64 and e["block_size"] == 64 and e["worker_type"] == "aggregated"
    assert e["speedup_ratio"] == 10.0 and e["timing_model"]["provider"] == "dynamo_profile"
    assert e["max_model_len"] == 40960 and e["backend"] == "vllm"
    assert "kv_transfer_bandwidth" not in e
    # numeric summary keys only; strings and None dropped
    assert out.report["output_throughput_tok_s"] == 1000.0 and "kv_eviction_policy" not in out.report
    assert out.repeats == 1 and out.spread == {}
    assert out.derived["agg_num_gpu_blocks"] == 2000


def test_trace_replay_concurrency_passed(fake, tmp_path):
    wl = {"trace_path": trace_file(tmp_path), "replay_concurrency": 32}
    assert ev().evaluate(EvalRequest(agg_candidate(), wl, THROUGHPUT)).status == "feasible"
    assert fake.calls[0][2]["replay_concurrency"] == 32


def test_bad_trace_fails_before_replay(fake, tmp_path):
    path = trace_file(tmp_path, isl=50_000)  # longer than the 40960 context
    out = ev().evaluate(EvalRequest(agg_candidate(), {"trace_path": path}, THROUGHPUT))
    assert out.status == "failed" and fake.calls == []
    assert out.reason.startswith("candidate build failed: TraceError: ") and "trace.jsonl:1:" in out.reason
    out = ev().evaluate(EvalRequest(agg_candidate(context_length=65536), {"trace_path": path}, THROUGHPUT))
    assert out.status == "feasible"


def test_goodput_threads_sla(fake, tmp_path):
    ev().evaluate(EvalRequest(agg_candidate(), {"trace_path": trace_file(tmp_path)}, dict(GOODPUT)))
    kw = fake.calls[0][2]
    assert kw["sla_ttft_ms"] == 500.0 and kw["sla_itl_ms"] == 30.0 and "sla_e2e_ms" not in kw


def test_goodput_threads_sla_on_planner_path(fake, tmp_path, monkeypatch):
    built = []

    class Policy:
        def __init__(self):
            self.ticks = 0

        def initial_tick_ms(self):
            return 1000.0

        def on_tick(self, snapshot):
            return {"target_prefill": None, "target_decode": None, "next_tick_ms": None}

    def build_scaling_policy(candidate, goal, workload):
        built.append((candidate.scaling_policy, goal.target.value, workload.get("trace_path")))  # typed goal
        return Policy()

    planner = types.ModuleType("spica_pipeline.evaluate.planner")
    planner.build_scaling_policy = build_scaling_policy
    monkeypatch.setitem(sys.modules, "spica_pipeline.evaluate.planner", planner)
    s = agg_sample(planner_scaling_policy="load_180_5", enable_load_scaling=True,
                   throughput_adjustment_interval_seconds=180, load_adjustment_interval_seconds=5,
                   max_num_fpm_samples=64, fpm_sample_bucket_size=16, load_scaling_down_sensitivity=80,
                   load_min_observations=5)
    out = ev().evaluate(EvalRequest(as_candidate(s), {"trace_path": trace_file(tmp_path)}, dict(GOODPUT)))
    assert out.status == "failed"  # the fake summary has no goodput key: fail closed
    kw = fake.calls[0][2]
    assert kw["sla_ttft_ms"] == 500.0 and kw["sla_itl_ms"] == 30.0
    assert kw["scaling_policy"].initial_tick_ms() == 1000.0
    assert built == [("load_180_5", "goodput", kw and fake.calls[0][1][0][0])]


def test_goodput_missing_fails_closed(fake, tmp_path):
    out = ev().evaluate(EvalRequest(agg_candidate(), {"trace_path": trace_file(tmp_path)}, dict(GOODPUT)))
    assert out.status == "failed" and "per-request SLA accounting" in out.reason
    pareto = {"target": "pareto", "pareto_objectives": ["goodput", "throughput_per_user"],
              "sla": {"ttft_ms": 500.0, "itl_ms": 30.0}}
    out = ev().evaluate(EvalRequest(agg_candidate(), {"trace_path": trace_file(tmp_path)}, pareto))
    assert out.status == "failed" and "per-request SLA accounting" in out.reason
    fake.summary["goodput_output_throughput_tok_s"] = 800.0
    out = ev().evaluate(EvalRequest(agg_candidate(), {"trace_path": trace_file(tmp_path)}, dict(GOODPUT)))
    assert out.status == "feasible" and out.report["goodput_output_throughput_tok_s"] == 800.0


def test_synthetic_concurrency(fake):
    wl = {"isl": 100, "osl": 100, "concurrency": 4, "num_request_ratio": 25}
    out = ev().evaluate(EvalRequest(agg_candidate(), wl, THROUGHPUT))
    fn, args, kw = fake.calls[0]
    # 4 ramped clients (fidelity/measurement.py): one session each, started one cycle / 4 apart,
    # each sending its next request when the previous completes; 25 requests per client
    assert fn == "synthetic" and args == (100, 100, 4)
    assert kw["replay_concurrency"] is None and kw["turns_per_session"] == 25 and kw["inter_turn_delay_ms"] == 0
    assert kw["arrival_interval_ms"] == pytest.approx((100.0 + 99 * 10.0) / 4)  # fake prefill 100, decode 10
    assert "request_rate" not in kw and kw["arrival_speedup_ratio"] == 1.0
    assert out.derived["concurrency"] == 4 and out.derived["request_count"] == 100
    assert out.derived["ramp"]["clients"] == 4 and out.derived["window_rule"] == "closed_loop"


def test_kv_load_override(fake):
    # per-rank 1216 tokens, block 64 -> 1216 usable; avg 150 tokens -> capacity concurrency 8
    wl = {"isl": 100, "osl": 100, "kv_load_ratio": 1.0, "num_request_ratio": 25}
    out = ev().evaluate(EvalRequest(agg_candidate(replicas=1, used_gpus=2), wl, THROUGHPUT))
    fn, args, kw = fake.calls[0]
    assert args == (100, 100, 8) and kw["turns_per_session"] == 25 and kw["replay_concurrency"] is None
    assert out.derived["concurrency"] == 8 and out.derived["kv_load_concurrency_capacity"] == 8
    assert out.derived["agg_kv_capacity_tokens"] == 1216


def test_kv_load_ratio_from_sample_under_pareto(fake):
    wl = {"isl": 100, "osl": 100, "kv_load_ratio": [0.0, 1.0], "num_request_ratio": 25}
    out = ev().evaluate(EvalRequest(agg_candidate(replicas=1, kv_load_ratio=0.5), wl,
                                    {"target": "pareto", "sla": None, "pareto_objectives": None}))
    assert out.derived["concurrency"] == 4 and fake.calls[0][1][2] == 4  # 4 ramped clients


def test_request_rate(fake):
    wl = {"isl": 100, "osl": 100, "request_rate": 20.0, "num_request_ratio": 4}
    ev().evaluate(EvalRequest(agg_candidate(), wl, THROUGHPUT))
    fn, args, kw = fake.calls[0]
    assert args == (100, 100, 80) and kw["arrival_interval_ms"] == 50.0 and kw["replay_concurrency"] is None


def test_kv_router_config_and_repeats(fake):
    fake.vary = [10.0, 20.0, 30.0, 40.0]
    s = agg_sample(router_mode="kv_router", overlap_score_credit=0.5, prefill_load_scale=2.0, router_temperature=0.0)
    wl = {"isl": 100, "osl": 100, "concurrency": 4, "num_request_ratio": 2}
    out = ev().evaluate(EvalRequest(as_candidate(s), wl, THROUGHPUT))
    assert len(fake.calls) == 3 and out.repeats == 3
    assert isinstance(fake.calls[0][2]["router_config"], core.KvRouterConfig)
    assert fake.calls[0][2]["router_mode"] == "kv_router"
    assert out.report["mean_ttft_ms"] == pytest.approx(20.0)
    assert out.spread["mean_ttft_ms"]["min"] == 10.0 and out.spread["mean_ttft_ms"]["max"] == 30.0
    assert out.spread["mean_ttft_ms"]["std"] > 0
    fake.calls.clear()
    fake.vary = None
    ev().evaluate(EvalRequest(as_candidate(s), wl, THROUGHPUT, {"router_repeats": 2}))
    assert len(fake.calls) == 2


def test_disagg(fake, tmp_path):
    out = ev(kv_transfer_bandwidth_gbps=10.0).evaluate(
        EvalRequest(disagg_candidate(), {"trace_path": trace_file(tmp_path)}, THROUGHPUT))
    assert out.status == "feasible", out.reason
    kw = fake.calls[0][2]
    assert "num_workers" not in kw and "extra_engine_args" not in kw
    assert kw["num_prefill_workers"] == 1 and kw["num_decode_workers"] == 1
    pre, dec = kw["prefill_engine_args"], kw["decode_engine_args"]
    assert pre["engine"]["worker_type"] == "prefill" and dec["engine"]["worker_type"] == "decode"
    assert pre["engine"]["kv_transfer_bandwidth"] == 10.0
    assert pre["engine"]["kv_transfer_bytes_per_token"] == 131072 // 2
    assert "kv_transfer_bandwidth" not in dec["engine"]
    # decode: tp2 x attention_dp2 -> 2 GPUs per rank, 2 ranks
    assert dec["tensor_parallel_size"] == 2 and dec["dp_size"] == 2
    assert dec["engine"]["enable_prefix_caching"] is False and dec["engine"]["max_num_seqs"] == 512


def test_backend_specific_engine_fields(fake):
    wl = {"isl": 100, "osl": 100, "concurrency": 4, "num_request_ratio": 2}
    ev().evaluate(EvalRequest(agg_candidate(backend="sglang", agg_max_num_batched_tokens=16384), wl, THROUGHPUT))
    cfg = fake.calls[-1][2]["extra_engine_args"]
    assert cfg["engine"]["sglang"]["chunked_prefill_size"] == 16384 and cfg["mem_fraction_static"] == 0.9
    offload = {"num_g2_blocks": 500, "kv_bytes_per_token": 131072, "bandwidth_g1_to_g2_gbps": 20.0}
    ev().evaluate(EvalRequest(agg_candidate(startup_time=30.0, aic_nextn=1, **offload), wl, THROUGHPUT))
    cfg = fake.calls[-1][2]["extra_engine_args"]
    assert cfg["startup_time"] == 30.0 and cfg["engine"]["aic_nextn"] == 1
    assert cfg["engine"]["native_host_offload"] == {"num_host_blocks": 500, "d2h_bandwidth_gbps": 20.0}
    assert cfg["engine"]["kv_cache_bytes_per_token"] == 131072


def test_outcome_classes(fake, monkeypatch):
    wl = {"isl": 100, "osl": 100, "concurrency": 4, "num_request_ratio": 2}

    def no_budget(ident, **kw):
        raise InfeasibleKVCapacity("no KV budget for backend=vllm, shape=tp2/pp1/dp1/moe_tp1/moe_ep1")

    over = ev().evaluate(EvalRequest(agg_candidate(tp=8, gpu_budget=8), wl, THROUGHPUT))
    assert over.status == "infeasible" and over.reason == "over gpu_budget: used_gpus=16 > gpu_budget=8"
    bad_shape = ev().evaluate(EvalRequest(agg_candidate(agg_block_size=0), wl, THROUGHPUT))
    assert bad_shape.status == "failed" and bad_shape.reason.startswith("candidate build failed: ")
    fake.raises = RuntimeError("engine\nexploded")
    failed = ev().evaluate(EvalRequest(agg_candidate(), wl, THROUGHPUT))
    assert failed.status == "failed" and failed.reason == "replay failed: RuntimeError: engine exploded"
    fake.raises = None
    sla_mix = dict(GOODPUT, sla={"ttft_ms": 1.0, "itl_ms": 1.0, "e2e_ms": 5.0})
    mixed = ev().evaluate(EvalRequest(agg_candidate(), wl, sla_mix))
    assert mixed.status == "failed" and "cannot combine e2e_ms" in mixed.reason
    monkeypatch.setattr(timing, "kv_capacity", no_budget)
    inf = ev().evaluate(EvalRequest(agg_candidate(), wl, THROUGHPUT))
    assert inf.status == "infeasible" and "no KV budget" in inf.reason


def test_exactly_one_controller_everywhere(fake, tmp_path):
    cases = [{"isl": 10, "osl": 10, "concurrency": 3, "num_request_ratio": 2},
             {"isl": 10, "osl": 10, "request_rate": 5.0, "num_request_ratio": 2},
             {"isl": 10, "osl": 10, "kv_load_ratio": 0.5, "num_request_ratio": 2}]
    for wl in cases:
        ev().evaluate(EvalRequest(agg_candidate(), wl, THROUGHPUT))
        kw = fake.calls[-1][2]
        assert sum(kw.get(k) is not None for k in ("replay_concurrency", "arrival_interval_ms")) == 1
        assert "request_rate" not in kw


def test_summarise_repeats():
    report, spread = summarise_repeats([{"a": 1.0, "b": "x", "c": 2}, {"a": 3.0, "b": "y", "c": 2}])
    assert report == {"a": 2.0, "c": 2.0}
    assert spread["a"] == {"std": 1.0, "min": 1.0, "max": 3.0}
    assert summarise_repeats([{"a": 1.0}])[1] == {}


def test_pickles_by_config():
    e = ReplayEvaluator(cache_dir="/x", kv_transfer_bandwidth_gbps=12.5, router_repeats=5)
    back = pickle.loads(pickle.dumps(e))
    assert isinstance(back, ReplayEvaluator)
    assert (back.cache_dir, back.kv_transfer_bandwidth_gbps, back.router_repeats) == ("/x", 12.5, 5)
    assert replay_mod.os.environ.get("DYN_LOG")


def test_missing_planner_module_fails_the_build(fake, monkeypatch):
    monkeypatch.setitem(sys.modules, "spica_pipeline.evaluate.planner", None)  # import raises ImportError
    s = agg_sample(planner_scaling_policy="load_180_5", enable_load_scaling=True,
                   throughput_adjustment_interval_seconds=180, load_adjustment_interval_seconds=5)
    out = ev().evaluate(EvalRequest(as_candidate(s), {"isl": 10, "osl": 10, "concurrency": 2, "num_request_ratio": 2}, THROUGHPUT))
    assert out.status == "failed" and out.reason.startswith("candidate build failed: ") and fake.calls == []


def test_resource_fields_validated():
    import pydantic

    with pytest.raises(pydantic.ValidationError):
        ReplayEvaluator(router_repeats=0)
    with pytest.raises(pydantic.ValidationError):
        ReplayEvaluator(kv_transfer_bandwidth_gbps=0)


def test_synthetic_context_check_counts_input_and_output():
    from spica_pipeline.evaluate.engine_args import CandidateBuildError, check_context

    check_context(40904, 56, 40960)
    with pytest.raises(CandidateBuildError, match=r"workload.isl=40904 \+ workload.osl=283 = 41187 tokens"):
        check_context(40904, 283, 40960)
    with pytest.raises(CandidateBuildError, match="workload.isl=50000 exceeds"):
        check_context(50000, 1, 40960)


def test_candidate_build_error_is_a_spica_error():
    from spica_pipeline.errors import CandidateBuildError, PerfModelError, SpicaError

    assert issubclass(CandidateBuildError, SpicaError) and issubclass(PerfModelError, CandidateBuildError)


def test_perf_model_refusal_keeps_its_name(fake, monkeypatch):
    """An AIC refusal (no perf data) is an expected candidate failure, recorded under its own name."""

    class PerfDataNotAvailableError(RuntimeError):
        pass

    def no_data(ident, **kw):
        raise PerfDataNotAvailableError("perf database error: context MLA data\nmissing")

    monkeypatch.setattr(timing, "timing_table", no_data)
    wl = {"isl": 100, "osl": 100, "concurrency": 4, "num_request_ratio": 2}
    out = ev().evaluate(EvalRequest(agg_candidate(), wl, THROUGHPUT))
    assert out.status == "failed" and fake.calls == []
    assert out.reason == "candidate build failed: PerfDataNotAvailableError: perf database error: context MLA data missing"


def test_a_bug_is_an_internal_error_with_traceback(fake, monkeypatch, caplog):
    """A programming error (here a KeyError) is logged with its traceback, never disguised."""

    def typo(ident, **kw):
        return {}["tokens_per_rank"]

    monkeypatch.setattr(timing, "kv_capacity", typo)
    wl = {"isl": 100, "osl": 100, "concurrency": 4, "num_request_ratio": 2}
    with caplog.at_level("ERROR", logger="spica_pipeline.evaluate.replay"):
        out = ev().evaluate(EvalRequest(agg_candidate(), wl, THROUGHPUT))
    assert out.status == "failed" and out.reason.startswith("internal error: KeyError: 'tokens_per_rank'")
    assert any(r.exc_info and r.exc_info[0] is KeyError for r in caplog.records)
    fake.raises = TypeError("unexpected keyword argument 'x'")  # our call is wrong, not the candidate
    monkeypatch.undo()
    monkeypatch.setattr(core, "run_mocker_synthetic_trace_replay", fake.synthetic)
    monkeypatch.setattr(timing, "kv_capacity", lambda ident, **kw: timing.KvCapacity(64_000, 65536))
    monkeypatch.setattr(timing, "timing_table", lambda ident, **kw: timing.TimingTable("/x.npz", 10.0, "k"))
    monkeypatch.setattr(timing, "model_context_length", lambda model: 40960)
    monkeypatch.setattr(timing, "table_estimators", lambda path: (lambda t: 100.0, lambda b, c: 10.0))
    out = ev().evaluate(EvalRequest(agg_candidate(), wl, THROUGHPUT))
    assert out.status == "failed" and out.reason.startswith("internal error: TypeError")


def test_engine_args_is_pure():
    """search/engine_args imports neither Dagster, the resources, the replay nor AIC."""
    import subprocess

    code = ("import sys, spica_pipeline.evaluate.engine_args; "
            "print([m for m in sys.modules if m.split('.')[0] in ('dagster', 'dynamo', 'aiconfigurator_core') "
            "or m.startswith('spica_pipeline.resources')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
