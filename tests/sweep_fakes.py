"""Importable evaluator fakes for whole-sweep tests (spawned pool workers import them by path)."""

from spica_pipeline.search.evaluation import EvalOutcome


class AggFailsEvaluator:
    """Every agg candidate fails; disagg candidates score their GPU count (no replay involved)."""

    def evaluate(self, request):
        sample = request.sample
        if sample["deployment_mode"] == "agg":
            return EvalOutcome("failed", reason="replay failed: RuntimeError: injected")
        return EvalOutcome("feasible", report={"output_throughput_tok_s": 100.0 * sample["used_gpus"]},
                           replay_seconds=0.001)
