"""Reliability: kill -9 and resume, injected evaluator faults, concurrent sweeps, a busy directory.

The sweeps are tiny (Qwen3-32B on 2 H200s, agg, round robin, 40 requests of 512/64 tokens); what
costs time is starting real sweeps (imports, enumeration, spawned workers, report plots): the kill
test runs three `spica sweep` processes and the concurrency test three sweeps at once, so they are
marked slow (30-60 s on an idle 2-core machine, minutes on a busy one). The faults come from
`tests/reliability_fakes.py` (spawned workers import it by module path).
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent

TIMING_COLUMNS = ("replay_seconds", "optimizer_seconds")
# Report keys measured on the host's wall clock: the evaluator leaves them out of the report, which
# is what lets two runs with the same seed produce equal ledgers.
WALL_CLOCK_KEYS = ("wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s")


def tiny_config(**sweep) -> dict:
    return {
        "search_space": {
            "model_name": "Qwen/Qwen3-32B", "hardware_sku": "h200_sxm", "gpu_budget": 2,
            "deployment_mode": ["agg"], "backend": ["vllm"], "router_mode": ["round_robin"],
            "planner_scaling_policy": ["disabled"], "agg_max_num_seqs": [256, 512, 1024],
            "agg_max_num_batched_tokens": [8192, 16384],
        },
        "workload": {"isl": 512, "osl": 64, "request_rate": 4, "num_request_ratio": 10},
        "goal": {"target": "throughput_per_gpu"},
        "sweep": {"max_rounds": 3, "candidates_per_round": 2, "parallel_evals": 1, "max_eval_seconds": 120,
                  "algorithm": "QUASI_RANDOM_SEARCH", "seed": 0, **sweep},
    }


def write_config(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def env() -> dict:
    return {**os.environ, "DYN_LOG": "warn", "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)])}


def spica(*args: str) -> list[str]:
    return [sys.executable, "-m", "spica_pipeline", *args]


def outcome_hashes(journal: Path) -> list[str]:
    """spec_hash of every complete outcome record, in file order (a torn last line is skipped)."""
    hashes = []
    if not journal.exists():
        return hashes
    for raw in journal.read_bytes().splitlines():
        try:
            record = json.loads(raw)
        except ValueError:
            continue
        if record.get("kind") == "outcome":
            hashes.append(record["spec_hash"])
    return hashes


def content(ledger: pd.DataFrame) -> list[dict]:
    """Ledger rows without timings, in trial order, nested JSON parsed."""
    rows = []
    for row in ledger.sort_values("trial").to_dict("records"):
        row = {k: v for k, v in row.items() if k not in TIMING_COLUMNS}
        if isinstance(row.get("report"), str):
            report = json.loads(row["report"])
            assert not set(report) & set(WALL_CLOCK_KEYS), report
            row["report"] = report
        rows.append({k: (None if isinstance(v, float) and v != v else v) for k, v in row.items()})
    return rows


# ---------------------------------------------------------------------------------------------
# kill -9, then resume
# ---------------------------------------------------------------------------------------------

@pytest.mark.integration
@pytest.mark.slow
def test_kill_9_mid_sweep_then_resume_equals_an_uninterrupted_run(tmp_path):
    config = write_config(tmp_path / "tiny.yaml", tiny_config(max_rounds=4))
    ref_dir, run_dir = tmp_path / "reference", tmp_path / "killed"
    common = dict(cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    reference = subprocess.Popen(spica("sweep", "--config", str(config), "--output-dir", str(ref_dir)),
                                 **common)
    victim = subprocess.Popen(spica("sweep", "--config", str(config), "--output-dir", str(run_dir)), **common)
    journal = run_dir / "journal.jsonl"
    deadline = time.monotonic() + 240
    while not outcome_hashes(journal):
        assert victim.poll() is None, f"sweep ended before any outcome: {victim.communicate()}"
        assert time.monotonic() < deadline, "no outcome journalled within 240 s"
        time.sleep(0.02)
    os.kill(victim.pid, signal.SIGKILL)
    victim.communicate()
    assert victim.returncode == -signal.SIGKILL, "the sweep finished before the kill: make it longer"
    before = outcome_hashes(journal)
    assert before, "the kill came before the first outcome record"

    resumed = subprocess.run(spica("sweep", "--config", str(config), "--output-dir", str(run_dir)),
                             timeout=300, **common)
    assert resumed.returncode == 0, resumed.stderr
    out, err = reference.communicate(timeout=300)
    assert reference.returncode == 0, err

    ledger = pd.read_parquet(run_dir / "ledger.parquet")
    ref_ledger = pd.read_parquet(ref_dir / "ledger.parquet")
    assert list(ledger.columns) == list(ref_ledger.columns)
    assert content(ledger) == content(ref_ledger)

    after = outcome_hashes(journal)
    assert after[:len(before)] == before, "journalled outcomes were rewritten on resume"
    assert len(after) == len(set(after)), "an evaluation was journalled twice"
    assert sorted(after) == sorted(outcome_hashes(ref_dir / "journal.jsonl")), "an evaluation was lost"
    replayed = ledger[ledger["status"].isin(["feasible", "infeasible", "failed"])]
    assert sorted(replayed["spec_hash"]) == sorted(after)


# ---------------------------------------------------------------------------------------------
# injected evaluator faults
# ---------------------------------------------------------------------------------------------

def test_evaluator_exception_hang_and_death_are_recorded_and_the_sweep_completes(tmp_path):
    from reliability_fakes import FaultyEvaluator

    from spica_pipeline.config import SmartSearchConfig
    from spica_pipeline.sweep import run_sweep

    config = SmartSearchConfig.from_dict(
        tiny_config(policy="thorough", parallel_evals=2, candidates_per_round=2, max_eval_seconds=3))
    result = run_sweep(config, tmp_path / "out", evaluator=FaultyEvaluator())
    ledger = pd.read_parquet(tmp_path / "out" / "ledger.parquet")
    assert len(ledger) == len(result.ledger) == 18  # 3 parallel configs x 3 x 2 knob values, all of them
    fake = FaultyEvaluator()
    by_fault: dict[str, list[dict]] = {}
    for row in ledger.to_dict("records"):
        fault = fake.faults.get(fake.fault_key(json.loads(row["config"])))
        by_fault.setdefault(fault or "ok", []).append(row)
    assert [r["status"] for r in by_fault["raise"]] == ["failed"]
    assert "RuntimeError: injected evaluator fault" in by_fault["raise"][0]["reason"]
    assert [r["status"] for r in by_fault["hang"]] == ["timed_out"]
    assert "exceed runtime" in by_fault["hang"][0]["reason"]
    assert [r["status"] for r in by_fault["exit"]] == ["failed"]
    assert "worker process died (exit code 3)" in by_fault["exit"][0]["reason"]
    assert {r["status"] for r in by_fault["ok"]} == {"feasible"} and len(by_fault["ok"]) == 15
    for row in ledger.to_dict("records"):
        assert row["status"] == "feasible" or "\n" not in row["reason"]
    # candidates the fake replays alike fold into one row each: every feasible trial is still counted
    assert sum(1 + len(c.twins) for c in result.merge.candidates) == 15
    assert (tmp_path / "out" / "report.md").exists()


# ---------------------------------------------------------------------------------------------
# two sweeps at once, and a second sweep on a busy directory
# ---------------------------------------------------------------------------------------------

HOLDER = """
import sys
from reliability_fakes import FaultyEvaluator
from spica_pipeline.config import load_config
from spica_pipeline.sweep import run_sweep

