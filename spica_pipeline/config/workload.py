"""`workload:`: one of four load shapes, inferred from which fields are set."""

import math
from typing import Any, Literal

from pydantic import field_validator, model_validator

from spica_pipeline.config.types import NonNegFloat, NonNegInt, PosFloat, PosInt, StrictModel, at_most_one

SYNTHETIC_FIELDS = ("isl", "osl", "request_rate", "concurrency", "kv_load_ratio", "num_request_ratio")
LOAD_FIELDS = ("request_rate", "concurrency", "kv_load_ratio")


def _ratio_value(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"kv_load_ratio values must be numbers, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"kv_load_ratio values must be finite, got {value!r}")
    if value < 0:
        raise ValueError(f"kv_load_ratio values must be >= 0, got {value!r}")
    return float(value)


class Workload(StrictModel):
    """Trace (open or capped) or synthetic (request rate, fixed concurrency, or KV-load ratio)."""

    isl: PosInt | None = None
    osl: PosInt | None = None
    concurrency: PosInt | None = None
    kv_load_ratio: float | list[float] | None = None
    request_rate: PosFloat | None = None
    num_request_ratio: PosFloat | None = None
    shared_prefix_ratio: NonNegFloat = 0.0
    num_prefix_groups: NonNegInt = 0
    turns_per_session: PosInt = 1
    inter_turn_delay_ms: NonNegFloat = 0.0
    isl_jitter: NonNegFloat = 0.0  # each request's ISL uniform in isl x (1 -+ isl_jitter); synthetic only
    osl_jitter: NonNegFloat = 0.0  # same for OSL
    trace_path: str | None = None
    trace_format: Literal["mooncake"] = "mooncake"
    arrival_speedup_ratio: PosFloat = 1.0
    replay_concurrency: PosInt | None = None

    @field_validator("kv_load_ratio", mode="before")
    @classmethod
    def _kv_load_ratio(cls, v: Any) -> Any:
        """A finite ratio >= 0, or (Pareto only) a [min, max] range with min < max."""
        if v is None:
            return None
        if isinstance(v, (list, tuple)):
            if len(v) != 2:
                raise ValueError(f"a kv_load_ratio range needs exactly 2 values [min, max], got {list(v)!r}")
            lo, hi = (_ratio_value(x) for x in v)
            if not lo < hi:
                raise ValueError(f"a kv_load_ratio range needs min < max, got [{lo}, {hi}]")
            return [lo, hi]
        return _ratio_value(v)

    @field_validator("shared_prefix_ratio")
    @classmethod
    def _prefix_ratio(cls, v: float) -> float:
        return at_most_one("shared_prefix_ratio", v)

    @field_validator("isl_jitter", "osl_jitter")
    @classmethod
    def _jitter(cls, v: float) -> float:
        if v >= 1:
            raise ValueError(f"a length jitter is a fraction in [0, 1), got {v}")
        return v

    @field_validator("trace_path")
    @classmethod
    def _trace_path(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("trace_path must not be empty")
        return v

    @model_validator(mode="after")
    def _shape(self) -> "Workload":
        if self.is_trace:
            offenders = [f for f in SYNTHETIC_FIELDS if getattr(self, f) is not None]
            offenders += [f for f in ("isl_jitter", "osl_jitter") if getattr(self, f)]
            if offenders:
                raise ValueError(f"trace workload (trace_path set) must not set synthetic fields {offenders}")
            return self
        if self.replay_concurrency is not None:
            raise ValueError("replay_concurrency is only for trace workloads; use 'concurrency'")
        loads = [f for f in LOAD_FIELDS if getattr(self, f) is not None]
        if len(loads) != 1:
            got = f"got {loads}" if loads else "got none"
            raise ValueError(f"a synthetic workload needs exactly one of {list(LOAD_FIELDS)} ({got})")
        missing = [f for f in ("isl", "osl", "num_request_ratio") if getattr(self, f) is None]
        if missing:
            raise ValueError(f"a synthetic workload requires {missing}")
        if self.has_jitter and self.turns_per_session > 1:
            raise ValueError("isl_jitter/osl_jitter need turns_per_session: 1 (jittered requests are independent)")
        return self

    @property
    def has_jitter(self) -> bool:
        return bool(self.isl_jitter or self.osl_jitter)

    # ---- derived quantities --------------------------------------------------------------------

    @property
    def is_trace(self) -> bool:
        return self.trace_path is not None

    @property
    def is_kv_load(self) -> bool:
        return not self.is_trace and self.kv_load_ratio is not None

    def in_flight_cap(self, override: int | None = None) -> int | None:
        """Closed-loop cap; None means open loop. A trace ignores the per-candidate override."""
        if self.is_trace:
            return self.replay_concurrency
        if override is not None:
            return override
        return self.concurrency

    def synthetic_request_count(self, override: int | None = None) -> int:
        """max(1, round(num_request_ratio x load)), load = override, concurrency or request_rate."""
        if self.is_trace:
            raise ValueError("a trace workload has no synthetic request count")
        if override is not None:
            load: float = override
        elif self.concurrency is not None:
            load = self.concurrency
        elif self.request_rate is not None:
            load = self.request_rate
        else:
            raise ValueError("a kv_load_ratio workload needs the per-candidate concurrency override")
        assert self.num_request_ratio is not None
        return max(1, round(self.num_request_ratio * load))

    def arrival_interval_ms(self) -> float | None:
        """Mean inter-arrival for a request-rate workload; None for closed loop or a trace."""
        if self.is_trace or self.request_rate is None:
            return None
        return 1000.0 / self.request_rate

    def kv_load_range(self) -> tuple[float, float] | None:
        if isinstance(self.kv_load_ratio, list):
            return (self.kv_load_ratio[0], self.kv_load_ratio[1])
        return None

    def kv_load_scalar(self) -> float | None:
        if isinstance(self.kv_load_ratio, (int, float)):
            return float(self.kv_load_ratio)
        return None

    @property
    def shape(self) -> str:
        """'trace', 'capped_trace', 'request_rate', 'concurrency' or 'kv_load'."""
        if self.is_trace:
            return "capped_trace" if self.replay_concurrency is not None else "trace"
        if self.request_rate is not None:
            return "request_rate"
        if self.concurrency is not None:
            return "concurrency"
        return "kv_load"
