"""The sweep's inputs as observed source assets: its config file and (for a trace workload) its
trace file, each with data version = sha256 of the file's bytes.

Downstream stages carry `AutomationCondition.eager()`, and Dagster counts an observation of a
source as an update only when its data version changes: a `touch` triggers nothing, an edit
re-materializes that sweep and no other. `spica_watch_files` records the observations every 30 s
without launching a run (cheaper than a scheduled observation run); the UI's "Observe sources"
button runs the same observe function.
"""

import json
import warnings
from pathlib import Path

import dagster as dg

from spica_pipeline import storage
from spica_pipeline.dagster.spec import SweepSpec

MISSING = "missing"
WATCH_INTERVAL_S = 30


def file_sha256(path: str | Path) -> str:
    """Content identity of a watched file; `missing` when it cannot be read."""
    try:
        return storage.file_sha256(path)
    except OSError:
        return MISSING


def watched_files(spec: SweepSpec) -> dict[dg.AssetKey, str]:
    files = {spec.key("config_file"): spec.config_path}
    if spec.trace_path:
        files[spec.key("trace_file")] = spec.trace_path
    return files


PATH_KEY = "spica/path"


def watched_files_of(defs: dg.Definitions) -> dict[dg.AssetKey, str]:
    """The files behind the observed source assets of loaded definitions (their `spica/path`)."""
    out = {}
    for asset in defs.assets or []:
        for spec in getattr(asset, "specs", []):
            path = (spec.metadata or {}).get(PATH_KEY)
            if path is not None:
                out[spec.key] = getattr(path, "value", path)
    return out


def _observed(path: str, version: str) -> dict:
    return {"path": dg.MetadataValue.path(path), "sha256": version,
            "bytes": Path(path).stat().st_size if version != MISSING else 0}


def build_sources(spec: SweepSpec) -> list:
    out = []
    for key, path in watched_files(spec).items():
        what = "trace" if key.path[-1] == "trace_file" else "config"

        def observe(context, _path=path) -> dg.ObserveResult:
            version = file_sha256(_path)
            return dg.ObserveResult(data_version=dg.DataVersion(version), metadata=_observed(_path, version))

        with warnings.catch_warnings():  # observable_source_asset is beta in 1.13: quiet at every load
            warnings.simplefilter("ignore", dg.BetaWarning)
            out.append(dg.observable_source_asset(
                key=key, group_name=spec.group, metadata={PATH_KEY: path}, tags={"dagster/kind/file": ""},
                description=f"The sweep's {what} file {path} (data version: sha256 of its bytes; a content "
                "change re-materializes this sweep)")(observe))
    return out


def build_watch_sensor(files: dict[dg.AssetKey, str], *, default_status=dg.DefaultSensorStatus.RUNNING,
                       interval_s: int = WATCH_INTERVAL_S) -> dg.SensorDefinition:
    """Records an observation of each watched file whose sha256 changed (first sight: the baseline).
    It launches no run: the automation condition sensor decides what to materialize."""
    @dg.sensor(name="spica_watch_files", minimum_interval_seconds=interval_s, default_status=default_status,
               description="Observes each sweep's config and trace files (sha256); no run of its own")
    def spica_watch_files(context: dg.SensorEvaluationContext):
        seen = json.loads(context.cursor) if context.cursor else {}
        events = []
        for key, path in files.items():
            version = file_sha256(path)
            name = key.to_user_string()
            if seen.get(name) != version:
                seen[name] = version
                events.append(dg.AssetObservation(asset_key=key, metadata=_observed(path, version),
                                                  tags={"dagster/data_version": version}))
        if not events:
            return dg.SkipReason("no watched file changed")
        return dg.SensorResult(asset_events=events, cursor=json.dumps(seen, sort_keys=True))

    return spica_watch_files
