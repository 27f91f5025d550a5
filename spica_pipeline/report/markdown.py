"""report.md: what a person reads first after a sweep."""

import json
import math
from typing import Any, Mapping

import pandas as pd

from spica_pipeline.config.goal import Target
from spica_pipeline.evaluate import scoring
from spica_pipeline.report import accuracy, verdict
from spica_pipeline.report.merge import MergeResult
from spica_pipeline.report.tables import (
    candidate_bands,
    describe_candidate,
    fmt_value,
    goal_value,
    plot_axes,
    router_spread_pct,
    sla_attainment,
)

TOP_RANKED = 10


def _kv_lines(d: Mapping[str, Any]) -> list[str]:
    out = []
    for k, v in d.items():
        if isinstance(v, (dict, list)):
            v = json.dumps(v, sort_keys=True)
        out.append(f"- **{k}**: {v}")
    return out or ["- (none given)"]


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(x) for x in r) + " |" for r in rows]
    return lines


def _num(v: Any) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–" if v is None or math.isnan(v) else str(v)
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.3g}"


def _pct(v: float | None, signed: bool = False) -> str:
    if v is None:
        return "–"
    return f"±{v:.1f}%" if signed else f"{100.0 * v:.1f}%"


def _attainment(c: Any) -> str:
    """'62.0% [31.0%]': the share of requests within the SLA as picks are judged, then its pessimistic band's."""
    got, pess = sla_attainment(c), sla_attainment(c, "pessimistic")
    return _pct(got) + (f" [{_pct(pess)}]" if got is not None and pess is not None else "")


def _quality(c: Any) -> list[str]:
    """SLA attainment, p90 TTFT / ITL (calibrated when the report has them, as picks are judged) and the
    router-repeat spread of one candidate, as table cells."""
    return [_attainment(c), _num(scoring.ranked_value(c.metrics, "p90_ttft_ms")),
            _num(scoring.ranked_value(c.metrics, "p90_itl_ms")), _pct(router_spread_pct(c), signed=True)]


def _load_cells(c: Any, merge: MergeResult) -> list[str]:
    """The request rate a candidate served and, with a GPU price, its cost per million output tokens and
    per thousand requests (the cost of its request rate)."""
    cost = [_num(scoring.cost_per_mtok(c.metrics)), _num(scoring.cost_per_k_requests(c.metrics))] \
        if merge.gpu_price is not None else []
    return [_num(scoring.ranked_value(c.metrics, "request_throughput_rps")), *cost]


def _load_header(merge: MergeResult) -> list[str]:
    return ["served req/s", *(["USD/Mtok", "USD/1k req"] if merge.gpu_price is not None else [])]


def _quality_header(candidates: Any) -> list[str]:
    """QUALITY_HEADER, its p90 columns marked (cal.) when they show calibrated values."""
    if not any(c.metrics.get("calibrated_p90_ttft_ms") is not None for c in candidates):
        return QUALITY_HEADER
    return [h.replace(" ms", " ms (cal.)") if h.startswith("p90") else h for h in QUALITY_HEADER]


def _cost_line(c: Any, merge: MergeResult) -> list[str]:
    """What the pick's GPUs cost at the sweep's GPU price, per hour, per million tokens, per 1k requests."""
    per_hour = scoring.usd_per_hour(c.metrics)
    if merge.gpu_price is None or per_hour is None:
        return []
    price = float(c.metrics.get(scoring.GPU_PRICE_KEY, merge.gpu_price))  # with two GPU types, its own mean
    types = (" (the mean over its GPUs of " + ", ".join(f"{s} {p:g}" for s, p in merge.gpu_prices.items()) + ")"
             if merge.gpu_prices else "")
    return [f"Cost at {price:g} USD per GPU-hour{types}: {_num(per_hour)} USD/h; "
            f"{_num(scoring.cost_per_mtok(c.metrics))} USD per million output tokens and "
            f"{_num(scoring.cost_per_k_requests(c.metrics))} USD per thousand requests at the "
            f"{_num(scoring.ranked_value(c.metrics, 'request_throughput_rps'))} req/s it served.", ""]


def _has_prefix_hits(candidates: Any) -> bool:
    """Whether any candidate served input from its prefix cache (the column is shown only then)."""
    return any((c.metrics.get("prefix_cache_reused_ratio") or 0) > 0 for c in candidates)


def _prefix_hit(c: Any, shown: bool) -> list[str]:
    """The prefix-cache hit rate cell (its header for c None): input tokens served from the prefix cache
    over all input tokens of the replay, where the KV router's worth shows."""
    if not shown:
        return []
    return ["prefix hit"] if c is None else [_pct(c.metrics.get("prefix_cache_reused_ratio"))]


