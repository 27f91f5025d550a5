"""What a user reads first, on the console and at the top of report.md alike: whether the picks carry the
offered load and meet goal.sla, in plain sentences, with what would carry or meet it when nothing does; the
marks on each ranked entry; and the glossary that names every number the report shows."""

import math
from typing import Any, Sequence

from spica_pipeline.evaluate import scoring
from spica_pipeline.evaluate.scoring import Candidate
from spica_pipeline.fidelity.measurement import LOAD_MEASURES, THROUGHPUT_DEFINITION
from spica_pipeline.report.merge import TWIN_RULE, MergeResult
from spica_pipeline.report.tables import describe_candidate

SLA_NAMES = {"ttft_ms": ("TTFT", "p90_ttft_ms"), "itl_ms": ("ITL", "p90_itl_ms"),
             "e2e_ms": ("E2E", "p90_e2e_latency_ms")}
NO_SLA = "No configuration met the SLA"


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100.0 * v:.0f} %"


def _rate(v: float | None) -> str:
    return "–" if v is None else f"{v:.3g} req/s"


def limits_text(sla: Any) -> str:
    """'TTFT <= 600 ms, ITL <= 30 ms' for goal.sla's set thresholds."""
    return ", ".join(f"{SLA_NAMES.get(k, (k, ''))[0]} <= {float(v):g} ms" for k, v in dict(sla or {}).items()
                     if v is not None)


def served(c: Candidate) -> float | None:
    """The request rate a candidate served (the window's, THROUGHPUT_DEFINITION)."""
    return scoring.ranked_value(c.metrics, "request_throughput_rps")


def carry_fleet(c: Candidate) -> str | None:
    """'2 copies (4 GPUs)': the fleet of this deployment that would carry its offered load."""
    n = scoring.replicas_to_carry(c.metrics)
    return None if n is None else f"{n} copies ({n * c.used_gpus} GPUs)"


def settled(c: Candidate) -> str:
    """'99 %': the share of arrivals served in the settled second half of the window."""
    return _pct(c.metrics.get("settled_served_share"))


def why_not_carried(c: Candidate) -> str:
    """Which half of the carry rule failed: too few requests served, or requests in flight still growing."""
    share = c.metrics.get("settled_served_share")
    if share is not None and share < scoring.CARRY_SHARE:
        return f"served {settled(c)} of the arrivals in the window's settled half"
    growth, offered = c.metrics.get("settled_queue_growth_rps"), c.metrics.get("offered_request_rate_rps")
    grew = f" ({100.0 * growth / offered:.0f} % of the offered rate)" if growth and offered else ""
    return f"its requests in flight were still growing in the window's settled half{grew}"


def _filling(c: Candidate) -> bool:
    """A candidate whose requests last over a quarter of its window may still be filling up when the replay
    ends, rather than falling behind: a longer replay tells the two apart."""
    e2e = c.metrics.get("mean_e2e_latency_ms")  # the replay's own timeline, not the calibrated one
    start, end = c.metrics.get("window_start_ms"), c.metrics.get("window_end_ms")
    return e2e is not None and start is not None and end is not None and e2e > 0.25 * (end - start)


def marks(c: Candidate, merge: MergeResult) -> list[str]:
    """Why an entry is not (only) what its score says: the offered load it does not carry, the SLA share
    it misses, the equivalent settings it stands for."""
    out = []
    if merge.carries(c) is False:
        fleet = carry_fleet(c)
        out.append(f"does not carry {merge.offered}: {why_not_carried(c)}; served {_rate(served(c))} over the window"
                   + (f"; {fleet} would carry it" if fleet else ""))
    if merge.meets_sla(c) is False:
        out.append(f"SLA met by {_pct(scoring.sla_attainment(c.metrics))} of requests "
                   f"(needs {_pct(merge.sla_required)})")
    if c.twins:
        out.append(f"+{len(c.twins)} equivalent setting{'s' if len(c.twins) > 1 else ''}")
    return out


