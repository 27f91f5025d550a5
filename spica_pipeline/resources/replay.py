"""`ReplayEvaluator`: one candidate -> one (or a few) Dynamo Replay runs -> an `EvalOutcome`.

Spec §7.1/§7.4 with the fidelity fixes of replay-notes §2-3: every role gets an AIC-derived timing
table and an explicit `num_gpu_blocks` (the replay's defaults are model-agnostic), disagg KV transfer
is charged on the prefill args, and kv_router replays are repeated because routing ties are broken
randomly. Usable as a Dagster resource or as a plain object; `evaluate` never raises for a bad
candidate: infeasible / failed outcomes carry a one-line reason.
"""

import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import dagster as dg
from pydantic import Field

from spica_pipeline.config.goal import OptimizationGoal
from spica_pipeline.errors import InfeasibleKVCapacity
from spica_pipeline.search import scoring
from spica_pipeline.search.deploy import (
    DeploymentPlan,
    active_roles,
    build_deployment_plan,
    role_replicas,
    role_shape,
)
from spica_pipeline.search.evaluation import EvalOutcome, EvalRequest, Evaluator

os.environ.setdefault("DYN_LOG", "warn")  # the KV router logs one INFO line per routing decision

DEFAULT_ROUTER_REPEATS = 3


class CandidateBuildError(Exception):
    """A candidate that cannot be turned into replay arguments (not a capacity problem)."""


@dataclass
class ReplayCall:
    """Everything one replay run needs; built once per candidate, run once per repeat."""

    function: str  # "trace" | "synthetic"
    args: tuple
    kwargs: dict[str, Any]
    repeats: int
    derived: dict[str, Any] = field(default_factory=dict)
    policy_factory: Callable[..., Any] | None = None  # build_scaling_policy(sample, goal, workload)


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


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _workload_model(workload: dict[str, Any]):
    from spica_pipeline.config.workload import Workload

    return Workload.model_validate(workload)


