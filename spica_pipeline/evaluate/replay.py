"""`ReplayEvaluator`: one candidate -> one (or a few) Dynamo Replay runs -> an `EvalOutcome`.

A thin adapter: the replay arguments are built by the pure
`evaluate.engine_args.build_replay_call`; this resource supplies the facts that need AIC or the disk
(`ReplayFacts`), runs the replay, averages repeats and maps errors to outcomes:

* `InfeasibleKVCapacity` -> infeasible; any other `SpicaError` (an expected candidate failure,
  e.g. `CandidateBuildError`, `TraceError`) -> failed with its one-line reason;
* an error raised by the replay itself -> failed, `replay failed: ...`;
* anything else is a bug: logged with its traceback and recorded as `internal error`, so it never
  looks like an infeasible candidate.

`evaluate` never raises for a bad candidate.
"""

import logging
import math
import os
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from spica_pipeline.errors import (
    CandidateBuildError,
    InfeasibleKVCapacity,
    PerfModelError,
    SpicaError,
    describe,
)
from spica_pipeline.evaluate import scoring, timing
from spica_pipeline.evaluate.engine_args import (
    ReplayCall,
    ReplaySettings,
    TimingRef,
    build_replay_call,
    check_context,
)
from spica_pipeline.evaluate.evaluator import EvalOutcome, EvalRequest, Evaluator
from spica_pipeline.fidelity import measurement
from spica_pipeline.fidelity.apply import calibrate
from spica_pipeline.fidelity.profile import for_client, load_profile, needs_client, uses_fixed_lengths
from spica_pipeline.jsonvalue import spec_hash
from spica_pipeline.space import kv
from spica_pipeline.space.engine import EngineIdentity, KvCapacity
from spica_pipeline.space.model_hw import latest_backend_version
from spica_pipeline.space.parallel import topology
from spica_pipeline.storage import atomic_write_text, default_cache_dir
from spica_pipeline.traces import read_mooncake_trace

os.environ.setdefault("DYN_LOG", "warn")  # the KV router logs one INFO line per routing decision

log = logging.getLogger(__name__)

DEFAULT_ROUTER_REPEATS = 3
# What the replay raises for a run it rejects or cannot finish; any other type is a bug of ours.
REPLAY_ERRORS = (RuntimeError, ValueError, OSError, SpicaError)

__all__ = ["CandidateBuildError", "ReplayEvaluator", "ReplayFacts", "check_context", "summarise_repeats"]


class _TickCounter:
    """Wraps a scaling policy to count planner ticks (the replay result does not report them)."""

    def __init__(self, policy: Any):
        self._policy = policy
        self.ticks = 0

    def initial_tick_ms(self) -> float:
        return self._policy.initial_tick_ms()

    def on_tick(self, snapshot: dict) -> dict:
        self.ticks += 1
        return self._policy.on_tick(snapshot)


def _describe(exc: SpicaError) -> str:
    """The ledger text of an expected failure: a wrapped library error keeps its own type name."""
    return getattr(exc, "detail", None) or describe(exc)


