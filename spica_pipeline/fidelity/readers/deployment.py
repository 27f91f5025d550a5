"""The deployment a benchmark file measured, from the file that describes it.

Three kinds of file say which deployment served the load:

* `simulation_record.yaml` (kind SpicaSimulationRecord, written by `spica sweep` under deploy/<rank>/):
  model, hardware_sku, backend, backend_version, precision and per role the canonical parallel shape and
  worker count; a min_gpus pick's fleet (expected.metrics.fleet_replicas) multiplies the worker counts,
  as its dgd.yaml does. Its `config` is kept as the Deployment's `sample`.
* `dgd.yaml` (a DynamoGraphDeployment, v1beta1 or v1alpha1): model, backend and per worker component its
  replicas and engine flags, read back into the canonical shape the way a pin in the engine's own words
  is read (space/pins.py). A manifest does not name the system, so it is read with the
  simulation_record.yaml written beside it: the system, backend version and precision come from there,
  the model and backend must agree, and the shape is the manifest's (what was applied).
* a one-candidate sweep config: `search_space` with model_name, hardware_sku, one backend, one
  deployment_mode and one `parallel_configs` entry (canonical keys or the engine's own words), and
  `precision` when not the checkpoint's own. It is validated as `spica validate` does.

Every refusal is one MeasurementError line naming the file and the field.
"""

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from spica_pipeline.config.loader import parse_yaml_text, validate_config
from spica_pipeline.errors import SpicaError, one_line
from spica_pipeline.fidelity.readers.points import (
    Deployment,
    MeasurementError,
    precision_pairs,
    read_text,
    whole,
)
from spica_pipeline.space.model_hw import model_facts
from spica_pipeline.space.pins import read_pin
from spica_pipeline.space.shapes import SHAPE_KEYS, DisaggShape, ParallelConfig, RoleShape

RECORD_KIND = "SpicaSimulationRecord"
DGD_KIND = "DynamoGraphDeployment"
RECORD_NAME = "simulation_record.yaml"
_ROLES = {"agg": ("agg",), "disagg": ("prefill", "decode")}
_WORKER_TYPES = {"worker": "agg", "prefill": "prefill", "decode": "decode"}


def read_deployment(path: str | os.PathLike[str]) -> Deployment:
    """The Deployment a simulation_record.yaml, dgd.yaml or one-candidate sweep config describes."""
    where = str(path)
    doc = _yaml(path, "deployment file")
    if doc.get("kind") == RECORD_KIND:
        return _from_record(doc, where)
    if doc.get("kind") == DGD_KIND:
        return _from_manifest(doc, Path(path))
    if "search_space" in doc:
        return _from_sweep_config(doc, where)
    raise MeasurementError(
        f"deployment file {where}: not a simulation_record.yaml (kind {RECORD_KIND}), a dgd.yaml (kind {DGD_KIND}) "
        "or a sweep config (search_space); the files spica sweep writes under deploy/<rank>/ are both readable")


def _yaml(path: str | os.PathLike[str], what: str) -> dict[str, Any]:
    text = read_text(path, what)
    try:
        doc = parse_yaml_text(text, str(path))
    except SpicaError as err:  # "malformed YAML in FILE: line L, column C: ..."
        raise MeasurementError(one_line(err)) from None
    if not isinstance(doc, dict):
        raise MeasurementError(f"{what} {path}: expected a YAML mapping, got {type(doc).__name__}")
    return doc


def _dig(doc: Any, *keys: str | int) -> Any:
    """doc[k1][k2]... through mappings and lists; None where a step is missing or of another type."""
    for k in keys:
        if isinstance(k, int):
            doc = doc[k] if isinstance(doc, list) and -len(doc) <= k < len(doc) else None
        else:
            doc = doc.get(k) if isinstance(doc, Mapping) else None
    return doc


def _text_field(doc: Mapping[str, Any], name: str, where: str, label: str | None = None) -> str:
    value = doc.get(name)
    if not isinstance(value, str) or not value.strip():
        shown = label or name
        raise MeasurementError(f"deployment file {where}: {shown} is missing; the deployment must say its model, "
                               "system (hardware_sku) and backend")
    return value.strip()


# ---- simulation_record.yaml -------------------------------------------------------------------------------

