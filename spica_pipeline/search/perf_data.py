"""Can aiconfigurator-core's perf data time an engine identity, and with which substitution?

AIC's perf databases do not cover every (backend, attention dtype) pair: SGLang's H200 data, for
example, has MLA attention only in bf16, so DeepSeek-V3 (fp8 attention and KV by default) fails
with `PerfDataNotAvailableError: context MLA data missing for ContextKey { fmha_quant: "fp8",
kv_quant: "fp8" }`. The nearest available data is bf16 attention: first the attention compute
alone, then attention and KV together (timing only; the KV capacity keeps the real KV dtype).
Every substitution comes back as a `fidelity_note`; nothing is substituted silently.

`timed_model` is the one routine for this: the timing tables (resources/timing.py) and the backend
check before sampling (search/branches.py) both build their AIC model through it.
"""

import re
from collections.abc import Callable
from dataclasses import replace
from functools import lru_cache
from typing import Any

from spica_pipeline.errors import PerfModelError
from spica_pipeline.search.engine_args import EngineIdentity
from spica_pipeline.search.model_hw import QuietAIC

_MISSING_ATTENTION = re.compile(r"(context|generation) (MLA|attention)[\w ]* data missing")
_KEY = re.compile(r'fmha_quant: "(\w+)", kv_quant: "(\w+)"')
PROBE_TOKENS = 1024
# AIC's "the perf database has nothing for this" errors (by name: AIC is imported lazily)
NO_DATA_ERRORS = frozenset({"PerfDataNotAvailableError", "MissingSystemFlopsError",
                            "InterpolationDataNotAvailableError"})


def is_missing_data(exc: BaseException | None) -> bool:
    """AIC has no perf data for it (as opposed to a bad shape or a bug): the backend cannot serve it."""
    return exc is not None and type(exc).__name__ in NO_DATA_ERRORS


def is_missing_attention_data(exc: BaseException) -> bool:
    """AIC's 'no attention data for this dtype' refusal (the case a bf16 fallback can serve)."""
    return type(exc).__name__ == "PerfDataNotAvailableError" and bool(_MISSING_ATTENTION.search(str(exc)))


def attention_fallbacks(identity: EngineIdentity) -> list[EngineIdentity]:
    """The nearest identities with bf16 attention data, nearest first (empty when already bf16)."""
    out = []
    if identity.attention_dtype != "bfloat16":
        out.append(replace(identity, attention_dtype="bfloat16"))
    if identity.kv_cache_dtype != "bfloat16":
        out.append(replace(identity, attention_dtype="bfloat16", kv_cache_dtype="bfloat16"))
    return out


def fallback_note(identity: EngineIdentity, used: EngineIdentity, exc: BaseException) -> str:
    """One line: what data was missing and what was used instead."""
    what = _MISSING_ATTENTION.search(str(exc))
    key = _KEY.search(str(exc))
    missing = f"{what.group(2)} attention" if what else "attention"
    dtypes = f" (fmha {key.group(1)}, kv {key.group(2)})" if key else ""
    instead = "bf16 attention" if used.kv_cache_dtype == identity.kv_cache_dtype else "bf16 attention and bf16 KV"
    return (f"{identity.backend} {identity.version} perf data on {identity.system} has no {missing} data{dtypes} "
            f"for {identity.model}; timed with the nearest available data: {instead}")


def timed_model(identity: EngineIdentity, build: Callable[[EngineIdentity], Any],
                probe: Callable[[Any], None]) -> tuple[Any, str | None]:
    """(model, fidelity_note): `build(identity)` checked by `probe(model)`, or the nearest fallback.

    Raises the original error when no fallback serves it (or it is not a missing-attention case).
    """
    model, note, _ = timed_model_used(identity, build, probe)
    return model, note


def timed_model_used(identity: EngineIdentity, build: Callable[[EngineIdentity], Any],
                     probe: Callable[[Any], None]) -> tuple[Any, str | None, EngineIdentity]:
    """`timed_model` plus the identity whose data was used (`identity` itself when exact)."""
    try:
        model = build(identity)
        probe(model)
        return model, None, identity
    except Exception as first:
        if not is_missing_attention_data(first):
            raise
        for candidate in attention_fallbacks(identity):
            try:
                model = build(candidate)
                probe(model)
            except Exception as exc:
                if is_missing_attention_data(exc):
                    continue
                raise
            return model, fallback_note(identity, candidate, first), candidate
        raise first


def aic_model(identity: EngineIdentity) -> Any:
    """aiconfigurator-core's strict forward-pass model of one identity."""
    from aiconfigurator_core.sdk.rust_engine_step import RustForwardPassPerfModel

    with QuietAIC():
        return RustForwardPassPerfModel.from_native(identity.aic_config())


def estimate_ms(model: Any, **scheduled: int) -> float:
    """One forward pass in ms; raises when AIC has no finite, positive estimate."""
    with QuietAIC():
        value = model.estimate_forward_pass_time_ms({"version": 1, "wall_time": 0.0, "scheduled_requests": scheduled})
    if value is None or not value == value or value in (float("inf"), float("-inf")) or value <= 0:
        raise RuntimeError(f"aiconfigurator-core has no estimate for {scheduled}: {value!r}")
    return float(value)


def probe_passes(model: Any) -> None:
    """One prefill and one decode pass: where AIC reports missing perf data."""
    estimate_ms(model, num_prefill_requests=1, sum_prefill_tokens=PROBE_TOKENS, sum_prefill_kv_tokens=0)
    estimate_ms(model, num_decode_requests=1, sum_decode_kv_tokens=PROBE_TOKENS)


@lru_cache(maxsize=256)
def check_timing(identity: EngineIdentity) -> str | None:
    """The fidelity note of timing `identity` (None: exact data); PerfModelError when AIC cannot at all."""
    try:
        return timed_model(identity, aic_model, probe_passes)[1]
    except (ValueError, RuntimeError) as exc:
        raise PerfModelError.wrap(exc) from exc


# --- fidelity round 5: the bf16 fallback's prefill attention, scaled by a perf-database dtype ratio ---
#
# The fallback above times fp8-attention MLA models with bf16 attention data. AIC's perf databases
# measure fp8 against bf16 attention (at the same KV dtype) for some op families; their matched-shape
# time ratio is the substitution's expected speed difference. Generation attention has no fp8 data
# in any of AIC's databases, so only prefill is scaled. Off unless SPICA_FALLBACK_ATTENTION_SCALING=1
# (bench_fidelity.FALLBACK_SCALING_RULE decides the default; the timing cache key names the setting).
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
    from spica_pipeline.search.model_hw import model_facts

    if identity.attention_dtype == "bfloat16" or not model_facts(identity.model).is_mla:
        return "off"  # never a bf16-attention MLA fallback: the setting cannot change its table
    got = attention_dtype_ratio(identity.system)
    return "on:none" if got is None else f"on:{got[0]:.6f}:{got[1]}"
