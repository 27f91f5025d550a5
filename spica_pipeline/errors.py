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
