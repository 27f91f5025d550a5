"""Legal, KV-feasible parallel configs per (model, hardware, backend, mode).

The pool is the GPU ladder {1,2,4,8,16} capped at the budget, one TP shape per width for a dense
model or the four pure MoE patterns (TEP, DEP, MoE-TP, DTP) after the backend filters, replicas
1..budget/g, `min_gpu_budget`, disagg pairing within the budget, and a KV filter: a role shape is
kept iff AIC's per-rank KV capacity (max_num_tokens 8192, max_batch_size 256, fraction 0.9,
nextn 0) exceeds max_seq_len. Results are memoised per argument tuple, and every pruned shape is
counted per rule in `EnumerationDiagnostics`, so a user can see why a shape is absent.

Deviation from upstream, on purpose: an AIC ValueError saying a width does not divide the model
(e.g. "num_heads 40 should be divisible by tp_size 16") prunes that shape under rule "kv" instead
of aborting the whole run: the shape cannot be modelled, the others still can. Any other estimator
ValueError is about the model itself and aborts, as a one-line ModelHardwareError.
"""

from collections import Counter
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any, Iterable, Mapping, TypedDict

from spica_pipeline.errors import InfeasibleKVCapacity, ModelHardwareError, NoViableParallelConfig
from spica_pipeline.space.kv import estimate_kv_tokens
from spica_pipeline.space.model_hw import check_hardware, latest_backend_version, model_facts
from spica_pipeline.space.shapes import DisaggShape, ParallelConfig, RoleShape, parallel_config_from_dict

GPU_LADDER = (1, 2, 4, 8, 16)
_POWERS_OF_TWO = (1, 2, 4, 8, 16, 32, 64, 128)
# The fixed engine settings of the pool's KV filter (not the candidate's own batching: space/kv_load.py
# sizes that per candidate).
class _KvProbe(TypedDict):
    max_num_tokens: int
    max_batch_size: int
    memory_fraction: float
    nextn: int


KV_PROBE: _KvProbe = {"max_num_tokens": 8192, "max_batch_size": 256, "memory_fraction": 0.9, "nextn": 0}
RULES = ("ladder", "backend_filter", "pattern", "budget", "min_budget", "kv")
_MAX_EXAMPLES = 5
_UNMODELLABLE_MARKERS = ("should be divisible by",)


def shape_label(shape: RoleShape, with_replicas: bool = True) -> str:
    label = f"tp{shape.tp}/pp{shape.pp}/dp{shape.attention_dp}/moe_tp{shape.moe_tp}/moe_ep{shape.moe_ep}"
    return f"{label}x{shape.replicas}" if with_replicas else label


def config_label(config: ParallelConfig) -> str:
    if isinstance(config, DisaggShape):
        return f"P[{shape_label(config.prefill)}]+D[{shape_label(config.decode)}]"
    return shape_label(config)


@dataclass
class _Pruned:
    count: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, example: str, count: int = 1) -> None:
        self.count += count
        if len(self.examples) < _MAX_EXAMPLES and example not in self.examples:
            self.examples.append(example)


@dataclass(frozen=True)
class EnumerationDiagnostics:
    """Why the pool looks the way it does, for one (backend, mode).

    Units: `engine_shapes_*` count engine layouts (no replicas); the ladder rule counts GPU widths;
    backend_filter and pattern count engine layouts; budget, min_budget and kv count configs
    (agg: shape x replicas, disagg: prefill x decode pairs), each config under the first rule it
    fails, in the order listed. `kv_tokens` maps every probed engine shape to its per-rank KV tokens
    (None: no KV budget / not modellable).
    """

    model_name: str
    hardware_sku: str
    backend: str
    backend_version: str
    deployment_mode: str
    gpu_budget: int
    min_gpu_budget: int | None
    max_seq_len: int
    engine_shapes_considered: int
    engine_shapes_kept: int
    configs_considered: int
    configs_kept: int
    pruned: tuple[tuple[str, int, tuple[str, ...]], ...]
    kv_tokens: tuple[tuple[str, int | None], ...]

    def pruned_count(self, rule: str) -> int:
        return next((count for r, count, _ in self.pruned if r == rule), 0)

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in (
            "model_name", "hardware_sku", "backend", "backend_version", "deployment_mode", "gpu_budget",
            "min_gpu_budget", "max_seq_len", "engine_shapes_considered", "engine_shapes_kept",
            "configs_considered", "configs_kept")}
        out["pruned"] = {rule: {"count": count, "examples": list(examples)}
                         for rule, count, examples in self.pruned}
        out["kv_tokens"] = dict(self.kv_tokens)
        return out


