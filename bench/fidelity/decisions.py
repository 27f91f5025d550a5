"""Decision fidelity: does the configuration picked on predicted numbers hold up on silicon?

A group of rows answers one deployment question: same model, system, backend, ISL and OSL. Its options are
the distinct configurations among them (precision, mode, parallel shape, concurrency; repeated measurements of one
configuration are one option at their geometric mean). The question: the highest output throughput per GPU,
concurrency x OSL / (TTFT + (OSL - 1) x TPOT) / GPUs, among the options whose mean TPOT is within the SLA, the
SLA being the median measured TPOT of the group's options. For each way of predicting (the raw sweep replay, the
raw client replay, the calibrated value, AIC's estimate, a profile from 3 of the model's own measurements):

* the pick is the option with the highest predicted throughput per GPU among those predicted within the SLA (no
  pick when none is); the "SLA at the band's P90" variants test the SLA on the top of the calibrated TPOT's
  P10-P90 band instead of its value, a pick that keeps a margin where the profile says its error is;
* "within 5 %": the pick meets the SLA on silicon and its measured throughput per GPU is within 5 % of the best
  option that meets it on silicon;
* "SLA broken": the pick's measured TPOT is above the SLA.

Groups with fewer than 2 options ask nothing and are left out. With own measurements (fidelity/own.py), the
question is asked within one benchmark campaign: the group's rows of its largest campaign, less the rows drawn as
the own measurements (OWN_K of the campaign's rows, OWN_DRAWS seeded draws), with at least 2 options left; the
other predictions are scored on exactly those questions too ("same_questions").
"""

import copy
import json
import math
import random
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from fidelity.scores import apply_profile, error_stats

from spica_pipeline.fidelity.own import OWN_DRAWS, OWN_KS, OWN_SEED, campaigns_of, fit_own, own_band, own_draws
from spica_pipeline.fidelity.profile import PHASES

WITHIN = 0.05
OWN_K = 3
Predict = Callable[[Mapping[str, Any]], Mapping[str, Any] | None]


def _at_band_top(r: Mapping[str, Any]) -> Mapping[str, Any] | None:
    cal, band = r.get("calibrated"), (r.get("band") or {}).get("tpot")
    return {**cal, "tpot_sla": band["hi"]} if cal and band else None


PREDICTIONS: dict[str, Predict] = {
    "raw sweep replay": lambda r: r.get("sweep"),
    "raw client replay": lambda r: r.get("ours"),
    "calibrated": lambda r: r.get("calibrated"),
    "calibrated, SLA at the band's P90": _at_band_top,
    "aic": lambda r: r.get("aic"),
}


# ---- campaigns ---------------------------------------------------------------------------------------

def source_file(source: str) -> str:
    """The silicon row's source file: `source_file=...` in its source column, else the column's first field (the
    database dumps name no file: `db-dump/<date>`)."""
    found = re.search(r"source_file=([^;]*)", source or "")
    return (found.group(1) if found else (source or "").split(";")[0]).strip()


def attach_campaigns(records: Iterable[dict[str, Any]], sources: Mapping[str, str]) -> None:
    """Each record's "campaign": one source file and one engine version of one (model, precision, system,
    backend, mode) (in place; records whose row has no source keep none)."""
    for r in records:
        if r["id"] in sources:
            r["campaign"] = "|".join(str(r.get(k) or "") for k in ("model", "precision", "system", "backend", "mode",
                                                                   "silicon_backend_version")) \
                + "|" + source_file(sources[r["id"]])


# ---- one question ----------------------------------------------------------------------------------------

def _gpus(record: Mapping[str, Any]) -> int:
    return sum(int(s.get("tp") or 1) * int(s.get("pp") or 1) * int(s.get("attention_dp") or 1)
               * int(s.get("workers") or 1) for s in (record.get("shape") or {}).values()) or 1