def _range(v: float | None, band: tuple[float, float] | None) -> str:
    if v is None or band is None:
        return "–"
    return f"{_num(v)} [{_num(band[0])}–{_num(band[1])}]"


def _bands(c: Any, target: str) -> list[str]:
    """Calibrated mean TTFT, mean TPOT and the goal value, each with its P10-P90 band."""
    scalar = target != Target.PARETO
    goal = goal_value(c, target) if scalar else None
    b = candidate_bands(c, target)
    return [_range(c.metrics.get("calibrated_mean_ttft_ms"), b.get("ttft_ms")),
            _range(c.metrics.get("calibrated_mean_tpot_ms"), b.get("tpot_ms")),
            _range(goal, b.get("goal")) if scalar else "–"]


BAND_HEADER = ["TTFT ms (cal.) [P10–P90]", "TPOT ms (cal.) [P10–P90]", "goal [P10–P90]"]
BAND_NOTE = ("TTFT/TPOT (cal.): the replayed means corrected by the calibration profile (evaluation.calibration), "
             "with the P10–P90 of calibration residuals for the candidate's (system, backend) slice, widened for "
             "few rows or a fallback (docs/fidelity.md; measured by bench/bench_fidelity.py, "
             "bench/results/fidelity_*.json); – when calibration is off.")

QUALITY_HEADER = ["SLA met [pess.]", "p90 TTFT ms", "p90 ITL ms", "router spread"]
QUALITY_NOTE = ("SLA met: share of the window's requests within goal.sla, at calibrated latencies when a profile "
                "is on, then [at the pessimistic end of the bands] (– without an SLA); p90 TTFT / ITL: calibrated "
                "when a profile is on; notes: what the rank does not say (Glossary below); router spread: "
                "std of output throughput over the KV-router repeats, as % of the mean (– for one replay). "
                "tok/s/user is the replay's mean over requests of each request's own output speed "
                "(`mean_output_token_throughput_per_user`), not 1/TPOT.")
FIDELITY_CLAIM = ("Numbers are from Dynamo Replay (simulation) with aiconfigurator-core step timings; they are "
                  "estimates, not measurements. The P10–P90 bands are the spread of the calibration profile's "
                  "leave-one-model-out residuals on its calibration models, not a guarantee for this model. How far numbers and bands are from "
                  "real GPUs, on models the profile never saw, is measured by `bench/bench_fidelity.py` against "
                  "aiconfigurator-core's silicon measurements (docs/fidelity.md, \"Current state\").")


def _fidelity_lines(ranked: list[tuple[Any, Any]]) -> list[str]:
    """Substitute perf data behind any shown (rank, candidate), with the ranks it applies to (never silent)."""
    notes: dict[str, list[str]] = {}
    for rank, c in ranked:
        note = c.config.get("fidelity_note")
        if note:
            notes.setdefault(str(note), []).append(str(rank))
    if not notes:
        return []
    return ["## Fidelity notes", "", *[f"- ranks {', '.join(r)}: {n}" for n, r in notes.items()], ""]


def _sla_answer(c: Any, goal_summary: Mapping[str, Any]) -> str:
    """The SLA question for one candidate: share of requests within it, p90 TTFT and ITL (replayed)."""
    sla = {k: v for k, v in dict(goal_summary.get("sla") or {}).items() if v is not None}
    m = c.metrics
    tails = f"p90 TTFT {_num(m.get('p90_ttft_ms'))} ms, p90 ITL {_num(m.get('p90_itl_ms'))} ms"
    if m.get("calibrated_p90_ttft_ms") is not None:
        tails += (f" (calibrated: {_num(m.get('calibrated_p90_ttft_ms'))} ms, "
                  f"{_num(m.get('calibrated_p90_itl_ms'))} ms)")
    if not sla:
        return f"Latency: {tails} (no goal.sla set, so no share of requests within an SLA)."
    limits = ", ".join(f"{k.removesuffix('_ms')} <= {v:g} ms" for k, v in sla.items())
    good, counted = scoring.sla_good_requests(m), m.get("window_counted_requests", m.get("completed_requests"))
    counts = f" ({_num(good)} of {_num(counted)})" if good is not None and counted is not None else ""
    others = [f"{name} {_pct(sla_attainment(c, basis))}" for name, basis in
              (("replayed", "raw"), ("pessimistic band", "pessimistic")) if sla_attainment(c, basis) is not None]
    return (f"SLA ({limits}): {_pct(sla_attainment(c))}{counts} of the window's requests met it"
            + (f" ({', '.join(others)})" if others else "") + f"; {tails}.")


