"""Goals and scoring: what a replay report is worth under the pinned goal.

Pure functions over plain values (target strings, report dicts), so the study loop, the merge and
the tests need no config objects. Everything ranks "higher is better" after signing, except the
Pareto machinery, which keeps raw values and a direction per objective.
"""

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal, Mapping, NamedTuple, Sequence, TypeVar

from spica_pipeline.config.goal import (
    GOODPUT_KEY,
    GOODPUT_TARGETS,
    GPU_PRICE_KEY,
    Target,
    as_target,
    objectives_for,
    target_direction,
)
from spica_pipeline.fidelity.apply import REPORT_KEYS as CALIBRATION_KEYS

Direction = Literal["max", "min"]

# Report keys copied into Candidate.metrics, in this order when present.
METRIC_KEYS: tuple[str, ...] = (
    "output_throughput_tok_s",
    "mean_ttft_ms",
    "mean_tpot_ms",
    "mean_e2e_latency_ms",
    "mean_output_token_throughput_per_user",
    GOODPUT_KEY,
    "gpu_hours",
    "duration_ms",
    "planner_total_ticks",
    "request_throughput_rps",
    "p90_ttft_ms",
    "p90_itl_ms",
    "completed_requests",
    "goodput_completed_requests",
    "window_counted_requests",  # the steady-state window's requests: what the goodput counts are out of
    "window_start_ms",  # where the window lies on the replay's timeline
    "window_end_ms",
    "prefix_cache_reused_ratio",  # prefix-cache hit rate: input tokens served from cache / all input tokens
    # the offered load against what was served (fidelity/measurement.LOAD_MEASURES; carries_load judges them)
    "offered_request_rate_rps",
    "settled_served_share",
    "settled_queue_growth_rps",
    GPU_PRICE_KEY,  # USD per GPU-hour, when the goal prices GPU-hours (cost_per_mtok)
    *CALIBRATION_KEYS,  # calibrated values and P10-P90 band multipliers (fidelity/apply.py)
)


class TargetMetric(NamedTuple):
    """How a scalar target reads a replay report: the key, and whether it divides by avg_gpu.

    Its direction is the goal's (`config.goal.target_direction`); a missing value is the worst one."""

    metric: str
    per_gpu: bool


TARGET_METRICS: dict[Target, TargetMetric] = {
    Target.THROUGHPUT: TargetMetric("output_throughput_tok_s", False),
    Target.THROUGHPUT_PER_GPU: TargetMetric("output_throughput_tok_s", True),
    Target.THROUGHPUT_PER_USER: TargetMetric("mean_output_token_throughput_per_user", False),
    Target.E2E_LATENCY: TargetMetric("mean_e2e_latency_ms", False),
    Target.GOODPUT: TargetMetric(GOODPUT_KEY, False),
    Target.GOODPUT_PER_GPU: TargetMetric(GOODPUT_KEY, True),
    # min_gpus: the study's proxy is replayed requests/s per GPU (more per GPU, fewer GPUs for a
    # given load); the exact fleet is sized after the sweep by size_fleet.
    Target.MIN_GPUS: TargetMetric("request_throughput_rps", True),
    # cost_per_mtok: GPU-hours per output token, priced (cost_per_mtok below); the token rate is its metric
    Target.COST_PER_MTOK: TargetMetric("output_throughput_tok_s", True),
}


def _name(target: Any) -> str:
    """Accept a plain string or a str Enum member (the config's `goal.target`)."""
    return str(getattr(target, "value", target))


def _scalar(target: Any) -> Target:
    t = as_target(_name(target))
    if t is Target.PARETO:
        raise ValueError("'pareto' is multi-objective and has no scalar value; use objective_vector")
    return t


def direction(target: Any) -> Direction:
    """'max' for every target but e2e_latency (the goal's rule)."""
    return target_direction(_name(target))


def directions_for(objectives: Sequence[Any]) -> dict[str, Direction]:
    """Objective name -> direction, in the given order (what pareto_front and hypervolume take)."""
    return {_name(o): direction(o) for o in objectives}


