"""Measure a replay like a benchmark client: ramp, steady-state window, count.

Why: a closed loop whose clients all start at t=0 with fixed ISL/OSL stays in lockstep, so every
wave prefills c prompts together (TTFT 1.5-2.5x too high at low concurrency), and a short run is
dominated by the t=0 burst (the bias changed sign between 6 x c and 24 x c requests). Real
clients drift apart; their phases end up spread over one request cycle.

* Ramp: c closed-loop clients start `cycle / c` apart, where `cycle` is the estimated latency of
  one request at that load (prefill of one prompt + OSL-1 decode steps at the per-rank batch), so
  their phases are spread evenly over a cycle from the start. Each client sends its next request
  when the previous one completes (the replay's session turns with zero think time).
* Window (`WINDOW_RULES`): metrics come only from requests inside the steady state; warm-up
  and drain are excluded by a stated rule; the counted requests are recorded.
* Count: every client runs at least `MIN_TURNS` requests (bench/bench_fidelity.py --stability
  shows that doubling it moves mean TTFT/TPOT by <= 5 % on calibration rows).
* Throughput (`THROUGHPUT_DEFINITION`): one definition for tokens and requests, both over the window,
  so request rate x mean output length is the token rate.
* Offered load (`LOAD_MEASURES`): how the window's arrivals compare with what was served in its
  second half, where a fleet that keeps up has settled: what evaluate/scoring.carries_load judges.

Pure: works on the replay's per-request records (dicts) and plain numbers.
"""

import math
import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

MIN_TURNS = 8
OPEN_LOOP_TRIM = 0.10
WINDOW_RULES = {
    "closed_loop": ("closed loop: from the moment every client has completed its first request (warm-up) "
                    "to the moment the first client has completed its last request (drain); a request "
                    "counts when it arrives and completes inside that window"),
    "open_loop": (f"open loop: requests arriving in the first and last {OPEN_LOOP_TRIM:.0%} of the arrival "
                  "span are excluded (warm-up / drain); the rest count"),
    "whole_run": "whole run: every completed request counts (planner scaling has no steady state)",
    "benchmark_client": ("closed loop with every client starting at t=0, as genai-perf / aiperf / SGLang "
                         "bench_serving run a fixed-concurrency benchmark: every completed request counts "
                         "(what those clients report)"),
}
THROUGHPUT_DEFINITION = (
    "steady-state window: output tokens generated inside the window (a request's tokens after its first are "
    "spread evenly from its first to its last token) over the window's length; request throughput counts the "
    "same output in requests, each request adding the share of its output tokens generated inside the window, "
    "so request throughput x mean output length = token throughput. The replay's whole-run values stay "
    "beside them as full_run_*")
LOAD_MEASURES = (
    "offered_request_rate_rps: requests arriving in the window over its length; settled_served_share: "
    "requests served (as above) in the window's second half over those arriving in it; "
    "settled_queue_growth_rps: the mean number of requests in flight over the window's last quarter minus over "
    "its third, over a quarter's length (means over time, so one request arriving just before an instant is not "
    "growth); the window ends at the last arrival at the latest")
# How a closed loop's clients start (EvalRequest.context["closed_loop_client"]):
# "ramp" (default, sweeps): spread over one request cycle and measured in the steady-state window;
# "together" (bench/bench_fidelity.py): all at t=0, every request counted, like the benchmark
# clients that measured aiconfigurator-core's silicon rows (AIC's eval runners: genai-perf
# `--concurrency c --request-count 10c`, SGLang bench_serving `--max-concurrency c --num-prompts 10c`).
CLIENT_STARTS = ("ramp", "together")
# "together": each client waits a random gap, uniform in [0, CLIENT_GAP_CYCLES x the estimated
# request cycle], between a response and its next request. Without it, fixed-ISL/OSL clients stay
# in lockstep forever in a deterministic replay; real clients drift apart.
CLIENT_GAP_CYCLES = 0.0
# The benchmark-client replay a sweep runs beside its own when its calibration profile corrects that
# replay (fidelity/profile.py, "replay": "client"): AIC's eval runners send 10 x c requests.
CLIENT_REQUEST_RATIO = 10.0
# ... with each request's ISL and OSL uniform in L x (1 -+ this), on both backends, unless the workload sets a spread
# of its own (or has several turns per session). Why: the profile corrects this replay with factors fitted on silicon
# rows replayed as their clients measured them, and most of those rows come from InferenceMAX's client, which draws
# lengths uniformly over [0.8 L, L]: 1/9 around its mean (fidelity/silicon.benchmark_client). With fixed lengths a
# deterministic replay keeps clients that started together in lockstep, every wave prefilling all c prompts at once:
# a different quantity from the one the factors were fitted on (docs/fidelity.md, "What is measured").
CLIENT_LENGTH_SPREAD = 1 / 9


