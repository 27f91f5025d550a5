"""A real `dagster dev` on 127.0.0.1 (temp DAGSTER_HOME) for the end-to-end tests: start it on a
code location file, talk GraphQL to it, wait on it, and stop its whole process group."""

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
LATEST = """
query Latest($path: [String!]!) {
  assetOrError(assetKey: {path: $path}) { ... on Asset { assetMaterializations(limit: 1) { runId timestamp } } }
}"""


@dataclass
class DevServer:
    port: int
    proc: subprocess.Popen
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def graphql(self, query: str, variables: dict | None = None) -> dict:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        req = urllib.request.Request(f"{self.url}/graphql", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            out = json.loads(resp.read())
        assert "errors" not in out, out
        return out["data"]

    def wait(self, predicate, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"dagster dev exited ({self.proc.returncode}) while waiting for {what}:\n"
                            f"{self.log.read_text()[-3000:]}")
            try:
                value = predicate()
                if value:
                    return value
            except (OSError, ValueError):
                pass
            time.sleep(2)
        pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}:\n{self.log.read_text()[-3000:]}")

    def latest(self, sweep: str, stage: str) -> dict | None:
        asset = self.graphql(LATEST, {"path": [sweep, stage]})["assetOrError"]
        mats = (asset or {}).get("assetMaterializations") or []
        return mats[0] if mats else None

    def wait_loaded(self, location: str, timeout: float = 180) -> None:
        def loaded():
            data = self.graphql("{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus "
                                "locationOrLoadError { __typename ... on PythonError { message } } } } } }")
            for e in data["workspaceOrError"]["locationEntries"]:
                if e["locationOrLoadError"] and e["locationOrLoadError"]["__typename"] == "PythonError":
                    pytest.fail(f"code location failed to load: {e['locationOrLoadError']['message']}")
            return any(e["name"] == location and e["loadStatus"] == "LOADED"
                       for e in data["workspaceOrError"]["locationEntries"])

        self.wait(loaded, timeout, "the code location to load")
        self.graphql("mutation { setNuxSeen }")  # the community modal would cover the screenshots


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def dagster_dev(tmp_path: Path, location_file: Path, location_name: str) -> Iterator[DevServer]:
    """`dagster dev` on a workspace of one python file, its own session so that one signal stops the
    whole tree (dev, code server, webserver, daemon, run workers); SIGTERM, then SIGKILL."""
    (tmp_path / "workspace.yaml").write_text(
        f"load_from:\n  - python_file:\n      relative_path: {location_file}\n"
        f"      working_directory: {REPO}\n      location_name: {location_name}\n")
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "deploy" / "dagster.yaml", home / "dagster.yaml")
    port = _free_port()
    # run workers and their replay-pool processes import the fake evaluator from tests/
    pythonpath = os.pathsep.join(p for p in (str(TESTS), str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, DAGSTER_HOME=str(home), DYN_LOG="warn", PYTHONUNBUFFERED="1", PYTHONPATH=pythonpath)
    log = tmp_path / "dagster-dev.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dagster", "dev", "-w", str(tmp_path / "workspace.yaml"),
             "-h", "127.0.0.1", "-p", str(port)],
            cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        yield DevServer(port, proc, log)
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


def keep_artifact(path: Path) -> None:
    """Copy a screenshot to $SPICA_E2E_ARTIFACTS when it is set."""
    keep = os.environ.get("SPICA_E2E_ARTIFACTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(keep) / path.name)
