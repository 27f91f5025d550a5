"""Silicon measurements (aiconfigurator-core's `systems/silicon_sample.csv`) as evaluator cases.

Each CSV row is one real benchmark: a model at a precision on a system and backend, agg or disagg,
a parallel shape, fixed ISL/OSL, a closed loop at a fixed concurrency, and the measured mean TTFT
and TPOT. This module turns a row into what our evaluator can express (an AIC model id, a flat
sample pinned to the row, a synthetic closed-loop workload) or says, in one short reason, why it
cannot. Pure: the caller reads the file and passes what AIC ships (models, perf databases).

The split rule is binding: anything fitted or tuned may use only rows of
`CALIBRATION_MODELS` (by the row's own model name); every other row is held out, reported only.
"""

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

CALIBRATION_MODELS = frozenset({
    "Qwen/Qwen3-32B",
    "meta-llama/Llama-3.1-70B",
    "meta-llama/Llama-3.1-8B-Instruct",
    "nvidia/Llama-3.1-8B-Instruct-FP8",
    "MiniMaxAI/MiniMax-M2.5",
    "Qwen/Qwen3-235B-A22B-FP8",
    "deepseek-ai/DeepSeek-R1",
    "deepseek-ai/DeepSeek-V3",
})
SPLITS = ("calibration", "heldout")
BENCH_BACKENDS = ("vllm", "sglang")  # the backends replayed; trtllm rows are counted, not replayed

# (silicon model name, precision family) -> the AIC checkpoint whose native quantization is that
# family. AIC picks GEMM/MoE/KV quantization from the checkpoint, so the checkpoint *is* the
# precision choice until the evaluator takes an explicit precision.
CHECKPOINTS: dict[tuple[str, str], str] = {
    ("Qwen/Qwen3-32B", "bf16"): "Qwen/Qwen3-32B",
    ("Qwen/Qwen3-32B", "fp8"): "Qwen/Qwen3-32B-FP8",
    ("meta-llama/Llama-3.1-70B", "bf16"): "meta-llama/Meta-Llama-3.1-70B",
    ("meta-llama/Llama-3.1-70B", "fp8"): "nvidia/Llama-3.1-70B-Instruct-FP8",
    ("meta-llama/Llama-3.1-8B-Instruct", "bf16"): "meta-llama/Meta-Llama-3.1-8B",
    ("MiniMaxAI/MiniMax-M2.5", "fp8"): "MiniMaxAI/MiniMax-M2.5",
    ("MiniMaxAI/MiniMax-M2.5", "fp4"): "nvidia/MiniMax-M2.5-NVFP4",
    ("Qwen/Qwen3-235B-A22B-FP8", "fp8"): "Qwen/Qwen3-235B-A22B-FP8",
    ("deepseek-ai/DeepSeek-R1", "fp8"): "deepseek-ai/DeepSeek-R1",
    ("deepseek-ai/DeepSeek-V3", "fp8"): "deepseek-ai/DeepSeek-V3",
    ("openai/gpt-oss-120b", "fp4"): "openai/gpt-oss-120b",  # published only as MXFP4 MoE weights
    ("Qwen/Qwen3.5-397B-A17B", "bf16"): "Qwen/Qwen3.5-397B-A17B",
    ("Qwen/Qwen3.5-397B-A17B", "fp4"): "nvidia/Qwen3.5-397B-A17B-NVFP4",
    ("moonshotai/Kimi-K2.5", "int4"): "moonshotai/Kimi-K2.5",  # native INT4 weight-only MoE
    ("moonshotai/Kimi-K2.5", "fp4"): "nvidia/Kimi-K2.5-NVFP4",
    ("zhipuai/GLM-5", "bf16"): "zai-org/GLM-5",
    ("zhipuai/GLM-5", "fp8"): "zai-org/GLM-5-FP8",
    ("zhipuai/GLM-5", "fp4"): "nvidia/GLM-5-NVFP4",
    ("nvidia/DeepSeek-V3.1-NVFP4", "fp4"): "nvidia/DeepSeek-V3.1-NVFP4",
}

