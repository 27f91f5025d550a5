"""The Dagster code location: one asset graph per sweep, from `spica_pipeline/dagster/defs/<name>/defs.yaml`
(a `SpicaSweep` component each), plus the resources, executor and sensors added once.

Steps run in one process by default: the multiprocess executor costs ~5 s per step on a small
machine and would make JAX and the replay workers compete for cores (see docs/dagster.md).
"""

import warnings
from pathlib import Path

import dagster as dg

from spica_pipeline.dagster.factory import code_location
from spica_pipeline.dagster.sources import watched_files_of

# observable source assets go through a beta constructor argument; the warning would print at every load
warnings.filterwarnings("ignore", message="Parameter `execution_type`", category=dg.BetaWarning)


def _load() -> dg.Definitions:
    """One Definitions at module scope: `dg` refuses a module holding two."""
    sweeps = dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
    return dg.Definitions.merge(sweeps, code_location(watched_files_of(sweeps)))


defs = _load()
