"""The measurement CSV: one measured point per row, each naming its own deployment.

Columns (a header row first; order free): model, system, backend, precision, tp, pp, attention_dp, moe_tp,
moe_ep, concurrency, isl, osl, ttft_ms, tpot_ms. model, system and backend are spelled as in a sweep config
(`model_name`, `hardware_sku`, `backend`); precision is empty (or "checkpoint default") for the checkpoint's
own, else `field=mode` pairs separated by ';' (weights=fp8;kv_cache=fp8). Empty pp, attention_dp, moe_tp
and moe_ep cells read as 1. Optional columns: replicas (engines serving the load, 1 when absent),
ttft_p90_ms, tpot_p90_ms. A row is one agg deployment (one engine shape) at one closed-loop concurrency.
Blank lines and lines whose first cell starts with '#' are skipped; any other column is refused, so a
misspelt one is not silently dropped.
"""

import csv
import io

from spica_pipeline.config.presets import BACKENDS
from spica_pipeline.fidelity.readers.points import (
    Deployment,
    Measurement,
    MeasurementError,
    number,
    optional_number,
    precision_pairs,
    whole,
)
from spica_pipeline.space.shapes import RoleShape

COLUMNS = ("model", "system", "backend", "precision", "tp", "pp", "attention_dp", "moe_tp", "moe_ep",
           "concurrency", "isl", "osl", "ttft_ms", "tpot_ms")
OPTIONAL_COLUMNS = ("replicas", "ttft_p90_ms", "tpot_p90_ms")
_DEFAULT_ONE = ("pp", "attention_dp", "moe_tp", "moe_ep", "replicas")


def read_table(text: str, source: str) -> list[Measurement]:
    """Every row of a measurement CSV as a Measurement (module docstring)."""
    reader = csv.reader(io.StringIO(text), strict=True)
    header: list[str] | None = None
    points: list[Measurement] = []
    while True:
        try:
            cells = next(reader)
        except StopIteration:
            break
        except csv.Error as err:
            raise MeasurementError(f"{source}, line {reader.line_num}: not CSV ({err})") from None
        line = reader.line_num
        if not cells or not any(c.strip() for c in cells) or cells[0].lstrip().startswith("#"):
            continue
        if header is None:
            header = [c.strip().lower() for c in cells]
            _check_header(header, source, line)
            continue
        origin = f"{source}, line {line}"
        if len(cells) != len(header):
            raise MeasurementError(f"{origin}: {len(cells)} cells but the header has {len(header)} columns")
        row = {k: v.strip() for k, v in zip(header, cells)}
        points.append(_row(row, source, line))
    if header is None:
        raise MeasurementError(f"{source}: empty (expected a header row with {', '.join(COLUMNS)})")
    if not points:
        raise MeasurementError(f"{source}: a header but no measured row")
    return points


def _check_header(header: list[str], source: str, line: int) -> None:
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise MeasurementError(f"{source}, line {line}: missing column{'s' if len(missing) > 1 else ''} "
                               f"{', '.join(missing)}")
    unknown = [c for c in header if c not in COLUMNS and c not in OPTIONAL_COLUMNS]
    if unknown:
        raise MeasurementError(f"{source}, line {line}: unknown column {unknown[0]!r} (columns: {', '.join(COLUMNS)}; "
                               f"optional: {', '.join(OPTIONAL_COLUMNS)})")
    repeated = sorted({c for c in header if header.count(c) > 1})
    if repeated:
        raise MeasurementError(f"{source}, line {line}: column {repeated[0]!r} appears more than once")


def _row(row: dict[str, str], source: str, line: int) -> Measurement:
    origin = f"{source}, line {line}"
    for name in ("model", "system", "backend"):
        if not row[name]:
            raise MeasurementError(f"{origin}: {name}: empty")
    if row["backend"] not in BACKENDS:
        raise MeasurementError(f"{origin}: backend: {row['backend']!r} is not one of {', '.join(BACKENDS)}")
    dims = {k: whole(row.get(k) or ("1" if k in _DEFAULT_ONE else ""), origin, k)
            for k in ("tp", "pp", "attention_dp", "moe_tp", "moe_ep", "replicas")}
    deployment = Deployment(model=row["model"], system=row["system"], backend=row["backend"], mode="agg",
                            shape=RoleShape(**dims), precision=precision_pairs(row["precision"], origin),
                            source=source)
    return Measurement(
        deployment=deployment, concurrency=whole(row["concurrency"], origin, "concurrency"), request_rate=None,
        isl=number(row["isl"], origin, "isl"), osl=number(row["osl"], origin, "osl"),
        ttft_ms=number(row["ttft_ms"], origin, "ttft_ms"), tpot_ms=number(row["tpot_ms"], origin, "tpot_ms"),
        ttft_p90_ms=optional_number(row.get("ttft_p90_ms"), origin, "ttft_p90_ms"),
        tpot_p90_ms=optional_number(row.get("tpot_p90_ms"), origin, "tpot_p90_ms"),
        source=source, where=f"line {line}", tool="csv")