def _num(report: Mapping[str, Any] | None, key: str) -> float | None:
    if not report:
        return None
    v = report.get(key)
    if v is None:
        return None
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def ranked_value(report: Mapping[str, Any] | None, key: str) -> float | None:
    """The value picks rank and gate on: the calibrated one when the report has it (a calibration
    profile was on, `evaluation.calibration`), else the raw replayed one. The raw value stays in
    the report and ledger beside it; with `calibration: none` there is no calibrated key."""
    v = _num(report, f"calibrated_{key}")
    return v if v is not None else _num(report, key)


def ranked_on(report: Mapping[str, Any] | None, target: Any, pareto_objectives: Sequence[Any] | None = None) -> str:
    """'calibrated' or 'raw': which numbers a goal (each of its objectives) was ranked on."""
    keys = [TARGET_METRICS[o].metric for o in objectives_for(as_target(_name(target)), pareto_objectives)
            if o in TARGET_METRICS]
    return "calibrated" if keys and all(_num(report, f"calibrated_{k}") is not None for k in keys) else "raw"


def avg_gpu(report: Mapping[str, Any] | None) -> float:
    """Time-averaged provisioned GPUs: gpu_hours / run hours; 0 when either is missing or <= 0.

    For a static fleet this is the GPU count; for a planner run it averages over startup, serving
    and drain, which is why per-GPU targets divide by it rather than by the static shape.
    """
    gpu_hours = _num(report, "gpu_hours") or 0.0
    duration_ms = _num(report, "duration_ms") or 0.0
    if gpu_hours <= 0 or duration_ms <= 0:
        return 0.0
    return gpu_hours / (duration_ms / 3_600_000.0)


def cost_per_mtok(report: Mapping[str, Any] | None) -> float | None:
    """USD per million output tokens: the deployment's GPUs (avg_gpu) for an hour at the report's GPU price
    over the output tokens it serves in an hour (the window's token rate, calibrated when the report has
    it); None without a price, GPUs or output."""
    price, tokens, gpus = _num(report, GPU_PRICE_KEY), ranked_value(report, "output_throughput_tok_s"), avg_gpu(report)
    if price is None or tokens is None or tokens <= 0 or gpus <= 0:
        return None
    return gpus * price / (tokens * 3600.0) * 1e6


def cost_per_k_requests(report: Mapping[str, Any] | None) -> float | None:
    """USD per thousand requests at the window's request rate: the cost per unit of request rate."""
    price, rate, gpus = _num(report, GPU_PRICE_KEY), ranked_value(report, "request_throughput_rps"), avg_gpu(report)
    if price is None or rate is None or rate <= 0 or gpus <= 0:
        return None
    return gpus * price / (rate * 3600.0) * 1000.0


def usd_per_hour(report: Mapping[str, Any] | None) -> float | None:
    """What the deployment's GPUs cost per hour at the report's GPU price."""
    price, gpus = _num(report, GPU_PRICE_KEY), avg_gpu(report)
    return gpus * price if price is not None and gpus > 0 else None


def objective_value(target: Any, report: Mapping[str, Any] | None) -> float:
    """The (unsigned) value of one scalar target read from a flat replay report, on
    calibrated numbers when the report has them (`ranked_value`: the one place picks read a goal
    metric); a missing metric is the worst value (0, or inf for a minimised target)."""
    t = _scalar(target)
    if t is Target.COST_PER_MTOK:
        cost = cost_per_mtok(report)
        return math.inf if cost is None else cost
    rule = TARGET_METRICS[t]
    v = ranked_value(report, rule.metric)
    if v is None:
        return 0.0 if target_direction(t) == "max" else math.inf
    if rule.per_gpu:
        g = avg_gpu(report)
        return v / g if g > 0 else 0.0
    return v


def score(target: Any, report: Mapping[str, Any] | None) -> float:
    """Signed value, higher is better: the raw value, negated for minimised targets."""
    t = _scalar(target)
    v = objective_value(t, report)
    return v if target_direction(t) == "max" else -v


def objective_vector(objectives: Sequence[Any], report: Mapping[str, Any] | None) -> dict[str, float]:
    """Raw value per Pareto objective, keyed by objective name, in the given order."""
    return {_name(o): objective_value(o, report) for o in objectives}


def require_goodput(objectives: Iterable[Any], report: Mapping[str, Any] | None) -> None:
    """Fail closed when a goodput objective is active but replay did not account goodput.

    There is no fallback to mean latency: the trial must be recorded as failed.
    """
    active = sorted(_name(o) for o in objectives if as_target(_name(o)) in GOODPUT_TARGETS)
    if active and (report is None or _num(report, GOODPUT_KEY) is None):
        raise RuntimeError(
            f"goal {active} needs '{GOODPUT_KEY}' but the replay report lacks it; install a replay "
            "version with per-request SLA accounting (ai-dynamo-runtime with goodput support)"
        )


