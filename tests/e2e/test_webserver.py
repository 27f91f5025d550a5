"""End to end: `dagster dev` on 127.0.0.1 with a temp DAGSTER_HOME, a tiny sweep launched through
GraphQL with the real replay, and a headless-Chromium screenshot of the asset graph."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("SPICA_CHROMIUM", "/usr/bin/chromium")
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.integration,
    pytest.mark.skipif(not Path(CHROMIUM).exists(),
                       reason=f"{CHROMIUM} not found: install the Debian package `chromium` (apt-get install -y chromium)"),
]
TINY_YAML = """\
search_space:
  model_name: Qwen/Qwen3-32B
  hardware_sku: h200_sxm
  gpu_budget: 2
  deployment_mode: [agg]
  backend: [vllm]
  router_mode: [round_robin]
  planner_scaling_policy: [disabled]
workload: {isl: 512, osl: 64, request_rate: 4, num_request_ratio: 10}
sweep: {max_rounds: 1, candidates_per_round: 2, parallel_evals: 1, algorithm: RANDOM_SEARCH}
"""
LAUNCH = """
mutation Launch($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on RunConfigValidationInvalid { errors { message } }
    ... on InvalidSubsetError { message }
  }
}"""
RUN = """
query Run($id: ID!) {
  runOrError(runId: $id) { __typename ... on Run { status assetMaterializations { assetKey { path } } } }
}"""
CHECKS = """
{ assetNodes { assetKey { path } assetChecksOrError { ... on AssetChecks { checks { name
    executionForLatestMaterialization { status } } } } } }"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _graphql(port: int, query: str, variables: dict | None = None) -> dict:
    body = json.dumps({"query": query, "variables": variables or {}}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        out = json.loads(resp.read())
    assert "errors" not in out, out
    return out["data"]


def _wait(predicate, timeout: float, what: str, proc: subprocess.Popen, log: Path):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"dagster dev exited ({proc.returncode}) while waiting for {what}:\n{log.read_text()[-3000:]}")
        try:
            value = predicate()
            if value:
                return value
        except (OSError, ValueError):
            pass
        time.sleep(2)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}:\n{log.read_text()[-3000:]}")


@pytest.fixture
def dagster_dev(tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "deploy" / "dagster.yaml", home / "dagster.yaml")
    port = _free_port()
    env = dict(os.environ, DAGSTER_HOME=str(home), DYN_LOG="warn", PYTHONUNBUFFERED="1")
    log = tmp_path / "dagster-dev.log"
    with log.open("w") as fh:
        # own session: the whole process tree (dev, code server, webserver, daemon, run workers) is
        # stopped by one signal to the group, and SIGINT/SIGTERM are not inherited as ignored
        proc = subprocess.Popen(
            [sys.executable, "-m", "dagster", "dev", "-w", str(REPO / "workspace.yaml"),
             "-h", "127.0.0.1", "-p", str(port)],
            cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        yield port, proc, log, home
    finally:
        for sig, grace in ((signal.SIGTERM, 20), (signal.SIGKILL, 5)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue


def test_launch_tiny_sweep_and_screenshot_asset_graph(dagster_dev, tmp_path):
    port, proc, log, home = dagster_dev

    def location_loaded():
        data = _graphql(port, "{ workspaceOrError { ... on Workspace { locationEntries { name "
                              "loadStatus locationOrLoadError { __typename ... on PythonError { message } } } } } }")
        entries = data["workspaceOrError"]["locationEntries"]
        for e in entries:
            if e["locationOrLoadError"] and e["locationOrLoadError"]["__typename"] == "PythonError":
                pytest.fail(f"code location failed to load: {e['locationOrLoadError']['message']}")
        return any(e["name"] == "spica_pipeline" and e["loadStatus"] == "LOADED" for e in entries)

    _wait(location_loaded, 240, "the code location to load", proc, log)
    _graphql(port, "mutation { setNuxSeen }")  # the community modal would cover the screenshot

    params = {
        "selector": {"repositoryLocationName": "spica_pipeline", "repositoryName": "__repository__",
                     "jobName": "spica_sweep"},
        "runConfigData": {"ops": {"validated_config": {"config": {"config_yaml": TINY_YAML, "name": "e2e"}}}},
        "executionMetadata": {"tags": [{"key": "dagster/asset_partition_range_start", "value": "agg"},
                                       {"key": "dagster/asset_partition_range_end", "value": "disagg"}]},
    }
    launched = _graphql(port, LAUNCH, {"params": params})["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    run_id = launched["run"]["runId"]

    def finished():
        run = _graphql(port, RUN, {"id": run_id})["runOrError"]
        return run if run["status"] in ("SUCCESS", "FAILURE", "CANCELED") else None

    run = _wait(finished, 900, f"run {run_id}", proc, log)
    assert run["status"] == "SUCCESS", f"run {run_id} ended {run['status']}:\n{log.read_text()[-4000:]}"
    materialized = {"/".join(m["assetKey"]["path"]) for m in run["assetMaterializations"]}
    assert {"validated_config", "filtered_config", "load_predictor_result", "branch_spaces", "branch_study",
            "sweep_result"} <= materialized
    checks = {c["name"]: c["executionForLatestMaterialization"]["status"]
              for n in _graphql(port, CHECKS)["assetNodes"] if n["assetChecksOrError"].get("checks")
              for c in n["assetChecksOrError"]["checks"]}
    assert set(checks) == {"has_feasible_candidate", "within_gpu_budget", "unique_replayed_spec_hashes",
                           "front_non_dominated"}
    assert checks["unique_replayed_spec_hashes"] == "SUCCEEDED" and checks["within_gpu_budget"] == "SUCCEEDED"
    assert (home / "storage" / "spica" / "outputs" / "e2e" / "report.md").exists()

    shot = tmp_path / "asset-graph.png"
    profile = tmp_path / "chrome-profile"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={profile}", f"--screenshot={shot}", "--window-size=1400,900",
           "--virtual-time-budget=20000",
           f"http://127.0.0.1:{port}/locations/spica_pipeline/asset-groups/sweep"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert shot.exists() and shot.stat().st_size > 20_000, done.stderr[-2000:]
    keep = os.environ.get("SPICA_E2E_ARTIFACTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / "dagster-asset-graph.png")