_SHAPE = ("tp", "pp", "attention_dp", "moe_tp", "moe_ep")
_CSV_SHAPE = {"tp": "tp_size", "pp": "pp_size", "attention_dp": "attention_dp_size",
              "moe_tp": "moe_tp_size", "moe_ep": "moe_ep_size"}


def precision_family(precision: str, gemm_quant_mode: str = "") -> str:
    """The row's precision column as a family: '' (unquantized) is bf16."""
    p = (precision or "").strip().lower()
    if p in ("", "bf16", "fp16", "half"):
        return "bf16"
    return p


def split_of(model: str) -> str:
    return "calibration" if model in CALIBRATION_MODELS else "heldout"


@dataclass(frozen=True)
class Role:
    """One role's engine shape and pool size as the row states it (None = not stated)."""

    tp: int | None
    pp: int | None
    attention_dp: int | None
    moe_tp: int | None
    moe_ep: int | None
    workers: int | None
    batch_size: int | None


@dataclass(frozen=True)
class SiliconRow:
    """One measured row, parsed; measurements in ms."""

    id: str
    line: int
    source: str
    backend: str
    backend_version: str
    model: str
    system: str
    precision: str
    mode: str
    isl: int | None
    osl: int | None
    concurrency: int | None
    agg: Role
    prefill: Role
    decode: Role
    ttft_ms: float | None
    tpot_ms: float | None

    @property
    def split(self) -> str:
        return split_of(self.model)

    def role(self, name: str) -> Role:
        return getattr(self, name)


def _int(value: Any) -> int | None:
    text = str(value if value is not None else "").strip()
    if not text or text.lower() in ("none", "nan"):
        return None
    try:
        number = float(text)
    except ValueError:
        return None
    if not math.isfinite(number) or number != int(number):
        return None
    return int(number)


def _float(value: Any) -> float | None:
    try:
        number = float(str(value).strip())
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _concurrency(row: Mapping[str, str]) -> int | None:
    """`silicon_concurrency=N` in the source column, else `_c<N>_` in the id."""
    found = re.search(r"silicon_concurrency=(\d+)", row.get("silicon_data_source") or "")
    if found is None:
        found = re.search(r"_c(\d+)(?:_|$)", row.get("id") or "")
    return int(found.group(1)) if found else None


def _role(row: Mapping[str, str], prefix: str) -> Role:
    values = {k: _int(row.get(f"{prefix}{col}")) for k, col in _CSV_SHAPE.items()}
    return Role(**values, workers=_int(row.get(f"{prefix}num_workers")),
                batch_size=_int(row.get(f"{prefix}batch_size")))


def parse_rows(rows: Iterable[Mapping[str, str]]) -> list[SiliconRow]:
    """csv.DictReader rows -> SiliconRow (line = the file line, header is line 1)."""
    out = []
    for i, row in enumerate(rows):
        out.append(SiliconRow(
            id=row.get("id") or f"line{i + 2}", line=i + 2, source=row.get("silicon_data_source") or "",
            backend=(row.get("backend") or "").strip(), backend_version=(row.get("backend_version") or "").strip(),
            model=(row.get("model_path") or "").strip(), system=(row.get("system") or "").strip(),
            precision=precision_family(row.get("precision") or "", row.get("gemm_quant_mode") or ""),
            mode=(row.get("mode") or "").strip(), isl=_int(row.get("isl")), osl=_int(row.get("osl")),
            concurrency=_concurrency(row), agg=_role(row, ""), prefill=_role(row, "prefill_"),
            decode=_role(row, "decode_"), ttft_ms=_float(row.get("silicon_ttft_ms")),
            tpot_ms=_float(row.get("silicon_tpot_ms")),
        ))
    return out


@dataclass(frozen=True)
class Shape:
    tp: int
    pp: int
    attention_dp: int
    moe_tp: int
    moe_ep: int
    workers: int
    max_num_seqs: int

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.attention_dp * self.workers