@dataclass(frozen=True)
class EnumerationResult:
    """The legal pool for one (backend, mode): RoleShape for agg, DisaggShape for disagg."""

    configs: tuple[ParallelConfig, ...]
    backend_version: str
    diagnostics: EnumerationDiagnostics


def _is_pure_moe_pattern(tp: int, dp: int, moe_tp: int, moe_ep: int) -> bool:
    """TEP, DEP, MoE-TP or DTP."""
    attention_ok = (tp > 1 and dp == 1) or (tp == 1 and dp > 1)
    ffn_ok = (moe_tp == 1 and moe_ep > 1) or (moe_tp > 1 and moe_ep == 1)
    return attention_ok and ffn_ok


def _backend_rejects(backend: str, tp: int, dp: int, moe_tp: int, moe_ep: int) -> str | None:
    """The reason a backend cannot run a MoE layout, or None (the sglang EP-only filter is dormant)."""
    if backend == "trtllm" and tp > 1 and dp > 1:
        return "trtllm forbids tp>1 with attention_dp>1"
    if backend == "vllm" and moe_tp > 1 and moe_ep > 1:
        return "vllm forbids moe_tp>1 with moe_ep>1"
    return None


def engine_shapes_at(is_moe: bool, backend: str, gpus: int,
                     pruned: dict[str, _Pruned] | None = None) -> list[RoleShape]:
    """Engine layouts of exactly `gpus` GPUs (pp=1, replicas=1), sorted; records what was pruned."""
    pruned = pruned if pruned is not None else {r: _Pruned() for r in RULES}
    if not is_moe:
        return [RoleShape(tp=gpus)]
    widths = [p for p in _POWERS_OF_TWO if p <= gpus]
    shapes = []
    for tp in widths:
        for dp in widths:
            if tp * dp != gpus:
                continue
            for moe_tp in widths:
                for moe_ep in widths:
                    if moe_tp * moe_ep != gpus:
                        continue
                    shape = RoleShape(tp=tp, attention_dp=dp, moe_tp=moe_tp, moe_ep=moe_ep)
                    reason = _backend_rejects(backend, tp, dp, moe_tp, moe_ep)
                    if reason:
                        pruned["backend_filter"].add(f"{shape_label(shape, False)} ({reason})")
                    elif not _is_pure_moe_pattern(tp, dp, moe_tp, moe_ep):
                        pruned["pattern"].add(f"{shape_label(shape, False)} (not TEP/DEP/MoE-TP/DTP)")
                    else:
                        shapes.append(shape)
    return sorted(shapes)


def _probe_kv(model: str, hardware: str, backend: str, version: str,
              shape: RoleShape, precision: tuple | None = None) -> tuple[int | None, str]:
    try:
        tokens = estimate_kv_tokens(model, hardware, backend, version, shape.engine_key(), **KV_PROBE,
                                    precision=precision or None)
    except InfeasibleKVCapacity:
        return None, "no KV budget (weights leave no room)"
    except ValueError as exc:
        text = str(exc).strip()
        if any(marker in text for marker in _UNMODELLABLE_MARKERS):
            return None, "not modellable: " + text.split(": ")[-1].splitlines()[0].strip()
        raise ModelHardwareError(  # not about this shape: the model itself cannot be estimated
            f"aiconfigurator-core cannot estimate KV capacity for model {model!r} on {hardware} "
            f"(backend={backend} {version}, {shape_label(shape, False)}): "
            f"{text.splitlines()[0] if text else repr(exc)}"
        ) from None
    return tokens, f"{tokens} KV tokens per rank"


def resolve_max_seq_len(model_name: str, context_length: int | None) -> int:
    """The max sequence length the pool is built for: search_space.context_length, else the model's."""
    if context_length:
        return int(context_length)
    facts = model_facts(model_name)
    if not facts.max_context_length:
        raise ModelHardwareError(
            f"model {model_name!r} declares no max context length; set search_space.context_length"
        )
    return facts.max_context_length


