"""The replay `scaling_policy` built from a candidate's planner: our planner (the planner composites).

The Dynamo Planner cannot be imported here, so this is our own planner with the same knobs,
driven by the replay's offline callback protocol (the replay calls it between steps): `initial_tick_ms()` and
`on_tick(snapshot) -> {"target_prefill", "target_decode", "next_tick_ms"}` (absolute worker counts
or None = unchanged; in agg `target_decode` is the aggregated worker count).

Load-based scaling (every `load_adjustment_interval_seconds`)
    pressure = max(observed/SLA for window TTFT and ITL (goodput goals only), queued prefill tokens
    per worker / max_num_batched_tokens, (decode + queued decode requests) per worker / max_num_seqs).
    Agg uses all of them; disagg prefill uses TTFT and the prefill queue, decode uses ITL and the
    decode occupancy. pressure > 1 scales up by ceil(n * (pressure - 1)) workers (1 <= step <= n).
    Otherwise the observation is calm when the projected utilisation with one worker fewer,
    100 * pressure * n / (n - 1), is below `load_scaling_down_sensitivity`; after
    `load_min_observations` calm observations in a row one worker is removed.

Throughput-based scaling (every `throughput_adjustment_interval_seconds`)
    The candidate's `load_predictor` (family default: arima, as the Dynamo PlannerConfig) forecasts the
    next interval's request count, ISL and OSL from the replayed traffic. Workers needed =
    ceil(forecast rate / (per-engine capacity * TARGET_UTILISATION)).

Per-engine capacity model (requests/s), from the engine's own forward passes in the replay
    Each FPM snapshot is one observed step: (prefill tokens P, decode requests D, step seconds s).
    Samples are bucketed on a sqrt(fpm_sample_bucket_size)^2 grid over [0, max_num_batched_tokens] x
    [0, max_num_seqs], the latest per cell, at most `max_num_fpm_samples` cells. A least-squares fit
    gives s = a + b*P + c*D; when P never varies, b comes from the lightest observed window,
    (TTFT - a) / ISL. At arrival rate L, Little's law gives D = L*osl*s and P = L*isl*s, hence
    s = a / (1 - L*K) with K = b*isl + c*osl. Capacity is the largest L with D <= max_num_seqs and,
    for goodput goals, s <= SLA ITL (decode) or s <= SLA TTFT (prefill engines, K = b*isl). The model
    is per attention-DP rank (each rank schedules on its own), so an engine holds `attention_dp` times it.
    Until the model has its samples, throughput scaling holds the fleet.

Hybrid: both; the throughput forecast sets a floor that load-based scale-down never crosses.
Every target is bounded by min_endpoint (>= 1 worker per role), min_gpu_budget and gpu_budget
(GPUs per engine = tp * pp * attention_dp per role), and a pool with starting workers is not
re-scaled until they are ready.
"""

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from spica_pipeline.config.goal import OptimizationGoal
from spica_pipeline.space.candidate import Candidate, Role
from spica_pipeline.space.load_predictor.predictors import make_predictor, predictor_fields

TARGET_UTILISATION = 0.85
_EPS_MS = 1e-6