@dataclass(frozen=True)
class SiliconCase:
    """A row the evaluator can express, with everything pinned to it."""

    row: SiliconRow
    aic_model: str
    roles: dict[str, Shape]
    note: str | None = None  # how the recorded shape was read, when not literally (a fidelity_note)

    @property
    def split(self) -> str:
        return self.row.split

    @property
    def used_gpus(self) -> int:
        return sum(s.gpus for s in self.roles.values())

    def sample(self, backend_version: str, *, max_num_batched_tokens: int = 8192, block_size: int = 64,
               memory_fraction: float = 0.9) -> dict[str, Any]:
        """The flat candidate sample (space/sample.py) for this row: round robin, static pools, no planner."""
        r = self.row
        s: dict[str, Any] = {
            "deployment_mode": r.mode, "backend": r.backend, "backend_version": backend_version,
            "model_name": self.aic_model, "hardware_sku": r.system, "gpu_budget": self.used_gpus,
            "used_gpus": self.used_gpus, "min_gpu_budget": None, "min_endpoint": None, "context_length": None,
            "startup_time": None, "aic_nextn": None, "num_g2_blocks": 0, "kv_bytes_per_token": None,
            "bandwidth_g1_to_g2_gbps": None, "bandwidth_g2_to_g1_gbps": None, "offload_batch_size": None,
            "router_mode": "round_robin", "planner_scaling_policy": "disabled",
            "enable_throughput_scaling": False, "enable_load_scaling": False,
        }
        for role, shape in self.roles.items():
            p = "" if role == "agg" else f"{role}_"
            for k in _SHAPE:
                s[f"{p}{k}"] = getattr(shape, k)
            s["replicas" if role == "agg" else f"{role}_replicas"] = shape.workers
            # a prefill pass must hold one whole prompt: never chunk below the row's ISL
            mnbt = max_num_batched_tokens if role != "prefill" else max(max_num_batched_tokens, r.isl or 0)
            s[f"{role}_max_num_batched_tokens"] = mnbt
            s[f"{role}_max_num_seqs"] = shape.max_num_seqs
            s[f"{role}_block_size"] = block_size
            s[f"{role}_gpu_memory_utilization"] = memory_fraction
            s[f"{role}_enable_prefix_caching"] = role != "decode"
        return s

    @property
    def client(self) -> str:
        return benchmark_client(self.row)

    def workload(self, num_request_ratio: float, *, client_lengths: bool = True) -> dict[str, Any]:
        """A synthetic closed loop at the row's concurrency and ISL/OSL; with `client_lengths`, each request's
        lengths drawn as the row's benchmark client drew them (`benchmark_client`)."""
        out: dict[str, Any] = {"isl": self.row.isl, "osl": self.row.osl, "concurrency": self.row.concurrency,
                               "num_request_ratio": num_request_ratio}
        if client_lengths and self.client == INFERENCEMAX and self.row.isl and self.row.osl:
            out["isl"], out["isl_jitter"] = range_ratio_lengths(self.row.isl, INFERENCEMAX_RANGE_RATIO)
            out["osl"], out["osl_jitter"] = range_ratio_lengths(self.row.osl, INFERENCEMAX_RANGE_RATIO)
        return out


# ---- the benchmark client that measured a row ------------------------------------------------------
# InferenceMAX / InferenceX (SemiAnalysis) runs every fixed-length scenario with its copy of vLLM's
# benchmark_serving.py: `--dataset-name random --random-range-ratio 0.8 --num-prompts 10c --max-concurrency c
# --request-rate inf --ignore-eos` (.github/workflows/benchmark-tmpl.yml RANDOM_RANGE_RATIO 0.8,
# benchmarks/*.sh), and draws each request's ISL and OSL uniformly among the integers in [int(0.8 L), L]
# (utils/bench_serving/benchmark_serving.py `sample_random_requests`). Its scenarios are 1k/1k, 1k/8k, 8k/1k.
# The silicon file's db-dump rows (InferenceX workflow runs), dated CSV dumps and kimi / qwen3.5 gap-analysis
# CSVs hold exactly those scenarios; the aic-auto-gap-analysis files are AIC's own runners (fixed lengths).
# Why it matters: lengths spread over 20 % let clients that started together drift apart, so a wave no longer
# prefills all c prompts at once (docs/fidelity.md, "What is measured").
INFERENCEMAX = "inferencemax"
AIC_RUNNER = "aic"
INFERENCEMAX_SCENARIOS = frozenset({(1024, 1024), (1024, 8192), (8192, 1024)})
INFERENCEMAX_RANGE_RATIO = 0.8
AIC_RUNNER_SOURCE = "aic-auto-gap-analysis"


