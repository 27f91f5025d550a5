"""`ray://` (the Ray Client) verified: this module starts a Ray head with its Ray Client server on
127.0.0.1 (`ray start --head --block`, its own temp dir and ports), drives a small sweep through
`ray_address: ray://127.0.0.1:PORT` and compares the ledger with the local pool's. The head is
stopped in the fixture's teardown: SIGTERM to `ray start` (which stops its node), then SIGKILL to
its process group and to any process still naming its temp dir, each wait bounded.

A separate module from tests/test_ray_pool.py so that module's cluster is gone before this head
starts (two Rays at once on a 2-core machine only make both slower).
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest

ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")

from ray_fakes import watchdog  # noqa: E402
from reliability_fakes import FaultyEvaluator  # noqa: E402

from spica_pipeline.config import SmartSearchConfig  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
STARTUP_TIMEOUT = "The current node timed out during startup"
READY = "This command will now block forever"
# one 2-replica candidate raises, one hangs past max_eval_seconds (a timed_out through the client)
FAULTS = [[512, 8192, "raise"], [1024, 8192, "hang"]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return True
    except OSError:
        return False


def ray_cli() -> str:
    beside = Path(sys.executable).with_name("ray")
    return str(beside) if beside.exists() else (shutil.which("ray") or "ray")


def tree(pid: int) -> list:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def stop(proc: subprocess.Popen, temp: str) -> None:
    """Stop the head within ~40 s whatever state it is in; only processes this fixture started."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # `ray start --block` stops its node's processes on SIGTERM
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # start_new_session: the group is this head's alone
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait(timeout=10)
    for p in psutil.process_iter(["cmdline"]):  # a straggler that left the group still names our temp dir
        if any(temp in part for part in (p.info["cmdline"] or [])):
            try:
                p.kill()
            except psutil.Error:
                pass
    shutil.rmtree(temp, ignore_errors=True)


def die_with_parent() -> None:
    """In the `ray start` child: SIGTERM when the test process dies, even by SIGKILL or the
    watchdog, so the head (its own session) is never left running (Linux; elsewhere a no-op)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


@pytest.fixture(scope="module", autouse=True)
def bounded():
    """This module takes 2-3 min here; 15 min means a hang (started before the head fixture)."""
    yield from watchdog(900)


@pytest.fixture(scope="module")
def head():
    """(address "ray://127.0.0.1:PORT", the `ray start` process) of a head with 2 CPUs."""
    temp = tempfile.mkdtemp(prefix="spica-rayc-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    client_port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    # keep 127.0.0.1 (see loopback_only); Ray's default token authentication, with the token of
    # ~/.ray/auth_token (`ray start` writes one when there is none, as a local ray.init does)
    env = {k: v for k, v in env.items() if not k.startswith("RAY_AUTH")}
    env.update(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", DYN_LOG="warn",
               # the client server gives a driver's own server 30 s to come up; a test host under
               # load can need more (the backend also retries once)
               RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S="120")
    cmd = [ray_cli(), "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(free_port()),
           "--ray-client-server-port", str(client_port), "--num-cpus", "2", "--include-dashboard", "false",
           "--disable-usage-stats", "--temp-dir", temp, "--object-store-memory", str(100 * 1024 * 1024),
           "--dashboard-agent-listen-port", str(free_port()), "--metrics-export-port", str(free_port())]
    log_path = Path(temp) / "ray-start.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=temp,
                                start_new_session=True, preexec_fn=die_with_parent)
    try:
        deadline = time.monotonic() + 150
        while READY not in log_path.read_text() or not accepts(client_port):
            text = log_path.read_text()
            if proc.poll() is not None or time.monotonic() > deadline:
                load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
                if STARTUP_TIMEOUT in text or proc.poll() is None:
                    pytest.skip(f"the Ray head did not start on this host (load average {load})")
                pytest.fail(f"ray start exited {proc.returncode}: {text[-2000:]}")
            time.sleep(0.5)
        yield f"ray://127.0.0.1:{client_port}", proc
    finally:
        stop(proc, temp)


def test_the_head_and_its_client_server_listen_on_loopback_only(head):
    address, proc = head
    listening = set()
    for p in tree(proc.pid):
        try:
            listening |= {c.laddr for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
        except psutil.Error:
            pass
    assert ("127.0.0.1", int(address.rsplit(":", 1)[1])) in {(ip.removeprefix("::ffff:"), port)
                                                             for ip, port in listening}
    assert {ip.removeprefix("::ffff:") for ip, _ in listening} == {"127.0.0.1"}, listening


DRIVER = """
import json, sys
from ray_fakes import register_by_value
from reliability_fakes import FaultyEvaluator
from spica_pipeline.config import SmartSearchConfig
from spica_pipeline.sweep import run_sweep

