"""Optional data outside the project that a few tests read (a real Mooncake trace), and the rule for
when it is missing.

The project's tests use data in the project (examples/traces/, tests/data/, or a trace generated in
the test); the real trace is optional: ../shared/data/traces/README.md asks that it is not copied
into the project. A test that needs it skips, naming the file and how to provide it, on a clone
without it. Set SPICA_SHARED_DATA to the data folder when it lives elsewhere, and
SPICA_REQUIRE_SHARED_DATA=1 where it must be present (a missing file is then a failure).
"""

import os
from pathlib import Path

import pytest

SHARED_DATA = Path(os.environ.get("SPICA_SHARED_DATA")
                   or Path(__file__).resolve().parents[2] / "shared" / "data")
REAL_TRACE = SHARED_DATA / "traces" / "mooncake_synthetic_trace.jsonl"


def require(path: Path) -> Path:
    """`path` when it exists; otherwise skip the test with the reason (fail with
    SPICA_REQUIRE_SHARED_DATA set)."""
    if path.is_file():
        return path
    message = (f"optional shared data file {path} is absent (set SPICA_SHARED_DATA to the folder holding "
               "traces/ to run this test)")
    if os.environ.get("SPICA_REQUIRE_SHARED_DATA"):
        pytest.fail(message + "; SPICA_REQUIRE_SHARED_DATA is set")
    pytest.skip(message)
