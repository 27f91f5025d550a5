"""Strict scalar types shared by the config models.

YAML already types its scalars, so we take them strictly: no bool where a number is expected,
no float where an int is expected (1.9 is not a concurrency), no NaN or infinity.
"""

import math
from typing import Annotated, Any

from pydantic import AllowInfNan, BaseModel, ConfigDict, Field, Strict

Int = Annotated[int, Strict()]
PosInt = Annotated[int, Strict(), Field(ge=1)]
NonNegInt = Annotated[int, Strict(), Field(ge=0)]
Float = Annotated[float, Strict(), AllowInfNan(False)]
PosFloat = Annotated[float, Strict(), AllowInfNan(False), Field(gt=0)]
NonNegFloat = Annotated[float, Strict(), AllowInfNan(False), Field(ge=0)]
Fraction = Annotated[float, Strict(), AllowInfNan(False), Field(gt=0, le=1)]
Bool = Annotated[bool, Strict()]


def is_finite_number(x: Any) -> bool:
    """A real number that is neither NaN nor infinite (None, strings and bools are not): the one
    test, for config values and replay report values alike."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def at_most_one(field: str, value: float, *, zero_allowed: bool = True) -> float:
    """A share or ratio is at most 1 (the field's type already bounds it below): one message form."""
    if value > 1:
        raise ValueError(f"{field} must be in {'[' if zero_allowed else '('}0, 1], got {value}")
    return value


class StrictModel(BaseModel):
    """Every config model rejects unknown keys and is frozen: a validated config is a value (its
    hash keys the journal and the Dagster runs), so nothing may change it after validation."""

    model_config = ConfigDict(extra="forbid", frozen=True)