def parallel_configs_for(
    model: str,
    hardware: str,
    backend: str,
    mode: str,
    budget: int,
    min_budget: int | None = None,
    max_seq_len: int | None = None,
    precision: tuple[str | None, str | None, str | None, str | None] | None = None,
) -> EnumerationResult:
    """The legal, KV-feasible pool (sorted), memoised; NoPerfDatabase / NoViableParallelConfig.

    `precision` is (gemm, moe, kvcache, fmha) quant modes (config.precision); None = the checkpoint's.
    """
    if mode not in ("agg", "disagg"):
        raise ValueError(f"deployment_mode must be 'agg' or 'disagg', got {mode!r}")
    check_hardware(hardware)
    seq = resolve_max_seq_len(model, max_seq_len)
    floor = int(min_budget) if min_budget else None
    return _enumerate(model, hardware, backend, mode, int(budget), floor, seq,
                      tuple(precision) if precision and any(precision) else None)


@lru_cache(maxsize=512)
def _enumerate(model: str, hardware: str, backend: str, mode: str, budget: int, min_budget: int | None,
               max_seq_len: int, precision: tuple | None = None) -> EnumerationResult:
    facts = model_facts(model)
    version = latest_backend_version(hardware, backend)  # NoPerfDatabase
    pruned = {r: _Pruned() for r in RULES}

    shapes: list[RoleShape] = []
    considered = 0
    for g in GPU_LADDER:
        if g > budget:
            pruned["ladder"].add(f"g={g} > gpu_budget={budget}")
            continue
        before = sum(p.count for p in pruned.values())
        at_g = engine_shapes_at(facts.is_moe, backend, g, pruned)
        considered += len(at_g) + sum(p.count for p in pruned.values()) - before
        shapes.extend(at_g)

    # Role configs: every shape with replicas 1..budget/g (min_gpu_budget applies to agg only).
    roles = [replace(s, replicas=r) for s in shapes for r in range(1, budget // s.gpus_per_engine + 1)]
    kv: dict[RoleShape, tuple[int | None, str]] = {}

    def feasible(role: RoleShape) -> bool:
        key = replace(role, replicas=1)
        if key not in kv:
            kv[key] = _probe_kv(model, hardware, backend, version, key, precision)
        tokens = kv[key][0]
        return tokens is not None and tokens > max_seq_len

    def kv_reason(role: RoleShape) -> str:
        tokens, why = kv[replace(role, replicas=1)]
        return why if tokens is None else f"{tokens} KV tokens per rank <= max_seq_len {max_seq_len}"

    configs: list[ParallelConfig] = []
    if mode == "agg":
        configs_considered = len(roles)
        for role in roles:
            if min_budget and role.used_gpus < min_budget:
                pruned["min_budget"].add(
                    f"{shape_label(role)} ({role.used_gpus} GPUs < min_gpu_budget={min_budget})")
            elif not feasible(role):
                pruned["kv"].add(f"{shape_label(role, False)} ({kv_reason(role)})")
            else:
                configs.append(role)
    else:
        configs_considered = len(roles) ** 2
        configs.extend(_pair(roles, budget, min_budget, feasible, kv_reason, pruned))

    if not configs:
        detail = "; ".join(f"{r}: {p.count} pruned" + (f", e.g. {p.examples[0]}" if p.examples else "")
                           for r, p in pruned.items() if p.count)
        err = NoViableParallelConfig(
            f"no {mode} parallel config of {model} on {hardware} fits gpu_budget={budget}"
            + (f", min_gpu_budget={min_budget}" if min_budget else "")
            + f" with KV for max_seq_len={max_seq_len} on backend={backend}"
            + f" ({detail or 'nothing to enumerate'})"
        )
        # The summary of a refusal names the filter that removed the last survivors (kv, usually).
        decisive = [f"{r}: {p.count} pruned" + (f", e.g. {p.examples[0]}" if p.examples else "")
                    for r, p in pruned.items() if p.count]
        err.pruning = decisive[-1] if decisive else "nothing to enumerate"
        raise err
    diagnostics = EnumerationDiagnostics(
        model_name=model, hardware_sku=hardware, backend=backend, backend_version=version,
        deployment_mode=mode, gpu_budget=budget, min_gpu_budget=min_budget, max_seq_len=max_seq_len,
        engine_shapes_considered=considered, engine_shapes_kept=len(shapes),
        configs_considered=configs_considered, configs_kept=len(configs),
        pruned=tuple((r, p.count, tuple(p.examples)) for r, p in pruned.items()),
        kv_tokens=tuple((shape_label(s, False), kv[s][0]) for s in sorted(kv)),
    )
    return EnumerationResult(configs=tuple(sorted(configs, key=lambda c: c.sort_key())),
                             backend_version=version, diagnostics=diagnostics)


def _pairs_between(hist: Counter, lo: int, hi: int) -> int:
    """How many (prefill, decode) pairs of roles with these footprint counts total within [lo, hi]."""
    return sum(n1 * n2 for f1, n1 in hist.items() for f2, n2 in hist.items() if lo <= f1 + f2 <= hi)


def _pair(roles: list[RoleShape], budget: int, min_budget: int | None, feasible, kv_reason,
          pruned: dict[str, _Pruned]) -> list[DisaggShape]:
    """Disagg pairing: prune roles above budget - m (m: the smallest role footprint), pair within
    [min_gpu_budget, budget].

    Pruned pairs are counted from footprint histograms, not materialised (a 64-GPU MoE space has
    ~250k raw pairs); each raw pair is counted once: over budget, else under min, else KV.
    """
    if not roles:
        return []
    smallest = min(r.used_gpus for r in roles)
    largest = max(r.used_gpus for r in roles)
    lo = min_budget or 0
    all_hist = Counter(r.used_gpus for r in roles)
    over = _pairs_between(all_hist, budget + 1, 2 * largest)
    under = _pairs_between(all_hist, 0, lo - 1)
    if over:
        pruned["budget"].add(f"pairs over gpu_budget={budget}, e.g. a {largest}-GPU role with a "
                             f"{smallest}-GPU role", count=over)
    if under:
        pruned["min_budget"].add(f"pairs under min_gpu_budget={min_budget}, e.g. {smallest}+{smallest} GPUs",
                                 count=under)

    pairable = [r for r in roles if r.used_gpus <= budget - smallest]
    good: dict[int, list[RoleShape]] = {}
    for r in pairable:
        if feasible(r):
            good.setdefault(r.used_gpus, []).append(r)
        elif len(pruned["kv"].examples) < _MAX_EXAMPLES:
            pruned["kv"].add(f"{shape_label(r, False)} ({kv_reason(r)})", count=0)
    pairs = [DisaggShape(p, d)
             for f1, prefills in good.items() for f2, decodes in good.items() if lo <= f1 + f2 <= budget
             for p in prefills for d in decodes]
    pruned["kv"].count += _pairs_between(Counter(r.used_gpus for r in pairable), lo, budget) - len(pairs)
    return pairs


def check_pins(
    pins: Iterable[dict[str, Any] | ParallelConfig],
    mode: str,
    legal_by_backend: Mapping[str, Iterable[ParallelConfig]],
) -> dict[ParallelConfig, tuple[str, ...]]:
    """Pinned parallel_configs -> the backends whose legal set holds them (user order, no duplicates).

    Raises NoViableParallelConfig when no backend supports any pin, or when some pin is supported
    by no backend.
    """
    legal = {b: set(configs) for b, configs in legal_by_backend.items()}
    parsed: list[ParallelConfig] = []
    for i, pin in enumerate(pins):
        config = parallel_config_from_dict(pin) if isinstance(pin, dict) else pin
        want = DisaggShape if mode == "disagg" else RoleShape
        if not isinstance(config, want):
            kind = "disagg pair" if isinstance(config, DisaggShape) else "single-role shape"
            raise NoViableParallelConfig(
                f"search_space.parallel_configs[{i}] is a {kind} but deployment_mode is {mode!r}"
            )
        if config not in parsed:
            parsed.append(config)
    support = {c: tuple(b for b in legal if c in legal[b]) for c in parsed}
    if not any(support.values()):
        raise NoViableParallelConfig(
            f"no configured backend can run the pinned parallel_configs {[config_label(c) for c in parsed]} "
            f"(backends with a viable pool: {sorted(legal) or 'none'}; a pin must be on the GPU ladder "
            f"{list(GPU_LADDER)}, pp=1, a TP shape (dense) or TEP/DEP/MoE-TP/DTP (MoE), within gpu_budget "
            "and KV-feasible)"
        )
    unsupported = [config_label(c) for c, backends in support.items() if not backends]
    if unsupported:
        raise NoViableParallelConfig(
            f"pinned parallel_configs are legal/KV-feasible for no configured backend: {unsupported}"
        )
    return support
