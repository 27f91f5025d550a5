"""Applying a calibration profile to a replay's report: calibrated values, their P10-P90 bands, and the goal
metrics at the calibrated TTFT and TPOT (what evaluate/replay.py adds to every report of a calibrated sweep).

A phase's calibrated value is factor x (replayed + overhead), where:

* replayed is the client replay's mean when the profile corrects that replay ("replay": "client") and the sweep
  ran it; without it the profile's sweep_fallback corrects the sweep's own mean;
* factor = the entry's factor x exp(b (x - a)) for the candidate's (system, backend, phase): its slice, else its
  backend's entry, else its phase's (those two with the band widened FALLBACK_WIDEN x); x = log2 of the
  concurrency per engine of the phase's role; the load terms and the overhead are the entry's own where it
  carries them (format 6), else the profile's.

Every other key of the phase (medians, P90s, ITL, per-user throughput) takes the same factor over the report's
own mean, so they move with it. Pure: no files (profile.py loads them).
"""

import math
from collections.abc import Mapping
from typing import Any

from spica_pipeline.config.goal import GOODPUT_KEY
from spica_pipeline.fidelity.measurement import sla_token_share
from spica_pipeline.fidelity.profile import FALLBACK_WIDEN, PHASES, SWEEP_FALLBACK, needs_client, number, replay_basis

# report key -> (phase, exponent): calibrated = raw x factor**exponent
CALIBRATED_KEYS: dict[str, tuple[str, int]] = {
    "mean_ttft_ms": ("ttft", 1), "median_ttft_ms": ("ttft", 1), "p90_ttft_ms": ("ttft", 1),
    "mean_tpot_ms": ("tpot", 1), "median_tpot_ms": ("tpot", 1), "p90_tpot_ms": ("tpot", 1),
    "mean_itl_ms": ("tpot", 1), "p90_itl_ms": ("tpot", 1),
    "mean_output_token_throughput_per_user": ("tpot", -1),
}
# goal metrics calibrated from the phases (`calibrate`: ranking reads them, evaluate/scoring.ranked_value)
GOAL_KEYS: tuple[str, ...] = ("mean_e2e_latency_ms", "p90_e2e_latency_ms", "output_throughput_tok_s",
                              "request_throughput_rps", GOODPUT_KEY, "goodput_completed_requests",
                              "sla_token_share")
# goal metric -> the phase whose band bounds it and the direction it moves (time-like +1, rate-like -1)
GOAL_PHASE: dict[str, tuple[str, int]] = {
    "throughput": ("tpot", -1), "throughput_per_gpu": ("tpot", -1), "throughput_per_user": ("tpot", -1),
    "goodput": ("tpot", -1), "goodput_per_gpu": ("tpot", -1), "min_gpus": ("tpot", -1),
    "e2e_latency": ("tpot", 1), "cost_per_mtok": ("tpot", 1),
}
# what a calibrated report adds (copied into Candidate.metrics so tables and deploy output see it)
REPORT_KEYS: tuple[str, ...] = (
    *(f"calibrated_{k}" for k in CALIBRATED_KEYS),
    *(f"calibrated_{k}" for k in GOAL_KEYS),
    *(f"{stem}_{p}{tail}" for p in PHASES for stem, tail in (("band", "_lo"), ("band", "_hi"), ("band", "_rows"),
                                                              ("calibration_factor", ""))),
    "calibration_fallback",
    # the window's requests meeting the SLA with TTFT and ITL at the top of their P10-P90 bands
    "pessimistic_goodput_completed_requests",
)


def load_x(concurrency_per_engine: float | None) -> float:
    """The load coordinate of the load term: log2 of concurrency per engine (1 when unknown)."""
    c = concurrency_per_engine if concurrency_per_engine and concurrency_per_engine > 0 else 1.0
    return math.log2(max(1.0, float(c)))


def factor_at(profile: Mapping[str, Any], system: str, backend: str, phase: str,
              load: float) -> tuple[float, dict[str, Any], str]:
    """(factor, the entry, where it came from: slice / backend / phase) for one phase at load coordinate `load`."""
    entry = profile["slices"].get(f"{system}/{backend}/{phase}")
    source = "slice"
    if entry is None:
        entry, source = profile["backend"].get(f"{backend}/{phase}"), "backend"
    if entry is None:
        entry, source = profile["phase"][phase], "phase"
    terms = entry["terms"] if "terms" in entry else profile["terms"][phase]
    log_load = sum(t["coefficient"] * (load - t.get("anchor", 0.0)) for t in terms)
    return entry["factor"] * math.exp(log_load), entry, source


