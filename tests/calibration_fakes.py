"""Calibration test helpers: bench-like records (fidelity/records.py), small methods, and a ReplayEvaluator whose
replay and timing inputs are stubbed."""

import json
from dataclasses import replace

from spica_pipeline.fidelity.bands import BandMethod
from spica_pipeline.fidelity.fit import Method, PhaseMethod


def record(i, system="h200_sxm", backend="vllm", c=8, ttft_ratio=2.0, tpot_ratio=0.5, split="calibration",
           model=None):
    """A row whose silicon is ratio x both replays (100 ms TTFT, 10 ms TPOT), a little noise on TTFT."""
    return {"id": f"r{i}", "split": split, "model": model or f"m{i % 3}", "system": system, "backend": backend,
            "concurrency": c, "shape": {"agg": {"workers": 1}}, "window_rule": "benchmark_client",
            "ours": {"ttft": 100.0, "tpot": 10.0}, "sweep": {"ttft": 100.0, "tpot": 10.0},
            "silicon": {"ttft": 100.0 * ttft_ratio * (1 + 0.01 * (i % 5)), "tpot": 10.0 * tpot_ratio}}


def client_record(i, ttft_client=200.0, ttft_sweep=50.0, silicon_ttft=300.0):
    """A row whose client replay and sweep replay differ: silicon 1.5x the client's TTFT, 6x the sweep's."""
    r = record(i)
    r["ours"] = {"ttft": ttft_client, "tpot": 10.0}
    r["sweep"] = {"ttft": ttft_sweep, "tpot": 10.0}
    r["silicon"] = {"ttft": silicon_ttft, "tpot": 5.0}
    return r


# factors in both phases on the client replay, no load term: the tests do not move with the shipped method
PLAIN = Method("test", PhaseMethod("client"), PhaseMethod("client"))
# the same with a load term (the full fitted slope)
SLOPED = Method("sloped", PhaseMethod("client", slope_shrink=1.0), PhaseMethod("client", slope_shrink=1.0))
# TTFT with a per-backend overhead from a grid
OVERHEAD = Method("overhead", replace(PLAIN.ttft, overhead_grid=(0.0, 10.0, 20.0, 30.0, 40.0)), PLAIN.tpot)
BACKEND_BANDS = Method("bands", replace(PLAIN.ttft, band=BandMethod("backend")), PLAIN.tpot)


def fake_replay(monkeypatch, tmp_path, vary):
    """The replay and its timing/KV inputs stubbed, so ReplayEvaluator runs without perf data; the FakeReplay
    records each replay call (a client replay before the sweep's), mean TTFT from `vary` in call order."""
    import dynamo._core as core
    from test_replay import FakeReplay

    from spica_pipeline.evaluate import timing
    from spica_pipeline.space import kv as kv_mod

    f = FakeReplay(vary=vary)
    monkeypatch.setattr(core, "run_mocker_trace_replay", f.trace)
    monkeypatch.setattr(core, "run_mocker_synthetic_trace_replay", f.synthetic)
    monkeypatch.setattr(timing, "kv_capacity", lambda ident, **kw: timing.KvCapacity(
        tokens_per_rank=64_000 * ident.tp, bytes_per_token=131072 // ident.tp))
    monkeypatch.setattr(timing, "timing_table", lambda ident, **kw: timing.TimingTable(
        path=str(tmp_path / f"tp{ident.tp}.npz"), speedup_ratio=10.0, key="k"))
    monkeypatch.setattr(timing, "model_context_length", lambda model: 40960)
    monkeypatch.setattr(timing, "table_estimators", lambda path: (lambda t: 100.0, lambda b, c: 10.0))
    monkeypatch.setattr(kv_mod, "estimate_kv_tokens", lambda *a, **k: 1216)
    return f


def evaluate_with_profile(tmp_path, profile, *, backend="vllm", context=None):
    """A small agg h200 candidate evaluated with `profile` (written to tmp_path) as its calibration."""
    from test_deploy import agg_candidate
    from test_replay import THROUGHPUT

    from spica_pipeline.evaluate.evaluator import EvalRequest
    from spica_pipeline.evaluate.replay import ReplayEvaluator

    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    wl = {"isl": 100, "osl": 10, "concurrency": 2, "num_request_ratio": 8}
    req = EvalRequest(agg_candidate(hardware_sku="h200_sxm", backend=backend), wl, THROUGHPUT,
                      {"calibration": {"setting": str(path)}, **(context or {})})
    return ReplayEvaluator(cache_dir=str(tmp_path)).evaluate(req)