def benchmark_client_request(request: Any, request_ratio: float = CLIENT_REQUEST_RATIO, *,
                             fixed_lengths: bool = False) -> Any:
    """`request` (an EvalRequest) as the benchmark client replays it: every client at t=0,
    `request_ratio` x c requests, every request counted, no calibration of its own (the same
    replay bench/bench_fidelity.py records as "ours"). `fixed_lengths`: a client that sends exactly the
    workload's ISL and OSL (fidelity/profile.uses_fixed_lengths says when a sweep's client is replayed so)."""
    from dataclasses import replace

    context = {k: v for k, v in (request.context or {}).items() if k not in ("calibration", "client_lengths")}
    workload = {**request.workload, "num_request_ratio": request_ratio}
    own = workload.get("isl_jitter") or workload.get("osl_jitter") or int(workload.get("turns_per_session") or 1) > 1
    if not fixed_lengths and not own and CLIENT_LENGTH_SPREAD:
        workload["isl_jitter"] = workload["osl_jitter"] = CLIENT_LENGTH_SPREAD
    return replace(request, workload=workload, context={**context, "closed_loop_client": "together"})


@dataclass(frozen=True)
class ClosedLoop:
    """c clients x `turns` requests each, client k starting at k x `interval_ms`."""

    clients: int
    turns: int
    interval_ms: float
    cycle_ms: float

    @property
    def request_count(self) -> int:
        return self.clients * self.turns

    def to_dict(self) -> dict[str, Any]:
        return {"clients": self.clients, "turns": self.turns, "interval_ms": round(self.interval_ms, 4),
                "cycle_ms": round(self.cycle_ms, 4), "request_count": self.request_count}


def cycle_estimate_ms(isl: int, osl: int, per_rank_batch: int, *, prefill_ms: Callable[[int], float],
                      decode_ms: Callable[[int, int], float]) -> float:
    """One request's latency at steady load: prefill of its prompt + OSL-1 decode steps.

    decode_ms(batch, context) at the mean context of a request's decode (ISL + OSL/2).
    """
    batch = max(1, int(per_rank_batch))
    step = decode_ms(batch, int(isl + osl / 2))
    return float(prefill_ms(int(isl)) + max(int(osl) - 1, 0) * step)


def closed_loop(concurrency: int, requested: int, cycle_ms: float, *, min_turns: int = MIN_TURNS) -> ClosedLoop:
    """The ramped closed loop for `concurrency` clients and at least `requested` requests."""
    clients = max(1, int(concurrency))
    turns = max(int(min_turns), math.ceil(max(1, int(requested)) / clients))
    cycle = max(0.0, float(cycle_ms)) if math.isfinite(cycle_ms) else 0.0
    return ClosedLoop(clients, turns, cycle / clients, cycle)


@dataclass
class Window:
    """The steady-state window of one replay and the metrics measured inside it."""

    kind: str
    start_ms: float
    end_ms: float
    counted: int
    total: int
    metrics: dict[str, float] = field(default_factory=dict)
    arrivals_only: bool = False  # the measured requests are those arriving inside (an open loop's window)

    @property
    def rule(self) -> str:
        return WINDOW_RULES[self.kind]

    def to_report(self) -> dict[str, float]:
        """Report keys: the window's metrics plus how it was cut (all numeric, ledger-friendly)."""
        return {**self.metrics, "window_start_ms": self.start_ms, "window_end_ms": self.end_ms,
                "window_counted_requests": float(self.counted), "window_total_requests": float(self.total),
                "window_counts_arrivals": float(self.arrivals_only)}


def _done(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("ttft_ms") is not None and r.get("terminal_time_ms") is not None]


def closed_loop_bounds(records: list[dict[str, Any]]) -> tuple[float, float]:
    """(warm-up end, drain start) of a session-per-client closed loop."""
    sessions: dict[Any, list[dict[str, Any]]] = {}
    for r in records:
        sessions.setdefault(r.get("session_id"), []).append(r)
    firsts, lasts = [], []
    for turns in sessions.values():
        turns.sort(key=lambda r: (r.get("turn_index") or 0, r["arrival_time_ms"]))
        firsts.append(turns[0]["terminal_time_ms"])
        lasts.append(turns[-1]["terminal_time_ms"])
    return max(firsts), min(lasts)


