"""Replaying silicon rows: aiconfigurator-core's `systems/silicon_sample.csv` mapped to candidates
(spica_pipeline/fidelity/silicon.py), each replayed through `ReplayEvaluator` pinned to the row, twice:

* "ours": as the benchmark client that measured it (every client at t=0, 10 x concurrency requests, every
  request counted; measurement.benchmark_client_request, the replay a calibrated sweep runs beside its own);
  a row of InferenceMAX's client draws each request's ISL and OSL over [int(0.8 L), L] as that client did, a
  row of AIC's own runners is spread 1/9 as a sweep spreads a fixed-length workload (--fixed-lengths: exactly
  the row's lengths);
* "sweep": as a sweep measures (ramped clients, steady-state window, fidelity/measurement.py).

A row whose recorded shape AIC refuses is replayed on the nearest deployment the engine could have run
(`silicon.nearest_deployments`), with a fidelity_note. AIC's own estimate on the same rows and perf database:
agg = `backend.run_agg(batch = concurrency per attention-DP rank, ctx_tokens = 8192)`; disagg = prefill
`run_static(static_ctx, batch 1)` for TTFT and decode `run_static(static_gen, batch = concurrency per decode
rank)` for TPOT.
"""

import csv
import math
import time
import zlib
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spica_pipeline.config.goal import OptimizationGoal
from spica_pipeline.evaluate.evaluator import EvalRequest
from spica_pipeline.space.candidate import Candidate
from spica_pipeline.fidelity import silicon
from spica_pipeline.fidelity.measurement import CLIENT_REQUEST_RATIO, benchmark_client_request

GOAL = OptimizationGoal.model_validate({"target": "throughput", "sla": None, "pareto_objectives": None})
MNBT = 8192
RAMP_REQUEST_RATIO = 6.0
QUICK_MAX_ROWS = 24
QUICK_MAX_CONCURRENCY = 256
SCRIPT_FLAGS = "engine"  # --script-flags: the script's chunk size, running-request cap and receive interval
WITH_MEMORY_FRACTION = "with-memory-fraction"  # ... and its memory fraction as the replay's


def silicon_csv_path() -> Path:
    import aiconfigurator_core

    return Path(aiconfigurator_core.__file__).resolve().parent / "systems" / "silicon_sample.csv"


def load_cases() -> tuple[list[silicon.SiliconRow], list[silicon.SiliconCase | silicon.Inexpressible]]:
    """Every silicon row, and each mapped to a case or the reason it cannot be expressed."""
    from spica_pipeline.space.model_hw import _supported_databases, available_models, model_facts

    with open(silicon_csv_path(), newline="") as fh:
        rows = silicon.parse_rows(csv.DictReader(fh))
    models = available_models()
    dbs = _supported_databases()
    mapped = [silicon.map_row(r, models=models, databases=dbs, is_moe=lambda m: model_facts(m).is_moe)
              for r in rows]
    return rows, mapped


def row_order(row_id: str) -> int:
    """The bench's row order (crc32 of the id): a prefix of it is a random sample."""
    return zlib.crc32(row_id.encode())


