"""`spica calibrate`: a profile from the user's own measurements, and which picks of a sweep to measure first.

Fitting (`calibrate`): each measured point (fidelity/measurements.py reads the files) becomes the candidate that
was measured, pinned to the point (its deployment, the engine arguments the sweep replayed when the point names a
sweep's pick, else the ones the packaged profile's silicon rows were replayed with), and is replayed twice, as
bench/bench_fidelity.py replays a silicon row:

* as the benchmark client that measured it (every client at t=0, CLIENT_REQUEST_RATIO x c requests, each request's
  lengths spread as a calibrated sweep's client replay spreads them: measurement.benchmark_client_request), the
  replay a calibrated sweep runs beside its own and corrects;
* as a sweep measures (ramped clients, steady-state window), the replay the profile's sweep fallback corrects.

The rows then go to fidelity/own.fit_own on the packaged profile, which writes the own correction, its band, the
rows' leave-one-out errors and the rows themselves into a self-contained profile of one (model, system, backend,
precision). A point the replay cannot build is retried at higher memory fractions (engines run up to about 0.98
of HBM; AIC's memory model is stricter), then left out with its reason; no point left is bad input.

Planning (`plan`): of a finished sweep's picks (deploy/<rank>/simulation_record.yaml), the ones whose error bands
decide the ranking: the pick, then the runners-up whose goal band overlaps the pick's, different shapes first.
"""

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from spica_pipeline.config.goal import OptimizationGoal
from spica_pipeline.errors import ConfigError, SpicaError, one_line
from spica_pipeline.evaluate.evaluator import EvalRequest, Evaluator
from spica_pipeline.evaluate.scoring import objective_value
from spica_pipeline.fidelity.measurement import CLIENT_REQUEST_RATIO, benchmark_client_request
from spica_pipeline.fidelity.own import fit_own
from spica_pipeline.fidelity.profile import PACKAGED, PHASES, ProfileError, deployment_text, load_profile
from spica_pipeline.report.tables import describe_shape
from spica_pipeline.space.candidate import Candidate, EngineArgs, Role
from spica_pipeline.space.model_hw import latest_backend_version, model_facts, resolve_hardware, resolve_model
from spica_pipeline.space.shapes import RoleShape

GOAL = OptimizationGoal.model_validate({"target": "throughput", "sla": None, "pareto_objectives": None})
SWEEP_REQUEST_RATIO = 6.0  # the sweep replay's requests per client (bench_fidelity's ramped replay)
MEMORY_FRACTIONS = (0.9, 0.95, 0.98)  # the replay's default, then what engines accept
CHUNK_TOKENS = 8192  # max_num_batched_tokens of a point without a sweep's engine arguments (the bench's)
BLOCK_SIZE = 64


@dataclass(frozen=True)
class MeasuredPoint:
    """One measurement as a replayable candidate: where it was read, the deployment, the load and what it measured."""

    where: str  # file:line (or file) of the measurement
    candidate: Candidate
    isl: int
    osl: int
    concurrency: int
    measured: Mapping[str, float]  # {"ttft", "tpot"} means, ms
    precision: Mapping[str, str] = field(default_factory=dict)
    from_sweep: bool = False  # the engine arguments are a sweep pick's own

    @property
    def deployment(self) -> tuple[str, str, str, tuple[tuple[str, str], ...]]:
        c = self.candidate
        return c.model, c.system, c.backend, tuple(sorted(self.precision.items()))


def where_of(m: Any) -> str:
    """Where a measurement was read: `file, line N` (the readers' origin), or the file."""
    return str(getattr(m, "origin", None) or getattr(m, "source", None) or "measurement")


def _measured(m: Any) -> dict[str, float]:
    out = {}
    for phase in PHASES:
        value = getattr(m, f"{phase}_ms", None)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ConfigError(f"{where_of(m)}: {phase}_ms must be a number > 0, got {value!r}")
        out[phase] = float(value)
    return out


def _length(m: Any, name: str) -> int:
    value = getattr(m, name, None)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 1:
        raise ConfigError(f"{where_of(m)}: {name} must be a number of tokens >= 1, got {value!r}")
    return max(1, round(value))


def _engine(role: str, shape: RoleShape, concurrency: int, isl: int, fraction: float) -> EngineArgs:
    """The engine arguments bench_fidelity replays a silicon row with: chunks of CHUNK_TOKENS (a prefill pass holds
    one whole prompt), running requests capped at the load per attention-DP rank, prefix caching but on decode."""
    per_rank = max(1, math.ceil(concurrency / (shape.replicas * shape.attention_dp)))
    chunk = max(CHUNK_TOKENS, isl) if role == "prefill" else CHUNK_TOKENS
    return EngineArgs(max_num_batched_tokens=chunk, max_num_seqs=per_rank, block_size=BLOCK_SIZE,
                      gpu_memory_utilization=fraction, enable_prefix_caching=role != "decode")


