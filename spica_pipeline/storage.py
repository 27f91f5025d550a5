"""Atomic file writes: write a temp file in the same directory, fsync, then rename over the target.

Readers never see a half-written file; an interrupted write leaves the previous version intact.
"""

import io
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_parquet(path: str | os.PathLike, frame: Any) -> Path:
    """Write a pandas DataFrame as Parquet atomically."""
    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    return atomic_write_bytes(path, buf.getvalue())
