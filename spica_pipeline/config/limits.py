"""Resource sanity limits: inputs the schema accepts but no replay can serve, refused up front.

`spica validate` and `spica sweep` both call `check_resource_limits` (through
`sweep.check_workload`), so a config that would make every candidate fail or hang is exit 2 with
one line naming the field and the limit, before any replay. Why each limit:

* `search_space.gpu_budget` <= MAX_GPU_BUDGET: parallel-shape enumeration grows faster than the
  budget, so a budget of 10^12 GPUs sits silent for minutes instead of failing. On a 2-core machine
  `enumerate_branches` for Qwen3-32B/H200 takes minutes at 1024 GPUs and does not finish in minutes
  at 4096, so 1024 keeps the stage under a few minutes.
* requests per replay <= MAX_REQUESTS_PER_REPLAY: the replay holds every request in memory and
  simulates each one (2,000 requests at isl 256 take about a second, bench/results/replay_memory.json);
  num_request_ratio 1e9 aborts every worker with a 64 GB allocation failure.
* `workload.request_rate` <= MAX_REQUEST_RATE req/s: far above what any fleet serves; 10^12 req/s
  arrives all at once and measures nothing.
* estimated replay memory x parallel replays <= `sweep.max_replay_memory_share` of this machine's
  memory. The per-request cost is measured by `bench/bench_replay_memory.py`
  (bench/results/replay_memory.json: 7.7 kB/request at isl 256, 9.8 kB at 1024, 32 kB at
  8192); REPLAY_BYTES_* bound those points from above.
"""

import os
from typing import Any

from spica_pipeline.errors import ResourceLimitError

MAX_GPU_BUDGET = 1024
MAX_REQUESTS_PER_REPLAY = 1_000_000
MAX_REQUEST_RATE = 100_000.0
REPLAY_BYTES_PER_REQUEST = 8_000
REPLAY_BYTES_PER_INPUT_TOKEN = 3.5


def machine_memory_bytes() -> int | None:
    """Physical memory of this machine (or None where it cannot be read)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def replay_memory_bytes(input_lengths: Any, requests: float | None = None) -> float:
    """Estimated peak memory of one replay: a fixed cost per request plus one per input token.
    `input_lengths` is one length (times `requests`) or a per-request sequence (a trace)."""
    if requests is not None:
        return requests * (REPLAY_BYTES_PER_REQUEST + REPLAY_BYTES_PER_INPUT_TOKEN * float(input_lengths))
    total_tokens = float(sum(input_lengths)) if not hasattr(input_lengths, "sum") else float(input_lengths.sum())
    return len(input_lengths) * REPLAY_BYTES_PER_REQUEST + REPLAY_BYTES_PER_INPUT_TOKEN * total_tokens


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def synthetic_requests(workload: Any) -> tuple[float | None, str]:
    """(requests per replay, which fields set it) for a synthetic workload; None for kv_load,
    whose concurrency is only known per candidate (the ratio alone is then the lower bound)."""
    ratio = float(workload.num_request_ratio or 0)
    turns = int(getattr(workload, "turns_per_session", 1) or 1)
    per = f" x turns_per_session {turns}" if turns > 1 else ""
    if workload.concurrency is not None:
        return ratio * workload.concurrency * turns, f"num_request_ratio {ratio:g} x concurrency {workload.concurrency}{per}"
    if workload.request_rate is not None:
        return ratio * workload.request_rate * turns, f"num_request_ratio {ratio:g} x request_rate {workload.request_rate:g}{per}"
    return ratio * turns, f"num_request_ratio {ratio:g} (at least; x the candidate's concurrency){per}"


def check_resource_limits(config: Any, trace: Any = None, memory_bytes: int | None = None) -> None:
    """Raise ResourceLimitError (exit 2) for the first limit `config` exceeds. `trace` is the parsed
    TraceData of a trace workload; `memory_bytes` defaults to this machine's memory."""
    space, workload, sweep = config.search_space, config.workload, config.sweep
    if space.gpu_budget > MAX_GPU_BUDGET:
        raise ResourceLimitError(f"search_space.gpu_budget {space.gpu_budget} exceeds the limit of "
                                 f"{MAX_GPU_BUDGET} GPUs")
    if workload.request_rate is not None and workload.request_rate > MAX_REQUEST_RATE:
        raise ResourceLimitError(f"workload.request_rate {workload.request_rate:g} req/s exceeds the limit of "
                                 f"{MAX_REQUEST_RATE:,.0f} req/s")
    if trace is not None:
        requests, where = trace.n_requests, f"workload.trace_path {workload.trace_path}"
        field, what = "workload.trace_path", f"{where} has {requests:,} requests"
        memory = replay_memory_bytes(trace.input_length)
    else:
        count, how = synthetic_requests(workload)
        requests = count
        field, what = "workload.num_request_ratio", f"{how} = {count:,.0f} requests per replay"
        memory = replay_memory_bytes(workload.isl or 0, count)
    if requests > MAX_REQUESTS_PER_REPLAY:
        raise ResourceLimitError(f"{field}: {what}, over the limit of {MAX_REQUESTS_PER_REPLAY:,} requests "
                                 "per replay")
    total = memory_bytes if memory_bytes is not None else machine_memory_bytes()
    if not total:
        return
    workers = sweep.eval_workers
    if sweep.executor == "ray":  # the replays spread over the Ray cluster's nodes: one must fit here
        workers = 1
    allowed = sweep.max_replay_memory_share * total
    if workers * memory > allowed:
        raise ResourceLimitError(
            f"{field}: {what} need about {_gib(memory)} per replay x {workers} parallel replays "
            f"(sweep.parallel_evals) = {_gib(workers * memory)}, over sweep.max_replay_memory_share "
            f"{sweep.max_replay_memory_share:g} of this machine's {_gib(total)} ({_gib(allowed)}); lower the "
            "request count or parallel_evals, or raise the share")