def benchmark_client(row: SiliconRow) -> str:
    """Which client measured the row: INFERENCEMAX (range-ratio lengths) or AIC_RUNNER (fixed lengths)."""
    if AIC_RUNNER_SOURCE in row.source:
        return AIC_RUNNER
    return INFERENCEMAX if (row.isl, row.osl) in INFERENCEMAX_SCENARIOS else AIC_RUNNER


def range_ratio_lengths(length: int, ratio: float) -> tuple[int, float]:
    """A length uniform over the integers in [int(ratio x L), L] as a workload's (mean, jitter): mean x
    (1 -+ jitter) spans that range, the mean rounded and the top kept at L."""
    low = int(length * ratio)
    mean = round((low + length) / 2)
    return mean, (length - mean) / mean


# ---- the engine flags the benchmark script passed -------------------------------------------------
# InferenceX's SGLang scripts (SemiAnalysisAI/InferenceX benchmarks/[single_node/]*.sh) pass the chunk size, the
# running-request cap and the memory fraction per (model, GPU, TP), and some a scheduler receive interval: SGLang then
# polls for new requests only every N decode steps (SchedulerRecvSkipper, 0.5.6-0.5.10), a wait the replay does not
# model. A branch is listed only where every stored version of its script we could read agrees; every other row
# replays with the bench's defaults (8192 tokens, no cap, 0.9, polled every step).
SGLANG_SMALL_GPU_CHUNK = 8192  # SGLang's default --chunked-prefill-size under 160 GiB per GPU (H100, H200) ...
SGLANG_LARGE_GPU_CHUNK = 16384  # ... and above (B200, B300, GB200, GB300): ServerArgs._handle_gpu_memory_settings
_SMALL_GPUS = frozenset({"h100_sxm", "h200_sxm"})


@dataclass(frozen=True)
class ScriptFlags:
    """What a row's benchmark script passed the engine. max_running None: not passed (the engine's cap, far above
    the row's concurrency); recv_interval 1: not passed. memory_fraction is SGLang's --mem-fraction-static, which
    bounds weights and the KV pool only: the replay's fraction holds activations too, so the bench records it and
    replays its own unless asked for the script's (bench_fidelity.py --script-flags)."""

    chunk_tokens: int
    max_running: int | None
    memory_fraction: float
    recv_interval: int
    script: str

    @property
    def recv_wait_steps(self) -> float:
        """Mean decode steps a new request waits for the scheduler's next poll: a request arrives at a uniform point
        of an N-step polling cycle."""
        return (self.recv_interval - 1) / 2


def _sglang_default_chunk(system: str) -> int:
    return SGLANG_SMALL_GPU_CHUNK if system in _SMALL_GPUS else SGLANG_LARGE_GPU_CHUNK


def _polling(concurrency: int) -> int:
    """`SCHEDULER_RECV_INTERVAL`: 30 at concurrency >= 16, else 10 (the scripts that set it)."""
    return 30 if concurrency >= 16 else 10


