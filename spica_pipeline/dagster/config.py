"""Stage 1 asset: the sweep's validated config, from its file plus the run's overrides.

`SweepLaunchConfig` is what a person edits in the launchpad (or what the schedule sends). The
config is stored as a one-row frame (JSON + YAML + hash) so each later stage reads back exactly
what was validated, independent of the working directory.
"""

import hashlib
import json
from pathlib import Path
from typing import Any

import dagster as dg
import pandas as pd
import yaml
from pydantic import Field

from spica_pipeline.config import ALGORITHMS, SmartSearchConfig, load_config, parse_yaml_text
from spica_pipeline.config.loader import validate_config
from spica_pipeline.dagster.spec import SweepSpec, resolve_path
from spica_pipeline.errors import ConfigError, SpicaError, describe
from spica_pipeline.jsonvalue import canonical_json
from spica_pipeline.preflight import PreflightError, preflight
from spica_pipeline.traces import trace_content_hash


class SweepLaunchConfig(dg.Config):
    """Ad-hoc overrides for one run of a sweep (launchpad, schedule). Empty keeps the file's value."""

    seed: int | None = Field(default=None, description="Override sweep.seed")
    policy: str | None = Field(default=None, description="Override sweep.policy: rapid | thorough")
    algorithm: str | None = Field(
        default=None,
        description=f"Override sweep.algorithm: {' | '.join(ALGORITHMS)}",
    )
    max_rounds: int | None = Field(default=None, description="Override sweep.max_rounds (the trial budget)")
    gpu_budget: int | None = Field(default=None, description="Override search_space.gpu_budget")


def _with_overrides(data: Any, launch: SweepLaunchConfig, where: str, base: Path | None) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ConfigError(f"invalid config {where}: the top level must be a mapping, got {type(data).__name__}")
    data = dict(data)
    sweep = dict(data.get("sweep") or {})
    sweep.update({k: v for k, v in (("seed", launch.seed), ("policy", launch.policy),
                                    ("algorithm", launch.algorithm), ("max_rounds", launch.max_rounds))
                  if v is not None})
    if sweep:
        data["sweep"] = sweep
    if launch.gpu_budget is not None and isinstance(data.get("search_space"), dict):
        data["search_space"] = {**data["search_space"], "gpu_budget": launch.gpu_budget}
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
    @dg.asset(**spec.common("validated_config"), kinds={"pandas", "parquet"}, deps=spec.source_keys,
              description=f"Stage 1: {Path(spec.config_path).name} read, overridden and validated "
              "(a bad config fails with one line)")
    def validated_config(context: dg.AssetExecutionContext, config: SweepLaunchConfig) -> dg.Output[pd.DataFrame]:
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
