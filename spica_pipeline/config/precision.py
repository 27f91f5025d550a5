"""`search_space.precision`: weight / MoE / attention / KV-cache quantization, pinned, in AIC's modes.

Unset fields mean "the checkpoint's own precision" (what aiconfigurator-core reads from the model
config; a quantized checkpoint such as `Qwen/Qwen3-32B-FP8` is chosen by `model_name`). A set field
changes the timing table and the KV capacity of every candidate, and travels in the candidate as a
`precision_<field>` key (ledger, report, deploy output).

The names are aiconfigurator-core 0.12.0's quant modes that its forward-pass model and its KV
estimator both accept under the same name (tests/test_precision.py checks them against AIC).
"""

from typing import Any

from pydantic import field_validator

from spica_pipeline.config.types import StrictModel

# field -> the choices, in AIC's names; the compute dtype each needs on the GPU (None: storage only)
CHOICES: dict[str, dict[str, str | None]] = {
    "weights": {"bfloat16": "bfloat16", "fp8": "fp8", "fp8_static": "fp8", "fp8_block": "fp8", "nvfp4": "fp4"},
    "moe": {"bfloat16": "bfloat16", "fp8": "fp8", "fp8_block": "fp8", "w4afp8": "fp8", "nvfp4": "fp4",
            "w4a16_mxfp4": "bfloat16", "w4a8_mxfp4_mxfp8": "fp8"},
    "attention": {"bfloat16": "bfloat16", "fp8": "fp8"},
    "kv_cache": {"bfloat16": None, "fp8": None, "int8": None},
}
ALIASES = {"bf16": "bfloat16"}
SAMPLE_PREFIX = "precision_"


class Precision(StrictModel):
    """Pinned quantization; every field optional (unset = the checkpoint's own)."""

    weights: str | None = None
    moe: str | None = None
    attention: str | None = None
    kv_cache: str | None = None

    @field_validator("weights", "moe", "attention", "kv_cache", mode="before")
    @classmethod
    def _choice(cls, v: Any, info: Any) -> Any:
        if v is None:
            return None
        if not isinstance(v, str):
            raise ValueError(f"must be one of {list(CHOICES[info.field_name])}, got {v!r}")
        name = ALIASES.get(v, v)
        if name not in CHOICES[info.field_name]:
            raise ValueError(f"{v!r} is not a supported {info.field_name} precision; "
                             f"valid choices: {list(CHOICES[info.field_name])}")
        return name

    def sample_fields(self) -> dict[str, str]:
        """The set fields as flat candidate keys (`precision_weights`, ...)."""
        return {f"{SAMPLE_PREFIX}{k}": v for k, v in self.model_dump().items() if v is not None}


def precision_of(sample: dict[str, Any]) -> dict[str, str]:
    """{field: mode} of the precision a flat candidate carries (empty for the checkpoint's own)."""
    return {k: str(sample[f"{SAMPLE_PREFIX}{k}"]) for k in CHOICES if sample.get(f"{SAMPLE_PREFIX}{k}")}


def quant_modes(sample: dict[str, Any]) -> tuple[str | None, str | None, str | None, str | None]:
    """(gemm, moe, kvcache, fmha) quant modes of a flat candidate, as AIC's KV estimator names them."""
    p = precision_of(sample)
    return (p.get("weights"), p.get("moe"), p.get("kv_cache"), p.get("attention"))