def open_loop_bounds(records: list[dict[str, Any]], trim: float = OPEN_LOOP_TRIM) -> tuple[float, float]:
    arrivals = sorted(r["arrival_time_ms"] for r in records)
    lo = arrivals[min(len(arrivals) - 1, int(math.floor(trim * len(arrivals))))]
    hi = arrivals[max(0, int(math.ceil((1 - trim) * len(arrivals))) - 1)]
    return lo, hi


def quantile(values: list[float], q: float) -> float:
    """Linear-interpolated quantile of a non-empty list (numpy's default rule, without numpy)."""
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _stats(prefix: str, values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {f"mean_{prefix}": statistics.fmean(values), f"median_{prefix}": quantile(values, 0.5),
            f"p90_{prefix}": quantile(values, 0.9), f"p99_{prefix}": quantile(values, 0.99)}


def _first_token(r: dict[str, Any]) -> float:
    ft = r.get("first_token_ms")
    return float(ft) if ft is not None else r["arrival_time_ms"] + r["ttft_ms"]


def _tokens_in(r: dict[str, Any], start: float, end: float) -> float:
    """Output tokens a request generated inside [start, end]: its first token, then the rest spread
    evenly from the first to the last token (a throughput over a window, not over completions)."""
    n = int(r.get("output_length") or 0)
    if n <= 0:
        return 0.0
    first = _first_token(r)
    last_ms = r.get("last_token_ms")
    last = float(last_ms if last_ms is not None else r["terminal_time_ms"])
    count = 1.0 if start < first <= end else 0.0
    if n > 1:
        if last > first:
            overlap = max(0.0, min(end, last) - max(start, first)) / (last - first)
        else:
            overlap = 1.0 if start < last <= end else 0.0
        count += (n - 1) * overlap
    return count


def _requests_in(r: dict[str, Any], start: float, end: float) -> float:
    """The share of a request served inside [start, end]: its output tokens generated there over its
    output length (a request without output counts whole when it completes there)."""
    n = int(r.get("output_length") or 0)
    if n <= 0:
        return 1.0 if start < r["terminal_time_ms"] <= end else 0.0
    return _tokens_in(r, start, end) / n


def load_measures(records: Iterable[dict[str, Any]], start: float, end: float) -> dict[str, float]:
    """LOAD_MEASURES of one replay's window [start, end]: the offered request rate, and the served share
    and queue growth over the window's second half (empty when the window has no length)."""
    done = _done(records)
    if not done:
        return {}
    end = min(end, max(r["arrival_time_ms"] for r in done))
    if end <= start:
        return {}
    middle = (start + end) / 2.0
    half_s = (end - middle) / 1000.0

    def arrivals(lo: float, hi: float) -> int:
        return sum(1 for r in done if lo <= r["arrival_time_ms"] <= hi)

    def in_flight(lo: float, hi: float) -> float:  # the mean number of requests in flight over [lo, hi]
        return math.fsum(max(0.0, min(hi, r["terminal_time_ms"]) - max(lo, r["arrival_time_ms"])) for r in done) \
            / (hi - lo)

    late_arrivals = arrivals(middle, end)
    served = math.fsum(_requests_in(r, middle, end) for r in done)
    quarter = (end - middle) / 2.0
    growth = in_flight(middle + quarter, end) - in_flight(middle, middle + quarter)
    return {"offered_request_rate_rps": arrivals(start, end) / ((end - start) / 1000.0),
            "settled_served_share": served / late_arrivals if late_arrivals else 1.0,
            "settled_queue_growth_rps": growth / (half_s / 2.0)}


def _meets(r: dict[str, Any], sla: Mapping[str, float], ttft_scale: float = 1.0, itl_scale: float = 1.0,
           e2e_scale: float = 1.0) -> bool:
    """The replay's goodput test: TTFT and per-request mean ITL within the SLA (or E2E alone); the
    scales test calibrated latencies (fidelity/apply.py) with the same rule."""
    if sla.get("e2e_ms") is not None:
        return (r.get("e2e_latency_ms") or math.inf) * e2e_scale <= sla["e2e_ms"]
    ok = True
    if sla.get("ttft_ms") is not None:
        ok = ok and r["ttft_ms"] * ttft_scale <= sla["ttft_ms"]
    if sla.get("itl_ms") is not None:
        itl = r.get("itl_ms")
        ok = ok and (itl if itl is not None else 0.0) * itl_scale <= sla["itl_ms"]
    return ok


def counted(r: dict[str, Any], start: float, end: float, arrivals_only: bool = False) -> bool:
    """Whether a completed request is one of the window's measured requests: it arrives and completes
    inside the window, or (an open loop's window, `arrivals_only`) it arrives inside it."""
    if arrivals_only:
        return start <= r["arrival_time_ms"] <= end
    return r["arrival_time_ms"] >= start and r["terminal_time_ms"] <= end


def sla_token_share(records: Iterable[dict[str, Any]], start: float, end: float, sla: Mapping[str, float], *,
                    ttft_scale: float = 1.0, itl_scale: float = 1.0, e2e_scale: float = 1.0,
                    arrivals_only: bool = False) -> tuple[float, int]:
    """(share of the window's output tokens from requests meeting the SLA, the window's measured requests
    meeting it), with each request's latencies scaled: goodput = output throughput x share. The measured
    requests are the window's own (`counted`; `arrivals_only` for an open loop's window, the report's
    window_counts_arrivals), so the count over window_counted_requests is the SLA attainment."""
    done = _done(records)
    scales = {"ttft_scale": ttft_scale, "itl_scale": itl_scale, "e2e_scale": e2e_scale}
    total = math.fsum(_tokens_in(r, start, end) for r in done)
    good = math.fsum(_tokens_in(r, start, end) for r in done if _meets(r, sla, **scales))
    inside = sum(1 for r in done if counted(r, start, end, arrivals_only) and _meets(r, sla, **scales))
    return (good / total if total > 0 else 0.0), inside


def steady_state(records: Iterable[dict[str, Any]], kind: str, *,
                 sla: dict[str, float] | None = None) -> Window | None:
    """Cut the window (`kind` in WINDOW_RULES) and measure inside it; None when nothing completed.

    Latencies are over the window's measured requests (`counted`); throughputs are the output generated
    in it over its length (THROUGHPUT_DEFINITION: a steady state's rate, not diluted by ramp/drain).
    """
    done = _done(records)
    if not done:
        return None
    if kind == "closed_loop":
        start, end = closed_loop_bounds(done)
    elif kind == "benchmark_client":
        start, end = min(r["arrival_time_ms"] for r in done), max(r["terminal_time_ms"] for r in done)
    elif kind == "open_loop":
        start, end = open_loop_bounds(done)
    else:
        start, end = min(r["arrival_time_ms"] for r in done), max(r["terminal_time_ms"] for r in done)
    # an overloaded open loop never drains inside: count every arrival in the span
    arrivals_only = kind == "open_loop"
    inside = [r for r in done if counted(r, start, end, arrivals_only)]
    if not inside or end <= start:  # too short for a steady state: say so by measuring everything
        kind, inside, arrivals_only = "whole_run", done, False
        start, end = min(r["arrival_time_ms"] for r in done), max(r["terminal_time_ms"] for r in done)
    metrics: dict[str, float] = {}
    metrics.update(_stats("ttft_ms", [r["ttft_ms"] for r in inside]))
    tpot = [r["itl_ms"] for r in inside if r.get("itl_ms") is not None]
    metrics.update(_stats("tpot_ms", tpot))
    if tpot:
        metrics["mean_itl_ms"] = statistics.fmean(tpot)
        # p90/p99 ITL over the window's requests (each request's mean ITL), the quantity goodput
        # judges per request, so the strict gate and goodput measure the same thing (p90 ITL <=
        # itl_ms: about 90 % of requests meet the ITL SLA); the replay's own value is token-level
        # over the whole run and stays as full_run_p90_itl_ms
        metrics["p90_itl_ms"] = metrics["p90_tpot_ms"]
        metrics["p99_itl_ms"] = metrics["p99_tpot_ms"]
        metrics["mean_output_token_throughput_per_user"] = statistics.fmean(1000.0 / t for t in tpot if t > 0)
    metrics.update(_stats("e2e_latency_ms", [r["e2e_latency_ms"] for r in inside if r.get("e2e_latency_ms")]))
    span_s = (end - start) / 1000.0
    if span_s > 0:  # THROUGHPUT_DEFINITION
        metrics["request_throughput_rps"] = math.fsum(_requests_in(r, start, end) for r in done) / span_s
        metrics["output_throughput_tok_s"] = math.fsum(_tokens_in(r, start, end) for r in done) / span_s
        metrics["input_throughput_tok_s"] = sum(int(r.get("input_length") or 0) for r in done
                                                if start < _first_token(r) <= end) / span_s
        metrics["total_throughput_tok_s"] = metrics["output_throughput_tok_s"] + metrics["input_throughput_tok_s"]
        metrics.update(load_measures(done, start, end))
        if sla:
            good = [r for r in done if _meets(r, sla)]
            metrics["goodput_completed_requests"] = float(sum(1 for r in inside if _meets(r, sla)))
            metrics["goodput_request_throughput_rps"] = math.fsum(_requests_in(r, start, end) for r in good) / span_s
            metrics["goodput_output_throughput_tok_s"] = math.fsum(_tokens_in(r, start, end) for r in good) / span_s
    return Window(kind, float(start), float(end), len(inside), len(done), metrics, arrivals_only)


def windowed_summary(summary: dict[str, Any], per_request: list[dict[str, Any]], kind: str | None,
                     sla: dict[str, float] | None = None) -> dict[str, Any]:
    """The replay summary with its latency/throughput keys measured in the steady-state window.

    The whole-run means stay beside them as `full_run_*` so the ledger shows what the window changed.
    """
    window = steady_state(per_request, kind or "open_loop", sla=sla)
    if window is None:
        return summary
    out = dict(summary)
    for key in ("mean_ttft_ms", "mean_tpot_ms", "output_throughput_tok_s", "request_throughput_rps", "p90_itl_ms",
                "p99_itl_ms"):
        if key in summary:
            out[f"full_run_{key}"] = summary[key]
    out.update(window.to_report())
    return out


def window_kind(is_static: bool, ramped: bool, together: bool = False) -> str:
    """Which WINDOW_RULES entry measures a replay."""
    if not is_static:
        return "whole_run"
    if together:
        return "benchmark_client"
    return "closed_loop" if ramped else "open_loop"


def relative_change(a: float, b: float) -> float:
    """|b - a| / |a| (inf when a is 0 and b is not)."""
    if a == b:
        return 0.0
    return abs(b - a) / abs(a) if a else math.inf


def jittered_trace(*, isl: int, osl: int, isl_jitter: float, osl_jitter: float, seed: int,
                   loop: ClosedLoop | None = None, request_count: int = 0, interval_ms: float = 0.0,
                   shared_prefix_ratio: float = 0.0, num_prefix_groups: int = 0,
                   block_size: int = 512, turn_gap_ms: float = 0.0) -> list[dict[str, Any]]:
    """Mooncake records with per-request ISL/OSL drawn uniformly in x(1 -+ jitter).

    Closed loop (`loop`): one session per client, the first request at the client's ramp offset,
    each later one sent when the previous completes. Open loop: `request_count` requests
    `interval_ms` apart. A shared prefix (ratio of the mean ISL, in whole blocks) is common to the
    requests of one of `num_prefix_groups` groups, as in the synthetic replay; the rest is unique.
    turn_gap_ms: a closed-loop client waits uniform [0, turn_gap_ms] before each later request.
    """
    import random

    rng = random.Random(seed)

    def draw(mean: int, jitter: float) -> int:
        return max(1, round(rng.uniform(mean * (1 - jitter), mean * (1 + jitter))))

    prefix_blocks = int(shared_prefix_ratio * isl) // block_size if num_prefix_groups > 0 else 0
    next_id = [max(1, num_prefix_groups) * prefix_blocks]

    def record(n: int) -> dict[str, Any]:
        length = draw(isl, isl_jitter)
        blocks = -(-length // block_size)
        group = n % num_prefix_groups if prefix_blocks else 0
        shared = list(range(group * prefix_blocks, group * prefix_blocks + min(prefix_blocks, blocks)))
        unique = list(range(next_id[0], next_id[0] + blocks - len(shared)))
        next_id[0] += len(unique)
        return {"input_length": length, "output_length": draw(osl, osl_jitter), "hash_ids": shared + unique}

    out: list[dict[str, Any]] = []
    if loop is not None:
        n = 0
        for client in range(loop.clients):
            for turn in range(loop.turns):
                rec = {"session_id": f"client{client}", **record(n)}
                if turn == 0:
                    rec["timestamp"] = round(client * loop.interval_ms, 6)
                elif turn_gap_ms > 0:  # the client's own gap before its next request
                    rec["delay"] = round(rng.uniform(0.0, turn_gap_ms), 6)
                out.append(rec)
                n += 1
        return out
    for n in range(max(1, int(request_count))):
        out.append({"timestamp": round(n * interval_ms, 6), **record(n)})
    return out
