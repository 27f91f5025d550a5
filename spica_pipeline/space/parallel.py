"""Legal, KV-feasible parallel configs per (model, hardware, backend, mode).

The pool is built from the system's GPU ladder (`gpu_ladder`: powers of two inside a node, whole nodes
doubling past it, up to the budget), one TP shape per width for a dense model (TP stays inside the NVLink
domain or two nodes) or the MoE layouts engines run (`engine_shapes_at`: one GPU; TEP, DEP, MoE-TP, DTP; TP
inside a node with attention DP across, experts expert-parallel) after the backend filters, replicas
1..budget/g, `min_gpu_budget`, disagg pairing within the budget, and a KV filter: a role shape is kept iff
AIC's per-rank KV capacity (max_num_tokens 8192, max_batch_size 256, the mode's gpu_memory_utilization,
nextn 0) exceeds max_seq_len. Results are memoised per argument tuple, and every pruned shape is counted
per rule in `EnumerationDiagnostics`, so a user can see why a shape is absent. Pinned shapes are checked
rule by rule in space/pins.py. With prefill and decode on two GPU types (`split_disagg_configs`) each
role's shapes are enumerated on its own system and paired within the budget of each type.

Deviation from upstream, on purpose: an AIC ValueError saying a width does not divide the model
(e.g. "num_heads 40 should be divisible by tp_size 16") prunes that shape under rule "kv" instead
of aborting the whole run: the shape cannot be modelled, the others still can. Any other estimator
ValueError is about the model itself and aborts, as a one-line ModelHardwareError.
"""

import re
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any, TypedDict

from spica_pipeline.errors import InfeasibleKVCapacity, ModelHardwareError, NoPerfDatabase, NoViableParallelConfig
from spica_pipeline.space.kv import estimate_kv_tokens
from spica_pipeline.space.model_hw import QuietAIC, check_hardware, hardware_facts, latest_backend_version, model_facts
from spica_pipeline.space.shapes import DisaggShape, ParallelConfig, RoleShape

# The fixed engine settings of the pool's KV filter (not the candidate's own batching: space/kv_load.py
# sizes that per candidate).
class _KvProbe(TypedDict):
    max_num_tokens: int
    max_batch_size: int
    memory_fraction: float
    nextn: int


KV_PROBE: _KvProbe = {"max_num_tokens": 8192, "max_batch_size": 256, "memory_fraction": 0.9, "nextn": 0}
DEFAULT_MEMORY_FRACTION = KV_PROBE["memory_fraction"]
RULES = ("ladder", "backend_filter", "pattern", "budget", "min_budget", "kv")
_MAX_EXAMPLES = 5
_UNMODELLABLE_MARKERS = ("should be divisible by",)
_BLOCK_SPLIT = re.compile(r"moe_intermediate_size=(\d+) / moe_tp_size=(\d+)\) % weight_block_size=(\d+)")


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


@dataclass(frozen=True)
class Topology:
    """How a system joins its GPUs: GPUs per node, GPUs per NVLink domain (the whole rack on GB200 / GB300
    NVL72, else the node) and each GPU's link off the node. AIC's system spec holds them
    (`node.num_gpus_per_node`, `num_gpus_per_rack`, `inter_node_bw`)."""

    hardware_sku: str
    gpus_per_node: int
    nvlink_domain: int
    inter_node_gbps: float | None = None  # a GPU's link off its node, GB/s (AIC's node.inter_node_bw)

    @property
    def tp_cap(self) -> int:
        """The widest attention TP offered: TP all-reduces every layer, so it stays inside the NVLink domain
        or spans two nodes (TP16 on two 8-GPU nodes is the widest TP deployments run over the network)."""
        return max(self.nvlink_domain, 2 * self.gpus_per_node)

    @property
    def moe_tp_cap(self) -> int:
        """The widest expert TP offered: past it the experts go expert-parallel (wide EP). The widest MoE-TP
        deployments run are 16 GPUs (SGLang's DeepSeek-R1 TP16 on two 8-GPU H100 nodes in AIC's
        silicon_sample.csv), and AIC's MoE perf data has no wider expert TP for DeepSeek on GB200."""
        return min(self.tp_cap, WIDEST_MOE_TP)

    def ladder_problem(self, gpus: int) -> str | None:
        """Why an engine of `gpus` GPUs does not fit the system's nodes, or None: inside a node an engine
        takes a divisor of the node, past one node it takes whole nodes."""
        node = self.gpus_per_node
        if gpus <= node and node % gpus:
            return f"an engine inside one {node}-GPU node of {self.hardware_sku} takes a divisor of {node} GPUs"
        if gpus > node and gpus % node:
            return f"an engine past one node of {self.hardware_sku} takes whole {node}-GPU nodes"
        return None


