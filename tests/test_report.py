"""Merge by goal and the output layer, on a synthetic ledger shaped like optimize/ledger.py's."""

import json
import math
import random
import re

import pandas as pd
import pytest
import yaml

from spica_pipeline.evaluate import scoring
from spica_pipeline.report import merge_candidates, write_outputs
from spica_pipeline.report.dgd import manifest_gpus, validate_manifest
from spica_pipeline.report.tables import describe_candidate

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _agg_config(rng, i):
    tp = rng.choice([1, 2, 4])
    replicas = rng.choice([1, 2, 4])
    router = rng.choice(["round_robin", "kv_router"])
    cfg = {
        "deployment_mode": "agg", "backend": "vllm", "backend_version": "0.24.0",
        "model_name": "Qwen/Qwen3-32B", "hardware_sku": "h200_sxm", "gpu_budget": 16,
        "tp": tp, "pp": 1, "attention_dp": 1, "moe_tp": 1, "moe_ep": 1, "strategy": "tp",
        "replicas": replicas, "used_gpus": tp * replicas,
        "agg_max_num_seqs": rng.choice([256, 512, 1024]), "agg_max_num_batched_tokens": 8192,
        "agg_block_size": 64, "agg_gpu_memory_utilization": 0.9, "agg_enable_prefix_caching": True,
        "router_mode": router, "planner_scaling_policy": "disabled",
        "enable_throughput_scaling": False, "enable_load_scaling": False, "concurrency": 32 + i,
    }
    if router == "kv_router":
        cfg.update(overlap_score_credit=0.5, prefill_load_scale=1.0, router_temperature=0.0)
    return cfg


def _disagg_config(rng, i):
    p_tp, d_tp = rng.choice([1, 2]), rng.choice([1, 2, 4])
    p_r, d_r = rng.choice([1, 2]), rng.choice([1, 2])
    cfg = {
        "deployment_mode": "disagg", "backend": "vllm", "backend_version": "0.24.0",
        "model_name": "Qwen/Qwen3-32B", "hardware_sku": "h200_sxm", "gpu_budget": 16,
        **{f"prefill_{k}": 1 for k in ("pp", "attention_dp", "moe_tp", "moe_ep")},
        **{f"decode_{k}": 1 for k in ("pp", "attention_dp", "moe_tp", "moe_ep")},
        "prefill_tp": p_tp, "decode_tp": d_tp, "prefill_replicas": p_r, "decode_replicas": d_r,
        "prefill_strategy": "tp", "decode_strategy": "tp", "used_gpus": p_tp * p_r + d_tp * d_r,
        "prefill_max_num_seqs": 8, "decode_max_num_seqs": rng.choice([256, 512]),
        "prefill_max_num_batched_tokens": 16384, "decode_max_num_batched_tokens": 8192,
        "prefill_block_size": 64, "decode_block_size": 64, "prefill_gpu_memory_utilization": 0.9,
        "decode_gpu_memory_utilization": 0.9, "prefill_enable_prefix_caching": True,
        "decode_enable_prefix_caching": False, "router_mode": "round_robin",
        "planner_scaling_policy": {"enable_throughput_scaling": True, "enable_load_scaling": False,
                                   "throughput_adjustment_interval_seconds": 240, "load_adjustment_interval_seconds": 5},
        "enable_throughput_scaling": True, "enable_load_scaling": False,
        "throughput_adjustment_interval_seconds": 240, "load_adjustment_interval_seconds": 5,
        "kv_load_ratio": round(rng.random(), 3),
    }
    return cfg


def _report(rng, gpus):
    thr = rng.uniform(500, 6000) * math.sqrt(gpus)
    per_user = rng.uniform(10, 120)
    return {"output_throughput_tok_s": thr, "mean_output_token_throughput_per_user": per_user,
            "mean_ttft_ms": rng.uniform(50, 900), "mean_tpot_ms": 1000 / per_user,
            "mean_e2e_latency_ms": rng.uniform(1000, 9000), "gpu_hours": gpus * 0.5, "duration_ms": 1.8e6,
            "goodput_output_throughput_tok_s": thr * 0.8}


