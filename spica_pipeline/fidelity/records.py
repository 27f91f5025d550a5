"""A measured row as fitting and scoring read it: one silicon measurement and the replays of the same deployment.

bench/bench_fidelity.py writes these records (one per silicon row); `fit.py` fits a profile on them. The keys read:

* "id", "split" ("calibration" or "heldout", fidelity/silicon.py), "model", "system", "backend";
* "silicon": {"ttft", "tpot"}, the measured means (ms);
* "ours": {"ttft", "tpot"}, the row replayed as its benchmark client (the "client" replay);
* "sweep": {"ttft", "tpot"}, the row replayed as a sweep measures (the "sweep" replay);
* "concurrency" and "shape" ({"agg": {...}} or {"prefill": {...}, "decode": {...}}, each with "workers"): the load
  per engine of the role that serves a phase;
* "client_lengths": "spread" or "fixed", how the client replay drew request lengths ("spread" when absent).

A record's architecture (`architecture`) is what leaving a model out means: DeepSeek-R1 and DeepSeek-V3 share
one architecture and mostly the same measurements, so leaving out one while its twin stays is not what a model
the profile never saw gets.
"""

import math
from collections.abc import Mapping
from typing import Any

from spica_pipeline.fidelity.profile import number

# model -> architecture, where models share one (every other model is its own)
ARCHITECTURES = {"deepseek-ai/DeepSeek-R1": "DeepSeek-V3", "deepseek-ai/DeepSeek-V3": "DeepSeek-V3"}


def architecture(model: object) -> str:
    """The architecture a model counts as when one is left out (ARCHITECTURES, else the model itself)."""
    return ARCHITECTURES.get(str(model), str(model))


def engine_concurrency(record: Mapping[str, Any], phase: str) -> float:
    """A record's concurrency per engine of the role that serves the phase (prefill for TTFT, decode for TPOT)."""
    shape = record.get("shape") or {}
    role = "agg" if "agg" in shape else ("prefill" if phase == "ttft" else "decode")
    workers = (shape.get(role) or {}).get("workers") or 1
    return float(record.get("concurrency") or 1) / float(workers)


def replayed(record: Mapping[str, Any], phase: str, replay: str) -> float | None:
    """A record's replayed mean of one phase on one basis: "client" = its "ours", "sweep" = its "sweep"."""
    v = (record.get("ours" if replay == "client" else "sweep") or {}).get(phase)
    return float(v) if number(v) else None


def client_lengths(record: Mapping[str, Any]) -> str:
    """How the record's client replay drew request lengths: 'fixed' (exactly the row's ISL and OSL) or 'spread'."""
    return "fixed" if record.get("client_lengths") == "fixed" else "spread"


def residual(record: Mapping[str, Any], phase: str, replay: str, overhead_ms: float = 0.0) -> float | None:
    """ln(silicon / (replayed + overhead)) of one phase, or None without both values positive and finite."""
    o = replayed(record, phase, replay)
    s = (record.get("silicon") or {}).get(phase)
    if o is None or not number(s):
        return None
    o += overhead_ms
    return math.log(s / o) if o > 0 and s > 0 and math.isfinite(o) else None

