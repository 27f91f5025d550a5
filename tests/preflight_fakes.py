"""Importable evaluator stand-in for the preflight tests (spawned pool workers import it by path)."""

import json

from spica_pipeline.evaluate.evaluator import EvalOutcome, Evaluator


class RecordingEvaluator(Evaluator):
    """Appends each request's model, hardware and backend to `calls_file` (one JSON line per replay
    asked for) and scores the GPUs used, so a test can tell whether, and with which names, the sweep
    replayed."""

    def __init__(self, calls_file: str):
        self.calls_file = calls_file

    def evaluate(self, request):
        sample = request.to_dict()["sample"]
        with open(self.calls_file, "a") as fh:
            fh.write(json.dumps({k: sample.get(k) for k in ("model_name", "hardware_sku", "backend")}) + "\n")
        gpus = int(sample.get("used_gpus") or 1)
        return EvalOutcome("feasible", report={"output_throughput_tok_s": 1000.0 * gpus, "duration_ms": 60_000.0,
                                               "gpu_hours": gpus / 60.0}, replay_seconds=0.001, repeats=1)
