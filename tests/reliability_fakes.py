"""Importable fault-injecting evaluator for the reliability tests (spawned workers unpickle it by
module path, so it cannot live inside a test file)."""

import os
import time

from spica_pipeline.evaluate.evaluator import EvalOutcome, Evaluator

# (agg_max_num_seqs, agg_max_num_batched_tokens) -> the fault, injected on 2-replica candidates only
FAULTS = {(512, 8192): "raise", (1024, 8192): "hang", (1024, 16384): "exit"}


class FaultyEvaluator(Evaluator):
    """A deterministic stand-in for the replay that raises, hangs or kills its own process on the
    candidates listed in FAULTS and otherwise reports a throughput that depends on the knobs."""

    def __init__(self, faults: dict | None = None, hang_seconds: float = 3600.0,
                 gate_file: str | None = None, delay_seconds: float = 0.0, calls_file: str | None = None):
        self.faults = dict(FAULTS if faults is None else faults)
        self.hang_seconds = hang_seconds
        self.gate_file = gate_file  # when set, every evaluation waits until this file exists
        self.delay_seconds = delay_seconds  # every evaluation takes at least this long
        self.calls_file = calls_file  # when set, every evaluation appends its spec hash here first

    @staticmethod
    def fault_key(config: dict) -> tuple | None:
        """The fault of a flat candidate config (a request's `candidate.to_dict()` or a ledger row's)."""
        if int(config.get("replicas") or 0) != 2:
            return None
        return int(config["agg_max_num_seqs"]), int(config["agg_max_num_batched_tokens"])

    def evaluate(self, request):
        candidate = request.candidate
        if self.calls_file:
            with open(self.calls_file, "a") as fh:
                fh.write(request.spec_hash + "\n")
        if self.delay_seconds:
            time.sleep(self.delay_seconds)
        while self.gate_file and not os.path.exists(self.gate_file):
            time.sleep(0.05)
        fault = self.faults.get(self.fault_key(candidate.to_dict()))
        if fault == "raise":
            raise RuntimeError("injected evaluator fault")
        if fault == "hang":
            time.sleep(self.hang_seconds)
        if fault == "exit":
            os._exit(3)
        gpus, engine = candidate.used_gpus, candidate.role("agg").engine
        tokens = 1000.0 + engine.max_num_seqs / 8 + engine.max_num_batched_tokens / 1024
        duration_ms = 60_000.0
        return EvalOutcome("feasible", report={
            "output_throughput_tok_s": tokens * gpus, "duration_ms": duration_ms,
            "gpu_hours": gpus * duration_ms / 3_600_000.0,
        }, replay_seconds=0.001, repeats=1)
