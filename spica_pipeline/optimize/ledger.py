"""The trial ledger: one row per trial, the full record of a sweep.

Every trial lands here, feasible or not, replayed or answered from the cache. Rows are plain
JSON-able dicts so they can be journalled line by line (resume after kill -9) and turned into a
Parquet table at the end. Nested values are stored as JSON strings so the Parquet schema is flat
and stable.
"""

import json
from dataclasses import dataclass, field
from typing import Any

from spica_pipeline.config.types import is_finite_number
from spica_pipeline.jsonvalue import canonical_json, json_safe

STATUSES = ("feasible", "infeasible", "failed", "timed_out", "unsupported", "cached")
JSON_COLUMNS = ("parameters", "selection", "parallel_config", "config", "report", "spread", "objectives",
                "projection")


@dataclass
class TrialRecord:
    """One trial. `trial` is the sweep-wide order; `round` is per branch."""

    branch: str
    trial: int
    round: int
    source: str
    status: str
    reason: str | None
    spec_hash: str | None
    parameters: dict[str, Any] = field(default_factory=dict)
    selection: dict[str, Any] = field(default_factory=dict)
    parallel_config: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    report: dict[str, Any] | None = None
    spread: dict[str, Any] = field(default_factory=dict)
    used_gpus: int = 0
    score: float | None = None
    objectives: dict[str, float] | None = None
    told_metrics: dict[str, float] | None = None
    replay_seconds: float = 0.0
    optimizer_seconds: float = 0.0
    projection: dict[str, Any] | None = None
    # who proposed it: the Vizier designer that answered the ask (e.g. DEFAULT, or the cheap
    # QUASI_RANDOM_SEARCH filling in while the model would cost too much), or "exhaustive"
    designer: str | None = None

    def to_row(self) -> dict[str, Any]:
        """Flat row: nested fields as canonical JSON strings (Parquet- and journal-friendly)."""
        row = {name: getattr(self, name) for name in self.__dataclass_fields__}  # shallow: the nested
        # fields become JSON strings below (asdict's deep copy would be most of an anytime write's time)
        for key in (*JSON_COLUMNS, "told_metrics"):
            value = row[key]
            row[key] = None if value is None else canonical_json(json_safe(value))
        if row["score"] is not None and not is_finite_number(row["score"]):
            row["score"] = None
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "TrialRecord":
        data = dict(row)
        for key in (*JSON_COLUMNS, "told_metrics"):
            value = data.get(key)
            if isinstance(value, str):
                data[key] = json.loads(value)
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


def content_view(row: dict[str, Any]) -> dict[str, Any]:
    """The part of a row that must be identical across reruns with the same seed (no timings)."""
    return {k: v for k, v in row.items() if k not in ("replay_seconds", "optimizer_seconds")}