def _ranked_on(c: Any, target: str, objectives: Any) -> str:
    """Which numbers ranked the picks (search/scoring.ranked_value)."""
    if scoring.ranked_on(c.metrics, target, objectives or None) == "calibrated":
        return ("Ranked on **calibrated** numbers: the goal value, the SLA gate and goodput use the replay "
                "corrected by the calibration profile (`evaluation.calibration`, docs/fidelity.md); the raw "
                "replayed values stay beside them in the ledger and candidates.csv (keys without `calibrated_`).")
    return "Ranked on **raw** replayed numbers (`evaluation.calibration: none`)."


def _seconds(ledger: pd.DataFrame, col: str) -> dict[str, float]:
    if col not in ledger.columns or ledger.empty:
        return {}
    per = ledger.groupby("branch", sort=False)[col].sum(min_count=1).fillna(0.0)
    return {str(b): float(s) for b, s in per.items()}


def render_report(
    merge: MergeResult,
    ledger: pd.DataFrame,
    *,
    goal_summary: Mapping[str, Any],
    workload_summary: Mapping[str, Any],
    timings: Mapping[str, Any],
    files: Mapping[str, str] | None = None,
    branch_notes: Mapping[str, str] | None = None,
    heldout_check: Mapping[str, Any] | None = None,
) -> str:
    """report.md. heldout_check: the recorded held-out check of the numbers ranked on
    (fidelity/profile.heldout_check; None: none recorded)."""
    lines = ["# Spica sweep report", ""]
    answer = verdict.headline(merge)
    if answer:
        lines += ["## Answer", "", *answer, ""]
    lines += ["## Goal", *_kv_lines(goal_summary), "", "## Workload", *_kv_lines(workload_summary), ""]

    lines += ["## Outcomes", ""]
    total = sum(merge.counts.values())
    lines += _table(["outcome", "trials"], [[k, v] for k, v in merge.counts.items() if v or k == "feasible"]
                    + [["**total**", total]])
    lines += ["", f"- unique feasible candidates: {len(merge.feasible)}",
              f"- duplicates (cache hits and repeated specs, not replayed again): {merge.duplicates}"]
    if merge.over_budget:
        lines.append(f"- feasible but over the GPU budget, dropped: {merge.over_budget}")
    for b in merge.branches:
        how = "enumerated exhaustively" if b in merge.exhaustive_branches else "searched by Vizier"
        note = (branch_notes or {}).get(b)
        lines.append(f"- branch `{b}`: {how}" + (f" ({note})" if note else ""))
    if merge.failure_reasons:
        lines += ["", "Top failure reasons:", *[f"- {s}" for s in merge.failure_summary(3)]]
    lines += ["", f"`{merge.summary_line()}`", ""]

    rec = merge.recommendation
    if merge.is_pareto and rec is not None:
        lines += ["## Best configuration (recommended point of the front)", ""]
    else:
        lines += ["## Best configuration", ""]
    best = merge.best
    if best is None:
        lines += ["No feasible candidate (check backends, SLA, gpu_budget and the failure reasons above).", ""]
    else:
        lines += [describe_candidate(best, merge.target, merge.objectives), "", _sla_answer(best, goal_summary), "",
                  _ranked_on(best, merge.target, merge.objectives), "", *_cost_line(best, merge)]
        if merge.is_pareto and rec is not None:
            lines += [f"Picked by the rule **{rec[1]}**; it is rank 1 (`deploy/1/`). A front has no single "
                      "best point: every point below trades one objective for another.", ""]
        if merge.load_target and "fleet_gpus" in best.metrics:
            kind, load = next(iter(merge.load_target.items()))
            unit = "req/s" if kind == "request_rate" else "requests in flight"
            lines += [f"Smallest fleet for {kind} {load:g} within the SLA: **{int(best.metrics['fleet_gpus'])} GPUs** = "
                      f"{int(best.metrics['fleet_replicas'])} replicas of this {best.used_gpus}-GPU deployment, each "
                      f"carrying {_num(best.metrics['replica_capacity'])} {unit} in replay.", ""]
            if merge.unservable:
                lines += [f"{merge.unservable} feasible candidate(s) carried no load in replay and were left out.", ""]
        if best.spread:
            lines.append("Router repeats spread: " + ", ".join(
                f"{m} std {_num(s.get('std'))}" for m, s in sorted(best.spread.items())
                if m in ("output_throughput_tok_s", "mean_ttft_ms", "p90_ttft_ms", "p90_itl_ms")))
            lines.append("")

    if merge.is_pareto:
        lines += [f"## Pareto front (all {len(merge.candidates)} non-dominated points, ascending by "
                  f"{merge.objectives[-1]})", ""]
        rows = []
        hits = _has_prefix_hits(merge.candidates)
        for c in merge.candidates:
            rank = merge.rank_of(c)
            mark = " ★" if rec is not None and c is rec[0] else ""
            rows.append([f"{rank}{mark}", c.branch, *[_num((c.objectives or {}).get(o)) for o in merge.objectives],
                         c.used_gpus, *_load_cells(c, merge), *_quality(c), *_prefix_hit(c, hits),
                         *_bands(c, merge.target)[:2], "; ".join(verdict.marks(c, merge)) or "–",
                         describe_candidate(c, merge.target, with_value=False)])
        lines += _table(["rank", "branch", *merge.objectives, "GPUs", *_load_header(merge),
                         *_quality_header(merge.candidates),
                         *_prefix_hit(None, hits), *BAND_HEADER[:2], "notes", "configuration"], rows)
        lines += ["", "rank = `deploy/<rank>/`; ★ = the recommended point. " + QUALITY_NOTE + " " + BAND_NOTE]
        lines += ["", f"Hypervolume: {merge.hypervolume:.6g} (reference point {tuple(round(r, 6) for r in merge.reference or ())};"
                  " origin for maximised objectives, 1.1 x worst observed for minimised ones)", ""]
    else:
        lines += [f"## Ranked candidates (top {min(TOP_RANKED, len(merge.candidates))} of {len(merge.candidates)})", ""]
        rows = []
        fleet = merge.target == "min_gpus" and any("fleet_gpus" in c.metrics for c in merge.candidates)
        hits = _has_prefix_hits(merge.candidates[:TOP_RANKED])
        for i, c in enumerate(merge.candidates[:TOP_RANKED], 1):
            per_user, per_gpu = plot_axes(c)
            extra = [_num(c.metrics.get("fleet_gpus"))] if fleet else []
            rows.append([i, c.branch, fmt_value(goal_value(c, merge.target), merge.target), c.used_gpus, *extra,
                         _num(per_gpu), _num(per_user), *_load_cells(c, merge), *_quality(c), *_prefix_hit(c, hits),
                         *_bands(c, merge.target), "; ".join(verdict.marks(c, merge)) or "–",
                         describe_candidate(c, merge.target, with_value=False)])
        lines += _table(["#", "branch", merge.target, "GPUs", *(["fleet GPUs"] if fleet else []), "tok/s/GPU",
                         "tok/s/user", *_load_header(merge), *_quality_header(merge.candidates[:TOP_RANKED]),
                         *_prefix_hit(None, hits), *BAND_HEADER,
                         "notes", "configuration"], rows)
        lines += ["", "# = `deploy/<rank>/`. " + QUALITY_NOTE + " " + BAND_NOTE, ""]

    shown = merge.candidates if merge.is_pareto else merge.candidates[:TOP_RANKED]
    if merge.is_pareto:
        lines += _fidelity_lines([(merge.rank_of(c), c) for c in merge.candidates])
    else:
        lines += _fidelity_lines(list(enumerate(shown, 1)))
    if best is not None:
        calibrated = scoring.ranked_on(best.metrics, merge.target, merge.objectives or None) == "calibrated"
        lines += accuracy.report_lines(heldout_check, (c.config.get("backend") for c in shown), calibrated,
                                       models=(c.config.get("model_name") for c in shown),
                                       picks=[(merge.rank_of(c) if merge.is_pareto else i, c)
                                              for i, c in enumerate(shown, 1)])

    lines += ["## Glossary", "", *verdict.glossary(merge), ""]
    lines += ["## Time", ""]
    opt, rep = _seconds(ledger, "optimizer_seconds"), _seconds(ledger, "replay_seconds")
    rows = [[b, f"{opt.get(b, 0.0):.1f}", f"{rep.get(b, 0.0):.1f}"] for b in merge.branches]
    rows.append(["**all**", f"{sum(opt.values()):.1f}", f"{sum(rep.values()):.1f}"])
    lines += _table(["branch", "optimizer s", "replay s"], rows)
    if timings:
        lines += ["", *_kv_lines({k: (f"{v:.1f}" if isinstance(v, float) else v) for k, v in timings.items()})]
    lines.append("")
    if files:
        lines += ["## Files", "", *[f"- `{name}`: {path}" for name, path in files.items()], ""]
    lines.append(FIDELITY_CLAIM)
    return "\n".join(lines) + "\n"

