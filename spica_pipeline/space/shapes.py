"""Parallel shapes: one role's engine layout (RoleShape) or a prefill/decode pair (DisaggShape).

These are the values the enumeration produces, projection chooses between, and unroll flattens.
"""

from dataclasses import asdict, dataclass
from typing import Any, Union

SHAPE_KEYS = ("tp", "pp", "attention_dp", "moe_tp", "moe_ep")


def _cached_hash(self: Any) -> int:
    """The dataclass hash (of the field tuple), computed once per shape: shapes key the sets and
    dicts of every projection and neighbourhood step, and a DisaggShape's hash hashes two nested
    shapes each time. Same value as the generated hash, so set and dict orders do not change."""
    h = self.__dict__.get("_hash")
    if h is None:
        h = hash(tuple(getattr(self, name) for name in self.__dataclass_fields__))
        object.__setattr__(self, "_hash", h)
    return h


@dataclass(frozen=True, order=True)
class RoleShape:
    """One engine layout and how many replicas of it run (a worker pool of one role)."""

    tp: int = 1
    pp: int = 1
    attention_dp: int = 1
    moe_tp: int = 1
    moe_ep: int = 1
    replicas: int = 1

    __hash__ = _cached_hash

    @property
    def gpus_per_engine(self) -> int:
        return self.tp * self.pp * self.attention_dp

    @property
    def used_gpus(self) -> int:
        return self.gpus_per_engine * self.replicas

    @property
    def is_moe(self) -> bool:
        return self.moe_tp > 1 or self.moe_ep > 1

    @property
    def strategy(self) -> str:
        """'tp' | 'tep' | 'dep' | 'dtp' | 'mixed' (a dense model's DP-only shape: 'dp')."""
        tp, dp = self.tp, self.attention_dp
        if not self.is_moe:
            return "tp" if dp == 1 else ("dp" if tp == 1 else "mixed")
        if tp > 1 and dp == 1 and self.moe_tp == 1 and self.moe_ep > 1:
            return "tep"
        if tp == 1 and dp > 1 and self.moe_tp == 1 and self.moe_ep > 1:
            return "dep"
        if tp > 1 and dp == 1 and self.moe_tp > 1 and self.moe_ep == 1:
            return "tp"
        if tp == 1 and dp > 1 and self.moe_tp > 1 and self.moe_ep == 1:
            return "dtp"
        return "mixed"

    def engine_key(self) -> tuple[int, int, int, int, int]:
        """The shape without replicas: what KV capacity and step timing depend on."""
        return (self.tp, self.pp, self.attention_dp, self.moe_tp, self.moe_ep)

    def sort_key(self) -> tuple[int, ...]:
        """Projection tie-break order (the smallest key wins)."""
        return (self.tp, self.pp, self.attention_dp, self.moe_tp, self.moe_ep, self.replicas)

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RoleShape":
        return cls(**{k: int(d.get(k, 1)) for k in (*SHAPE_KEYS, "replicas")})


@dataclass(frozen=True, order=True)
class DisaggShape:
    """A disaggregated deployment: a prefill pool and a decode pool."""

    prefill: RoleShape
    decode: RoleShape

    __hash__ = _cached_hash

    @property
    def used_gpus(self) -> int:
        return self.prefill.used_gpus + self.decode.used_gpus

    @property
    def is_moe(self) -> bool:
        return self.prefill.is_moe or self.decode.is_moe

    def sort_key(self) -> tuple[int, ...]:
        return self.prefill.sort_key() + self.decode.sort_key()

    def to_dict(self) -> dict[str, dict[str, int]]:
        return {"prefill": self.prefill.to_dict(), "decode": self.decode.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DisaggShape":
        return cls(RoleShape.from_dict(d["prefill"]), RoleShape.from_dict(d["decode"]))


ParallelConfig = Union[RoleShape, DisaggShape]


def parallel_config_from_dict(d: dict[str, Any]) -> ParallelConfig:
    """Parse a pin or a stored config: a dict with prefill/decode is disagg, else one role."""
    if "prefill" in d or "decode" in d:
        return DisaggShape.from_dict(d)
    return RoleShape.from_dict(d)
