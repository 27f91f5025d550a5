"""Per-rank KV-cache capacity from AI Configurator's memory estimator, memoised in-process.

`total_kv_size_tokens` is the capacity of one attention-DP rank (each GPU of a TP group holds 1/TP
of every token), so a role's capacity is per-rank tokens x attention_dp x replicas. A speculative engine
(nextn > 0) also holds its draft layers' weights and KV (`with_draft_layers`).
"""

import math
import re
from dataclasses import dataclass
from functools import lru_cache, wraps
from typing import Callable, ParamSpec

from spica_pipeline.errors import InfeasibleKVCapacity, one_line
from spica_pipeline.space.model_hw import QuietAIC, model_facts
from spica_pipeline.space.speculative import draft_kv_layers

P = ParamSpec("P")

# Messages from estimate_kv_cache that mean "this shape cannot hold any KV", not "bad input".
_INFEASIBLE_MARKERS = ("no KV budget", "Invalid quantized MoE configuration")


def memory_fraction_kind(backend: str) -> str:
    """TRT-LLM reserves a fraction of free memory; vLLM and SGLang a fraction of total memory."""
    return "of_free" if backend == "trtllm" else "of_total"


def estimate_kv(
    model_name: str,
    hardware_sku: str,
    backend: str,
    backend_version: str,
    shape: tuple[int, int, int, int, int],
    *,
    max_num_tokens: int = 8192,
    max_batch_size: int = 256,
    memory_fraction: float = 0.9,
    nextn: int | None = 0,
    precision: tuple[str | None, str | None, str | None, str | None] | None = None,
) -> tuple[int, int]:
    """(per-rank KV tokens, KV bytes per token per GPU) for one engine shape (tp, pp, attention_dp,
    moe_tp, moe_ep).

    Raises InfeasibleKVCapacity when the weights leave no KV budget; other estimator errors
    (unknown model, bad parallel width) propagate as ValueError. `precision` is (gemm, moe,
    kvcache, fmha) in AIC's quant-mode names; None = the checkpoint's own.
    """
    return _estimate(model_name, hardware_sku, backend, backend_version, tuple(int(x) for x in shape),
                     int(max_num_tokens), int(max_batch_size), float(memory_fraction), int(nextn or 0),
                     tuple(precision) if precision else (None, None, None, None))



def _first(estimate: Callable[P, tuple[int, int]]) -> Callable[P, int]:
    @wraps(estimate)
    def tokens(*args: P.args, **kwargs: P.kwargs) -> int:
        return estimate(*args, **kwargs)[0]

    return tokens


# Per-rank KV tokens only: `estimate_kv` with the same arguments and errors.
estimate_kv_tokens = _first(estimate_kv)


@lru_cache(maxsize=4096)
def _estimate(model_name, hardware_sku, backend, backend_version, shape, max_num_tokens, max_batch_size,
              memory_fraction, nextn, precision) -> tuple[int, int]:
    from aiconfigurator_core.sdk.memory import estimate_kv_cache

    tp, pp, dp, moe_tp, moe_ep = shape
    gemm, moe, kvcache, fmha = precision
    is_moe = moe_tp * moe_ep > 1
    try:
        with QuietAIC():
            result = estimate_kv_cache(
                model_name, hardware_sku, backend, backend_version,
                max_num_tokens=max_num_tokens, max_batch_size=max_batch_size,
                memory_fraction_kind=memory_fraction_kind(backend), memory_fraction_value=memory_fraction,
                tp_size=tp, pp_size=pp, attention_dp_size=dp,
                moe_tp_size=moe_tp if is_moe else None, moe_ep_size=moe_ep if is_moe else None,
                gemm_quant_mode=gemm, moe_quant_mode=moe, kvcache_quant_mode=kvcache, fmha_quant_mode=fmha,
                nextn=nextn, allow_naive_fallback=False, allow_hf_config_download=False,
            )
    except ValueError as exc:
        if any(marker in str(exc) for marker in _INFEASIBLE_MARKERS):
            why = "" if "no KV budget" in str(exc) else f" ({one_line(str(exc).split(': ')[-1])})"
            raise InfeasibleKVCapacity(
                f"no KV budget for backend={backend}, shape=tp{tp}/pp{pp}/dp{dp}/moe_tp{moe_tp}/moe_ep{moe_ep}{why}"
            ) from None
        raise
    tokens, per_token = int(result["total_kv_size_tokens"]), int(result["kv_size_per_token_bytes"])
    if nextn:
        weights = (result.get("memory_breakdown") or {}).get("weights_bytes")
        tokens, per_token = with_draft_layers(model_name, nextn, int(result["total_kv_size_bytes"]), per_token,
                                              int(weights or 0))
        if tokens <= 0:
            raise InfeasibleKVCapacity(f"no KV budget for backend={backend}, shape=tp{tp}/pp{pp}/dp{dp}/"
                                       f"moe_tp{moe_tp}/moe_ep{moe_ep} once the draft layers of {nextn} draft "
                                       "tokens take their weights and KV")
    return tokens, per_token


