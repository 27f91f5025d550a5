"""Where the Dagster pipeline keeps things: the Parquet IO manager and the sweep storage resource.

Every stage asset is a pandas DataFrame stored as one Parquet file per asset (and per partition)
by an IO manager built on Dagster's `UPathIOManager`, so the base path may be local or any fsspec
URL. Journals (resume memos) and report outputs are plain files under `SweepStorage.base_dir`.
"""

import os
from pathlib import Path
from typing import Any

import dagster as dg
import pandas as pd
from pydantic import Field
from upath import UPath


def default_base_dir() -> str:
    """`$DAGSTER_HOME/storage/spica` when Dagster has a home, else `./.dagster_home/storage/spica`
    (`$SPICA_DAGSTER_STORAGE` overrides both)."""
    override = os.environ.get("SPICA_DAGSTER_STORAGE")
    if override:
        return override
    home = os.environ.get("DAGSTER_HOME")
    if home:
        return str(Path(home) / "storage" / "spica")
    return str(Path.cwd() / ".dagster_home" / "storage" / "spica")


class PandasParquetIOManager(dg.UPathIOManager):
    """DataFrame <-> Parquet, one file per asset or partition.

    Unlike the base class it also stores a multi-partition output (a run over the partition range
    agg..disagg, as a sweep's job launches) when the asset returns {partition_key: DataFrame}.
    """

    extension = ".parquet"

    def dump_to_path(self, context: dg.OutputContext, obj: pd.DataFrame, path: UPath) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as fh:
            obj.to_parquet(fh, index=False)

    def load_from_path(self, context: dg.InputContext, path: UPath) -> pd.DataFrame:
        with path.open("rb") as fh:
            return pd.read_parquet(fh)

    def get_metadata(self, context: dg.OutputContext, obj: Any) -> dict[str, Any]:
        frames = obj.values() if isinstance(obj, dict) else [obj]
        frames = [f for f in frames if isinstance(f, pd.DataFrame)]
        if not frames:
            return {}
        first = frames[0]
        metadata: dict[str, Any] = {"dagster/column_schema": dg.TableSchema(
            columns=[dg.TableColumn(str(c), str(t), description=column_description(str(c)))
                     for c, t in first.dtypes.items()])}
        if not context.has_asset_partitions:  # a partitioned asset reports each partition's own count
            metadata["dagster/row_count"] = dg.MetadataValue.int(len(first))
        return metadata

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        if not (context.has_asset_partitions and isinstance(obj, dict)):
            if isinstance(obj, dict):
                raise dg.Failure(f"{context.asset_key.to_user_string()}: got a dict for an unpartitioned output")
            return super().handle_output(context, obj)
        paths = self._get_paths_for_partitions(context)
        missing = sorted(set(paths) - set(obj))
        if missing:
            raise dg.Failure(f"{context.asset_key.to_user_string()}: no frame for partition(s) {missing}")
        for key, path in paths.items():
            self._handle_transition_to_partitioned_asset(context, path.parent)
            self.make_directory(path.parent)
            self.dump_to_path(context=context, obj=obj[key], path=path)
        metadata: dict[str, Any] = {f"path[{k}]": dg.MetadataValue.path(str(p)) for k, p in paths.items()}
        metadata.update(self.get_metadata(context, obj))
        context.add_output_metadata(metadata)


class ParquetIOManager(dg.ConfigurableIOManagerFactory):
    """The configurable front end (shows in the UI with its base path)."""

    base_dir: str | None = Field(
        default=None, description="Root for the Parquet files; default $DAGSTER_HOME/storage/spica/assets"
    )

    def create_io_manager(self, context) -> PandasParquetIOManager:
        base = self.base_dir or str(Path(default_base_dir()) / "assets")
        return PandasParquetIOManager(base_path=UPath(base))


def is_url(path: str | None) -> bool:
    return bool(path) and "://" in str(path) and not str(path).startswith("file://")


class SweepStorage(dg.ConfigurableResource):
    """Plain files the stages keep between runs: resume journals and the report output folders.

    `base_dir` may be a local path or an object-store URL (`s3://bucket/spica`, any fsspec URL).
    With a URL the stages work in a local folder (`local_dir`: the journal lock needs a file
    system) and sync it with the URL: `pull` before a study or a warm start, `push` after a study,
    the result and the deploy output, so another pod (dagster-k8s) resumes and warm-starts from it.
    """

    base_dir: str | None = Field(
        default=None, description="Root for journals and outputs (path or fsspec URL); default "
        "$DAGSTER_HOME/storage/spica"
    )
    local_dir: str | None = Field(
        default=None, description="Local working folder when base_dir is a URL; default "
        "$DAGSTER_HOME/storage/spica-local"
    )

    @property
    def remote(self) -> UPath | None:
        return UPath(self.base_dir) if self.base_dir is not None and is_url(self.base_dir) else None

    @property
    def root(self) -> Path:
        if self.remote is None:
            return Path(self.base_dir or default_base_dir())
        return Path(self.local_dir or (str(default_base_dir()).rstrip("/") + "-local"))

    def journal_dir(self, config_hash: str, mode: str) -> Path:
        """One journal per (config, branch): a retried or interrupted partition resumes from it."""
        return self.root / "journals" / config_hash[:16] / mode

    def output_dir(self, sweep_name: str) -> Path:
        """A stable folder per sweep name: the latest report, and last night's ledger for warm start."""
        return self.root / "outputs" / sweep_name

    def pull(self, local: Path) -> None:
        """Copy the URL's files under `local`'s relative path down (no-op for a local base_dir)."""
        remote = self.remote
        if remote is None:
            return
        src = remote / local.relative_to(self.root).as_posix()
        if not src.exists():
            return
        for item in src.rglob("*"):
            if item.is_file():
                dest = local / item.relative_to(src).as_posix()
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(item.read_bytes())

    def push(self, local: Path) -> None:
        """Copy every file under `local` up to the same relative path of the URL."""
        remote = self.remote
        if remote is None or not local.exists():
            return
        dest_root = remote / local.relative_to(self.root).as_posix()
        for item in local.rglob("*"):
            if item.is_file() and not item.name.startswith("."):
                dest = dest_root / item.relative_to(local).as_posix()
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(item.read_bytes())


