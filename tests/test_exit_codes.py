"""Exit codes tell the truth (issue 20 item 4, issue 17 item 5): 2 for bad input before any replay,
3 for a bug (one line naming the log, --debug prints the traceback), 4 for the machine failing
mid-sweep, 130 / 143 for SIGINT / SIGTERM with a flush and a resume hint.

The sweeps run the real CLI (`spica_pipeline.cli.main`) with the fault-injecting stand-in of
`tests/reliability_fakes.py` instead of the replay, so they take seconds, not minutes.
"""

import errno
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from reliability_fakes import FaultyEvaluator
from test_reliability import ROOT, content, env, outcome_hashes, tiny_config, write_config

from spica_pipeline import cli

# raise and die are recorded as failed trials; no hang (a timed-out trial is not journalled yet)
FAULTS = [[512, 8192, "raise"], [1024, 16384, "exit"]]

DRIVER = """
import json, sys
from reliability_fakes import FaultyEvaluator
from spica_pipeline.cli import main

if __name__ == "__main__":
    kwargs = json.loads(sys.argv[1])
    kwargs["faults"] = {(a, b): kind for a, b, kind in kwargs.get("faults", [])}
    sys.exit(main(sys.argv[2:], evaluator=FaultyEvaluator(**kwargs)))
"""


def thorough_config(tmp_path: Path, **sweep) -> Path:
    return write_config(tmp_path / "tiny.yaml",
                        tiny_config(policy="thorough", parallel_evals=2, candidates_per_round=2, **sweep))


def fake(**kwargs) -> FaultyEvaluator:
    kwargs.setdefault("faults", FAULTS)
    kwargs["faults"] = {(a, b): kind for a, b, kind in kwargs["faults"]}
    return FaultyEvaluator(**kwargs)


def driver(tmp_path: Path, fake_kwargs: dict, *args: str) -> list[str]:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    fake_kwargs = {"faults": FAULTS, **fake_kwargs}
    return [sys.executable, str(script), json.dumps(fake_kwargs), *args]


def stderr_lines(text: str) -> list[str]:
    return [line for line in text.strip().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> pd.DataFrame:
    """The ledger of an uninterrupted run of the thorough tiny sweep with the standard faults."""
    tmp = tmp_path_factory.mktemp("reference")
    config = thorough_config(tmp)
    assert cli.main(["sweep", "--config", str(config), "--output-dir", str(tmp / "out")],
                    evaluator=fake()) == 0
    return pd.read_parquet(tmp / "out" / "ledger.parquet")


# ---------------------------------------------------------------------------------------------
# 2: bad input, refused before any replay
# ---------------------------------------------------------------------------------------------

def test_output_dir_under_a_file_is_exit_2_before_any_replay(tmp_path, capsys):
    config = thorough_config(tmp_path)
    (tmp_path / "hostname").write_text("x\n")
    calls = tmp_path / "calls"
    code = cli.main(["sweep", "--config", str(config), "--output-dir", str(tmp_path / "hostname" / "x")],
                    evaluator=fake(calls_file=str(calls)))
    err = capsys.readouterr().err
    assert code == 2, err
    lines = stderr_lines(err)
    assert len(lines) == 1 and "--output-dir" in lines[0] and "is not a directory" in lines[0], lines
    assert "resume" not in lines[0]
    assert not calls.exists(), "a replay ran before the output directory was checked"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory anyway")
def test_read_only_output_dir_is_exit_2(tmp_path, capsys):
    config = thorough_config(tmp_path)
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o500)
    try:
        code = cli.main(["sweep", "--config", str(config), "--output-dir", str(out)], evaluator=fake())
    finally:
        out.chmod(0o700)
    lines = stderr_lines(capsys.readouterr().err)
    assert code == 2 and len(lines) == 1 and "not writable" in lines[0], lines


