"""The candidates table (one flat row per candidate) and the words that describe a candidate."""

import json
import math
from typing import Any, Mapping, Sequence

import pandas as pd

from spica_pipeline.config.goal import Target
from spica_pipeline.config.precision import precision_of
from spica_pipeline.evaluate import scoring
from spica_pipeline.evaluate.scoring import Candidate
from spica_pipeline.fidelity.apply import bands

UNITS = {
    "throughput": "tok/s",
    "throughput_per_gpu": "tok/s/GPU",
    "throughput_per_user": "tok/s/user",
    "e2e_latency": "ms",
    "goodput": "tok/s",
    "goodput_per_gpu": "tok/s/GPU",
    "min_gpus": "req/s/GPU",
    "cost_per_mtok": "USD/Mtok",
}
SPREAD_STATS = ("std", "min", "max")
# The router-repeat spread kept in candidates.csv: a few headline metrics, not every report key.
SPREAD_METRICS = ("output_throughput_tok_s", "goodput_output_throughput_tok_s", "mean_ttft_ms", "p90_ttft_ms",
                  "p90_itl_ms")


def sla_attainment(c: Candidate, basis: str = "ranked") -> float | None:
    """Share of the steady-state window's requests that met the SLA (scoring.sla_attainment: at calibrated
    latencies when a calibration profile was on, `basis` "raw" or "pessimistic" for the others); None
    without an SLA."""
    return scoring.sla_attainment(c.metrics, basis)


def router_spread_pct(c: Candidate) -> float | None:
    """Throughput spread over the KV-router repeats: std as a % of the mean; None without repeats."""
    stats = (c.spread or {}).get("output_throughput_tok_s") or {}
    mean = c.metrics.get("output_throughput_tok_s")
    if stats.get("std") is None or not mean:
        return None
    return 100.0 * float(stats["std"]) / float(mean)


def plot_axes(c: Candidate) -> tuple[float, float]:
    """(tok/s/user, tok/s/GPU): the InferenceX / AI Configurator axes, from a candidate's metrics."""
    m = c.metrics
    return (scoring.objective_value("throughput_per_user", m), scoring.objective_value("throughput_per_gpu", m))


def goal_value(c: Candidate, target: str) -> float:
    """A candidate's raw value for one target (re-read from its metrics, unsigned)."""
    if c.objectives and target in c.objectives:
        return c.objectives[target]
    return scoring.objective_value(target, c.metrics)


def candidate_bands(c: Candidate, target: str | None) -> dict[str, tuple[float, float]]:
    """The P10-P90 bands of a candidate's calibrated TTFT, TPOT and, for a scalar goal, its goal
    value (empty without a calibration profile): the one reading for the table, report.md and deploy."""

    goal = target if target and target != Target.PARETO else None
    return bands(c.metrics, goal, goal_value(c, goal) if goal else None)


def fmt_value(value: float, target: str) -> str:
    if value is None or not math.isfinite(value):
        return str(value)
    unit = UNITS.get(target, "")
    text = f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.3g}"
    return f"{text} {unit}".strip()


def _shape(cfg: Mapping[str, Any], prefix: str = "") -> str:
    g = lambda k: int(cfg.get(f"{prefix}{k}", 1) or 1)  # noqa: E731
    tp, pp, dp, mtp, mep = g("tp"), g("pp"), g("attention_dp"), g("moe_tp"), g("moe_ep")
    parts = [f"TP{tp}"] if tp > 1 or dp == 1 else []
    if dp > 1:
        parts.append(f"DP{dp}")
    if pp > 1:
        parts.append(f"PP{pp}")
    if mep > 1:
        parts.append(f"EP{mep}")
    if mtp > 1 and mtp != tp:
        parts.append(f"MoE-TP{mtp}")
    return "".join(parts) if len(parts) == 1 else "+".join(parts)