def _from_record(doc: Mapping[str, Any], where: str) -> Deployment:
    model = _text_field(doc, "model", where)
    system = _text_field(doc, "hardware_sku", where)
    backend = _text_field(doc, "backend", where)
    mode = doc.get("deployment_mode")
    if mode not in _ROLES:
        raise MeasurementError(f"deployment file {where}: deployment_mode {mode!r} is not agg or disagg")
    fleet_value = _dig(doc, "expected", "metrics", "fleet_replicas")
    fleet = whole(fleet_value or 1, f"deployment file {where}", "expected.metrics.fleet_replicas")
    workers = doc.get("workers")
    if not isinstance(workers, Mapping):
        raise MeasurementError(f"deployment file {where}: workers is missing (per role: count and parallel)")
    shapes = []
    for role in _ROLES[mode]:
        w = workers.get(role)
        if not isinstance(w, Mapping) or not isinstance(w.get("parallel"), Mapping):
            raise MeasurementError(f"deployment file {where}: workers.{role}.parallel is missing")
        par = w["parallel"]
        dims = {k: whole(par.get(k, 1), f"deployment file {where}", f"workers.{role}.parallel.{k}") for k in SHAPE_KEYS}
        count = whole(w.get("count", 1), f"deployment file {where}", f"workers.{role}.count")
        shapes.append(RoleShape(**dims, replicas=count * fleet))
    shape: ParallelConfig = DisaggShape(shapes[0], shapes[1]) if mode == "disagg" else shapes[0]
    config = doc.get("config")
    version = doc.get("backend_version")
    return Deployment(model=model, system=system, backend=backend, mode=mode, shape=shape,
                      precision=precision_pairs(doc.get("precision"), f"deployment file {where}"),
                      backend_version=str(version) if version else None, fleet=fleet, source=where,
                      sample=dict(config) if isinstance(config, Mapping) else None)


# ---- dgd.yaml ----------------------------------------------------------------------------------------------

def _components(doc: Mapping[str, Any], where: str) -> list[tuple[str, str, Any, Any]]:
    """(name, role, replicas, args) of each worker component, v1beta1 `components` or v1alpha1 `services`."""
    spec = doc.get("spec")
    if not isinstance(spec, Mapping):
        raise MeasurementError(f"deployment file {where}: spec is missing")
    found = []
    if isinstance(spec.get("components"), list):
        for c in spec["components"]:
            role = _WORKER_TYPES.get(str(_dig(c, "type")))
            if role is not None:
                args = _dig(c, "podTemplate", "spec", "containers", 0, "args")
                found.append((str(_dig(c, "name")), role, _dig(c, "replicas") or 1, args))
    elif isinstance(spec.get("services"), Mapping):
        for name, s in spec["services"].items():
            if _dig(s, "componentType") == "worker":
                role = str(_dig(s, "subComponentType") or "agg")
                args = _dig(s, "extraPodSpec", "mainContainer", "args")
                found.append((str(name), role, _dig(s, "replicas") or 1, args))
    else:
        raise MeasurementError(f"deployment file {where}: spec has neither components nor services")
    return found


def _flags(args: Any, where: str, comp: str) -> dict[str, str | bool]:
    """`--flag value` and bare `--flag` arguments as a mapping (a bare flag is True)."""
    if not isinstance(args, list):
        raise MeasurementError(f"deployment file {where}: component {comp} has no container args (a list)")
    out: dict[str, str | bool] = {}
    items = [str(a) for a in args]
    for i, a in enumerate(items):
        if a.startswith("--"):
            nxt = items[i + 1] if i + 1 < len(items) else None
            out[a] = nxt if nxt is not None and not nxt.startswith("--") else True
    return out


def _engine_pin(backend: str, flags: Mapping[str, str | bool], replicas: int, where: str, comp: str) -> dict[str, Any]:
    """One worker's engine flags as a pin in that engine's own words (space/pins.py reads it)."""
    def size(flag: str) -> int:
        v = flags.get(flag, "1")
        return whole(v if isinstance(v, str) else "1", f"deployment file {where}", f"{comp} {flag}")

    if backend == "vllm":
        return {"tp": size("--tensor-parallel-size"), "pp": size("--pipeline-parallel-size"),
                "data_parallel": size("--data-parallel-size"),
                "enable_expert_parallel": bool(flags.get("--enable-expert-parallel")), "replicas": replicas}
    if backend == "sglang":
        return {"tp": size("--tp-size"), "pp": size("--pp-size"), "dp": size("--dp-size"), "ep": size("--ep-size"),
                "enable_dp_attention": bool(flags.get("--enable-dp-attention")), "replicas": replicas}
    raise MeasurementError(f"deployment file {where}: spec.backendFramework {backend!r} is not vllm or sglang "
                           "(the engines whose flags a manifest is read back from)")


