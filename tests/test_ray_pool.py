"""The Ray evaluation backend on a 2-node Ray cluster on 127.0.0.1 (ray.cluster_utils.Cluster),
started and stopped by this module: streaming, timeouts, lost workers and nodes, the same ledger
as the local pool, and resume after the driver is killed.

Each node has one CPU (one actor); the evaluators are the fakes of tests/*_fakes.py, shipped to the
workers by value. Starting the cluster costs ~10 s; the sweeps are the reliability suite's tiny
thorough sweep (18 candidates, one hang of 3 s). The node-death test runs last: it removes a node.
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

ray = pytest.importorskip("ray")

from pool_fakes import FakeEvaluator, probe  # noqa: E402
from ray_fakes import PacedEvaluator, register_by_value, watchdog  # noqa: E402
from reliability_fakes import FaultyEvaluator  # noqa: E402

from spica_pipeline.config import SmartSearchConfig  # noqa: E402
from spica_pipeline.evaluate.evaluator import EvalRequest  # noqa: E402
from spica_pipeline.evaluate.pool import evaluate_safely  # noqa: E402
from spica_pipeline.evaluate.ray_pool import RayEvaluationPool, loopback_only  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
NODE = dict(num_cpus=1, object_store_memory=80 * 1024 * 1024, include_dashboard=False)
# notice a removed node in ~2 s instead of ~30 s
FAST_HEALTH = {"health_check_period_ms": 500, "health_check_failure_threshold": 4, "health_check_timeout_ms": 500}


# Ray gives a starting raylet a fixed 30 s to register with the GCS; on a 2-core host under a load
# average of 10-20 (other test suites running) it can miss that every time. That is the host, not
# this code: such a run is skipped with the load average named, never passed.
STARTUP_TIMEOUT = "The current node timed out during startup"


def overloaded(err) -> None:
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    pytest.skip(f"Ray could not start on this host (load average {load}): {str(err).splitlines()[-1][:200]}")


def req(behaviour="ok", **extra):
    return probe(behaviour, **extra)


@pytest.fixture(scope="module", autouse=True)
def bounded():
    """This module takes 2-5 min here; 20 min means a hang (started before the cluster fixture)."""
    yield from watchdog(1200)


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    os.environ.pop("RAY_ADDRESS", None)
    loopback_only()  # every node and server on 127.0.0.1
    register_by_value()
    for attempt in (1, 2, 3):
        c = Cluster(initialize_head=False, shutdown_at_exit=True)
        try:
            c.add_node(**NODE, _system_config=FAST_HEALTH)
            c.worker = c.add_node(**NODE)
            c.wait_for_nodes()
            c.connect()
            break
        except Exception as err:
            c.shutdown()
            if attempt == 3:
                if STARTUP_TIMEOUT in str(err):
                    overloaded(err)
                raise
    yield c
    ray.shutdown()
    c.shutdown()


def wait_ready(pool, n: int, timeout: float = 120.0) -> list[dict]:
    """Warm the pool until `n` actors answered their start probe."""
    deadline = time.monotonic() + timeout
    while len(pool.workers_info()) < n:
        assert time.monotonic() < deadline, f"only {len(pool.workers_info())} of {n} Ray workers started"
        pool.evaluate_wave([req()])
    return pool.workers_info()


# ---- choosing the backend (no Ray started) ------------------------------------------------

def test_executor_choice_config_cli_and_dagster_resource():
    from spica_pipeline.cli import build_parser
    from spica_pipeline.cli.sweep import _with_overrides
    from spica_pipeline.dagster.config import config_hash
    from spica_pipeline.dagster.resources import EvaluationBackendResource
    from spica_pipeline.evaluate.pool import EvaluationPool

    local = SmartSearchConfig.from_dict(tiny_config())
    on_ray = SmartSearchConfig.from_dict(tiny_config(executor="ray", ray_address="127.0.0.1:6379"))
    assert local.sweep.executor == "local" and on_ray.sweep.executor == "ray"
    assert config_hash(local) == config_hash(on_ray)  # where replays run never changes a result
    with pytest.raises(Exception, match="executor"):
        SmartSearchConfig.from_dict(tiny_config(executor="dask"))

    args = build_parser().parse_args(["sweep", "--config", "x.yaml", "--executor", "ray", "--ray-address", "h:1"])
    overridden = _with_overrides(local, args)
    assert (overridden.sweep.executor, overridden.sweep.ray_address) == ("ray", "h:1")

    with EvaluationBackendResource().open(FakeEvaluator(), local.sweep) as pool:
        assert type(pool) is EvaluationPool and pool.workers == 2 and pool.max_eval_seconds == 3
    with EvaluationBackendResource().open(FakeEvaluator(), on_ray.sweep) as pool:  # lazy: nothing starts
        assert type(pool) is RayEvaluationPool and pool.address == "127.0.0.1:6379"
    with EvaluationBackendResource(executor="ray", ray_address="ray://head:10001").open(
            FakeEvaluator(), local.sweep) as pool:
        assert type(pool) is RayEvaluationPool and pool.address == "ray://head:10001"


# ---- no address: a Ray of our own on 127.0.0.1, shut down on close ----------------------

LOCAL = """
import json, os, sys
from pool_fakes import FakeEvaluator, probe
from ray_fakes import register_by_value
from spica_pipeline.evaluate.ray_pool import RayEvaluationPool

