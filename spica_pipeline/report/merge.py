"""Stage 6, merge by goal: all branches' feasible ledger rows become one ranked list or one front.

Input is the sweep ledger (one row per trial, JSON-string columns as written by optimize/ledger.py).
The merge re-scores each feasible row from its stored replay report, so the result depends only on
the goal and the reports, never on how a branch happened to sign or store its score.

What a user can act on comes first: candidates that carry the offered load and meet goal.sla for the
required share of requests rank before those that do not (`tier`), and candidates whose replayed
metrics are equal are one entry (`collapse_twins`), the others listed as its equivalent settings.
"""

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import pandas as pd

from spica_pipeline.config.goal import GPU_PRICE_KEY, Target, objectives_for
from spica_pipeline.evaluate import scoring
from spica_pipeline.evaluate.scoring import Candidate
from spica_pipeline.space.candidate import Candidate as Deployment

STATUSES = ("feasible", "infeasible", "failed", "timed_out", "unsupported", "cached")
REQUIRED_COLUMNS = ("branch", "status", "spec_hash", "config", "report", "used_gpus")


def _present(value: Any) -> bool:
    """False for None and for the NaN pandas puts in missing cells."""
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _loads(value: Any, default: Any = None) -> Any:
    """A ledger JSON cell: JSON text, an already-decoded object, or null/NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return default
    if isinstance(value, (dict, list)):
        return value
    if isinstance(value, (bytes, str)):
        if not value:
            return default
        return json.loads(value)
    return default


@dataclass
class MergeResult:
    """What the sweep found, by goal: the ranked list or the Pareto front, and how it got there.

    candidates: scalar goal -> every feasible candidate, best first; Pareto -> the front, ascending
        by the last objective. feasible: every unique feasible candidate in ledger order (for plots).
    convergence: one row per (scope, evaluation): scope is a branch name or "merged"; evaluation
        counts trials in ledger order, per scope, cache hits excluded (they evaluate nothing new); value is the best score, or the front's hypervolume against the fixed
        `reference`, after that evaluation (NaN before the first feasible one).
    """

    target: str
    objectives: list[str]
    directions: dict[str, str]
    candidates: list[Candidate]
    feasible: list[Candidate]
    counts: dict[str, int]
    duplicates: int
    failure_reasons: list[tuple[str, int]]
    convergence: pd.DataFrame
    branches: list[str]
    exhaustive_branches: list[str] = field(default_factory=list)
    hypervolume: float | None = None
    reference: tuple[float, ...] | None = None
    over_budget: int = 0
    # min_gpus: the load the fleet is sized for, and feasible candidates that could not carry any of it
    load_target: dict[str, float] | None = None
    unservable: int = 0
    # the offered load in words ("8 req/s"; None: a closed loop, nothing to carry), and whether a candidate
    # that does not carry it ranks after those that do (goal.offered_load "required") or is only marked
    offered: str | None = None
    offered_required: bool = True
    # goal.sla's thresholds and the share of requests a pick must serve within them (None: no SLA)
    sla: dict[str, float] | None = None
    sla_required: float | None = None
    gpu_price: float | None = None  # USD per GPU-hour the candidates are priced at
    # with disagg roles on two GPU types: each type's USD per GPU-hour (a candidate's price is the mean over its GPUs)
    gpu_prices: dict[str, float] | None = None

    def carries(self, c: Candidate) -> bool | None:
        """Whether `c` carries the offered load (scoring.carries_load); None when nothing is offered."""
        return scoring.carries_load(c.metrics) if self.offered is not None else None

    def meets_sla(self, c: Candidate) -> bool | None:
        """Whether `c` serves goal.sla_attainment of its requests within goal.sla; None without an SLA."""
        return scoring.meets_sla(c.metrics, self.sla_required)

    def tier(self, c: Candidate) -> int:
        """Where `c` ranks before its score counts (`tier`)."""
        return tier(c, self.offered is not None and self.offered_required, self.sla_required)

    @property
    def is_pareto(self) -> bool:
        return self.target == Target.PARETO

    @property
    def best(self) -> Candidate | None:
        """Scalar: the top of the ranking. Pareto: the recommended front point (see `recommendation`)."""
        top = self.top(1)
        return top[0] if top else None

    @property
    def recommendation(self) -> tuple[Candidate, str] | None:
        """Pareto: (the recommended front point, the rule that picked it: the knee for two
        objectives); scalar: (the top of the ranking, 'best <target>')."""
        if not self.candidates:
            return None
        if not self.is_pareto:
            return self.candidates[0], f"best {self.target}"
        vectors = [_vec(c, self.objectives) for c in self.candidates]
        i, rule = scoring.knee_index(vectors, [self.directions[o] for o in self.objectives])
        return self.candidates[i], rule

    def top(self, n: int) -> list[Candidate]:
        """The n candidates to hand out first, in rank order (deploy/<rank>): the ranking's head, or
        for a front the recommended point, then the others best-first on the headline objective."""
        if not self.is_pareto:
            return self.candidates[:n]
        first = self.objectives[0]
        sign = 1.0 if self.directions[first] == "max" else -1.0
        ordered = sorted(self.candidates, key=lambda c: (-sign * (c.objectives or {}).get(first, 0.0), c.used_gpus))
        rec = self.recommendation
        if rec is not None:
            ordered = [rec[0]] + [c for c in ordered if c is not rec[0]]
        return ordered[:n]

    def rank_of(self, c: Candidate) -> int | None:
        """1-based rank of a candidate in `top` order (the deploy/<rank> number), None if not listed."""
        for i, x in enumerate(self.top(len(self.candidates)), start=1):
            if x is c:
                return i
        return None

    def failure_summary(self, k: int = 3) -> list[str]:
        """Up to k distinct reasons with (xN) counts, then '+K more distinct reason(s)'."""
        lines = [f"{reason} (x{n})" for reason, n in self.failure_reasons[:k]]
        if len(self.failure_reasons) > k:
            lines.append(f"+{len(self.failure_reasons) - k} more distinct reason(s)")
        return lines

    def cli_lines(self) -> list[str]:
        """The CLI's result listing: 'i: score=.. used_gpus=n', or for a front a header
        then 'i: obj=<4 significant digits>, ... [concurrency=c] used_gpus=n'. Empty when nothing."""
        if not self.candidates:
            return []
        if not self.is_pareto:
            return [f"{i}: score={c.score} used_gpus={c.used_gpus}"
                    + (f" fleet_gpus={int(c.metrics['fleet_gpus'])}" if "fleet_gpus" in c.metrics else "")
                    for i, c in enumerate(self.candidates)]
        lines = [f"pareto front ({len(self.candidates)} non-dominated):"]
        for i, c in enumerate(self.candidates):
            objs = ", ".join(f"{k}={v:.4g}" for k, v in (c.objectives or {}).items())
            conc = c.config.get("concurrency", c.config.get("kv_load_concurrency"))
            lines.append(f"{i}: {objs}" + (f" concurrency={conc}" if conc is not None else "")
                         + f" used_gpus={c.used_gpus}")
        return lines

    def summary_line(self) -> str:
        """Spica's end-of-run line: outcome counts, then the headline result."""
        c = self.counts
        head = (f"feasible={c.get('feasible', 0)} gated={c.get('infeasible', 0) + c.get('timed_out', 0)} "
                f"unsupported={c.get('unsupported', 0)} failed={c.get('failed', 0)} cache_hits={self.duplicates}")
        if not self.candidates:
            if self.unservable:
                return f"{head}; NO candidate carried any of the load ({self.unservable} feasible, capacity 0)"
            return f"{head}; NO feasible candidate"
        if self.is_pareto:
            return f"{head}; pareto front: {len(self.candidates)}"
        best = self.candidates[0]
        if self.target == Target.MIN_GPUS and "fleet_gpus" in best.metrics:
            kind, load = next(iter((self.load_target or {"load": 0}).items()))
            return (f"{head}; min_gpus: {int(best.metrics['fleet_gpus'])} GPUs = "
                    f"{int(best.metrics['fleet_replicas'])} x {best.used_gpus} for {kind} {load:g}")
        value = best.score if scoring.direction(self.target) == "max" else -best.score
        return f"{head}; best {self.target}={value:.6g}"


