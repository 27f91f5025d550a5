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


class StrictModel(BaseModel):
    """Every config model rejects unknown keys and re-validates on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
