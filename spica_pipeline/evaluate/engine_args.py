"""One candidate -> the arguments of one Dynamo Replay run: pure building.

Load resolution, deployment plan, context check, per-role engine configs and replay kwargs are
decided here, with no Dagster, no file I/O and no replay call, so they can be read and tested on
their own. What only the outside world knows (the AIC KV capacity and timing table of an engine
identity, the model's context length, whether a trace file is valid, the latest perf-DB version)
comes in through `EngineFacts`; `evaluate/replay.py` supplies the real one and runs the call.

Fidelity rules (docs/evaluator.md): every role gets an AIC-derived timing table and an explicit
`num_gpu_blocks` (the replay's defaults are model-agnostic), each from the role's own GPU type when
prefill and decode run on two (heterogeneous disaggregation), disagg KV transfer is charged on the
prefill args (between two GPU types at the slower side's link, `kv_transfer_gbps`), and kv_router
replays are repeated because routing ties are broken randomly.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from spica_pipeline.config.goal import OptimizationGoal, planner_target
from spica_pipeline.config.workload import Workload
from spica_pipeline.errors import CandidateBuildError, InfeasibleKVCapacity, describe
from spica_pipeline.evaluate.evaluator import EvalRequest
from spica_pipeline.jsonvalue import canonical_json, spec_hash
from spica_pipeline.fidelity import measurement
from spica_pipeline.space.candidate import Candidate
from spica_pipeline.space.engine import EngineIdentity, KvCapacity
from spica_pipeline.space.kv_load import resolve_kv_load
from spica_pipeline.space.plan import DeploymentPlan, build_deployment_plan
from spica_pipeline.space.speculative import expected_tokens_per_step
from spica_pipeline.traces import session_records


class TimingRef(Protocol):
    """How engine args reference a timing table (`resources.timing.TimingTable`)."""

    @property
    def speedup_ratio(self) -> float: ...

    @property
    def fidelity_note(self) -> str | None:
        """Set when the table uses substitute perf data (space/perf_data.py)."""

    def timing_model(self) -> dict[str, Any]: ...


class EngineFacts(Protocol):
    """What the builder asks the outside world; raises CandidateBuildError / InfeasibleKVCapacity."""

    def backend_version(self, hardware_sku: str, backend: str) -> str: ...

    def kv_tokens(self, model_name: str, hardware_sku: str, backend: str, backend_version: str,
                  shape: tuple[int, int, int, int, int], **knobs: Any) -> int: ...

    def kv_capacity(self, identity: EngineIdentity, *, max_num_tokens: int, max_batch_size: int,
                    memory_fraction: float) -> KvCapacity: ...

    def timing_table(self, identity: EngineIdentity, *, max_num_batched_tokens: int) -> TimingRef: ...

    def context_length(self, model_name: str) -> int | None: ...

    def inter_node_gbps(self, hardware_sku: str) -> float | None:
        """A GPU's network link off its node (GB/s; AIC's system spec), None when the spec has none."""
        ...

    def check_trace(self, path: str, context: int | None, block_size: int) -> None: ...

    def step_estimators(self, timing_model: dict[str, Any]) -> tuple[Callable[[int], float],
                                                                     Callable[[int, int], float]]:
        """(prefill_ms(tokens), decode_ms(batch, context)) of an engine's timing table."""
        ...

    def write_trace(self, text: str) -> str:
        """Store a generated Mooncake trace (content-addressed) and return its path."""
        ...


@dataclass(frozen=True)
class ReplaySettings:
    """The evaluator's own knobs (the replay resource's fields)."""

    trace_block_size: int = 512
    benchmark_granularity: int = 8
    kv_transfer_bandwidth_gbps: float = 25.0
    router_repeats: int = 3


class OverTypeBudget(InfeasibleKVCapacity):
    """A candidate with more GPUs of a type than the budget of that type (a type pair searched from lists):
    infeasible, like a KV shortfall, and refused before any replay."""