def make_ledger(seed=3, n=36):
    """Both branches interleaved, every outcome class, one repeated feasible spec and cache hits."""
    rng = random.Random(seed)
    rows = []
    per_branch = {"agg": 0, "disagg": 0}
    for i in range(n):
        branch = "agg" if i % 3 else "disagg"
        per_branch[branch] += 1
        cfg = _agg_config(rng, i) if branch == "agg" else _disagg_config(rng, i)
        status, reason, report, spread = "feasible", None, None, {}
        r = rng.random()
        if i in (5, 11, 17):
            status, reason = "failed", "replay failed: RuntimeError: boom"
        elif i == 7:
            status, reason = "infeasible", "KV cache cannot hold 4 concurrent requests"
        elif i == 13:
            status, reason = "timed_out", "exceed runtime: replay > 60s"
        elif i == 19:
            status, reason = "unsupported", "backend 'vllm' does not support this parallel config"
        if status == "feasible":
            report = _report(rng, cfg["used_gpus"])
            if cfg["router_mode"] == "kv_router":
                spread = {"output_throughput_tok_s": {"std": 12.0, "min": 100.0, "max": 130.0}}
        h = f"h{i:03d}"
        rows.append(_row(branch, per_branch[branch], status, reason, h, cfg, report, spread, r))
    # A cache hit repeating an earlier feasible row, and a repeated feasible spec from the other branch.
    first = next(x for x in rows if x["status"] == "feasible")
    rows.append({**first, "status": "cached", "trial": 99, "replay_seconds": 0.0})
    rows.append({**first, "trial": 100, "branch": "disagg" if first["branch"] == "agg" else "agg"})
    return pd.DataFrame(rows)


def _row(branch, trial, status, reason, h, cfg, report, spread, r):
    return {
        "branch": branch, "trial": trial, "round": trial // 4, "source": "vizier", "status": status,
        "reason": reason, "spec_hash": h, "selection": json.dumps({"backend": cfg["backend"]}),
        "parallel_config": json.dumps({"tp": cfg.get("tp", 1)}), "config": json.dumps(cfg),
        "report": json.dumps(report) if report is not None else None, "spread": json.dumps(spread),
        "used_gpus": cfg["used_gpus"], "score": None, "objectives": None,
        "replay_seconds": 1.0 + r, "optimizer_seconds": 0.25, "projection": None,
    }


GOAL = {"target": "throughput_per_gpu", "gpu_budget": 16}
WORKLOAD = {"kind": "synthetic", "isl": 4000, "osl": 1000, "concurrency": "per candidate"}


def _feasible_rows(ledger):
    return ledger[ledger["status"] == "feasible"].drop_duplicates("spec_hash")


def test_scalar_merge_ranks_unique_feasible_rows():
    ledger = make_ledger()
    m = merge_candidates(ledger, "throughput_per_gpu", gpu_budget=16)
    feas = _feasible_rows(ledger)
    over = int((feas["used_gpus"] > 16).sum())
    assert len(m.candidates) == len(feas) - over and m.over_budget == over
    assert {c.spec_hash for c in m.candidates} <= set(feas["spec_hash"])
    scores = [c.score for c in m.candidates]
    assert scores == sorted(scores, reverse=True)
    for c in m.candidates:
        report = json.loads(ledger.loc[ledger["spec_hash"] == c.spec_hash, "report"].iloc[0])
        assert c.score == pytest.approx(scoring.score("throughput_per_gpu", report))
    # The repeated spec keeps the branch of its first occurrence.
    first = ledger[ledger["status"] == "feasible"].iloc[0]
    dup = next(c for c in m.feasible if c.spec_hash == first["spec_hash"])
    assert dup.branch == first["branch"]
    assert m.duplicates == 2
    assert m.counts["failed"] == 3 and m.counts["cached"] == 1 and m.counts["unsupported"] == 1
    assert m.failure_reasons[0] == ("replay failed: RuntimeError: boom", 3)
    assert m.failure_summary(1)[-1] == "+3 more distinct reason(s)"
    assert "best throughput_per_gpu=" in m.summary_line()