def _load_lines(merge: MergeResult) -> list[str]:
    cands = merge.candidates
    if merge.offered is None or not cands:
        return []
    judged = [c for c in cands if merge.carries(c) is not None]
    short = [c for c in judged if merge.carries(c) is False]
    if not judged:
        return []
    top = cands[0]
    if len(short) == len(judged):
        closest = max(short, key=lambda c: served(c) or 0.0)
        fleet = carry_fleet(closest)
        return [f"No configuration carried the offered load ({merge.offered}) in steady state. Closest: "
                f"{describe_candidate(closest, merge.target, merge.objectives)}, which served "
                f"{_rate(served(closest))} of {_rate(closest.metrics.get('offered_request_rate_rps'))} offered"
                + (f"; {fleet} of it would carry the load." if fleet else ".")]
    lines = []
    if merge.carries(top):
        lines.append(f"Rank 1 carries the offered load ({merge.offered}): in the window's settled second half it "
                     f"served {settled(top)} of the requests arriving ({_rate(served(top))} of "
                     f"{_rate(top.metrics.get('offered_request_rate_rps'))} over the whole window, its fill-up "
                     "included).")
    if short:
        where = ("they rank after every configuration that carries it" if merge.offered_required
                 else "they are marked in place (goal.offered_load: report)")
        lines.append(f"{len(short)} of {len(cands)} distinct configurations do not carry it; {where}.")
        best = min(short, key=lambda c: (-c.score, c.used_gpus))
        if not merge.is_pareto and best.score > top.score:
            fleet = carry_fleet(best)
            lines.append(f"The best of them by {merge.target}, "
                         f"{describe_candidate(best, merge.target, merge.objectives)}: {why_not_carried(best)}; "
                         f"it served {_rate(served(best))}" + (f"; {fleet} of it would carry the load." if fleet else "."))
        filling = [c for c in short if _filling(c) and c.metrics.get("settled_served_share", 0.0) >= scoring.CARRY_SHARE]
        if filling:
            lines.append(f"{len(filling)} of them served their arrivals but their requests in flight still grew, and "
                         "their requests last over a quarter of the window: they may have been filling up rather "
                         "than falling behind when the replay ended; a longer replay (workload.num_request_ratio) "
                         "tells the two apart.")
    return lines


def _gpu_trend(merge: MergeResult) -> str | None:
    """'2 GPUs: 0 %, 4 GPUs: 12 %, 8 GPUs: 62 %': the best attainment at each GPU count evaluated."""
    best: dict[int, float] = {}
    for c in merge.feasible:
        got = scoring.sla_attainment(c.metrics)
        if got is not None:
            best[c.used_gpus] = max(best.get(c.used_gpus, 0.0), got)
    if len(best) < 2:
        return None
    return ", ".join(f"{g} GPUs: {_pct(v)}" for g, v in sorted(best.items()))


def _would_meet(merge: MergeResult, closest: Candidate) -> list[str]:
    """What would meet the SLA: limits near the closest candidate's calibrated p90s, and more GPUs when the
    share within the SLA grows with them."""
    out = []
    looser = []
    for key, limit in (merge.sla or {}).items():
        name, p90_key = SLA_NAMES.get(key, (key, None))
        p90 = scoring.ranked_value(closest.metrics, p90_key) if p90_key else None
        if p90 is not None and limit is not None and p90 > float(limit):
            looser.append(f"{name} <= {math.ceil(p90):g} ms (now {float(limit):g})")
    if looser:
        out.append("a looser SLA near the closest configuration's calibrated p90s: " + ", ".join(looser))
    trend = _gpu_trend(merge)
    if trend:
        out.append(f"more GPUs, if the share grows with them (best share by GPUs: {trend})")
    return out