def script_flags(row: SiliconRow) -> ScriptFlags | None:
    """The flags of the InferenceX script that measured an InferenceMAX SGLang agg row, or None (not such a row, or
    the script's versions disagree for its branch)."""
    if benchmark_client(row) != INFERENCEMAX or row.backend != "sglang" or row.mode != "agg":
        return None
    c, tp, system, p = row.concurrency or 0, row.agg.tp, row.system, row.precision
    dated = bool(re.match(r"\d{4}_\d\d_\d\d_", row.id))  # the dated dumps lie in the scripts' window
    if row.model in ("deepseek-ai/DeepSeek-R1", "deepseek-ai/DeepSeek-V3") and p == "fp8" and (row.agg.attention_dp or 1) <= 1:
        if system in ("b200_sxm", "b300_sxm"):
            if tp == 8 and c <= 64:  # dsr1_fp8_{b200,b300}.sh TP8 (conc 4-64; only the MTP config runs above 64)
                return ScriptFlags(32768, 128, 0.82, _polling(c), f"dsr1_fp8_{system[:4]}.sh TP8")
            if tp == 4 and (row.isl, row.osl) == (8192, 1024):  # the TP4 branch runs 8k/1k only
                return ScriptFlags(8192, 32, 0.95, 10, f"dsr1_fp8_{system[:4]}.sh TP4")
        if system == "h200_sxm" and tp == 8:  # dsr1_fp8_h200.sh: no receive interval
            return ScriptFlags(32768, 512 if (row.isl, row.osl) == (1024, 1024) else 256, 0.82, 1,
                               "dsr1_fp8_h200.sh TP8")
        return None
    if row.model == "zhipuai/GLM-5" and tp == 8 and (row.agg.attention_dp or 1) <= 1:
        if p == "fp8" and system in ("b200_sxm", "b300_sxm"):  # glm5_fp8_{b200,b300}.sh TP-only branch
            return ScriptFlags(32768, c, 0.85, 1, f"glm5_fp8_{system[:4]}.sh TP8")
        if p == "fp8" and system == "h200_sxm":  # glm5_fp8_h200.sh passes the memory fraction only
            return ScriptFlags(_sglang_default_chunk(system), None, 0.85, 1, "glm5_fp8_h200.sh TP8")
        if p == "fp4" and system == "b200_sxm" and c > 4:  # glm5_nvfp4_b200.sh (glm5_fp4_b200.sh ran conc 4 only)
            return ScriptFlags(131072, c, 0.80, 1, "glm5_nvfp4_b200.sh TP8")
        return None
    if row.model == "Qwen/Qwen3.5-397B-A17B":
        if p == "bf16" and system == "b200_sxm" and tp == 8 and dated:  # PR #758's recipe; the first one differed
            return ScriptFlags(32768, 128, 0.82, _polling(c), "qwen3.5_bf16_b200.sh TP8")
        if p == "bf16" and system == "b300_sxm" and tp in (4, 8):
            return ScriptFlags(32768, 128, 0.82, _polling(c), f"qwen3.5_bf16_b300.sh TP{tp}")
        if p == "fp4" and system == "b200_sxm" and tp == 4:
            return ScriptFlags(32768, 128, 0.85, _polling(c), "qwen3.5_fp4_b200.sh TP4")
        if p == "fp4" and system == "b300_sxm" and tp == 4:
            return ScriptFlags(32768, 128, 0.80, _polling(c), "qwen3.5_fp4_b300.sh TP4")
    return None


def with_script_flags(case: "SiliconCase", flags: ScriptFlags) -> "SiliconCase":
    """The case with the script's running-request cap on every role's max_num_seqs."""
    from dataclasses import replace

    cap = flags.max_running
    return case if cap is None else _replace_roles(case, lambda s: replace(s, max_num_seqs=min(s.max_num_seqs, cap)))


@dataclass(frozen=True)
class Inexpressible:
    row: SiliconRow
    reason: str