if __name__ == "__main__":
    register_by_value()  # the head has no copy of tests/: the fakes travel inside the pickle
    config = SmartSearchConfig.from_dict(json.loads(sys.argv[1]))
    faults = {(a, b): kind for a, b, kind in json.loads(sys.argv[3])}
    run_sweep(config, sys.argv[2], evaluator=FaultyEvaluator(faults=faults))
"""


def tiny_config(**sweep) -> dict:
    """tests/test_ray_pool.py's tiny sweep (18 candidates, round robin, thorough)."""
    from test_ray_pool import tiny_config as base

    return base(**sweep)


def content(ledger: pd.DataFrame) -> list[dict]:
    from test_ray_pool import content as rows

    return rows(ledger)


def driver_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH"))}
    env.update(DYN_LOG="warn", PYTHONPATH=os.pathsep.join([str(ROOT), str(TESTS)]), **extra)
    return env


def test_a_sweep_through_ray_client_equals_the_local_pool_ledger(head, tmp_path):
    """The driver has the token (~/.ray/auth_token) but no RAY_AUTH_MODE: the backend sends it
    (ray.init alone would not through ray://, and would time out after 30 s)."""
    from spica_pipeline.sweep import run_sweep

    address, _ = head
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = driver_env()
    data = tiny_config(executor="ray", ray_address=address)
    run = subprocess.run([sys.executable, str(script), json.dumps(data), str(tmp_path / "client"), json.dumps(FAULTS)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    on_client = content(pd.read_parquet(tmp_path / "client" / "ledger.parquet"))

    faults = {(a, b): kind for a, b, kind in FAULTS}
    local = run_sweep(SmartSearchConfig.from_dict(tiny_config()), tmp_path / "local",
                      evaluator=FaultyEvaluator(faults=faults))
    reference = content(local.ledger)
    assert len(on_client) == len(reference) == 18
    assert on_client == reference
    statuses = sorted(row["status"] for row in on_client)
    assert statuses.count("timed_out") == 1 and statuses.count("failed") == 1


CLI = """
import sys
from reliability_fakes import FaultyEvaluator
from spica_pipeline.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], evaluator=FaultyEvaluator()))
"""


def test_a_client_without_the_token_is_exit_4_naming_it(head, tmp_path):
    """Refused by the client server: Ray's client gives up after ~30 s; one line, exit 4."""
    from test_reliability import write_config

    address, _ = head
    script = tmp_path / "cli.py"
    script.write_text(CLI)
    config = write_config(tmp_path / "tiny.yaml", tiny_config())
    run = subprocess.run([sys.executable, str(script), "sweep", "--config", str(config), "--output-dir",
                          str(tmp_path / "out"), "--executor", "ray", "--ray-address", address],
                         cwd=tmp_path, env=driver_env(RAY_AUTH_MODE="disabled"), capture_output=True, text=True,
                         timeout=180)
    assert run.returncode == 4, run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    line = run.stderr.strip().splitlines()[-1]
    assert line.startswith(f"environment failure: cannot connect to Ray at {address} (sweep.ray_address): "
                           "ConnectionError: ray client connection timeout")
    assert "RAY_AUTH_TOKEN" in line
