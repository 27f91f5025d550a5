"""End to end against a real `dagster dev` on 127.0.0.1 (temp DAGSTER_HOME): a code location with
two tiny trace sweeps (the fake evaluator, exhaustive one-point studies) whose automation is on.
The daemon materializes both, then a content change to sweep A's trace re-materializes sweep A
and only sweep A. Headless Chromium screenshots the asset graph and sweep A's result page."""

import os
import subprocess
import time
from pathlib import Path

import pytest
from dagster_dev import REPO, TESTS, dagster_dev, keep_artifact

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
    with dagster_dev(tmp_path, tmp_path / "location.py", "e2e") as server:
        yield server, traces


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
    keep_artifact(shot)


def test_trace_change_rematerializes_only_that_sweep(dev_server, tmp_path):
    server, traces = dev_server
    server.wait_loaded("e2e")

    # automation is on: the daemon fills both sweeps once (their assets are missing)
    first = {s: server.wait(lambda s=s: server.latest(s, "deploy"), 240, f"{s} to materialize")
             for s in ("e2e_a", "e2e_b")}
    b_result = server.latest("e2e_b", "sweep_result")

    with traces["e2e_a"].open("a") as fh:  # a content change to sweep A's trace only
        fh.write(TRACE.read_text().splitlines()[40] + "\n")

    def a_again():
        latest = server.latest("e2e_a", "deploy")
        return latest if latest and latest["runId"] != first["e2e_a"]["runId"] else None

    server.wait(a_again, 180, "sweep e2e_a to re-materialize after its trace changed")
    time.sleep(10)  # give a wrong trigger of sweep B the time to show up
    assert server.latest("e2e_b", "sweep_result") == b_result
    assert server.latest("e2e_b", "deploy") == first["e2e_b"]

    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} not found: screenshots need the Debian package `chromium`")
    _screenshot(f"{server.url}/asset-groups", tmp_path / "dagster-asset-graph.png", tmp_path)
    _screenshot(f"{server.url}/assets/e2e_a/sweep_result", tmp_path / "dagster-sweep-result.png",
                tmp_path, height=3200)
    # the events view: the latest materialization's metadata (inline plots, the ranked table)
    _screenshot(f"{server.url}/assets/e2e_a/sweep_result?view=events",
                tmp_path / "dagster-sweep-result-events.png", tmp_path, height=2400)
