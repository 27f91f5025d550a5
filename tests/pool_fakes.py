"""Importable fakes for the spawned pool tests (spawn pickles classes by module path)."""

import os
import time

from spica_pipeline.evaluate.evaluator import EvalOutcome, Evaluator


class FakeEvaluator(Evaluator):
    """Behaviour chosen per request by `sample["behaviour"]`: ok | raise | hang | exit | segv | slow."""

    def __init__(self, tag: str = "fake"):
        self.tag = tag
        self.pid_at_init = None

    def warm_up(self):
        self.pid_at_init = os.getpid()

    def evaluate(self, request):
        behaviour = request.sample.get("behaviour", "ok")
        if behaviour == "raise":
            raise ValueError("candidate exploded")
        if behaviour == "hang":
            time.sleep(3600)
        if behaviour == "exit":
            os._exit(7)
        if behaviour == "segv":
            import signal

            os.kill(os.getpid(), signal.SIGSEGV)
        if behaviour == "slow":
            time.sleep(float(request.sample.get("seconds", 0.5)))
        return EvalOutcome("feasible", report={"value": float(request.sample.get("value", 0)),
                                               "pid": float(os.getpid())},
                           derived={"tag": self.tag, "warm_pid": self.pid_at_init})


class BrokenWarmUp(FakeEvaluator):
    def warm_up(self):
        raise RuntimeError("no runtime here")
