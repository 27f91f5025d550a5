"""Importable evaluator fakes for whole-sweep tests (spawned pool workers import them by path)."""

from spica_pipeline.evaluate.evaluator import EvalOutcome, Evaluator


class AggFailsEvaluator(Evaluator):
    """Every agg candidate fails; disagg candidates score their GPU count (no replay involved)."""

    def evaluate(self, request):
        candidate = request.candidate
        if candidate.deployment_mode == "agg":
            return EvalOutcome("failed", reason="replay failed: RuntimeError: injected")
        return EvalOutcome("feasible", report={"output_throughput_tok_s": 100.0 * candidate.used_gpus},
                           replay_seconds=0.001)


class CapacityEvaluator(Evaluator):
    """A replay stand-in for min_gpus: requests/s grow with the GPUs (TP2 engines a little faster),
    and a fleet of two replicas breaks the p90 TTFT SLA, so it must never be part of the answer."""

    def evaluate(self, request):
        candidate = request.candidate
        used = candidate.used_gpus
        agg = candidate.role("agg") if candidate.deployment_mode == "agg" else None
        rps = 3.0 * used + (1.0 if agg is not None and agg.shape.tp == 2 else 0.0)
        ttft = 900.0 if agg is not None and agg.replicas == 2 else 100.0
        report = {"request_throughput_rps": rps, "output_throughput_tok_s": 64.0 * rps,
                  "duration_ms": 3_600_000.0, "gpu_hours": float(used),
                  "p90_ttft_ms": ttft, "p90_itl_ms": 10.0, "mean_ttft_ms": ttft / 2}
        return EvalOutcome("feasible", report=report, replay_seconds=0.001)