if __name__ == "__main__":
    evaluator = FaultyEvaluator(faults={}, gate_file=sys.argv[3])
    result = run_sweep(load_config(sys.argv[1]), sys.argv[2], evaluator=evaluator)
    print(len(result.ledger))
"""


@pytest.mark.slow
def test_concurrent_sweeps_succeed_and_a_busy_directory_is_refused(tmp_path):
    config = write_config(tmp_path / "tiny.yaml", tiny_config(policy="thorough", parallel_evals=1))
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    gate = tmp_path / "go"
    dirs = [tmp_path / "a", tmp_path / "b"]
    common = dict(cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sweeps = [subprocess.Popen([sys.executable, str(script), str(config), str(d), str(gate)], **common)
              for d in dirs]
    try:
        lock = dirs[0] / ".spica.lock"
        deadline = time.monotonic() + 120
        while not (lock.exists() and lock.read_text().strip() == str(sweeps[0].pid)):
            assert sweeps[0].poll() is None, sweeps[0].communicate()
            assert time.monotonic() < deadline, "first sweep never took its lock"
            time.sleep(0.05)
        second = subprocess.run(spica("sweep", "--config", str(config), "--output-dir", str(dirs[0])),
                                timeout=120, **common)
        assert second.returncode == 2
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and "in use by another sweep" in lines[0] and str(sweeps[0].pid) in lines[0]
        assert "Traceback" not in second.stderr + second.stdout
    finally:
        gate.touch()
    results = [s.communicate(timeout=180) for s in sweeps]
    for sweep, (out, err) in zip(sweeps, results):
        assert sweep.returncode == 0, err
        assert out.strip().splitlines()[-1] == "18"
    ledgers = [pd.read_parquet(d / "ledger.parquet") for d in dirs]
    assert [len(x) for x in ledgers] == [18, 18]
    assert content(ledgers[0]) == content(ledgers[1])  # the refused sweep left the first one intact
    assert (dirs[0] / "report.md").exists() and (dirs[0] / "candidates.csv").exists()


# ---------------------------------------------------------------------------------------------
# randomized crash test: kill -9 at 10 seeded random points of one sweep, resume each time
# ---------------------------------------------------------------------------------------------

CLI_DRIVER = """
import json, sys
from reliability_fakes import FaultyEvaluator
from spica_pipeline.cli import main

