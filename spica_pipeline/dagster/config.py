"""Stage 1 asset: the sweep's validated config, from its file plus the run's overrides.

`SweepLaunchConfig` is what a person edits in the launchpad (or what the schedule sends). The
config is stored as a one-row frame (JSON + YAML + hash) so each later stage reads back exactly
what was validated, independent of the working directory.
"""

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import dagster as dg
import pandas as pd
import yaml
from pydantic import Field, create_model

from spica_pipeline.config import ALGORITHMS, SmartSearchConfig, load_config, parse_yaml_text
from spica_pipeline.config.loader import validate_config
from spica_pipeline.dagster.spec import SweepSpec, resolve_path
from spica_pipeline.errors import ConfigError, SpicaError, describe
from spica_pipeline.jsonvalue import canonical_json
from spica_pipeline.preflight import PreflightError, preflight
from spica_pipeline.traces import trace_content_hash


class SweepLaunchConfig(dg.Config):
    """Overrides for one run of a sweep (launchpad, schedule). A field left at its default keeps the
    file's value; `launch_config_for` makes each sweep's form, whose defaults are its file's values."""

    seed: int | None = Field(default=None, description="sweep.seed: every random choice derives from it")
    max_rounds: int | None = Field(
        default=None, description="sweep.max_rounds: the evaluation budget per branch, in rounds of "
        "sweep.candidates_per_round evaluations")
    time_budget: str | None = Field(
        default=None, description="sweep.time_budget, e.g. 10m, 90s, 1h: evaluate until it is spent (shared by "
        "the branches); empty for none")
    parallel_evals: int | None = Field(default=None, description="sweep.parallel_evals: replays at once")
    policy: str | None = Field(default=None, description="sweep.policy: rapid | thorough")
    algorithm: str | None = Field(default=None, description=f"sweep.algorithm: {' | '.join(ALGORITHMS)}")
    gpu_budget: int | None = Field(default=None, description="search_space.gpu_budget: GPUs a candidate may use")
    request_rate: float | None = Field(
        default=None, description="workload.request_rate (req/s) of a synthetic open-loop workload")
    sla_ttft_ms: float | None = Field(default=None, description="goal.sla.ttft_ms: time to first token, ms")
    sla_itl_ms: float | None = Field(default=None, description="goal.sla.itl_ms: inter-token latency, ms")
    sla_e2e_ms: float | None = Field(default=None, description="goal.sla.e2e_ms: end-to-end latency, ms")


# each launch field -> where it lives in the sweep file
LAUNCH_PATHS: dict[str, tuple[str, ...]] = {
    "seed": ("sweep", "seed"), "max_rounds": ("sweep", "max_rounds"), "time_budget": ("sweep", "time_budget"),
    "parallel_evals": ("sweep", "parallel_evals"), "policy": ("sweep", "policy"),
    "algorithm": ("sweep", "algorithm"), "gpu_budget": ("search_space", "gpu_budget"),
    "request_rate": ("workload", "request_rate"), "sla_ttft_ms": ("goal", "sla", "ttft_ms"),
    "sla_itl_ms": ("goal", "sla", "itl_ms"), "sla_e2e_ms": ("goal", "sla", "e2e_ms"),
}


def _file_values(config: SmartSearchConfig) -> dict[str, Any]:
    """The launch fields' values in a validated config (what the form shows as defaults)."""
    dump = config.model_dump(mode="json")
    values: dict[str, Any] = {}
    for name, path in LAUNCH_PATHS.items():
        node: Any = dump
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        values[name] = node
    if values["time_budget"] is not None:
        values["time_budget"] = _duration_text(float(values["time_budget"]))
    if isinstance(values["gpu_budget"], dict):  # a budget per GPU type: the form shows (and takes) the total
        values["gpu_budget"] = config.search_space.gpu_budget
    return values


def _duration_text(seconds: float) -> str:
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def launch_config_for(config_path: str | Path) -> type[SweepLaunchConfig]:
    """A launch form for one sweep: SweepLaunchConfig with the file's values as defaults (read when
    the code location loads), so the launchpad's "Scaffold all default config" shows them. A field
    left at that default keeps the file's value when the run starts, so an edit to the file after
    the load is not undone by a stale default. A file that does not validate gets the plain form."""
    try:
        values = _file_values(read_sweep_config(config_path))
    except SpicaError:
        return SweepLaunchConfig
    base = SweepLaunchConfig.model_fields
    fields: dict[str, Any] = {}
    for name, value in values.items():
        info = base[name]
        note = "" if value is not None else " (not set in the file)"
        kind = info.annotation if value is None else type(value) | None
        fields[name] = (kind, Field(default=value, description=(info.description or "") + note))
    budget = values["max_rounds"]
    doc = (f"Overrides for one run of {Path(config_path).name}; the defaults are the file's values"
           + (f" (evaluation budget: max_rounds {budget} per branch)" if budget else "") + ".")
    return create_model(f"{_class_name(config_path)}LaunchConfig", __base__=SweepLaunchConfig, __doc__=doc,
                        **fields)