WIDEST_MOE_TP = 16
GENERIC_TOPOLOGY = Topology("a system of 8-GPU nodes", 8, 8)


@lru_cache(maxsize=64)
def topology(hardware_sku: str) -> Topology:
    """The system's node and NVLink-domain sizes from AIC's system spec."""
    from aiconfigurator_core.sdk.perf_database import load_system_spec

    node = hardware_facts(hardware_sku).gpus_per_node
    with QuietAIC():
        spec = load_system_spec(hardware_sku) or {}
    rack = int((spec.get("node") or {}).get("num_gpus_per_rack") or 0)
    link = (spec.get("node") or {}).get("inter_node_bw")
    return Topology(hardware_sku, node, max(node, rack), float(link) / 1e9 if link else None)


def gpu_ladder(topo: Topology, budget: int) -> tuple[int, ...]:
    """Engine widths the enumeration offers: powers of two inside a node, then whole nodes doubling (2, 4,
    8, ... nodes) up to `budget`. AIC's MoE perf data holds power-of-two expert-parallel widths, so a width
    such as a whole 72-GPU NVL72 rack is left to a pin, whose timing is checked."""
    widths = []
    width = 1
    while width < topo.gpus_per_node and width <= budget:
        widths.append(width)
        width *= 2
    width = topo.gpus_per_node
    while width <= budget:
        widths.append(width)
        width *= 2
    return tuple(widths)


def _next_width(topo: Topology, budget: int) -> int:
    """The first ladder width above `budget` (what the budget leaves out)."""
    return gpu_ladder(topo, 2 * budget + 2 * topo.gpus_per_node)[len(gpu_ladder(topo, budget))]


def _pattern_problem(tp: int, dp: int, moe_tp: int, moe_ep: int, topo: Topology) -> str | None:
    """Why the enumeration does not offer a MoE layout of tp x dp GPUs, or None. Offered: one GPU; TEP and
    MoE-TP (attention TP up to the system's TP cap); DEP and DTP (expert TP up to its cap); TP inside a node
    with attention DP across and the experts expert-parallel over every GPU (vLLM's `--tensor-parallel-size t --data-parallel-size d
    --enable-expert-parallel`, SGLang's `--tp t*d --dp d --enable-dp-attention --ep t*d`)."""
    gpus = tp * dp
    if gpus == 1:
        return None
    if moe_tp > 1 and moe_ep > 1:
        return "experts split both ways (moe_tp and moe_ep > 1): a pin can ask for it"
    if dp == 1 and tp > topo.tp_cap:
        return f"attention TP {tp} is wider than the NVLink domain or two nodes ({topo.tp_cap} GPUs)"
    if moe_tp > topo.moe_tp_cap:
        return f"experts tensor-parallel over more than {topo.moe_tp_cap} GPUs go expert-parallel instead"
    if tp > 1 and dp > 1:
        if tp > topo.gpus_per_node:
            return f"attention TP {tp} with attention DP spans nodes ({topo.gpus_per_node} GPUs per node)"
        if moe_ep != gpus:
            return "attention TP x DP offers experts expert-parallel over every GPU only"
    return None


