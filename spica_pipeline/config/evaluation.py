"""`evaluation:`: how replayed numbers are reported (calibration profile, issue 14 item 4)."""

from pydantic import field_validator

from spica_pipeline.config.types import StrictModel


class EvaluationSettings(StrictModel):
    """calibration: `auto` (the packaged profile), `none` (raw replay only), or a profile path.

    The ledger and report always carry the raw replayed metrics; with a profile they also carry
    `calibrated_*` values and P10-P90 bands beside them.
    """

    calibration: str = "auto"

    @field_validator("calibration")
    @classmethod
    def _calibration(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("calibration must be 'auto', 'none' or a profile path")
        return v.strip()
