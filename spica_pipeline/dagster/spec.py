"""A sweep's identity in Dagster: its name (the asset-key prefix and group), its config file, and
what the graph's shape depends on (the searched modes, the trace file), read once at load.

Every stage builder takes a `SweepSpec`, so each sweep config yields its own asset graph with its
own history, checks and plots.
"""

import re
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from spica_pipeline.config import load_config
from spica_pipeline.errors import SpicaError, one_line

MODES = ("agg", "disagg")
DEFAULT_OWNERS = ("team:spica",)
DEFAULT_NIGHTLY_CRON = "0 2 * * *"
REPLAY_POOL = "spica_replay"  # Dagster concurrency pool: caps replay work across runs and backfills
SWEEP_TAG = "spica/sweep"  # run tag: at most one whole-sweep run per sweep (deploy/dagster.yaml)
REPO_ROOT = Path(__file__).resolve().parents[2]
# bump one when that stage's computation changes, so the UI marks downstream assets stale
CODE_VERSIONS = {
    "validated_config": "2", "filtered_config": "1", "load_predictor_result": "1", "branch_spaces": "1",
    "branch_study": "2", "sweep_result": "2", "deploy": "1",
}
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def resolve_path(path: str | Path, base: Path | None = None) -> Path:
    """Relative paths: against `base` (the defining file's folder) when the file is there, else the
    working dir, else the repository root."""
    p = Path(path).expanduser()
    if p.is_absolute():
        return p
    for root in ([base] if base else []) + [Path.cwd(), REPO_ROOT]:
        if (root / p).exists():
            return (root / p).resolve()
    return p


@dataclass(frozen=True)
class SweepSpec:
    """What Dagster needs at load time to stamp out one sweep's graph."""

    name: str
    config_path: str  # absolute
    modes: tuple[str, ...] = MODES
    trace_path: str | None = None  # absolute, when the workload replays a trace
    nightly_cron: str | None = DEFAULT_NIGHTLY_CRON
    owners: tuple[str, ...] = DEFAULT_OWNERS
    load_error: str | None = None  # the config did not validate at load: the run will say why

    def key(self, stage: str) -> dg.AssetKey:
        return dg.AssetKey([self.name, stage])

    @property
    def group(self) -> str:
        return self.name

    @property
    def source_keys(self) -> list[dg.AssetKey]:
        keys = [self.key("config_file")]
        if self.trace_path:
            keys.append(self.key("trace_file"))
        return keys

    @property
    def all_modes_tags(self) -> dict[str, str]:
        """Run tags covering every searched mode in one run (the sweep job, the nightly)."""
        return {"dagster/asset_partition_range_start": self.modes[0],
                "dagster/asset_partition_range_end": self.modes[-1]}

    def common(self, stage: str) -> dict:
        """Asset arguments every stage shares: key, group, owners, code version, automation."""
        return {"key": self.key(stage), "group_name": self.group, "owners": list(self.owners),
                "code_version": CODE_VERSIONS[stage], "automation_condition": dg.AutomationCondition.eager()}


def sweep_spec(name: str, config_path: str | Path, *, base: Path | None = None,
               nightly_cron: str | None = DEFAULT_NIGHTLY_CRON,
               owners: list[str] | tuple[str, ...] = DEFAULT_OWNERS) -> SweepSpec:
    """Read the config once for the graph's shape. A config that does not validate still yields a
    graph (both modes, no trace): its `validated_config` step fails with the one-line reason."""

    if not _NAME.match(name):
        raise ValueError(f"sweep name {name!r}: use letters, digits and underscores (it prefixes asset keys)")
    path = resolve_path(config_path, base)
    try:
        config = load_config(path)
    except SpicaError as err:
        return SweepSpec(name=name, config_path=str(path), nightly_cron=nightly_cron, owners=tuple(owners),
                         load_error=one_line(err))
    modes = tuple(m for m in MODES if m in config.search_space.deployment_mode) or MODES
    trace = config.workload.trace_path
    return SweepSpec(name=name, config_path=str(path), modes=modes,
                     trace_path=str(resolve_path(trace, path.parent)) if trace else None,
                     nightly_cron=nightly_cron, owners=tuple(owners))