@dataclass
class ReplayCall:
    """Everything one replay run needs; built once per candidate, run once per repeat.

    `kwargs["router_config"]` is a plain dict (or None) here; the resource turns it into the
    replay's `KvRouterConfig`.
    """

    function: str  # "trace" | "synthetic"
    args: tuple
    kwargs: dict[str, Any]
    repeats: int
    derived: dict[str, Any] = field(default_factory=dict)
    policy_factory: Callable[..., Any] | None = None  # build_scaling_policy(candidate, goal, workload)


def build_replay_call(request: EvalRequest, settings: ReplaySettings, facts: EngineFacts,
                      derived: dict[str, Any] | None = None) -> ReplayCall:
    """Resolve load, plan, capacity and timing into replay arguments (no replay yet).

    Raises InfeasibleKVCapacity for capacity problems and CandidateBuildError for a candidate that
    cannot be built; fills `derived` as it goes so a failing candidate still records what was
    computed.
    """
    derived = {} if derived is None else derived
    candidate = request.candidate
    goal = OptimizationGoal.model_validate(request.goal or {})
    workload = Workload.model_validate(request.workload)
    if not candidate.backend_version:
        version = facts.backend_version(candidate.system, candidate.backend)
        candidate = replace(candidate, backend_version=version)
        derived["backend_version"] = candidate.backend_version
    over = candidate.over_type_budget()
    if over:
        raise OverTypeBudget(over)

    # 1. load: a KV-load ratio becomes a per-candidate concurrency (space/kv_load.py)
    override: int | None = None
    if workload.is_kv_load:
        ratio = candidate.kv_load_ratio if candidate.kv_load_ratio is not None else workload.kv_load_scalar()
        if ratio is None:
            raise CandidateBuildError("a ranged kv_load_ratio needs the candidate's own kv_load_ratio")
        load = resolve_kv_load(candidate, int(workload.isl or 0), int(workload.osl or 0), float(ratio),
                               estimate=facts.kv_tokens)
        derived.update(load)
        override = load["concurrency"]
    elif workload.concurrency is not None:
        derived["concurrency"] = workload.concurrency

    # 2. plan: workers, router and planner payloads (space/plan.py)
    sla = goal.sla.model_dump(mode="json") if goal.sla is not None else None
    try:
        plan = build_deployment_plan(candidate, planner_target=planner_target(goal.target), sla=sla)
    except ValueError as exc:  # an 'sla' planner target without both ttft_ms and itl_ms
        raise CandidateBuildError(str(exc), detail=describe(exc)) from exc

    # 3. model context and trace checks, before any replay
    context = candidate.context_length or facts.context_length(candidate.model)
    if workload.is_trace:
        facts.check_trace(str(workload.trace_path), context, settings.trace_block_size)
    elif workload.sessions is not None:
        if context is not None and workload.sessions.max_history() > context:
            raise CandidateBuildError(f"workload.sessions reach {workload.sessions.max_history()} tokens of history "
                                      f"and answer, over the model context length {context}")
    elif context is not None and workload.isl is not None:
        check_context(int(workload.isl), int(workload.osl or 0), int(context))

    # 4. per-role engine configs with AIC timing and explicit capacity
    rates = speculative_rates(candidate, workload, derived)
    engines = {role: engine_config(candidate, role, args, context, derived, facts, settings, rates)
               for role, args in plan.engine_args().items()}

    # 5. replay kwargs
    kwargs: dict[str, Any] = {
        "router_mode": plan.router_mode,
        "router_config": router_config(plan),
        "capture_per_request": True,  # the steady-state window is cut from per-request records
    }
    if plan.deployment_mode == "agg":
        kwargs.update(extra_engine_args=engines["agg"], num_workers=plan.num_workers)
    else:
        kwargs.update(prefill_engine_args=engines["prefill"], decode_engine_args=engines["decode"],
                      num_prefill_workers=plan.num_prefill_workers, num_decode_workers=plan.num_decode_workers)
    kwargs.update(sla_kwargs(sla))
    cap = workload.in_flight_cap(override)
    if workload.sessions is not None:  # the replay runs each session's turns in order, think time apart
        function = "trace"
        args: tuple = ([session_trace_path(workload, derived, settings, facts)],)
        kwargs.update(arrival_speedup_ratio=1.0, trace_block_size=int(settings.trace_block_size),
                      trace_format="mooncake-delta")
    elif workload.is_trace:
        function = "trace"
        args = ([str(workload.trace_path)],)
        kwargs.update(arrival_speedup_ratio=float(workload.arrival_speedup_ratio),
                      trace_block_size=int(settings.trace_block_size), replay_concurrency=cap)
    else:
        function = "synthetic"
        args = (int(workload.isl or 0), int(workload.osl or 0), int(workload.synthetic_request_count(override)))
        interval = workload.arrival_interval_ms()
        kwargs.update(arrival_speedup_ratio=1.0, replay_concurrency=cap if interval is None else None,
                      arrival_interval_ms=interval, turns_per_session=int(workload.turns_per_session),
                      shared_prefix_ratio=float(workload.shared_prefix_ratio),
                      num_prefix_groups=int(workload.num_prefix_groups),
                      inter_turn_delay_ms=float(workload.inter_turn_delay_ms))
        derived["request_count"] = args[2]
        client = str((request.context or {}).get("closed_loop_client") or "ramp")
        if client not in measurement.CLIENT_STARTS:
            raise CandidateBuildError(f"closed_loop_client must be one of {list(measurement.CLIENT_STARTS)}, "
                                      f"got {client!r}")
        together = interval is None and bool(cap) and client == "together" and int(workload.turns_per_session) == 1
        gap = 0.0
        if together and cap:  # benchmark-client start: all clients at t=0, a random client gap between turns
            cycles = float((request.context or {}).get("client_gap_cycles", measurement.CLIENT_GAP_CYCLES))
            cycle = ramped_closed_loop(plan, engines, workload, int(cap), args[2], facts).cycle_ms if cycles else 0.0
            gap = cycles * cycle
            loop = measurement.closed_loop(int(cap), args[2], 0.0, min_turns=1)
            derived["closed_loop_client"] = {**loop.to_dict(), "cycle_ms": round(cycle, 4), "start": "together",
                                             "gap_cycles": cycles, "gap_ms": round(gap, 4)}
            derived["request_count"] = loop.request_count
        if interval is None and cap and int(workload.turns_per_session) == 1 and not together:
            loop = ramped_closed_loop(plan, engines, workload, int(cap), args[2], facts)
            args = (args[0], args[1], loop.clients)
            kwargs.update(replay_concurrency=None, arrival_interval_ms=max(loop.interval_ms, 1e-3),
                          turns_per_session=loop.turns, inter_turn_delay_ms=0.0)
            derived["ramp"] = loop.to_dict()
            derived["request_count"] = loop.request_count
        if workload.has_jitter or (together and gap > 0):  # per-request lengths / gaps need a generated trace
            function, args = "trace", ([jittered_trace_path(workload, derived, interval, context, settings, facts)],)
            for key in ("arrival_interval_ms", "turns_per_session", "shared_prefix_ratio", "num_prefix_groups",
                        "inter_turn_delay_ms"):
                kwargs.pop(key, None)
            looped = derived.get("ramp") or derived.get("closed_loop_client")
            kwargs.update(replay_concurrency=None if looped else kwargs.get("replay_concurrency"),
                          trace_block_size=int(settings.trace_block_size), trace_format="mooncake")
    derived["window_rule"] = measurement.window_kind(plan.is_static, bool(derived.get("ramp")),
                                                     together=bool(derived.get("closed_loop_client")))
    controllers = [k for k in ("replay_concurrency", "arrival_interval_ms") if kwargs.get(k) is not None]
    if function == "synthetic" and len(controllers) != 1:
        raise CandidateBuildError(f"a synthetic replay needs exactly one load controller, got {controllers}")

    repeats = 1
    if plan.router_mode == "kv_router":
        repeats = max(1, int(request.context.get("router_repeats", settings.router_repeats)))
    derived["benchmark_granularity"] = settings.benchmark_granularity
    policy_factory: Callable[..., Any] | None = None
    if not plan.is_static:  # imported here so a missing planner fails the build, not the replay
        try:
            from spica_pipeline.evaluate.planner import build_scaling_policy

            policy_factory = build_scaling_policy
        except ImportError as exc:
            raise CandidateBuildError(str(exc), detail=describe(exc)) from exc
    return ReplayCall(function, args, kwargs, repeats, derived, policy_factory=policy_factory)


