"""Per-candidate replay fidelity: AIC step timing as a `dynamo_profile` NPZ, and KV capacity.

The replay's default polynomial timing is model/GPU/TP-agnostic and inverts candidate rankings
(replay-notes §2d), so every engine identity (model, system, backend, version, tp, pp, attention_dp,
moe_tp, moe_ep, nextn, and the weight / MoE / attention / KV dtypes) gets its own table tabulated from aiconfigurator-core's forward-pass model:

* prefill: latency of one pass over the total new tokens in it (every 32 tokens up to the largest
  chunk budget), linear interpolation in the replay;
* decode: latency over (sum of context of the batch, mean context) on a log grid, bilinear;
  fractional batch sizes are interpolated between integer AIC calls.

The replay floors a decode step at 1 ms *before* dividing by `speedup_ratio`, so tables are stored
x`TIME_SCALE` and the engine args must carry `speedup_ratio=TIME_SCALE` (`TimingTable.speedup_ratio`).

KV capacity per rank (AIC `estimate_kv_cache`) gives the explicit `num_gpu_blocks` (the replay
silently uses 16384 otherwise) and the KV bytes per token for disagg transfer delays.

Both are cached on disk under `cache_dir` keyed by a content hash of the identity plus
`FORMAT_VERSION` and the aiconfigurator-core version, written atomically (temp file + rename) so
concurrent workers never see a torn file, and memoised in-process.

Known limits of the NPZ route (what a per-step AIC callback would add):
(i) attention over cached prefix / earlier chunks is ignored (AIC: +8/+25/+106 % for a 2k prefill
    behind 2k/8k/32k of prefix);
(ii) a prefill pass with several requests is charged as one request of the summed length (<= 10 %
    high);
(iii) mixed agg passes are charged prefill + decode, 4-6 % above AIC's fused mixed step;
(iv) pipeline parallelism is not pipelined: PP changes capacity and GPU count, not pass latency;
(v) attention-DP ranks are modeled as independent schedulers (`dp_size`) each with this table;
(vi) a speculative engine (nextn k > 0) is timed as AIC times it: the draft layers scale the pass
     ((L + k) / L) and a decode pass verifies k + 1 tokens per request (`verify_width`); the prompt's
     pass through the draft layers is not charged (AIC scales only its generation ops). The replay then
     yields the accepted tokens of each step (evaluate/engine_args.py).
"""

import hashlib
import io
import json
import math
import os
import threading
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from spica_pipeline.errors import InfeasibleKVCapacity, ModelHardwareError
from spica_pipeline.space import perf_data
from spica_pipeline.space.engine import EngineIdentity, KvCapacity
from spica_pipeline.space.kv import estimate_kv
from spica_pipeline.space.model_hw import model_facts
from spica_pipeline.storage import atomic_write_bytes, atomic_write_text, default_cache_dir

FORMAT_VERSION = 2  # 2: precision dtypes in the identity, fidelity note beside each table
TIME_SCALE = 10.0
PREFILL_STEP = 32
PREFILL_MIN_TOP = 32768
DECODE_MAX_KV_TOKENS = 8_000_000
DECODE_MAX_CONTEXT = 262_144
DECODE_MAX_BATCH = 4096
N_KV, N_CTX = 56, 48

_lock = threading.Lock()
_timing_memo: dict[str, "TimingTable"] = {}
_kv_memo: dict[str, "KvCapacity"] = {}
_models: dict[str, Any] = {}  # identity -> (AIC model, fidelity note)


def _aic_version() -> str:
    try:
        from importlib.metadata import version

        return version("aiconfigurator-core")
    except Exception:
        return "unknown"


def _aic_systems_paths() -> list[str]:
    """Where AIC reads perf data from (AICONFIGURATOR_SYSTEMS_PATH or its bundled data), resolved."""
    import aiconfigurator_core
    from aiconfigurator_core.sdk.perf_database import get_systems_paths

    bundled = str(Path(aiconfigurator_core.__file__).parent)  # the same data in every venv
    return [str(p).replace(bundled, "<aiconfigurator_core>") for p in get_systems_paths()]