def _resolve_shape(role: Role, *, moe: bool, default_workers: int | None, concurrency: int,
                   name: str) -> Shape | str:
    """A complete shape, or the reason it is not one. MoE widths are inferred as AIC does."""
    tp, pp, dp = role.tp or None, role.pp or 1, role.attention_dp or 1
    if tp is None:
        return f"{name} tp_size missing"
    workers = role.workers if role.workers else default_workers
    if not workers:
        return f"{name} worker count missing"
    moe_tp, moe_ep = 1, 1
    if moe:
        width = tp * dp
        mt, me = role.moe_tp or None, role.moe_ep or None
        if mt is None and me is None:
            return f"{name} MoE shape missing (moe_tp_size and moe_ep_size)"
        if mt is None and me is not None:
            mt = width // me if width % me == 0 else None
        if me is None and mt is not None:
            me = width // mt if width % mt == 0 else None
        if mt is None or me is None or mt * me != width:
            return f"{name} MoE shape moe_tp={role.moe_tp} x moe_ep={role.moe_ep} does not match tp x dp = {width}"
        moe_tp, moe_ep = mt, me
    # engines cap running requests per attention-DP rank, and the row's batch size is per rank
    # (agg: batch x attention_dp == concurrency on every row that states both); a prefill
    # worker's batch is AIC's prefill-pass batch, not a cap on queued prompts
    per_rank_load = max(1, math.ceil(concurrency / (workers * dp)))
    seqs = role.batch_size if (role.batch_size and name != "prefill") else per_rank_load
    return Shape(tp, pp, dp, moe_tp, moe_ep, workers, seqs)


def map_row(row: SiliconRow, *, models: Iterable[str], databases: Mapping[str, Mapping[str, Any]],
            is_moe: Callable[[str], bool], backends: Iterable[str] = BENCH_BACKENDS) -> SiliconCase | Inexpressible:
    """Map one row to a case, or explain (one line) why the evaluator cannot express it.

    models: AIC's shipped model ids; databases: {system: {backend: [versions]}} with perf data;
    is_moe: whether an AIC model id is MoE (its MoE shape then has to be complete).
    """
    if row.backend not in tuple(backends):
        return Inexpressible(row, f"backend {row.backend or '?'} is outside the bench scope ({', '.join(backends)})")
    if row.mode not in ("agg", "disagg"):
        return Inexpressible(row, f"mode {row.mode!r} is neither agg nor disagg")
    if not databases.get(row.system, {}).get(row.backend):
        return Inexpressible(row, f"no AIC perf database for {row.backend} on {row.system}")
    aic_model = CHECKPOINTS.get((row.model, row.precision))
    if aic_model is None:  # never a checkpoint at another precision: that would measure something else
        return Inexpressible(row, f"no AIC checkpoint for {row.model} at {row.precision}")
    if aic_model not in set(models):
        return Inexpressible(row, f"AIC does not ship {aic_model}")
    if not row.isl or not row.osl:
        return Inexpressible(row, "ISL/OSL missing")
    if not row.concurrency:
        return Inexpressible(row, "concurrency missing")
    if row.ttft_ms is None or row.tpot_ms is None or row.ttft_ms <= 0 or row.tpot_ms <= 0:
        return Inexpressible(row, "silicon TTFT/TPOT missing")
    moe = is_moe(aic_model)
    roles: dict[str, Shape] = {}
    names = ("agg",) if row.mode == "agg" else ("prefill", "decode")
    for name in names:
        shape = _resolve_shape(row.role(name), moe=moe, default_workers=1 if name == "agg" else None,
                               concurrency=row.concurrency, name=name)
        if isinstance(shape, str):
            return Inexpressible(row, shape)
        roles[name] = shape
    twins = {k: _ep_twin(s) for k, s in roles.items()} if row.backend == "vllm" else {}
    if not any(twins.values()):
        return SiliconCase(row, aic_model, roles)
    return SiliconCase(row, aic_model, {k: twins[k] or s for k, s in roles.items()}, EP_TWIN_NOTE)


# vLLM rows recorded with attention_dp = tp > 1 and moe_ep = tp x dp measure the same deployment as
# their twin rows with tp GPUs, no attention DP and moe_ep = tp: 55 calibration twin pairs (MiniMax-M2.5,
# both sources) agree within 1.5 % on TPOT in 53
EP_TWIN_NOTE = ("the row's attention_dp = tp with moe_ep = tp x dp is read as its twin deployment: tp GPUs, "
                "no attention DP, experts expert-parallel over tp (the twins' silicon numbers agree)")


