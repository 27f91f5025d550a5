"""File journal: survives torn writes, dedups outcomes, and the output-dir lock refuses a second sweep."""

import subprocess
import sys

import pytest

from spica_pipeline.journal import FileJournal, OutputDirBusy, RunLock
from spica_pipeline.search.evaluation import EvalOutcome


def test_journal_round_trip_and_torn_last_line(tmp_path):
    path = tmp_path / "journal.jsonl"
    j = FileJournal(path)
    j.put_suggestions("k1", [{"a": 1.0}], 0.5)
    j.put_outcome(3, "h1", EvalOutcome("feasible", report={"x": 1.0, "bad": float("inf")}, replay_seconds=0.2))
    j.put_outcome(4, "h1", EvalOutcome("failed", reason="ignored: first one wins"))
    j.close()
    with open(path, "ab") as fh:
        fh.write(b'{"kind": "outcome", "trial": 9, "spec_h')  # a write cut short by kill -9
    again = FileJournal(path)
    assert again.get_suggestions("k1") == [{"a": 1.0}]
    trial, outcome = again.get_outcome("h1")
    assert trial == 3 and outcome.status == "feasible" and outcome.report == {"x": 1.0, "bad": None}
    assert again.torn_records == 1 and again.loaded_records == 2
    again.close()


def test_second_sweep_on_the_same_directory_is_refused(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from spica_pipeline.journal import RunLock\n"
         f"with RunLock({str(tmp_path)!r}):\n    print('held', flush=True); time.sleep(30)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(OutputDirBusy, match="in use by another sweep"):
            with RunLock(tmp_path):
                pass
    finally:
        holder.kill()
        holder.wait()
    with RunLock(tmp_path):  # released when the holder died
        pass
