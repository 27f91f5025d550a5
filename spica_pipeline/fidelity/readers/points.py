"""The typed values the readers produce: a served deployment and one measured point of it.

`Deployment` is what was measured (model, system, backend, precision, parallel shape); `Measurement` is
one workload point of it (load, ISL, OSL) with the measured TTFT and TPOT. Both are frozen: the
calibration groups and keys on them. The helpers below turn a file's raw values into checked numbers,
each failure one `MeasurementError` line naming the file and the line, record or field.
"""

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from spica_pipeline.config.precision import CHOICES, Precision
from spica_pipeline.errors import SpicaError, one_line
from spica_pipeline.space.shapes import SHAPE_KEYS, DisaggShape, ParallelConfig, RoleShape
from spica_pipeline.traces import path_problem

MAX_FILE_BYTES = 256 << 20  # a --save-detailed vLLM result of many thousand prompts stays well below
PRECISION_FIELDS = tuple(CHOICES)  # weights, moe, attention, kv_cache


class MeasurementError(SpicaError):
    """A measurement or deployment file that cannot be read; the message names the file and the line,
    record or field (the CLI prints it and exits 2)."""


@dataclass(frozen=True)
class Deployment:
    """The deployment a measurement was taken on, in the words of a sweep config.

    `shape` is the canonical parallel layout with the replicas that served the load (a RoleShape for agg, a
    DisaggShape for disagg); for a min_gpus pick that is the whole fleet, `fleet` copies of the replayed
    sample's pools. `precision` holds the set (field, mode) pairs of `search_space.precision`, sorted; empty
    is the checkpoint's own. `sample` is the flat candidate replay simulated, where the file holds one
    (simulation_record.yaml's `config`); `sweep_config` the validated one-candidate sweep config mapping,
    where that was the deployment file. Neither takes part in equality or hashing.
    """

    model: str
    system: str
    backend: str
    mode: str
    shape: ParallelConfig
    precision: tuple[tuple[str, str], ...] = ()
    backend_version: str | None = None
    fleet: int = 1
    source: str = ""
    sample: Mapping[str, Any] | None = field(default=None, compare=False, hash=False, repr=False)
    sweep_config: Mapping[str, Any] | None = field(default=None, compare=False, hash=False, repr=False)

    @property
    def key(self) -> tuple[str, str, str, tuple[tuple[str, str], ...]]:
        """(model, system, backend, precision): what one calibration profile is for."""
        return (self.model, self.system, self.backend, self.precision)

    @property
    def precision_dict(self) -> dict[str, str]:
        """`search_space.precision` as a mapping (empty: the checkpoint's own)."""
        return dict(self.precision)

    @property
    def precision_label(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in self.precision) or "checkpoint default"

    @property
    def gpus(self) -> int:
        return self.shape.used_gpus

    def roles(self) -> dict[str, RoleShape]:
        """Role name -> shape: {"agg": ...} or {"prefill": ..., "decode": ...}."""
        if isinstance(self.shape, DisaggShape):
            return {"prefill": self.shape.prefill, "decode": self.shape.decode}
        return {"agg": self.shape}

    def pin(self) -> dict[str, Any]:
        """The shape as a `search_space.parallel_configs` entry in the canonical keys (with replicas)."""
        return dict(self.shape.to_dict())

    def describe(self) -> str:
        roles = " + ".join(f"{name} {s.replicas} x {shape_text(s)}" for name, s in self.roles().items())
        return f"{self.model} on {self.system}, {self.backend} {self.mode} ({roles}), {self.precision_label}"


def shape_text(s: RoleShape) -> str:
    parts = [f"tp{s.tp}"] + [f"{k}{getattr(s, k)}" for k in SHAPE_KEYS[1:] if getattr(s, k) != 1]
    return " ".join(parts)