if __name__ == "__main__":
    kwargs = json.loads(sys.argv[1])
    kwargs["faults"] = {(a, b): kind for a, b, kind in kwargs.pop("fault_list")}
    sys.exit(main(sys.argv[2:], evaluator=FaultyEvaluator(**kwargs)))
"""
CRASH_FAULTS = [[512, 8192, "raise"], [1024, 16384, "exit"]]  # failed trials are journalled too


@pytest.mark.slow
def test_kill_9_at_ten_seeded_random_points_then_resume_equals_an_uninterrupted_run(tmp_path):
    import random

    from reliability_fakes import FaultyEvaluator

    from spica_pipeline.config import SmartSearchConfig
    from spica_pipeline.sweep import run_sweep

    workers, kills, seed = 2, 10, 20
    data = tiny_config(policy="thorough", parallel_evals=workers, candidates_per_round=workers)
    config = write_config(tmp_path / "tiny.yaml", data)
    faults = {(a, b): kind for a, b, kind in CRASH_FAULTS}
    reference = run_sweep(SmartSearchConfig.from_dict(data), tmp_path / "reference",
                          evaluator=FaultyEvaluator(faults=faults)).ledger
    total = len(reference)
    assert total == 18

    script = tmp_path / "driver.py"
    script.write_text(CLI_DRIVER)
    run_dir, calls = tmp_path / "crashed", tmp_path / "calls.txt"
    journal = run_dir / "journal.jsonl"
    fake = json.dumps({"fault_list": CRASH_FAULTS, "delay_seconds": 0.15, "calls_file": str(calls)})
    cmd = [sys.executable, str(script), fake, "sweep", "--config", str(config), "--output-dir", str(run_dir)]
    rng = random.Random(seed)
    schedule = [(target, rng.uniform(0.0, 0.3)) for target in sorted(rng.sample(range(1, total), kills))]
    killed = 0
    for target, extra in schedule:
        # no pipes: orphaned workers of a killed sweep could hold them open
        victim = subprocess.Popen(cmd, cwd=ROOT, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 240
        while len(outcome_hashes(journal)) < target and victim.poll() is None:
            assert time.monotonic() < deadline, "no progress within 240 s"
            time.sleep(0.01)
        time.sleep(extra)
        victim.kill()
        victim.wait(timeout=60)
        if victim.returncode == -signal.SIGKILL:
            killed += 1
        hashes = outcome_hashes(journal)
        assert len(hashes) == len(set(hashes)), "an evaluation was journalled twice"
    assert killed >= kills - 1, f"only {killed} of {kills} kills landed before the sweep ended"

    final = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
    assert final.returncode == 0, final.stderr
    ledger = pd.read_parquet(run_dir / "ledger.parquet")
    assert content(ledger) == content(reference)
    hashes = outcome_hashes(journal)
    assert sorted(hashes) == sorted(reference["spec_hash"]) and len(hashes) == len(set(hashes))
    for raw in journal.read_bytes().splitlines():  # every torn tail was cut back
        json.loads(raw)
    evaluations = calls.read_text().split()
    redone = len(evaluations) - len(set(evaluations))
    assert set(evaluations) == set(reference["spec_hash"])
    print(f"{killed} kills, {len(evaluations)} evaluations for {total} trials: {redone} redone "
          f"(bound {workers * killed})")
    assert redone <= workers * killed, f"{redone} evaluations redone over {killed} kills with {workers} workers"