def with_draft_layers(model_name: str, draft_tokens: int, kv_bytes: int, bytes_per_token: int,
                      weights_bytes: int) -> tuple[int, int]:
    """(KV tokens, KV bytes per token) per rank once a speculative engine's draft layers are in.

    aiconfigurator-core's estimate leaves them out ("the draft module's marginal weight/KV cost is not
    separately modeled"); an engine keeps draft KV for every token (SGLang: one draft slot per target
    token) and holds the draft weights. Each of the d draft layers is taken as one of the model's L layers:
    KV per token x (L + d) / L, and d / L of the weights come out of the KV budget."""
    layers = model_facts(model_name).num_layers
    draft = draft_kv_layers(model_name, draft_tokens)
    if layers <= 0 or draft <= 0 or bytes_per_token <= 0:
        return kv_bytes // max(1, bytes_per_token), bytes_per_token
    per_token = math.ceil(bytes_per_token * (layers + draft) / layers)
    budget = kv_bytes - weights_bytes * draft / layers
    return (int(budget // per_token) if budget > 0 else 0), per_token


@dataclass(frozen=True)
class MemoryPicture:
    """Where one GPU's memory goes in AIC's model of one engine shape, for a refusal that shows its numbers.

    non_kv_bytes is everything outside the KV cache (weights, activations, runtime and communication
    buffers); kv_bytes_per_token is per rank (what one more token of context costs), None when the weights
    leave no room to measure it."""

    capacity_bytes: int
    non_kv_bytes: int
    weights_bytes: int | None
    kv_bytes_per_token: float | None
    fraction_kind: str

    def needed_fraction(self, tokens: int) -> float | None:
        """The gpu_memory_utilization at which `tokens` of KV fit per rank (None: not even all of it)."""
        if self.kv_bytes_per_token is None:
            return None
        kv = tokens * self.kv_bytes_per_token
        if self.fraction_kind == "of_free":
            free = self.capacity_bytes - self.non_kv_bytes
            return kv / free if free > 0 and kv <= free else None
        need = (self.non_kv_bytes + kv) / self.capacity_bytes
        return need if need <= 1.0 else None


_NON_KV = re.compile(r"non-KV memory \((\d+) bytes\).*capacity=(\d+) bytes")


def memory_picture(model_name: str, hardware_sku: str, backend: str, backend_version: str,
                   shape: tuple[int, int, int, int, int], *, max_num_tokens: int = 8192, max_batch_size: int = 256,
                   nextn: int | None = 0,
                   precision: tuple[str | None, str | None, str | None, str | None] | None = None,
                   ) -> MemoryPicture | None:
    """AIC's memory breakdown of one engine shape with all of the GPU given to it (None: AIC gave no numbers)."""
    from aiconfigurator_core.sdk.memory import estimate_kv_cache

    tp, pp, dp, moe_tp, moe_ep = (int(x) for x in shape)
    gemm, moe, kvcache, fmha = precision or (None, None, None, None)
    is_moe = moe_tp * moe_ep > 1
    kind = memory_fraction_kind(backend)
    try:
        with QuietAIC():
            result = estimate_kv_cache(
                model_name, hardware_sku, backend, backend_version, max_num_tokens=max_num_tokens,
                max_batch_size=max_batch_size, memory_fraction_kind=kind, memory_fraction_value=1.0,
                tp_size=tp, pp_size=pp, attention_dp_size=dp,
                moe_tp_size=moe_tp if is_moe else None, moe_ep_size=moe_ep if is_moe else None,
                gemm_quant_mode=gemm, moe_quant_mode=moe, kvcache_quant_mode=kvcache, fmha_quant_mode=fmha,
                nextn=int(nextn or 0), allow_naive_fallback=False, allow_hf_config_download=False,
            )
    except ValueError as exc:
        found = _NON_KV.search(str(exc))
        if not found:
            return None
        return MemoryPicture(int(found.group(2)), int(found.group(1)), None, None, kind)
    parts = result.get("memory_breakdown") or {}
    tokens = int(result["total_kv_size_tokens"])
    kv_bytes = int(result["total_kv_size_bytes"])
    return MemoryPicture(
        capacity_bytes=int(result["total_gpu_capacity_bytes"]),
        non_kv_bytes=int(sum(int(v) for v in parts.values())),
        weights_bytes=int(parts["weights_bytes"]) if "weights_bytes" in parts else None,
        kv_bytes_per_token=kv_bytes / tokens if tokens > 0 else None,
        fraction_kind=kind,
    )
