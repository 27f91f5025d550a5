"""The shared data files some tests read (a real Mooncake trace), and the rule for when one is missing.

CI always has the shared data next to the checkout, so a missing file there is a failure, never a
silent skip. Set SPICA_SHARED_DATA to the data folder when it lives elsewhere, or SPICA_ALLOW_SKIP=1
to skip these tests on a machine without it.
"""

import os
from pathlib import Path

import pytest

SHARED_DATA = Path(os.environ.get("SPICA_SHARED_DATA")
                   or Path(__file__).resolve().parents[2] / "shared" / "data")
REAL_TRACE = SHARED_DATA / "traces" / "mooncake_synthetic_trace.jsonl"


def require(path: Path) -> Path:
    """`path` when it exists; otherwise fail (skip only with SPICA_ALLOW_SKIP set)."""
    if path.is_file():
        return path
    message = (f"shared data file {path} is missing (set SPICA_SHARED_DATA to the folder holding "
               "traces/, or SPICA_ALLOW_SKIP=1 to skip the tests that need it)")
    if os.environ.get("SPICA_ALLOW_SKIP"):
        pytest.skip(message)
    pytest.fail(message)