def tier(c: Candidate, load_required: bool, sla_required: float | None) -> int:
    """0 for a candidate a user can act on; +2 when it does not carry the offered load (and that is
    required), +1 when it misses the SLA for the required share of requests: rankings order by tier first."""
    unserved = load_required and scoring.carries_load(c.metrics) is False
    return 2 * unserved + (scoring.meets_sla(c.metrics, sla_required) is False)


def _price(config: Mapping[str, Any], gpu_price: float | None,
           gpu_prices: Mapping[str, float] | None) -> float | None:
    """A candidate's USD per GPU-hour: with roles on their own GPU types the mean of its GPUs' prices by type
    (space/candidate.Candidate.gpu_usd_per_hour), else the sweep's one price."""
    if not gpu_prices or not any(f"{r}_hardware_sku" in config for r in ("prefill", "decode")):
        return gpu_price
    try:
        return Deployment.from_dict(config, extra="ignore").gpu_usd_per_hour(gpu_prices.get)
    except (ValueError, TypeError, KeyError):  # not a whole candidate (a hand-made ledger row)
        return gpu_price


def _candidate(row: Mapping[str, Any], target: str, objectives: Sequence[str],
               gpu_price: float | None = None, gpu_prices: Mapping[str, float] | None = None) -> Candidate:
    config = _loads(row.get("config"), {}) or {}
    if "used_gpus" not in config and row.get("used_gpus") is not None:
        config = {**config, "used_gpus": int(row["used_gpus"])}
    report = _loads(row.get("report"))
    gpu_price = _price(config, gpu_price, gpu_prices)
    if report is not None and gpu_price is not None:  # the config's price, also for a ledger priced otherwise
        report = {**report, GPU_PRICE_KEY: gpu_price}
    spread = _loads(row.get("spread"), {}) or {}
    branch = str(row.get("branch"))
    spec_hash = str(row["spec_hash"]) if _present(row.get("spec_hash")) else None
    if report is not None:
        cand = Candidate.from_report(config, report, target, objectives if target == Target.PARETO else None,
                                     branch=branch, spread=spread, spec_hash=spec_hash)
    elif target == Target.PARETO:
        # No stored report: fall back to the objective vector the study recorded.
        cand = Candidate.pareto(config, _loads(row.get("objectives")), {}, branch=branch, spread=spread,
                                spec_hash=spec_hash)
    else:
        s = row.get("score")
        if s is None or not _present(s):
            raise ValueError(f"ledger row {row.get('spec_hash')!r}: feasible without report or score")
        cand = Candidate(config=config, used_gpus=int(config.get("used_gpus", 0)), score=float(s),
                         metrics={}, branch=branch, spec_hash=spec_hash, spread=spread)
    if _present(row.get("used_gpus")):
        cand.used_gpus = int(row["used_gpus"])
    return cand