def is_feasible(used_gpus: int, gpu_budget: int) -> bool:
    """Feasibility is the GPU budget only; the SLA acts through goodput."""
    return int(used_gpus) <= int(gpu_budget)


SLA_GATE_KEYS: dict[str, str] = {"ttft_ms": "ttft_ms", "itl_ms": "itl_ms", "e2e_ms": "e2e_latency_ms"}


def sla_gate(
    report: Mapping[str, Any] | None,
    sla: Mapping[str, Any] | None,
    mode: str | None = "strict",
    percentile: int = 90,
) -> tuple[bool, str | None]:
    """An optional aggregate SLA gate, stricter than Spica (which only uses the SLA via goodput).

    mode "strict": reject a candidate whose p<percentile> (default p90) TTFT, ITL or E2E latency in
    the replay report (calibrated when the report has it, `ranked_value`) exceeds the corresponding
    SLA threshold that is set (report keys `p90_ttft_ms`, `p90_itl_ms`, `p90_e2e_latency_ms`). A set threshold whose percentile key is
    missing fails closed. mode None/"off"/"goodput": always passes (the Spica rule).
    Returns (passes, reason); the reason is a one-line text for the ledger.
    """
    if mode in (None, "off", "goodput") or not sla:
        return True, None
    if mode != "strict":
        raise ValueError(f"unknown sla gate mode: {mode!r} (expected 'strict' or 'off')")
    for sla_key, metric in SLA_GATE_KEYS.items():
        limit = sla.get(sla_key)
        if limit is None:
            continue
        key = f"p{percentile}_{metric}"
        observed = ranked_value(report, key)
        if observed is None:
            return False, f"sla gate: report lacks {key}"
        if observed > float(limit):
            # no observed value in the text: equal reasons group together in the failure summary
            return False, f"sla gate: {key} above {sla_key}={float(limit):.4g}"
    return True, None


# Offered load: a candidate carries it when, in the settled half of its window, it serves at least this
# share of the requests arriving and its requests in flight grow by at most (1 - this) x the offered rate.
CARRY_SHARE = 0.95
CARRY_RULE = (f"in the second half of the steady-state window it serves >= {CARRY_SHARE:.0%} of the requests "
              f"arriving and its requests in flight grow by <= {1 - CARRY_SHARE:.0%} of the offered rate")


def carries_load(metrics: Mapping[str, Any] | None) -> bool | None:
    """CARRY_RULE on a report's load measures (fidelity/measurement.LOAD_MEASURES); None without them."""
    offered = _num(metrics, "offered_request_rate_rps")
    share = _num(metrics, "settled_served_share")
    growth = _num(metrics, "settled_queue_growth_rps")
    if offered is None or share is None or growth is None or offered <= 0:
        return None
    return share >= CARRY_SHARE and growth <= (1.0 - CARRY_SHARE) * offered


def replicas_to_carry(metrics: Mapping[str, Any] | None) -> int | None:
    """Copies of a deployment that would carry its offered load: ceil(offered / served request rate), at
    least 2 for one that does not carry it alone; None without the rates."""
    offered, served = _num(metrics, "offered_request_rate_rps"), ranked_value(metrics, "request_throughput_rps")
    if offered is None or served is None or served <= 0 or offered <= 0:
        return None
    return max(2, math.ceil(offered / served - 1e-9))


ATTAINMENT_KEYS = {"ranked": None, "raw": "goodput_completed_requests",
                   "pessimistic": "pessimistic_goodput_completed_requests"}


def sla_good_requests(metrics: Mapping[str, Any] | None, basis: str = "ranked") -> float | None:
    """The window's measured requests that met goal.sla. basis "ranked": at calibrated latencies when the
    report has them (what picks are judged on), "raw": the replay's own, "pessimistic": TTFT and ITL at the
    top of their P10-P90 bands (fidelity/apply.py)."""
    key = ATTAINMENT_KEYS[basis]
    return ranked_value(metrics, "goodput_completed_requests") if key is None else _num(metrics, key)


