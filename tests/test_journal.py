"""File journal: survives torn writes, dedups outcomes, and the output-dir lock refuses a second sweep."""

import subprocess
import sys

import pytest

from spica_pipeline.evaluate.evaluator import EvalOutcome
from spica_pipeline.optimize.journal import FileJournal, OutputDirBusy, RunLock


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
         "import sys, time; from spica_pipeline.optimize.journal import RunLock\n"
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


# ---------------------------------------------------------------------------------------------
# crash safety (issue 20 item 2)
# ---------------------------------------------------------------------------------------------

import json  # noqa: E402
import os  # noqa: E402

from spica_pipeline.errors import JournalError  # noqa: E402
from spica_pipeline.optimize.journal import FORMAT_VERSION  # noqa: E402


def _journal_with_three(path):
    j = FileJournal(path)
    for i in range(3):
        j.put_outcome(i + 1, f"h{i + 1}", EvalOutcome("feasible", report={"x": float(i)}, replay_seconds=1600.0))
    j.close()
    return path.read_bytes().splitlines(keepends=True)


def test_records_carry_the_format_version(tmp_path):
    lines = _journal_with_three(tmp_path / "journal.jsonl")
    assert all(json.loads(line)["v"] == FORMAT_VERSION for line in lines)


def test_torn_tail_is_cut_with_one_warning_and_the_next_append_starts_a_fresh_line(tmp_path):
    path = tmp_path / "journal.jsonl"
    lines = _journal_with_three(path)
    path.write_bytes(b"".join(lines) + lines[0][:40])  # kill -9 mid-write: no final newline
    j = FileJournal(path)
    assert j.loaded_records == 3 and j.torn_records == 1
    assert len(j.warnings) == 1 and f"{path}:4: cut a torn last record" in j.warnings[0]
    assert path.read_bytes() == b"".join(lines)
    j.put_outcome(4, "h4", EvalOutcome("failed", reason="x"))
    j.close()
    again = FileJournal(path)  # the bug of issue 20: the redone record was glued onto the cut line
    assert again.loaded_records == 4 and again.torn_records == 0 and again.warnings == []
    again.close()


def test_unparseable_last_line_is_a_torn_tail_too(tmp_path):
    path = tmp_path / "journal.jsonl"
    lines = _journal_with_three(path)
    path.write_bytes(b"".join(lines) + b'{"kind": "outcome", "tri\n')
    j = FileJournal(path)
    assert j.loaded_records == 3 and len(j.warnings) == 1 and ":4:" in j.warnings[0]
    assert path.read_bytes() == b"".join(lines)
    j.close()


@pytest.mark.parametrize("bad, why", [
    (b'...1600.0{"kind": "outcome", "trial": 2}\n', "not valid JSON"),  # the glued line of issue 20
    (b"[1, 2]\n", "expected a JSON object, got list"),
    (b'{"kind": "outcome"}\n', "'trial' must be an integer"),
    (b'{"kind": "suggest", "key": 3, "suggestions": []}\n', "'key' must be a string"),
    (b'{"kind": "weird"}\n', "unknown record kind 'weird'"),
    (b'{"v": 99, "kind": "outcome"}\n', "format version 99 is newer"),
    (b'{"kind": "outcome", "trial": 1, "spec_hash": "h", "outcome": {"status": "great"}}\n',
     "'outcome.status' must be one of"),
])
def test_a_damaged_middle_record_names_file_and_line(tmp_path, bad, why):
    path = tmp_path / "journal.jsonl"
    lines = _journal_with_three(path)
    path.write_bytes(lines[0] + bad + lines[1] + lines[2])
    with pytest.raises(JournalError) as info:
        FileJournal(path)
    message = str(info.value)
    assert message.startswith(f"journal {path}:2: damaged record") and why in message and "--repair" in message
    assert "\n" not in message
    assert path.read_bytes() == lines[0] + bad + lines[1] + lines[2]  # refused, not changed


def test_a_wrongly_shaped_last_record_is_damage_not_a_torn_write(tmp_path):
    path = tmp_path / "journal.jsonl"
    lines = _journal_with_three(path)
    path.write_bytes(b"".join(lines) + b'{"kind": "outcome"}\n')
    with pytest.raises(JournalError, match=r":4: damaged record"):
        FileJournal(path)


