"""Same config and seed, same ledger: two examples swept with the real replay give the ledger they gave
when the digests below were recorded. A change that moves a digest changes what users get; it updates the
digest in the same commit and says why (CHANGELOG.md).

quickstart: exhaustive over both branches (no optimizer); planner: Vizier's quasi-random seeds then the
GP designer, with planner scaling policies.
"""

import hashlib
import json
from pathlib import Path

import pandas as pd
import pytest

from spica_pipeline.config import load_config
from spica_pipeline.sweep import run_sweep

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
# host timings differ between two runs of the same sweep; everything else must not
TIMING_COLUMNS = {"replay_seconds", "optimizer_seconds"}
DIGESTS = {
    "quickstart": ("f7913e7ee8404116", 344),
    "planner": ("34d80a612f96c068", 12),
}


def ledger_digest(frame: pd.DataFrame) -> str:
    """sha256 (16 hex digits) of the ledger's rows in (branch, trial) order, timing columns left out."""
    frame = frame.sort_values(["branch", "trial"]).reset_index(drop=True)
    columns = [c for c in frame.columns if c not in TIMING_COLUMNS]
    h = hashlib.sha256()
    for row in frame[columns].itertuples(index=False):
        cells = [None if isinstance(v, float) and v != v else v for v in row]
        h.update(json.dumps(cells, default=str).encode())
    return h.hexdigest()[:16]


@pytest.mark.parametrize("example", sorted(DIGESTS))
def test_an_example_gives_the_recorded_ledger(example, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    run_sweep(load_config(ROOT / "examples" / "configs" / f"{example}.yaml"), tmp_path)
    ledger = pd.read_parquet(tmp_path / "ledger.parquet")
    assert (ledger_digest(ledger), len(ledger)) == DIGESTS[example]