def sla_attainment(metrics: Mapping[str, Any] | None, basis: str = "ranked") -> float | None:
    """Share of the window's measured requests (window_counted_requests) that met goal.sla, on `basis`
    (sla_good_requests); None without an SLA count."""
    done = _num(metrics, "window_counted_requests")
    done = done if done is not None else _num(metrics, "completed_requests")
    good = sla_good_requests(metrics, basis)
    if done is None or good is None or done <= 0:
        return None
    return good / done


def meets_sla(metrics: Mapping[str, Any] | None, required: float | None) -> bool | None:
    """Whether the ranked attainment reaches `required`; None when there is no SLA or no count."""
    if required is None:
        return None
    got = sla_attainment(metrics)
    return None if got is None else got >= required - 1e-12


class FleetSize(NamedTuple):
    """A min_gpus answer for one candidate: `replicas` copies of its deployment, `gpus` in all."""

    replicas: int
    gpus: int
    capacity: float  # the load one replica carries (req/s, or requests in flight)
    load: float
    kind: str  # "request_rate" | "concurrency"


def replica_capacity(kind: str, report: Mapping[str, Any] | None, config: Mapping[str, Any]) -> float | None:
    """The load one copy of a candidate carried in replay: its completed request rate, or the
    concurrency it was replayed at. None when the replay did not record it."""
    if kind == "request_rate":
        return ranked_value(report, "request_throughput_rps")
    if kind == "concurrency":
        for key in ("concurrency", "kv_load_concurrency"):
            v = _num(config, key)
            if v is not None:
                return v
        return None
    raise ValueError(f"unknown load kind {kind!r} (request_rate or concurrency)")


def size_fleet(kind: str, load: float, capacity: float | None, used_gpus: int) -> FleetSize | None:
    """replicas = ceil(load / capacity), GPUs = replicas x the candidate's GPUs; None if it carries nothing."""
    if capacity is None or not math.isfinite(capacity) or capacity <= 0 or used_gpus <= 0:
        return None
    replicas = max(1, math.ceil(load / capacity - 1e-9))
    return FleetSize(replicas, replicas * int(used_gpus), float(capacity), float(load), kind)


def metrics_from_report(report: Mapping[str, Any] | None) -> dict[str, float]:
    """The candidate-metrics subset of a report: whichever METRIC_KEYS are present and numeric."""
    out: dict[str, float] = {}
    for k in METRIC_KEYS:
        v = _num(report, k)
        if v is not None:
            out[k] = v
    return out


@dataclass
class Candidate:
    """A feasible configuration and what it scored, plus where it came from.

    score: scalar goal -> the signed objective; Pareto -> the first objective's raw value
    (a headline only; Pareto never ranks by it).
    """

    config: dict[str, Any]
    used_gpus: int
    score: float
    metrics: dict[str, float]
    objectives: dict[str, float] | None = None
    branch: str | None = None
    spec_hash: str | None = None
    spread: dict[str, dict[str, float]] = field(default_factory=dict)
    # candidates whose replayed metrics equal this one's (report/merge.py), which it stands for in rankings
    twins: list["Candidate"] = field(default_factory=list)

    @classmethod
    def from_report(
        cls,
        config: Mapping[str, Any],
        report: Mapping[str, Any] | None,
        target: Any,
        pareto_objectives: Sequence[Any] | None = None,
        *,
        branch: str | None = None,
        spec_hash: str | None = None,
        spread: Mapping[str, Mapping[str, float]] | None = None,
    ) -> "Candidate":
        """Score a report under the goal; a Pareto goal fills `objectives` and the headline score."""
        if as_target(_name(target)) is Target.PARETO:
            objs = objective_vector(objectives_for(Target.PARETO, pareto_objectives), report)
            return cls.pareto(config, objs, metrics_from_report(report), branch=branch,
                              spec_hash=spec_hash, spread=spread)
        return cls(
            config=dict(config), used_gpus=int(config.get("used_gpus", 0)), score=score(target, report),
            metrics=metrics_from_report(report), objectives=None, branch=branch, spec_hash=spec_hash,
            spread={k: dict(v) for k, v in (spread or {}).items()},
        )

    @classmethod
    def pareto(
        cls,
        config: Mapping[str, Any],
        objectives: Mapping[str, float] | None,
        metrics: Mapping[str, float] | None = None,
        **extra: Any,
    ) -> "Candidate":
        """A Pareto candidate: score is the first objective's raw value; objectives are required."""
        if not objectives:
            raise ValueError("a Pareto candidate needs objectives (raw value per objective)")
        spread = extra.pop("spread", None) or {}
        return cls(
            config=dict(config), used_gpus=int(config.get("used_gpus", 0)),
            score=float(next(iter(objectives.values()))), metrics=dict(metrics or {}),
            objectives={k: float(v) for k, v in objectives.items()},
            spread={k: dict(v) for k, v in spread.items()}, **extra,
        )


