"""`recommendation.json`: our ledger in the AI Simulate Sweeper `SweepResult` envelope, and back.

The envelope follows ai-dynamo/aisimulate docs/sweeper/results.md (schema 1.0: candidates in
evaluation order, counts, `views.top_n` / `views.pareto_front` by `candidate_id`, run provenance
with the validated config and the SHA-256 of its canonical JSON). We write `schema_version` 1.1,
which adds the `resource_limited` status (an evaluation stopped by a resource limit of the sweeper
itself: memory, a trace or output cap), so it is not mistaken for a modelled infeasibility.

Lossless: every candidate record carries its ledger row verbatim under
`provenance.runner_metadata.spica.ledger_row` (the envelope's place for runner data it does not
type), cache-hit rows (the envelope has no row for them) ride in run provenance, and the column
order and dtypes are recorded, so `sweep_result_to_ledger(ledger_to_sweep_result(L))` equals `L`.
"""

import hashlib
import json
import re
from typing import Any, Mapping, Sequence

import pandas as pd

from spica_pipeline.config.types import is_finite_number
from spica_pipeline.jsonvalue import canonical_json, json_safe, plain

SCHEMA_VERSION = "1.1"
ACCEPTED_VERSIONS = ("1.0", "1.1")
STATUSES = ("feasible", "infeasible", "unsupported", "timed_out", "failed", "resource_limited")
REASON_CATEGORIES = (
    "gpu_budget", "kv_capacity", "sla_constraint", "backend_topology", "runtime_timeout",
    "candidate_materialization", "replay_runtime", "runner_contract", "invalid_metrics", "no_samples",
    "parallel_projection", "adapter_constraint", "resource_limit", "unknown",
)
# (pattern on the reason text, status, category); first match wins, checked in order.
_RULES: tuple[tuple[str, str | None, str], ...] = (
    (r"out of memory|MemoryError|memory limit|resource limit|too many open files", "resource_limited",
     "resource_limit"),
    (r"gpu[_ ]budget|over budget|exceeds? the budget", None, "gpu_budget"),
    (r"\bKV\b|kv cache|kv budget|kv capacity", None, "kv_capacity"),
    (r"\bSLA\b|ttft_ms|itl_ms|e2e_ms", None, "sla_constraint"),
    (r"does not support|unsupported", None, "backend_topology"),
    (r"projection", None, "parallel_projection"),
    (r"no (finished|completed) requests|no samples", None, "no_samples"),
    (r"metric", None, "invalid_metrics"),
    (r"context length|cannot build|needs exactly one load controller", None, "candidate_materialization"),
)
_STATUS_DEFAULT_CATEGORY = {"timed_out": "runtime_timeout", "unsupported": "backend_topology",
                            "failed": "replay_runtime", "infeasible": "unknown"}


def classify(status: str, reason: str | None) -> tuple[str, str | None]:
    """(envelope status, reason category) of one ledger outcome; feasible has no category."""
    if status == "feasible":
        return "feasible", None
    text = reason or ""
    for pattern, new_status, category in _RULES:
        if re.search(pattern, text, re.IGNORECASE):
            if new_status is not None:
                return new_status, category
            if status == "timed_out":
                return status, "runtime_timeout"
            return status, category
    return status, _STATUS_DEFAULT_CATEGORY.get(status, "unknown")


def config_sha256(config_json: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json(config_json).encode()).hexdigest()


def _loads(value: Any) -> Any:
    if isinstance(value, str) and value:
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, (dict, list)) else None


def _candidate_id(index: int) -> str:
    return f"candidate-{index + 1:06d}"


