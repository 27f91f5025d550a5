"""`workload:`: one of five load shapes (trace, request rate, concurrency, KV load, sessions), inferred from
which fields are set."""

import math
from typing import Any, Literal

from pydantic import SerializerFunctionWrapHandler, field_validator, model_serializer, model_validator

from spica_pipeline.config.types import NonNegFloat, NonNegInt, PosFloat, PosInt, StrictModel, at_most_one

SYNTHETIC_FIELDS = ("isl", "osl", "request_rate", "concurrency", "kv_load_ratio", "num_request_ratio")
LOAD_FIELDS = ("request_rate", "concurrency", "kv_load_ratio")
OPTIONAL_FIELDS = ("sessions", "speculative_acceptance")  # absent from a dump when unset (Workload._dump)


def _ratio_value(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"kv_load_ratio values must be numbers, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"kv_load_ratio values must be finite, got {value!r}")
    if value < 0:
        raise ValueError(f"kv_load_ratio values must be >= 0, got {value!r}")
    return float(value)


def _acceptance_value(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"must be a number in (0, 1], got {value!r}")
    if not 0 < value <= 1:
        raise ValueError(f"must be in (0, 1] (the probability that a draft token is accepted), got {value!r}")
    return float(value)


Range = int | float | list[int | float]


def _range(value: Any, *, integer: bool, low: float) -> Any:
    """One number or a [min, max] range with min <= max, each at least `low`."""
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if isinstance(value, (list, tuple)) and len(values) != 2:
        raise ValueError(f"takes one number or a [min, max] range, got {list(values)!r}")
    kind = "an integer" if integer else "a number"
    for v in values:
        ok = isinstance(v, int) if integer else isinstance(v, (int, float)) and math.isfinite(v)
        if isinstance(v, bool) or not ok:
            raise ValueError(f"must be {kind}, got {v!r}")
        if v < low:
            raise ValueError(f"must be >= {low:g}, got {v!r}")
    if len(values) == 2:
        if values[0] > values[1]:
            raise ValueError(f"a range needs min <= max, got {list(values)!r}")
        return [values[0], values[1]]
    return values[0]


class Sessions(StrictModel):
    """Agentic multi-turn sessions: `count` sessions arriving at `session_rate` per second (Poisson), each
    of `turns` turns. The first turn sends `first_isl` tokens; each later turn re-sends the whole history
    (every earlier input and answer, a shared prefix) plus `turn_isl` new tokens, `think_time_s` after the
    previous answer; every answer is `osl` tokens. turns, first_isl, turn_isl, osl and think_time_s take
    one number or a [min, max] range drawn uniformly per session (turns, first_isl) or per turn (the rest),
    seeded by the workload."""

    count: PosInt
    session_rate: PosFloat
    turns: Range
    first_isl: Range
    turn_isl: Range
    osl: Range
    think_time_s: Range = 0.0

    @field_validator("turns", "first_isl", "turn_isl", "osl", mode="before")
    @classmethod
    def _lengths(cls, v: Any, info: Any) -> Any:
        return _range(v, integer=True, low=1)

    @field_validator("think_time_s", mode="before")
    @classmethod
    def _think(cls, v: Any) -> Any:
        return _range(v, integer=False, low=0)

    def bounds(self, name: str) -> tuple[float, float]:
        """(min, max) of a field (a single number gives it twice)."""
        v = getattr(self, name)
        return (v[0], v[1]) if isinstance(v, list) else (v, v)

    def max_history(self) -> int:
        """The longest context a session reaches: its last turn's input plus its answer."""
        turns, first, turn_isl, osl = (int(self.bounds(k)[1]) for k in ("turns", "first_isl", "turn_isl", "osl"))
        return first + (turns - 1) * (osl + turn_isl) + osl


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
    # multi-turn agentic sessions: a load shape of their own (Sessions)
    sessions: Sessions | None = None
    # the probability that a draft token is accepted: one number, or one per draft position (each given
    # the earlier ones were accepted); the traffic's property, so it lives here, not in the engine knobs
    speculative_acceptance: float | list[float] | None = None

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The fields added with sessions and speculative decoding leave a dump when unset, so a workload
        without them dumps (and hashes: every request's spec hash includes it) as before they existed."""
        out = handler(self)
        for key in OPTIONAL_FIELDS:
            if out.get(key) is None:
                out.pop(key, None)
        return out

    @field_validator("speculative_acceptance", mode="before")
    @classmethod
    def _acceptance(cls, v: Any) -> Any:
        if v is None:
            return None
        if isinstance(v, (list, tuple)):
            if not v:
                raise ValueError("speculative_acceptance needs one number or one per draft position, got []")
            return [_acceptance_value(x) for x in v]
        return _acceptance_value(v)

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
        if self.sessions is not None:
            offenders = [f for f in (*SYNTHETIC_FIELDS, "trace_path", "replay_concurrency")
                         if getattr(self, f) is not None]
            offenders += [f for f in ("isl_jitter", "osl_jitter", "shared_prefix_ratio", "num_prefix_groups",
                                      "inter_turn_delay_ms") if getattr(self, f)]
            offenders += ["turns_per_session"] if self.turns_per_session != 1 else []
            if offenders:
                raise ValueError(f"a sessions workload (sessions set) must not set {offenders}: sessions.turns, "
                                 "first_isl, turn_isl, osl and think_time_s describe the traffic")
            return self
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
    def is_sessions(self) -> bool:
        return self.sessions is not None

    @property
    def is_kv_load(self) -> bool:
        return not self.is_trace and self.kv_load_ratio is not None

    def acceptance_rates(self, draft_tokens: int) -> list[float] | None:
        """Per-position acceptance of `draft_tokens` drafts (None: not set). One number holds for every
        position; a list gives one per position and must be at least that long (ValueError otherwise)."""
        a = self.speculative_acceptance
        if a is None or draft_tokens <= 0:
            return None
        if isinstance(a, list):
            if len(a) < draft_tokens:
                raise ValueError(f"workload.speculative_acceptance gives {len(a)} draft position(s) but "
                                 f"{draft_tokens} draft tokens are replayed; give one number or at least "
                                 f"{draft_tokens} values")
            return [float(x) for x in a[:draft_tokens]]
        return [float(a)] * draft_tokens

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
        """'sessions', 'trace', 'capped_trace', 'request_rate', 'concurrency' or 'kv_load'."""
        if self.is_sessions:
            return "sessions"
        if self.is_trace:
            return "capped_trace" if self.replay_concurrency is not None else "trace"
        if self.request_rate is not None:
            return "request_rate"
        if self.concurrency is not None:
            return "concurrency"
        return "kv_load"
