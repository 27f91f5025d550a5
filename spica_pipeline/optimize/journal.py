"""The on-disk journal of a sweep and the lock on its output directory.

The journal is an append-only JSON Lines file of the two expensive results a sweep produces:
optimizer suggestions and evaluation outcomes. Re-running the sweep with the same journal resumes
it exactly (see `optimize/study.py`), so the journal is treated as a crash-safe log:

* Each record is one `write` on an O_APPEND descriptor, then fsynced; a write that fails part way
  (a full disk) is cut back off, so a later append never lands on a half line.
* On open, a torn tail (no final newline, or an unparseable last line: what `kill -9` or a power
  cut leaves) is cut back to the last complete record, with one warning. That record is simply
  recomputed.
* Every record carries the format version `v` and is validated on read. A damaged record before
  the last line is not a crash artefact but damage: it is a `JournalError` naming `file:line`
  (exit 2), or, with `repair=True`, moved to `<journal>.quarantine` and the sweep goes on.
"""

import fcntl
import json
import math
import os
from pathlib import Path
from typing import IO, Any, Callable, get_args

from spica_pipeline.errors import JournalError, OutputDirError, SpicaError
from spica_pipeline.evaluate.evaluator import EvalOutcome, Status
from spica_pipeline.jsonvalue import canonical_json, json_safe
from spica_pipeline.optimize.trial import Journal
from spica_pipeline.storage import atomic_write_bytes

JOURNAL_NAME = "journal.jsonl"
LOCK_NAME = ".spica.lock"
QUARANTINE_SUFFIX = ".quarantine"
# Bump when a record's shape changes; records without "v" were written before versioning (same shape).
FORMAT_VERSION = 1
STATUSES = frozenset(get_args(Status))


class OutputDirBusy(SpicaError):
    """Another sweep holds the output directory."""


# --------------------------------------------------------------------------------------------
# record validation
# --------------------------------------------------------------------------------------------

def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check_suggest(record: dict[str, Any]) -> str | None:
    if not isinstance(record.get("key"), str):
        return "'key' must be a string"
    suggestions = record.get("suggestions")
    if not isinstance(suggestions, list) or not all(isinstance(s, dict) for s in suggestions):
        return "'suggestions' must be a list of objects"
    if "seconds" in record and record["seconds"] is not None and not _number(record["seconds"]):
        return "'seconds' must be a number"
    return None


def _check_outcome(record: dict[str, Any]) -> str | None:
    trial = record.get("trial")
    if not isinstance(trial, int) or isinstance(trial, bool):
        return "'trial' must be an integer"
    if not isinstance(record.get("spec_hash"), str) or not record["spec_hash"]:
        return "'spec_hash' must be a non-empty string"
    outcome = record.get("outcome")
    if not isinstance(outcome, dict):
        return "'outcome' must be an object"
    unknown = set(outcome) - set(EvalOutcome.__dataclass_fields__)
    if unknown:
        return f"'outcome' has unknown fields {sorted(unknown)}"
    if outcome.get("status") not in STATUSES:
        return f"'outcome.status' must be one of {sorted(STATUSES)}, got {outcome.get('status')!r}"
    for name, kind in (("reason", str), ("report", dict), ("spread", dict), ("derived", dict)):
        if outcome.get(name) is not None and not isinstance(outcome[name], kind):
            return f"'outcome.{name}' must be {'a string' if kind is str else 'an object'}"
    if outcome.get("replay_seconds") is not None and not _number(outcome["replay_seconds"]):
        return "'outcome.replay_seconds' must be a number"
    return None


# kind -> validator (None when the record is well formed, else why not)
RECORD_KINDS: dict[str, Callable[[dict[str, Any]], str | None]] = {
    "suggest": _check_suggest,
    "outcome": _check_outcome,
}


def record_problem(record: Any) -> str | None:
    """Why a parsed journal line is not a record this version can use, or None."""
    if not isinstance(record, dict):
        return f"expected a JSON object, got {type(record).__name__}"
    version = record.get("v", FORMAT_VERSION)
    if not isinstance(version, int) or isinstance(version, bool):
        return f"format version 'v' must be an integer, got {version!r}"
    if version > FORMAT_VERSION:
        return f"format version {version} is newer than this spica reads ({FORMAT_VERSION}): upgrade spica"
    kind = record.get("kind")
    check = RECORD_KINDS.get(kind) if isinstance(kind, str) else None
    if check is None:
        return f"unknown record kind {kind!r} (expected one of {', '.join(RECORD_KINDS)})"
    return check(record)


