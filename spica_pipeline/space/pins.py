"""Pinned parallel_configs: read in the engine's own words, checked rule by rule, refused with the rule that
refused them and the nearest shape that passes every rule.

A role pin is canonical (tp, pp, attention_dp, moe_tp, moe_ep), vLLM's (tp, data_parallel,
enable_expert_parallel) or SGLang's (tp: every GPU of the engine, dp, ep, enable_dp_attention); the config
layer has checked which (config/search_space.py). Reading it gives the canonical RoleShape:

* MoE widths left out take the engines' default, the experts tensor-parallel across the engine's GPUs
  (vLLM without --enable-expert-parallel, SGLang with ep 1); with --enable-expert-parallel vLLM runs them
  expert-parallel over tp x data_parallel GPUs. attention_dp left out beside MoE widths wider than tp is
  what makes the engine that wide (moe_tp x moe_ep / tp).
* A dense model has no experts: its MoE widths are ignored, and a data-parallel width that is not attention
  DP (vLLM's data_parallel, SGLang's dp without enable_dp_attention) is that many independent copies,
  read as replicas. Each such reading comes back as a note.

Then the rules, in order; the first one a pin breaks refuses it for that backend:
  shape      pp 1; a MoE engine's experts span its GPUs (moe_tp x moe_ep = tp x attention_dp); a dense
             model has no attention DP; the model's heads divide by tp (AIC's check)
  ladder     an engine inside a node takes a divisor of it, past a node whole nodes (the system's topology)
  backend    what the backend cannot run (vLLM: moe_tp and moe_ep both > 1; TRT-LLM: tp and attention DP)
  budget     within gpu_budget and min_gpu_budget
  memory     AIC's KV estimate at the role's gpu_memory_utilization holds max_seq_len per rank
  perf_data  AIC's perf data times the engine (a prefill and a decode pass)
"""

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from spica_pipeline.config.search_space import pin_spelling
from spica_pipeline.errors import NoViableParallelConfig, PerfModelError, one_line
from spica_pipeline.space.engine import EngineIdentity
from spica_pipeline.space.kv import memory_picture
from spica_pipeline.space.model_hw import latest_backend_version, model_facts
from spica_pipeline.space.parallel import (
    _backend_rejects,
    engine_shapes_at,
    gpu_ladder,
    probe_kv,
    config_label,
    topology,
)
from spica_pipeline.space.perf_data import check_timing
from spica_pipeline.space.shapes import DisaggShape, ParallelConfig, RoleShape

PIN_RULES = ("shape", "ladder", "backend", "budget", "memory", "perf_data")
_GIB = 1024 ** 3
_NEAREST_TIMED = 3  # nearest candidates whose timing is checked before one is named


class PinRefused(NoViableParallelConfig):
    """A pin no configured backend can run: `rule` is the check that refused it, `nearest` the nearest shape
    that passes every rule (None when none was found)."""

    def __init__(self, message: str, rule: str, nearest: ParallelConfig | None = None):
        super().__init__(message)
        self.rule = rule
        self.nearest = nearest
        self.pruning = f"{rule}: {message}"


@dataclass(frozen=True)
class PinContext:
    """What every pin of one sweep is checked against."""

    model: str
    hardware: str
    mode: str
    budget: int
    min_budget: int | None
    max_seq_len: int
    precision: tuple[str | None, str | None, str | None, str | None] | None = None  # (gemm, moe, kvcache, fmha)
    memory_fraction: Mapping[str, float] = field(default_factory=lambda: {"agg": 0.9, "prefill": 0.9, "decode": 0.9})
    nextn: int = 0