def ramped_closed_loop(plan: DeploymentPlan, engines: dict[str, dict[str, Any]], workload: Workload, clients: int,
                       requested: int, facts: EngineFacts) -> measurement.ClosedLoop:
    """c ramped clients spaced one estimated request cycle / c apart (timing from the role tables)."""
    first = engines["agg"] if "agg" in engines else engines["prefill"]
    last = engines["agg"] if "agg" in engines else engines["decode"]
    prefill_ms, _ = facts.step_estimators(first["engine"]["timing_model"])
    _, step_ms = facts.step_estimators(last["engine"]["timing_model"])
    rates = last["engine"].get("aic_nextn_accept_rates")
    per_step = expected_tokens_per_step([float(a) for a in rates.split(",")]) if rates else 1.0

    def decode_ms(batch: int, context: int) -> float:  # per output token: a speculative step yields several
        return step_ms(batch, context) / per_step

    ranks = max(1, (plan.num_workers if "agg" in engines else plan.num_decode_workers) * int(last.get("dp_size", 1)))
    batch = min(-(-clients // ranks), int(last["engine"]["max_num_seqs"]))
    cycle = measurement.cycle_estimate_ms(int(workload.isl or 0), int(workload.osl or 0), batch,
                                          prefill_ms=prefill_ms, decode_ms=decode_ms)
    return measurement.closed_loop(clients, requested, cycle)


def jittered_trace_path(workload: Workload, derived: dict[str, Any], interval: float | None, context: int | None,
                        settings: ReplaySettings, facts: EngineFacts) -> str:
    """The Mooncake trace of a jittered workload, seeded by the workload alone (every candidate of
    a sweep sees the same requests), stored by the facts."""

    isl, osl = int(workload.isl or 0), int(workload.osl or 0)
    if context is not None:
        check_context(math.ceil(isl * (1 + workload.isl_jitter)), math.ceil(osl * (1 + workload.osl_jitter)),
                      int(context))
    seed = int(spec_hash(workload.model_dump(mode="json")), 16) % (2 ** 31)
    ramp = derived.get("ramp") or derived.get("closed_loop_client")
    loop = measurement.ClosedLoop(ramp["clients"], ramp["turns"], ramp["interval_ms"], ramp["cycle_ms"]) \
        if ramp else None
    records = measurement.jittered_trace(
        isl=isl, osl=osl, isl_jitter=float(workload.isl_jitter), osl_jitter=float(workload.osl_jitter), seed=seed,
        loop=loop, request_count=int(derived.get("request_count") or 1), interval_ms=float(interval or 0.0),
        turn_gap_ms=float((derived.get("closed_loop_client") or {}).get("gap_ms") or 0.0),
        shared_prefix_ratio=float(workload.shared_prefix_ratio), num_prefix_groups=int(workload.num_prefix_groups),
        block_size=int(settings.trace_block_size))
    derived["jitter_seed"] = seed
    return facts.write_trace("".join(canonical_json(r) + "\n" for r in records))


def speculative_rates(candidate: Candidate, workload: Workload, derived: dict[str, Any]) -> list[float] | None:
    """The per-position acceptance of a speculating candidate's drafts (workload.speculative_acceptance),
    recorded in `derived` with the tokens a step yields; None when it does not speculate or (a pinned
    aic_nextn only) the workload gives none. A searched method without acceptance cannot be replayed."""
    drafts = candidate.draft_tokens
    if not drafts:
        return None
    try:
        rates = workload.acceptance_rates(drafts)
    except ValueError as exc:
        raise CandidateBuildError(str(exc)) from None
    if rates is None:
        if candidate.speculative_method:
            raise CandidateBuildError("speculative decoding needs workload.speculative_acceptance (the "
                                      "probability that a draft token is accepted)")
        return None
    derived["speculative"] = {"method": candidate.draft_method, "draft_tokens": drafts, "acceptance": rates,
                              "tokens_per_step": round(expected_tokens_per_step(rates), 6)}
    return rates


def session_trace_path(workload: Workload, derived: dict[str, Any], settings: ReplaySettings,
                       facts: EngineFacts) -> str:
    """The Mooncake-delta trace of a sessions workload, seeded by the workload alone (every candidate of a
    sweep replays the same sessions), stored by the facts."""
    sessions = workload.sessions
    assert sessions is not None
    seed = int(spec_hash(workload.model_dump(mode="json")), 16) % (2 ** 31)
    records = session_records(**sessions.model_dump(mode="json"), seed=seed,
                              block_size=int(settings.trace_block_size))
    derived["sessions"] = {"count": sessions.count, "requests": len(records), "seed": seed}
    derived["request_count"] = len(records)
    return facts.write_trace("".join(canonical_json(r) + "\n" for r in records))


def engine_identity(candidate: Candidate, role: str, args: dict[str, Any]) -> EngineIdentity:
    """The timing/KV identity of one role's engine (`args`: the plan's engine args of the role)."""
    s, precision = candidate.role(role).shape, candidate.precision
    return EngineIdentity(
        model=args["aic_model_path"], system=args["aic_system"], backend=args["aic_backend"],
        version=args["aic_backend_version"], tp=s.tp, pp=s.pp, attention_dp=s.attention_dp, moe_tp=s.moe_tp,
        moe_ep=s.moe_ep,
        nextn=candidate.draft_tokens, weight_dtype=precision.get("weights"),
        moe_dtype=precision.get("moe"), attention_dtype=precision.get("attention"),
        kv_cache_dtype=precision.get("kv_cache"),
    )


def engine_config(candidate: Candidate, role: str, args: dict[str, Any], context: int | None,
                  derived: dict[str, Any], facts: EngineFacts, settings: ReplaySettings,
                  rates: list[float] | None = None) -> dict[str, Any]:
    """One role's replay engine config: AIC timing, explicit KV blocks, backend-specific knobs, and a
    decoding role's draft tokens with their acceptance `rates` (None: the replay's own rates)."""
    shape = candidate.role(role).shape
    tp, pp, dp = shape.tp, shape.pp, shape.attention_dp
    identity = engine_identity(candidate, role, args)
    block_size = int(args["block_size"])
    if block_size <= 0:
        raise CandidateBuildError(f"{role}_block_size must be greater than zero, got {block_size}",
                                  detail=f"ValueError: {role}_block_size must be greater than zero, got {block_size}")
    mnbt = int(args["max_num_batched_tokens"])
    capacity = facts.kv_capacity(identity, max_num_tokens=mnbt, max_batch_size=int(args["max_num_seqs"]),
                                 memory_fraction=float(args["gpu_memory_utilization"]))
    num_gpu_blocks = capacity.num_gpu_blocks(block_size)
    if num_gpu_blocks < 1:
        raise InfeasibleKVCapacity(f"{role} KV capacity {capacity.tokens_per_rank} tokens is under one block")
    table = facts.timing_table(identity, max_num_batched_tokens=mnbt)
    derived[f"{role}_num_gpu_blocks"] = num_gpu_blocks
    derived[f"{role}_kv_tokens_per_rank"] = capacity.tokens_per_rank
    derived[f"{role}_kv_bytes_per_token"] = capacity.bytes_per_token
    note = getattr(table, "fidelity_note", None)
    if note:  # substitute perf data: recorded on the trial, never silent
        notes = [n for n in str(derived.get("fidelity_note") or "").split("; ") if n]
        derived["fidelity_note"] = "; ".join(dict.fromkeys([*notes, str(note)]))

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
    drafts = candidate.draft_tokens
    if drafts and role != "prefill":  # a decoding engine drafts; its table verifies drafts + 1 tokens a step
        engine["aic_nextn"] = drafts  # the replay yields 1 + the accepted drafts per step, sampled by `rates`
        if rates:  # (a pinned aic_nextn without workload.speculative_acceptance: the replay's own rates)
            engine["aic_nextn_accept_rates"] = ",".join(f"{a:g}" for a in rates)
        if candidate.aic_nextn:
            derived[f"{role}_mtp_nextn"] = drafts
    if dp > 1:  # attention-DP ranks: independent schedulers with per-rank KV (replay dp_size)
        derived[f"{role}_attention_dp_ranks"] = dp
    if backend == "sglang":
        engine["sglang"] = {"chunked_prefill_size": max(block_size, mnbt // block_size * block_size),
                            "max_prefill_tokens": mnbt}
    if role == "prefill":
        engine["kv_transfer_bandwidth"] = kv_transfer_gbps(candidate, settings, facts, derived)
        engine["kv_transfer_bytes_per_token"] = int(capacity.bytes_per_token)
    if int(args.get("num_g2_blocks") or 0) > 0:
        engine.update(host_offload(args))
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


def kv_transfer_gbps(candidate: Candidate, settings: ReplaySettings, facts: EngineFacts,
                     derived: dict[str, Any]) -> float:
    """The per-GPU link a disagg prompt's KV crosses (GB/s): the evaluator's kv_transfer_bandwidth_gbps,
    and between two GPU types no faster than the slower side's link off its node (AIC's inter_node_bw):
    different types never share a node, so the hand-off always crosses the network. Recorded in `derived`
    for such a candidate."""
    bandwidth = float(settings.kv_transfer_bandwidth_gbps)
    systems = candidate.systems
    if len(systems) < 2:
        return bandwidth
    sides = {system: facts.inter_node_gbps(system) for system in systems}
    known = {system: float(gbps) for system, gbps in sides.items() if gbps}
    slower = min(known, key=lambda system: known[system]) if known else None
    limited = slower is not None and known[slower] < bandwidth
    if limited and slower is not None:
        bandwidth = known[slower]
    derived["kv_transfer"] = {"bandwidth_gbps": bandwidth, "link_gbps": sides,
                              "limited_by": slower if limited else "kv_transfer_bandwidth_gbps"}
    return bandwidth


def router_config(plan: DeploymentPlan) -> dict[str, Any] | None:
    """KvRouterConfig fields of a kv_router plan (None otherwise)."""
    if plan.router_mode != "kv_router" or not plan.router_config:
        return None
    return dict(plan.router_config)


def sla_kwargs(sla: dict[str, Any] | None) -> dict[str, float]:
    """Goodput SLA for the replay, only when the goal has one."""
    if not sla:
        return {}
    out = {f"sla_{k}": float(sla[k]) for k in ("ttft_ms", "itl_ms", "e2e_ms") if sla.get(k) is not None}
    if "sla_e2e_ms" in out and len(out) > 1:
        raise CandidateBuildError("goal.sla: the replay cannot combine e2e_ms with ttft_ms/itl_ms; set one kind")
    return out


def host_offload(args: dict[str, Any]) -> dict[str, Any]:
    """KVBM G2 (host) offload knobs -> the mocker's native host offload block."""
    if not args.get("kv_bytes_per_token"):
        raise CandidateBuildError("kv_bytes_per_token is required when num_g2_blocks > 0")
    offload: dict[str, Any] = {"num_host_blocks": int(args["num_g2_blocks"])}
    if args.get("bandwidth_g1_to_g2_gbps") is not None:
        offload["d2h_bandwidth_gbps"] = float(args["bandwidth_g1_to_g2_gbps"])
    if args.get("bandwidth_g2_to_g1_gbps") is not None:
        offload["h2d_bandwidth_gbps"] = float(args["bandwidth_g2_to_g1_gbps"])
    return {"native_host_offload": offload, "kv_cache_bytes_per_token": int(args["kv_bytes_per_token"])}


def check_context(isl: int, osl: int, context: int) -> None:
    """A synthetic request must fit the model context with its output: input + output <= context."""
    if isl > context:
        raise CandidateBuildError(f"workload.isl={isl} exceeds the model context length {context}")
    if isl + osl > context:
        raise CandidateBuildError(f"workload.isl={isl} + workload.osl={osl} = {isl + osl} tokens exceeds the "
                                  f"model context length {context}")

