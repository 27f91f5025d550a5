"""Atomic file writes: write a temp file in the same directory, fsync, then rename over the target.

Readers never see a half-written file; an interrupted write leaves the previous version intact.
The temp file is created 0600 by `mkstemp`; it is given the mode a plain `open()` would have
(0666 minus the umask) before the rename, so outputs are as readable as any other file the user
writes.
"""

import hashlib
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def current_umask() -> int:
    """The process umask, read without changing it where Linux allows (os.umask is a global write,
    racy under threads such as Dagster's)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def new_file_mode() -> int:
    """The mode `open(path, "w")` gives a new file: 0666 minus the umask."""
    return 0o666 & ~current_umask()


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), new_file_mode())
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def _fsync_dir(directory: Path) -> None:
    """Make the rename itself durable (a crash right after could otherwise lose the new name)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes, read in 1 MiB chunks: an edit changes it, a touch does not.
    OSError (missing, a directory, unreadable) propagates for the caller to word."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def write_json_result(path: str | os.PathLike, data: Any) -> Path:
    """A bench or run result as indented JSON (other values as str), written atomically: a run
    stopped mid-write leaves the previous result, never half a file."""
    return atomic_write_text(path, json.dumps(data, indent=2, default=str) + "\n")


def atomic_write_parquet(path: str | os.PathLike, frame: Any) -> Path:
    """Write a pandas DataFrame as Parquet atomically."""
    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    return atomic_write_bytes(path, buf.getvalue())


def default_cache_dir() -> Path:
    """Where derived data is cached (timing tables, KV estimates, aiconfigurator-core's database index):
    `$SPICA_CACHE_DIR`, else ~/.cache/spica-pipeline."""
    env = os.environ.get("SPICA_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "spica-pipeline"
