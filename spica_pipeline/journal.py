"""The on-disk journal of a sweep and the lock on its output directory.

The journal is an append-only JSON Lines file of the two expensive results a sweep produces:
optimizer suggestions and evaluation outcomes. Each record is written with one `write` on an
O_APPEND descriptor and fsynced, so a `kill -9` loses at most the record being written, and a torn
last line is ignored on load. Re-running the sweep with the same journal resumes it exactly
(see `search/study.py`).
"""

import fcntl
import json
import os
from pathlib import Path
from typing import Any

from spica_pipeline.errors import SpicaError
from spica_pipeline.search.evaluation import EvalOutcome, canonical_json, json_safe
from spica_pipeline.search.study import Journal

JOURNAL_NAME = "journal.jsonl"
LOCK_NAME = ".spica.lock"


class OutputDirBusy(SpicaError):
    """Another sweep holds the output directory."""


class FileJournal(Journal):
    """Journal protocol of `search.study`, persisted as JSON Lines."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.suggestions: dict[str, list[dict[str, Any]]] = {}
        self.outcomes: dict[str, tuple[int, EvalOutcome]] = {}
        self.loaded_records = 0
        self.torn_records = 0
        self._load()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _load(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, "rb") as fh:
            for raw in fh:
                try:
                    record = json.loads(raw)
                except ValueError:
                    self.torn_records += 1  # a write cut short by a kill: ignore it
                    continue
                self._index(record)
                self.loaded_records += 1

    def _index(self, record: dict[str, Any]) -> None:
        if record.get("kind") == "suggest":
            self.suggestions.setdefault(record["key"], record["suggestions"])
        elif record.get("kind") == "outcome":
            self.outcomes.setdefault(record["spec_hash"],
                                     (record["trial"], EvalOutcome.from_dict(record["outcome"])))

    def _append(self, record: dict[str, Any]) -> None:
        line = (canonical_json(json_safe(record)) + "\n").encode()
        os.write(self._fd, line)
        os.fsync(self._fd)

    # -- Journal protocol ---------------------------------------------------------------------

    def get_suggestions(self, key: str):
        return self.suggestions.get(key)

    def put_suggestions(self, key: str, suggestions, seconds: float) -> None:
        self.suggestions[key] = suggestions
        self._append({"kind": "suggest", "key": key, "suggestions": suggestions, "seconds": seconds})

    def get_outcome(self, spec_hash: str):
        return self.outcomes.get(spec_hash)

    def put_outcome(self, trial: int, spec_hash: str, outcome: EvalOutcome) -> None:
        if spec_hash in self.outcomes:
            return
        self.outcomes[spec_hash] = (trial, outcome)
        self._append({"kind": "outcome", "trial": trial, "spec_hash": spec_hash, "outcome": outcome.to_dict()})

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class RunLock:
    """An exclusive, non-blocking lock on an output directory (released when the process dies)."""

    def __init__(self, output_dir: str | os.PathLike) -> None:
        self.dir = Path(output_dir)
        self._fh = None

    def __enter__(self) -> "RunLock":
        self.dir.mkdir(parents=True, exist_ok=True)
        fh = open(self.dir / LOCK_NAME, "a+")
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