def merge_candidates(
    ledger_df: pd.DataFrame,
    goal_target: Any,
    objectives: Sequence[Any] | None = None,
    directions: Mapping[str, str] | None = None,
    gpu_budget: int | None = None,
    load_target: Mapping[str, float] | None = None,
    *,
    offered: str | None = None,
    offered_required: bool = True,
    sla: Mapping[str, float] | None = None,
    sla_required: float | None = None,
    gpu_price: float | None = None,
    gpu_prices: Mapping[str, float] | None = None,
) -> MergeResult:
    """Merge every branch's feasible trials by goal (stage 6).

    Feasible rows only, deduplicated by spec_hash (first occurrence wins and keeps its branch);
    rows over `gpu_budget` are dropped defensively and counted in `over_budget`. A scalar goal
    gives the ranked list (score desc, ties to fewer GPUs); `pareto` gives the non-dominated front
    and its hypervolume (reference: see scoring.hypervolume, fixed over all feasible points).
    `min_gpus` with `load_target` ({"request_rate": r} or {"concurrency": c}) ranks by the fleet each
    candidate needs (scoring.size_fleet from its replayed per-replica capacity), fewest GPUs first;
    ties go to the higher score (capacity per GPU). Candidates that carry no load are left out.

    offered (the offered load in words; None for a closed loop) and sla / sla_required (goal.sla and the
    share of requests to meet it) order every ranking by `MergeResult.tier` first; a front is taken over
    the best tier present. min_gpus replays a probe load, so it is judged by its fleet, not by `offered`.
    Twins (equal replayed metrics) become one entry (`collapse_twins`). gpu_price (USD per GPU-hour)
    prices every candidate for the cost columns and cost_per_mtok.
    """
    missing = [c for c in REQUIRED_COLUMNS if c not in ledger_df.columns]
    if missing:
        raise ValueError(f"ledger is missing column(s) {missing}")
    target = scoring._name(goal_target)
    is_pareto = target == Target.PARETO
    dirs: dict[str, str]
    if is_pareto:
        objs = [t.value for t in objectives_for(target, objectives)]
        dirs = dict(directions) if directions else dict(scoring.directions_for(objs))
        if list(dirs) != objs:
            dirs = {o: dirs.get(o) or scoring.direction(o) for o in objs}
    else:
        scoring.direction(target)  # validates the target
        objs, dirs = [target], {target: scoring.direction(target)}

    rows = ledger_df.to_dict("records")
    counts = {s: 0 for s in STATUSES}
    reasons: Counter[str] = Counter()
    seen: set[str] = set()
    duplicates = over_budget = 0
    feasible: list[Candidate] = []
    # Convergence bookkeeping: one evaluation per non-cached trial, per branch and merged.
    branches: list[str] = []
    evals: Counter[str] = Counter()
    series: list[dict[str, Any]] = []
    steps: list[tuple[str, Candidate | None]] = []

    for row in rows:
        status = str(row.get("status"))
        branch = str(row.get("branch"))
        if branch not in branches:
            branches.append(branch)
        counts[status] = counts.get(status, 0) + 1
        if status not in ("feasible", "cached"):
            reason = row.get("reason")
            reasons[str(reason) if _present(reason) and reason else status] += 1
        if status == "cached":
            duplicates += 1
            continue
        cand = None
        if status == "feasible":
            h = str(row.get("spec_hash"))
            if h in seen:
                duplicates += 1
            elif gpu_budget is not None and not scoring.is_feasible(int(row["used_gpus"]), gpu_budget):
                over_budget += 1
            else:
                seen.add(h)
                cand = _candidate(row, target, objs, gpu_price, gpu_prices)
                feasible.append(cand)
        steps.append((branch, cand))

    offered = None if target == Target.MIN_GPUS else offered
    sla_required = sla_required if sla else None

    def tier_of(c: Candidate) -> int:
        return tier(c, offered is not None and offered_required, sla_required)

    if is_pareto:
        reference = scoring.default_reference([_vec(c, objs) for c in feasible], list(dirs.values()))
        best_tier = min((tier_of(c) for c in feasible), default=0)
        front = scoring.pareto_front([c for c in feasible if tier_of(c) == best_tier], dirs)
        hv = scoring.hypervolume(front, dirs, reference) if front else 0.0
        ranked = front
    else:
        reference, hv = None, None
        ranked = scoring.rank(feasible)
    unservable = 0
    if target == Target.MIN_GPUS and load_target:
        ranked, unservable = _size_fleets(ranked, dict(load_target), rows)
    ranked = collapse_twins(sorted(ranked, key=tier_of), {id(c): i for i, c in enumerate(feasible)}, tier_of)

    tracker = {scope: _Tracker(is_pareto, dirs, reference) for scope in (*branches, "merged")}
    for branch, cand in steps:
        for scope in (branch, "merged"):
            evals[scope] += 1
            series.append({"scope": scope, "evaluation": evals[scope], "value": tracker[scope].add(cand)})
    convergence = pd.DataFrame(series, columns=["scope", "evaluation", "value"])

    exhaustive = []
    if "source" in ledger_df.columns:
        exhaustive = sorted({str(b) for b, s in zip(ledger_df["branch"], ledger_df["source"]) if s == "exhaustive"})
    return MergeResult(
        target=target, objectives=objs, directions=dirs, candidates=ranked, feasible=feasible,
        counts=counts, duplicates=duplicates, failure_reasons=sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])),
        convergence=convergence, branches=branches, exhaustive_branches=exhaustive,
        hypervolume=hv, reference=reference, over_budget=over_budget,
        load_target=dict(load_target) if load_target else None, unservable=unservable,
        offered=offered, offered_required=offered_required, sla=dict(sla) if sla else None, sla_required=sla_required,
        gpu_price=gpu_price, gpu_prices=dict(gpu_prices) if gpu_prices else None,
    )