def _class_name(config_path: str | Path) -> str:
    return "".join(part.capitalize() for part in re.split(r"[^A-Za-z0-9]+", Path(config_path).stem) if part)


def overrides_of(launch: SweepLaunchConfig) -> dict[str, Any]:
    """The fields a person changed: those whose value differs from the form's default."""
    fields = type(launch).model_fields
    return {name: getattr(launch, name) for name in LAUNCH_PATHS if getattr(launch, name) != fields[name].default}


def _with_overrides(data: Any, launch: SweepLaunchConfig, where: str, base: Path | None) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ConfigError(f"invalid config {where}: the top level must be a mapping, got {type(data).__name__}")
    data = dict(data)
    for name, value in overrides_of(launch).items():
        *parents, leaf = LAUNCH_PATHS[name]
        node = data
        for part in parents:
            child = node.get(part)
            child = dict(child) if isinstance(child, dict) else {}
            node[part] = child
            node = child
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    workload = data.get("workload")
    if isinstance(workload, dict) and isinstance(workload.get("trace_path"), str) and workload["trace_path"].strip():
        # pin the trace to an absolute path so later stages and run workers agree on the file
        data["workload"] = {**workload, "trace_path": str(resolve_path(workload["trace_path"], base))}
    return data


def read_sweep_config(config_path: str | Path, launch: SweepLaunchConfig | None = None) -> SmartSearchConfig:
    """The sweep's file with the run's overrides applied; every problem is one ConfigError line."""
    launch = launch or SweepLaunchConfig()
    path = resolve_path(config_path)
    load_config(path)  # file-level checks and messages (size, encoding, YAML, schema)
    data = parse_yaml_text(path.read_text(encoding="utf-8-sig"), path)
    return validate_config(_with_overrides(data, launch, str(path), path.parent), str(path))


RESULT_NEUTRAL = {"sweep": {"executor", "ray_address"}}


def config_hash(config: SmartSearchConfig) -> str:
    """Content hash of the validated config and, for a trace workload, of the trace bytes."""
    # where replays run does not change a result: a sweep moved to Ray resumes the same journal
    payload: dict[str, Any] = {"config": config.model_dump(mode="json", exclude=RESULT_NEUTRAL)}
    if config.workload.trace_path:

        try:
            payload["trace_sha256"] = trace_content_hash(config.workload.trace_path)
        except SpicaError:
            payload["trace_sha256"] = None
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


def config_frame(config: SmartSearchConfig, *, source: str, sweep_name: str,
                 dropped: list[dict[str, Any]] | None = None) -> pd.DataFrame:
    dump = config.model_dump(mode="json")
    row = {
        "sweep_name": sweep_name,
        "source": source,
        "config_hash": config_hash(config),
        "config_json": canonical_json(dump),
        "config_yaml": yaml.safe_dump(config.model_dump(mode="json", exclude_none=True), sort_keys=False),
    }
    if dropped is not None:
        row["dropped_json"] = json.dumps(dropped, default=str)
    return pd.DataFrame([row])


def config_from_frame(frame: pd.DataFrame) -> SmartSearchConfig:
    return SmartSearchConfig.from_dict(json.loads(frame["config_json"].iloc[0]))


def frame_value(frame: pd.DataFrame, column: str) -> Any:
    return frame[column].iloc[0]


def fail(err: Exception) -> dg.Failure:
    """A Dagster failure carrying the one-line domain error."""
    return dg.Failure(description=describe(err))


def build_validated_config(spec: SweepSpec) -> dg.AssetsDefinition:
    Launch = launch_config_for(spec.config_path)  # the launch form, with this sweep's file as defaults

    @dg.asset(**spec.common("validated_config"), kinds={"pandas", "parquet"}, deps=spec.source_keys,
              description=f"Stage 1: {Path(spec.config_path).name} read, overridden and validated "
              "(a bad config fails with one line)")
    def validated_config(context: dg.AssetExecutionContext, config: Launch) -> dg.Output[pd.DataFrame]:  # type: ignore[valid-type]
        try:
            # the sweep's preflight: the CLI's refusals before any study; the names as the stages use them
            checked = preflight(read_sweep_config(spec.config_path, config))
        except PreflightError as err:
            raise dg.Failure(description=err.line(spec.config_path)) from None
        except SpicaError as err:
            raise fail(err) from None
        cfg = checked.config
        for warning in checked.warnings:
            context.log.warning(warning)
        frame = config_frame(cfg, source=spec.config_path, sweep_name=spec.name)
        space = cfg.search_space
        return dg.Output(frame, metadata={
            "source": spec.config_path,
            "sweep_name": spec.name,
            "config_hash": frame_value(frame, "config_hash"),
            "goal": cfg.goal.target.value,
            "model": space.model_name,
            "hardware": space.hardware_sku,
            "gpu_budget": int(space.gpu_budget),
            "deployment_modes": ", ".join(space.deployment_mode),
            "seed": int(cfg.sweep.seed),
            "algorithm": cfg.sweep.algorithm,
            "config": dg.MetadataValue.md(f"```yaml\n{frame_value(frame, 'config_yaml')}```"),
        })

    return validated_config