def _shapes(deployment: Any) -> dict[str, RoleShape]:
    shape = deployment.shape
    return {"agg": shape} if isinstance(shape, RoleShape) else {"prefill": shape.prefill, "decode": shape.decode}


def open_loop(m: Any) -> str | None:
    """Why a measurement cannot be replayed as a benchmark client's closed loop (an open loop at a request rate,
    no concurrency), else None."""
    if getattr(m, "concurrency", None):
        return None
    rate = getattr(m, "request_rate", None)
    return (f"an open loop at {rate:g} requests/s: the profile corrects the closed-loop benchmark client's replay, "
            "so it is fitted on closed-loop points (a concurrency)") if rate else "no concurrency"


def measured_point(m: Any, *, fraction: float = MEMORY_FRACTIONS[0]) -> MeasuredPoint:
    """A measurement (fidelity/readers Measurement: a closed-loop point of a Deployment) as the candidate it
    measured; ConfigError naming its file and line for a model, GPU, backend or shape the sweep would refuse.

    A deployment that names the sample a sweep replayed (simulation_record.yaml) is that sample with the served
    worker counts (a min_gpus fleet's included); any other is built from its shape with the engine arguments
    bench_fidelity replays silicon rows with (`_engine`)."""
    where = where_of(m)
    d = m.deployment
    concurrency = getattr(m, "concurrency", None)
    if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
        raise ConfigError(f"{where}: {open_loop(m) or f'concurrency must be a whole number >= 1, got {concurrency!r}'}")
    isl, osl = _length(m, "isl"), _length(m, "osl")
    measured = _measured(m)
    precision = dict(d.precision)
    shapes = _shapes(d)
    try:
        model = resolve_model(str(d.model)).name
        system = resolve_hardware(str(d.system)).name
        version = d.backend_version or latest_backend_version(system, d.backend)
        if d.sample:  # a sweep's pick, as it was replayed, with the workers that served the load
            candidate = Candidate.from_dict(d.sample, extra="ignore")
            if candidate.role_names != tuple(shapes):
                raise ConfigError(f"{where}: the deployment's roles {tuple(shapes)} differ from its sample's "
                                  f"{candidate.role_names}")
            roles = tuple(replace(r, shape=shapes[r.name]) for r in candidate.roles)
            candidate = replace(candidate, roles=roles, concurrency=concurrency, kv_load_ratio=None,
                                backend_version=candidate.backend_version or version)
            return MeasuredPoint(where, candidate, isl, osl, concurrency, measured, dict(candidate.precision),
                                 from_sweep=True)
        is_moe = model_facts(model).is_moe
    except (SpicaError, ValueError) as exc:  # a sweep config's field names read as the measurement's columns
        text = one_line(exc).replace("search_space.model_name", "model").replace("search_space.hardware_sku", "system")
        raise ConfigError(f"{where}: {text}") from None
    for role, shape in shapes.items():
        width = shape.tp * shape.attention_dp
        if is_moe and shape.moe_tp * shape.moe_ep != width:
            raise ConfigError(f"{where}: {role} moe_tp {shape.moe_tp} x moe_ep {shape.moe_ep} must be the "
                              f"engine's tp x attention_dp = {width} GPUs ({model} is a mixture of experts)")
    roles = tuple(Role(name, shape, _engine(name, shape, concurrency, isl, fraction)) for name, shape in shapes.items())
    candidate = Candidate(model=model, system=system, backend=str(d.backend), roles=roles, precision=precision,
                          gpu_budget=sum(r.used_gpus for r in roles), backend_version=version,
                          concurrency=concurrency)
    return MeasuredPoint(where, candidate, isl, osl, concurrency, measured, precision)


def _with_fraction(point: MeasuredPoint, fraction: float) -> MeasuredPoint:
    roles = tuple(replace(r, engine=replace(r.engine, gpu_memory_utilization=fraction)) for r in point.candidate.roles)
    return replace(point, candidate=replace(point.candidate, roles=roles))


def one_deployment(points: Sequence[MeasuredPoint]) -> None:
    """ConfigError naming the first point of another (model, system, backend, precision) than the first point's:
    one profile corrects one deployment."""
    first = points[0]
    for p in points[1:]:
        if p.deployment != first.deployment:
            def text(q: MeasuredPoint) -> str:
                return deployment_text(q.candidate.model, q.candidate.system, q.precision, q.candidate.backend)
            raise ConfigError(f"{p.where}: {text(p)} differs from {text(first)} of {first.where}; a profile corrects "
                              "one model, system, backend and precision: run spica calibrate once per deployment")