def _size_fleets(ranked: list[Candidate], load_target: dict[str, float],
                 rows: Sequence[Mapping[str, Any]]) -> tuple[list[Candidate], int]:
    """Attach fleet_replicas / fleet_gpus / replica_capacity to each candidate and rank by fleet GPUs."""
    (kind, load), = load_target.items()
    reports = {str(r.get("spec_hash")): _loads(r.get("report")) for r in rows if r.get("status") == "feasible"}
    sized, unservable = [], 0
    for c in ranked:
        capacity = scoring.replica_capacity(kind, reports.get(str(c.spec_hash)), c.config)
        fleet = scoring.size_fleet(kind, float(load), capacity, c.used_gpus)
        if fleet is None:
            unservable += 1
            continue
        c.metrics = {**c.metrics, "fleet_replicas": float(fleet.replicas), "fleet_gpus": float(fleet.gpus),
                     "replica_capacity": fleet.capacity}
        sized.append(c)
    sized.sort(key=lambda c: (c.metrics["fleet_gpus"], -c.score, c.used_gpus))
    return sized, unservable


def offered_load(workload: Any) -> str | None:
    """The load an open-loop workload offers, in words; None for a closed loop (nothing to carry)."""
    shape = getattr(workload, "shape", None)
    if shape == "request_rate":
        return f"{float(workload.request_rate):g} req/s"
    if shape == "trace":
        return "the trace's arrivals"
    return None