def test_scalar_convergence_is_monotone_and_ends_at_best():
    ledger = make_ledger()
    m = merge_candidates(ledger, "e2e_latency")
    merged = m.convergence[m.convergence["scope"] == "merged"]
    assert len(merged) == len(ledger) - m.counts["cached"]
    vals = merged["value"].dropna().tolist()
    assert vals == sorted(vals) and vals[-1] == pytest.approx(m.candidates[0].score)
    assert m.candidates[0].score == -min(c.metrics["mean_e2e_latency_ms"] for c in m.feasible)
    for b in m.branches:
        part = m.convergence[m.convergence["scope"] == b]
        best_b = max(c.score for c in m.feasible if c.branch == b)
        assert part["value"].iloc[-1] == pytest.approx(best_b)


def test_pareto_merge_front_is_non_dominated_with_hypervolume():
    ledger = make_ledger(seed=11, n=60)
    m = merge_candidates(ledger, "pareto")
    dirs = m.directions
    assert list(dirs) == ["throughput_per_gpu", "throughput_per_user"]
    vec = lambda c: tuple(c.objectives[o] for o in dirs)  # noqa: E731
    for c in m.candidates:
        assert not any(scoring.dominates(vec(o), vec(c), list(dirs.values())) for o in m.feasible)
    for c in m.feasible:
        if c not in m.candidates:
            assert any(scoring.dominates(vec(f), vec(c), list(dirs.values())) for f in m.candidates)
    xs = [c.objectives["throughput_per_user"] for c in m.candidates]
    assert xs == sorted(xs)
    assert m.hypervolume == pytest.approx(scoring.hypervolume(m.feasible, dirs, m.reference)) and m.hypervolume > 0
    hv = m.convergence[m.convergence["scope"] == "merged"]["value"].dropna().tolist()
    assert hv == sorted(hv) and hv[-1] == pytest.approx(m.hypervolume)


def test_merge_rejects_bad_input():
    ledger = make_ledger()
    with pytest.raises(ValueError, match="missing column"):
        merge_candidates(ledger.drop(columns=["report"]), "throughput")
    with pytest.raises(ValueError, match="unknown optimization target"):
        merge_candidates(ledger, "speed")


def test_empty_ledger_merges_to_nothing():
    ledger = make_ledger().iloc[0:0]
    m = merge_candidates(ledger, "throughput")
    assert m.candidates == [] and m.best is None and "NO feasible candidate" in m.summary_line()