# ---- replaying a point -------------------------------------------------------------------------------------

def _request(point: MeasuredPoint, ratio: float, client: str) -> EvalRequest:
    workload = {"isl": point.isl, "osl": point.osl, "concurrency": point.concurrency, "num_request_ratio": ratio}
    return EvalRequest(point.candidate, workload, GOAL, {"closed_loop_client": client})


def _means(outcome: Any) -> dict[str, float] | None:
    report = outcome.report or {}
    ttft, tpot = report.get("mean_ttft_ms"), report.get("mean_tpot_ms")
    if outcome.status != "feasible" or not isinstance(ttft, (int, float)) or not isinstance(tpot, (int, float)):
        return None
    return {"ttft": float(ttft), "tpot": float(tpot)}


def replay_point(evaluator: Evaluator, point: MeasuredPoint) -> dict[str, Any]:
    """The point's record (fidelity/records.py: "silicon" the measured means, "ours" the client replay, "sweep" the
    sweep's replay), or {"where", "reason"} when no memory fraction lets the replay build it."""
    started = time.perf_counter()
    reason = None
    fractions = MEMORY_FRACTIONS if not point.from_sweep else (None,)
    for fraction in fractions:
        tried = point if fraction is None or fraction == MEMORY_FRACTIONS[0] else _with_fraction(point, fraction)
        outcome = evaluator.evaluate(benchmark_client_request(_request(tried, CLIENT_REQUEST_RATIO, "together")))
        ours = _means(outcome)
        if ours is not None:
            break
        reason = outcome.reason or outcome.status
    else:
        return {"where": point.where,
                "reason": f"the replay cannot build it: {one_line(reason or 'no TTFT and TPOT replayed')}"}
    sweep = _means(evaluator.evaluate(_request(tried, SWEEP_REQUEST_RATIO, "ramp")))
    c = tried.candidate
    record: dict[str, Any] = {
        "id": point.where, "model": c.model, "system": c.system, "backend": c.backend,
        "mode": c.deployment_mode, "isl": point.isl, "osl": point.osl, "concurrency": point.concurrency,
        "shape": {r.name: {"tp": r.shape.tp, "pp": r.shape.pp, "attention_dp": r.shape.attention_dp,
                           "moe_tp": r.shape.moe_tp, "moe_ep": r.shape.moe_ep, "workers": r.replicas}
                  for r in c.roles},
        "silicon": dict(point.measured), "ours": ours, "client_lengths": "spread",
        "replay_seconds": round(time.perf_counter() - started, 3)}
    if sweep is not None:
        record["sweep"] = sweep
    if tried is not point:
        record["memory_fraction"] = tried.candidate.roles[0].engine.gpu_memory_utilization
    return record


@dataclass
class Calibration:
    """What `calibrate` produced: the profile, every replayed record and the points left out with their reasons."""

    profile: dict[str, Any]
    records: list[dict[str, Any]]
    skipped: list[dict[str, Any]]
    seconds: float


def calibrate(measurements: Iterable[Any], *, evaluator: Evaluator | None = None, source: str = "spica calibrate",
              on_record: Callable[[dict[str, Any]], None] | None = None) -> Calibration:
    """Replay every measured point and fit the own profile on the packaged one (module docstring). ConfigError
    (exit 2) for bad points, points of several deployments, or none the replay can build."""
    started = time.perf_counter()
    points, skipped = [], []
    for m in measurements:
        why = open_loop(m)
        if why is None:
            points.append(measured_point(m))
        else:
            skipped.append({"where": where_of(m), "reason": why})
            if on_record is not None:
                on_record(skipped[-1])
    if not points:
        raise ConfigError(f"no closed-loop measurement to fit on: {skipped[0]['where']}: {skipped[0]['reason']}"
                          if skipped else "no measurements: give at least one measured point")
    one_deployment(points)
    if evaluator is None:
        from spica_pipeline.evaluate.replay import ReplayEvaluator

        evaluator = ReplayEvaluator()
    records: list[dict[str, Any]] = []
    for point in points:
        record = replay_point(evaluator, point)
        (records if "reason" not in record else skipped).append(record)
        if on_record is not None:
            on_record(record)
    if not records:
        first = skipped[-len(points)]  # the first point the replay could not build
        raise ConfigError(f"no measured point could be replayed: {first['where']}: {first['reason']}")
    base, digest = load_profile(str(PACKAGED))
    try:
        profile = fit_own(records, base=base, fitted=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                          source=source, precision=points[0].precision, base_sha256=digest)
    except ProfileError as exc:
        raise ConfigError(f"own measurements: {exc}") from None
    return Calibration(profile, records, skipped, time.perf_counter() - started)


# ---- which picks to measure first ---------------------------------------------------------------------------