def _parse(raw: bytes) -> tuple[Any, str | None]:
    try:
        return json.loads(raw), None
    except ValueError as exc:
        return None, f"not valid JSON ({getattr(exc, 'msg', exc)})"


# --------------------------------------------------------------------------------------------
# the journal
# --------------------------------------------------------------------------------------------

class FileJournal(Journal):
    """Journal protocol of `search.study`, persisted as JSON Lines.

    `warnings` holds one line per repair made on open (a torn tail cut, records quarantined), for
    the caller to show. `repair=True` quarantines damaged records instead of refusing the journal.
    """

    def __init__(self, path: str | os.PathLike, *, repair: bool = False) -> None:
        self.path = Path(path)
        self.repair = repair
        self.suggestions: dict[str, list[dict[str, Any]]] = {}
        self.outcomes: dict[str, tuple[int, EvalOutcome]] = {}
        self.loaded_records = 0
        self.torn_records = 0
        self.quarantined_records = 0
        self.warnings: list[str] = []
        self._fd: int | None = None
        self._load()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        except OSError as exc:
            raise OutputDirError(f"journal {self.path}: cannot open for writing: {exc.strerror or exc}") from None

    @property
    def quarantine_path(self) -> Path:
        return self.path.with_name(self.path.name + QUARANTINE_SUFFIX)

    # -- reading -------------------------------------------------------------------------------

    def _load(self) -> None:
        if not self.path.exists():
            return
        if not self.path.is_file():
            raise JournalError(f"journal {self.path}: is not a regular file")
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            raise JournalError(f"journal {self.path}: cannot read: {exc.strerror or exc}") from None
        lines = data.split(b"\n")
        torn_tail = lines.pop()  # b"" when the file ends with a newline
        # (line number, raw bytes, parsed record) of every complete line; blank lines are skipped
        parsed: list[tuple[int, bytes, Any, str | None]] = []
        for lineno, raw in enumerate(lines, start=1):
            if raw.strip():
                record, problem = _parse(raw)
                parsed.append((lineno, raw, record, problem))
        keep_bytes = len(data) - len(torn_tail)
        if torn_tail.strip():
            self._cut_tail(keep_bytes, len(lines) + 1, "no final newline")
        elif parsed and parsed[-1][3] is not None:  # the last complete line does not parse
            lineno, raw, _, _ = parsed.pop()
            keep_bytes -= len(raw) + 1
            self._cut_tail(keep_bytes, lineno, "unparseable last line")
        damaged: list[tuple[int, bytes, str]] = []
        good: list[bytes] = []
        for lineno, raw, record, problem in parsed:
            problem = problem or record_problem(record)
            if problem is not None:
                damaged.append((lineno, raw, problem))
                continue
            good.append(raw)
            self._index(record)
            self.loaded_records += 1
        if damaged:
            self._damaged(damaged, good)

    def _cut_tail(self, keep_bytes: int, lineno: int, why: str) -> None:
        """Truncate the file to its last complete record: the record being written when the sweep
        died is gone, and the next append starts on a fresh line."""
        try:
            with open(self.path, "r+b") as fh:
                fh.truncate(keep_bytes)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            raise JournalError(f"journal {self.path}:{lineno}: torn last record ({why}) and the file "
                               f"cannot be cut back: {exc.strerror or exc}") from None
        self.torn_records += 1
        self.warnings.append(f"journal {self.path}:{lineno}: cut a torn last record ({why}), left by an "
                             "interrupted write; that result is recomputed")

    def _damaged(self, damaged: list[tuple[int, bytes, str]], good: list[bytes]) -> None:
        first_line, _, first_problem = damaged[0]
        more = f" (and {len(damaged) - 1} more damaged records)" if len(damaged) > 1 else ""
        if not self.repair:
            raise JournalError(
                f"journal {self.path}:{first_line}: damaged record: {first_problem}{more}; rerun with "
                f"--repair to move damaged records to {self.quarantine_path.name} and continue")

        quarantine = b"".join(canonical_json({"line": lineno, "problem": problem,
                                              "raw": raw.decode("utf-8", "replace")}).encode() + b"\n"
                              for lineno, raw, problem in damaged)
        try:
            with open(self.quarantine_path, "ab") as fh:
                fh.write(quarantine)
                fh.flush()
                os.fsync(fh.fileno())
            atomic_write_bytes(self.path, b"".join(raw + b"\n" for raw in good))
        except OSError as exc:
            raise JournalError(f"journal {self.path}: cannot quarantine damaged records: "
                               f"{exc.strerror or exc}") from None
        self.quarantined_records = len(damaged)
        lines = ", ".join(str(lineno) for lineno, _, _ in damaged[:5]) + (", ..." if len(damaged) > 5 else "")
        self.warnings.append(f"journal {self.path}: moved {len(damaged)} damaged record(s) (line {lines}; "
                             f"first: {first_problem}) to {self.quarantine_path}; their results are recomputed")

    def _index(self, record: dict[str, Any]) -> None:
        if record["kind"] == "suggest":
            self.suggestions.setdefault(record["key"], record["suggestions"])
        elif record["kind"] == "outcome":
            fields = dict(record["outcome"])
            fields["replay_seconds"] = fields.get("replay_seconds") or 0.0  # NaN was written as null
            for name in ("spread", "derived"):
                fields[name] = fields.get(name) or {}
            self.outcomes.setdefault(record["spec_hash"], (record["trial"], EvalOutcome.from_dict(fields)))

    # -- writing -------------------------------------------------------------------------------

    def _append(self, record: dict[str, Any]) -> None:
        """One record, one write, fsynced. A failed or short write (ENOSPC) is cut back off the
        file before the error propagates, so the journal never keeps half a line."""
        if self._fd is None:
            raise RuntimeError(f"journal {self.path} is closed")
        line = (canonical_json(json_safe({"v": FORMAT_VERSION, **record})) + "\n").encode()
        start = os.fstat(self._fd).st_size  # the lock makes this process the only writer
        try:
            written = os.write(self._fd, line)
            while written < len(line):
                n = os.write(self._fd, line[written:])
                if n == 0:
                    raise OSError(28, os.strerror(28), str(self.path))
                written += n
            os.fsync(self._fd)
        except OSError as exc:
            try:
                os.ftruncate(self._fd, start)
            except OSError:
                pass  # the next open cuts the torn tail instead
            if exc.filename is None:
                exc.filename = str(self.path)
            raise

    # -- Journal protocol ---------------------------------------------------------------------

    def get_suggestions(self, key: str):
        return self.suggestions.get(key)

    def put_suggestions(self, key: str, suggestions, seconds: float) -> None:
        self.suggestions[key] = suggestions
        self._append({"kind": "suggest", "key": key, "suggestions": suggestions,
                      "seconds": seconds if math.isfinite(seconds) else None})

    def get_outcome(self, spec_hash: str):
        return self.outcomes.get(spec_hash)

    def put_outcome(self, trial: int, spec_hash: str, outcome: EvalOutcome) -> None:
        if spec_hash in self.outcomes:
            return
        self._append({"kind": "outcome", "trial": trial, "spec_hash": spec_hash, "outcome": outcome.to_dict()})
        self.outcomes[spec_hash] = (trial, outcome)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# --------------------------------------------------------------------------------------------