@pytest.mark.parametrize("target", ["throughput_per_gpu", "pareto"])
def test_write_outputs_files_are_present_and_consistent(tmp_path, target):
    ledger = make_ledger(seed=5, n=45)
    ledger.loc[ledger["branch"] == "disagg", "source"] = "exhaustive"
    m = merge_candidates(ledger, target, gpu_budget=16)
    paths = write_outputs(tmp_path, ledger, m, goal_summary={**GOAL, "target": target},
                          workload_summary=WORKLOAD, timings={"wall_seconds": 12.5}, top_n=3)
    for name in ("ledger.parquet", "candidates.parquet", "candidates.csv", "report.md", "pareto.png",
                 "convergence.png"):
        assert (tmp_path / name).is_file(), name
    assert not list(tmp_path.rglob("*.tmp"))
    assert set(paths) >= {"ledger", "candidates", "report", "pareto_png", "convergence_png"}

    back = pd.read_parquet(tmp_path / "ledger.parquet")
    assert len(back) == len(ledger) and list(back["spec_hash"]) == list(ledger["spec_hash"])

    cands = pd.read_parquet(tmp_path / "candidates.parquet")
    csv = pd.read_csv(tmp_path / "candidates.csv")
    assert len(cands) == len(csv) == len(m.candidates)
    assert set(cands["spec_hash"]) <= set(_feasible_rows(ledger)["spec_hash"])
    assert list(cands["rank"]) == list(range(1, len(cands) + 1))
    assert {"cfg.backend", "cfg.used_gpus", "output_throughput_tok_s", "tok_s_per_gpu"} <= set(cands.columns)
    kv = cands[cands["cfg.router_mode"] == "kv_router"]
    assert kv.empty or kv["spread.output_throughput_tok_s.std"].notna().all()
    if target == "pareto":
        assert {"obj.throughput_per_gpu", "obj.throughput_per_user"} <= set(cands.columns)
        pts = list(zip(cands["obj.throughput_per_gpu"], cands["obj.throughput_per_user"]))
        assert scoring.pareto_front(pts, ["max", "max"]) == sorted(pts, key=lambda p: p[1])
    else:
        assert list(cands["score"]) == sorted(cands["score"], reverse=True)

    text = (tmp_path / "report.md").read_text()
    assert f"| failed | {m.counts['failed']} |" in text and f"| feasible | {m.counts['feasible']} |" in text
    assert "replay failed: RuntimeError: boom (x3)" in text
    assert "branch `disagg`: enumerated exhaustively" in text and "branch `agg`: searched by Vizier" in text
    best = m.best
    best_section = text.split("## Best configuration")[1].split("\n", 1)[1].split("##")[0]
    assert describe_candidate(best, m.target, m.objectives) in best_section
    assert best_section.strip().startswith(f"{best.config['deployment_mode']}, vllm 0.24.0, ")
    assert re.search(rf"\({best.used_gpus} GPUs?\)", best_section)
    assert f"duplicates (cache hits and repeated specs, not replayed again): {m.duplicates}" in text
    assert "| SLA met [pess.] | p90 TTFT ms | p90 ITL ms | router spread |" in text
    assert len([c for c in cands.columns if c.startswith("spread.")]) <= 15 and "router_spread_pct" in cands.columns
    if target == "pareto":
        rec, rule = m.recommendation
        assert rec is best and f"Picked by the rule **{rule}**" in text
        front_rows = text.split("## Pareto front")[1].split("\n\n")[1].splitlines()[2:]
        assert len(front_rows) == len(m.candidates)  # the whole front, every point with its rank
        assert sum("★" in r for r in front_rows) == 1 and m.top(1)[0] is rec

    for png in ("pareto.png", "convergence.png"):
        data = (tmp_path / png).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 10_000

    top = m.top(3)
    for rank, cand in enumerate(top, start=1):
        doc = yaml.safe_load((tmp_path / "deploy" / str(rank) / "simulation_record.yaml").read_text())
        dgd_doc = yaml.safe_load((tmp_path / "deploy" / str(rank) / "dgd.yaml").read_text())
        assert validate_manifest(dgd_doc) == [] and manifest_gpus(dgd_doc) == cand.used_gpus
        assert doc["config"] == cand.config
        assert doc["rank"] == rank and doc["total_gpus"] == cand.used_gpus
        assert doc["backend"] == "vllm" and doc["backend_version"] == "0.24.0"
        assert doc["model"] == "Qwen/Qwen3-32B"
        roles = doc["workers"]
        if cand.config["deployment_mode"] == "agg":
            assert roles["agg"]["count"] == cand.config["replicas"]
            assert roles["agg"]["engine_args"]["max_num_seqs"] == cand.config["agg_max_num_seqs"]
            assert roles["agg"]["parallel"]["tp"] * roles["agg"]["count"] == cand.used_gpus
        else:
            assert roles["decode"]["count"] == cand.config["decode_replicas"]
            assert doc["planner"]["enabled"] and doc["planner"]["settings"]["throughput_adjustment_interval_seconds"] == 240
            gpus = sum(r["count"] * r["gpus_per_worker"] for r in roles.values())
            assert gpus == cand.used_gpus
        assert doc["router"]["mode"] == cand.config["router_mode"]
        assert "dgd.yaml" in (tmp_path / "deploy" / str(rank) / "README.md").read_text()
    assert not (tmp_path / "deploy" / str(len(top) + 1)).exists()


