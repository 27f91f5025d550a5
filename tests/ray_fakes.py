"""Importable fakes for the Ray backend tests (Ray workers unpickle them; the tests register this
module and its peers for pickling by value, so the cluster needs no copy of tests/)."""

import faulthandler
import time

from reliability_fakes import FaultyEvaluator


class PacedEvaluator(FaultyEvaluator):
    """FaultyEvaluator that takes `seconds` per candidate, so a sweep lasts long enough to kill its
    driver mid-way; same reports, so its ledger equals an unpaced run's."""

    def __init__(self, seconds: float = 0.3, **kwargs):
        super().__init__(**kwargs)
        self.seconds = seconds

    def evaluate(self, request):
        time.sleep(self.seconds)
        return super().evaluate(request)


def register_by_value() -> None:
    """Ship the test fakes to Ray workers inside the pickle (workers cannot import tests/)."""
    import pool_fakes
    import ray_fakes
    import reliability_fakes
    from ray import cloudpickle

    for module in (pool_fakes, reliability_fakes, ray_fakes):
        cloudpickle.register_pickle_by_value(module)


def watchdog(seconds: float):
    """A generator for a module-scoped autouse fixture: past `seconds` the test process prints every
    thread's stack and exits, so a hung Ray call fails the run instead of hanging it. Ray's node
    processes share the fate of the process that started them (Linux), so they stop with it."""
    faulthandler.dump_traceback_later(seconds, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