def test_damaged_journal_is_exit_2_naming_the_line_and_repair_continues(tmp_path, capsys, reference):
    config = thorough_config(tmp_path)
    out = tmp_path / "out"
    assert cli.main(["sweep", "--config", str(config), "--output-dir", str(out)], evaluator=fake()) == 0
    journal = out / "journal.jsonl"
    lines = journal.read_bytes().splitlines(keepends=True)
    lines[2] = b'{"kind": "outcome"}\n'  # valid JSON of the wrong shape, in the middle
    journal.write_bytes(b"".join(lines))
    capsys.readouterr()

    calls = tmp_path / "calls"
    code = cli.main(["sweep", "--config", str(config), "--output-dir", str(out)],
                    evaluator=fake(calls_file=str(calls)))
    err = stderr_lines(capsys.readouterr().err)
    assert code == 2, err
    assert err[-1].startswith(f"journal {journal}:3: damaged record"), err  # one line; progress lines before
    assert "'trial' must be an integer" in err[-1] and "--repair" in err[-1]
    assert not any("KeyError" in line or "Traceback" in line for line in err) and not calls.exists()

    code = cli.main(["sweep", "--config", str(config), "--output-dir", str(out), "--repair"],
                    evaluator=fake(calls_file=str(calls)))
    err = capsys.readouterr().err
    assert code == 0, err
    assert "journal.jsonl.quarantine" in err and "warning:" in err
    assert len(calls.read_text().split()) == 1, "only the quarantined outcome is recomputed"
    quarantined = [json.loads(x) for x in (out / "journal.jsonl.quarantine").read_text().splitlines()]
    assert [q["line"] for q in quarantined] == [3]
    assert content(pd.read_parquet(out / "ledger.parquet")) == content(reference)


# ---------------------------------------------------------------------------------------------
# 3: a bug is one line naming the log; --debug prints the traceback
# ---------------------------------------------------------------------------------------------

class UnpicklableEvaluator(FaultyEvaluator):
    """A stand-in the spawned pool cannot ship to its workers: a programming error in the main process."""

    def __init__(self):
        super().__init__(faults={})
        self.hook = lambda: None


def test_internal_error_is_exit_3_one_line_naming_the_log(tmp_path, capsys):
    config = thorough_config(tmp_path)
    out = tmp_path / "out"
    code = cli.main(["sweep", "--config", str(config), "--output-dir", str(out)],
                    evaluator=UnpicklableEvaluator())
    err = capsys.readouterr().err
    lines = stderr_lines(err)
    assert code == 3, err
    assert lines[-1].startswith("internal error") and "Traceback" not in err, lines
    assert not any(line.startswith("internal error") for line in lines[:-1])
    log = out / "spica-error.log"
    assert str(log) in lines[-1] and "--debug" in lines[-1]
    assert "Traceback (most recent call last)" in log.read_text()

    code = cli.main(["sweep", "--config", str(config), "--output-dir", str(out), "--debug"],
                    evaluator=UnpicklableEvaluator())
    err = capsys.readouterr().err
    assert code == 3 and "Traceback (most recent call last)" in err
    assert stderr_lines(err)[-1].startswith("internal error")


class _AlwaysFails(FaultyEvaluator):
    def evaluate(self, request):
        raise RuntimeError("injected: every candidate fails")


def test_exit_1_stays_nothing_feasible(tmp_path, capsys):
    config = thorough_config(tmp_path)
    code = cli.main(["sweep", "--config", str(config), "--output-dir", str(tmp_path / "out")],
                    evaluator=_AlwaysFails(faults={}))
    err = capsys.readouterr().err
    assert code == 1 and "no feasible candidate found" in err, err


# ---------------------------------------------------------------------------------------------
# 4: the machine fails mid-sweep
# ---------------------------------------------------------------------------------------------