def _configuration(record: Mapping[str, Any]) -> str:
    shape = {pool: {k: v for k, v in (s or {}).items() if k != "max_num_seqs"}
             for pool, s in (record.get("shape") or {}).items()}
    return json.dumps([record.get("precision"), record.get("mode"), shape, record.get("concurrency")], sort_keys=True)


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _throughput_per_gpu(ttft: float, tpot: float, record: Mapping[str, Any]) -> float:
    osl = float(record.get("osl") or 1)
    return float(record.get("concurrency") or 1) * osl * 1000.0 / (ttft + (osl - 1) * tpot) / _gpus(record)


def options(rows: Sequence[Mapping[str, Any]], predict: Predict) -> list[dict[str, Any]]:
    """The distinct configurations of the rows: {measured: (tput/GPU, TPOT), predicted: (tput/GPU, the TPOT the SLA
    is tested on) or None}."""
    by: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        by[_configuration(r)].append(r)
    out = []
    for key in sorted(by):
        members = by[key]
        silicon = [(r["silicon"]["ttft"], r["silicon"]["tpot"]) for r in members]
        seen = [predict(r) or {} for r in members]
        pairs = [(p.get("ttft"), p.get("tpot")) for p in seen]
        complete = all(t and d and t > 0 and d > 0 for t, d in pairs)
        sla_tpot = [p.get("tpot_sla", p.get("tpot")) for p in seen]
        m_ttft, m_tpot = _geomean([s[0] for s in silicon]), _geomean([s[1] for s in silicon])
        opt: dict[str, Any] = {"measured": (_throughput_per_gpu(m_ttft, m_tpot, members[0]), m_tpot), "predicted": None}
        if complete:
            p_ttft, p_tpot = _geomean([float(t) for t, _ in pairs]), _geomean([float(d) for _, d in pairs])
            opt["predicted"] = (_throughput_per_gpu(p_ttft, p_tpot, members[0]), _geomean([float(d) for d in sla_tpot]))
        out.append(opt)
    return out


def decide(opts: list[dict[str, Any]]) -> dict[str, Any] | None:
    """One question's outcome: {within, broken, picked} (None: fewer than 2 options, or an option without a
    prediction)."""
    if len(opts) < 2 or any(o["predicted"] is None for o in opts):
        return None
    tpots = sorted(o["measured"][1] for o in opts)
    mid = len(tpots) // 2
    sla = tpots[mid] if len(tpots) % 2 else 0.5 * (tpots[mid - 1] + tpots[mid])
    best = max(o["measured"][0] for o in opts if o["measured"][1] <= sla)
    feasible = [o for o in opts if o["predicted"][1] <= sla]
    if not feasible:
        return {"within": False, "broken": False, "picked": False}
    pick = max(feasible, key=lambda o: o["predicted"][0])
    meets = pick["measured"][1] <= sla
    return {"within": meets and pick["measured"][0] >= (1 - WITHIN) * best, "broken": not meets, "picked": True}


