"""Stage 4 glue: read the workload's trace, then run the pure load-predictor sub-sweep."""

from typing import Any, Callable

from spica_pipeline.space.load_predictor.sweep import (
    LoadPredictorResult,
    sweep_load_predictor,
    throughput_intervals,
)
from spica_pipeline.traces import read_mooncake_trace


class _SpedUpTrace:
    """Trace arrays as the replay (and so its planner) sees them: arrivals / arrival_speedup_ratio."""

    def __init__(self, trace: Any, speedup: float) -> None:
        self.timestamp_ms = trace.timestamp_ms / float(speedup)
        self.input_length = trace.input_length
        self.output_length = trace.output_length


def load_predictor_for_config(
    config: Any, *, on_progress: Callable[[str], None] | None = None
) -> LoadPredictorResult:
    """The sub-sweep for a validated `SmartSearchConfig` (after the stage-2 policy filter).

    The trace is read only when some kept policy uses throughput scaling; a bad trace raises
    TraceError naming file and line, an unknown predictor family ValueError.
    """
    space, workload = config.search_space, config.workload
    policies = list(space.planner_scaling_policy)
    candidates = list(space.load_predictor_candidates)
    traffic = None
    if workload.is_trace and throughput_intervals(policies):
        trace = read_mooncake_trace(workload.trace_path)
        speedup = float(getattr(workload, "arrival_speedup_ratio", 1.0) or 1.0)
        traffic = trace if speedup == 1.0 else _SpedUpTrace(trace, speedup)
    return sweep_load_predictor(policies, candidates, traffic, is_trace=bool(workload.is_trace),
                                on_progress=on_progress)


load_predictor_from_config = load_predictor_for_config