def describe_shape(cfg: Mapping[str, Any]) -> str:
    """'4 x TP2 (8 GPUs)' or 'prefill 1 x TP4 + decode 2 x DP8+EP8 (24 GPUs)'; with prefill and decode on two
    GPU types each names its own ('prefill 1 x TP4 on h100_sxm + decode 2 x TP2 on h200_sxm (8 GPUs)')."""
    gpus = cfg.get("used_gpus")
    if cfg.get("deployment_mode") == "disagg":
        split = any(f"{r}_hardware_sku" in cfg for r in ("prefill", "decode"))
        on = {r: f" on {cfg.get(f'{r}_hardware_sku', cfg.get('hardware_sku'))}" if split else ""
              for r in ("prefill", "decode")}
        body = (f"prefill {cfg.get('prefill_replicas', 1)} x {_shape(cfg, 'prefill_')}{on['prefill']} + "
                f"decode {cfg.get('decode_replicas', 1)} x {_shape(cfg, 'decode_')}{on['decode']}")
    else:
        body = f"{cfg.get('replicas', 1)} x {_shape(cfg)}"
    if gpus is None:
        return body
    return f"{body} ({gpus} GPU{'' if int(gpus) == 1 else 's'})"


def describe_planner(cfg: Mapping[str, Any]) -> str:
    policy = cfg.get("planner_scaling_policy")
    if not (cfg.get("enable_throughput_scaling") or cfg.get("enable_load_scaling")):
        return "planner disabled"
    if isinstance(policy, str):
        text = f"planner {policy}"
    else:
        modes = [f"{m} every {cfg[f'{m}_adjustment_interval_seconds']:g} s" for m in ("throughput", "load")
                 if cfg.get(f"enable_{m}_scaling") and cfg.get(f"{m}_adjustment_interval_seconds") is not None]
        text = f"planner custom ({', '.join(modes) or 'scaling on'})"
    if cfg.get("load_predictor"):
        text += f" (predictor {cfg['load_predictor']})"
    return text


def describe_router(cfg: Mapping[str, Any]) -> str:
    mode = cfg.get("router_mode", "round_robin")
    if mode != "kv_router":
        return str(mode)
    knobs = [f"{k}={cfg[k]}" for k in ("overlap_score_credit", "prefill_load_scale", "router_temperature",
                                          "host_cache_hit_weight") if k in cfg]
    return f"kv_router ({', '.join(knobs)})" if knobs else "kv_router"


def describe_candidate(
    c: Candidate, target: str, objectives: Sequence[str] | None = None, *, with_value: bool = True
) -> str:
    """One line a person can read, e.g.
    'agg, vllm 0.24.0, 4 x TP2 (8 GPUs), max_num_seqs 512, round_robin, planner disabled: 1,234 tok/s/GPU'.
    """
    cfg = c.config
    mode = cfg.get("deployment_mode", c.branch or "?")
    backend = " ".join(str(x) for x in (cfg.get("backend"), cfg.get("backend_version")) if x)
    parts = [str(mode), backend or "?", describe_shape({**cfg, "used_gpus": c.used_gpus})]
    # both batching knobs of every role: two picks that differ only in one must not read alike
    labels = {"prefill": "prefill ", "decode": "decode "} if mode == "disagg" else {"agg": ""}
    for role, label in labels.items():
        for knob in ("max_num_seqs", "max_num_batched_tokens"):
            if f"{role}_{knob}" in cfg:
                parts.append(f"{label}{knob} {cfg[f'{role}_{knob}']}")
    precision = precision_of(cfg)
    if precision:
        parts.append("precision " + " ".join(f"{k}={v}" for k, v in precision.items()))
    if cfg.get("aic_nextn"):
        parts.append(f"MTP nextn {cfg['aic_nextn']}")
    if cfg.get("speculative_method"):
        drafts = int(cfg.get("speculative_num_tokens") or 0)
        parts.append(f"{cfg['speculative_method']} with {drafts} draft token{'' if drafts == 1 else 's'}")
    parts += [describe_router(cfg), describe_planner(cfg)]
    for k in ("concurrency", "kv_load_ratio"):
        if cfg.get(k) is not None:
            parts.append(f"{k} {cfg[k]:g}" if isinstance(cfg[k], float) else f"{k} {cfg[k]}")
    if not with_value:
        return ", ".join(parts)
    names = list(objectives or c.objectives or []) if target == Target.PARETO else [target]
    values = ", ".join(fmt_value(goal_value(c, n), n) + ("" if len(names) == 1 else f" ({n})") for n in names)
    return f"{', '.join(parts)}: {values}"