# the output directory
# --------------------------------------------------------------------------------------------

def check_output_dir(output_dir: str | os.PathLike) -> Path:
    """Create `output_dir` and prove it writable, before any replay runs (exit 2 otherwise).

    Says what is wrong with the path: a parent that is a file, a directory without write
    permission, a read-only filesystem."""
    path = Path(output_dir)
    for parent in [path, *path.parents]:
        if parent.exists():
            if not parent.is_dir():
                what = "is not a directory" if parent != path else "exists and is not a directory"
                raise OutputDirError(f"--output-dir {path}: {parent} {what}")
            break
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".spica-write-test.{os.getpid()}"
        with open(probe, "wb") as fh:
            fh.write(b"ok")
        probe.unlink()
    except OSError as exc:
        raise OutputDirError(f"--output-dir {path}: not writable: {exc.strerror or exc}") from None
    return path


class RunLock:
    """An exclusive, non-blocking lock on an output directory (released when the process dies).

    Entering it also checks that the directory is writable, so a bad `--output-dir` is refused
    before any replay."""

    def __init__(self, output_dir: str | os.PathLike) -> None:
        self.dir = Path(output_dir)
        self._fh: IO[str] | None = None

    def __enter__(self) -> "RunLock":
        check_output_dir(self.dir)
        try:
            fh = open(self.dir / LOCK_NAME, "a+")
        except OSError as exc:
            raise OutputDirError(f"--output-dir {self.dir}: cannot create {LOCK_NAME}: "
                                 f"{exc.strerror or exc}") from None
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            fh.close()
            raise OutputDirBusy(f"output directory {self.dir} is in use by another sweep (pid {holder}); "
                                "wait for it or choose another --output-dir") from None
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        self._fh = fh
        return self

    def __exit__(self, *exc) -> None:
        if self._fh is not None:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None
