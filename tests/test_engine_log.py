"""The replay runtime's own output (its Rust logger and per-replay progress bar write to file
descriptors 1 and 2 of the worker) goes to the run's logs/engine.log, never to the console."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from engine_log_fakes import NoisyEvaluator
from pool_fakes import probe

from spica_pipeline.evaluate.pool import ENGINE_LOG, EvaluationPool

ROOT = Path(__file__).resolve().parents[1]


def test_worker_output_goes_to_the_engine_log(tmp_path, capfd):
    log = tmp_path / ENGINE_LOG
    with EvaluationPool(NoisyEvaluator(), workers=2, max_eval_seconds=120, log_path=log) as pool:
        outcomes = pool.evaluate_wave([probe(value=1), probe(value=2), probe(value=3)])
    assert [o.status for o in outcomes] == ["feasible"] * 3
    assert all(o.derived["NO_COLOR"] == "1" and o.derived["DYN_SDK_DISABLE_ANSI_LOGGING"] == "1" for o in outcomes)
    text = log.read_text()
    # a worker still starting when the wave is done (a loaded machine) may never write: count those that did
    started = text.count("--- replay worker pid")
    assert 1 <= started <= 2 and text.count("warm-up line on fd 2") == started
    assert text.count("candidate line on fd 1") == 3 and text.count("candidate line on fd 2") == 3
    console = capfd.readouterr()
    assert "engine" not in console.out + console.err


def test_without_a_log_path_the_output_stays_on_stderr(capfd):
    with EvaluationPool(NoisyEvaluator(), workers=1, max_eval_seconds=120) as pool:
        [outcome] = pool.evaluate_wave([probe(value=1)])
    assert outcome.status == "feasible" and outcome.derived["NO_COLOR"] == "1"
    assert "candidate line on fd 2" in capfd.readouterr().err  # what the log file takes over


RAY_LOCAL = """
import sys
from engine_log_fakes import NoisyEvaluator
from pool_fakes import probe
from spica_pipeline.evaluate.ray_pool import RayEvaluationPool

with RayEvaluationPool(NoisyEvaluator(), workers=1, max_eval_seconds=120, num_cpus=1, log_path=sys.argv[1]) as pool:
    [out] = pool.evaluate_wave([probe(value=1)])
print(out.status)
"""


@pytest.mark.slow
def test_a_local_ray_writes_the_same_log(tmp_path):
    pytest.importorskip("ray")
    script, log = tmp_path / "ray_local.py", tmp_path / ENGINE_LOG
    script.write_text(RAY_LOCAL)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests")])
    run = subprocess.run([sys.executable, str(script), str(log)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == "feasible"
    text = log.read_text()
    assert "warm-up line on fd 2" in text and "candidate line on fd 1" in text
    assert "engine" not in run.stderr