@dataclass(frozen=True)
class Measurement:
    """One measured workload point of a deployment.

    The load is `concurrency` (requests kept in flight by the client, a closed loop) and/or `request_rate`
    (requests per second, an open loop; None when the client sent as fast as its concurrency allowed); at
    least one is set. `isl` and `osl` are the mean input and output tokens per request as the file
    records them. `ttft_ms` and `tpot_ms` are the measured means (TPOT: time per output token after the
    first), the `_p90_ms` values their 90th percentiles where the file has them. `source` is the file,
    `where` the line or record in it ("" for a file of one point), `tool` the format ("csv", "aiperf",
    "vllm", "sglang"), `served_model` the model name the client sent, where the file records it.
    """

    deployment: Deployment
    concurrency: int | None
    request_rate: float | None
    isl: float
    osl: float
    ttft_ms: float
    tpot_ms: float
    ttft_p90_ms: float | None = None
    tpot_p90_ms: float | None = None
    requests: int | None = None
    source: str = ""
    where: str = ""
    tool: str = ""
    served_model: str | None = None

    @property
    def origin(self) -> str:
        """`file` or `file, line N`: where the point was read."""
        return f"{self.source}, {self.where}" if self.where else self.source

    @property
    def campaign(self) -> tuple[str, str, tuple[tuple[str, str], ...], str, str, str]:
        """(file, model, precision, system, backend, mode): one benchmark campaign of one deployment."""
        d = self.deployment
        return (self.source, d.model, d.precision, d.system, d.backend, d.mode)


# ---- reading raw values ------------------------------------------------------------------------------------

def read_text(path: str | os.PathLike[str], what: str) -> str:
    """A file's text (UTF-8), every failure one line naming the file."""
    problem = path_problem(path)
    if problem is not None:
        raise MeasurementError(f"{what} {path} {problem}")
    try:
        with Path(path).open("rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise MeasurementError(f"{what} {path} cannot be read: {one_line(err.strerror or err)}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise MeasurementError(f"{what} {path} is larger than {MAX_FILE_BYTES >> 20} MiB")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise MeasurementError(f"{what} {path}: not UTF-8 text (byte {err.start})") from None


def _where(origin: str, name: str) -> str:
    return f"{origin}: {name}"


def number(value: Any, origin: str, name: str, *, positive: bool = True) -> float:
    """A finite number (positive unless told); `origin` names the file and line, `name` the field."""
    if isinstance(value, bool) or value is None:
        raise MeasurementError(f"{_where(origin, name)}: expected a number, got {value!r}")
    raw = value
    if isinstance(value, str):
        text = value.strip()
        if not text:
            raise MeasurementError(f"{_where(origin, name)}: empty (expected a number)")
        try:
            value = float(text)
        except ValueError:
            raise MeasurementError(f"{_where(origin, name)}: {value!r} is not a number") from None
    if not isinstance(value, (int, float)):
        raise MeasurementError(f"{_where(origin, name)}: expected a number, got {type(value).__name__}")
    x = float(value)
    if not math.isfinite(x):
        raise MeasurementError(f"{_where(origin, name)}: {raw!r} is not a finite number")
    if positive and x <= 0:
        raise MeasurementError(f"{_where(origin, name)}: {raw!r} must be above 0")
    return x


def whole(value: Any, origin: str, name: str) -> int:
    """A positive whole number (`4` or `4.0`)."""
    x = number(value, origin, name)
    if x != int(x):
        raise MeasurementError(f"{_where(origin, name)}: {value!r} is not a whole number")
    return int(x)


def optional_number(value: Any, origin: str, name: str) -> float | None:
    """A positive number, or None when the value is absent or empty."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return number(value, origin, name)


def precision_pairs(value: Any, origin: str, name: str = "precision") -> tuple[tuple[str, str], ...]:
    """`search_space.precision` from a mapping, from None / "" / "checkpoint default" (the checkpoint's own),
    or from a cell of `field=mode` pairs separated by ';' (e.g. `weights=fp8;kv_cache=fp8`)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "checkpoint default")):
        return ()
    if isinstance(value, str):
        pairs: dict[str, Any] = {}
        for part in value.replace(",", ";").split(";"):
            if not part.strip():
                continue
            key, sep, mode = part.partition("=")
            if not sep:
                raise MeasurementError(
                    f"{_where(origin, name)}: {value!r} is not field=mode pairs; write e.g. weights=fp8;kv_cache=fp8 "
                    f"(fields: {', '.join(PRECISION_FIELDS)}), or leave it empty for the checkpoint default")
            pairs[key.strip()] = mode.strip()
        value = pairs
    if not isinstance(value, Mapping):
        raise MeasurementError(f"{_where(origin, name)}: expected field=mode pairs, got {value!r}")
    try:
        checked = Precision.model_validate(dict(value))
    except ValidationError as err:  # one line: the field and what it may be
        text = "; ".join(f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in err.errors())
        raise MeasurementError(f"{_where(origin, name)}: {one_line(text)}") from None
    return tuple(sorted((k, v) for k, v in checked.model_dump().items() if v is not None))