def _from_manifest(doc: Mapping[str, Any], path: Path) -> Deployment:
    where = str(path)
    raw_spec = doc.get("spec")
    spec: Mapping[str, Any] = raw_spec if isinstance(raw_spec, Mapping) else {}
    backend = _text_field(spec, "backendFramework", where, "spec.backendFramework")
    comps = _components(doc, where)
    if not comps:
        raise MeasurementError(f"deployment file {where}: no worker component (type worker, prefill or decode)")
    roles = {role for _, role, _, _ in comps}
    mode = "agg" if roles == {"agg"} else ("disagg" if roles == {"prefill", "decode"} else None)
    if mode is None or len(comps) != len(roles):
        raise MeasurementError(f"deployment file {where}: worker components {sorted(n for n, *_ in comps)} are "
                               "neither one agg worker nor one prefill and one decode worker")
    sibling = path.parent / RECORD_NAME
    if not sibling.is_file():
        raise MeasurementError(
            f"deployment file {where}: a dgd.yaml does not name the system (hardware_sku) and no {RECORD_NAME} is "
            f"beside it; pass the {RECORD_NAME} spica sweep wrote with it, or a one-candidate sweep config")
    record = _from_record(_yaml(sibling, "deployment file"), str(sibling))
    models = set()
    pins: dict[str, dict[str, Any]] = {}
    for name, role, replicas, args in comps:
        flags = _flags(args, where, name)
        model = flags.get("--model", flags.get("--model-path"))
        if not isinstance(model, str):
            raise MeasurementError(f"deployment file {where}: component {name} passes no --model / --model-path")
        models.add(model)
        count = whole(replicas, f"deployment file {where}", f"component {name} replicas")
        pins[role] = _engine_pin(backend, flags, count, where, f"component {name}")
    if len(models) != 1:
        raise MeasurementError(f"deployment file {where}: worker components serve different models {sorted(models)}")
    model = models.pop()
    if (model, backend) != (record.model, record.backend):
        raise MeasurementError(f"deployment file {where}: serves {model} on {backend} but {sibling} records "
                               f"{record.model} on {record.backend}; pass the record of this manifest's pick")
    shape = _read_shape(pins["agg"] if mode == "agg" else pins, model, where)
    return Deployment(model=model, system=record.system, backend=backend, mode=mode, shape=shape,
                      precision=record.precision, backend_version=record.backend_version, fleet=record.fleet,
                      source=where, sample=record.sample)


def _read_shape(pin: Mapping[str, Any], model: str, where: str) -> ParallelConfig:
    """A pin (canonical keys or an engine's words) as the canonical shape, the way a sweep reads it."""
    try:  # whether the model has experts decides how the engine's words read (AIC's model config)
        is_moe = model_facts(model).is_moe
    except SpicaError as err:
        raise MeasurementError(f"deployment file {where}: {one_line(err)}") from None
    try:
        shape, _notes = read_pin(pin, is_moe, model)
    except Exception as err:  # space/pins.py refuses an inconsistent pin with its own one-line reason
        raise MeasurementError(f"deployment file {where}: parallel shape {dict(pin)}: {one_line(err)}") from None
    return shape


# ---- one-candidate sweep config ----------------------------------------------------------------------------

def _from_sweep_config(doc: dict[str, Any], where: str) -> Deployment:
    try:
        config = validate_config(doc, where)
    except SpicaError as err:  # names the file and the field
        raise MeasurementError(one_line(err)) from None
    space = config.search_space
    for name, values in (("backend", space.backend), ("deployment_mode", space.deployment_mode),
                         ("parallel_configs", space.parallel_configs)):
        if len(values) != 1:
            raise MeasurementError(f"deployment file {where}: search_space.{name} lists {len(values)} entries; the "
                                   "deployment a measurement was taken on pins exactly one")
    mode = space.deployment_mode[0]
    shape = _read_shape(space.parallel_configs[0], space.model_name, where)
    if (mode == "disagg") != isinstance(shape, DisaggShape):
        raise MeasurementError(f"deployment file {where}: search_space.parallel_configs[0] does not match "
                               f"deployment_mode {mode}")
    pinned = space.precision.model_dump() if space.precision is not None else None
    precision = precision_pairs(pinned, f"deployment file {where}", "search_space.precision")
    return Deployment(model=space.model_name, system=space.hardware_sku, backend=space.backend[0], mode=mode,
                      shape=shape, precision=precision,
                      source=where, sweep_config=doc)
