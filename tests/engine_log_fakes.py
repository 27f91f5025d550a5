"""An importable evaluator that writes to file descriptors 1 and 2 the way the replay runtime's
Rust logger does (spawn pickles classes by module path)."""

import os

from pool_fakes import FakeEvaluator


class NoisyEvaluator(FakeEvaluator):
    """Writes a log line to fds 1 and 2 at warm-up and per candidate; reports the colour settings."""

    def warm_up(self):
        super().warm_up()
        os.write(2, b"WARN engine: warm-up line on fd 2\n")

    def evaluate(self, request):
        os.write(1, b"engine: candidate line on fd 1\n")
        os.write(2, b"WARN engine: candidate line on fd 2\n")
        outcome = super().evaluate(request)
        outcome.derived = {**outcome.derived, "NO_COLOR": os.environ.get("NO_COLOR"),
                           "DYN_SDK_DISABLE_ANSI_LOGGING": os.environ.get("DYN_SDK_DISABLE_ANSI_LOGGING")}
        return outcome
