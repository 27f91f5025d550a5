"""End to end against a real `dagster dev` on 127.0.0.1 (temp DAGSTER_HOME): a code location with
two tiny trace sweeps (the fake evaluator, exhaustive one-point studies) whose automation is on.
The daemon materializes both, then a content change to sweep A's trace re-materializes sweep A
and only sweep A. Headless Chromium screenshots the asset graph and sweep A's result page."""

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
TESTS = REPO / "tests"
TRACE = REPO / "examples" / "traces" / "small_mooncake.jsonl"
CHROMIUM = os.environ.get("SPICA_CHROMIUM", "/usr/bin/chromium")
pytestmark = [pytest.mark.e2e]
# the tiny space test_dagster.py sweeps too, one point of it, over a trace
SWEEP_YAML = (TESTS / "data" / "tiny_agg_space.yaml").read_text() + """\
  agg_max_num_seqs: [256]
  agg_max_num_batched_tokens: [8192]
workload:
  trace_path: {trace}
sweep: {{max_rounds: 1, candidates_per_round: 2, parallel_evals: 1, policy: thorough,
        algorithm: QUASI_RANDOM_SEARCH}}
"""
LOCATION = """\
import sys
sys.path.insert(0, {tests!r})
from dagster import DefaultSensorStatus
from dagster_fakes import FakeEvaluator
from spica_pipeline.dagster.factory import sweeps_definitions
from spica_pipeline.dagster.io import ParquetIOManager, SweepStorage
from spica_pipeline.dagster.spec import sweep_spec
from spica_pipeline.optimize.vizier import VizierClient

defs = sweeps_definitions(
    [sweep_spec("e2e_a", {a!r}), sweep_spec("e2e_b", {b!r})],
    resources={{"io_manager": ParquetIOManager(), "sweep_storage": SweepStorage(), "replay": FakeEvaluator(),
               "vizier": VizierClient()}},
    automation_status=DefaultSensorStatus.RUNNING, interval_s=5)
"""
LATEST = """
query Latest($path: [String!]!) {
  assetOrError(assetKey: {path: $path}) { ... on Asset { assetMaterializations(limit: 1) { runId timestamp } } }
}"""


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


def _latest(port: int, sweep: str, stage: str) -> dict | None:
    asset = _graphql(port, LATEST, {"path": [sweep, stage]})["assetOrError"]
    mats = (asset or {}).get("assetMaterializations") or []
    return mats[0] if mats else None


@pytest.fixture
def dev_server(tmp_path):
    traces = {}
    for name in ("e2e_a", "e2e_b"):
        trace = tmp_path / f"{name}.jsonl"
        trace.write_text("\n".join(TRACE.read_text().splitlines()[:40]) + "\n")
        (tmp_path / f"{name}.yaml").write_text(SWEEP_YAML.format(trace=trace))
        traces[name] = trace
    (tmp_path / "location.py").write_text(LOCATION.format(tests=str(TESTS), a=str(tmp_path / "e2e_a.yaml"),
                                                         b=str(tmp_path / "e2e_b.yaml")))
    (tmp_path / "workspace.yaml").write_text(
        f"load_from:\n  - python_file:\n      relative_path: {tmp_path / 'location.py'}\n"
        f"      working_directory: {REPO}\n      location_name: e2e\n")
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "deploy" / "dagster.yaml", home / "dagster.yaml")
    port = _free_port()
    # run workers and their replay-pool processes import the fake evaluator from tests/
    pythonpath = os.pathsep.join(p for p in (str(TESTS), str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, DAGSTER_HOME=str(home), DYN_LOG="warn", PYTHONUNBUFFERED="1", PYTHONPATH=pythonpath)
    log = tmp_path / "dagster-dev.log"
    with log.open("w") as fh:
        # own session: the whole tree (dev, code server, webserver, daemon, run workers) stops with
        # one signal to the group, and SIGINT/SIGTERM are not inherited as ignored
        proc = subprocess.Popen(
            [sys.executable, "-m", "dagster", "dev", "-w", str(tmp_path / "workspace.yaml"),
             "-h", "127.0.0.1", "-p", str(port)],
            cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        yield port, proc, log, traces
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


def _screenshot(url: str, shot: Path, tmp_path: Path, height: int = 900) -> None:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'chrome-profile'}", f"--screenshot={shot}", f"--window-size=1400,{height}",
           "--virtual-time-budget=15000", url]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert shot.exists(), done.stderr[-2000:]
    from PIL import Image

    with Image.open(shot) as img:  # non-blank: many distinct colours, not one background
        colours = img.convert("RGB").resize((350, 225)).getcolors(maxcolors=1 << 16) or []
    assert len(colours) > 20, f"{shot.name} looks blank ({len(colours)} colours)"
    keep = os.environ.get("SPICA_E2E_ARTIFACTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / shot.name)


def test_trace_change_rematerializes_only_that_sweep(dev_server, tmp_path):
    port, proc, log, traces = dev_server

    def location_loaded():
        data = _graphql(port, "{ workspaceOrError { ... on Workspace { locationEntries { name "
                              "loadStatus locationOrLoadError { __typename ... on PythonError { message } } } } } }")
        for e in data["workspaceOrError"]["locationEntries"]:
            if e["locationOrLoadError"] and e["locationOrLoadError"]["__typename"] == "PythonError":
                pytest.fail(f"code location failed to load: {e['locationOrLoadError']['message']}")
        return any(e["name"] == "e2e" and e["loadStatus"] == "LOADED" for e in data["workspaceOrError"]["locationEntries"])

    _wait(location_loaded, 180, "the code location to load", proc, log)
    _graphql(port, "mutation { setNuxSeen }")  # the community modal would cover the screenshots

    # automation is on: the daemon fills both sweeps once (their assets are missing)
    first = {s: _wait(lambda s=s: _latest(port, s, "deploy"), 240, f"{s} to materialize", proc, log)
             for s in ("e2e_a", "e2e_b")}
    b_result = _latest(port, "e2e_b", "sweep_result")

    with traces["e2e_a"].open("a") as fh:  # a content change to sweep A's trace only
        fh.write(TRACE.read_text().splitlines()[40] + "\n")

    def a_again():
        latest = _latest(port, "e2e_a", "deploy")
        return latest if latest and latest["runId"] != first["e2e_a"]["runId"] else None

    _wait(a_again, 180, "sweep e2e_a to re-materialize after its trace changed", proc, log)
    time.sleep(10)  # give a wrong trigger of sweep B the time to show up
    assert _latest(port, "e2e_b", "sweep_result") == b_result
    assert _latest(port, "e2e_b", "deploy") == first["e2e_b"]

    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} not found: screenshots need the Debian package `chromium`")
    _screenshot(f"http://127.0.0.1:{port}/asset-groups", tmp_path / "dagster-asset-graph.png", tmp_path)
    _screenshot(f"http://127.0.0.1:{port}/assets/e2e_a/sweep_result", tmp_path / "dagster-sweep-result.png",
                tmp_path, height=3200)
    # the events view: the latest materialization's metadata (inline plots, the ranked table)
    _screenshot(f"http://127.0.0.1:{port}/assets/e2e_a/sweep_result?view=events",
                tmp_path / "dagster-sweep-result-events.png", tmp_path, height=2400)