def _numeric(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


# Summary keys measured on the host's wall clock, not the simulated one: they differ between two
# replays of the same spec, so they stay out of the report (replay cost is `replay_seconds`) and a
# rerun with the same seed gives an identical ledger.
WALL_CLOCK_KEYS = frozenset({"wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s"})


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


class ReplayEvaluator(dg.ConfigurableResource, Evaluator):
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

    cache_dir: str | None = Field(default=None, description="timing/KV cache directory")
    trace_block_size: int = Field(default=512, gt=0, description="tokens per Mooncake hash_id")
    benchmark_granularity: int = Field(default=8, gt=0, description="recorded only (no replay knob in 1.6.1)")
    kv_transfer_bandwidth_gbps: float = Field(default=25.0, gt=0, description="per-GPU disagg KV link, GB/s")
    router_repeats: int = Field(default=DEFAULT_ROUTER_REPEATS, ge=1, description="kv_router replays per candidate")

    def __reduce__(self):
        """Pickle by config only: a Dagster resource's internals do not survive a spawn round trip."""
        fields = {name: getattr(self, name) for name in
                  ("cache_dir", "trace_block_size", "benchmark_granularity", "kv_transfer_bandwidth_gbps",
                   "router_repeats")}
        return (_rebuild_evaluator, (type(self), fields))

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
        except Exception as exc:  # a bad candidate never aborts a sweep
            return EvalOutcome("failed", reason=f"candidate build failed: {_one_line(exc)}", derived=derived)

        summaries: list[dict[str, Any]] = []
        ticks: list[int] = []
        started = time.perf_counter()
        try:
            for _ in range(call.repeats):
                summary, n_ticks = self._run(call, request)
                summaries.append(summary)
                if n_ticks is not None:
                    ticks.append(n_ticks)
        except Exception as exc:
            return EvalOutcome("failed", reason=f"replay failed: {_one_line(exc)}", derived=derived,
                               replay_seconds=time.perf_counter() - started, repeats=len(summaries))
        replay_seconds = time.perf_counter() - started
        report, spread = summarise_repeats(summaries)
        if ticks:
            report["planner_total_ticks"] = statistics.fmean(ticks)
        outcome = EvalOutcome("feasible", report=report, spread=spread, derived=derived,
                              replay_seconds=replay_seconds, repeats=len(summaries))

        try:
            scoring.require_goodput(OptimizationGoal.model_validate(request.goal or {}).objectives(), report)
        except RuntimeError as exc:
            outcome.status, outcome.reason = "failed", str(exc)
            return outcome

        sample = request.sample
        used = sample.get("used_gpus") or role_gpus(sample)
        budget = sample.get("gpu_budget")
        if budget is not None and int(used) > int(budget):
            outcome.status = "infeasible"
            outcome.reason = f"over gpu_budget: used_gpus={int(used)} > gpu_budget={int(budget)}"
        return outcome

    def prepare(self, request: EvalRequest, derived: dict[str, Any] | None = None) -> ReplayCall:
        """Resolve load, plan, capacity and timing into replay arguments (no replay yet).

        Raises InfeasibleKVCapacity for capacity problems and anything else for a broken candidate;
        fills `derived` as it goes so a failing candidate still records what was computed.
        """
        from spica_pipeline.resources import timing
        from spica_pipeline.search.kv import estimate_kv_tokens
        from spica_pipeline.search.kv_load import resolve_kv_load

        derived = {} if derived is None else derived
        sample = dict(request.sample)
        goal = OptimizationGoal.model_validate(request.goal or {})
        workload = _workload_model(request.workload)
        if not sample.get("backend_version"):
            from spica_pipeline.search.model_hw import latest_backend_version

            sample["backend_version"] = latest_backend_version(sample["hardware_sku"], sample["backend"])
            derived["backend_version"] = sample["backend_version"]

        # 1. load (spec §3.4): a KV-load ratio becomes a per-candidate concurrency
        override: int | None = None
        if workload.is_kv_load:
            ratio = sample.get("kv_load_ratio", workload.kv_load_scalar())
            if ratio is None:
                raise CandidateBuildError("a ranged kv_load_ratio needs the sample's own kv_load_ratio")
            load = resolve_kv_load(sample, workload.isl, workload.osl, float(ratio), estimate=estimate_kv_tokens)
            derived.update(load)
            override = load["concurrency"]
        elif workload.concurrency is not None:
            derived["concurrency"] = workload.concurrency

        # 2. plan (spec §7.2-7.3)
        sla = goal.sla.model_dump(mode="json") if goal.sla is not None else None
        plan = build_deployment_plan(sample, planner_target=goal.planner_target, sla=sla)

        # 3. model context and trace checks, before any replay
        context = sample.get("context_length") or timing.model_context_length(sample["model_name"])
        if workload.is_trace:
            _check_trace(workload.trace_path, context, self.trace_block_size)
        elif context is not None and workload.isl is not None:
            check_context(int(workload.isl), int(workload.osl or 0), int(context))

        # 4. per-role engine configs with AIC timing and explicit capacity
        engines = {}
        for role, args in plan.engine_args().items():
            engines[role] = self._engine_config(sample, role, args, context, derived)

        # 5. replay kwargs
        kwargs: dict[str, Any] = {
            "router_mode": plan.router_mode,
            "router_config": _router_config(plan),
            "capture_per_request": False,
        }
        if plan.deployment_mode == "agg":
            kwargs.update(extra_engine_args=engines["agg"], num_workers=plan.num_workers)
        else:
            kwargs.update(prefill_engine_args=engines["prefill"], decode_engine_args=engines["decode"],
                          num_prefill_workers=plan.num_prefill_workers, num_decode_workers=plan.num_decode_workers)
        kwargs.update(_sla_kwargs(sla))
        cap = workload.in_flight_cap(override)
        if workload.is_trace:
            function = "trace"
            args: tuple = ([str(workload.trace_path)],)
            kwargs.update(arrival_speedup_ratio=float(workload.arrival_speedup_ratio),
                          trace_block_size=int(self.trace_block_size), replay_concurrency=cap)
        else:
            function = "synthetic"
            args = (int(workload.isl), int(workload.osl), int(workload.synthetic_request_count(override)))
            interval = workload.arrival_interval_ms()
            kwargs.update(arrival_speedup_ratio=1.0, replay_concurrency=cap if interval is None else None,
                          arrival_interval_ms=interval, turns_per_session=int(workload.turns_per_session),
                          shared_prefix_ratio=float(workload.shared_prefix_ratio),
                          num_prefix_groups=int(workload.num_prefix_groups),
                          inter_turn_delay_ms=float(workload.inter_turn_delay_ms))
            derived["request_count"] = args[2]
        controllers = [k for k in ("replay_concurrency", "arrival_interval_ms") if kwargs.get(k) is not None]
        if function == "synthetic" and len(controllers) != 1:
            raise CandidateBuildError(f"a synthetic replay needs exactly one load controller, got {controllers}")

        repeats = 1
        if plan.router_mode == "kv_router":
            repeats = max(1, int(request.context.get("router_repeats", self.router_repeats)))
        derived["benchmark_granularity"] = self.benchmark_granularity
        policy_factory = None
        if not plan.is_static:  # imported here so a missing planner fails the build, not the replay
            from spica_pipeline.search.planner import build_scaling_policy as policy_factory
        return ReplayCall(function, args, kwargs, repeats, derived, policy_factory=policy_factory)

    # ---- internals ---------------------------------------------------------------------------

    def _engine_config(self, sample: dict[str, Any], role: str, args: dict[str, Any], context: int | None,
                       derived: dict[str, Any]) -> dict[str, Any]:
        from spica_pipeline.resources import timing

        tp, pp, dp, moe_tp, moe_ep = role_shape(sample, role)
        identity = timing.EngineIdentity(
            model=args["aic_model_path"], system=args["aic_system"], backend=args["aic_backend"],
            version=args["aic_backend_version"], tp=tp, pp=pp, attention_dp=dp, moe_tp=moe_tp, moe_ep=moe_ep,
            nextn=int(args.get("aic_nextn") or 0),
        )
        block_size = int(args["block_size"])
        if block_size <= 0:
            raise ValueError(f"{role}_block_size must be greater than zero, got {block_size}")
        mnbt = int(args["max_num_batched_tokens"])
        capacity = timing.kv_capacity(identity, max_num_tokens=mnbt, max_batch_size=int(args["max_num_seqs"]),
                                      memory_fraction=float(args["gpu_memory_utilization"]),
                                      cache_dir=self.cache_dir)
        num_gpu_blocks = capacity.num_gpu_blocks(block_size)
        if num_gpu_blocks < 1:
            raise InfeasibleKVCapacity(f"{role} KV capacity {capacity.tokens_per_rank} tokens is under one block")
        table = timing.timing_table(identity, max_num_batched_tokens=mnbt, cache_dir=self.cache_dir)
        derived[f"{role}_num_gpu_blocks"] = num_gpu_blocks
        derived[f"{role}_kv_tokens_per_rank"] = capacity.tokens_per_rank
        derived[f"{role}_kv_bytes_per_token"] = capacity.bytes_per_token

        backend = args["engine_type"]
        engine: dict[str, Any] = {
            "backend": backend,
            "worker_type": args["worker_type"],
            "num_gpu_blocks": num_gpu_blocks,
            "block_size": block_size,
            "max_num_seqs": int(args["max_num_seqs"]),
            "max_num_batched_tokens": mnbt,
            "enable_prefix_caching": bool(args["enable_prefix_caching"]),
            "enable_chunked_prefill": True,
            "speedup_ratio": table.speedup_ratio,
            "timing_model": table.timing_model(),
        }
        if context:
            engine["max_model_len"] = int(context)
        if args.get("aic_nextn"):
            engine["aic_nextn"] = int(args["aic_nextn"])
        if backend == "sglang":
            engine["sglang"] = {"chunked_prefill_size": max(block_size, mnbt // block_size * block_size),
                                "max_prefill_tokens": mnbt}
        if role == "prefill":
            engine["kv_transfer_bandwidth"] = float(self.kv_transfer_bandwidth_gbps)
            engine["kv_transfer_bytes_per_token"] = int(capacity.bytes_per_token)
        if int(args.get("num_g2_blocks") or 0) > 0:
            engine.update(_host_offload(args))
        config: dict[str, Any] = {
            "engine": engine,
            # the replay counts tensor_parallel_size x dp_size GPUs per worker
            "tensor_parallel_size": tp * pp,
            "dp_size": dp,
        }
        memory_key = {"vllm": "gpu_memory_utilization", "sglang": "mem_fraction_static",
                      "trtllm": "free_gpu_memory_fraction"}.get(backend)
        if memory_key:
            config[memory_key] = float(args["gpu_memory_utilization"])
        if args.get("startup_time") is not None:
            config["startup_time"] = float(args["startup_time"])
        return config

    def _run(self, call: ReplayCall, request: EvalRequest) -> tuple[dict[str, Any], int | None]:
        import dynamo._core as core

        kwargs = dict(call.kwargs)
        counter = None
        if call.policy_factory is not None:  # a fresh policy per repeat: policies keep state
            policy = call.policy_factory(request.sample, request.goal, request.workload)
            if policy is not None:
                counter = _TickCounter(policy)
                kwargs["scaling_policy"] = counter
        if call.function == "trace":
            result = core.run_mocker_trace_replay(*call.args, **kwargs)
        else:
            result = core.run_mocker_synthetic_trace_replay(*call.args, **kwargs)
        summary = result.summary if hasattr(result, "summary") else result
        return dict(summary), (counter.ticks if counter is not None else None)


def _rebuild_evaluator(cls: type, fields: dict[str, Any]) -> "ReplayEvaluator":
    return cls(**fields)


def _router_config(plan: DeploymentPlan):
    if plan.router_mode != "kv_router" or not plan.router_config:
        return None
    from dynamo._core import KvRouterConfig

    return KvRouterConfig(**plan.router_config)


def _sla_kwargs(sla: dict[str, Any] | None) -> dict[str, float]:
    """Goodput SLA for the replay, only when the goal has one (spec §7.4)."""
    if not sla:
        return {}
    out = {f"sla_{k}": float(sla[k]) for k in ("ttft_ms", "itl_ms", "e2e_ms") if sla.get(k) is not None}
    if "sla_e2e_ms" in out and len(out) > 1:
        raise CandidateBuildError("goal.sla: the replay cannot combine e2e_ms with ttft_ms/itl_ms; set one kind")
    return out


def _host_offload(args: dict[str, Any]) -> dict[str, Any]:
    """KVBM G2 (host) offload knobs -> the mocker's native host offload block."""
    if not args.get("kv_bytes_per_token"):
        raise CandidateBuildError("kv_bytes_per_token is required when num_g2_blocks > 0")
    offload: dict[str, Any] = {"num_host_blocks": int(args["num_g2_blocks"])}
    if args.get("bandwidth_g1_to_g2_gbps") is not None:
        offload["d2h_bandwidth_gbps"] = float(args["bandwidth_g1_to_g2_gbps"])
    if args.get("bandwidth_g2_to_g1_gbps") is not None:
        offload["h2d_bandwidth_gbps"] = float(args["bandwidth_g2_to_g1_gbps"])
    return {"native_host_offload": offload, "kv_cache_bytes_per_token": int(args["kv_bytes_per_token"])}


_trace_checked: dict[tuple, None] = {}


def check_context(isl: int, osl: int, context: int) -> None:
    """A synthetic request must fit the model context with its output: input + output <= context."""
    if isl > context:
        raise CandidateBuildError(f"workload.isl={isl} exceeds the model context length {context}")
    if isl + osl > context:
        raise CandidateBuildError(f"workload.isl={isl} + workload.osl={osl} = {isl + osl} tokens exceeds the "
                                  f"model context length {context}")


def _check_trace(path: str, context: int | None, block_size: int) -> None:
    """Validate the trace once per (file version, context, block size) in this process."""
    from spica_pipeline.traces import read_mooncake_trace

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


def role_gpus(sample: dict[str, Any]) -> int:
    """Provisioned GPUs of a static candidate (engine GPUs x replicas over active roles)."""
    total = 0
    for role in active_roles(sample):
        tp, pp, dp, _, _ = role_shape(sample, role)
        total += tp * pp * dp * role_replicas(sample, role)
    return total
