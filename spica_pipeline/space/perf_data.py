"""Can aiconfigurator-core's perf data time an engine identity, and with which substitution?

AIC's perf databases do not cover every (backend, attention dtype) pair: SGLang's H200 data, for
example, has MLA attention only in bf16, so DeepSeek-V3 (fp8 attention and KV by default) fails
with `PerfDataNotAvailableError: context MLA data missing for ContextKey { fmha_quant: "fp8",
kv_quant: "fp8" }`. The nearest available data is bf16 attention: first the attention compute
alone, then attention and KV together (timing only; the KV capacity keeps the real KV dtype).
Every substitution comes back as a `fidelity_note`; nothing is substituted silently.

Some data is there but not usable: vLLM's fp8_block GEMM collection is flat in the token count on
the systems in `GEMM_PER_TENSOR` (a 4096x4096 GEMM 0.16-0.30 ms from 1 to 8,192 tokens on B200/B300,
where per-tensor fp8 and the SGLang/TRT-LLM DeepGEMM fp8_block collections take ~0.01 ms at <= 64),
so an fp8_block checkpoint's dense GEMMs are timed with the per-tensor fp8 data there (the MoE keeps
its own data), chosen per system on calibration rows (docs/fidelity.md, `GEMM_PER_TENSOR`).

`timed_model` is the one routine for this: the timing tables (evaluate/timing.py) and the backend
check before sampling (space/branches.py) both build their AIC model through it.
"""

import re
from collections.abc import Callable
from dataclasses import replace
from functools import lru_cache
from typing import Any

from spica_pipeline.errors import PerfModelError
from spica_pipeline.space.engine import EngineIdentity
from spica_pipeline.space.model_hw import QuietAIC, checkpoint_quant

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


# (backend, system) whose fp8_block dense-GEMM data is replaced by the per-tensor fp8 data, chosen per
# system on the calibration split's fp8_block checkpoints on vLLM (MiniMax-M2.5, Qwen3-235B-A22B-FP8):
# listed where the per-tensor data cuts the replayed TPOT error on those rows by far (docs/fidelity.md).
# h200 keeps its own data: there the substitution gains little TPOT and makes calibrated TTFT worse.
GEMM_PER_TENSOR: frozenset[tuple[str, str]] = frozenset({("vllm", "b200_sxm"), ("vllm", "b300_sxm"),
                                                          ("vllm", "h100_sxm")})


def gemm_substitute(identity: EngineIdentity) -> EngineIdentity | None:
    """The identity timed instead of `identity` when its dense GEMMs are fp8_block on a (backend,
    system) of GEMM_PER_TENSOR (None: timed as is). The MoE dtype is left to the checkpoint."""
    if (identity.backend, identity.system) not in GEMM_PER_TENSOR:
        return None
    gemm = identity.weight_dtype or checkpoint_quant(identity.model)
    return replace(identity, weight_dtype="fp8") if gemm == "fp8_block" else None


def gemm_note(identity: EngineIdentity) -> str:
    """One line for the trial: which data was not used, and what timed the GEMMs instead."""
    return (f"{identity.backend} {identity.version} fp8_block GEMM data on {identity.system} is flat in the token "
            f"count (a measurement floor); dense GEMMs timed with the per-tensor fp8 data")


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
    substitute = gemm_substitute(identity)
    if substitute is not None:
        model, note, used = _attention_timed(substitute, build, probe)
        return model, "; ".join(n for n in (gemm_note(identity), note) if n), used
    return _attention_timed(identity, build, probe)


def _attention_timed(identity: EngineIdentity, build: Callable[[EngineIdentity], Any],
                     probe: Callable[[Any], None]) -> tuple[Any, str | None, EngineIdentity]:
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