def _cell(v: Any) -> Any:
    """Nested config values (raw planner dicts, lists) become JSON text so every column is flat."""
    if isinstance(v, (dict, list, tuple)):
        return json.dumps(v, sort_keys=True)
    return v


def candidates_frame(candidates: Sequence[Candidate], objectives: Sequence[str] | None = None,
                     target: str | None = None) -> pd.DataFrame:
    """One row per candidate in the given order: rank, branch, score/objectives, metrics, spread,
    P10-P90 bands (calibrated TTFT/TPOT and the goal value, when a calibration profile was on), cfg.*."""

    rows = []
    for i, c in enumerate(candidates, start=1):
        per_user, per_gpu = plot_axes(c)
        row: dict[str, Any] = {"rank": i, "branch": c.branch, "spec_hash": c.spec_hash,
                               "used_gpus": c.used_gpus, "score": c.score}
        for name in objectives or []:
            row[f"obj.{name}"] = (c.objectives or {}).get(name)
        for k in scoring.METRIC_KEYS:
            row[k] = c.metrics.get(k)
        row["avg_gpu"] = scoring.avg_gpu(c.metrics)
        row["tok_s_per_gpu"] = per_gpu
        row["tok_s_per_user"] = per_user
        row["sla_attainment"] = sla_attainment(c)
        row["sla_attainment_raw"] = sla_attainment(c, "raw")
        row["sla_attainment_pessimistic"] = sla_attainment(c, "pessimistic")
        row["sla_good_requests"] = scoring.sla_good_requests(c.metrics)
        row["carries_offered_load"] = scoring.carries_load(c.metrics)
        row["replicas_to_carry"] = scoring.replicas_to_carry(c.metrics) if row["carries_offered_load"] is False \
            else None
        row["usd_per_hour"] = scoring.usd_per_hour(c.metrics)
        row["cost_per_mtok_usd"] = scoring.cost_per_mtok(c.metrics)
        row["cost_per_k_requests_usd"] = scoring.cost_per_k_requests(c.metrics)
        row["equivalent_settings"] = len(c.twins)
        row["equivalent_spec_hashes"] = " ".join(str(t.spec_hash) for t in c.twins) or None
        row["router_spread_pct"] = router_spread_pct(c)
        for metric in SPREAD_METRICS:  # the full spread stays in the ledger's `spread` column
            stats = (c.spread or {}).get(metric) or {}
            for s in SPREAD_STATS:
                if s in stats:
                    row[f"spread.{metric}.{s}"] = stats[s]
        for name, (lo, hi) in candidate_bands(c, target).items():
            row[f"band.{name}.p10"], row[f"band.{name}.p90"] = lo, hi
        for k in ("fleet_replicas", "fleet_gpus", "replica_capacity"):
            if k in c.metrics:
                row[k] = c.metrics[k]
        for k, v in c.config.items():
            row[f"cfg.{k}"] = _cell(v)
        rows.append(row)
    frame = pd.DataFrame(rows)
    return arrow_safe(frame)


def arrow_safe(frame: pd.DataFrame) -> pd.DataFrame:
    """Columns mixing strings with numbers (a knob absent in some rows is fine) become text,
    so Parquet can store them."""
    frame = frame.copy()
    for col in frame.columns:
        if frame[col].dtype != object:
            continue
        kinds = {type(v) for v in frame[col] if v is not None and not (isinstance(v, float) and math.isnan(v))}
        if len(kinds) > 1 and not kinds <= {int, float, bool}:
            frame[col] = [None if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)
                          for v in frame[col]]
    return frame