def _shares(outcomes: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Per question its outcomes' shares (several draws of one question count as one question), then the mean."""
    kept = [o for o in outcomes if o]
    if not kept:
        return {"questions": 0, "within_5pct": None, "sla_broken": None, "no_pick": None}

    def mean(flag: str) -> float:
        return round(sum(sum(x[flag] for x in o) / len(o) for o in kept) / len(kept), 4)
    return {"questions": len(kept), "within_5pct": mean("within"), "sla_broken": mean("broken"),
            "no_pick": round(1 - mean("picked"), 4)}


def groups(records: Iterable[Mapping[str, Any]]) -> dict[tuple, list[Mapping[str, Any]]]:
    by: dict[tuple, list[Mapping[str, Any]]] = defaultdict(list)
    for r in records:
        if r.get("status") == "feasible" and (r.get("silicon") or {}).get("tpot"):
            by[tuple(r.get(k) for k in ("model", "system", "backend", "isl", "osl"))].append(r)
    return dict(by)


def decisions(records: list[dict[str, Any]], base: Mapping[str, Any] | None) -> dict[str, Any]:
    """The shares for every prediction on the split's questions, and with OWN_K own measurements (on `base`)
    beside the others on the same within-campaign questions. Records already carry their calibrated values."""
    by_group = groups(records)
    out: dict[str, Any] = {"questions_asked": sum(1 for g in by_group.values() if len({_configuration(r) for r in g}) > 1),
                           "rule": f"max output tok/s/GPU within the SLA = the group's median measured TPOT; within "
                                   f"{WITHIN:.0%} of the measured best and meeting the SLA on silicon",
                           "by_prediction": {}}
    for name, predict in PREDICTIONS.items():
        out["by_prediction"][name] = _shares([[d] if (d := decide(options(g, predict))) else []
                                             for _, g in sorted(by_group.items(), key=lambda kv: str(kv[0]))])
    if base is not None:
        out["same_questions"] = own_questions(records, by_group, base)
    return out


def own_questions(records: list[dict[str, Any]], by_group: Mapping[tuple, list[Mapping[str, Any]]],
                  base: Mapping[str, Any]) -> dict[str, Any]:
    """Each group's question within its largest campaign, for OWN_DRAWS seeded draws of OWN_K own rows from that
    campaign: the own profile's pick and every other prediction's on the campaign's other rows."""
    campaigns = campaigns_of(records)
    rng = random.Random(OWN_SEED)
    outcomes: dict[str, list[list[dict[str, Any]]]] = defaultdict(list)
    for _, rows in sorted(by_group.items(), key=lambda kv: str(kv[0])):
        sizes: dict[str, int] = defaultdict(int)
        for r in rows:
            if r.get("campaign"):
                sizes[str(r["campaign"])] += 1
        if not sizes:
            continue
        campaign = max(sorted(sizes), key=lambda c: sizes[c])
        pool = [r for r in campaigns[campaign] if r.get("status") == "feasible"]
        if len(pool) <= OWN_K:
            continue
        per: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for _ in range(OWN_DRAWS):
            drawn = rng.sample(range(len(pool)), OWN_K)
            ids = {pool[i]["id"] for i in drawn}
            judged = [copy.deepcopy(r) for r in rows if r.get("campaign") == campaign and r["id"] not in ids]
            own = fit_own([pool[i] for i in drawn], base=base, fitted="bench", source="bench")
            own_judged = copy.deepcopy(judged)
            apply_profile(own_judged, own)
            own_predictions = {f"own {OWN_K}": PREDICTIONS["calibrated"],
                               f"own {OWN_K}, SLA at the band's P90": _at_band_top}
            for name, predict in {**PREDICTIONS, **own_predictions}.items():
                d = decide(options(own_judged if name.startswith("own") else judged, predict))
                if d:
                    per[name].append(d)
        for name, d in per.items():
            outcomes[name].append(d)
    return {name: _shares(o) for name, o in outcomes.items()}


# ---- errors with own measurements -------------------------------------------------------------------------

def own_errors(records: list[dict[str, Any]], base: Mapping[str, Any]) -> dict[str, Any]:
    """For k in OWN_KS: MdAPE / P90 / bias of an own profile from k rows of a campaign, judged on the campaign's
    other rows (OWN_DRAWS seeded draws per campaign, pooled), and how often the base's own band for k held."""
    by_campaign = campaigns_of([r for r in records if r.get("status") == "feasible"])
    out: dict[str, Any] = {"campaigns": len(by_campaign)}
    for k in OWN_KS:
        entry: dict[str, Any] = {}
        for phase in PHASES:
            held = own_draws(by_campaign, k, base, phase)
            band = own_band(base, k, phase)
            entry[phase] = {**error_stats([(math.exp(-x), 1.0) for _, x in held]),
                            "campaigns": len({r["campaign"] for r, _ in held}),
                            "band_coverage": round(sum(band[0] <= x <= band[1] for _, x in held) / len(held), 4)
                            if band and held else None}
        out[str(k)] = entry
    return out