class EngineModel:
    """Step-time model of one role's engine, learnt from its forward-pass metrics."""

    def __init__(self, max_num_seqs: int, max_num_batched_tokens: int, max_samples: int = 64,
                 bucket_size: int = 16) -> None:
        self.max_num_seqs = max(1, int(max_num_seqs))
        self.max_num_batched_tokens = max(1, int(max_num_batched_tokens))
        self.max_samples = max(3, int(max_samples))
        self.side = max(1, math.isqrt(max(1, int(bucket_size))))
        self.samples: OrderedDict[tuple[int, int], tuple[float, float, float]] = OrderedDict()
        self.prefill_cost_hint: float | None = None

    def observe(self, fpm_snapshots: list[dict[str, Any]]) -> None:
        for snap in fpm_snapshots or []:
            s = float(snap.get("wall_time") or 0.0)
            p = float(snap.get("sum_prefill_tokens") or 0.0)
            d = float(snap.get("num_decode_requests") or 0.0)
            if not (s > 0 and math.isfinite(s)) or (p <= 0 and d <= 0):
                continue
            cell = (min(self.side - 1, int(p * self.side // (self.max_num_batched_tokens + 1))),
                    min(self.side - 1, int(d * self.side // (self.max_num_seqs + 1))))
            self.samples.pop(cell, None)
            self.samples[cell] = (p, d, s)
            while len(self.samples) > self.max_samples:
                self.samples.popitem(last=False)

    def observe_ttft(self, avg_ttft_ms: float, avg_isl: float) -> None:
        """Lightest-load estimate of the per-token prefill cost (queueing only inflates TTFT)."""
        fit = self._fit()
        if fit is None or avg_isl <= 0 or avg_ttft_ms <= 0:
            return
        b = max(0.0, (avg_ttft_ms / 1000.0 - fit[0]) / avg_isl)
        self.prefill_cost_hint = b if self.prefill_cost_hint is None else min(self.prefill_cost_hint, b)

    def _fit(self) -> tuple[float, float | None, float] | None:
        """(a, b, c) of s = a + b*P + c*D; b is None when prefill tokens never varied."""
        if not self.samples:
            return None
        arr = np.array(list(self.samples.values()))
        p, d, s = arr[:, 0], arr[:, 1], arr[:, 2]
        if len(np.unique(p)) >= 2 and len(arr) >= 3:
            cols = [np.ones_like(s), p, d] if len(np.unique(d)) >= 2 else [np.ones_like(s), p]
            coef = np.linalg.lstsq(np.column_stack(cols), s, rcond=None)[0]
            a, b = max(float(coef[0]), 1e-6), max(float(coef[1]), 0.0)
            c = max(float(coef[2]), 0.0) if len(coef) == 3 else 0.0
            return a, b, c
        if len(np.unique(d)) >= 2:
            coef = np.polyfit(d, s, 1)
            return max(float(coef[1]), 1e-6), None, max(float(coef[0]), 0.0)
        return max(float(s.min()), 1e-6), None, 0.0

    def capacity_rps(self, isl: float, osl: float, role: str, sla_s: float | None) -> float | None:
        """Sustainable requests/s of one engine (None until the model has data)."""
        fit = self._fit()
        if fit is None:
            return None
        a, b, c = fit
        b = b if b is not None else self.prefill_cost_hint
        isl, osl = max(isl, 1.0), max(osl, 1.0)
        if role == "prefill":
            if b is None:
                return None
            k = b * isl
            cap = self.max_num_batched_tokens / (isl * (a + self.max_num_batched_tokens * b))
        else:
            if role == "agg" and b is None:
                return None
            k = (b or 0.0) * isl * (role == "agg") + c * osl
            cap = self.max_num_seqs / (osl * a + self.max_num_seqs * k)
        if sla_s is not None and sla_s > a and k > 0:
            cap = min(cap, (1.0 - a / sla_s) / k)
        return cap if cap > 0 and math.isfinite(cap) else None


@dataclass
class _Role:
    name: str  # "agg" | "prefill" | "decode"
    gpus: int
    model: EngineModel
    ranks: int = 1  # attention-DP ranks per engine: each runs its own scheduler (and FPM series)
    calm: int = 0
    floor: int = 0


@dataclass
class _SeriesForecaster:
    """Three predictors (request count, ISL, OSL) fed once per throughput interval."""

    fields: dict[str, Any]
    interval_s: float
    predictors: list[Any] = field(default_factory=list)
    last: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def __post_init__(self) -> None:
        self.predictors = [make_predictor(self.fields, self.interval_s) for _ in range(3)]

    def add(self, num_req: float, isl: float, osl: float) -> None:
        self.last = (num_req, isl, osl)
        for p, v in zip(self.predictors, self.last):
            p.add_data_point(v)

    def forecast(self) -> tuple[float, float, float]:
        out = []
        for p, fallback in zip(self.predictors, self.last):
            try:
                v = float(p.predict_next())
            except Exception:  # noqa: BLE001 - a failing forecaster falls back to the last value
                v = fallback
            out.append(max(0.0, v) if math.isfinite(v) else fallback)
        return out[0], out[1], out[2]


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _default(value: Any, default: Any) -> Any:
    return default if value is None else value


class ScalingPolicy:
    """A planner for one candidate; see the module docstring for the model."""

    def __init__(self, candidate: Candidate, goal: "OptimizationGoal | Mapping[str, Any]",
                 workload: dict[str, Any]) -> None:
        planner = candidate.planner
        if planner is None:
            raise ValueError("a static candidate (both scaling flags off) has no planner")
        self.mode = candidate.deployment_mode
        self.throughput_on = bool(planner.enable_throughput_scaling)
        self.load_on = bool(planner.enable_load_scaling)
        self.load_s = float(planner.load_adjustment_interval_seconds or 5.0)
        self.tput_s = float(planner.throughput_adjustment_interval_seconds or 180.0)
        self.sensitivity = float(_default(planner.load_scaling_down_sensitivity, 80))
        self.min_observations = max(1, int(_default(planner.load_min_observations, 5)))
        self.gpu_budget = _int_or_none(candidate.gpu_budget)
        self.min_gpu_budget = _int_or_none(candidate.min_gpu_budget)
        self.min_endpoint = max(1, int(candidate.min_endpoint or 1))
        goal = OptimizationGoal.model_validate(goal)  # the request's goal, typed once
        self.target = goal.planner_target
        sla = goal.sla if self.target == "sla" else None
        self.sla_ttft_ms = sla.ttft_ms if sla is not None else None
        self.sla_itl_ms = sla.itl_ms if sla is not None else None
        self.default_isl = float(workload.get("isl") or 0.0)
        self.default_osl = float(workload.get("osl") or 0.0)
        fpm = (int(_default(planner.max_num_fpm_samples, 64)),
               int(_default(planner.fpm_sample_bucket_size, 16)))

        def role(r: Role) -> _Role:
            model = EngineModel(r.engine.max_num_seqs, r.engine.max_num_batched_tokens, *fpm)
            return _Role(r.name, max(1, r.gpus_per_engine), model, max(1, r.shape.attention_dp))

        self.roles = {r.name: role(r) for r in candidate.roles}
        self.forecaster: _SeriesForecaster | None = None
        if self.throughput_on:
            family = planner.predictor.to_dict() if planner.predictor is not None else {"load_predictor": "arima"}
            fields = predictor_fields(family)
            self.forecaster = _SeriesForecaster(fields, self.tput_s)
        intervals = ([self.load_s] if self.load_on else []) + ([self.tput_s] if self.throughput_on else [])
        self._first_tick_ms = min(intervals) * 1000.0 if intervals else None
        self.next_load_ms = self.load_s * 1000.0
        self.next_tput_ms = self.tput_s * 1000.0
        self._acc = [0.0, 0.0, 0.0, 0.0, 0.0]  # num_req, isl_sum, isl_n, osl_sum, osl_n
        self.history: list[dict[str, Any]] = []

    # -- protocol -------------------------------------------------------------------------------

    def initial_tick_ms(self) -> float:
        return float(self._first_tick_ms or self.load_s * 1000.0)

    def on_tick(self, snapshot: dict[str, Any]) -> dict[str, Any]:
        now = float(snapshot.get("now_ms") or 0.0)
        traffic = snapshot.get("traffic") or {}
        self._learn(snapshot, traffic)
        counts = self._counts(snapshot)
        targets = dict(counts)
        reasons: list[str] = []
        starting = self._starting(snapshot)
        if self.throughput_on and now + _EPS_MS >= self.next_tput_ms:
            self._throughput_step(counts, targets, reasons)
            while self.next_tput_ms <= now + _EPS_MS:
                self.next_tput_ms += self.tput_s * 1000.0
        if self.load_on and now + _EPS_MS >= self.next_load_ms:
            self._load_step(snapshot, traffic, counts, targets, reasons)
            while self.next_load_ms <= now + _EPS_MS:
                self.next_load_ms += self.load_s * 1000.0
        for name in self.roles:
            if starting[name] > 0:  # workers still starting: let them come up before re-scaling
                targets[name] = counts[name]
        bounded = self._bound(targets, counts)
        out = {"target_prefill": None, "target_decode": None, "next_tick_ms": self._next_tick_ms()}
        for name, n in bounded.items():
            if n != counts[name]:
                out["target_decode" if name in ("agg", "decode") else "target_prefill"] = int(n)
                self.roles[name].calm = 0
        self.history.append({"now_ms": now, "counts": counts, "targets": bounded,
                             "gpus": sum(bounded[k] * self.roles[k].gpus for k in bounded), "reasons": reasons})
        return out

    # -- internals ------------------------------------------------------------------------------

    def _next_tick_ms(self) -> float:
        nexts = ([self.next_load_ms] if self.load_on else []) + ([self.next_tput_ms] if self.throughput_on else [])
        return float(min(nexts))

    def _counts(self, snap: dict[str, Any]) -> dict[str, int]:
        if self.mode == "disagg":
            return {"prefill": int(snap.get("non_draining_prefill_count", snap.get("active_prefill_count", 0))),
                    "decode": int(snap.get("non_draining_decode_count", snap.get("active_decode_count", 0)))}
        return {"agg": int(snap.get("non_draining_decode_count", snap.get("active_decode_count", 0)))}

    def _starting(self, snap: dict[str, Any]) -> dict[str, int]:
        if self.mode == "disagg":
            return {"prefill": int(snap.get("starting_prefill_count", 0)),
                    "decode": int(snap.get("starting_decode_count", 0))}
        return {"agg": int(snap.get("starting_decode_count", 0))}

    def _fpm(self, snap: dict[str, Any], name: str) -> list[dict[str, Any]]:
        return snap.get("prefill_fpm_snapshots" if name == "prefill" else "decode_fpm_snapshots") or []

    def _learn(self, snap: dict[str, Any], traffic: dict[str, Any]) -> None:
        for name, r in self.roles.items():
            r.model.observe(self._fpm(snap, name))
        isl = float(traffic.get("avg_isl") or 0.0)
        osl = float(traffic.get("avg_osl") or 0.0)
        shapes = float(traffic.get("shape_count") or 0.0)
        self._acc[0] += float(traffic.get("num_req") or 0.0)
        if shapes > 0 and isl > 0:
            self._acc[1] += isl * shapes
            self._acc[2] += shapes
        if shapes > 0 and osl > 0:
            self._acc[3] += osl * shapes
            self._acc[4] += shapes
        if (traffic.get("ttft_count") or 0) > 0 and isl > 0:
            name = "prefill" if self.mode == "disagg" else "agg"
            self.roles[name].model.observe_ttft(float(traffic.get("avg_ttft_ms") or 0.0), isl)

    def _throughput_step(self, counts: dict[str, int], targets: dict[str, int], reasons: list[str]) -> None:
        assert self.forecaster is not None
        num_req, isl_sum, isl_n, osl_sum, osl_n = self._acc
        self._acc = [0.0, 0.0, 0.0, 0.0, 0.0]
        isl = isl_sum / isl_n if isl_n else (self.forecaster.last[1] or self.default_isl)
        osl = osl_sum / osl_n if osl_n else (self.forecaster.last[2] or self.default_osl)
        self.forecaster.add(num_req, isl, osl)
        n_hat, i_hat, o_hat = self.forecaster.forecast()
        i_hat = i_hat or isl or self.default_isl
        o_hat = o_hat or osl or self.default_osl
        rate = n_hat / self.tput_s
        for name, r in self.roles.items():
            sla_ms = self.sla_ttft_ms if name == "prefill" else self.sla_itl_ms
            cap = r.model.capacity_rps(i_hat, o_hat, name, None if sla_ms is None else sla_ms / 1000.0)
            if cap is None:
                reasons.append(f"{name}: throughput hold (no engine model yet)")
                continue
            cap *= r.ranks
            need = max(1, math.ceil(rate / (cap * TARGET_UTILISATION)))
            r.floor = need if self.load_on else 0
            if self.load_on:
                targets[name] = max(targets[name], need)
            else:
                targets[name] = need
            reasons.append(f"{name}: forecast {rate:.2f} req/s, capacity {cap:.2f} req/s/engine -> {need}")

    def _pressure(self, snap: dict[str, Any], traffic: dict[str, Any], name: str) -> float:
        r = self.roles[name]
        fpm = self._fpm(snap, name)
        workers = max(1, len({(f.get("worker_id"), f.get("dp_rank")) for f in fpm}))
        queued_tokens = sum(float(f.get("sum_queued_prefill_tokens") or 0.0) for f in fpm) / workers
        decode_reqs = sum(float(f.get("num_decode_requests") or 0.0) + float(f.get("num_queued_decode") or 0.0)
                          for f in fpm) / workers
        signals = []
        if name in ("agg", "prefill"):
            signals.append(queued_tokens / r.model.max_num_batched_tokens)
            if self.sla_ttft_ms and (traffic.get("ttft_count") or 0) > 0:
                signals.append(float(traffic.get("avg_ttft_ms") or 0.0) / float(self.sla_ttft_ms))
        if name in ("agg", "decode"):
            signals.append(decode_reqs / r.model.max_num_seqs)
            if self.sla_itl_ms and (traffic.get("itl_count") or 0) > 0:
                signals.append(float(traffic.get("avg_itl_ms") or 0.0) / float(self.sla_itl_ms))
        return max(signals) if signals else 0.0

    def _load_step(self, snap: dict[str, Any], traffic: dict[str, Any], counts: dict[str, int],
                   targets: dict[str, int], reasons: list[str]) -> None:
        for name, r in self.roles.items():
            n = counts[name]
            pressure = self._pressure(snap, traffic, name)
            if pressure > 1.0:
                step = min(max(1, math.ceil(n * (pressure - 1.0))), max(1, n))
                targets[name] = max(targets[name], n + step)
                r.calm = 0
                reasons.append(f"{name}: pressure {pressure:.2f} -> +{step}")
                continue
            projected = 100.0 * pressure * n / (n - 1) if n > 1 else math.inf
            r.calm = r.calm + 1 if projected < self.sensitivity else 0
            if r.calm >= self.min_observations and targets[name] == n and n - 1 >= max(1, r.floor):
                targets[name] = n - 1
                r.calm = 0
                reasons.append(f"{name}: calm (projected {projected:.0f}%) -> -1")

    def _bound(self, targets: dict[str, int], counts: dict[str, int]) -> dict[str, int]:
        """min_endpoint / min_gpu_budget / gpu_budget, never 0 workers; the budget wins a conflict."""
        out = {k: max(self.min_endpoint, int(v)) for k, v in targets.items()}

        def gpus() -> int:
            return sum(out[k] * self.roles[k].gpus for k in out)

        if self.gpu_budget is not None:
            while gpus() > self.gpu_budget:
                shrinkable = [k for k in out if out[k] > 1]
                if not shrinkable:
                    break
                # shrink the role that grew most past its current count, else the larger one
                k = max(shrinkable, key=lambda k: (out[k] - counts.get(k, 0), out[k] * self.roles[k].gpus))
                out[k] -= 1
        if self.min_gpu_budget is not None:
            order = ["decode", "prefill"] if self.mode == "disagg" else ["agg"]
            grown = True
            while gpus() < self.min_gpu_budget and grown:
                grown = False
                for k in order:
                    if gpus() < self.min_gpu_budget and (
                            self.gpu_budget is None or gpus() + self.roles[k].gpus <= self.gpu_budget):
                        out[k] += 1
                        grown = True
        return out


def build_scaling_policy(candidate: Candidate, goal: "OptimizationGoal | Mapping[str, Any]",
                         workload: dict[str, Any]) -> ScalingPolicy | None:
    """The planner of a candidate, or None for a static candidate (both scaling flags off)."""
    if candidate.planner is None:
        return None
    return ScalingPolicy(candidate, goal, workload)