def _digest(kind: str, identity: dict[str, Any]) -> str:
    """Content key of a cached table: every input that changes it, incl. AIC's version and data path."""
    payload = json.dumps({"kind": kind, "format": FORMAT_VERSION, "aic": _aic_version(),
                          "aic_systems_paths": _aic_systems_paths(), **identity},
                         sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


@dataclass(frozen=True)
class TimingTable:
    """A cached NPZ and how the engine args must reference it."""

    path: str
    speedup_ratio: float
    key: str
    fidelity_note: str | None = None  # substitute perf data used (space/perf_data.py), else None

    def timing_model(self) -> dict[str, Any]:
        return {"type": "external", "provider": "dynamo_profile", "config": {"path": self.path}}


def _model_key(identity: EngineIdentity) -> str:
    """In-process memo key of a built AIC model: the identity and its GEMM data setting."""
    return json.dumps({**asdict(identity), "gemm_data": gemm_data_key(identity)}, sort_keys=True)


def gemm_data_key(identity: EngineIdentity) -> str:
    """What a cache key must name about the dense GEMM data (search/perf_data.GEMM_PER_TENSOR)."""
    return "own" if perf_data.gemm_substitute(identity) is None else "fp8_per_tensor"


class _AicStep:
    """One identity's forward-pass model; raises on a missing estimate instead of tabulating NaN.

    Built through `perf_data.timed_model`, so missing attention data falls back to the nearest
    available (bf16) data and `fidelity_note` says so.
    """

    def __init__(self, identity: EngineIdentity):
        key = _model_key(identity)
        built = _models.get(key)
        if built is None:
            model, note = perf_data.timed_model(identity, perf_data.aic_model, perf_data.probe_passes)
            built = (model, note)
            _models[key] = built
        self._model, note = built
        self.fidelity_note: str | None = note
        self._decode_memo: dict[tuple[int, int], float] = {}
        self._verify = verify_width(identity)

    def _est(self, **scheduled: int) -> float:
        return perf_data.estimate_ms(self._model, **scheduled)

    def prefill(self, new_tokens: int) -> float:
        return self._est(num_prefill_requests=1, sum_prefill_tokens=int(new_tokens), sum_prefill_kv_tokens=0)

    def decode(self, batch: int, context: int) -> float:
        key = (int(batch), int(context))
        value = self._decode_memo.get(key)
        if value is None:  # the clamped grid corners repeat the same (batch, context) many times
            rows = key[0] * self._verify  # a speculative step verifies k + 1 tokens of every request
            value = self._est(num_decode_requests=rows, sum_decode_kv_tokens=rows * key[1])
            self._decode_memo[key] = value
        return value

    def decode_frac(self, batch: float, context: int) -> float:
        batch = min(max(1.0, batch), float(DECODE_MAX_BATCH))
        lo = math.floor(batch)
        w = batch - lo
        if w < 1e-9:
            return self.decode(lo, context)
        return (1 - w) * self.decode(lo, context) + w * self.decode(lo + 1, context)


def verify_width(identity: EngineIdentity) -> int:
    """Tokens per request one decode pass runs: 1, or k + 1 for k draft tokens (the target verifies the
    k drafts and samples one more). aiconfigurator-core's forward-pass estimate scales the draft layers in
    ((L + k) / L) but takes its decode rows as given, so the table asks for (k + 1) rows per request, each
    over the request's context: AIC's own static generation step (EngineHandle.decode_step_latency with
    nextn k) is exactly that pass."""
    return int(identity.nextn or 0) + 1


def timing_grid() -> list[float]:
    """The tabulation constants: a table built with other ones is a different table."""
    return [TIME_SCALE, PREFILL_STEP, PREFILL_MIN_TOP, DECODE_MAX_KV_TOKENS, DECODE_MAX_CONTEXT, DECODE_MAX_BATCH,
            N_KV, N_CTX]


def prefill_grid(max_num_batched_tokens: int) -> np.ndarray:
    top = max(int(max_num_batched_tokens), PREFILL_MIN_TOP)
    return np.unique(np.concatenate([[1, 2, 4, 8, 16], np.arange(PREFILL_STEP, top + 1, PREFILL_STEP), [top]]))


def build_timing_arrays(identity: EngineIdentity, max_num_batched_tokens: int) -> dict[str, np.ndarray]:
    """The NPZ arrays (already x TIME_SCALE) for one identity."""
    step = _AicStep(identity)
    p_x = prefill_grid(max_num_batched_tokens).astype(float)
    p_y = np.array([step.prefill(int(t)) for t in p_x])
    kv = np.unique(np.concatenate([[1.0], np.geomspace(16, DECODE_MAX_KV_TOKENS, N_KV)]).round())
    ctx = np.unique(np.geomspace(1, DECODE_MAX_CONTEXT, N_CTX).round())
    itl = np.empty((len(kv), len(ctx)))
    for i, x in enumerate(kv):
        for j, y in enumerate(ctx):
            itl[i, j] = step.decode_frac(x / y, int(max(1, min(y, x))))
    return {
        "prefill_isl": p_x, "prefill_ttft_ms": p_y * TIME_SCALE,
        "decode_active_kv_tokens": kv, "decode_context_length": ctx, "decode_itl": itl * TIME_SCALE,
    }


def fidelity_note_of(identity: EngineIdentity) -> str | None:
    """The substitution `_AicStep` made for this identity in this process (None: exact data or not built)."""
    built = _models.get(_model_key(identity))
    return built[1] if built is not None else None


def timing_table(identity: EngineIdentity, *, max_num_batched_tokens: int = 8192,
                 cache_dir: str | os.PathLike | None = None) -> TimingTable:
    """The cached NPZ for `identity`, building it on first use (about a second, then milliseconds).

    Tables span at least `PREFILL_MIN_TOP` tokens so the searched chunk budgets share one table.
    """
    top = max(int(max_num_batched_tokens), PREFILL_MIN_TOP)
    verify = {"verify_width": verify_width(identity)} if identity.nextn else {}  # keys without drafts unchanged
    key = _digest("timing", {**asdict(identity), "prefill_top": top, "grid": timing_grid(),
                             "gemm_data": gemm_data_key(identity), **verify})
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    path = root / "timing" / f"{key}.npz"
    meta = path.with_suffix(".json")
    memo = _timing_memo.get(str(path))
    if memo is not None and path.exists():
        return memo
    if not path.exists():
        with _build_lock(path):  # concurrent workers wanting the same identity build it once
            if not path.exists():
                arrays: dict[str, Any] = build_timing_arrays(identity, top)
                note = fidelity_note_of(identity)
                buf = io.BytesIO()
                np.savez(buf, **arrays)
                # the note first: a table on disk always has its note beside it
                atomic_write_text(meta, json.dumps({"fidelity_note": note}))
                atomic_write_bytes(path, buf.getvalue())
    table = TimingTable(path=str(path), speedup_ratio=TIME_SCALE, key=key, fidelity_note=_read_note(meta))
    with _lock:
        _timing_memo[str(path)] = table
    return table


def _read_note(meta: Path) -> str | None:
    try:
        note = json.loads(meta.read_text()).get("fidelity_note")
    except (OSError, ValueError, AttributeError):
        return None
    return str(note) if note else None


@contextmanager
def _build_lock(path: Path):
    """An advisory per-file lock (POSIX); the atomic rename alone already keeps files whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # non-POSIX: duplicate builds are wasteful but safe
        yield
        return
    with open(path.with_suffix(path.suffix + ".lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def kv_capacity(identity: EngineIdentity, *, max_num_tokens: int, max_batch_size: int, memory_fraction: float,
                cache_dir: str | os.PathLike | None = None) -> KvCapacity:
    """Per-rank KV capacity for the identity and the candidate's own batching/memory knobs.

    Raises InfeasibleKVCapacity when the weights leave no KV budget.
    """
    ident = {**asdict(identity), "max_num_tokens": int(max_num_tokens), "max_batch_size": int(max_batch_size),
             "memory_fraction": float(memory_fraction)}
    key = _digest("kv", ident)
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    path = root / "kv" / f"{key}.json"
    memo = _kv_memo.get(str(path))
    if memo is not None:
        return memo
    cap: KvCapacity | None = None
    if path.exists():
        try:
            data = json.loads(path.read_text())
            if "infeasible" in data:
                raise InfeasibleKVCapacity(data["infeasible"])
            cap = KvCapacity(int(data["tokens_per_rank"]), int(data["bytes_per_token"]))
        except (ValueError, KeyError, TypeError):
            cap = None  # a foreign or stale file: recompute and overwrite
    if cap is None:
        try:
            cap = _estimate_kv(identity, int(max_num_tokens), int(max_batch_size), float(memory_fraction))
        except InfeasibleKVCapacity as exc:
            atomic_write_text(path, json.dumps({"infeasible": str(exc)}))
            raise
        atomic_write_text(path, json.dumps(asdict(cap)))
    with _lock:
        _kv_memo[str(path)] = cap
    return cap


def _estimate_kv(identity: EngineIdentity, max_num_tokens: int, max_batch_size: int,
                 memory_fraction: float) -> KvCapacity:
    i = identity
    tokens, bytes_per_token = estimate_kv(
        i.model, i.system, i.backend, i.version, (i.tp, i.pp, i.attention_dp, i.moe_tp, i.moe_ep),
        max_num_tokens=max_num_tokens, max_batch_size=max_batch_size, memory_fraction=memory_fraction,
        nextn=i.nextn, precision=i.quant_modes(),
    )
    return KvCapacity(tokens, bytes_per_token)


def model_context_length(model: str) -> int | None:
    """The model's max context from AIC's shipped config (None when unknown)."""
    try:
        return model_facts(model).max_context_length
    except ModelHardwareError:
        return None


def table_estimators(path: str | os.PathLike):
    """(prefill_ms(tokens), decode_ms(batch, context)) read back from a cached NPZ, unscaled.

    The same interpolation the replay applies (linear prefill, bilinear decode over (sum of
    context, mean context)), for cheap a-priori estimates such as a closed loop's request cycle.
    """
    with np.load(path) as npz:
        p_x, p_y = npz["prefill_isl"], npz["prefill_ttft_ms"] / TIME_SCALE
        kv, ctx, itl = npz["decode_active_kv_tokens"], npz["decode_context_length"], npz["decode_itl"] / TIME_SCALE

    def prefill_ms(tokens: int) -> float:
        return float(np.interp(float(tokens), p_x, p_y))

    def decode_ms(batch: int, context: int) -> float:
        x, y = float(batch) * float(context), float(context)
        per_ctx = np.array([np.interp(x, kv, itl[:, j]) for j in range(len(ctx))])
        return float(np.interp(y, ctx, per_ctx))

    return prefill_ms, decode_ms