def _topology(cfg: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("deployment_mode", "tp", "pp", "attention_dp", "moe_tp", "moe_ep", "replicas")
    roles = ("prefill_", "decode_") if cfg.get("deployment_mode") == "disagg" else ("",)
    return {f"{r}{k}" if k != "deployment_mode" else k: cfg[f"{r}{k}" if k != "deployment_mode" else k]
            for r in roles for k in keys if (f"{r}{k}" if k != "deployment_mode" else k) in cfg}


def ledger_to_sweep_result(
    ledger: pd.DataFrame, merge: Any, *, config_json: Mapping[str, Any], top_n: int = 10,
    goal: Mapping[str, Any] | None = None, implementation: str = "spica-pipeline",
) -> dict[str, Any]:
    """The envelope of one sweep: `merge` is its MergeResult (ranking or front), `config_json` the
    validated config as JSON. Deterministic: same ledger and config give the same document."""
    rows = ledger.to_dict("records")
    candidates: list[dict[str, Any]] = []
    cache_rows: list[dict[str, Any]] = []
    first_id: dict[str, str] = {}
    counts = {s: 0 for s in STATUSES}
    counts["cache_hits"] = 0
    scored = {c.spec_hash: c for c in (merge.feasible if merge is not None else [])}
    is_pareto = bool(merge is not None and merge.is_pareto)
    for i, row in enumerate(rows):
        plain = {k: json_safe(v) for k, v in row.items()}
        if plain.get("status") == "cached":
            counts["cache_hits"] += 1
            cache_rows.append({"ledger_index": i, "row": plain})
            continue
        status, category = classify(str(plain.get("status")), plain.get("reason"))
        counts[status] += 1
        cfg = _loads(plain.get("config")) or {}
        report = _loads(plain.get("report")) or {}
        metrics = {k: v for k, v in report.items() if is_finite_number(v)}
        cid = _candidate_id(i)
        h = plain.get("spec_hash")
        cand = scored.get(h) if status == "feasible" else None
        if status == "feasible" and h is not None:
            first_id.setdefault(h, cid)
        score = None
        objectives = None
        if cand is not None:
            if is_pareto:
                objectives = {k: float(v) for k, v in (cand.objectives or {}).items()}
                score = objectives.get(merge.objectives[0]) if objectives else None
            else:
                score = float(cand.score)
        record = {
            "candidate_id": cid,
            "status": status,
            "config": cfg,
            "prediction_config": None,
            "used_gpus": plain.get("used_gpus"),
            "score": score,
            "metrics": metrics,
            "objectives": objectives,
            "reason_category": category,
            "reason": plain.get("reason"),
            "provenance": {
                "model": cfg.get("model_name"), "hardware": cfg.get("hardware_sku"),
                "backend": cfg.get("backend"), "backend_version": cfg.get("backend_version"),
                "topology": _topology(cfg),
                "workload": {k: cfg[k] for k in ("concurrency", "request_rate", "kv_load_ratio",
                                                 "kv_load_concurrency") if cfg.get(k) is not None},
                "objective": dict(goal or {}),
                "runner_metadata": {"spica": {"ledger_index": i, "ledger_row": plain,
                                              **_fidelity({**cfg, **plain}, report)}},
            },
        }
        candidates.append(record)
    counts["evaluated"] = sum(counts[s] for s in ("feasible", "infeasible", "timed_out", "failed",
                                                  "resource_limited"))
    views: dict[str, list[str]] = {"top_n": [], "pareto_front": []}
    if merge is not None and merge.candidates:
        picks = [first_id[c.spec_hash] for c in merge.candidates if c.spec_hash in first_id]
        if is_pareto:
            views["pareto_front"] = picks
        else:
            views["top_n"] = picks[:top_n]
    exhaustive = set(getattr(merge, "exhaustive_branches", []) or [])
    branches = set(getattr(merge, "branches", []) or [])
    config_json = dict(config_json)
    digest = config_sha256(config_json)
    return {
        "schema_version": SCHEMA_VERSION,
        "candidate_retention": "all",
        "counts": counts,
        "candidates": candidates,
        "views": views,
        "provenance": {
            "search_strategy": "exhaustive" if branches and branches <= exhaustive else "optimizer_guided",
            "run_id": f"spica-{digest[:16]}",
            "implementation": implementation,
            "input_fingerprint": {"algorithm": "sha256", "config_sha256": digest},
            "config": config_json,
            "runner_metadata": {"spica": {
                "ledger_columns": [{"name": str(c), "dtype": str(ledger[c].dtype)} for c in ledger.columns],
                "cache_hit_rows": cache_rows,
                "target": getattr(merge, "target", None),
                "recommended": (first_id.get(merge.recommendation[0].spec_hash)
                                if merge is not None and merge.recommendation is not None else None),
                "load_target": getattr(merge, "load_target", None),
                "objectives": list(getattr(merge, "objectives", []) or []),
            }},
        },
    }


def _fidelity(row: Mapping[str, Any], report: Mapping[str, Any]) -> dict[str, Any]:
    """Seam for precision and error bands: ledger/report fields whose names say so travel along."""
    keys = [k for k in (*row, *report) if re.search(r"fidelity|error_band|band_|precision", str(k))]
    out = {k: row.get(k, report.get(k)) for k in dict.fromkeys(keys)}
    return {"fidelity": out} if out else {}


def sweep_result_to_ledger(doc: Mapping[str, Any]) -> pd.DataFrame:
    """Our ledger back from an envelope we wrote; a foreign one (no ledger rows) is refused."""
    version = doc.get("schema_version")
    if version not in ACCEPTED_VERSIONS:
        raise ValueError(f"schema_version {version!r} is not one of {list(ACCEPTED_VERSIONS)}")
    meta = ((doc.get("provenance") or {}).get("runner_metadata") or {}).get("spica")
    if not isinstance(meta, dict) or "ledger_columns" not in meta:
        raise ValueError("provenance.runner_metadata.spica.ledger_columns is missing: not a spica export, "
                         "so there is no ledger to restore")
    indexed: list[tuple[int, dict[str, Any]]] = []
    for i, cand in enumerate(doc.get("candidates") or []):
        spica = ((cand.get("provenance") or {}).get("runner_metadata") or {}).get("spica") or {}
        if "ledger_row" not in spica:
            raise ValueError(f"candidates[{i}] ({cand.get('candidate_id')}) has no ledger row")
        indexed.append((int(spica["ledger_index"]), dict(spica["ledger_row"])))
    for item in meta.get("cache_hit_rows") or []:
        indexed.append((int(item["ledger_index"]), dict(item["row"])))
    indexed.sort(key=lambda t: t[0])
    if [i for i, _ in indexed] != list(range(len(indexed))):
        raise ValueError("ledger rows are not a contiguous sequence (a candidate was dropped or duplicated)")
    columns = [c["name"] for c in meta["ledger_columns"]]
    frame = pd.DataFrame([r for _, r in indexed], columns=columns)
    for c in meta["ledger_columns"]:
        frame[c["name"]] = _restore(frame[c["name"]], c["dtype"])
    return frame


def _restore(series: pd.Series, dtype: str) -> pd.Series:
    if dtype == "object":
        return series.astype(object).where(series.notna(), None)
    return series.astype(dtype)


def to_json_text(doc: Mapping[str, Any]) -> str:
    """Strict, key-sorted JSON (non-finite numbers rejected), as the envelope requires."""
    return json.dumps(doc, sort_keys=True, indent=1, allow_nan=False, default=plain) + "\n"


def view_ids(doc: Mapping[str, Any]) -> Sequence[str]:
    views = doc.get("views") or {}
    return list(views.get("top_n") or []) + list(views.get("pareto_front") or [])
