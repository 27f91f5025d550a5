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
    agg..disagg, as the `spica_sweep` job launches) when the asset returns {partition_key: DataFrame}.
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
        return {
            "dagster/row_count": dg.MetadataValue.int(int(sum(len(f) for f in frames))),
            "dagster/column_schema": dg.TableSchema(
                columns=[dg.TableColumn(str(c), str(t)) for c, t in first.dtypes.items()]
            ),
        }

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


class SweepStorage(dg.ConfigurableResource):
    """Plain files the stages keep between runs: resume journals and the report output folders."""

    base_dir: str | None = Field(
        default=None, description="Root for journals and outputs; default $DAGSTER_HOME/storage/spica"
    )

    @property
    def root(self) -> Path:
        return Path(self.base_dir or default_base_dir())

    def journal_dir(self, config_hash: str, mode: str) -> Path:
        """One journal per (config, branch): a retried or interrupted partition resumes from it."""
        return self.root / "journals" / config_hash[:16] / mode

    def output_dir(self, sweep_name: str) -> Path:
        """A stable folder per sweep name: the latest report, and last night's ledger for warm start."""
        return self.root / "outputs" / sweep_name
