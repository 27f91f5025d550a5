"""Reading and validating Mooncake traces before any replay touches them, and making session traces.

The replay's own trace errors are terse and arrive only after a candidate was built, so every line
is checked here first; each problem raises `TraceError` with `<path>:<line>: <reason>` (or
`<path>: <reason>` for file-level problems) so one bad line never costs a sweep.

Sessions: a line with a `session_id` is one turn of that session; the replay sends a session's turns in
file order, each when the previous one has been answered plus its `delay` (ms, the think time; without
one, the gap between the two turns' timestamps), and a turn's blocks that repeat earlier ones are a
shared prefix (`hash_ids`). `session_records` writes
`workload.sessions` in the Mooncake-delta form, where each turn gives only its new tokens and the replay
prepends the session's history (every earlier input and answer).
"""

import json
import math
import os
import random
import stat
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from spica_pipeline.errors import TraceError
from spica_pipeline.storage import file_sha256

MOONCAKE_BLOCK_SIZE = 512


@dataclass(frozen=True)
class TraceData:
    """The per-request columns of a trace (timestamps in ms, lengths in tokens)."""

    path: str
    timestamp_ms: np.ndarray
    input_length: np.ndarray
    output_length: np.ndarray
    warnings: tuple[str, ...] = field(default=())  # one line per kind of oddity, with a count

    @property
    def n_requests(self) -> int:
        return int(self.timestamp_ms.shape[0])

    @property
    def duration_ms(self) -> float:
        return float(self.timestamp_ms.max() - self.timestamp_ms.min()) if self.n_requests else 0.0