C = TypeVar("C")


def rank(candidates: Iterable[C]) -> list[C]:
    """Best score first; equal scores go to fewer GPUs (cheaper); otherwise input order (stable)."""
    return sorted(candidates, key=lambda c: (-c.score, c.used_gpus))  # type: ignore[attr-defined]


def _vector(point: Any, names: Sequence[str] | None) -> tuple[float, ...] | None:
    """A point's objective values in objective order; None when it has no objectives."""
    if names is None:
        return tuple(float(v) for v in point)
    objs = point.objectives if hasattr(point, "objectives") else point
    if objs is None:
        return None
    return tuple(float(objs.get(n, 0.0) if objs.get(n) is not None else 0.0) for n in names)


def _split_directions(directions: Mapping[str, str] | Sequence[str]) -> tuple[list[str] | None, list[str]]:
    if isinstance(directions, Mapping):
        names, dirs = list(directions), [str(d) for d in directions.values()]
    else:
        names, dirs = None, [str(d) for d in directions]
    bad = [d for d in dirs if d not in ("max", "min")]
    if bad:
        raise ValueError(f"objective directions must be 'max' or 'min', got {bad}")
    return names, dirs


def dominates(a: Sequence[float], b: Sequence[float], dirs: Sequence[str]) -> bool:
    """a is at least as good as b everywhere (in each objective's direction) and better somewhere."""
    strictly = False
    for x, y, d in zip(a, b, dirs):
        if d == "min":
            x, y = -x, -y
        if x < y:
            return False
        if x > y:
            strictly = True
    return strictly


def pareto_front(points: Iterable[C], directions: Mapping[str, str] | Sequence[str]) -> list[C]:
    """The non-dominated subset, sorted ascending by the last objective (the x axis), stable.

    `directions` as a mapping (objective name -> 'max'|'min') reads each point's `.objectives` (a
    Candidate) or the point itself as a mapping; points without objectives are ignored and a
    missing value counts as 0. As a plain sequence it reads each point as a value sequence.
    Exact ties do not dominate each other, so both are kept. O(n^2), as in Spica.
    """
    names, dirs = _split_directions(directions)
    kept = [(p, v) for p in points if (v := _vector(p, names)) is not None]
    front = [(p, v) for p, v in kept if not any(dominates(w, v, dirs) for _, w in kept)]
    front.sort(key=lambda pv: pv[1][-1])
    return [p for p, _ in front]


def default_reference(vectors: Sequence[Sequence[float]], dirs: Sequence[str]) -> tuple[float, ...]:
    """Origin for maximised objectives; 1.1 x the largest observed value for minimised ones."""
    ref = []
    for i, d in enumerate(dirs):
        if d == "max":
            ref.append(0.0)
        else:
            worst = max((v[i] for v in vectors), default=0.0)
            ref.append(worst * 1.1)
    return tuple(ref)


def hypervolume(
    front: Iterable[Any],
    directions: Mapping[str, str] | Sequence[str],
    reference: Sequence[float] | None = None,
) -> float:
    """Volume dominated by the points and bounded by the reference point (exact in every dimension).

    Points are read like `pareto_front` reads them (dominated points may be included; they add
    nothing). Reference default: 0 (the origin) for a maximised objective; for a minimised one the
    worst (largest) observed value times 1.1, so the worst point still encloses some volume. Pass
    an explicit `reference` to compare hypervolumes across runs or over a convergence series.
    Points not strictly better than the reference on every objective contribute nothing.
    Exact sweep for 2-D (O(n log n)); for 3+ D exact slicing over the last objective (HSO),
    O(n^(d-1) log n), fine for fronts of a few hundred points.
    """
    names, dirs = _split_directions(directions)
    vectors = [v for p in front if (v := _vector(p, names)) is not None]
    if not vectors:
        return 0.0
    ref = tuple(float(r) for r in reference) if reference is not None else default_reference(vectors, dirs)
    if len(ref) != len(dirs):
        raise ValueError(f"reference has {len(ref)} values for {len(dirs)} objectives")
    # Flip minimised objectives so everything is maximised above the reference.
    sign = [1.0 if d == "max" else -1.0 for d in dirs]
    r = tuple(s * x for s, x in zip(sign, ref))
    pts = [tuple(s * x for s, x in zip(sign, v)) for v in vectors]
    pts = [p for p in pts if all(math.isfinite(x) and x > rx for x, rx in zip(p, r))]
    return _hv(pts, r)