@dataclass(frozen=True)
class PinVerdict:
    """One pin on one backend: accepted (rule None) or refused by `rule` with `detail`."""

    index: int
    backend: str
    config: ParallelConfig | None
    rule: str | None
    detail: str
    notes: tuple[str, ...] = ()
    timing_notes: tuple[str, ...] = ()
    nearest: ParallelConfig | None = None

    @property
    def accepted(self) -> bool:
        return self.rule is None

    def to_dict(self) -> dict[str, Any]:
        return {"pin": self.index, "backend": self.backend,
                "config": config_label(self.config) if self.config is not None else None,
                "accepted": self.accepted, "rule": self.rule, "detail": self.detail, "notes": list(self.notes),
                "nearest": config_label(self.nearest) if self.nearest is not None else None}


class _Refusal(Exception):
    def __init__(self, rule: str, detail: str):
        super().__init__(detail)
        self.rule = rule
        self.detail = detail


# ---- reading a pin --------------------------------------------------------------------------------------

def _moe_widths(entry: Mapping[str, Any], width: int, notes: list[str]) -> tuple[int, int]:
    """Canonical moe_tp / moe_ep; a missing one completes the engine's width, both missing take the default."""
    mt: int | None = entry.get("moe_tp")
    me: int | None = entry.get("moe_ep")
    if mt is None and me is None:
        if width > 1:
            notes.append(f"moe_tp {width}: experts tensor-parallel across the engine's {width} GPUs (the engines' "
                         "default without expert parallelism)")
        return width, 1
    if mt is None or me is None:
        name, given = ("moe_ep", int(me or 1)) if mt is None else ("moe_tp", int(mt))
        if width % given:
            raise _Refusal("shape", f"{name} {given} does not divide the engine's tp x attention_dp = {width} GPUs")
        return (width // given, given) if mt is None else (given, width // given)
    return int(mt), int(me)


def read_role(entry: Mapping[str, Any], is_moe: bool, model: str = "the model") -> tuple[RoleShape, list[str]]:
    """The canonical shape of one role pin and the notes on how it was read; _Refusal('shape') when the
    engine's own words are inconsistent (e.g. SGLang's ep not dividing tp)."""
    spelling = pin_spelling(dict(entry))
    notes: list[str] = []
    tp, pp, replicas = int(entry["tp"]), int(entry.get("pp", 1)), int(entry.get("replicas", 1))
    if spelling == "vllm":
        dp, expert_parallel = int(entry.get("data_parallel", 1)), bool(entry.get("enable_expert_parallel", False))
        if not is_moe:
            if dp > 1:
                notes.append(f"{model} is dense: vLLM's data_parallel {dp} runs {dp} independent copies, read as "
                             f"replicas {replicas * dp}")
            if expert_parallel:
                notes.append(f"{model} is dense: enable_expert_parallel ignored")
            return RoleShape(tp=tp, pp=pp, replicas=replicas * dp), notes
        width = tp * dp
        shape = RoleShape(tp=tp, pp=pp, attention_dp=dp, moe_tp=1 if expert_parallel else width,
                          moe_ep=width if expert_parallel else 1, replicas=replicas)
        return shape, notes
    if spelling == "sglang":
        total, dp, ep = tp, int(entry.get("dp", 1)), int(entry.get("ep", 1))
        if entry.get("enable_dp_attention", False):
            if total % dp:
                raise _Refusal("shape", f"SGLang's dp {dp} does not divide its tp {total} (tp counts every GPU "
                                        "of the engine; attention TP is tp / dp)")
            attn_tp, attn_dp = total // dp, dp
        else:
            attn_tp, attn_dp = total, 1
            if dp > 1:
                notes.append(f"SGLang's dp {dp} without enable_dp_attention runs {dp} independent copies, read as "
                             f"replicas {replicas * dp}")
                replicas *= dp
        if not is_moe:
            if ep > 1:
                notes.append(f"{model} is dense: ep ignored")
            return RoleShape(tp=attn_tp, pp=pp, attention_dp=attn_dp, replicas=replicas), notes
        if total % ep:
            raise _Refusal("shape", f"SGLang's ep {ep} does not divide its tp {total} (the experts span every GPU)")
        return RoleShape(tp=attn_tp, pp=pp, attention_dp=attn_dp, moe_tp=total // ep, moe_ep=ep,
                         replicas=replicas), notes
    dp = int(entry.get("attention_dp", 1))
    moe_width = int(entry.get("moe_tp") or 1) * int(entry.get("moe_ep") or 1)
    if is_moe and "attention_dp" not in entry and moe_width > tp and moe_width % tp == 0:
        dp = moe_width // tp  # the experts' widths say how many GPUs the engine has
        notes.append(f"attention_dp {dp}: moe_tp x moe_ep = {moe_width} GPUs over tp {tp} (attention_dp left out)")
    if not is_moe:
        if (entry.get("moe_tp") or 1) > 1 or (entry.get("moe_ep") or 1) > 1:
            notes.append(f"{model} is dense: moe_tp / moe_ep ignored")
        return RoleShape(tp=tp, pp=pp, attention_dp=dp, replicas=replicas), notes
    moe_tp, moe_ep = _moe_widths(entry, tp * dp, notes)
    return RoleShape(tp=tp, pp=pp, attention_dp=dp, moe_tp=moe_tp, moe_ep=moe_ep, replicas=replicas), notes


def pin_backends(entry: Mapping[str, Any], backends: Sequence[str]) -> list[str]:
    """The backends a pin is checked on: its spelling's engine only, or every configured backend."""
    roles = [entry["prefill"], entry["decode"]] if "prefill" in entry else [entry]
    engines = {pin_spelling(dict(r)) for r in roles} - {"canonical"}
    return [b for b in backends if not engines or b in engines]


# ---- the rules --------------------------------------------------------------------------------------------

def _shape_rule(shape: RoleShape, is_moe: bool) -> None:
    if shape.pp != 1:
        raise _Refusal("shape", f"pp {shape.pp}: the space holds pp 1 engines only; write the engine's GPUs as "
                                "tp or attention_dp")
    width = shape.tp * shape.attention_dp
    if not is_moe and shape.attention_dp > 1:
        raise _Refusal("shape", f"a dense model has no attention DP: attention_dp {shape.attention_dp} is "
                                f"{shape.attention_dp} independent copies; pin replicas "
                                f"{shape.replicas * shape.attention_dp} of tp {shape.tp}")
    if is_moe and shape.moe_tp * shape.moe_ep != width:
        raise _Refusal("shape", f"moe_tp {shape.moe_tp} x moe_ep {shape.moe_ep} = {shape.moe_tp * shape.moe_ep} "
                                f"but tp {shape.tp} x attention_dp {shape.attention_dp} = {width}: the experts "
                                f"span every GPU of the engine (moe_tp {width} is vLLM's default for tp "
                                f"{shape.tp}, moe_ep {width} its --enable-expert-parallel)")


def _ladder_rule(shape: RoleShape, hardware: str) -> None:
    problem = topology(hardware).ladder_problem(shape.gpus_per_engine)
    if problem:
        raise _Refusal("ladder", f"{shape.gpus_per_engine} GPUs per engine: {problem}")


def _backend_rule(shape: RoleShape, backend: str) -> None:
    reason = _backend_rejects(backend, shape.tp, shape.attention_dp, shape.moe_tp, shape.moe_ep)
    if reason:
        raise _Refusal("backend", reason)


def _budget_rule(config: ParallelConfig, ctx: PinContext) -> None:
    if config.used_gpus > ctx.budget:
        raise _Refusal("budget", f"{config.used_gpus} GPUs > gpu_budget {ctx.budget}")
    if ctx.min_budget and config.used_gpus < ctx.min_budget and (ctx.mode == "disagg" or isinstance(config, RoleShape)):
        raise _Refusal("budget", f"{config.used_gpus} GPUs < min_gpu_budget {ctx.min_budget}")


def _memory_text(shape: RoleShape, ctx: PinContext, backend: str, version: str, fraction: float,
                 tokens: int | None) -> str:
    """The memory refusal with AIC's numbers and what would fit."""
    have = "no KV budget" if tokens is None else f"{tokens} KV tokens per rank"
    text = (f"AIC's memory estimate leaves {have} at gpu_memory_utilization {fraction:g}, fewer than "
            f"max_seq_len {ctx.max_seq_len}")
    picture = memory_picture(ctx.model, ctx.hardware, backend, version, shape.engine_key(), nextn=ctx.nextn,
                             precision=ctx.precision)
    if picture is None:
        return text
    parts = f"{picture.non_kv_bytes / _GIB:.1f} GiB of {picture.capacity_bytes / _GIB:.1f} GiB per GPU outside the KV"
    if picture.weights_bytes is not None:
        parts += f" (weights {picture.weights_bytes / _GIB:.1f} GiB)"
    need = picture.needed_fraction(ctx.max_seq_len)
    fix = (f"it fits from gpu_memory_utilization {math.ceil(need * 100) / 100:g}" if need is not None
           else "more GPUs per engine or a smaller checkpoint")
    return f"{text}: {parts}; {fix}"


def _memory_rule(shape: RoleShape, role: str, ctx: PinContext, backend: str, version: str) -> None:
    fraction = float(ctx.memory_fraction.get(role, 0.9))
    tokens, why = probe_kv(ctx.model, ctx.hardware, backend, version, replace(shape, replicas=1), ctx.precision,
                           fraction)
    if why.startswith("not modellable"):
        detail = why.removeprefix("not modellable: ")
        if "block-quantized" in detail:
            detail += "; run the experts expert-parallel (moe_ep, vLLM's enable_expert_parallel, SGLang's ep)"
        raise _Refusal("shape", detail + " (aiconfigurator-core's model of the layers)")
    if tokens is None or tokens <= ctx.max_seq_len:
        raise _Refusal("memory", _memory_text(shape, ctx, backend, version, fraction, tokens))


def identity_of(shape: RoleShape, ctx: PinContext, backend: str, version: str) -> EngineIdentity:
    gemm, moe, kvcache, fmha = ctx.precision or (None, None, None, None)
    return EngineIdentity(model=ctx.model, system=ctx.hardware, backend=backend, version=version, tp=shape.tp,
                          pp=shape.pp, attention_dp=shape.attention_dp, moe_tp=shape.moe_tp, moe_ep=shape.moe_ep,
                          nextn=ctx.nextn, weight_dtype=gemm, moe_dtype=moe, attention_dtype=fmha,
                          kv_cache_dtype=kvcache)


def _timing_rule(shape: RoleShape, ctx: PinContext, backend: str, version: str) -> str | None:
    """The fidelity note of timing the engine (None: exact data); _Refusal('perf_data') when AIC cannot."""
    try:
        return check_timing(identity_of(shape, ctx, backend, version))
    except PerfModelError as exc:
        raise _Refusal("perf_data", f"aiconfigurator-core cannot time {backend} {version} on {ctx.hardware} for "
                                    f"{ctx.model}: {one_line(exc.detail)[:300]}") from None


def check_role(shape: RoleShape, role: str, ctx: PinContext, backend: str, version: str, is_moe: bool) -> None:
    """The rules that need no AIC model build (shape, ladder, backend), then memory."""
    _shape_rule(shape, is_moe)
    _ladder_rule(shape, ctx.hardware)
    _backend_rule(shape, backend)
    _memory_rule(shape, role, ctx, backend, version)


# ---- one pin ----------------------------------------------------------------------------------------------

def _roles(config: ParallelConfig) -> list[tuple[str, RoleShape]]:
    if isinstance(config, DisaggShape):
        return [("prefill", config.prefill), ("decode", config.decode)]
    return [("agg", config)]


def read_pin(entry: Mapping[str, Any], is_moe: bool, model: str) -> tuple[ParallelConfig, list[str]]:
    """The canonical config of a pin (agg role or prefill/decode pair) and the notes on its reading."""
    if "prefill" in entry or "decode" in entry:
        prefill, n1 = read_role(entry["prefill"], is_moe, model)
        decode, n2 = read_role(entry["decode"], is_moe, model)
        return DisaggShape(prefill, decode), [f"prefill: {n}" for n in n1] + [f"decode: {n}" for n in n2]
    return read_role(entry, is_moe, model)


def check_pin(index: int, entry: Mapping[str, Any], backend: str, ctx: PinContext) -> PinVerdict:
    """Read one pin and run the rules for one backend, in order; the first broken rule refuses it."""
    facts = model_facts(ctx.model)
    version = latest_backend_version(ctx.hardware, backend)
    try:
        config, notes = read_pin(entry, facts.is_moe, ctx.model)
    except _Refusal as refusal:
        return PinVerdict(index, backend, None, refusal.rule, refusal.detail)
    want = DisaggShape if ctx.mode == "disagg" else RoleShape
    if not isinstance(config, want):
        kind = "disagg pair" if isinstance(config, DisaggShape) else "single-role shape"
        return PinVerdict(index, backend, config, "shape", f"a {kind} but deployment_mode is {ctx.mode!r}")
    timing_notes: list[str] = []
    try:
        for role, shape in _roles(config):
            _shape_rule(shape, facts.is_moe)
            _ladder_rule(shape, ctx.hardware)
            _backend_rule(shape, backend)
        _budget_rule(config, ctx)
        for role, shape in _roles(config):
            _memory_rule(shape, role, ctx, backend, version)
        for role, shape in _roles(config):
            note = _timing_rule(shape, ctx, backend, version)
            if note and note not in timing_notes:
                timing_notes.append(note)
    except _Refusal as refusal:
        where = f"{role}: " if isinstance(config, DisaggShape) and refusal.rule != "budget" else ""
        return PinVerdict(index, backend, config, refusal.rule, where + refusal.detail, tuple(notes))
    return PinVerdict(index, backend, config, None, "accepted", tuple(notes), tuple(timing_notes))


# ---- the nearest accepted shape ---------------------------------------------------------------------------

def _distance(a: RoleShape, b: RoleShape) -> tuple[float, ...]:
    lg = math.log2
    width = abs(lg(a.gpus_per_engine) - lg(b.gpus_per_engine))
    dims = sum(abs(lg(x) - lg(y)) for x, y in zip(a.engine_key(), b.engine_key()))
    return (width, dims, abs(a.replicas - b.replicas), *b.sort_key())


def _nearest_role(shape: RoleShape, role: str, room: int, ctx: PinContext, backend: str, version: str,
                  is_moe: bool) -> RoleShape | None:
    """The nearest role of at most `room` GPUs that passes every rule (timing checked on the first few)."""
    topo = topology(ctx.hardware)
    candidates = []
    for g in gpu_ladder(topo, room):
        for engine in engine_shapes_at(is_moe, backend, g, topo=topo):
            candidates.append(replace(engine, replicas=max(1, min(shape.replicas, room // g))))
    candidates.sort(key=lambda c: _distance(shape, c))
    timed = 0
    for candidate in candidates:
        if candidate.engine_key() == shape.engine_key() and candidate.replicas == shape.replicas:
            continue
        try:
            _memory_rule(candidate, role, ctx, backend, version)
            if timed >= _NEAREST_TIMED:
                return None
            timed += 1
            _timing_rule(candidate, ctx, backend, version)
        except _Refusal:
            continue
        return candidate
    return None


def nearest_accepted(config: ParallelConfig, ctx: PinContext, backend: str) -> ParallelConfig | None:
    """The nearest config that passes every rule on `backend`: each role that breaks a rule replaced by its
    nearest passing role within what the budget leaves it (None when there is none)."""
    facts = model_facts(ctx.model)
    version = latest_backend_version(ctx.hardware, backend)
    if isinstance(config, RoleShape):
        return _nearest_role(config, "agg", ctx.budget, ctx, backend, version, facts.is_moe)
    roles = dict(_roles(config))
    for role, other in (("prefill", "decode"), ("decode", "prefill")):
        try:
            check_role(roles[role], role, ctx, backend, version, facts.is_moe)
            _timing_rule(roles[role], ctx, backend, version)
        except _Refusal:
            room = ctx.budget - min(roles[other].used_gpus, ctx.budget - 1)
            found = _nearest_role(roles[role], role, room, ctx, backend, version, facts.is_moe)
            if found is None:
                return None
            roles[role] = found
    pair = DisaggShape(roles["prefill"], roles["decode"])
    return pair if pair.used_gpus <= ctx.budget and pair != config else None


# ---- every pin --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PinCheck:
    """The pins that passed (canonical config -> the backends that run it, in pin then backend order), every
    verdict, and the warnings to print (readings, backends that run none of the pins, timing substitutions)."""

    support: dict[ParallelConfig, tuple[str, ...]]
    verdicts: tuple[PinVerdict, ...]
    warnings: tuple[str, ...]

    def diagnostics(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for v in self.verdicts:
            out.setdefault(v.backend, {"pins": []})["pins"].append(v.to_dict())
        return out


def _refusal_text(index: int, entry: Mapping[str, Any], verdicts: list[PinVerdict]) -> str:
    label = config_label(verdicts[0].config) if verdicts and verdicts[0].config is not None else str(dict(entry))
    why = "; ".join(f"{v.backend}: rule '{v.rule}': {v.detail}" for v in verdicts) or "no configured backend"
    return f"search_space.parallel_configs[{index}] ({label}) is refused by every configured backend: {why}"


def check_pins(pins: Iterable[Mapping[str, Any]], ctx: PinContext, backends: Sequence[str]) -> PinCheck:
    """Every pin on every backend it names (user order, duplicates merged); PinRefused names the first pin
    no backend runs, the rule that refused it and the nearest accepted shape."""
    support: dict[ParallelConfig, list[str]] = {}
    verdicts: list[PinVerdict] = []
    warnings: list[str] = []
    timing_warned: set[str] = set()
    for index, entry in enumerate(pins):
        here = [check_pin(index, entry, b, ctx) for b in pin_backends(entry, backends)]
        verdicts.extend(here)
        accepted = [v for v in here if v.accepted]
        for note in dict.fromkeys(n for v in here for n in v.notes):
            warnings.append(f"smart-sweep: parallel_configs[{index}]: {note}")
        if not here:
            raise PinRefused(f"search_space.parallel_configs[{index}] is written in one engine's words, and no "
                             f"configured backend with a perf database is that engine (checked: {list(backends)})",
                             "backend")
        if not accepted:
            # the verdict that got furthest through the rules is the one to act on
            best = max(here, key=lambda v: PIN_RULES.index(v.rule) if v.rule in PIN_RULES else -1)
            nearest = nearest_accepted(best.config, ctx, best.backend) if best.config is not None else None
            text = _refusal_text(index, entry, here)
            if nearest is not None:
                text += f"; nearest accepted: {config_label(nearest)} on {best.backend}"
            elif best.config is not None:
                text += f"; no nearby shape within gpu_budget {ctx.budget} passes every rule on {best.backend}"
            raise PinRefused(text, best.rule or "shape", nearest)
        for v in accepted:
            assert v.config is not None
            support.setdefault(v.config, [])
            if v.backend not in support[v.config]:
                support[v.config].append(v.backend)
            for note in v.timing_notes:
                if v.backend not in timing_warned:
                    timing_warned.add(v.backend)
                    warnings.append(f"smart-sweep: backend '{v.backend}': {note} (recorded as fidelity_note on every "
                                    "trial)")
    for backend in backends:
        if not any(backend in b for b in support.values()):
            refused = [v for v in verdicts if v.backend == backend]
            if refused:
                warnings.append(f"smart-sweep: backend '{backend}' runs none of the pinned parallel_configs ("
                                + "; ".join(f"[{v.index}] rule '{v.rule}': {v.detail}" for v in refused) + ")")
    return PinCheck({c: tuple(b) for c, b in support.items()}, tuple(verdicts), tuple(warnings))

