"""`evaluation:`: how replayed numbers are reported (raw, or corrected by a calibration profile)."""

from typing import Literal

from pydantic import field_validator

from spica_pipeline.config.types import StrictModel


class EvaluationSettings(StrictModel):
    """calibration: `auto` (the packaged profile), `none` (raw replay only), or a profile path.

    The ledger and report always carry the raw replayed metrics; with a profile they also carry
    `calibrated_*` values and P10-P90 bands beside them.

    client_lengths: what the benchmark client whose numbers you want sends. `spread` (default):
    lengths that vary around the workload's ISL/OSL, like real traffic and InferenceMAX's client.
    `fixed`: exactly the workload's ISL and OSL every time (genai-perf or AIC's runners with fixed
    lengths); on SGLang such clients stay in lockstep, and the profile's fixed-length factors
    correct a lockstep replay (docs/fidelity.md). Needs a synthetic workload without
    its own jitter and a profile with those factors.
    """

    calibration: str = "auto"
    client_lengths: Literal["spread", "fixed"] = "spread"

    @field_validator("calibration")
    @classmethod
    def _calibration(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("calibration must be 'auto', 'none' or a profile path")
        return v.strip()