def lookup(profile: Mapping[str, Any], system: str, backend: str, phase: str,
           concurrency_per_engine: float | None = None) -> dict[str, Any]:
    """{factor, band: [lo, hi] (log), rows, source, overhead_ms}: the slice, else its backend, else the phase (a
    fallback: rows 0, the band widened FALLBACK_WIDEN x); overhead_ms: the entry's own, else the profile's for
    the backend."""
    factor, entry, source = factor_at(profile, system, backend, phase, load_x(concurrency_per_engine))
    overhead = entry["overhead_ms"] if "overhead_ms" in entry else \
        (profile.get("overhead_ms") or {}).get(f"{backend}/{phase}", 0.0)
    if source == "slice":
        return {"factor": factor, "band": list(entry["band"]), "rows": entry["rows"], "source": source,
                "overhead_ms": overhead}
    lo, hi = entry["band"]
    return {"factor": factor, "band": [lo * FALLBACK_WIDEN, hi * FALLBACK_WIDEN], "rows": 0,
            "source": f"fallback:{source}", "overhead_ms": overhead}


def calibrate(report: Mapping[str, Any], profile: Mapping[str, Any], *, system: str | Mapping[str, str], backend: str,
              concurrency: Mapping[str, float] | float | None = None, extra_widen: float = 1.0,
              closed_loop: bool = False, per_request: list[dict[str, Any]] | None = None,
              sla: Mapping[str, float] | None = None,
              client: Mapping[str, float | None] | None = None) -> dict[str, Any]:
    """`calibrated_<key>` for every calibrated key present, the goal metrics at calibrated TTFT/TPOT
    (`_calibrated_goal`), `calibration_factor_<phase>` and the `band_<phase>_lo/hi` multipliers.

    system: the GPU system, one name or {"ttft": prefill-side, "tpot": decode-side} when a disagg candidate's
    roles run on two types: each phase reads the slice of the system that runs it.
    concurrency: per-engine concurrency, one number or {"ttft": prefill-side, "tpot": decode-side} (a disagg
    candidate's TTFT is prefill-bound and its TPOT decode-bound).
    extra_widen > 1 widens the bands further (e.g. a perf-data fallback was used for this candidate).
    client: the same candidate's benchmark-client replay, mean {"ttft", "tpot"} (ms). A phase the profile fits
    on that replay is calibrated as client value x factor; the phase's factor on this report is then that over
    the report's own mean. Without a client value such a phase uses the profile's sweep_fallback. An overhead a
    (overhead_ms) makes it factor x (replayed + a): the phase's other keys take the same factor, so their a
    scales with their value (exact for the mean the profile was fitted on, close for medians and percentiles).
    """
    out: dict[str, Any] = {}
    per_phase = concurrency if isinstance(concurrency, Mapping) else {p: concurrency for p in PHASES}
    systems = system if isinstance(system, Mapping) else {p: system for p in PHASES}
    looked: dict[str, dict[str, Any]] = {}
    for p in PHASES:
        own = _finite(report.get(f"mean_{p}_ms"))
        seen = _finite((client or {}).get(p))
        corrected, base = profile, own  # the profile whose factors (and overhead) apply, and the value they correct
        if replay_basis(profile, p) == "client" and seen is not None and seen > 0 and own is not None and own > 0:
            ratio = seen / own  # the client replay over the report's own mean
            info = lookup(profile, systems[p], backend, p, per_phase.get(p))
            info = {**info, "factor": info["factor"] * ratio}
            base = own * ratio
            out[f"client_mean_{p}_ms"] = seen
        elif replay_basis(profile, p) == "client":
            corrected = profile[SWEEP_FALLBACK]
            info = lookup(corrected, systems[p], backend, p, per_phase.get(p))
            info = {**info, "source": f"{SWEEP_FALLBACK}:{info['source']}"}
        else:
            info = lookup(profile, systems[p], backend, p, per_phase.get(p))
        overhead = info["overhead_ms"]
        if overhead and base is not None and base > 0:  # factor x replayed -> factor x (replayed + a)
            info = {**info, "factor": info["factor"] * (base + overhead) / base}
        looked[p] = info
    for key, (phase, exponent) in CALIBRATED_KEYS.items():
        v = report.get(key)
        if isinstance(v, (int, float)) and math.isfinite(v):
            out[f"calibrated_{key}"] = float(v) * looked[phase]["factor"] ** exponent
    for phase, info in looked.items():
        lo, hi = info["band"]
        out[f"calibration_factor_{phase}"] = info["factor"]
        out[f"band_{phase}_lo"] = math.exp(lo * extra_widen)
        out[f"band_{phase}_hi"] = math.exp(hi * extra_widen)
        out[f"band_{phase}_rows"] = float(info["rows"])
    out["calibration_fallback"] = float(any(i["source"].removeprefix(f"{SWEEP_FALLBACK}:").startswith("fallback")
                                            for i in looked.values()))
    if needs_client(profile):  # 1: the client replay's means were corrected; 0: the sweep fallback was used
        out["calibration_client_replay"] = float(any(f"client_mean_{p}_ms" in out for p in PHASES))
    out.update(_calibrated_goal(report, out, looked["ttft"]["factor"], looked["tpot"]["factor"],
                                closed_loop=closed_loop, per_request=per_request, sla=sla))
    return out


