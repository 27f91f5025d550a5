"""An engine's identity (what its pass latency depends on) and its KV capacity: the values the
enumeration, the perf-data checks and the timing tables share."""

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EngineIdentity:
    """Everything a pass latency depends on (not replicas, batching knobs or memory fraction)."""

    model: str
    system: str
    backend: str
    version: str
    tp: int = 1
    pp: int = 1
    attention_dp: int = 1
    moe_tp: int = 1
    moe_ep: int = 1
    nextn: int = 0
    # AIC dtypes (config/precision.py); None = the checkpoint's own
    weight_dtype: str | None = None
    moe_dtype: str | None = None
    attention_dtype: str | None = None
    kv_cache_dtype: str | None = None

    @property
    def is_moe(self) -> bool:
        return self.moe_tp * self.moe_ep > 1

    def quant_modes(self) -> tuple[str | None, str | None, str | None, str | None]:
        """(gemm, moe, kvcache, fmha) quant modes as AIC's KV estimator names them."""
        return (self.weight_dtype, self.moe_dtype, self.kv_cache_dtype, self.attention_dtype)

    def aic_config(self) -> dict[str, Any]:
        return {
            "schema_version": 1, "model_name": self.model, "system_name": self.system, "backend": self.backend,
            "backend_version": self.version, "kv_block_size": None, "tp_size": self.tp, "pp_size": self.pp,
            "moe_tp_size": self.moe_tp if self.is_moe else None, "moe_ep_size": self.moe_ep if self.is_moe else None,
            "attention_dp_size": self.attention_dp, "cp_size": None, "weight_dtype": self.weight_dtype,
            "moe_dtype": self.moe_dtype, "activation_dtype": self.attention_dtype,
            "kv_cache_dtype": self.kv_cache_dtype, "nextn": self.nextn or None, "extra": {},
        }


@dataclass(frozen=True)
class KvCapacity:
    """Per-rank KV tokens and KV bytes per token per GPU (AIC estimate_kv_cache)."""

    tokens_per_rank: int
    bytes_per_token: int

    def num_gpu_blocks(self, block_size: int) -> int:
        if block_size <= 0:
            raise ValueError(f"block_size must be greater than zero, got {block_size}")
        return self.tokens_per_rank // block_size