def _hv(points: list[tuple[float, ...]], ref: tuple[float, ...]) -> float:
    if not points:
        return 0.0
    d = len(ref)
    if d == 1:
        return max(p[0] for p in points) - ref[0]
    if d == 2:
        # Sweep x descending; each point adds the strip of y above the best y seen so far.
        total, best_y = 0.0, ref[1]
        for x, y in sorted(points, key=lambda p: (-p[0], -p[1])):
            if y > best_y:
                total += (x - ref[0]) * (y - best_y)
                best_y = y
        return total
    # Slice along the last objective: between consecutive distinct levels z_i > z_{i+1}, the
    # dominated cross-section is the (d-1)-D hypervolume of every point with last value >= z_i.
    pts = sorted(points, key=lambda p: -p[-1])
    levels = sorted({p[-1] for p in pts}, reverse=True) + [ref[-1]]
    total, active, j = 0.0, [], 0
    for z, z_next in zip(levels, levels[1:]):
        while j < len(pts) and pts[j][-1] >= z:
            active.append(pts[j][:-1])
            j += 1
        total += _hv(active, ref[:-1]) * (z - z_next)
    return total


KNEE_RULE_2D = "knee: the front point farthest from the straight line joining the front's two extremes (objectives scaled to [0, 1] over the front)"
KNEE_RULE_ND = "closest to the ideal point: smallest distance to the best value of every objective (objectives scaled to [0, 1] over the front)"


def knee_index(vectors: Sequence[Sequence[float]], dirs: Sequence[str]) -> tuple[int, str]:
    """The recommended point of a front and the rule that picked it.

    Objectives are scaled to [0, 1] over the front, 1 = best. Two objectives: the knee, the point
    farthest from the chord between the two extremes on the ideal side (ties: the first); a front
    of one or two points, or a straight one, falls back to the closest point to the ideal (1, 1).
    Three or more: the closest point to the ideal. Raises ValueError on an empty front.
    """
    if not vectors:
        raise ValueError("an empty front has no recommended point")
    d = len(dirs)
    scaled = []
    for v in vectors:
        row = []
        for i in range(d):
            col = [float(w[i]) for w in vectors]
            lo, hi = min(col), max(col)
            x = 0.5 if hi == lo else (float(v[i]) - lo) / (hi - lo)
            row.append(x if dirs[i] == "max" else 1.0 - x)
        scaled.append(row)

    def ideal_distance(i: int) -> float:
        return math.sqrt(sum((1.0 - x) ** 2 for x in scaled[i]))

    closest = min(range(len(scaled)), key=lambda i: (ideal_distance(i), i))
    if d != 2 or len(scaled) < 3:
        return closest, KNEE_RULE_ND
    a = max(range(len(scaled)), key=lambda i: (scaled[i][0], -i))  # best on the first objective
    b = max(range(len(scaled)), key=lambda i: (scaled[i][1], -i))  # best on the second
    (ax, ay), (bx, by) = scaled[a], scaled[b]
    norm = math.hypot(bx - ax, by - ay)
    if norm == 0:
        return closest, KNEE_RULE_ND

    def above_chord(i: int) -> float:
        x, y = scaled[i]
        # signed distance, positive on the side of the ideal point (1, 1)
        side = ((bx - ax) * (1.0 - ay) - (by - ay) * (1.0 - ax))
        dist = ((bx - ax) * (y - ay) - (by - ay) * (x - ax)) / norm
        return dist if side >= 0 else -dist

    best = max(range(len(scaled)), key=lambda i: (round(above_chord(i), 12), -i))
    if above_chord(best) <= 1e-12:
        return closest, KNEE_RULE_ND
    return best, KNEE_RULE_2D
