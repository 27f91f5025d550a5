"""Importable fakes for the spawned pool tests (spawn pickles classes by module path)."""

import os
import time

from spica_pipeline.evaluate.evaluator import EvalOutcome, EvalRequest, Evaluator
from spica_pipeline.space.candidate import Candidate, EngineArgs, Role
from spica_pipeline.space.shapes import RoleShape

# any candidate will do: these fakes read what to do from the request's context
PROBE = Candidate(model="m", system="h200_sxm", backend="vllm",
                  roles=(Role("agg", RoleShape(), EngineArgs(8192, 256, 64, 0.9, True)),))


def probe(behaviour="ok", **context):
    """A request for the fakes below: `behaviour` and its values travel in the context (so in the spec hash)."""
    return EvalRequest(PROBE, {}, {}, {"behaviour": behaviour, **context})


class FakeEvaluator(Evaluator):
    """Behaviour chosen per request by `context["behaviour"]`: ok | raise | hang | exit | segv | slow."""

    def __init__(self, tag: str = "fake"):
        self.tag = tag
        self.pid_at_init = None

    def warm_up(self):
        self.pid_at_init = os.getpid()

    def evaluate(self, request):
        behaviour = request.context.get("behaviour", "ok")
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
            time.sleep(float(request.context.get("seconds", 0.5)))
        return EvalOutcome("feasible", report={"value": float(request.context.get("value", 0)),
                                               "pid": float(os.getpid())},
                           derived={"tag": self.tag, "warm_pid": self.pid_at_init})


class BrokenWarmUp(FakeEvaluator):
    def warm_up(self):
        raise RuntimeError("no runtime here")