COLUMN_DESCRIPTIONS = {
    # config frames (validated_config, filtered_config)
    "sweep_name": "the sweep's name (asset-key prefix)",
    "source": "the config file it was read from",
    "config_hash": "sha256 of the validated config and, for a trace workload, the trace bytes",
    "config_json": "the validated config as canonical JSON",
    "config_yaml": "the validated config as YAML",
    "dropped_json": "planner policies dropped by the goal filter, with the reason",
    # load_predictor_result
    "result_class": "class of the load-predictor result (module:qualname), null when none is needed",
    "result_json": "the load-predictor result as JSON",
    # branch_spaces
    "deployment_mode": "agg or disagg",
    "space_json": "the branch's search space (parallel pool and knobs) as JSON",
    "space_hash": "identity of the space: warm start only reuses trials of an equal hash",
    "finite_size": "points in the space (-1: continuous)",
    "pool_size": "legal parallel configurations",
    "exhaustive": "true when the whole space is replayed instead of searched",
    "plan": "why the branch is searched the way it is",
    "warnings_json": "enumeration warnings",
    # ledgers (branch_study)
    "branch": "deployment mode of the trial",
    "trial": "trial number (sweep-wide in a merged ledger)",
    "round": "optimizer round that suggested it",
    "status": "feasible | infeasible | failed | timed_out | cached | ...",
    "reason": "why it is not feasible, or which trial's result it reuses",
    "spec_hash": "identity of the replayed deployment spec (dedup key)",
    "parameters": "the optimizer's parameters (JSON)",
    "selection": "the parallel-config selection (JSON)",
    "parallel_config": "TP/PP/replicas per role (JSON)",
    "config": "the full candidate config (JSON)",
    "report": "the replay's summary metrics (JSON)",
    "spread": "per-metric spread over router repeats (JSON)",
    "used_gpus": "GPUs the candidate uses",
    "score": "goal value, signed so that larger is better",
    "objectives": "Pareto objective values (JSON)",
    "told_metrics": "what the optimizer was told (JSON)",
    "replay_seconds": "wall seconds spent replaying",
    "optimizer_seconds": "wall seconds spent suggesting",
    "projection": "how the sample was projected onto a legal config (JSON)",
    # candidates (sweep_result)
    "rank": "1 = best (a front: ascending by the last objective)",
    "avg_gpu": "time-averaged GPUs in use (planner scaling)",
    "tok_s_per_gpu": "output tokens/s per GPU",
    "tok_s_per_user": "output tokens/s per user",
    "sla_attainment": "share of requests within the SLA",
    "router_spread_pct": "spread of throughput across router repeats, percent",
    "fleet_replicas": "min_gpus: replicas to carry the load",
    "fleet_gpus": "min_gpus: GPUs of the sized fleet",
    "replica_capacity": "min_gpus: requests/s one replica carries within the SLA",
    "output_throughput_tok_s": "output tokens/s (replay)",
    "mean_ttft_ms": "mean time to first token, ms",
    "mean_tpot_ms": "mean time per output token, ms",
    "mean_e2e_latency_ms": "mean end-to-end latency, ms",
    "mean_output_token_throughput_per_user": "mean output tokens/s per request",
    "goodput_output_throughput_tok_s": "output tokens/s of requests within the SLA",
    "gpu_hours": "GPU hours the replay used",
    "duration_ms": "replayed duration, ms",
    "planner_total_ticks": "planner decisions during the replay",
    "request_throughput_rps": "completed requests/s",
    "p90_ttft_ms": "p90 time to first token, ms",
    "p90_itl_ms": "p90 over the window's requests of their mean inter-token latency, ms",
    "completed_requests": "requests completed in the replay",
    "goodput_completed_requests": "completed requests within the SLA",
    "window_counted_requests": "requests that arrived and completed in the steady-state window",
    "window_total_requests": "requests completed in the whole replay",
    "window_start_ms": "steady-state window start (warm-up excluded), ms",
    "window_end_ms": "steady-state window end (drain excluded), ms",
}
PREFIX_DESCRIPTIONS = {"obj.": "Pareto objective: ", "cfg.": "candidate config: ", "spread.": "router-repeat spread: ",
                       "full_run_": "over the whole replay (warm-up and drain included): ",
                       "calibrated_": "calibrated (replay x the calibration profile): "}


def column_description(name: str) -> str | None:
    """What a stored column means (shown in the asset's column schema)."""
    if name in COLUMN_DESCRIPTIONS:
        return COLUMN_DESCRIPTIONS[name]
    for prefix, what in PREFIX_DESCRIPTIONS.items():
        if name.startswith(prefix):
            rest = name[len(prefix):]
            return what + (COLUMN_DESCRIPTIONS.get(rest) or rest)
    return None