def merge_for_config(ledger_df: pd.DataFrame, config: Any) -> MergeResult:
    """merge_candidates driven by a validated SmartSearchConfig: its goal (target, SLA and the share of
    requests to meet it, the offered-load rule, GPU prices), GPU budget and workload (the offered load)."""
    goal = config.goal
    objectives = goal.objective_names() if goal.is_pareto else None
    load = goal.load.model_dump(exclude_none=True) if getattr(goal, "load", None) is not None else None
    return merge_candidates(ledger_df, goal.target, objectives, None, config.search_space.gpu_budget,
                            load_target=load, offered=offered_load(getattr(config, "workload", None)),
                            offered_required=goal.offered_load == "required", sla=goal.sla_thresholds(),
                            sla_required=goal.required_attainment(),
                            gpu_price=goal.gpu_usd_per_hour(getattr(config.search_space, "hardware_sku", None)),
                            gpu_prices=type_prices(config))


def type_prices(config: Any) -> dict[str, float] | None:
    """Each GPU type's USD per GPU-hour when disagg roles run on their own types (None otherwise, or when a
    type has no price)."""
    space = config.search_space
    if not getattr(space, "split_systems", False):
        return None
    systems = dict.fromkeys([space.hardware_sku, *space.role_systems("prefill"), *space.role_systems("decode")])
    prices = {system: config.goal.gpu_usd_per_hour(system) for system in systems}
    return None if any(p is None for p in prices.values()) else {s: float(p) for s, p in prices.items()}