def test_repair_quarantines_damaged_records_and_keeps_the_rest(tmp_path):
    path = tmp_path / "journal.jsonl"
    lines = _journal_with_three(path)
    path.write_bytes(lines[0] + b"[1, 2]\n" + lines[1] + b"garbage\n" + lines[2])
    j = FileJournal(path, repair=True)
    assert j.loaded_records == 3 and j.quarantined_records == 2
    assert len(j.warnings) == 1 and "moved 2 damaged record(s) (line 2, 4" in j.warnings[0]
    assert set(j.outcomes) == {"h1", "h2", "h3"}
    j.close()
    assert path.read_bytes() == b"".join(lines)
    quarantined = [json.loads(x) for x in j.quarantine_path.read_text().splitlines()]
    assert [(q["line"], q["raw"]) for q in quarantined] == [(2, "[1, 2]"), (4, "garbage")]
    FileJournal(path).close()  # clean now


def test_a_failed_append_is_cut_back_so_no_half_line_stays(tmp_path):
    """A write past the file-size limit is short, then fails (EFBIG), like a disk filling up."""
    path = tmp_path / "journal.jsonl"
    script = (
        "import resource, signal, sys\n"
        "from spica_pipeline.optimize.journal import FileJournal\n"
        "from spica_pipeline.evaluate.evaluator import EvalOutcome\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))\n"
        f"j = FileJournal({str(path)!r})\n"
        "try:\n"
        "    for i in range(100):\n"
        "        j.put_outcome(i, f'h{i}', EvalOutcome('feasible', report={'x': 1.0}))\n"
        "except OSError as exc:\n"
        "    print(exc.errno, exc.filename, len(j.outcomes))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    code, filename, kept = proc.stdout.split()
    assert int(code) == 27 and filename == str(path)  # EFBIG
    data = path.read_bytes()
    assert data.endswith(b"\n") and len(data) <= 1000
    j = FileJournal(path)
    assert j.loaded_records == int(kept) > 0 and j.warnings == []
    j.close()


def test_journal_path_that_is_a_directory_is_bad_input(tmp_path):
    (tmp_path / "journal.jsonl").mkdir()
    with pytest.raises(JournalError, match="is not a regular file"):
        FileJournal(tmp_path / "journal.jsonl")


def test_output_files_honour_the_umask(tmp_path):
    from spica_pipeline.storage import atomic_write_text

    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "a.txt", "x")
        os.umask(0o077)
        atomic_write_text(tmp_path / "b.txt", "x")
        FileJournal(tmp_path / "journal.jsonl").close()
    finally:
        os.umask(old)
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "b.txt").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "journal.jsonl").stat().st_mode & 0o777 == 0o600


def test_record_log_rows_equal_the_ledger_built_at_the_end():
    """The anytime writes read rows built once per record; they must equal a ledger built at the end."""
    from spica_pipeline.optimize.ledger import TrialRecord
    from spica_pipeline.sweep import RecordLog, ledger_frame

    records = [TrialRecord("agg", i, i // 2, "vizier", "feasible" if i % 3 else "failed", None if i % 3 else "boom",
                           f"h{i}", parameters={"x": i, "nested": {"y": [1.0, float("inf")]}},
                           report={"tok": i * 1.5}, score=float("nan") if i == 4 else float(i), objectives={"a": 1.0})
               for i in range(7)]
    log = RecordLog()
    for rec in records:
        log.append(rec)
    assert log.frame().equals(ledger_frame(records))
    assert RecordLog().frame().columns.tolist() == ledger_frame([]).columns.tolist()


def test_shapes_hash_like_their_field_tuples():
    """Shapes cache their hash; the value must stay the dataclass one (set and dict orders)."""
    from spica_pipeline.space.shapes import DisaggShape, RoleShape

    a, b = RoleShape(tp=2, replicas=3), RoleShape(tp=4, moe_ep=4)
    assert hash(a) == hash((2, 1, 1, 1, 1, 3)) and hash(a) == hash(a)
    assert hash(DisaggShape(a, b)) == hash((a, b)) and {DisaggShape(a, b): 1}[DisaggShape(a, b)] == 1


def test_anytime_result_defers_writes_that_would_cost_more_than_their_share(monkeypatch):
    """After a write that took 1 s, the next one waits until 10 s (share 0.1) have passed; a
    deferred write stays pending, so the caller can flush it when the sweep stops."""
    from spica_pipeline import sweep

    now = [0.0]
    writes = []

    def fake_write(output_dir, config, log):
        writes.append(now[0])
        now[0] += 1.0  # every write costs 1 s

    monkeypatch.setattr(sweep, "write_anytime", fake_write)
    anytime = sweep.AnytimeResult(None, None, sweep.RecordLog(), share=0.1, clock=lambda: now[0])
    anytime.after_batch()  # t=0: written, ends at 1, next not before 11
    for t in (2.0, 5.0, 10.9):
        now[0] = t
        anytime.after_batch()
    assert writes == [0.0] and anytime.pending
    now[0] = 11.0
    anytime.after_batch()
    assert writes == [0.0, 11.0] and not anytime.pending
