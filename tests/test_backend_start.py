"""An evaluation backend that cannot run is an environment failure (issue 20, exit 4): one line
naming the cause and what to fix, no traceback unless --debug. The ray package missing while
`sweep.executor: ray` is bad input instead (exit 2, naming the field and the extra), refused by
`spica validate` and at sweep start.

The sweeps run the real CLI with the stand-ins of tests/*_fakes.py; none starts a Ray: a wrong
address is answered by a TCP probe on 127.0.0.1 within seconds.
"""

import errno
import socket
import sys
import time

import pytest
from pool_fakes import BrokenWarmUp, probe
from reliability_fakes import FaultyEvaluator
from test_reliability import tiny_config, write_config

from spica_pipeline import cli
from spica_pipeline.errors import BackendStartError
from spica_pipeline.evaluate.pool import EvaluationPool


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sweep(tmp_path, *extra: str, evaluator=None, **sweep_fields) -> list[str]:
    config = write_config(tmp_path / "tiny.yaml", tiny_config(**sweep_fields))
    return ["sweep", "--config", str(config), "--output-dir", str(tmp_path / "out"), *extra]


def one_line(err: str) -> str:
    """The error: stderr's last line (progress lines come before it), and no traceback."""
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


def test_local_workers_that_cannot_start_exit_4_with_one_line(tmp_path, capsys):
    assert cli.main(sweep(tmp_path), evaluator=BrokenWarmUp()) == 4
    line = one_line(capsys.readouterr().err)
    assert line.startswith("environment failure: the local worker pool cannot start its workers")
    assert "RuntimeError: no runtime here at pool_fakes.py:" in line
    assert "then run the same command again" in line

    assert cli.main(sweep(tmp_path, "--debug"), evaluator=BrokenWarmUp()) == 4
    err = capsys.readouterr().err
    assert err.count("Traceback") == 2  # the driver's and the worker's (where warm_up raised)
    assert "in warm_up" in err and err.strip().splitlines()[-1].startswith("environment failure: ")


def test_a_process_that_cannot_be_spawned_is_exit_4(monkeypatch):
    """fork/exec refused (EAGAIN at the process limit): a stand-in context, since root ignores
    RLIMIT_NPROC and this machine cannot be made to run out of processes safely."""

    class Refusing:
        def Pipe(self, duplex=True):
            import multiprocessing

            return multiprocessing.Pipe(duplex)

        def Process(self, *args, **kwargs):
            raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    pool = EvaluationPool(FaultyEvaluator(), workers=1)
    monkeypatch.setattr(pool, "_ctx", Refusing())
    with pytest.raises(BackendStartError, match=r"cannot start a process: BlockingIOError: \[Errno 11\] Resource temporarily") as err:
        pool.submit(probe())
    assert err.value.exit_code == 4 and "sweep.parallel_evals" in str(err.value)


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_a_ray_address_nothing_answers_at_is_exit_4_within_seconds(tmp_path, capsys, scheme):
    pytest.importorskip("ray")
    address = f"{scheme}127.0.0.1:{closed_port()}"
    started = time.monotonic()
    assert cli.main(sweep(tmp_path, "--executor", "ray", "--ray-address", address), evaluator=FaultyEvaluator()) == 4
    assert time.monotonic() - started < 60  # Ray's own connect retries a GCS address for minutes
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"environment failure: cannot reach Ray at {address} (sweep.ray_address): "
                           "ConnectionRefusedError")


def test_ray_address_from_the_environment_is_named(tmp_path, capsys, monkeypatch):
    pytest.importorskip("ray")
    address = f"127.0.0.1:{closed_port()}"
    monkeypatch.setenv("RAY_ADDRESS", address)
    assert cli.main(sweep(tmp_path, executor="ray"), evaluator=FaultyEvaluator()) == 4
    assert f"cannot reach Ray at {address} ($RAY_ADDRESS)" in one_line(capsys.readouterr().err)


def test_executor_ray_without_the_ray_package_is_exit_2_naming_field_and_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError, as without the extra
    config = write_config(tmp_path / "tiny.yaml", tiny_config(executor="ray"))
    assert cli.main(["validate", "--config", str(config)]) == 2
    line = one_line(capsys.readouterr().err)
    assert "sweep.executor: 'ray' needs the ray package" in line and "spica-pipeline[ray]" in line

    assert cli.main(["sweep", "--config", str(config), "--output-dir", str(tmp_path / "out")],
                    evaluator=FaultyEvaluator()) == 2
    assert "pip install 'spica-pipeline[ray]'" in one_line(capsys.readouterr().err)
