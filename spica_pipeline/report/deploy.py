"""deploy/<rank>/: per pick, a DynamoGraphDeployment (`dgd.yaml`) and the simulation record.

The simulation record (`simulation_record.yaml`) is built from the candidate's ledger config alone
(its flat form, space/candidate.py, plus what the evaluator derived), so it shows exactly what
replay simulated: engine arguments per role, worker counts, router and planner settings, model,
backend and version, and what replay measured.
`dgd.yaml` is the same pick as a manifest `kubectl apply` takes (report/dgd.py).
"""

from dataclasses import replace
from typing import Any, Mapping

import yaml

from spica_pipeline.config.goal import planner_target as goal_planner_target
from spica_pipeline.config.precision import precision_of
from spica_pipeline.evaluate.scoring import Candidate
from spica_pipeline.report.accuracy import backend_check, header_line, own_entry
from spica_pipeline.report.bench_script import bench_script
from spica_pipeline.report.dgd import GPU_PRODUCT_LABEL, GPU_PRODUCTS, dgd_manifest, manifest_name, validate_manifest
from spica_pipeline.report.tables import candidate_bands
from spica_pipeline.space.candidate import PLANNER_FIELDS, PREDICTOR_FIELDS
from spica_pipeline.space.candidate import Candidate as Deployment
from spica_pipeline.space.plan import planner_config_for
from spica_pipeline.space.shapes import SHAPE_KEYS
from spica_pipeline.storage import atomic_write_text

ROLE_ENGINE_KEYS = ("max_num_batched_tokens", "max_num_seqs", "block_size", "gpu_memory_utilization",
                    "enable_prefix_caching")
OFFLOAD_PREFIXES = ("num_g", "bandwidth_g")
OFFLOAD_KEYS = ("kv_bytes_per_token", "offload_batch_size")
ROUTER_KEYS = ("overlap_score_credit", "prefill_load_scale", "router_temperature", "host_cache_hit_weight",
               "disk_cache_hit_weight", "active_decode_blocks_threshold", "active_prefill_tokens_threshold",
               "active_prefill_tokens_threshold_frac", "no_admission_control")
PLANNER_KEYS = PLANNER_FIELDS + PREDICTOR_FIELDS  # the flat candidate's planner settings, as space/candidate names them
LOAD_KEYS = ("concurrency", "kv_load_ratio", "kv_load_concurrency", "kv_capacity_concurrency")


def _role(cfg: Mapping[str, Any], role: str, shape_prefix: str) -> dict[str, Any]:
    parallel = {k: cfg[f"{shape_prefix}{k}"] for k in SHAPE_KEYS if f"{shape_prefix}{k}" in cfg}
    count = cfg.get(f"{shape_prefix}replicas", 1)
    engine = {k: cfg[f"{role}_{k}"] for k in ROLE_ENGINE_KEYS if f"{role}_{k}" in cfg}
    if role != "decode" and (cfg.get("num_g2_blocks") or 0) > 0:
        engine.update({k: v for k, v in cfg.items() if v is not None and (k in OFFLOAD_KEYS or k.startswith(OFFLOAD_PREFIXES))})
    gpus_per_worker = 1
    for k in ("tp", "pp", "attention_dp"):
        gpus_per_worker *= int(parallel.get(k, 1) or 1)
    if cfg.get("aic_nextn") is not None:
        engine["nextn"] = cfg["aic_nextn"]
    if cfg.get("startup_time") is not None:
        engine["startup_time"] = cfg["startup_time"]
    out = {"count": count, "gpus_per_worker": gpus_per_worker, "parallel": parallel, "engine_args": engine}
    if any(f"{r}_hardware_sku" in cfg for r in ("prefill", "decode")):  # roles on two GPU types: name each
        out = {"hardware_sku": cfg.get(f"{role}_hardware_sku", cfg.get("hardware_sku")), **out}
    return out