def _backend_rejects(backend: str, tp: int, dp: int, moe_tp: int, moe_ep: int) -> str | None:
    """The reason a backend cannot run a MoE layout, or None (the sglang EP-only filter is dormant)."""
    if backend == "trtllm" and tp > 1 and dp > 1:
        return "trtllm forbids tp>1 with attention_dp>1"
    if backend == "vllm" and moe_tp > 1 and moe_ep > 1:
        return "vllm forbids moe_tp>1 with moe_ep>1"
    return None


def _powers_up_to(n: int) -> list[int]:
    out, p = [], 1
    while p <= n:
        out.append(p)
        p *= 2
    return out


def engine_shapes_at(is_moe: bool, backend: str, gpus: int, pruned: dict[str, _Pruned] | None = None,
                     topo: Topology = GENERIC_TOPOLOGY) -> list[RoleShape]:
    """Engine layouts of exactly `gpus` GPUs (pp=1, replicas=1), sorted; records what was pruned."""
    pruned = pruned if pruned is not None else {r: _Pruned() for r in RULES}
    if not is_moe:
        if gpus > topo.tp_cap:
            pruned["pattern"].add(f"tp{gpus} (a dense model's TP stays within {topo.tp_cap} GPUs)")
            return []
        return [RoleShape(tp=gpus)]
    widths = _powers_up_to(gpus)
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
                    problem = None if reason else _pattern_problem(tp, dp, moe_tp, moe_ep, topo)
                    if reason:
                        pruned["backend_filter"].add(f"{shape_label(shape, False)} ({reason})")
                    elif problem:
                        pruned["pattern"].add(f"{shape_label(shape, False)} ({problem})")
                    else:
                        shapes.append(shape)
    return sorted(shapes)


def probe_kv(model: str, hardware: str, backend: str, version: str, shape: RoleShape,
             precision: tuple | None = None, memory_fraction: float = DEFAULT_MEMORY_FRACTION) -> tuple[int | None, str]:
    """(per-rank KV tokens or None, why) of one engine shape at the pool's fixed engine settings."""
    try:
        tokens = estimate_kv_tokens(model, hardware, backend, version, shape.engine_key(),
                                    max_num_tokens=KV_PROBE["max_num_tokens"],
                                    max_batch_size=KV_PROBE["max_batch_size"], memory_fraction=float(memory_fraction),
                                    nextn=KV_PROBE["nextn"], precision=precision or None)
    except InfeasibleKVCapacity as exc:
        found = _BLOCK_SPLIT.search(str(exc))
        if found:  # AIC and the engines refuse this expert split of a block-quantized checkpoint
            inter, ways, block = found.groups()
            return None, (f"not modellable: block-quantized experts cannot split moe_tp {ways} ways "
                          f"(moe_intermediate_size {inter} / {ways} is not a multiple of the {block} block)")
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
    memory_fraction: float = DEFAULT_MEMORY_FRACTION,
) -> EnumerationResult:
    """The legal, KV-feasible pool (sorted), memoised; NoPerfDatabase / NoViableParallelConfig.

    `precision` is (gemm, moe, kvcache, fmha) quant modes (config.precision); None = the checkpoint's.
    `memory_fraction` is the gpu_memory_utilization the KV filter probes at.
    """
    if mode not in ("agg", "disagg"):
        raise ValueError(f"deployment_mode must be 'agg' or 'disagg', got {mode!r}")
    check_hardware(hardware)
    seq = resolve_max_seq_len(model, max_seq_len)
    floor = int(min_budget) if min_budget else None
    return _enumerate(model, hardware, backend, mode, int(budget), floor, seq,
                      tuple(precision) if precision and any(precision) else None, float(memory_fraction))


