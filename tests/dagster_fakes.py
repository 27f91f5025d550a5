"""Evaluator fakes for the Dagster tests (importable by path: the e2e code location loads them)."""

from spica_pipeline.evaluate.evaluator import EvalOutcome, Evaluator


class FakeEvaluator(Evaluator):
    """Deterministic stand-in for the replay: throughput grows with max_num_seqs, per-GPU falls with GPUs."""

    def evaluate(self, request):
        candidate = request.candidate
        gpus = max(1, candidate.used_gpus)
        seqs = float(candidate.role("agg").engine.max_num_seqs if candidate.deployment_mode == "agg" else 256)
        tput = 1000.0 + seqs + 100.0 / gpus
        report = {"output_throughput_tok_s": tput * gpus, "gpu_hours": gpus / 60.0, "duration_ms": 60_000.0,
                  "mean_output_token_throughput_per_user": 5000.0 / seqs, "mean_e2e_latency_ms": 100.0 + seqs,
                  "mean_ttft_ms": 10.0, "mean_tpot_ms": 1.0}
        return EvalOutcome(status="feasible", report=report, replay_seconds=0.01, repeats=1)


class InfeasibleEvaluator(Evaluator):
    """Every candidate misses: the sweep ends with no feasible candidate."""

    def evaluate(self, request):
        return EvalOutcome(status="infeasible", reason="injected: over the SLA", replay_seconds=0.01, repeats=1)


class SlowEvaluator(FakeEvaluator):
    """FakeEvaluator that takes `seconds` per candidate: a time budget ends the study early."""

    def __init__(self, seconds: float = 0.4):
        self.seconds = seconds

    def evaluate(self, request):
        import time

        time.sleep(self.seconds)
        return super().evaluate(request)
