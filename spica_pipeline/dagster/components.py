"""`SpicaSweep`: the Dagster component that turns one sweep config into its asset graph.

Each `spica_pipeline/dagster/defs/<name>/defs.yaml` instantiates it; adding a sweep is adding one such file:

    type: spica_pipeline.dagster.components.SpicaSweep
    attributes:
      config_path: ../../../../examples/configs/quickstart.yaml   # relative to this defs.yaml
      nightly_cron: "0 2 * * *"                                 # null: no nightly schedule
"""

from pathlib import Path

import dagster as dg
from pydantic import Field

from spica_pipeline.dagster.factory import build_sweep_defs
from spica_pipeline.dagster.spec import DEFAULT_NIGHTLY_CRON, DEFAULT_OWNERS, sweep_spec


class SpicaSweep(dg.Component, dg.Model, dg.Resolvable):
    """One sweep: its config file's own asset graph, checks, job and nightly schedule."""

    config_path: str = Field(description="The sweep config YAML, relative to this defs.yaml (or absolute)")
    name: str | None = Field(default=None, description="Asset-key prefix and group; default the folder name")
    nightly_cron: str | None = Field(default=DEFAULT_NIGHTLY_CRON, description="UTC cron of the nightly "
                                     "warm-started run (the schedule starts stopped); null for none")
    owners: list[str] = Field(default_factory=lambda: list(DEFAULT_OWNERS), description="Asset owners")

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:

        folder = Path(context.path)
        folder = folder if folder.is_dir() else folder.parent
        spec = sweep_spec(self.name or folder.name, self.config_path, base=folder,
                          nightly_cron=self.nightly_cron, owners=self.owners)
        return build_sweep_defs(spec)