# Twins: equal (to TWIN_DIGITS significant digits) in every one of these replayed metrics, in one branch and tier.
TWIN_METRICS = ("output_throughput_tok_s", "request_throughput_rps", "mean_ttft_ms", "p90_ttft_ms", "mean_tpot_ms",
                "p90_itl_ms", "mean_e2e_latency_ms", "mean_output_token_throughput_per_user",
                scoring.GOODPUT_KEY, "goodput_completed_requests")
TWIN_DIGITS = 4
TWIN_RULE = ("candidates whose replayed metrics are equal (throughput, request rate, TTFT, TPOT/ITL, E2E, goodput; "
             f"mean and p90, to {TWIN_DIGITS} significant digits) are one entry, shown as the one with the fewest GPUs, "
             "then the smallest max_num_seqs, then the smallest max_num_batched_tokens (agg, prefill, decode in "
             "turn), then the first evaluated, at its own rank")
_TWIN_KNOBS = tuple(f"{role}_{knob}" for role in ("agg", "prefill", "decode")
                    for knob in ("max_num_seqs", "max_num_batched_tokens"))


def twin_key(c: Candidate) -> tuple[Any, ...]:
    """What twins share: the branch and the replayed TWIN_METRICS to TWIN_DIGITS digits. The same replay on
    more GPUs is the same answer at a higher cost, so the GPU count is not part of it; nor are calibrated
    values, which move with the number of engines a load is spread over even when no request saw it."""
    def rounded(key: str) -> str | None:
        v = c.metrics.get(key)
        return None if v is None else f"{float(v):.{TWIN_DIGITS}g}"

    values = [rounded(k) for k in TWIN_METRICS]
    if all(v is None for v in values):  # nothing replayed to compare: a twin of nothing
        return ("unique", id(c))
    return (c.branch, *values)


def _representative_key(c: Candidate, order: Mapping[int, int]) -> tuple[Any, ...]:
    knobs = tuple(float(v) if isinstance(v := c.config.get(k), (int, float)) else math.inf for k in _TWIN_KNOBS)
    return (c.metrics.get("fleet_gpus", c.used_gpus), *knobs[0::2], *knobs[1::2], order.get(id(c), 0))


def collapse_twins(ranked: Sequence[Candidate], order: Mapping[int, int] | None = None,
                   tier_of: Callable[[Candidate], int] | None = None) -> list[Candidate]:
    """One entry per group of twins (`twin_key`, within one `tier_of`): the member TWIN_RULE picks, at its own
    place in `ranked`, the others in its `twins` (in ranking order). `order`: id -> ledger position."""
    groups: dict[tuple[Any, ...], list[Candidate]] = {}
    for c in ranked:
        groups.setdefault((tier_of(c) if tier_of else 0, *twin_key(c)), []).append(c)
    kept = set()
    for members in groups.values():
        rep = min(members, key=lambda c: _representative_key(c, order or {}))
        rep.twins = [c for c in members if c is not rep]
        kept.add(id(rep))
    return [c for c in ranked if id(c) in kept]


def _vec(c: Candidate, objs: Sequence[str]) -> tuple[float, ...]:
    o = c.objectives or {}
    return tuple(float(o.get(n) or 0.0) for n in objs)


class _Tracker:
    """Best-so-far for one scope: a running max score, or an incrementally kept front's hypervolume."""

    def __init__(self, is_pareto: bool, dirs: Mapping[str, str], reference: tuple[float, ...] | None):
        self.is_pareto, self.dirs, self.reference = is_pareto, dict(dirs), reference
        self.best = math.nan
        self.front: list[Candidate] = []

    def add(self, cand: Candidate | None) -> float:
        if cand is None:
            return self.best
        if not self.is_pareto:
            self.best = cand.score if math.isnan(self.best) else max(self.best, cand.score)
            return self.best
        objs, dvals = list(self.dirs), list(self.dirs.values())
        v = _vec(cand, objs)
        if any(scoring.dominates(_vec(f, objs), v, dvals) for f in self.front) and not math.isnan(self.best):
            return self.best
        self.front = [f for f in self.front if not scoring.dominates(v, _vec(f, objs), dvals)] + [cand]
        self.best = scoring.hypervolume(self.front, self.dirs, self.reference)
        return self.best
