"""Exceptions shared across the package; each carries a one-line, user-facing message."""



def one_line(text: object) -> str:
    """Any message on one line, whitespace runs folded: the one form of every error text we show."""
    return " ".join(str(text).split())


def describe(exc: BaseException) -> str:
    """`Type: message` on one line (the type alone when the message is empty)."""
    text = one_line(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__

class SpicaError(Exception):
    """Base class: the message is meant to be printed as is, on one line.

    `exit_code` is what the CLI exits with (README "Exit codes"); bad input unless a subclass says
    otherwise, so the one table of codes lives next to the errors that produce them.
    """

    exit_code = 2


class ConfigError(SpicaError):
    """A config file could not be read, parsed or validated (CLI exit code 2)."""


class TraceError(SpicaError):
    """A trace file is missing or malformed; the message names the file and line."""


class NoPerfDatabase(SpicaError):
    """AI Configurator ships no perf database for (hardware_sku, backend)."""


class NoViableParallelConfig(SpicaError):
    """No parallel shape fits the budget and KV constraints (or pins are illegal)."""

    pruning: str | None = None  # the filter that removed the last survivors (the refusal's summary)


class InfeasibleKVCapacity(SpicaError):
    """A candidate's KV cache cannot hold its load; the candidate is infeasible, not failed."""


class PolicyFilterError(SpicaError):
    """Every planner scaling policy was dropped by the stage-2 filters."""


class ModelHardwareError(SpicaError):
    """Unknown hardware_sku or model without a shipped AI Configurator config."""


class JournalError(SpicaError):
    """A sweep journal has a damaged record before its last line; the message names file:line."""


class OutputDirError(SpicaError):
    """The output directory cannot be created or written; refused before any replay."""


class ResourceLimitError(ConfigError):
    """An input asks for more than this machine or the replay can do (names the field and the limit)."""


class EnvironmentFailure(SpicaError):
    """The machine failed mid-sweep (disk full, read-only filesystem, I/O error, out of memory):
    what could be flushed was flushed; the message says what to fix before rerunning."""

    exit_code = 4


class BackendStartError(EnvironmentFailure):
    """The evaluation backend cannot run anything: the local pool cannot start worker processes, or
    Ray cannot be started or reached (exit 4; nothing is lost, the journal resumes the sweep).

    `debug_text` is what `--debug` prints besides the driver's traceback (a worker's traceback)."""

    def __init__(self, what: str, todo: str, debug_text: str | None = None):
        super().__init__(f"environment failure: {what}; {todo}, then run the same command again "
                         "(journalled trials are not recomputed)")
        self.debug_text = debug_text


class CandidateBuildError(SpicaError):
    """A candidate that cannot be turned into replay arguments (not a capacity problem).

    `detail` is the one-line reason recorded in the ledger; an error wrapped from a library keeps
    the library's own type name there (e.g. `PerfDataNotAvailableError: ...`).
    """

    def __init__(self, message: str, detail: str | None = None):
        super().__init__(message)
        self.detail = detail if detail is not None else f"{type(self).__name__}: {one_line(message)}"


class PerfModelError(CandidateBuildError):
    """aiconfigurator-core cannot model this candidate (no perf data, unsupported shape or model)."""

    @classmethod
    def wrap(cls, exc: BaseException) -> "PerfModelError":
        detail = describe(exc)
        err = cls(detail, detail=detail)
        err.__cause__ = exc  # what AIC said, for callers that tell a data gap from other refusals
        return err
