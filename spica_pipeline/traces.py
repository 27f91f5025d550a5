"""Reading and validating Mooncake traces (spec §3.5) before any replay touches them.

The replay's own trace errors are terse and arrive only after a candidate was built, so every line
is checked here first; each problem raises `TraceError` with `<path>:<line>: <reason>` (or
`<path>: <reason>` for file-level problems) so one bad line never costs a sweep.
"""

import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from spica_pipeline.errors import TraceError

MOONCAKE_BLOCK_SIZE = 512


@dataclass(frozen=True)
class TraceData:
    """The per-request columns of a trace (timestamps in ms, lengths in tokens)."""

    path: str
    timestamp_ms: np.ndarray
    input_length: np.ndarray
    output_length: np.ndarray

    @property
    def n_requests(self) -> int:
        return int(self.timestamp_ms.shape[0])

    @property
    def duration_ms(self) -> float:
        return float(self.timestamp_ms.max() - self.timestamp_ms.min()) if self.n_requests else 0.0


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _length(obj: dict, key: str, where: str) -> int:
    if key not in obj:
        raise TraceError(f"{where}: missing '{key}'")
    value = obj[key]
    if not _is_int(value):
        raise TraceError(f"{where}: '{key}' must be a non-negative integer, got {value!r}")
    if value < 0:
        raise TraceError(f"{where}: '{key}' must be a non-negative integer, got {value}")
    return value


def read_mooncake_trace(
    path: str | os.PathLike,
    *,
    max_input_length: int | None = None,
    block_size: int = MOONCAKE_BLOCK_SIZE,
) -> TraceData:
    """Parse and validate every line of a Mooncake JSONL trace.

    `max_input_length` is the model's context length: a request whose input plus output is longer
    cannot be served (the KV cache must hold both);
    `block_size` is the tokens per `hash_id` the replay will assume (512 for Mooncake).
    Blank lines are skipped; line numbers are 1-based physical lines.
    """
    p = Path(path)
    name = str(path)
    if not p.exists():
        raise TraceError(f"{name}: trace file does not exist")
    if p.is_dir():
        raise TraceError(f"{name}: is a directory, expected a JSONL trace file")
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise TraceError(f"{name}: cannot read trace: {exc.strerror or exc}") from None
    if not raw.strip():
        raise TraceError(f"{name}: trace file is empty")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise TraceError(f"{name}:{line}: not valid UTF-8 text (binary or corrupt file?)") from None

    timestamps: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    loads = json.loads
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{name}:{lineno}"
        try:
            obj = loads(line)
        except ValueError as exc:
            msg = getattr(exc, "msg", str(exc))
            raise TraceError(f"{where}: not valid JSON ({msg})") from None
        if not isinstance(obj, dict):
            raise TraceError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        if "timestamp" not in obj:
            raise TraceError(f"{where}: missing 'timestamp'")
        ts = obj["timestamp"]
        if isinstance(ts, bool) or not isinstance(ts, (int, float)):
            raise TraceError(f"{where}: 'timestamp' must be a number (ms), got {ts!r}")
        if not math.isfinite(ts):
            raise TraceError(f"{where}: 'timestamp' must be finite, got {ts!r}")
        isl = _length(obj, "input_length", where)
        osl = _length(obj, "output_length", where)
        hash_ids = obj.get("hash_ids")
        if hash_ids is not None:
            if not isinstance(hash_ids, list) or not all(_is_int(h) for h in hash_ids):
                raise TraceError(f"{where}: 'hash_ids' must be a list of integers")
            capacity = len(hash_ids) * block_size
            if isl > capacity:
                raise TraceError(
                    f"{where}: input_length {isl} exceeds hash_ids capacity {capacity} "
                    f"({len(hash_ids)} ids x {block_size} tokens)"
                )
        if max_input_length is not None and isl > max_input_length:
            raise TraceError(f"{where}: input_length {isl} exceeds the model context length {max_input_length}")
        if max_input_length is not None and isl + osl > max_input_length:
            raise TraceError(f"{where}: input_length {isl} + output_length {osl} = {isl + osl} tokens exceeds "
                             f"the model context length {max_input_length}")
        timestamps.append(float(ts))
        inputs.append(isl)
        outputs.append(osl)

    if not timestamps:
        raise TraceError(f"{name}: trace file is empty")
    return TraceData(
        path=name,
        timestamp_ms=np.asarray(timestamps, dtype=np.float64),
        input_length=np.asarray(inputs, dtype=np.int64),
        output_length=np.asarray(outputs, dtype=np.int64),
    )


def trace_content_hash(path: str | os.PathLike) -> str:
    """sha256 of the file bytes: a trace edited in place changes the hash, a touch does not."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    except FileNotFoundError:
        raise TraceError(f"{path}: trace file does not exist") from None
    except IsADirectoryError:
        raise TraceError(f"{path}: is a directory, expected a JSONL trace file") from None
    return digest.hexdigest()