def quick_subset(cases: list[silicon.SiliconCase], limit: int = QUICK_MAX_ROWS) -> list[silicon.SiliconCase]:
    """One row per (model, backend, system, mode) stratum, deterministic, cheap concurrencies first."""
    strata: dict[tuple, list[silicon.SiliconCase]] = defaultdict(list)
    for c in cases:
        if (c.row.concurrency or 0) <= QUICK_MAX_CONCURRENCY:
            strata[(c.row.model, c.row.backend, c.row.system, c.row.mode)].append(c)
    picked = []
    for i, key in enumerate(sorted(strata)):
        group = sorted(strata[key], key=lambda c: (c.row.concurrency, row_order(c.row.id)))
        picked.append(group[0] if i % 2 == 0 else group[len(group) // 2])
    picked.sort(key=lambda c: row_order(c.row.id))
    return picked[:limit]


def select(mapped: list, *, split: str, models: list[str] | None = None, systems: list[str] | None = None,
           quick: bool = False, max_rows: int | None = None, ids: list[str] | None = None,
           max_concurrency: int | None = None, backends: list[str] | None = None,
           clients: list[str] | None = None, modes: list[str] | None = None) -> list[silicon.SiliconCase]:
    """The expressible cases to replay, in the bench's row order; backends, clients and modes filter after the
    --max-rows prefix, so a backend's rows are the same rows as in the full prefix."""
    cases = [m for m in mapped if isinstance(m, silicon.SiliconCase)]
    if ids:
        cases = [c for c in cases if c.row.id in ids]
    if split != "all":
        cases = [c for c in cases if c.split == split]
    if models:
        cases = [c for c in cases if c.row.model in models or c.aic_model in models]
    if systems:
        cases = [c for c in cases if c.row.system in systems]
    cases = quick_subset(cases) if quick else sorted(cases, key=lambda c: row_order(c.row.id))
    if max_rows is not None:
        cases = cases[:max_rows]
    if max_concurrency is not None:  # replay cost grows with concurrency (a c=7168 row takes minutes)
        cases = [c for c in cases if (c.row.concurrency or 0) <= max_concurrency]
    if backends:
        cases = [c for c in cases if c.row.backend in backends]
    if clients:
        cases = [c for c in cases if c.client in clients]
    if modes:
        cases = [c for c in cases if c.row.mode in modes]
    return cases


# ---- AIC's own estimate ------------------------------------------------------------------------

_aic_models: dict[tuple, Any] = {}


def _known(value: int | None, name: str) -> int:
    """A row field an expressible row always has (silicon.map_row); None is a mapping bug."""
    if value is None:
        raise ValueError(f"silicon row without {name}")
    return int(value)


def aic_estimate(case: silicon.SiliconCase, version: str) -> tuple[float, float]:
    """(TTFT ms, TPOT ms) from aiconfigurator-core's own agg/static estimators for the row."""
    from aiconfigurator_core.sdk.backends.factory import get_backend
    from aiconfigurator_core.sdk.config import RuntimeConfig
    from aiconfigurator_core.sdk.config_builders import build_model_config
    from aiconfigurator_core.sdk.models import get_model
    from aiconfigurator_core.sdk.perf_database import get_database

    from spica_pipeline.space.model_hw import QuietAIC

    r = case.row
    concurrency, isl, osl = _known(r.concurrency, "concurrency"), _known(r.isl, "isl"), _known(r.osl, "osl")

    def model(shape: silicon.Shape):
        key = (case.aic_model, r.backend, shape.tp, shape.pp, shape.attention_dp, shape.moe_tp, shape.moe_ep)
        if key not in _aic_models:
            cfg = build_model_config(tp_size=shape.tp, pp_size=shape.pp, attention_dp_size=shape.attention_dp,
                                     moe_tp_size=shape.moe_tp, moe_ep_size=shape.moe_ep)
            _aic_models[key] = get_model(case.aic_model, cfg, r.backend)
        return _aic_models[key]

    with QuietAIC():
        db = get_database(r.system, r.backend, version)
        if db is None:
            raise ValueError(f"no AIC perf database for {r.system}/{r.backend} {version}")
        backend = get_backend(r.backend)
        if r.mode == "agg":
            shape = case.roles["agg"]
            bs = max(1, math.ceil(concurrency / (shape.workers * shape.attention_dp)))
            out = backend.run_agg(model(shape), db, RuntimeConfig(batch_size=bs, isl=isl, osl=osl),
                                  ctx_tokens=MNBT).get_summary_df()
            return float(out.loc[0, "ttft"]), float(out.loc[0, "tpot"])
        p, d = case.roles["prefill"], case.roles["decode"]
        ctx = backend.run_static(model(p), db, RuntimeConfig(batch_size=1, isl=isl, osl=osl),
                                 mode="static_ctx").get_summary_df()
        bs = max(1, math.ceil(concurrency / (d.workers * d.attention_dp)))
        gen = backend.run_static(model(d), db, RuntimeConfig(batch_size=bs, isl=isl, osl=osl),
                                 mode="static_gen").get_summary_df()
        return float(ctx.loc[0, "ttft"]), float(gen.loc[0, "tpot"])


# ---- one row -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class RowJob:
    """Everything a row needs besides its case: sent once to each worker process."""

    cache_dir: str | None
    with_aic: bool = True
    fixed_lengths: bool = False  # every row's client replay with exactly its ISL and OSL
    script_flags: str | None = None  # each InferenceMAX SGLang row with its script's engine flags


def with_recv_wait(rec: dict[str, Any], side: str, report: Mapping[str, Any],
                   flags: silicon.ScriptFlags | None) -> dict[str, Any]:
    """A replay's mean TTFT and TPOT; with a script's scheduler receive interval, the mean polling wait
    (recv_wait_steps decode steps of the replay's own mean TPOT) added to TTFT, the replayed TTFT kept beside it
    (the replay's scheduler polls every step)."""
    ttft, tpot = report.get("mean_ttft_ms"), report.get("mean_tpot_ms")
    if flags is None or flags.recv_interval <= 1 or ttft is None or tpot is None:
        return {"ttft": ttft, "tpot": tpot}
    wait = flags.recv_wait_steps * float(tpot)
    rec.setdefault("recv_wait_ms", {})[side] = wait
    rec.setdefault("replayed_ttft", {})[side] = ttft
    return {"ttft": float(ttft) + wait, "tpot": tpot}


def evaluate_case(evaluator, case: silicon.SiliconCase, version: str, job: RowJob) -> dict[str, Any]:
    """One row's record: the silicon numbers, both replays, AIC's estimate and what each cost."""
    r = case.row
    spread = not job.fixed_lengths
    rec: dict[str, Any] = {
        "id": r.id, "line": r.line, "split": case.split, "model": r.model, "aic_model": case.aic_model,
        "precision": r.precision, "backend": r.backend, "silicon_backend_version": r.backend_version,
        "db_version": version, "system": r.system, "mode": r.mode, "isl": r.isl, "osl": r.osl,
        "concurrency": r.concurrency, "shape": {k: vars(v) for k, v in case.roles.items()},
        "silicon": {"ttft": r.ttft_ms, "tpot": r.tpot_ms},
        "benchmark_client": case.client, "client_lengths": "spread" if spread else "fixed",
    }
    lengths = {k: v for k, v in case.workload(CLIENT_REQUEST_RATIO, client_lengths=spread).items()
               if k in ("isl", "osl", "isl_jitter", "osl_jitter")}
    if lengths != {"isl": r.isl, "osl": r.osl}:  # the client's own length spread (silicon.benchmark_client)
        rec["replayed_lengths"] = lengths
    if case.note:  # the shape was not read literally (silicon.map_row): keep what the row recorded
        rec["recorded_shape"] = {k: vars(r.role(k)) for k in case.roles}
    started = time.perf_counter()
    flags = silicon.script_flags(r) if job.script_flags else None
    # the script's --mem-fraction-static leaves activations outside it, the replay's fraction holds them: the
    # bench's own fraction unless asked for the script's
    fraction = flags.memory_fraction if flags and job.script_flags == WITH_MEMORY_FRACTION else 0.9
    mnbt = flags.chunk_tokens if flags else MNBT
    if flags:
        case = silicon.with_script_flags(case, flags)
        rec["script_flags"] = {**vars(flags), "recv_wait_steps": flags.recv_wait_steps,
                               "replayed_memory_fraction": fraction}

    def client_request(c: silicon.SiliconCase, memory_fraction: float = fraction) -> EvalRequest:
        req = EvalRequest(Candidate.from_dict(c.sample(version, max_num_batched_tokens=mnbt,
                                                       memory_fraction=memory_fraction)),
                          c.workload(CLIENT_REQUEST_RATIO, client_lengths=spread), GOAL,
                          {"closed_loop_client": "together"})
        return benchmark_client_request(req, CLIENT_REQUEST_RATIO, fixed_lengths=job.fixed_lengths)

    out = evaluator.evaluate(client_request(case))
    if out.status != "feasible" and out.reason:  # the nearest deployment the engine could have run
        for near, near_fraction, note in silicon.nearest_deployments(case, out.reason):
            retry = evaluator.evaluate(client_request(near, near_fraction))
            if retry.status == "feasible":
                case, fraction, out = near, near_fraction, retry
                rec["nearest_deployment"] = {"note": note, "memory_fraction": near_fraction,
                                             "shape": {k: vars(v) for k, v in near.roles.items()}}
                break
    notes = [n for n in (case.note, out.derived.get("fidelity_note"), (rec.get("nearest_deployment") or {}).get("note"))
             if n]
    if notes:
        rec["fidelity_note"] = "; ".join(notes)
    rec["replay_seconds"] = round(time.perf_counter() - started, 3)
    rec["status"] = out.status
    if out.status == "feasible" and out.report:
        rec["ours"] = with_recv_wait(rec, "ours", out.report, flags)
        rec["requests"] = out.report.get("completed_requests")
        rec["window_counted"] = out.report.get("window_counted_requests")
        rec["window_rule"] = out.derived.get("window_rule")
        sweep_started = time.perf_counter()
        sweep = evaluator.evaluate(EvalRequest(Candidate.from_dict(case.sample(version, max_num_batched_tokens=mnbt,
                                                                              memory_fraction=fraction)),
                                               case.workload(RAMP_REQUEST_RATIO, client_lengths=spread), GOAL,
                                               {"closed_loop_client": "ramp"}))
        rec["sweep_seconds"] = round(time.perf_counter() - sweep_started, 3)
        if sweep.status == "feasible" and sweep.report:
            rec["sweep"] = {**with_recv_wait(rec, "sweep", sweep.report, flags),
                            "window_rule": sweep.derived.get("window_rule"),
                            "requests": sweep.derived.get("request_count")}
    else:
        rec["reason"] = out.reason
    if job.with_aic:
        aic_started = time.perf_counter()
        try:
            ttft, tpot = aic_estimate(case, version)
            rec["aic"] = {"ttft": ttft, "tpot": tpot}
        except Exception as exc:  # AIC's own failure is data, not a bench crash
            rec["aic_reason"] = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        rec["aic_seconds"] = round(time.perf_counter() - aic_started, 3)
    # the whole row (client replay incl. table builds and nearest-deployment retries, sweep replay, AIC estimate)
    rec["row_seconds"] = round(time.perf_counter() - started, 3)
    return rec


_job: RowJob | None = None
_evaluator: Any = None


def start_rows(job: RowJob) -> None:
    """Set up this process to replay rows (one evaluator); runs in the bench's own process (--workers 1) and at
    the start of every worker."""
    global _job, _evaluator
    from spica_pipeline.evaluate.replay import ReplayEvaluator

    _job, _evaluator = job, ReplayEvaluator(cache_dir=job.cache_dir)


def replay_row(case: silicon.SiliconCase) -> dict[str, Any]:
    """One row's record (the only row function: --workers 1 calls it here, --workers N in worker processes)."""
    from spica_pipeline.space.model_hw import latest_backend_version

    assert _job is not None, "start_rows() first"
    return evaluate_case(_evaluator, case, latest_backend_version(case.row.system, case.row.backend), _job)


def expected_cost(case: silicon.SiliconCase) -> tuple[bool, int]:
    """Sort key, largest first: disagg rows, then concurrency x (ISL + OSL) (the replayed tokens): the few
    disagg DeepSeek rows at c >= 2,048 take minutes each, and dispatched last they would finish last, alone."""
    r = case.row
    return r.mode == "disagg", (r.concurrency or 0) * ((r.isl or 0) + (r.osl or 0))


def replay_rows(cases: list[silicon.SiliconCase], job: RowJob, workers: int = 1) -> Iterator[tuple[int, dict[str, Any]]]:
    """(index in `cases`, record) of every row as it finishes: in order in this process (workers 1), or on
    `workers` spawned processes, largest expected cost first. Spawn, not fork: Dynamo's replay runs a Tokio
    runtime that does not survive a fork (evaluate/pool.py). The workers share the on-disk timing and KV cache
    (atomic writes, one build per table under a file lock: evaluate/timing.py)."""
    if workers <= 1:
        start_rows(job)
        for i, case in enumerate(cases):
            yield i, replay_row(case)
        return
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    order = sorted(range(len(cases)), key=lambda i: expected_cost(cases[i]), reverse=True)
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=start_rows,
                             initargs=(job,)) as pool:
        futures = {pool.submit(replay_row, cases[i]): i for i in order}
        for future in as_completed(futures):
            yield futures[future], future.result()