def _numeric(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


# Summary keys measured on the host's wall clock, not the simulated one: they differ between two
# replays of the same spec, so they stay out of the report (replay cost is `replay_seconds`) and a
# rerun with the same seed gives an identical ledger.
WALL_CLOCK_KEYS = frozenset({"wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s"})


# Significant digits kept of the replay's own summary floats. Why: the mocker sums per-request values in a hash map's
# iteration order, which changes between two replays of the same spec, so its means and standard deviations differ in
# the last bits (1 replay in ~40 under load, tests/test_contracts.py) and the same seed would not give the same ledger;
# 12 digits drop that noise and keep every physically meaningful digit. Our own window statistics use exact sums.
SUMMARY_DIGITS = 12


def order_free(summary: dict[str, Any]) -> dict[str, Any]:
    """The replay's summary with its finite floats rounded to SUMMARY_DIGITS significant digits."""
    return {k: float(f"{v:.{SUMMARY_DIGITS}g}") if isinstance(v, float) and math.isfinite(v) else v
            for k, v in summary.items()}


def summarise_repeats(summaries: list[dict[str, Any]]) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Mean of every simulated numeric summary key over repeats, and std/min/max when there are several."""
    keys = [k for k in summaries[0] if k not in WALL_CLOCK_KEYS and _numeric(summaries[0][k]) is not None]
    report: dict[str, float] = {}
    spread: dict[str, dict[str, float]] = {}
    for key in keys:
        values = [v for s in summaries if (v := _numeric(s.get(key))) is not None]
        if not values:
            continue
        report[key] = statistics.fmean(values)
        if len(summaries) > 1:
            spread[key] = {"std": statistics.pstdev(values), "min": min(values), "max": max(values)}
    return report, spread


class ReplayEvaluator(BaseModel, Evaluator):
    """Evaluates candidates in Dynamo Replay (ai-dynamo-runtime) with AIC timing and capacity.

    cache_dir: where timing tables and KV estimates are cached (default `$SPICA_CACHE_DIR` or
        `~/.cache/spica-pipeline`).
    trace_block_size: tokens per Mooncake `hash_id` (512 by convention).
    benchmark_granularity: kept for parity with Spica's replay API; the raw 1.6.1 replay has no such
        knob, so it is only recorded in `outcome.derived`.
    kv_transfer_bandwidth_gbps: per-GPU prefill->decode link (GB/s) for disagg KV hand-off; each
        prefill rank ships its own 1/TP share of a prompt's KV in parallel.
    router_repeats: kv_router runs per candidate unless `request.context["router_repeats"]` says
        otherwise (round-robin is deterministic and runs once).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    cache_dir: str | None = Field(default=None, description="timing/KV cache directory")
    trace_block_size: int = Field(default=512, gt=0, description="tokens per Mooncake hash_id")
    benchmark_granularity: int = Field(default=8, gt=0, description="recorded only (no replay knob in 1.6.1)")
    kv_transfer_bandwidth_gbps: float = Field(default=25.0, gt=0, description="per-GPU disagg KV link, GB/s")
    router_repeats: int = Field(default=DEFAULT_ROUTER_REPEATS, ge=1, description="kv_router replays per candidate")

    # ---- public ----------------------------------------------------------------------------

    def warm_up(self) -> None:
        """Import the replay runtime once per process (a pool worker calls this before serving)."""
        os.environ.setdefault("DYN_LOG", "warn")
        import dynamo._core  # noqa: F401

    def evaluate(self, request: EvalRequest) -> EvalOutcome:
        derived: dict[str, Any] = {}
        try:
            call = self.prepare(request, derived)
        except InfeasibleKVCapacity as exc:
            return EvalOutcome("infeasible", reason=str(exc), derived=derived)
        except SpicaError as exc:  # an expected candidate failure never aborts a sweep
            return EvalOutcome("failed", reason=f"candidate build failed: {_describe(exc)}", derived=derived)
        except Exception as exc:
            return _internal_error(exc, request, "building the replay arguments", derived)

        summaries: list[dict[str, Any]] = []
        ticks: list[int] = []
        started = time.perf_counter()
        client = self._benchmark_client(request, call)
        try:
            for _ in range(call.repeats):
                summary, n_ticks = self._run(call, request, client)
                summaries.append(summary)
                if n_ticks is not None:
                    ticks.append(n_ticks)
        except REPLAY_ERRORS as exc:
            return EvalOutcome("failed", reason=f"replay failed: {describe(exc)}", derived=derived,
                               replay_seconds=time.perf_counter() - started, repeats=len(summaries))
        except Exception as exc:
            outcome = _internal_error(exc, request, "running the replay", derived)
            outcome.replay_seconds, outcome.repeats = time.perf_counter() - started, len(summaries)
            return outcome
        replay_seconds = time.perf_counter() - started
        report, spread = summarise_repeats(summaries)
        # each role's GPUs at its type's price (space/candidate.Candidate.gpu_usd_per_hour)
        price = request.candidate.gpu_usd_per_hour(request.goal.gpu_usd_per_hour) if request.goal.scores_cost() \
            else None
        if price is not None:  # what cost_per_mtok prices the GPU-hours at (evaluate/scoring.py)
            report[scoring.GPU_PRICE_KEY] = price
        if ticks:
            report["planner_total_ticks"] = statistics.fmean(ticks)
        outcome = EvalOutcome("feasible", report=report, spread=spread, derived=derived,
                              replay_seconds=replay_seconds, repeats=len(summaries))

        try:
            scoring.require_goodput(request.goal.objectives(), report)
        except RuntimeError as exc:
            outcome.status, outcome.reason = "failed", str(exc)
            return outcome
        used, budget = request.candidate.used_gpus, request.candidate.gpu_budget
        if budget is not None and not scoring.is_feasible(used, int(budget)):
            outcome.status = "infeasible"
            outcome.reason = f"over gpu_budget: used_gpus={used} > gpu_budget={int(budget)}"
        return outcome

    def prepare(self, request: EvalRequest, derived: dict[str, Any] | None = None) -> ReplayCall:
        """The replay arguments of one candidate (no replay yet), ready for `dynamo._core`.

        Raises InfeasibleKVCapacity for capacity problems and a SpicaError for a candidate that
        cannot be built; fills `derived` as it goes.
        """
        call = build_replay_call(request, self.settings, ReplayFacts(self.cache_dir), derived)
        if call.kwargs.get("router_config") is not None:
            from dynamo._core import KvRouterConfig

            call.kwargs["router_config"] = KvRouterConfig(**call.kwargs["router_config"])
        return call

    @property
    def settings(self) -> ReplaySettings:
        return ReplaySettings(trace_block_size=self.trace_block_size, benchmark_granularity=self.benchmark_granularity,
                              kv_transfer_bandwidth_gbps=self.kv_transfer_bandwidth_gbps,
                              router_repeats=self.router_repeats)

    # ---- internals ---------------------------------------------------------------------------

    def _benchmark_client(self, request: EvalRequest, call: ReplayCall) -> dict[str, float] | None:
        """The candidate's mean TTFT/TPOT replayed as the benchmark client that measured the silicon
        rows (every client at t=0, CLIENT_REQUEST_RATIO x c requests, every request counted), when
        its calibration profile corrects that replay (fidelity/profile.needs_client) and the sweep's
        own replay is a ramped closed loop; None otherwise or when that replay fails (the profile's
        sweep fallback then applies). Recorded in `call.derived["benchmark_client"]`."""
        setting = (request.context or {}).get("calibration")
        if not setting or not call.derived.get("ramp"):
            return None

        profile, _ = load_profile(setting["setting"])
        backend = request.candidate.backend
        if profile is None or not needs_client(profile):
            return None
        # a fixed-length client is replayed with fixed lengths where the profile has factors for that replay
        fixed = uses_fixed_lengths(profile, (request.context or {}).get("client_lengths"), backend)
        client_request = measurement.benchmark_client_request(request, fixed_lengths=fixed)
        derived: dict[str, Any] = {}
        try:
            client_call = self.prepare(client_request, derived)
            summary, _ = self._run(client_call, client_request)
        except (InfeasibleKVCapacity, *REPLAY_ERRORS) as exc:
            call.derived["benchmark_client"] = {"failed": describe(exc)}
            return None
        out = {"ttft": _numeric(summary.get("mean_ttft_ms")), "tpot": _numeric(summary.get("mean_tpot_ms"))}
        call.derived["benchmark_client"] = {
            "mean_ttft_ms": out["ttft"], "mean_tpot_ms": out["tpot"], "window_rule": derived.get("window_rule"),
            "request_count": derived.get("request_count"), "isl_jitter": client_request.workload.get("isl_jitter"),
            "osl_jitter": client_request.workload.get("osl_jitter")}
        return {k: v for k, v in out.items() if v is not None}

    def _run(self, call: ReplayCall, request: EvalRequest,
             client: dict[str, float] | None = None) -> tuple[dict[str, Any], int | None]:
        import dynamo._core as core

        kwargs = dict(call.kwargs)
        counter = None
        if call.policy_factory is not None:  # a fresh policy per repeat: policies keep state
            policy = call.policy_factory(request.candidate, request.goal, request.workload)
            if policy is not None:
                counter = _TickCounter(policy)
                kwargs["scaling_policy"] = counter
        if call.function == "trace":
            result = core.run_mocker_trace_replay(*call.args, **kwargs)
        else:
            result = core.run_mocker_synthetic_trace_replay(*call.args, **kwargs)
        summary = order_free(dict(result.summary if hasattr(result, "summary") else result))
        per_request = getattr(result, "per_request", None)
        if per_request:  # measured like a benchmark client: the steady-state window (fidelity/measurement.py)
            summary = measurement.windowed_summary(summary, per_request, call.derived.get("window_rule"),
                                                   request.goal.sla_thresholds())
        # per repeat, because calibrated goodput re-tests each request's latencies against the SLA
        _calibrate(summary, request, call.derived, per_request or None, client)
        return summary, (counter.ticks if counter is not None else None)


def _calibrate(report: dict[str, Any], request: EvalRequest, derived: dict[str, Any],
               per_request: list[dict[str, Any]] | None = None, client: dict[str, float] | None = None) -> None:
    """Add calibrated metrics and P10-P90 bands beside the raw ones (request.context["calibration"]);
    with a profile, picks rank on the calibrated goal metrics (evaluate/scoring.ranked_value).

    The profile was validated when the sweep built its context, so a failure here is a bug, not a
    bad candidate: it propagates (and is recorded as an internal error by the caller's contract).
    """
    setting = (request.context or {}).get("calibration")
    if not setting:
        return

    loaded, _ = load_profile(setting["setting"])
    if loaded is None:  # the sweep records only a setting that names a profile
        return
    candidate = request.candidate
    profile = for_client(loaded, (request.context or {}).get("client_lengths"), candidate.backend)
    concurrency = derived.get("concurrency") or candidate.concurrency
    closed_loop = concurrency is not None
    if concurrency is None and report.get("request_throughput_rps") and report.get("mean_e2e_latency_ms"):
        # open loop / trace: Little's law gives the mean number of requests in flight
        concurrency = report["request_throughput_rps"] * report["mean_e2e_latency_ms"] / 1000.0
    engines, systems = {}, {}
    for phase, role in (("ttft", "prefill"), ("tpot", "decode")):
        role = "agg" if candidate.deployment_mode == "agg" else role
        engines[phase] = float(concurrency or 1) / max(1, candidate.role(role).replicas)
        systems[phase] = candidate.role_system(role)  # prefill and decode may run on two GPU types
    widen = 1.5 if derived.get("fidelity_note") else 1.0  # a perf-data fallback was used: less certain
    report.update(calibrate(report, profile, system=systems, backend=candidate.backend,
                            concurrency=engines, extra_widen=widen, closed_loop=closed_loop, per_request=per_request,
                            sla=request.goal.sla_thresholds(), client=client))


def _internal_error(exc: Exception, request: EvalRequest, stage: str, derived: dict[str, Any]) -> EvalOutcome:
    """A bug, not a bad candidate: log the traceback and record it as such (never 'infeasible')."""
    log.exception("internal error while %s for candidate %s", stage, request.spec_hash)
    return EvalOutcome("failed", reason=f"internal error: {describe(exc)} (traceback in the log)",
                       derived=derived)


@contextmanager
def _perf_model_errors() -> Iterator[None]:
    """aiconfigurator-core's refusals (no perf data, unsupported shape) are candidate failures."""
    try:
        yield
    except SpicaError:
        raise
    except (ValueError, RuntimeError) as exc:
        raise PerfModelError.wrap(exc) from exc


class ReplayFacts:
    """`search.engine_args.EngineFacts` backed by aiconfigurator-core and the on-disk timing cache."""

    def __init__(self, cache_dir: str | None):
        self.cache_dir = cache_dir

    def backend_version(self, hardware_sku: str, backend: str) -> str:
        return latest_backend_version(hardware_sku, backend)

    def kv_tokens(self, model_name: str, hardware_sku: str, backend: str, backend_version: str,
                  shape: tuple[int, int, int, int, int], **knobs: Any) -> int:

        with _perf_model_errors():
            return kv.estimate_kv_tokens(model_name, hardware_sku, backend, backend_version, shape, **knobs)

    def kv_capacity(self, identity: EngineIdentity, *, max_num_tokens: int, max_batch_size: int,
                    memory_fraction: float) -> KvCapacity:

        with _perf_model_errors():
            return timing.kv_capacity(identity, max_num_tokens=max_num_tokens, max_batch_size=max_batch_size,
                                      memory_fraction=memory_fraction, cache_dir=self.cache_dir)

    def timing_table(self, identity: EngineIdentity, *, max_num_batched_tokens: int) -> TimingRef:
        with _perf_model_errors():
            return timing.timing_table(identity, max_num_batched_tokens=max_num_batched_tokens,
                                       cache_dir=self.cache_dir)

    def context_length(self, model_name: str) -> int | None:
        return timing.model_context_length(model_name)

    def inter_node_gbps(self, hardware_sku: str) -> float | None:
        return topology(hardware_sku).inter_node_gbps

    def check_trace(self, path: str, context: int | None, block_size: int) -> None:
        _check_trace(path, context, block_size)

    def step_estimators(self, timing_model: dict[str, Any]):
        return timing.table_estimators(timing_model["config"]["path"])

    def write_trace(self, text: str) -> str:
        from pathlib import Path


        root = Path(self.cache_dir) if self.cache_dir else default_cache_dir()
        path = root / "traces" / f"generated-{spec_hash(text)}.jsonl"
        if not path.exists():
            atomic_write_text(path, text)
        return str(path)


_trace_checked: dict[tuple, None] = {}


def _check_trace(path: str, context: int | None, block_size: int) -> None:
    """Validate the trace once per (file version, context, block size) in this process."""

    try:
        st = os.stat(path)
        key = (os.path.abspath(path), st.st_mtime_ns, st.st_size, context, block_size)
    except OSError:
        key = None
    if key is not None and key in _trace_checked:
        return
    read_mooncake_trace(path, max_input_length=int(context) if context else None, block_size=block_size)
    if key is not None:
        _trace_checked[key] = None