if __name__ == "__main__":
    import ray
    register_by_value()
    with RayEvaluationPool(FakeEvaluator(), workers=1, max_eval_seconds=60) as pool:
        (out,) = pool.evaluate_wave([probe(value=3)])
        info = pool.workers_info()
        node = ray._private.worker._global_node
        pids = [p.process.pid for ps in node.all_processes.values() for p in ps]
        address = node.address
    alive = []
    for pid in pids + [info[0]["pid"]]:
        try:
            os.kill(pid, 0)
            alive.append(pid)
        except ProcessLookupError:
            pass
    print(json.dumps({"status": out.status, "ip": info[0]["ip"], "address": address, "connected": ray.is_initialized(),
                      "alive": alive}))
"""


def test_without_an_address_a_local_ray_on_loopback_is_started_and_shut_down(tmp_path):
    script = tmp_path / "local.py"
    script.write_text(LOCAL)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(DYN_LOG="warn", PYTHONPATH=os.pathsep.join([str(ROOT), str(TESTS)]))
    run = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=240)
    if run.returncode != 0 and STARTUP_TIMEOUT in run.stderr:
        overloaded(run.stderr.strip())
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["status"] == "feasible"
    assert result["ip"] == "127.0.0.1" and result["address"].startswith("127.0.0.1:")
    assert not result["connected"]
    deadline = time.monotonic() + 20  # ray.shutdown() signals its processes; give them a moment
    alive = result["alive"]
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in alive if _alive(pid)]
        time.sleep(0.2)
    assert not alive, f"processes of the local Ray still running after close: {alive}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its parent) is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


# ---- the backend on a 2-node cluster ------------------------------------------------------

def test_streams_times_out_and_fails_like_the_local_pool(cluster):
    with RayEvaluationPool(FakeEvaluator("shipped"), workers=2, max_eval_seconds=2.0) as pool:
        info = wait_ready(pool, 2)
        assert len({i["node_id"] for i in info}) == 2  # one actor per node: one CPU each
        assert {i["ip"] for i in info} == {"127.0.0.1"}
        outs = pool.evaluate_wave([req(value=i) for i in range(4)])
        assert [o.report["value"] for o in outs] == [0, 1, 2, 3]
        assert all(o.derived["tag"] == "shipped" and o.derived["warm_pid"] == o.report["pid"] for o in outs)

        slow = pool.submit(req("slow", seconds=1.0, value=1))
        fast = pool.submit(req(value=2))
        assert [c.ticket for c in pool.wait()] == [fast]  # streamed: no barrier behind the slow one
        assert [c.ticket for c in pool.completions()] == [slow]

        (raised,) = pool.evaluate_wave([req("raise")])
        assert raised.status == "failed"
        assert raised.reason == evaluate_safely(FakeEvaluator(), req("raise")).reason  # same text as local

        before = pool.replaced
        hang, after = pool.evaluate_wave([req("hang"), req(value=5)])
        assert hang.status == "timed_out" and hang.reason == "exceed runtime: replay > 2s"
        assert after.status == "feasible"
        assert pool.replaced == before + 1
        short = pool.submit(req("slow", seconds=3.0), max_seconds=0.5)
        (done,) = pool.completions()
        assert done.ticket == short and done.outcome.reason == "exceed runtime: replay > 0.5s"

        running = pool.submit(req("hang"))
        wait_ready(pool, 2)
        assert pool.cancel(running) and pool.pending == 0
        assert [o.status for o in pool.evaluate_wave([req(), req()])] == ["feasible"] * 2


def test_a_killed_worker_is_retried_once_and_the_retry_is_recorded(cluster):
    with RayEvaluationPool(FakeEvaluator(), workers=1, max_eval_seconds=60) as pool:
        wait_ready(pool, 1)
        ticket = pool.submit(req("slow", seconds=3.0, value=4))
        victim = pool.running()[ticket]["pid"]
        os.kill(victim, signal.SIGKILL)
        (done,) = pool.completions()
        assert done.outcome.status == "feasible" and done.outcome.report["value"] == 4
        assert done.outcome.report["pid"] != victim
        assert "lost" in done.outcome.derived["evaluation_retry"] and str(victim) in done.outcome.derived["evaluation_retry"]
        assert pool.retried == 1

        (dead,) = pool.evaluate_wave([req("exit")])  # the candidate kills every worker it lands on
        assert dead.status == "failed"
        assert "lost" in dead.reason and "retried once after" in dead.reason and "\n" not in dead.reason
        assert pool.retried == 2
        assert [o.status for o in pool.evaluate_wave([req(value=1)])] == ["feasible"]


@pytest.mark.integration
def test_the_real_replay_evaluator_on_ray_gives_the_in_process_result(cluster, tmp_path):
    """ReplayEvaluator (a Dagster resource) survives the trip to a Ray actor: same report, same derived."""
    from test_replay_integration import THROUGHPUT, agg

    from spica_pipeline.evaluate.replay import ReplayEvaluator
    from spica_pipeline.space.model_hw import latest_backend_version

    evaluator = ReplayEvaluator(cache_dir=str(tmp_path / "cache"))
    request = EvalRequest(agg(latest_backend_version("h200_sxm", "vllm"), tp=2, replicas=2, used_gpus=4),
                          {"isl": 1024, "osl": 64, "request_rate": 5.0, "num_request_ratio": 20}, THROUGHPUT)
    local = evaluator.evaluate(request)
    with RayEvaluationPool(evaluator, workers=1, max_eval_seconds=300) as pool:
        (remote,) = pool.evaluate_wave([request])
    assert remote.status == local.status == "feasible", remote.reason
    for key in ("mean_ttft_ms", "mean_itl_ms", "duration_ms", "gpu_hours", "completed_requests"):
        assert remote.report[key] == local.report[key]
    assert remote.derived == local.derived


# ---- whole sweeps --------------------------------------------------------------------------

def tiny_config(**sweep) -> dict:
    """The reliability suite's tiny sweep: 18 candidates of a 2-GPU agg space, round robin."""
    return {
        "search_space": {
            "model_name": "Qwen/Qwen3-32B", "hardware_sku": "h200_sxm", "gpu_budget": 2,
            "deployment_mode": ["agg"], "backend": ["vllm"], "router_mode": ["round_robin"],
            "planner_scaling_policy": ["disabled"], "agg_max_num_seqs": [256, 512, 1024],
            "agg_max_num_batched_tokens": [8192, 16384],
        },
        "workload": {"isl": 512, "osl": 64, "request_rate": 4, "num_request_ratio": 10},
        "goal": {"target": "throughput_per_gpu"},
        "sweep": {"policy": "thorough", "max_rounds": 3, "candidates_per_round": 2, "parallel_evals": 2,
                  "max_eval_seconds": 3, "seed": 0, **sweep},
    }