def deployment_dict(c: Candidate, rank: int, *, target: str | None = None,
                    heldout_check: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The deployment document for one candidate; `config` carries the full flat sample verbatim.
    heldout_check: the numbers' recorded held-out check (report/accuracy.py), shown for its backend."""

    cfg = c.config
    mode = cfg.get("deployment_mode", c.branch)
    if mode == "disagg":
        workers = {"prefill": _role(cfg, "prefill", "prefill_"), "decode": _role(cfg, "decode", "decode_")}
    else:
        workers = {"agg": _role(cfg, "agg", "")}
    router = {"mode": cfg.get("router_mode", "round_robin")}
    router_cfg = {k: cfg[k] for k in ROUTER_KEYS if k in cfg}
    if router_cfg:
        router["config"] = router_cfg
    planner_on = bool(cfg.get("enable_throughput_scaling") or cfg.get("enable_load_scaling"))
    planner: dict[str, Any] = {"enabled": planner_on, "scaling_policy": cfg.get("planner_scaling_policy")}
    if planner_on:
        planner["settings"] = {k: cfg[k] for k in PLANNER_KEYS if k in cfg}
        planner["limits"] = {k: cfg[k] for k in ("gpu_budget", "min_gpu_budget", "min_endpoint") if cfg.get(k) is not None}
    return {
        "kind": "SpicaSimulationRecord",
        "note": "starting point simulated by Dynamo Replay; validate on hardware before production",
        "rank": rank,
        "branch": c.branch,
        "spec_hash": c.spec_hash,
        "model": cfg.get("model_name"),
        "hardware_sku": cfg.get("hardware_sku"),
        "backend": cfg.get("backend"),
        "backend_version": cfg.get("backend_version"),
        "deployment_mode": mode,
        "precision": precision_of(dict(cfg)) or "checkpoint default",
        **({"speculative_decoding": {"method": "mtp", "nextn": cfg["aic_nextn"]}} if cfg.get("aic_nextn") else {}),
        **({"speculative_decoding": cfg["speculative"]} if cfg.get("speculative") else {}),
        **({"fidelity_note": cfg["fidelity_note"]} if cfg.get("fidelity_note") else {}),
        "total_gpus": c.used_gpus,
        "workers": workers,
        "router": router,
        "planner": planner,
        "load": {k: cfg[k] for k in LOAD_KEYS if k in cfg},
        "expected": {"goal": target, "score": c.score, "objectives": c.objectives, "metrics": c.metrics,
                     **({"spread": c.spread} if c.spread else {}), **_bands(c, target)},
        **({"heldout_check": found} if (found := backend_check(heldout_check, cfg.get("backend"))) else {}),
        **({"calibration_profile": own} if (own := own_entry(heldout_check, cfg)) else {}),
        "config": dict(cfg),
    }


def _bands(c: Candidate, target: str | None) -> dict[str, Any]:
    """P10-P90 bands of calibrated TTFT/TPOT and of the goal value (empty without a calibration profile)."""

    found = candidate_bands(c, target)
    if not found:
        return {}
    return {"bands_p10_p90": {k: [float(lo), float(hi)] for k, (lo, hi) in found.items()},
            "bands_note": "calibrated replay values; P10-P90 of calibration residuals (docs/fidelity.md)"}


def deployment_yaml(c: Candidate, rank: int, *, target: str | None = None,
                    heldout_check: Mapping[str, Any] | None = None) -> str:
    header = (f"# Spica candidate #{rank}: the simulation record of this pick (not a Kubernetes object; "
              "dgd.yaml is).\n"
              "# `workers` lists engine arguments per role; `config` is the exact sample replay simulated.\n")
    doc = deployment_dict(c, rank, target=target, heldout_check=heldout_check)
    return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)


def dgd_yaml(c: Candidate, rank: int, doc: Mapping[str, Any], *, target: str | None = None,
             heldout_check: Mapping[str, Any] | None = None) -> str:
    """The manifest with a header saying where it came from, what replay predicted for it and how far
    such predictions were off on unseen models (the recorded held-out check)."""

    lines = [f"# Spica pick #{rank} ({c.branch}, spec {c.spec_hash}): {doc['metadata']['name']}",
             "# Generated from the replayed sample; validated against the vendored DGD CRD schema subset",
             "# and backend flag lists (spica_pipeline/report/dgd_data/SOURCES.md).",
             f"# GPUs: {c.used_gpus}. Predicted by Dynamo Replay, not measured: benchmark before production."]
    lines += gpu_type_lines(c.config)
    if c.metrics.get("fleet_replicas", 1) > 1:
        lines.append(f"# min_gpus fleet: {int(c.metrics['fleet_replicas'])} x the replayed deployment = "
                     f"{int(c.metrics['fleet_gpus'])} GPUs; worker replicas below are already multiplied.")
    precision = precision_of(dict(c.config))
    if precision:
        lines.append("# precision: " + ", ".join(f"{k} {v}" for k, v in precision.items()))
    if c.config.get("fidelity_note"):
        lines.append(f"# fidelity note: {c.config['fidelity_note']}")
    if target is not None and c.score is not None:
        lines.append(f"# goal {target}: score {c.score:.6g}")
    accuracy = header_line(heldout_check, c.config.get("backend"))
    if accuracy:
        lines.append(accuracy)
    return "\n".join(lines) + "\n" + yaml.safe_dump(dict(doc), sort_keys=False, default_flow_style=False, width=1000)


