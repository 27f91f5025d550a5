"""Strict scalar types shared by the config models.

YAML already types its scalars, so we take them strictly: no bool where a number is expected,
no float where an int is expected (1.9 is not a concurrency), no NaN or infinity.
"""

from typing import Annotated

from pydantic import AllowInfNan, BaseModel, ConfigDict, Field, Strict

Int = Annotated[int, Strict()]
PosInt = Annotated[int, Strict(), Field(ge=1)]
NonNegInt = Annotated[int, Strict(), Field(ge=0)]
Float = Annotated[float, Strict(), AllowInfNan(False)]
PosFloat = Annotated[float, Strict(), AllowInfNan(False), Field(gt=0)]
NonNegFloat = Annotated[float, Strict(), AllowInfNan(False), Field(ge=0)]
Fraction = Annotated[float, Strict(), AllowInfNan(False), Field(gt=0, le=1)]
Bool = Annotated[bool, Strict()]


class StrictModel(BaseModel):
    """Every config model rejects unknown keys and re-validates on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