def test_write_outputs_with_no_feasible_candidate(tmp_path):
    ledger = make_ledger()
    ledger["status"] = "failed"
    m = merge_candidates(ledger, "throughput")
    write_outputs(tmp_path, ledger, m, goal_summary=GOAL, workload_summary=WORKLOAD, timings={})
    assert "No feasible candidate" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "pareto.png").read_bytes()[:8] == PNG_MAGIC
    assert pd.read_parquet(tmp_path / "candidates.parquet").empty
    assert not (tmp_path / "deploy").exists()


def test_cli_lines_follow_the_spica_format():
    ledger = make_ledger()
    scalar = merge_candidates(ledger, "throughput")
    lines = scalar.cli_lines()
    top = scalar.candidates[0]
    assert lines[0] == f"0: score={top.score} used_gpus={top.used_gpus}" and len(lines) == len(scalar.candidates)
    front = merge_candidates(ledger, "pareto")
    lines = front.cli_lines()
    assert lines[0] == f"pareto front ({len(front.candidates)} non-dominated):"
    c = front.candidates[0]
    v = c.objectives["throughput_per_gpu"]
    assert lines[1].startswith(f"0: throughput_per_gpu={v:.4g}, throughput_per_user=")
    assert lines[1].endswith(f"used_gpus={c.used_gpus}")
    assert merge_candidates(ledger.iloc[0:0], "pareto").cli_lines() == []


