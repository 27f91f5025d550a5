"""Exceptions shared across the package; each carries a one-line, user-facing message."""


class SpicaError(Exception):
    """Base class: the message is meant to be printed as is, on one line."""


class ConfigError(SpicaError):
    """A config file could not be read, parsed or validated (CLI exit code 2)."""


class TraceError(SpicaError):
    """A trace file is missing or malformed; the message names the file and line."""


class NoPerfDatabase(SpicaError):
    """AI Configurator ships no perf database for (hardware_sku, backend)."""


class NoViableParallelConfig(SpicaError):
    """No parallel shape fits the budget and KV constraints (or pins are illegal)."""


class InfeasibleKVCapacity(SpicaError):
    """A candidate's KV cache cannot hold its load; the candidate is infeasible, not failed."""


class PolicyFilterError(SpicaError):
    """Every planner scaling policy was dropped by the stage-2 filters."""


class ModelHardwareError(SpicaError):
    """Unknown hardware_sku or model without a shipped AI Configurator config."""


class CandidateBuildError(SpicaError):
    """A candidate that cannot be turned into replay arguments (not a capacity problem).

    `detail` is the one-line reason recorded in the ledger; an error wrapped from a library keeps
    the library's own type name there (e.g. `PerfDataNotAvailableError: ...`).
    """

    def __init__(self, message: str, detail: str | None = None):
        super().__init__(message)
        self.detail = detail if detail is not None else f"{type(self).__name__}: {' '.join(message.split())}"


class PerfModelError(CandidateBuildError):
    """aiconfigurator-core cannot model this candidate (no perf data, unsupported shape or model)."""

    @classmethod
    def wrap(cls, exc: BaseException) -> "PerfModelError":
        text = " ".join(str(exc).split())
        detail = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
        err = cls(detail, detail=detail)
        err.__cause__ = exc  # what AIC said, for callers that tell a data gap from other refusals
        return err