def content(ledger: pd.DataFrame) -> list[dict]:
    rows = ledger.sort_values("trial").drop(columns=["replay_seconds", "optimizer_seconds"]).to_dict("records")
    return [{k: (None if isinstance(v, float) and v != v else v) for k, v in row.items()} for row in rows]


def test_ray_sweep_equals_the_local_pool_ledger_and_records_a_lost_worker(cluster, tmp_path):
    from spica_pipeline.sweep import run_sweep

    local = run_sweep(SmartSearchConfig.from_dict(tiny_config()), tmp_path / "local", evaluator=FaultyEvaluator())
    on_ray = run_sweep(SmartSearchConfig.from_dict(tiny_config(executor="ray")), tmp_path / "ray",
                       evaluator=FaultyEvaluator())
    a, b = content(local.ledger), content(on_ray.ledger)
    assert len(a) == len(b) == 18
    fake = FaultyEvaluator()
    faults = [fake.faults.get(fake.fault_key(json.loads(row["config"]))) for row in a]
    assert sorted(f for f in faults if f) == ["exit", "hang", "raise"]
    for fault, x, y in zip(faults, a, b):
        if fault != "exit":
            assert x == y  # identical rows: statuses, reasons (the timeout and the raise too), reports
            continue
        # a worker that dies: the local pool records the exit code, Ray the lost actor and its retry
        assert x["status"] == y["status"] == "failed"
        assert "worker process died (exit code 3)" in x["reason"]
        assert "lost" in y["reason"] and "retried once after" in y["reason"]
        assert {k: v for k, v in x.items() if k not in ("reason", "config")} == \
               {k: v for k, v in y.items() if k not in ("reason", "config")}
    hang = b[faults.index("hang")]
    assert hang["status"] == "timed_out" and hang["reason"] == "exceed runtime: replay > 3s"
    assert (tmp_path / "ray" / "report.md").exists()