def _ep_twin(shape: Shape) -> Shape | None:
    """The twin reading of a vLLM role shape recorded as tp = attention_dp > 1, moe_ep = tp x dp, else None."""
    tp, dp = shape.tp, shape.attention_dp
    if dp <= 1 or dp != tp or shape.moe_tp != 1 or shape.moe_ep != tp * dp:
        return None
    return Shape(tp, shape.pp, 1, 1, tp, shape.workers, shape.max_num_seqs * dp)


def reason_kind(reason: str) -> str:
    """The reason without row-specific numbers, for counting."""
    return re.sub(r"\d+", "N", reason)


# ---- nearest expressible deployment for a measured row AIC refuses ------------------------------
# A silicon row ran, so a refusal by AIC's shape or memory model means the row's recorded shape is
# not how the engine really ran it (or AIC's memory model is stricter than the engine). The bench
# then replays the nearest deployment the engine could have run, and records a fidelity_note;
# never silently. Rules, in order (bench/bench_fidelity.py tries each until one builds):
MEMORY_FRACTIONS = (0.95, 0.98)  # vLLM/SGLang accept up to ~0.98 of HBM; the row's own value is not recorded
_MOE_SPLIT = "Invalid quantized MoE configuration"
_NO_KV = "no KV budget"
_HEADS = "should be divisible by tp_size"


def _replace_roles(case: SiliconCase, change: Callable[[Shape], Shape]) -> SiliconCase:
    return SiliconCase(case.row, case.aic_model, {k: change(v) for k, v in case.roles.items()}, case.note)


def nearest_deployments(case: SiliconCase, reason: str) -> list[tuple[SiliconCase, float, str]]:
    """(case, memory fraction, fidelity_note) to try, nearest first, for a row AIC refused with `reason`.

    * a block-quantized MoE split AIC (and the engine) refuse across moe_tp: the engine must have
      run the experts expert-parallel (moe_ep = moe_tp x moe_ep, moe_tp 1);
    * a TP that does not divide the attention heads: SGLang's `--tp N --enable-dp-attention`
      convention (N ranks of attention DP, one GPU each, experts across all N);
    * no KV budget at the default memory fraction for a shape that ran: a higher fraction (then,
      for a MoE split over moe_tp, expert parallel).
    """
    from dataclasses import replace

    ep = _replace_roles(case, lambda s: replace(s, moe_tp=1, moe_ep=s.moe_tp * s.moe_ep))
    ep_note = ("the row's MoE split (moe_tp) is one AIC refuses for block-quantized experts; replayed "
               "expert-parallel (moe_ep = moe_tp x moe_ep)")
    shapes: list[tuple[SiliconCase, str]] = []
    if _MOE_SPLIT in reason and ep != case:
        shapes.append((ep, ep_note))
    if _HEADS in reason:
        dp = _replace_roles(case, lambda s: replace(s, tp=1, attention_dp=s.tp * s.attention_dp, moe_tp=1,
                                                     moe_ep=s.tp * s.attention_dp))
        shapes.append((dp, "the row's TP does not divide the attention heads; replayed as SGLang's DP-attention "
                           "convention (attention_dp = tp, one GPU per rank, experts expert-parallel)"))
    if _NO_KV in reason:
        shapes.append((case, ""))
        if ep != case:
            shapes.append((ep, ep_note))
    out: list[tuple[SiliconCase, float, str]] = []
    seen: set[tuple[int, float]] = set()
    for shape, note in shapes:
        for frac in (0.9, *MEMORY_FRACTIONS):
            if (shape is case and frac == 0.9) or (id(shape), frac) in seen:
                continue
            seen.add((id(shape), frac))
            mem = f"AIC's memory model leaves no KV budget at memory fraction 0.9; replayed at {frac}" \
                if frac != 0.9 else ""
            out.append((shape, frac, "; ".join(x for x in (note, mem) if x)))
    return out