RECORD = "simulation_record.yaml"
BENCH_SCRIPT = "bench.sh"


@dataclass(frozen=True)
class Pick:
    """One deploy/<rank>/ folder of a finished sweep, as its simulation record states it."""

    rank: int
    folder: Path
    backend: str
    shape: str  # describe_shape's words
    shape_key: tuple[Any, ...]
    value: float | None  # the goal value the ranking used
    band: tuple[float, float] | None  # its P10-P90 (None without a calibration profile or for a front)


@dataclass
class Plan:
    """The picks to measure first, why each, and what the plan could not say."""

    target: str | None
    picks: list[tuple[Pick, str]]  # (pick, why)
    considered: int
    notes: list[str]


def read_picks(run_dir: Path) -> tuple[list[Pick], str | None]:
    """The picks of a finished sweep's deploy/<rank>/ folders, by rank, and the sweep's goal; ConfigError naming
    the folder when there are none or a record cannot be read."""
    deploy = run_dir / "deploy"
    folders = sorted((d for d in deploy.iterdir() if d.is_dir() and d.name.isdigit()), key=lambda d: int(d.name)) \
        if deploy.is_dir() else []
    if not folders:
        raise ConfigError(f"{run_dir}: no deploy/<rank>/{RECORD}; give the output directory of a finished "
                          "spica sweep")
    picks, target = [], None
    for d in folders:
        path = d / RECORD
        try:
            record = yaml.safe_load(path.read_text())
            config, expected = dict(record["config"]), dict(record.get("expected") or {})
        except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{path}: not a simulation record spica sweep wrote: {one_line(exc)}") from None
        target = expected.get("goal") or target
        metrics = dict(expected.get("metrics") or {})
        value = None
        if target and target != "pareto":
            try:
                value = float(objective_value(str(target), metrics))
            except (KeyError, TypeError, ValueError):
                value = None
        band = (expected.get("bands_p10_p90") or {}).get("goal")
        roles = ("prefill_", "decode_") if config.get("deployment_mode") == "disagg" else ("",)
        key = (config.get("backend"), config.get("deployment_mode"),
               *(tuple(config.get(f"{p}{k}") for k in ("tp", "pp", "attention_dp", "moe_tp", "moe_ep", "replicas"))
                 for p in roles))
        picks.append(Pick(int(record.get("rank") or d.name), d, str(config.get("backend")), describe_shape(config),
                          key, value, (float(band[0]), float(band[1])) if band else None))
    return picks, target


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> float:
    """How much of band b lies inside band a, as a share of b (0: apart)."""
    lo, hi = max(a[0], b[0]), min(a[1], b[1])
    width = b[1] - b[0]
    return max(0.0, hi - lo) / width if width > 0 else float(a[0] <= b[0] <= a[1])


def plan(run_dir: Path, n: int = 3) -> Plan:
    """The picks to measure first (module docstring): the pick, then the runners-up whose goal band overlaps the
    pick's, a shape not yet chosen before one already chosen, by rank; at most n. Without bands (calibration
    `none`, or a Pareto front) the first picks by rank, different shapes first."""
    if n < 1:
        raise ConfigError(f"-n must be at least 1, got {n}")
    picks, target = read_picks(run_dir)
    first = picks[0]
    notes: list[str] = []
    chosen: list[tuple[Pick, str]] = [(first, "the pick: rank 1")]
    if first.band is not None:
        rivals = [(p, _overlap(first.band, p.band)) for p in picks[1:] if p.band is not None]
        deciding = [(p, share) for p, share in rivals if share > 0]
        why = {p.rank: f"its band overlaps the pick's ({share:.0%} of it inside)" for p, share in deciding}
        candidates = [p for p, _ in deciding]
        if not candidates:
            notes.append("no runner-up's band overlaps the pick's: the ranking holds within the bands, measure the "
                         "pick to confirm it")
    else:
        candidates = picks[1:]
        why = {p.rank: f"rank {p.rank}" for p in candidates}
        notes.append("the picks carry no goal band (a Pareto front, or evaluation.calibration: none): the first picks "
                     "by rank, different shapes first")
    seen = {first.shape_key}
    for repeat in (False, True):  # new shapes first, then the rest by rank
        for p in candidates:
            if len(chosen) >= n:
                break
            if any(p is q for q, _ in chosen) or ((p.shape_key in seen) != repeat):
                continue
            seen.add(p.shape_key)
            chosen.append((p, why[p.rank] + ("; a shape already listed" if repeat else "")))
    backends = sorted({p.backend for p, _ in chosen})
    if len(backends) > 1:
        notes.append(f"the picks run {' and '.join(backends)}: a profile corrects one backend, so calibrate each "
                     "backend's measurements apart")
    return Plan(target, chosen, len(picks), notes)