def test_importing_scoring_and_report_leaves_jax_alone():
    import subprocess
    import sys

    code = ("import os, sys; import spica_pipeline.evaluate.scoring, spica_pipeline.report; "
            "print('JAX_PLATFORMS' in os.environ, 'jax' in sys.modules, 'vizier' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={k: v for k, v in __import__("os").environ.items() if k != "JAX_PLATFORMS"})
    assert out.stdout.split() == ["False", "False", "False"]


def test_describe_candidate_in_words():
    from spica_pipeline.evaluate.scoring import Candidate

    cfg = {"deployment_mode": "agg", "backend": "vllm", "backend_version": "0.24.0", "tp": 2, "pp": 1,
           "attention_dp": 1, "moe_tp": 1, "moe_ep": 1, "replicas": 4, "used_gpus": 8,
           "agg_max_num_seqs": 512, "router_mode": "round_robin", "planner_scaling_policy": "disabled",
           "enable_throughput_scaling": False, "enable_load_scaling": False}
    report = {"output_throughput_tok_s": 9872.0, "gpu_hours": 4.0, "duration_ms": 1.8e6}
    c = Candidate.from_report(cfg, report, "throughput_per_gpu", branch="agg")
    assert describe_candidate(c, "throughput_per_gpu") == (
        "agg, vllm 0.24.0, 4 x TP2 (8 GPUs), max_num_seqs 512, round_robin, planner disabled: 1,234 tok/s/GPU")
    moe = {**cfg, "deployment_mode": "disagg", "prefill_tp": 8, "prefill_moe_ep": 8, "prefill_replicas": 1,
           "decode_tp": 1, "decode_attention_dp": 8, "decode_moe_ep": 8, "decode_replicas": 2, "used_gpus": 24,
           "router_mode": "kv_router", "overlap_score_credit": 1.0, "planner_scaling_policy": "throughput_180_5",
           "enable_throughput_scaling": True}
    c = Candidate.from_report(moe, report, "e2e_latency", branch="disagg")
    text = describe_candidate(c, "e2e_latency", with_value=False)
    assert text.startswith("disagg, vllm 0.24.0, prefill 1 x TP8+EP8 + decode 2 x DP8+EP8 (24 GPUs)")
    assert "kv_router (overlap_score_credit=1.0)" in text and text.endswith("planner throughput_180_5")
    # picks that differ only in one role's batched tokens do not read alike
    knobs = {"prefill_max_num_seqs": 16, "decode_max_num_seqs": 512, "decode_max_num_batched_tokens": 8192}
    lines = {describe_candidate(Candidate.from_report({**moe, **knobs, "prefill_max_num_batched_tokens": t}, report,
                                                      "e2e_latency", branch="disagg"), "e2e_latency", with_value=False)
             for t in (8192, 32768)}
    assert len(lines) == 2 and any("prefill max_num_seqs 16, prefill max_num_batched_tokens 32768, decode max_num_seqs "
                                   "512, decode max_num_batched_tokens 8192" in line for line in lines)


def test_merge_for_config_reads_goal_and_budget(tmp_path):
    from types import SimpleNamespace

    from spica_pipeline.config.goal import OptimizationGoal
    from spica_pipeline.report import merge_for_config

    ledger = make_ledger(seed=5, n=45)
    cfg = SimpleNamespace(goal=OptimizationGoal(target="pareto", pareto_objectives=["e2e_latency", "throughput"]),
                          search_space=SimpleNamespace(gpu_budget=4))
    m = merge_for_config(ledger, cfg)
    assert m.objectives == ["e2e_latency", "throughput"] and m.directions == {"e2e_latency": "min", "throughput": "max"}
    assert all(c.used_gpus <= 4 for c in m.feasible) and m.over_budget > 0
    write_outputs(tmp_path, ledger, m, goal_summary={"target": "pareto"}, workload_summary={}, timings={},
                  branch_notes={"agg": "space of 90 points > evaluation budget 40: Vizier DEFAULT"})
    assert "branch `agg`: searched by Vizier (space of 90 points" in (tmp_path / "report.md").read_text()


def test_merge_reads_a_ledger_built_from_trial_records():
    from spica_pipeline.optimize.ledger import TrialRecord

    cfg = {"deployment_mode": "agg", "backend": "vllm", "tp": 2, "replicas": 2, "used_gpus": 4}
    report = {"output_throughput_tok_s": 1000.0, "gpu_hours": 1.0, "duration_ms": 9e5,
              "mean_output_token_throughput_per_user": 30.0}
    recs = [
        TrialRecord("agg", 0, 0, "vizier", "unsupported", None, None, used_gpus=8),
        TrialRecord("agg", 1, 0, "vizier", "feasible", None, "abc", config=cfg, report=report, used_gpus=4),
        TrialRecord("agg", 2, 0, "vizier", "cached", None, "abc", used_gpus=4),
    ]
    ledger = pd.DataFrame([r.to_row() for r in recs])
    m = merge_candidates(ledger, "throughput_per_gpu", gpu_budget=8)
    assert [c.score for c in m.candidates] == [pytest.approx(250.0)]
    assert m.failure_reasons == [("unsupported", 1)] and m.duplicates == 1
    assert m.candidates[0].spec_hash == "abc" and m.candidates[0].branch == "agg"


def test_plot_axes_follow_the_goal_and_zero_goal_values_are_off_the_front():
    from spica_pipeline.report.plots import _front, plot_axes_for

    ledger = make_ledger(seed=5, n=45)
    assert plot_axes_for(merge_candidates(ledger, "goodput_per_gpu")) == ("throughput_per_user", "goodput_per_gpu")
    assert plot_axes_for(merge_candidates(ledger, "goodput")) == ("throughput_per_user", "goodput_per_gpu")
    assert plot_axes_for(merge_candidates(ledger, "throughput")) == ("throughput_per_user", "throughput_per_gpu")
    assert plot_axes_for(merge_candidates(ledger, "pareto")) == ("throughput_per_user", "throughput_per_gpu")
    # the fastest per-user point served no goodput: it is not on the plotted front
    assert _front([(10.0, 5.0), (99.0, 0.0), (20.0, 4.0)], ("max", "max")) == [(10.0, 5.0), (20.0, 4.0)]


def test_knee_is_the_recommended_front_point():
    vectors = [(100.0, 1.0), (90.0, 5.0), (60.0, 8.0), (10.0, 10.0)]
    i, rule = scoring.knee_index(vectors, ["max", "max"])
    assert i in (1, 2) and rule.startswith("knee")
    assert scoring.knee_index([(1.0, 1.0)], ["max", "max"])[0] == 0
    i, rule = scoring.knee_index([(3.0, 1.0, 2.0), (2.0, 2.0, 2.0), (1.0, 3.0, 1.0)], ["max"] * 3)
    assert i == 1 and rule.startswith("closest to the ideal")


def test_a_rerun_with_fewer_picks_drops_stale_deploy_folders(tmp_path):
    ledger = make_ledger(seed=5, n=45)
    m = merge_candidates(ledger, "throughput_per_gpu", gpu_budget=16)
    write_outputs(tmp_path, ledger, m, goal_summary=GOAL, workload_summary=WORKLOAD, timings={}, top_n=5)
    assert (tmp_path / "deploy" / "5" / "dgd.yaml").is_file()
    write_outputs(tmp_path, ledger, m, goal_summary=GOAL, workload_summary=WORKLOAD, timings={}, top_n=2)
    assert sorted(p.name for p in (tmp_path / "deploy").iterdir()) == ["1", "2"]


def test_fidelity_note_and_precision_reach_report_csv_and_deploy(tmp_path):
    """Substitute perf data is never silent: report.md, candidates.csv and deploy/ all say so."""
    ledger = make_ledger(seed=5, n=45)
    note = "sglang 0.5.16 perf data on h200_sxm has no MLA attention data; timed with bf16 attention"
    configs = [json.loads(c) for c in ledger["config"]]
    for cfg in configs:
        cfg.update(fidelity_note=note, precision_weights="fp8", precision_kv_cache="fp8", aic_nextn=1)
    ledger["config"] = [json.dumps(c) for c in configs]
    m = merge_candidates(ledger, "throughput_per_gpu", gpu_budget=16)
    write_outputs(tmp_path, ledger, m, goal_summary=GOAL, workload_summary=WORKLOAD, timings={}, top_n=1)
    report = (tmp_path / "report.md").read_text()
    assert "## Fidelity notes" in report and note in report
    assert "precision weights=fp8 kv_cache=fp8" in report and "MTP nextn 1" in report
    assert "not 1/TPOT" in report and "5-15%" not in report
    assert "Latency: p90 TTFT" in report  # the SLA question, answered even without an SLA
    csv = pd.read_csv(tmp_path / "candidates.csv")
    assert (csv["cfg.fidelity_note"] == note).all() and (csv["cfg.precision_weights"] == "fp8").all()
    record = yaml.safe_load((tmp_path / "deploy" / "1" / "simulation_record.yaml").read_text())
    assert record["fidelity_note"] == note and record["precision"] == {"weights": "fp8", "kv_cache": "fp8"}
    assert record["speculative_decoding"] == {"method": "mtp", "nextn": 1}
    dgd = (tmp_path / "deploy" / "1" / "dgd.yaml").read_text()
    assert f"# fidelity note: {note}" in dgd and "--quantization" in dgd


def test_best_configuration_answers_the_sla_question(tmp_path):
    ledger = make_ledger(seed=5, n=45)
    reports = [json.loads(r) if isinstance(r, str) else r for r in ledger["report"]]
    for r in reports:
        if isinstance(r, dict):
            r.update(completed_requests=200.0, goodput_completed_requests=180.0, p90_ttft_ms=420.0, p90_itl_ms=25.0)
    ledger["report"] = [json.dumps(r) if isinstance(r, dict) else None for r in reports]
    m = merge_candidates(ledger, "throughput_per_gpu", gpu_budget=16)
    write_outputs(tmp_path, ledger, m, goal_summary={**GOAL, "sla": {"ttft_ms": 500.0, "itl_ms": 30.0}},
                  workload_summary=WORKLOAD, timings={}, top_n=1)
    report = (tmp_path / "report.md").read_text()
    assert ("SLA (ttft <= 500 ms, itl <= 30 ms): 90.0% (180 of 200) of the window's requests met it "
            "(replayed 90.0%); p90 TTFT 420 ms, p90 ITL 25 ms.") in report


def test_a_custom_planner_is_described_by_its_intervals():
    from spica_pipeline.report.tables import describe_planner

    cfg = {"planner_scaling_policy": {"enable_throughput_scaling": True}, "enable_throughput_scaling": True,
           "enable_load_scaling": True, "throughput_adjustment_interval_seconds": 240.0,
           "load_adjustment_interval_seconds": 5}
    assert describe_planner(cfg) == "planner custom (throughput every 240 s, load every 5 s)"