def _file_size_limit(limit: int):
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_environment_failure_mid_sweep_is_exit_4_and_a_rerun_resumes(tmp_path, reference):
    config = thorough_config(tmp_path)
    out = tmp_path / "out"
    common = dict(cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
    proc = subprocess.run(driver(tmp_path, {}, "sweep", "--config", str(config), "--output-dir", str(out)),
                          preexec_fn=_file_size_limit(6000), **common)
    lines = stderr_lines(proc.stderr)
    assert proc.returncode == 4, proc.stderr
    assert lines[-1].startswith("environment failure: file too large"), lines
    assert "ulimit -f" in lines[-1] and "run the same command again" in lines[-1]
    assert "Traceback" not in proc.stderr
    journalled = outcome_hashes(out / "journal.jsonl")
    assert journalled, "nothing was journalled before the failure"
    assert (out / "journal.jsonl").read_bytes().endswith(b"\n")

    proc = subprocess.run(driver(tmp_path, {}, "sweep", "--config", str(config), "--output-dir", str(out)),
                          **common)
    assert proc.returncode == 0, proc.stderr
    assert content(pd.read_parquet(out / "ledger.parquet")) == content(reference)
    assert outcome_hashes(out / "journal.jsonl")[:len(journalled)] == journalled


def test_environment_failure_messages():
    out = Path("/runs/x")
    full = cli.common.environment_failure(OSError(errno.ENOSPC, "No space left on device", "/runs/x/ledger.parquet"), out)
    assert full.startswith("environment failure: no space left on device writing /runs/x/ledger.parquet")
    assert "free space on the filesystem holding /runs/x" in full and "are not recomputed" in full
    assert "read-only" in cli.common.environment_failure(OSError(errno.EROFS, "Read-only file system"), out)
    assert "out of memory" in cli.common.environment_failure(MemoryError(), out)
    assert cli.common.environment_failure(FileNotFoundError(errno.ENOENT, "gone", "/opt/data.csv"), out) is None
    assert cli.common.environment_failure(KeyError("x"), out) is None


# ---------------------------------------------------------------------------------------------
# 130 / 143: interrupted, flushed, resumable
# ---------------------------------------------------------------------------------------------

def _interrupt(cmd: list[str], journal: Path, sig: signal.Signals, after_outcomes: int) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while len(outcome_hashes(journal)) < after_outcomes:
        assert proc.poll() is None, f"sweep ended before the signal: {proc.communicate()}"
        assert time.monotonic() < deadline, "no progress within 240 s"
        time.sleep(0.02)
    proc.send_signal(sig)
    proc.out, proc.err = proc.communicate(timeout=120)
    return proc


@pytest.mark.slow
def test_sigint_and_sigterm_flush_and_print_the_resume_hint_then_resume_equals(tmp_path, reference):
    config = thorough_config(tmp_path)
    out = tmp_path / "out"
    journal = out / "journal.jsonl"
    cmd = driver(tmp_path, {"delay_seconds": 0.4}, "sweep", "--config", str(config), "--output-dir", str(out))
    for sig, code, word in ((signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated (SIGTERM)")):
        before = len(outcome_hashes(journal))
        proc = _interrupt(cmd, journal, sig, before + 2)
        assert proc.returncode == code, proc.err
        last = stderr_lines(proc.err)[-1]
        assert last.startswith(word) and "run the same command again to resume" in last, proc.err
        assert "Traceback" not in proc.err
        partial = pd.read_parquet(out / "ledger.parquet")  # the partial ledger was flushed, readable
        assert set(partial["spec_hash"].dropna()) <= set(outcome_hashes(journal))
    proc = subprocess.run(driver(tmp_path, {}, "sweep", "--config", str(config), "--output-dir", str(out)),
                          cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert content(pd.read_parquet(out / "ledger.parquet")) == content(reference)
    hashes = outcome_hashes(journal)
    assert len(hashes) == len(set(hashes))


# ---------------------------------------------------------------------------------------------
# a real full disk and a real read-only filesystem (a small tmpfs; skipped where mount is not allowed)
# ---------------------------------------------------------------------------------------------

def _mount_tmpfs(path: Path, options: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    try:
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                              capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0


@pytest.fixture
def tmpfs(tmp_path):
    mounted: list[Path] = []

    def mount(name: str, options: str) -> Path:
        path = tmp_path / name
        if not _mount_tmpfs(path, options):
            pytest.skip("cannot mount a tmpfs here (needs root and mount permission)")
        mounted.append(path)
        return path

    yield mount
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def test_read_only_filesystem_output_dir_is_exit_2(tmp_path, tmpfs, capsys):
    config = thorough_config(tmp_path)
    ro = tmpfs("ro", "ro,size=1m")
    calls = tmp_path / "calls"
    code = cli.main(["sweep", "--config", str(config), "--output-dir", str(ro / "run")],
                    evaluator=fake(calls_file=str(calls)))
    lines = stderr_lines(capsys.readouterr().err)
    assert code == 2 and len(lines) == 1, lines
    assert "not writable" in lines[0] and "Read-only file system" in lines[0] and "resume" not in lines[0]
    assert not calls.exists()


def test_disk_full_mid_sweep_is_exit_4_and_a_rerun_after_freeing_space_resumes(tmp_path, tmpfs, reference):
    config = thorough_config(tmp_path)
    disk = tmpfs("disk", "size=24k")
    out = disk / "run"
    cmd = driver(tmp_path, {}, "sweep", "--config", str(config), "--output-dir", str(out))
    common = dict(cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
    proc = subprocess.run(cmd, **common)
    lines = stderr_lines(proc.stderr)
    assert proc.returncode == 4, proc.stderr
    assert lines[-1].startswith("environment failure: no space left on device"), lines
    assert f"free space on the filesystem holding {out}" in lines[-1] and "run the same command again" in lines[-1]
    assert "Traceback" not in proc.stderr and "the journal resumes them" not in proc.stderr
    journal = out / "journal.jsonl"
    journalled = outcome_hashes(journal)
    for raw in journal.read_bytes().splitlines():  # no half record left behind
        json.loads(raw)

    subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True, timeout=30)  # space freed
    proc = subprocess.run(cmd, **common)
    assert proc.returncode == 0, proc.stderr
    assert content(pd.read_parquet(out / "ledger.parquet")) == content(reference)
    assert outcome_hashes(journal)[:len(journalled)] == journalled