_FILE_KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
               (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"))


def path_problem(path: str | os.PathLike) -> str | None:
    """What is wrong with `path` as an input file ("does not exist", "is a directory", "is not a
    regular file (a character device)"), or None for a readable regular file. Checked before any
    read: reading /dev/zero never ends."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "does not exist"
    except NotADirectoryError:
        return "does not exist (a parent is not a directory)"
    except PermissionError:
        return "permission denied"
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    if stat.S_ISDIR(mode):
        return "is a directory"
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _FILE_KINDS if test(mode)), "a special file")
        return f"is not a regular file ({kind})"
    return None


class _KeyCounter:
    """object_pairs_hook that counts objects with a repeated key (json keeps the last value)."""

    def __init__(self) -> None:
        self.duplicates = 0
        self.first_line: int | None = None
        self.line = 0

    def __call__(self, pairs: list) -> dict:
        obj = dict(pairs)
        if len(obj) != len(pairs):
            self.duplicates += 1
            if self.first_line is None:
                self.first_line = self.line
        return obj


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
    problem = path_problem(p)
    if problem == "does not exist":
        raise TraceError(f"{name}: trace file does not exist")
    if problem is not None:
        raise TraceError(f"{name}: {problem}, expected a JSONL trace file")
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise TraceError(f"{name}: cannot read trace: {exc.strerror or exc}") from None
    if not raw.strip():
        raise TraceError(f"{name}: trace file is empty")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad_line = raw.count(b"\n", 0, exc.start) + 1
        raise TraceError(f"{name}:{bad_line}: not valid UTF-8 text (binary or corrupt file?)") from None

    timestamps: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    keys = _KeyCounter()
    decoder = json.JSONDecoder(object_pairs_hook=keys)
    loads = decoder.decode
    negative, backwards = [0, 0], [0, 0]  # [count, first line (0: none yet)]
    previous_ts = -math.inf
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{name}:{lineno}"
        keys.line = lineno
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
        delay = obj.get("delay")
        if delay is not None and (isinstance(delay, bool) or not isinstance(delay, (int, float))
                                  or not math.isfinite(delay) or delay < 0):
            raise TraceError(f"{where}: 'delay' (ms after the session's previous answer) must be a non-negative "
                             f"number, got {delay!r}")
        session = obj.get("session_id")
        if session is not None and (isinstance(session, bool) or not isinstance(session, (str, int))):
            raise TraceError(f"{where}: 'session_id' must be a string or an integer, got {session!r}")
        hash_ids = obj.get("hash_ids")
        if hash_ids is not None:
            if not isinstance(hash_ids, list) or not all(_is_int(h) for h in hash_ids):
                raise TraceError(f"{where}: 'hash_ids' must be a list of integers")
            if hash_ids and min(hash_ids) < 0:
                raise TraceError(f"{where}: 'hash_ids' must be non-negative, got {min(hash_ids)} "
                                 "(the replay cannot parse it)")
            capacity = len(hash_ids) * block_size
            if isl > capacity:
                raise TraceError(
                    f"{where}: input_length {isl} exceeds hash_ids capacity {capacity} "
                    f"({len(hash_ids)} ids x {block_size} tokens)"
                )
            needed = -(-isl // block_size)
            if len(hash_ids) > needed:
                raise TraceError(
                    f"{where}: {len(hash_ids)} hash_ids for input_length {isl}, more than the "
                    f"{needed} blocks of {block_size} tokens it spans"
                )
        if max_input_length is not None and isl > max_input_length:
            raise TraceError(f"{where}: input_length {isl} exceeds the model context length {max_input_length}")
        if max_input_length is not None and isl + osl > max_input_length:
            raise TraceError(f"{where}: input_length {isl} + output_length {osl} = {isl + osl} tokens exceeds "
                             f"the model context length {max_input_length}")
        if ts < 0:
            negative[0] += 1
            negative[1] = negative[1] or lineno
        if ts < previous_ts:
            backwards[0] += 1
            backwards[1] = backwards[1] or lineno
        previous_ts = ts
        timestamps.append(float(ts))
        inputs.append(isl)
        outputs.append(osl)

    if not timestamps:
        raise TraceError(f"{name}: trace file is empty")
    warnings = []
    if backwards[0]:
        warnings.append(f"{name}:{backwards[1]}: timestamps go backwards on {backwards[0]} line(s) "
                        "(the replay sorts requests by timestamp)")
    if negative[0]:
        warnings.append(f"{name}:{negative[1]}: {negative[0]} negative timestamp(s)")
    if keys.duplicates:
        warnings.append(f"{name}:{keys.first_line}: {keys.duplicates} line(s) repeat a key (the last value is used)")
    return TraceData(
        path=name,
        timestamp_ms=np.asarray(timestamps, dtype=np.float64),
        input_length=np.asarray(inputs, dtype=np.int64),
        output_length=np.asarray(outputs, dtype=np.int64),
        warnings=tuple(warnings),
    )


def trace_content_hash(path: str | os.PathLike) -> str:
    """sha256 of the file bytes: a trace edited in place changes the hash, a touch does not."""

    try:
        return file_sha256(path)
    except FileNotFoundError:
        raise TraceError(f"{path}: trace file does not exist") from None
    except IsADirectoryError:
        raise TraceError(f"{path}: is a directory, expected a JSONL trace file") from None


def _draw(rng: random.Random, value: int | float | list, integer: bool) -> float:
    """One number, or a uniform draw from a [min, max] range (inclusive integers when `integer`)."""
    if not isinstance(value, (list, tuple)):
        return value
    lo, hi = value
    if integer:
        return rng.randint(int(lo), int(hi))
    return rng.uniform(float(lo), float(hi)) if hi > lo else float(lo)


def session_records(*, count: int, session_rate: float, turns: int | list, first_isl: int | list,
                    turn_isl: int | list, osl: int | list, think_time_s: float | list = 0.0, seed: int,
                    block_size: int = MOONCAKE_BLOCK_SIZE) -> list[dict]:
    """Mooncake-delta records of `count` multi-turn sessions (replay with trace_format 'mooncake-delta').

    Sessions start as a Poisson process of `session_rate` per second (the first at 0); a session's turn
    count and first input are drawn once, each later turn's new input, every answer length and every
    think time per turn (numbers, or [min, max] ranges drawn uniformly). Each turn's new tokens get
    block ids of their own; the history the replay prepends is what repeats."""
    rng = random.Random(seed)
    out: list[dict] = []
    start_ms, next_id = 0.0, 0
    for s in range(int(count)):
        if s:
            start_ms += rng.expovariate(float(session_rate)) * 1000.0
        for turn in range(int(_draw(rng, turns, True))):
            new = int(_draw(rng, first_isl if turn == 0 else turn_isl, True))
            blocks = -(-new // block_size)
            record: dict = {"session_id": f"session{s}", "timestamp": round(start_ms, 6), "input_length": new,
                            "output_length": int(_draw(rng, osl, True)),
                            "hash_ids": list(range(next_id, next_id + blocks))}
            next_id += blocks
            if turn:
                record["delay"] = round(_draw(rng, think_time_s, False) * 1000.0, 6)
            out.append(record)
    return out