@lru_cache(maxsize=512)
def _enumerate(model: str, hardware: str, backend: str, mode: str, budget: int, min_budget: int | None,
               max_seq_len: int, precision: tuple | None = None,
               memory_fraction: float = DEFAULT_MEMORY_FRACTION) -> EnumerationResult:
    facts = model_facts(model)
    version = latest_backend_version(hardware, backend)  # NoPerfDatabase
    topo = topology(hardware)
    pruned = {r: _Pruned() for r in RULES}

    shapes: list[RoleShape] = []
    considered = 0
    for g in gpu_ladder(topo, budget):
        before = sum(p.count for p in pruned.values())
        at_g = engine_shapes_at(facts.is_moe, backend, g, pruned, topo)
        considered += len(at_g) + sum(p.count for p in pruned.values()) - before
        shapes.extend(at_g)
    pruned["ladder"].add(f"g={_next_width(topo, budget)} > gpu_budget={budget}")

    # Role configs: every shape with replicas 1..budget/g (min_gpu_budget applies to agg only).
    roles = [replace(s, replicas=r) for s in shapes for r in range(1, budget // s.gpus_per_engine + 1)]
    kv: dict[RoleShape, tuple[int | None, str]] = {}

    def feasible(role: RoleShape) -> bool:
        key = replace(role, replicas=1)
        if key not in kv:
            kv[key] = probe_kv(model, hardware, backend, version, key, precision, memory_fraction)
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


@dataclass(frozen=True)
class SplitPool:
    """The disagg pool of prefill on one GPU type and decode on another: pairs of role shapes each enumerated
    and KV-filtered on its own system, and per role the enumeration that gave its shapes."""

    configs: tuple[DisaggShape, ...]
    backend_version: str
    prefill: EnumerationDiagnostics
    decode: EnumerationDiagnostics

    def diagnostics(self) -> dict[str, Any]:
        return {"prefill": self.prefill.to_dict(), "decode": self.decode.to_dict(), "configs_kept": len(self.configs)}


def split_disagg_configs(model: str, prefill_hardware: str, decode_hardware: str, backend: str, *,
                         budgets: tuple[int, int] | None, total: int, min_budget: int | None = None,
                         max_seq_len: int | None = None,
                         precision: tuple[str | None, str | None, str | None, str | None] | None = None,
                         memory_fractions: tuple[float, float] = (DEFAULT_MEMORY_FRACTION, DEFAULT_MEMORY_FRACTION),
                         ) -> SplitPool:
    """Disagg pairs with prefill on `prefill_hardware` and decode on `decode_hardware` (two GPU types).

    Each role's shapes are the agg pool of its own system (the ladder, backend filter and KV filter there,
    at the role's gpu_memory_utilization), sized by `budgets` (GPUs of each type) when the budget is per
    type, else by `total` less one GPU for the other role; a pair is kept within `total` and, when set,
    at least `min_budget`. NoPerfDatabase / NoViableParallelConfig name the system that has none."""
    caps = budgets if budgets is not None else (total - 1, total - 1)
    roles = []
    for hardware, cap, fraction in zip((prefill_hardware, decode_hardware), caps, memory_fractions):
        if cap < 1:
            raise NoViableParallelConfig(f"no GPUs of {hardware} in gpu_budget for a disagg role on it")
        roles.append(parallel_configs_for(model, hardware, backend, "agg", cap, None, max_seq_len,
                                          precision=precision, memory_fraction=fraction))
    prefill, decode = roles
    if prefill.backend_version != decode.backend_version:
        raise NoPerfDatabase(f"aiconfigurator-core's latest {backend} perf data is {prefill.backend_version} on "
                             f"{prefill_hardware} and {decode.backend_version} on {decode_hardware}: one deployment "
                             "runs one engine version")
    lo = int(min_budget or 0)
    pairs = tuple(DisaggShape(p, d) for p in prefill.configs for d in decode.configs  # type: ignore[arg-type]
                  if lo <= p.used_gpus + d.used_gpus <= total)
    if not pairs:
        raise NoViableParallelConfig(f"no disagg pair of prefill on {prefill_hardware} and decode on "
                                     f"{decode_hardware} fits gpu_budget={total}"
                                     + (f", min_gpu_budget={min_budget}" if min_budget else ""))
    return SplitPool(tuple(sorted(pairs, key=lambda c: c.sort_key())), prefill.backend_version,
                     prefill.diagnostics, decode.diagnostics)
