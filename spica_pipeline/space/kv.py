"""Per-rank KV-cache capacity from AI Configurator's memory estimator, memoised in-process.

`total_kv_size_tokens` is the capacity of one attention-DP rank (each GPU of a TP group holds 1/TP
of every token), so a role's capacity is per-rank tokens x attention_dp x replicas.
"""

from functools import lru_cache, wraps
from typing import Callable, ParamSpec

from spica_pipeline.errors import InfeasibleKVCapacity, one_line
from spica_pipeline.space.model_hw import QuietAIC

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
    return int(result["total_kv_size_tokens"]), int(result["kv_size_per_token_bytes"])
