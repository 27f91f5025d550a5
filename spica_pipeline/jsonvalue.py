"""JSON values: the one canonical text of a value (hashes, journal keys, config digests) and the one
sanitiser that makes a value strict JSON (no NaN or infinity, no numpy scalars)."""

import hashlib
import json
import math
from typing import Any


def canonical_json(obj: Any) -> str:
    """Sorted keys, compact separators, strict (NaN/inf rejected): stable across processes."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False, default=plain)


def plain(obj: Any) -> Any:
    """The JSON form of a value `json` does not know (the `default` hook of every dump)."""
    if hasattr(obj, "model_dump"):  # pydantic models
        return obj.model_dump(mode="json")
    if hasattr(obj, "to_dict"):  # our dataclass values
        return obj.to_dict()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):  # numpy scalar
        return obj.item()
    if hasattr(obj, "tolist"):  # numpy array
        return obj.tolist()
    raise TypeError(f"not JSON-serialisable: {type(obj).__name__}")


def spec_hash(obj: Any) -> str:
    """16 hex digits of the sha256 of the canonical JSON: the dedup and cache key of a value."""
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()[:16]


def json_safe(value: Any) -> Any:
    """The value as strict JSON, recursively: non-finite floats become None, numpy scalars Python ones."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes, dict, list, tuple)):
        value = value.item()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value