def _sla_lines(merge: MergeResult) -> list[str]:
    cands = merge.candidates
    if merge.sla_required is None or not cands:
        return []
    judged = [c for c in cands if merge.meets_sla(c) is not None]
    if not judged:
        return []
    need = f"{limits_text(merge.sla)} for >= {_pct(merge.sla_required)} of requests"
    if not any(merge.meets_sla(c) for c in judged):
        closest = max(judged, key=lambda c: scoring.sla_attainment(c.metrics) or 0.0)
        pess = scoring.sla_attainment(closest.metrics, "pessimistic")
        lines = [f"{NO_SLA} ({need}). Closest: {describe_candidate(closest, merge.target, merge.objectives)}, "
                 f"with {_pct(scoring.sla_attainment(closest.metrics))} of requests within it"
                 + (f" ({_pct(pess)} at the pessimistic end of its bands)." if pess is not None else ".")]
        would = _would_meet(merge, closest)
        if would:
            lines.append("What would meet it: " + "; ".join(would) + ".")
        return lines
    top = cands[0]
    if merge.meets_sla(top):
        pess = scoring.sla_attainment(top.metrics, "pessimistic")
        return [f"Rank 1 meets the SLA ({need}): {_pct(scoring.sla_attainment(top.metrics))} of its requests"
                + (f", {_pct(pess)} at the pessimistic end of its bands." if pess is not None else ".")]
    return []


def headline(merge: MergeResult) -> list[str]:
    """The plain sentences on offered load and SLA, in that order; empty when neither applies."""
    return [*_load_lines(merge), *_sla_lines(merge)]


def sla_unmet(merge: MergeResult) -> bool:
    """goal.sla is set, some candidate has an SLA count, and none serves the required share within it."""
    if merge.sla_required is None:
        return False
    judged = [merge.meets_sla(c) for c in merge.candidates]
    return any(m is not None for m in judged) and not any(judged)


def glossary(merge: MergeResult) -> list[str]:
    """report.md's glossary: what every number of the tables means and which numbers picks rank on."""
    lines = [
        f"- **Throughput** (tok/s, req/s, tok/s/GPU): {THROUGHPUT_DEFINITION}.",
        "- **TTFT / TPOT**: time to first token and the per-request mean time between output tokens "
        "(goal.sla's itl_ms, also accepted as tpot_ms). *Replayed*: the replay's mean (or p90) over the window's "
        "requests; *(cal.)*: the same corrected by the calibration profile, with its P10–P90 band. Picks rank "
        "and are judged on the calibrated values when a profile is on; the raw ones stay in candidates.csv.",
        f"- **Offered load** ({merge.offered or 'closed loop: none'}): {LOAD_MEASURES}. A configuration carries "
        f"it when {scoring.CARRY_RULE}; one that does not is marked with the copies of it that would (ceil of "
        "offered over served request rate).",
        "- **SLA met**: the share of the window's requests within goal.sla (TTFT and the request's mean ITL, or "
        "E2E): *cal.* at calibrated latencies (what picks are judged on, against goal.sla_attainment), *raw* at "
        "the replayed ones, *pess.* with TTFT and ITL at the top of their P10–P90 bands. candidates.csv has the "
        "count it is out of (sla_good_requests / window_counted_requests).",
        f"- **Equivalent settings**: {TWIN_RULE}.",
    ]
    if merge.gpu_price is not None:
        priced = (f"at {merge.gpu_price:g} USD per GPU-hour" if not merge.gpu_prices else  # roles on two GPU types
                  "each at its GPU type's USD per GPU-hour (" + ", ".join(f"{s} {p:g}" for s, p in merge.gpu_prices.items())
                  + "; a deployment's price is the mean over its GPUs)")
        lines.append(f"- **Cost**: the deployment's GPUs {priced} (goal.gpu_prices, else "
                     "the default table in config/goal.py): USD/h; USD per million output tokens (cost_per_mtok) "
                     "and per thousand requests at the throughputs above.")
    return lines


def rank_marks(ranked: Sequence[Candidate], merge: MergeResult) -> list[str]:
    """'; '-joined marks per ranked entry (the report's notes column)."""
    return ["; ".join(marks(c, merge)) for c in ranked]