DRIVER = """
import sys
from ray_fakes import PacedEvaluator, register_by_value
from spica_pipeline.config import SmartSearchConfig
from spica_pipeline.sweep import run_sweep
import json

if __name__ == "__main__":
    register_by_value()
    config = SmartSearchConfig.from_dict(json.loads(sys.argv[1]))
    run_sweep(config, sys.argv[2], evaluator=PacedEvaluator(seconds=0.5, faults={}))
"""


def outcome_hashes(journal: Path) -> list[str]:
    hashes = []
    if journal.exists():
        for raw in journal.read_bytes().splitlines():
            try:
                record = json.loads(raw)
            except ValueError:
                continue
            if record.get("kind") == "outcome":
                hashes.append(record["spec_hash"])
    return hashes


def test_resume_after_killing_the_driver_equals_an_uninterrupted_run(cluster, tmp_path):
    from spica_pipeline.sweep import run_sweep

    data = tiny_config(executor="ray", ray_address=cluster.address)
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    run_dir = tmp_path / "killed"
    env = {**os.environ, "DYN_LOG": "warn", "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)])}
    driver = subprocess.Popen([sys.executable, str(script), json.dumps(data), str(run_dir)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    journal = run_dir / "journal.jsonl"
    deadline = time.monotonic() + 180
    while len(outcome_hashes(journal)) < 2:
        assert driver.poll() is None, f"driver ended before the kill: {driver.communicate()}"
        assert time.monotonic() < deadline, "no outcome journalled within 180 s"
        time.sleep(0.05)
    os.kill(driver.pid, signal.SIGKILL)
    driver.communicate()
    before = outcome_hashes(journal)
    assert 2 <= len(before) < 18, "the kill must land mid-sweep"

    # the resumed driver uses this process's connection; the reference runs on the local pool
    resumed = run_sweep(SmartSearchConfig.from_dict(data), run_dir, evaluator=FaultyEvaluator(faults={}))
    reference = run_sweep(SmartSearchConfig.from_dict(tiny_config()), tmp_path / "reference",
                          evaluator=FaultyEvaluator(faults={}))
    assert resumed.resumed_records >= len(before)
    assert content(resumed.ledger) == content(reference.ledger)
    assert content(pd.read_parquet(run_dir / "ledger.parquet")) == content(reference.ledger)
    after = outcome_hashes(journal)
    assert after[:len(before)] == before and len(after) == len(set(after)) == 18


def test_a_node_lost_mid_candidate_is_retried_on_another_node(cluster):
    """Runs last: removes the cluster's second node."""
    head_node = cluster.head_node.node_id
    with RayEvaluationPool(FakeEvaluator(), workers=2, max_eval_seconds=120) as pool:
        wait_ready(pool, 2)
        tickets = [pool.submit(req("slow", seconds=4.0, value=i)) for i in range(2)]
        running = pool.running()
        assert set(running) == set(tickets)
        (on_worker,) = [t for t, info in running.items() if info["node_id"] != head_node]
        cluster.remove_node(cluster.worker)
        done = {c.ticket: c.outcome for c in pool.completions(timeout=120)}
    assert set(done) == set(tickets) and all(o.status == "feasible" for o in done.values())
    assert "lost" in done[on_worker].derived["evaluation_retry"]
    assert "evaluation_retry" not in done[tickets[1 - tickets.index(on_worker)]].derived
