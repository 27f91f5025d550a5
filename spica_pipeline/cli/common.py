"""What every `spica` command shares: exit codes, the one-line failure, environment failures (exit 4),
internal errors (exit 3) and SIGTERM handled like Ctrl-C.

Exit codes (the README's table lists them): 0 results; 1 nothing feasible; 2 bad input (config, trace,
journal, output dir), checked before any replay; 3 internal error (a bug: the traceback goes to a log
file, or to stderr with --debug); 4 environment failure mid-sweep (disk full, read-only filesystem,
out of memory, worker processes or a Ray that cannot start or be reached), after flushing what can be
flushed; 5 results, but no configuration met goal.sla for goal.sla_attainment of its requests (the
ranking, the closest configuration and what would meet the SLA are written as for 0); 130 interrupted
(SIGINT); 143 terminated (SIGTERM).
"""

import contextlib
import errno
import signal
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from spica_pipeline.config import load_config
from spica_pipeline.errors import ConfigError, one_line
from spica_pipeline.optimize.journal import JOURNAL_NAME

EXIT_OK = 0
EXIT_NOTHING_FEASIBLE = 1
EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 3
EXIT_ENVIRONMENT = 4
EXIT_SLA_NOT_MET = 5  # a finished sweep whose candidates all miss the SLA: an answer, not an error
EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_TERMINATED = 143  # 128 + SIGTERM
ERROR_LOG_NAME = "spica-error.log"


def fail(message: str, code: int = EXIT_BAD_INPUT) -> int:
    print(one_line(message), file=sys.stderr)
    return code


class SweepTerminated(KeyboardInterrupt):
    """SIGTERM (Kubernetes, Dagster, systemd) turned into the same unwinding as Ctrl-C: the sweep
    stops dispatching, the journal and partial ledger are flushed, the resume hint is printed."""


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Raise `SweepTerminated` in the main thread on the first SIGTERM; a second SIGTERM during
    the flush is ignored so the flush completes (SIGKILL still stops everything)."""
    fired = False

    def handler(signum: int, frame: Any) -> None:
        nonlocal fired
        if not fired:
            fired = True
            raise SweepTerminated()

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals to whoever owns it
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# errno -> (what happened, what to do); the advice must be true for that case
_ENVIRONMENT_ERRNOS = {
    errno.ENOSPC: ("no space left on device", "free space on the filesystem holding {dir}"),
    errno.EDQUOT: ("disk quota exceeded", "free space or raise the quota on the filesystem holding {dir}"),
    errno.EROFS: ("the filesystem is read-only", "make {dir} writable again (remount, or copy it to a "
                                                 "writable place and pass that as --output-dir)"),
    errno.EFBIG: ("file too large for this process's file-size limit", "raise the limit (ulimit -f)"),
    errno.EIO: ("I/O error", "check the disk holding {dir} (dmesg)"),
    errno.EMFILE: ("too many open files", "raise the open-file limit (ulimit -n) or lower sweep.parallel_evals"),
    errno.ENFILE: ("too many open files on this machine", "close other programs or lower sweep.parallel_evals"),
    errno.ENOMEM: ("out of memory", "free memory or lower sweep.parallel_evals"),
}


def environment_failure(err: BaseException, output_dir: Path | None) -> str | None:
    """The one-line message for a machine failure mid-sweep (exit 4), or None when `err` is not one."""
    place = str(output_dir) if output_dir is not None else "the output directory"
    if isinstance(err, MemoryError):
        what, todo = _ENVIRONMENT_ERRNOS[errno.ENOMEM]
    elif isinstance(err, OSError) and err.errno in _ENVIRONMENT_ERRNOS:
        what, todo = _ENVIRONMENT_ERRNOS[err.errno]
    elif (isinstance(err, PermissionError) and output_dir is not None and err.filename
          and _inside(Path(str(err.filename)), output_dir)):
        what, todo = "permission denied", "restore write permission on {dir}"
    else:
        return None
    name = getattr(err, "filename", None)
    where = f" writing {name}" if name else ""
    resume = (f"; finished trials are journalled in {output_dir}/{JOURNAL_NAME} and are not recomputed"
              if output_dir is not None else "")
    return f"environment failure: {what}{where}; {todo.format(dir=place)}, then run the same command again{resume}"


def _inside(path: Path, directory: Path) -> bool:
    try:
        path.resolve().relative_to(directory.resolve())
        return True
    except (ValueError, OSError):
        return False


def internal_error(err: BaseException, debug: bool, log_dir: Path | None = None) -> int:
    """A bug: one line on stderr naming where the traceback went; `--debug` prints it too."""
    text = traceback.format_exc()
    if debug:
        sys.stderr.write(text)
    where = "rerun with --debug to print the traceback"
    if log_dir is not None:
        log = log_dir / ERROR_LOG_NAME
        try:
            with open(log, "a") as fh:
                fh.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S%z')} spica {' '.join(sys.argv[1:])}\n{text}")
            where = f"traceback in {log} (or rerun with --debug to print it)"
        except OSError:
            pass
    message = one_line(f"{type(err).__name__}: {err}")
    if len(message) > 300:
        message = message[:297] + "..."
    print(one_line(f"internal error (a bug in spica, please report it): {message}; {where}"), file=sys.stderr)
    return EXIT_INTERNAL


def load_or_report(path: str) -> Any:
    """Load a config; returns the config, or an int exit code after printing one line."""
    try:
        return load_config(path)
    except ConfigError as err:
        return fail(str(err))
    except Exception as err:  # a bug must still not print a traceback at the user
        return fail(f"invalid config {path}: unexpected {type(err).__name__}: {err}")
