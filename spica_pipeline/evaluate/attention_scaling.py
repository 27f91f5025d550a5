"""Round 5 of the fidelity work, kept opt-in: scale a bf16-attention fallback's prefill attention.

space/perf_data.py times fp8-attention MLA models with bf16 attention data when AIC has no fp8
data (with a `fidelity_note`). AIC's perf databases measure fp8 against bf16 attention (at the same
KV dtype) for some op families; their matched-shape time ratio is the substitution's expected speed
difference. Generation attention has no fp8 data in any of AIC's databases, so only prefill is
scaled. Off unless SPICA_FALLBACK_ATTENTION_SCALING=1: bench_fidelity.FALLBACK_SCALING_RULE rejected
it on calibration rows (docs/fidelity.md, round 5); the timing cache key names the setting. It reads
AIC's parquet files and the environment, so it lives here rather than in the pure search layer.
"""
from functools import lru_cache
from typing import Any

from spica_pipeline.space.engine import EngineIdentity
from spica_pipeline.space.model_hw import QuietAIC

FALLBACK_SCALING_ENV = "SPICA_FALLBACK_ATTENTION_SCALING"
FALLBACK_SCALING_DEFAULT = False


def fallback_scaling_enabled() -> bool:
    import os

    value = os.environ.get(FALLBACK_SCALING_ENV)
    return FALLBACK_SCALING_DEFAULT if value is None else value.strip().lower() in ("1", "true", "yes", "on")


def _data_root() -> Any:
    from pathlib import Path

    from aiconfigurator_core.sdk.perf_database import get_systems_paths

    for p in get_systems_paths():
        if (Path(p) / "data").is_dir():
            return Path(p) / "data"
    raise FileNotFoundError("aiconfigurator-core's systems/data folder")


def matched_dtype_ratio(frame: Any, dtype_column: str) -> tuple[float, int] | None:
    """Median over matched shapes of time(fp8 attention) / time(bf16 attention), both with fp8 KV.

    Shapes match on every shape column present and on the kernel (same kernel, only the dtype
    differs); None when no shape has both.
    """
    import pandas as pd

    d = frame[frame["kv_cache_dtype"] == "fp8"]
    shape = [c for c in ("model", "gemm_type", "kernel_source", "batch_size", "isl", "num_heads",
                         "num_key_value_heads", "head_dim", "window_size", "tp_size", "beam_width") if c in d.columns]
    fp8 = d[d[dtype_column] == "fp8"].groupby(shape)["latency"].median()
    bf16 = d[d[dtype_column] == "bfloat16"].groupby(shape)["latency"].median()
    both = pd.concat([fp8.rename("fp8"), bf16.rename("bf16")], axis=1).dropna()
    both = both[(both["fp8"] > 0) & (both["bf16"] > 0)]
    if both.empty:
        return None
    return float((both["fp8"] / both["bf16"]).median()), int(len(both))


@lru_cache(maxsize=32)
def attention_dtype_ratio(system: str) -> tuple[float, str] | None:
    """(ratio, source): fp8/bf16 context-attention time on `system` from AIC's perf data.

    Nearest op family first: MLA (vLLM's mla_context_module, the only database with fp8 and bf16
    MLA at the same KV dtype, latest version); where `system` has no MLA pair, SGLang's GQA context
    attention on the same system. None when neither exists.
    """
    import pandas as pd

    root = _data_root() / system
    candidates = [("MLA", "mla_dtype", sorted((root / "mla" / "vllm").glob("*/mla_context_module_perf.parquet"))),
                  ("GQA", "attn_dtype", sorted((root / "attention" / "sglang").glob("*/context_attention_perf.parquet")))]
    for family, column, files in candidates:
        for path in reversed(files):  # latest version first
            got = matched_dtype_ratio(pd.read_parquet(path), column)
            if got is not None:
                ratio, n = got
                rel = path.relative_to(root.parent)
                return ratio, f"{family} context attention, fp8/bf16 at fp8 KV, median of {n} matched shapes, AIC {rel}"
    return None


@lru_cache(maxsize=64)
def _context_mla_table(system: str, backend: str, version: str, heads: int, kv_dtype: str) -> tuple[Any, Any] | None:
    """(isl, per-layer ms) of one request's bf16 context MLA in the fallback's own database (batch 1)."""
    import numpy as np
    import pandas as pd

    folder = _data_root() / system / "mla" / backend
    path = folder / version / "context_mla_perf.parquet"
    if not path.exists():  # AIC serves a version without its own MLA files from an earlier one
        found = sorted(folder.glob("*/context_mla_perf.parquet"))
        if not found:
            return None
        path = found[-1]
    d = pd.read_parquet(path)
    d = d[(d["mla_dtype"] == "bfloat16") & (d["kv_cache_dtype"] == kv_dtype) & (d["batch_size"] == 1)
          & (d["num_heads"] == heads)]
    if d.empty:
        return None
    s = d.groupby("isl")["latency"].median().sort_index()
    return np.asarray(s.index, dtype=float), np.asarray(s.values, dtype=float)


class FallbackScaling:
    """Prefill time of a bf16-attention fallback with its MLA attention scaled by the dtype ratio."""

    def __init__(self, ratio: float, source: str, layers: int, isl: Any, per_layer_ms: Any):
        self.ratio, self.source, self.layers = float(ratio), source, int(layers)
        self._isl, self._ms = isl, per_layer_ms

    def saving_ms(self, tokens: int) -> float:
        """(1 - ratio) x layers x the context attention time of `tokens` (linear in isl, clamped)."""
        import numpy as np

        return (1.0 - self.ratio) * self.layers * float(np.interp(float(tokens), self._isl, self._ms))

    def note(self) -> str:
        return f"prefill attention time x{self.ratio:.3f} ({self.source})"


def fallback_scaling(identity: EngineIdentity, used: EngineIdentity) -> FallbackScaling | None:
    """The scaling for a fallback `identity` -> `used` (bf16 attention, KV kept), or None (off, no data)."""
    if not fallback_scaling_enabled() or used.kv_cache_dtype != identity.kv_cache_dtype:
        return None
    from aiconfigurator_core.sdk.utils import get_model_config_from_model_path

    got = attention_dtype_ratio(identity.system)
    if got is None:
        return None
    with QuietAIC():
        parsed = get_model_config_from_model_path(identity.model)
    heads = max(1, int(parsed.get("n") or 0) // max(1, identity.tp))
    kv = "bfloat16" if identity.kv_cache_dtype == "bfloat16" else "fp8"
    table = _context_mla_table(identity.system, identity.backend, identity.version, heads, kv)
    if table is None:
        return None
    return FallbackScaling(got[0], got[1], int(parsed.get("layers") or 0), *table)


def fallback_scaling_key(identity: EngineIdentity) -> str:
    """What the timing cache key must name: off, or the ratio and its source for this system."""
    if not fallback_scaling_enabled():
        return "off"
    from spica_pipeline.space.model_hw import model_facts

    if identity.attention_dtype == "bfloat16" or not model_facts(identity.model).is_mla:
        return "off"  # never a bf16-attention MLA fallback: the setting cannot change its table
    got = attention_dtype_ratio(identity.system)
    return "on:none" if got is None else f"on:{got[0]:.6f}:{got[1]}"