def _calibrated_goal(report: Mapping[str, Any], calibrated: Mapping[str, Any], f_ttft: float, f_tpot: float, *,
                     closed_loop: bool, per_request: list[dict[str, Any]] | None,
                     sla: Mapping[str, float] | None) -> dict[str, float]:
    """The goal metrics at calibrated TTFT/TPOT, so picks rank on them (evaluate/scoring.ranked_value).

    E2E = TTFT + the decode part: ttft x f_ttft + (e2e - ttft) x f_tpot (its P90 scaled by the same ratio). A
    closed loop's clients send the next request when one completes, so its throughputs scale with raw E2E /
    calibrated E2E; an open loop's arrivals are fixed, so its throughputs stay. Goodput: the share of the
    window's output tokens from requests that meet the SLA with their TTFT x f_ttft and ITL x f_tpot (E2E
    rescaled likewise), times the calibrated output throughput. The pessimistic count tests the same requests
    with TTFT and ITL at the top of their bands (`calibrated`'s band_<phase>_hi).
    """
    out: dict[str, float] = {}
    e2e, ttft = _finite(report.get("mean_e2e_latency_ms")), _finite(report.get("mean_ttft_ms"))
    ratio = 1.0
    if e2e is not None and ttft is not None and e2e > 0:
        cal_e2e = ttft * f_ttft + max(0.0, e2e - ttft) * f_tpot
        if cal_e2e > 0:
            out["calibrated_mean_e2e_latency_ms"] = cal_e2e
            ratio = e2e / cal_e2e
            p90 = _finite(report.get("p90_e2e_latency_ms"))
            if p90 is not None:
                out["calibrated_p90_e2e_latency_ms"] = p90 / ratio
    for key in ("output_throughput_tok_s", "request_throughput_rps"):
        v = _finite(report.get(key))
        if v is not None:
            out[f"calibrated_{key}"] = v * ratio if closed_loop else v
    start, end = _finite(report.get("window_start_ms")), _finite(report.get("window_end_ms"))
    if sla and per_request and start is not None and end is not None:
        arrivals_only = bool(report.get("window_counts_arrivals"))
        share, good = sla_token_share(per_request, start, end, sla, ttft_scale=f_ttft, itl_scale=f_tpot,
                                      e2e_scale=1.0 / ratio, arrivals_only=arrivals_only)
        out["calibrated_sla_token_share"] = share
        out["calibrated_goodput_completed_requests"] = float(good)
        hi_ttft, hi_tpot = _finite(calibrated.get("band_ttft_hi")), _finite(calibrated.get("band_tpot_hi"))
        if hi_ttft is not None and hi_tpot is not None:
            _, worst = sla_token_share(per_request, start, end, sla, ttft_scale=f_ttft * hi_ttft,
                                       itl_scale=f_tpot * hi_tpot, e2e_scale=hi_tpot / ratio,
                                       arrivals_only=arrivals_only)
            out["pessimistic_goodput_completed_requests"] = float(worst)
        if "calibrated_output_throughput_tok_s" in out:
            out[f"calibrated_{GOODPUT_KEY}"] = out["calibrated_output_throughput_tok_s"] * share
    return out


def _finite(v: Any) -> float | None:
    return float(v) if number(v) else None


def goal_band(report: Mapping[str, Any], goal_metric: str, value: float | None) -> tuple[float, float] | None:
    """P10-P90 range for a goal metric's value from the band of the phase that bounds it."""
    if value is None or not math.isfinite(value) or goal_metric not in GOAL_PHASE:
        return None
    phase, direction = GOAL_PHASE[goal_metric]
    lo, hi = report.get(f"band_{phase}_lo"), report.get(f"band_{phase}_hi")
    if lo is None or hi is None:
        return None
    if direction > 0:
        return (value * lo, value * hi)
    return (value / hi, value / lo)


def bands(metrics: Mapping[str, Any], goal_metric: str | None = None,
          goal_value: float | None = None) -> dict[str, tuple[float, float]]:
    """P10-P90 ranges of calibrated mean TTFT, mean TPOT and (when given) the goal value."""
    out: dict[str, tuple[float, float]] = {}
    for phase, key in (("ttft", "calibrated_mean_ttft_ms"), ("tpot", "calibrated_mean_tpot_ms")):
        v, lo, hi = metrics.get(key), metrics.get(f"band_{phase}_lo"), metrics.get(f"band_{phase}_hi")
        if v is not None and lo is not None and hi is not None:
            out[f"{phase}_ms"] = (v * lo, v * hi)
    if goal_metric is not None:
        band = goal_band(metrics, goal_metric, goal_value)
        if band is not None:
            out["goal"] = band
    return out
