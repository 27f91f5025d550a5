"""Users' own benchmark files as typed measured points: what `spica calibrate` fits a profile on.

Contract of `read_measurements(paths, deployment=None) -> list[Measurement]`:

* `paths`: files, in the order given; a directory stands for every AIPerf `profile_export_aiperf.json`
  under it (an AIPerf artifact folder, sweeps included), in path order. Each file's format is read from
  its content, not its name:
  - the measurement CSV (readers/table.py): one point per row, each row naming its own deployment
    (model, system, backend, precision, parallel shape); `deployment` is not used for it;
  - AIPerf's `profile_export_aiperf.json`: one point (readers/clients.py);
  - `vllm bench serve --save-result` JSON: one point;
  - SGLang `bench_serving --output-file` JSONL: one point per line (the client appends a line per run).
  AIPerf's `profile_export_aiperf.csv` is refused: it does not record the load the run was at.
* `deployment`: the deployment the client files measured: a `Deployment`, or the path of a
  simulation_record.yaml or dgd.yaml that `spica sweep` wrote under deploy/<rank>/, or of a one-candidate
  sweep config (readers/deployment.py). Required when a client file is given. When the client file
  records the model it asked for (AIPerf, vLLM) it must be the deployment's model (the same id, or the
  same name after the last '/', case aside).
* The result: one `Measurement` per point, in file order then line order. A Measurement carries its
  Deployment (model, system, backend, precision, mode, canonical shape with replicas), the load
  (concurrency and/or request rate), mean ISL and OSL, mean TTFT and TPOT in ms (P90s where the file has
  them), the completed requests behind them, and where it was read (`source`, `where`, `tool`).
* Nothing is replayed or fitted here, and the files are only read.
* Bad input raises `MeasurementError` (a SpicaError: exit 2 at the CLI) with one line naming the file and
  the line, record or field: a missing column or field, a value that is not a positive number, a file of
  no known format, a client file without a deployment, a deployment file that does not say the model,
  system or backend, a measured model that is not the deployment's.
"""

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from spica_pipeline.fidelity.readers.clients import aiperf_point, summary_point
from spica_pipeline.fidelity.readers.deployment import read_deployment
from spica_pipeline.fidelity.readers.points import Deployment, Measurement, MeasurementError, read_text
from spica_pipeline.fidelity.readers.table import COLUMNS, read_table

__all__ = [
    "Deployment",
    "Measurement",
    "MeasurementError",
    "read_deployment",
    "read_measurement_file",
    "read_measurements",
]

AIPERF_EXPORT = "profile_export_aiperf.json"
_KNOWN = (f"the measurement CSV ({', '.join(COLUMNS[:3])}, ...), AIPerf's {AIPERF_EXPORT}, a vllm bench serve "
          "--save-result JSON or SGLang bench_serving JSONL")
_SUMMARY_KEYS = ("mean_ttft_ms", "mean_tpot_ms", "completed", "duration")  # a serving benchmark's summary
_CLIENT_TOOLS = {"aiperf": "an AIPerf export", "vllm": "a vllm bench serve result",
                 "sglang": "an SGLang bench_serving result"}


def read_measurements(paths: Iterable[str | os.PathLike[str]],
                      deployment: Deployment | str | os.PathLike[str] | None = None) -> list[Measurement]:
    """Every measured point of `paths` (module docstring: the contract)."""
    files = _expand([Path(p) for p in paths])
    if not files:
        raise MeasurementError("no measurement file given")
    served = read_deployment(deployment) if isinstance(deployment, (str, os.PathLike)) else deployment
    points: list[Measurement] = []
    for f in files:
        points += read_measurement_file(f, served)
    return points


def read_measurement_file(path: str | os.PathLike[str], deployment: Deployment | None = None) -> list[Measurement]:
    """The points of one file (any format of the module docstring)."""
    source = str(path)
    text = read_text(path, "measurement file")
    head = text.lstrip()
    if not head:
        raise MeasurementError(f"{source}: empty (expected {_KNOWN})")
    if head[0] in "{[":
        return _json_points(text, source, deployment)
    first = head.splitlines()[0]
    if first.startswith("Metric,"):
        raise MeasurementError(f"{source}: AIPerf's CSV export does not record the load the run was at; pass the "
                               f"{AIPERF_EXPORT} beside it")
    if sum(c.strip().lower() in COLUMNS for c in first.split(",")) < 3 and not first.startswith("#"):
        raise MeasurementError(f"{source}: not a measurement file of a known format (expected {_KNOWN})")
    return read_table(text, source)


def _expand(paths: list[Path]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            found = sorted(p.rglob(AIPERF_EXPORT))
            if not found:
                raise MeasurementError(f"measurement folder {p} holds no {AIPERF_EXPORT}")
            out += found
        else:
            out.append(p)
    return out


def _json_points(text: str, source: str, deployment: Deployment | None) -> list[Measurement]:
    try:
        docs = [(json.loads(text), "")]
    except json.JSONDecodeError:  # JSON lines: one document per line
        docs = []
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                docs.append((json.loads(line), f"line {n}"))
            except json.JSONDecodeError as err:
                raise MeasurementError(f"{source}, line {n}: not JSON ({err.msg})") from None
    points = []
    for doc, where in docs:
        origin = f"{source}, {where}" if where else source
        tool = _tool(doc)
        if tool is None:
            raise MeasurementError(f"{origin}: not a measurement file of a known format (expected {_KNOWN})")
        if deployment is None:
            raise MeasurementError(f"{origin}: {_CLIENT_TOOLS[tool]} does not say which deployment it measured; give "
                                   "the deployment (a dgd.yaml or simulation_record.yaml spica sweep wrote, or a "
                                   "one-candidate sweep config)")
        if tool == "aiperf":
            if where:
                raise MeasurementError(f"{origin}: an AIPerf export is one JSON document, not JSON lines")
            point = aiperf_point(doc, deployment, source)
        else:
            point = summary_point(doc, deployment, source, where, tool)
        _check_model(point)
        points.append(point)
    return points


def _tool(doc: Any) -> str | None:
    """Which client wrote a JSON document, from the keys only that client writes."""
    if not isinstance(doc, Mapping):
        return None
    if "input_config" in doc and ("time_to_first_token" in doc or "request_latency" in doc or "aiperf_version" in doc):
        return "aiperf"
    summary = any(k in doc for k in _SUMMARY_KEYS)
    if "model_id" in doc and summary:
        return "vllm"
    if "dataset_name" in doc and summary:
        return "sglang"
    return None


def _check_model(point: Measurement) -> None:
    served, model = point.served_model, point.deployment.model
    if not served or served == model:
        return
    if served.rsplit("/", 1)[-1].lower() == model.rsplit("/", 1)[-1].lower():
        return
    raise MeasurementError(f"{point.origin}: measured model {served!r} but the deployment "
                           f"({point.deployment.source or 'given'}) serves {model!r}; give the deployment this run "
                           "measured")