def gpu_type_lines(cfg: Mapping[str, Any]) -> list[str]:
    """The manifest header's line naming each worker role's GPU type, when prefill and decode run on two."""
    if not any(f"{r}_hardware_sku" in cfg for r in ("prefill", "decode")):
        return []
    roles = []
    for role in ("prefill", "decode"):
        system = str(cfg.get(f"{role}_hardware_sku", cfg.get("hardware_sku")))
        product = GPU_PRODUCTS.get(system)
        roles.append(f"{role} on {system}" + (f" (nodes labelled {GPU_PRODUCT_LABEL}={product})" if product
                                              else " (no known node label: add a nodeSelector for it)"))
    return ["# GPU types: " + "; ".join(roles)]


def readme_text(c: Candidate, rank: int, description: str) -> str:
    return (
        f"# Candidate {rank}\n\n{description}\n\n"
        "- `dgd.yaml`: a DynamoGraphDeployment for this pick (`kubectl apply -f dgd.yaml`): a Frontend "
        "with the router settings, one component per worker role with its replicas and GPUs, the "
        "backend's own engine flags, a Planner when a scaling policy is on, `multinode` when an engine "
        "spans nodes. It expects an `hf-token-secret` Secret holding HF_TOKEN (configurable under "
        "`deploy:`).\n"
        "- `simulation_record.yaml`: what Dynamo Replay simulated for this candidate (engine arguments "
        "per role, worker counts, router and planner settings, model, backend and perf-database "
        "version) and what it measured.\n"
        "- `bench.sh`: the AIPerf command(s) that measure this pick, once deployed, at the sweep's workload; "
        "`spica calibrate <this folder> --output PROFILE.json` then fits a calibration profile from what it "
        "saved, for the next sweep.\n\n"
        "The numbers are replay predictions, not measurements; benchmark on real hardware before "
        "relying on them.\n"
    )


def fleet(deployment: Deployment, fleet_replicas: Any) -> Deployment:
    """A min_gpus pick deploys its whole fleet: every worker role's replicas times the fleet size."""
    k = int(fleet_replicas or 1)
    if k <= 1:
        return deployment
    return replace(deployment, roles=tuple(replace(r, shape=replace(r.shape, replicas=r.replicas * k))
                                           for r in deployment.roles))


def write_deploy_folder(out_dir: Any, c: Candidate, rank: int, *, target: str | None, description: str,
                        options: Any = None, planner_target: str | None = None,
                        sla: Mapping[str, Any] | None = None,
                        heldout_check: Mapping[str, Any] | None = None,
                        workload: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """deploy/<rank>/{dgd.yaml, simulation_record.yaml, README.md, bench.sh}; returns name -> path.
    workload: the sweep's workload as report.md states it (bench.sh measures the pick at it).

    A manifest that fails validation is a bug in the writer: it is not written as dgd.yaml; its
    problems go to dgd.invalid.txt so the rest of the sweep's output still lands.
    """
    from pathlib import Path


    d = Path(out_dir)
    paths: dict[str, Any] = {}
    record = deployment_yaml(c, rank, target=target, heldout_check=heldout_check)
    paths["record"] = atomic_write_text(d / "simulation_record.yaml", record)
    atomic_write_text(d / "README.md", readme_text(c, rank, description))
    deployment = Deployment.from_dict(c.config, extra="ignore")
    # the planner times engines as the sweep did (aiconfigurator-core's model); the workers serve `served_model`
    planner_config = planner_config_for(deployment, planner_target=planner_target or goal_planner_target(target or ""),
                                        sla=dict(sla) if sla else None)
    served = getattr(options, "served_model", None)
    if served:
        deployment = replace(deployment, model=served)
    paths["bench"] = atomic_write_text(d / "bench.sh", bench_script(c.config, rank, workload, model=deployment.model))
    paths["bench"].chmod(0o755)
    doc = dgd_manifest(fleet(deployment, c.metrics.get("fleet_replicas")),
                       name=manifest_name(deployment.model, rank, deployment.deployment_mode),
                       options=options, planner_config=planner_config)
    problems = validate_manifest(doc)
    if problems:
        paths["dgd_invalid"] = atomic_write_text(d / "dgd.invalid.txt", "\n".join(problems) + "\n")
    else:
        paths["dgd"] = atomic_write_text(d / "dgd.yaml", dgd_yaml(c, rank, doc, target=target, heldout_check=heldout_check))
    return paths
