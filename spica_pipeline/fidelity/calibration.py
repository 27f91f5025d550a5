"""Calibration profiles and error bands: the replay's TTFT/TPOT against real GPU measurements.

Method (fitted by `bench/bench_fidelity.py --fit-calibration`, calibration split only; the variant
is a `Method`, chosen between candidates only by leave-one-model-out error on the calibration split,
`bench_fidelity.py --compare-methods`):

* A row's residual is r = ln(silicon / replayed) for its mean TTFT and mean TPOT.
* Residuals trend with load (what a steady-state step model misses is queueing and burstiness in
  real clients), so each phase first gets one load slope b: the Theil-Sen (median pairwise) slope
  of r over x = log2(concurrency per engine), fitted on all calibration rows of that phase.
  Optionally a second Theil-Sen slope on another feature (log2 ISL / OSL) of the detrended residuals.
* Then one multiplicative offset per (system, backend, phase): m = median over models of per-model
  medians of r - b x, shrunk towards its parent (backend, phase), itself shrunk towards (phase):
  m = (n x median + K x parent) / (n + K), K = 3, n = models in the slice.
* The correction applied is exp(m + s b x): the offsets are anchored at one request per engine and
  the applied load slope is s x the fitted one (s <= 1 shrinks it: the pooled slope mixes
  between-model differences into the load trend). Format 1 profiles (replay-v1/v2) applied
  exp(m) c^b = exp(m + ln2 b x), i.e. s = ln 2 without saying so; format 2 records s.
  Why this and not a richer regression: log-linear ridge/Huber fits on load, ISL, OSL, mode,
  backend, system class, MoE and precision, and an additive queueing-wait model, all lost to it
  in leave-one-model-out error on the calibration split (docs/fidelity.md): with six calibration
  models, model-level features overfit; medians are robust to rows where the replay is far off,
  and shrinkage keeps a slice with two rows from swinging. Nothing is fitted per model, so
  held-out models are scored by factors they never influenced.
* A band is the P10-P90 of the calibrated residuals ln(silicon / (replayed x factor)) of the
  slice, each row scored by a profile fitted without its own model (leave-one-model-out: the
  profile is used on unseen models), its parent's when the slice has fewer than MIN_BAND_ROWS rows, widened by
  sqrt(1 + K / n) for few rows, and by FALLBACK_WIDEN when the slice had no rows at all.
  It reads: on calibration rows like this one, 80 % of silicon values fell in [value x lo, value x hi].

Pure: fitting works on bench records (dicts), applying on report dicts; files are read elsewhere.
"""

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeGuard

from spica_pipeline.config.goal import GOODPUT_KEY
from spica_pipeline.fidelity.measurement import quantile, sla_token_share

PROFILE_FORMAT = 2  # what fit writes for a method without per-backend overrides
PER_BACKEND_FORMAT = 3  # what fit writes when some (backend, phase) has its own terms and replay basis
# 1: replay-v1/v2 (load slope applied as c^b); 2: explicit terms; 3: 2 + "<backend>/<phase>" keys in
# "terms" and "replay" (replay-v5), which a format-2 reader would silently ignore
MIX_FORMAT = 4  # 2/3 + "client_mix" (round 7: a phase's replayed value between the sweep and the client replay)
OVERHEAD_FORMAT = 5  # 2-4 + "overhead_ms" (round 18: a fixed per-request cost added to the replayed value)
READABLE_FORMATS = (1, 2, 3, 4, 5)
PHASES = ("ttft", "tpot")
SHRINK_K = 3.0
MIN_BAND_ROWS = 5
FALLBACK_WIDEN = 1.5
LOAD = "log2_concurrency_per_engine"
FEATURES = (LOAD, "log2_isl", "log2_osl")
# The replay a phase's correction applies to: "sweep" = the sweep's own measurement (ramped clients,
# steady-state window); "client" = the same candidate replayed as the benchmark client that measured
# the silicon rows (every client at t=0, CLIENT_REQUEST_RATIO x c requests, every request counted;
# fidelity/measurement.py). A sweep runs the client replay only when its profile has a client phase.
REPLAYS = ("sweep", "client")
# rounds 14-15 (bench_fidelity.ROUND15_LOCKSTEP_RULE): a profile's FIXED_LENGTHS entry holds the factors fitted on rows
# whose benchmark client sent exactly the workload's ISL and OSL (evaluation.client_lengths: fixed), replayed so
FIXED_LENGTHS = "fixed_lengths"
# PhaseMethod.overhead: the costs in ms a phase's overhead is chosen from, per backend, by leave-one-model-out score
# on the fit rows (0 first: the pure multiplicative correction); TTFT: per request (round 18), TPOT: per decode step
# (round 19)
OVERHEAD_GRID_MS = {"ttft": (0.0, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 75.0, 100.0, 150.0, 200.0),
                    "tpot": (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0)}
# a phase's score, the distance to issue 14's targets in target units: MdAPE / target + P90 / target (lower is better)
SCORE_TARGETS = {"ttft": (0.20, 0.50), "tpot": (0.10, 0.50)}
# the prefill chunk budget a ClientMix gate counts passes in when the candidate does not say (the replay's
# max_num_batched_tokens in every bench row, bench_fidelity.MNBT)
CHUNK_TOKENS = 8192


@dataclass(frozen=True)
class ClientMix:
    """Round 7: the value a client-basis phase of one backend corrects, between the two replays a sweep runs:
    sweep x (client / sweep)^w, w = `weight` (1: the client replay, 0: the sweep's; None: fitted, the Theil-Sen
    slope of ln(silicon / sweep) on ln(client / sweep) over the training rows, clipped to [0, 1]); with
    `max_passes`, w = 0 where the first wave's prefill passes (concurrency per prefill rank x ISL / chunk
    budget, `prefill_passes`) exceed it: many passes let real clients drift apart (the sweep's regime)."""

    weight: float | None = 1.0
    max_passes: float | None = None
    # round 8: the weight beyond max_passes (0: the sweep's value, round 7's gate; 1: the client replay's)
    above_weight: float = 0.0
    # round 8: the weight where the candidate's attention was timed with its own perf data (no bf16 fallback,
    # attention_fallback); None: `weight` either way. The fallback's slower attention is what the blend damps.
    native_weight: float | None = None

    def label(self) -> str:
        w = "fitted" if self.weight is None else f"{self.weight:g}"
        above = "sweep" if self.above_weight == 0 else f"client^{self.above_weight:g}"
        return (f"client^{w}" + (f" if passes <= {self.max_passes:g} else {above}" if self.max_passes is not None else "")
                + (f" (native attention data: client^{self.native_weight:g})" if self.native_weight is not None else ""))

    def entry(self) -> dict[str, Any]:
        """The profile's client_mix entry (round 8's keys only when set, so earlier profiles refit identically)."""
        out: dict[str, Any] = {"weight": self.weight, "max_passes": self.max_passes, "chunk_tokens": CHUNK_TOKENS}
        if self.above_weight != 0.0:
            out["above_weight"] = self.above_weight
        if self.native_weight is not None:
            out["native_weight"] = self.native_weight
        return out


# how search/perf_data.fallback_note says a candidate's attention was timed with other (bf16) data
FALLBACK_NOTE_MARK = "timed with the nearest available data"


def attention_fallback(fidelity_note: str | None) -> bool:
    """Whether a candidate's fidelity note says its attention was timed with the nearest (bf16) perf data."""
    return FALLBACK_NOTE_MARK in str(fidelity_note or "")


def prefill_passes(concurrency_per_engine: float | None, isl: float | None, attention_dp: float | None = 1,
                   chunk_tokens: float | None = None) -> float | None:
    """Prefill passes the first wave of a closed loop needs on one rank: (c per engine / attention DP) x ISL /
    the chunk budget (None when ISL or the concurrency is unknown)."""
    if not concurrency_per_engine or not isl or concurrency_per_engine <= 0 or isl <= 0:
        return None
    return float(concurrency_per_engine) / max(1.0, float(attention_dp or 1)) * float(isl) / float(
        chunk_tokens or CHUNK_TOKENS)


def mix_weight(mix: Mapping[str, Any], passes: float | None, fallback: bool | None = None) -> float:
    """A profile's client_mix entry's weight on the client replay for a candidate with `passes` first-wave prefill
    passes and, when known, whether its attention was timed with fallback data (unknown: the entry's `weight`)."""
    cap = mix.get("max_passes")
    if cap is not None and passes is not None and passes > cap:
        return float(mix.get("above_weight", 0.0))
    native = mix.get("native_weight")
    return float(native) if native is not None and fallback is False else float(mix["weight"])


@dataclass(frozen=True)
class PhaseMethod:
    """How one phase is fitted. slope_shrink: s (applied load slope = s x fitted; 0 = no load term);
    extra: a second feature (or None); slices: per-(system, backend) offsets, else the backend level."""

    slope_shrink: float = 1.0
    extra: str | None = None
    slices: bool = True
    centred: bool = False  # anchor the load term at the rows' median load instead of one request per engine
    replay: str = "sweep"  # which replay the phase corrects (REPLAYS)
    # slopes from within-model variation only: the median over models of each model's Theil-Sen slope
    # (pooled pairs let the model with most rows, and between-model offsets, set the slope)
    within: bool = False
    # model-balanced Theil-Sen: the weighted median of pairwise slopes, pair weight 1 / (n_i n_j) (n = the
    # model's rows), so every model, not every row, weighs the same; with `within`: only pairs of one
    # model's rows, each model's pairs weighing 1 in total (not the median of six per-model slopes)
    balanced: bool = False
    # round 8: no correction at all (every offset 1, no term): only the phase's band is fitted, on the raw residuals
    raw: bool = False
    # round 8: each offset (slice, backend, phase) a weighted median of its rows, every model weighing 1 in total,
    # instead of the median of per-model medians (both give each model one vote; this one reads within-model spread)
    balanced_offsets: bool = False
    # silicon = factor x (replayed + a), a in ms per backend from OVERHEAD_GRID_MS by the backend's leave-one-model-out
    # score on the fit rows (resolve_overhead): a cost the replay does not model that adds ms, not a ratio. Round 18
    # (TTFT, per request) did not qualify; round 19 (TPOT, per decode step, with raw: factor 1) is replay-v15, and its
    # held-out check shows the 2 ms is the calibration models' shared bias, not every vLLM deployment's (docs/fidelity.md)
    overhead: bool = False

    def label(self) -> str:
        if self.raw:
            return ("client " if self.replay == "client" else "") + "raw"
        return (("client " if self.replay == "client" else "") + f"s={self.slope_shrink:.3g}"
                + (" centred" if self.centred else "")
                + (f" +{self.extra}" if self.extra else "") + ("" if self.slices else " backend-only")
                + (" within-model" if self.within else "") + (" balanced" if self.balanced else "")
                + (" balanced-offsets" if self.balanced_offsets else "") + (" +overhead" if self.overhead else ""))

    @property
    def is_reference(self) -> bool:
        """The simplest variant: (system, backend) offsets only, no load or extra term."""
        return self.slope_shrink == 0.0 and self.extra is None and self.slices


BAND_LEVELS = ("slice", "backend", "phase")


@dataclass(frozen=True)
class BandMethod:
    """How one phase's P10-P90 band is built from leave-one-model-out calibrated residuals.

    level: the pool a slice's band is read from: "slice" (v1-v4: the (system, backend, phase) slice's
    own residuals, its backend's when it has fewer than MIN_BAND_ROWS, widened sqrt(1 + K/n)),
    "backend" (every slice of a backend shares its (backend, phase) pool) or "phase" (one pool per
    phase). balanced: every model weighs the same in the pool's quantiles (weight 1 / its rows there),
    so the model with most rows does not set the band. spread: the band's distance from the pool's
    median x this (1 = the pool's own P10 and P90)."""

    level: str = "slice"
    balanced: bool = False
    spread: float = 1.0

    def label(self) -> str:
        return f"{self.level}{' balanced' if self.balanced else ''} x{self.spread:g}"

    @property
    def is_reference(self) -> bool:
        return self == BandMethod()


def band_options() -> tuple[BandMethod, ...]:
    """The band variants compared (bench_fidelity.py --compare-bands, BAND_RULE); the first is v4's."""
    return tuple(BandMethod(level, balanced, spread) for spread in (1.0, 1.25, 1.5, 2.0)
                 for level in BAND_LEVELS for balanced in (False, True))


def weighted_quantile(values: list[float], weights: list[float], q: float) -> float:
    """Quantile of weighted values: each value sits at the midpoint of its cumulative weight,
    linear between them (equal weights give `quantile`'s rule on n >= 2 values up to the ends)."""
    pairs = sorted(zip(values, weights))
    total = sum(w for _, w in pairs)
    pos, acc = [], 0.0
    for _, w in pairs:
        pos.append((acc + w / 2) / total)
        acc += w
    if q <= pos[0]:
        return pairs[0][0]
    for i in range(1, len(pairs)):
        if q <= pos[i]:
            t = (q - pos[i - 1]) / (pos[i] - pos[i - 1]) if pos[i] > pos[i - 1] else 0.0
            return pairs[i - 1][0] + t * (pairs[i][0] - pairs[i - 1][0])
    return pairs[-1][0]


def pool_band(pool: list[tuple[float, str]], bm: BandMethod) -> tuple[float, float]:
    """(P10, P90) of a pool of (residual, model) under a band method, before any widening."""
    values = [v for v, _ in pool]
    if bm.balanced:
        counts: dict[str, int] = defaultdict(int)
        for _, m in pool:
            counts[m] += 1
        weights = [1.0 / counts[m] for _, m in pool]
        lo, mid, hi = (weighted_quantile(values, weights, q) for q in (0.1, 0.5, 0.9))
    else:
        lo, mid, hi = (quantile(values, q) for q in (0.1, 0.5, 0.9))
    if bm.spread != 1.0:
        lo, hi = mid + bm.spread * (lo - mid), mid + bm.spread * (hi - mid)
    return lo, hi


@dataclass(frozen=True)
class Method:
    """One variant of the fit, per phase (the phases are fitted independently)."""

    name: str
    ttft: PhaseMethod = PhaseMethod()
    tpot: PhaseMethod = PhaseMethod()
    # (backend, phase, PhaseMethod): that backend's phase fitted on its own rows only, with its own
    # terms and replay basis (profile keys "<backend>/<phase>", format 3); the pooled fit above stays
    # the phase level for backends without an override
    per_backend: tuple[tuple[str, str, PhaseMethod], ...] = ()
    # how each phase's band is built (BandMethod(): v1-v4's per-slice bands)
    ttft_band: BandMethod = BandMethod()
    tpot_band: BandMethod = BandMethod()
    # (backend, phase, ClientMix): for a client-basis phase, the replayed value that backend's rows correct
    # (round 7; profile key "client_mix", format 4)
    client_mix: tuple[tuple[str, str, ClientMix], ...] = ()
    # round 7b: only the client_mix (backend, phase)s take their offsets, bands and load term from the mixed
    # fit; every other entry is the same method's fit without the mix (an SGLang basis change then cannot move
    # the vLLM offsets through the shared phase-level parent or the pooled slope)
    decoupled: bool = False
    # (backend, phase, ms): the per-request costs of PhaseMethod.overhead phases; None: not fitted yet (resolve_overhead)
    overhead_ms: tuple[tuple[str, str, float], ...] | None = None

    def overhead_for(self, phase: str, backend: str | None) -> float:
        """The ms added to a row's replayed value of `phase` before the factors (0 without an overhead)."""
        for b, p, ms in self.overhead_ms or ():
            if b == backend and p == phase:
                return ms
        return 0.0

    def mix_for(self, phase: str, backend: str | None) -> ClientMix | None:
        for b, p, mix in self.client_mix:
            if b == backend and p == phase:
                return mix
        return None

    def phase(self, phase: str) -> PhaseMethod:
        return self.ttft if phase == "ttft" else self.tpot

    def band(self, phase: str) -> BandMethod:
        return self.ttft_band if phase == "ttft" else self.tpot_band

    def phase_for(self, phase: str, backend: str | None) -> PhaseMethod:
        """The phase method a row of `backend` is fitted with (its override, else the pooled one)."""
        for b, p, pm in self.per_backend:
            if b == backend and p == phase:
                return pm
        return self.phase(phase)

    def describe(self) -> str:
        over = "".join(f"; {b} {p.upper()} {pm.label()} (own fit)" for b, p, pm in self.per_backend)
        over += "".join(f"; {b} {p.upper()} replayed = sweep x (client/sweep)^w, w: {mix.label()}"
                        + (" (its entries and load term from that fit, the rest from the fit without it)"
                           if self.decoupled else "") for b, p, mix in self.client_mix)
        return (f"{self.name} (TTFT {self.ttft.label()}; TPOT {self.tpot.label()}{over}): replayed = the sweep's own "
                "replay, or for a 'client' phase the benchmark-client replay a sweep runs beside it; "
                "r = ln(silicon/replayed); per "
                "phase a Theil-Sen slope b of r on x = log2(concurrency per engine) [then a Theil-Sen slope of r - b x "
                "on the extra feature]; per (system, backend, phase) [backend-only: per (backend, phase)] m = median over "
                "models of per-model medians of the detrended r, shrunk to (backend, phase) then (phase) with K=3 "
                "pseudo-models; correction exp(m + s b x [+ extra term]) (a 'raw' phase: no correction, factor 1, "
                "only its band); band = P10-P90 of leave-one-model-out "
                "calibrated residuals, widened sqrt(1+K/n), x1.5 for a slice without rows"
                + ("" if not any(self.phase(p).overhead for p in PHASES) else
                   "; '+overhead': replayed + a (ms, per backend, from OVERHEAD_GRID_MS by the backend's "
                   "leave-one-model-out score on the fit rows) before every other step, so silicon = correction x "
                   "(replayed + a)")
                + ("" if self.ttft_band.is_reference and self.tpot_band.is_reference else
                   f" (band pools: TTFT {self.ttft_band.label()}, TPOT {self.tpot_band.label()}; 'backend'/'phase': every "
                   "slice reads its (backend, phase) / phase pool; 'balanced': each model weighs the same in the "
                   "quantiles; xk: the P10/P90's distance from the pool median x k)"))


def phase_options(replays: tuple[str, ...] = ("sweep",)) -> tuple[PhaseMethod, ...]:
    """The per-phase variants compared (each phase's choice is independent of the other's), on each
    replay basis in `replays` (s = 0 centred is s = 0 and is listed once)."""
    return tuple(opt for replay in replays for opt in (
        *(PhaseMethod(s, replay=replay) for s in (0.0, 0.25, 0.5, math.log(2), 0.75, 1.0)),
        *(PhaseMethod(s, centred=True, replay=replay) for s in (0.25, 0.5, 0.75)),
        PhaseMethod(math.log(2), slices=False, replay=replay), PhaseMethod(1.0, slices=False, replay=replay),
        *(PhaseMethod(s, extra=e, replay=replay) for s in (math.log(2), 1.0) for e in ("log2_isl", "log2_osl"))))


# The v2 method as it was applied (s = ln 2 in both phases, see above).
V2_AS_APPLIED = Method("v2-as-applied", PhaseMethod(math.log(2)), PhaseMethod(math.log(2)))
# replay-v3: chosen per phase by leave-one-model-out error on the calibration split only (465 rows of
# 6 models, bench_fidelity.py --compare-methods, 2026-12-04; docs/fidelity.md): TTFT keeps the
# (system, backend) slices with a quarter of the fitted load slope, TPOT the backend level with ln 2 of it
V3 = Method("v3", PhaseMethod(0.25), PhaseMethod(math.log(2), slices=False))
# replay-v4: both phases corrected on the benchmark-client replay (fidelity/measurement.py
# benchmark_client_request), chosen by bench_fidelity.CHOICE_RULE (fixed 2026-12-04T11:14Z: pooled
# leave-one-model-out score and >= 4 of 6 model folds against the simplest variant, sweep basis as
# the reference) on 465 calibration rows (docs/fidelity.md)
V4 = Method("v4", PhaseMethod(0.5, centred=True, replay="client"),
            PhaseMethod(math.log(2), extra="log2_osl", replay="client"))
# replay-v5: v4's corrections, bands chosen by bench_fidelity.BAND_RULE (committed 2026-12-04T21:39Z, ecdee6e,
# before any candidate was scored) by nested leave-one-model-out coverage on the calibration split only
# (bench/results/fidelity_calibration_bands.json, 21:47Z): TTFT from its backend's pool, TPOT from the phase's
# pool, both with model-balanced quantiles (docs/fidelity.md, round 6)
V5 = replace(V4, name="v5", ttft_band=BandMethod("backend", balanced=True),
             tpot_band=BandMethod("phase", balanced=True))
# replay-v6: v5 with SGLang TTFT corrected on the geometric mean of the sweep's and the benchmark-client replay
# (ClientMix(0.5); its offsets, band and load term from that fit, everything else v5's), chosen by
# bench_fidelity.ROUND7B_RULE (committed 2026-12-05T02:11Z, 2cd5265, before any decoupled candidate was scored) by
# leave-one-model-out on the calibration split only (bench/results/fidelity_calibration_round7b.json, 02:13Z),
# fitted on v5's 465 rows (ROUND7_RULE step 1 kept them: bench/results/fidelity_calibration_round7.json)
V6 = replace(V5, name="v6", client_mix=(("sglang", "ttft", ClientMix(0.5)),), decoupled=True)
# replay-v7: v6 with that blend only where the candidate's attention was timed with the bf16 fallback data (the perf
# database lacks its own: DeepSeek's fp8 MLA on SGLang); with its own data an SGLang candidate's TTFT is corrected on
# the client replay again, as v5 did. Chosen by bench_fidelity.ROUND8_TTFT_RULE (committed 2026-12-05T04:51Z,
# 20f33a4, before any candidate was scored) by leave-one-model-out on the 1,135 stored calibration rows
# (bench/results/fidelity_calibration_round8_ttft.json, 04:53Z); fitted on v5's 465 rows; vLLM TTFT and TPOT as v6
V7 = replace(V6, name="v7", client_mix=(("sglang", "ttft", ClientMix(0.5, native_weight=1.0)),))
# replay-v8: v7 with no TPOT correction (the benchmark-client replay's TPOT as it is; only the phase's band, v6's band
# method on the raw residuals), chosen by bench_fidelity.ROUND8_TPOT_RULE (committed 2026-12-05T04:58Z, e5b2260, before
# any candidate was scored; reference V6) by leave-one-model-out on the calibration split only
# (bench/results/fidelity_calibration_round8_tpot.json, 05:11Z); TTFT entries v7's (the default when it landed);
# fitted on v6's 465 rows
V8 = replace(V7, name="v8", tpot=PhaseMethod(0.0, replay="client", raw=True))
# replay-v9: v8's method unchanged, refitted on its 465 rows with round 9's replays (vLLM fp8_block dense GEMMs
# timed with per-tensor data on b200/b300/h100, search/perf_data.GEMM_PER_TENSOR); adopted by
# bench_fidelity.ROUND9C_REFIT_RULE (docs/fidelity.md "Round 9")
V9 = replace(V8, name="v9")
# round 10 candidates (bench_fidelity.ROUND10_CLIENT_RULE): v9's method refitted on replays that draw each silicon row's
# lengths as its benchmark client did (silicon.benchmark_client), with and without SGLang TTFT's client mix (a proxy,
# chosen when the InferenceMAX rows were replayed in lockstep, for clients drifting apart)
V10 = replace(V9, name="v10")
V10_NO_MIX = replace(V9, name="v10-no-mix", client_mix=(), decoupled=False)
# replay-v10 (the default 17:01-17:15 UTC on 2026-12-05, round 10): V10_NO_MIX, the only qualifier (C1's TTFT score on the 664 calibration rows
# outside the fit 2.470 against v9's 2.407; C2's 2.305, TPOT equal, bands 85 % / 87 %), fitted on 471 prefix rows
# with the round-10 replays (bench/results/round10/round10b_refit_V10*.json, docs/fidelity.md "Round 10")
# replay-v11 (the default 17:15-18:08 UTC, round 10c, bench_fidelity.ROUND10C_SWEEP_RULE): the same method refitted once AIC's
# runners' rows replay with fixed lengths, as those runners sent them, and sweeps spread a fixed-length workload's
# client replay like the rows the factors were fitted on (measurement.CLIENT_LENGTH_SPREAD); on the 664 calibration rows
# outside both fits TTFT score 2.664 -> 2.630, TPOT equal (bench/results/round10/round10c_refit_V11.json)
V11 = replace(V10_NO_MIX, name="v11")
# round 11's candidate (bench_fidelity.ROUND11_BENCH_IS_SWEEP_RULE): the same method refitted once AIC's runners' rows
# replay as a sweep replays a fixed-length workload (lengths spread 1/9)
V12 = replace(V11, name="v12")
# round 12's candidates (bench_fidelity.ROUND12_BAND_RULE): v12 with its TTFT band drawn closer to the pool median
V12_BAND_90 = replace(V12, ttft_band=BandMethod("backend", balanced=True, spread=0.9))
V12_BAND_80 = replace(V12, ttft_band=BandMethod("backend", balanced=True, spread=0.8))
V12_BAND_70 = replace(V12, ttft_band=BandMethod("backend", balanced=True, spread=0.7))
# replay-v12 (the default from round 12 to round 15): V12_BAND_90, the spread whose nested leave-one-model-out TTFT band coverage on
# the prefix was closest to 80 % (80.3 %; 1.0: 82.8 %, 0.8: 75.4 %, 0.7: 69.2 %); against v11 on the 664 calibration
# rows outside both fits TTFT score 2.607 -> 2.130, TPOT equal, TTFT band 75 -> 88 % (round10/round12_refit_V12_BAND_90.json);
# worse than v11 on SGLang rows (calibration TTFT P90 81 -> 125 %), left for a round with a per-backend guard
# replay-v13 (the default since round 15, bench_fidelity.ROUND15_LOCKSTEP_RULE): the same method, its main factors fitted
# without the rows of AIC's SGLang runner (a lockstep client the spread replay does not model) and its FIXED_LENGTHS
# factors on those rows replayed with fixed lengths, for a workload with evaluation.client_lengths: fixed on SGLang;
# against v12 on the 664 calibration rows outside the fits TTFT score 2.130 -> 1.909 (SGLang 4.310 -> 3.192, vLLM
# 1.564 -> 1.457), TPOT 2.265 -> 2.133 (bench/results/round14/round15_refit_P15.json)
V13 = replace(V12_BAND_90, name="v13")
# replay-v14 (the default since round 16, bench_fidelity.ROUND16_SCRIPT_FLAGS_RULE): v13's method and fixed-length factors,
# its main factors refitted on InferenceMAX's SGLang rows replayed with their benchmark scripts' engine flags (chunk size,
# running-request cap, memory fraction) and receive interval (silicon.script_flags), so the factors no longer carry the
# scripts' polling wait, which a sweep's deployment does not have; against v13 on the 664 calibration rows outside the fits
# TTFT score 1.909 -> 1.731 (SGLang 3.192 -> 2.622, vLLM 1.457 -> 1.441), TPOT 2.133 -> 2.124
# (bench/results/round16/round16_refit_P16.json)
V14 = replace(V12_BAND_90, name="v14")
# round 18's candidate (bench_fidelity.ROUND18_OVERHEAD_RULE): v14 with a per-request overhead in TTFT, per backend
V14_OVERHEAD = replace(V14, name="v14-overhead", ttft=replace(V14.ttft, overhead=True))
# round 19's candidate (bench_fidelity.ROUND19_TPOT_OVERHEAD_RULE): v14 with TPOT = the client replay's + a per-step overhead
V14_TPOT_OVERHEAD = replace(V14, name="v14-tpot-overhead", tpot=replace(V14.tpot, overhead=True))
# replay-v15 (the default since round 19, bench_fidelity.ROUND19_TPOT_OVERHEAD_RULE): v14 with TPOT = the client replay's TPOT
# + a per-step overhead per backend (vLLM 2 ms, SGLang 0), still no TPOT factor; against v14 on the 664 calibration rows
# outside the fits, same replays: TPOT MdAPE / P90 14.0 / 36.4 % -> 8.0 / 35.1 %, score 2.124 -> 1.501, TTFT unchanged
# (bench/results/round18/round19_refit_P19.json). Round 18's TTFT overhead (V14_OVERHEAD) did not qualify.
V15 = replace(V14_TPOT_OVERHEAD, name="v15")
# round 20's candidate (bench_fidelity.ROUND20_REPLAYS_RULE): v15's method, fitted on round 17's SGLang replays
V15_ON_ROUND17_REPLAYS = replace(V15, name="v15-on-round17-replays")
CHOSEN = V15
METHOD = CHOSEN.describe()

# report key -> (phase, exponent): calibrated = raw x factor**exponent
CALIBRATED_KEYS: dict[str, tuple[str, int]] = {
    "mean_ttft_ms": ("ttft", 1), "median_ttft_ms": ("ttft", 1), "p90_ttft_ms": ("ttft", 1),
    "mean_tpot_ms": ("tpot", 1), "median_tpot_ms": ("tpot", 1), "p90_tpot_ms": ("tpot", 1),
    "mean_itl_ms": ("tpot", 1), "p90_itl_ms": ("tpot", 1),
    "mean_output_token_throughput_per_user": ("tpot", -1),
}
# goal metrics calibrated from the phases (calibrate: ranking reads them, search/scoring.ranked_value)
GOAL_KEYS: tuple[str, ...] = ("mean_e2e_latency_ms", "p90_e2e_latency_ms", "output_throughput_tok_s",
                              "request_throughput_rps", GOODPUT_KEY, "goodput_completed_requests",
                              "sla_token_share")
# goal metric -> the phase whose band bounds it and the direction it moves (time-like +1, rate-like -1)
GOAL_PHASE: dict[str, tuple[str, int]] = {
    "throughput": ("tpot", -1), "throughput_per_gpu": ("tpot", -1), "throughput_per_user": ("tpot", -1),
    "goodput": ("tpot", -1), "goodput_per_gpu": ("tpot", -1), "min_gpus": ("tpot", -1),
    "e2e_latency": ("tpot", 1),
}


# what a calibrated report adds (copied into Candidate.metrics so tables and deploy output see it)
REPORT_KEYS: tuple[str, ...] = (
    *(f"calibrated_{k}" for k in CALIBRATED_KEYS),
    *(f"calibrated_{k}" for k in GOAL_KEYS),
    *(f"{stem}_{p}{tail}" for p in PHASES for stem, tail in (("band", "_lo"), ("band", "_hi"), ("band", "_rows"),
                                                              ("calibration_factor", ""))),
    "calibration_fallback",
)


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


class ProfileError(ValueError):
    """A calibration profile that is not a valid profile (the caller names the file)."""


def _model_median(members: list[dict[str, Any]]) -> float:
    """Median over models of each model's median residual: a model with many rows (MiniMax-M2.5 is
    over half of the calibration sample) cannot set a slice's correction for the others."""
    per: dict[Any, list[float]] = defaultdict(list)
    for m in members:
        per[m.get("model")].append(m["residual"])
    return statistics.median(statistics.median(v) for v in per.values())


def _balanced_median(members: list[dict[str, Any]]) -> float:
    """PhaseMethod.balanced_offsets: the weighted median of the rows' residuals, each model weighing 1 in total."""
    counts: dict[Any, int] = defaultdict(int)
    for m in members:
        counts[m.get("model")] += 1
    return weighted_quantile([m["residual"] for m in members], [1.0 / counts[m.get("model")] for m in members], 0.5)


def _offset_median(members: list[dict[str, Any]], pm: "PhaseMethod | None" = None) -> float:
    return _balanced_median(members) if pm is not None and pm.balanced_offsets else _model_median(members)


def _shrunk(members: list[dict[str, Any]], parent: float, pm: "PhaseMethod | None" = None) -> float:
    if not members:
        return parent
    n = len({m.get("model") for m in members})  # evidence counts in models, not rows
    return (n * _offset_median(members, pm) + SHRINK_K * parent) / (n + SHRINK_K)


def load_x(concurrency_per_engine: float | None) -> float:
    """The load coordinate of the slope: log2 of concurrency per engine (1 when unknown)."""
    c = concurrency_per_engine if concurrency_per_engine and concurrency_per_engine > 0 else 1.0
    return math.log2(max(1.0, float(c)))


def features(concurrency_per_engine: float | None, isl: float | None = None,
             osl: float | None = None) -> dict[str, float]:
    """The named inputs a profile's terms read (a missing ISL/OSL is left out: the term uses its centre)."""
    out = {LOAD: load_x(concurrency_per_engine)}
    for name, v in (("log2_isl", isl), ("log2_osl", osl)):
        if v is not None and v > 0 and math.isfinite(v):
            out[name] = math.log2(float(v))
    return out


def engine_concurrency(record: Mapping[str, Any], phase: str) -> float:
    """A bench record's concurrency per engine of the role that serves the phase."""
    shape = record.get("shape") or {}
    role = "agg" if "agg" in shape else ("prefill" if phase == "ttft" else "decode")
    workers = (shape.get(role) or {}).get("workers") or 1
    return float(record.get("concurrency") or 1) / float(workers)


def record_passes(record: Mapping[str, Any]) -> float | None:
    """A bench record's first-wave prefill passes (prefill_passes; the bench's chunk budget)."""
    shape = record.get("shape") or {}
    role = shape.get("agg") or shape.get("prefill") or {}
    return prefill_passes(engine_concurrency(record, "ttft"), record.get("isl"), role.get("attention_dp") or 1)


def record_attention_fallback(record: Mapping[str, Any]) -> bool:
    """Whether a bench record's attention was timed with the bf16 fallback data (its fidelity note)."""
    return attention_fallback(record.get("fidelity_note"))


def record_features(record: Mapping[str, Any], phase: str) -> dict[str, float]:
    return features(engine_concurrency(record, phase), record.get("isl"), record.get("osl"))


def replayed(record: Mapping[str, Any], phase: str, replay: str = "sweep") -> float | None:
    """A bench record's replayed value of one phase on one basis (REPLAYS): "client" = its "ours"
    (the benchmark-client replay); "sweep" = its "sweep" numbers, or "ours" when the record has a
    single replay (a `--client ramp` run, whose "ours" is the sweep measurement)."""
    if replay == "client":
        side = record.get("ours") or {}
    else:
        side = record.get("sweep") or record.get("ours") or {}
    v = side.get(phase)
    return float(v) if _number(v) else None


def mixed_replayed(record: Mapping[str, Any], phase: str, mix: ClientMix) -> float | None:
    """A bench record's replayed value under a resolved ClientMix: sweep x (client / sweep)^w."""
    if mix.weight is None:
        raise ValueError("resolve a fitted ClientMix weight first (resolve_mix)")
    w = mix_weight(mix.entry(), record_passes(record), record_attention_fallback(record))
    sweep = replayed(record, phase, "sweep")
    if w == 0.0 or sweep is None or sweep <= 0:
        return sweep
    client = replayed(record, phase, "client")
    if client is None or client <= 0:
        return None
    return sweep * (client / sweep) ** w


def fitted_mix_weight(records: Iterable[Mapping[str, Any]], backend: str, phase: str) -> float:
    """ClientMix(weight=None)'s weight: the Theil-Sen slope of ln(silicon / sweep) on ln(client / sweep) over
    the backend's rows, clipped to [0, 1]."""
    xs, ys = [], []
    for r in records:
        if r.get("backend") != backend:
            continue
        s, c, m = replayed(r, phase, "sweep"), replayed(r, phase, "client"), (r.get("silicon") or {}).get(phase)
        if s and c and _number(m) and s > 0 and c > 0 and m > 0:
            xs.append(math.log(c / s))
            ys.append(math.log(m / s))
    return min(1.0, max(0.0, theil_sen(xs, ys))) if xs else 1.0


def resolve_mix(records: Iterable[Mapping[str, Any]], method: "Method") -> "Method":
    """The method with every fitted ClientMix weight fitted on `records`."""
    if not any(mix.weight is None for _, _, mix in method.client_mix):
        return method
    records = list(records)
    return replace(method, client_mix=tuple(
        (b, p, replace(mix, weight=round(fitted_mix_weight(records, b, p), 6)) if mix.weight is None else mix)
        for b, p, mix in method.client_mix))


def target_score(mdape: float, p90: float, phase: str) -> float:
    """SCORE_TARGETS' score: MdAPE / its target + P90 / its target (bench_fidelity's scores read it too)."""
    t_md, t_p90 = SCORE_TARGETS[phase]
    return mdape / t_md + p90 / t_p90


def lomo_residuals(records: list[Mapping[str, Any]], method: "Method",
                   keep: Callable[[Mapping[str, Any]], bool] = lambda r: True) -> Iterator[tuple[dict[str, Any], float]]:
    """(residual row, calibrated residual ln(silicon / (replayed x factor))) of every kept record, its factor from
    `method` fitted without the record's model; a model without kept records costs no fit."""
    for model in sorted({str(r.get("model")) for r in records}):
        train = [r for r in records if str(r.get("model")) != model]
        test = [r for r in records if str(r.get("model")) == model and keep(r)]
        if not train or not test:
            continue
        sub = fit(train, fitted="lomo", source="lomo", method=method, lomo_bands=False, fallback=False)
        for x in residual_rows(test, method):
            yield x, x["residual"] - math.log(_factor(sub, x["system"], x["backend"], x["phase"], x["x"])[0])


def lomo_score(records: list[Mapping[str, Any]], method: "Method", phase: str, backend: str) -> float:
    """The phase's score on `backend`'s rows, each row calibrated by `method` fitted without the row's model."""
    apes = [abs(math.exp(-res) - 1.0) for x, res in lomo_residuals(records, method, lambda r: r.get("backend") == backend)
            if x["phase"] == phase]
    return target_score(quantile(apes, 0.5), quantile(apes, 0.9), phase) if apes else math.inf


def resolve_overhead(records: Iterable[Mapping[str, Any]], method: "Method") -> "Method":
    """The method with its PhaseMethod.overhead phases' per-request costs fitted on `records`: per phase, backend
    by backend (sorted; the others at their chosen value, first 0), the OVERHEAD_GRID_MS value with the lowest
    lomo_score (ties to the smaller)."""
    if method.overhead_ms is not None:
        return method
    phases = [p for p in PHASES if method.phase(p).overhead]
    if not phases:
        return replace(method, overhead_ms=())
    records = list(records)
    chosen: dict[tuple[str, str], float] = {}

    def current() -> "Method":
        return replace(method, overhead_ms=tuple((b, p, ms) for (b, p), ms in sorted(chosen.items())))

    for phase in phases:
        for backend in sorted({str(r.get("backend")) for r in records}):
            scores = []
            for ms in OVERHEAD_GRID_MS[phase]:
                chosen[(backend, phase)] = ms
                scores.append((lomo_score(records, current(), phase, backend), ms))
            chosen[(backend, phase)] = min(scores)[1]
    return current()


def residual_rows(records: Iterable[Mapping[str, Any]], method: "Method | None" = None) -> list[dict[str, Any]]:
    """Bench records -> {id, model, system, backend, phase, x (features), residual} for rows with both
    numbers positive; each phase's replayed value on the method's basis (PhaseMethod.replay), or its
    ClientMix for a client phase of a backend that has one."""
    out = []
    for r in records:
        silicon = r.get("silicon") or {}
        for phase in PHASES:
            basis = method.phase_for(phase, r.get("backend")).replay if method else "sweep"
            mix = method.mix_for(phase, r.get("backend")) if method and basis == "client" else None
            o = mixed_replayed(r, phase, mix) if mix else replayed(r, phase, basis)
            if o is not None and method is not None:
                o += method.overhead_for(phase, r.get("backend"))
            s = silicon.get(phase)
            if o and s and o > 0 and s > 0 and math.isfinite(o) and math.isfinite(s):
                out.append({"id": r["id"], "model": r.get("model"), "system": r["system"], "backend": r["backend"],
                            "phase": phase, "split": r.get("split"), "x": record_features(r, phase),
                            "residual": math.log(s / o)})
    return out


def theil_sen(xs: list[float], ys: list[float]) -> float:
    """Median of pairwise slopes (0 when x never varies): robust to a few far-off rows."""
    slopes = [(ys[j] - ys[i]) / (xs[j] - xs[i]) for i in range(len(xs)) for j in range(i + 1, len(xs))
              if xs[j] != xs[i]]
    return statistics.median(slopes) if slopes else 0.0


def within_model_slope(rows: list[dict[str, Any]], feature: str) -> float:
    """Median over models of each model's Theil-Sen slope of the residual on `feature` (models whose
    rows do not vary in it are left out; 0 when none varies)."""
    per: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        per[r.get("model")].append(r)
    slopes = [theil_sen([r["x"][feature] for r in v], [r["residual"] for r in v]) for v in per.values()
              if len({r["x"][feature] for r in v}) > 1]
    return statistics.median(slopes) if slopes else 0.0


def balanced_theil_sen(rows: list[dict[str, Any]], feature: str, within: bool = False) -> float:
    """PhaseMethod.balanced's slope of the residual on `feature` (0 when no pair varies in it)."""
    counts: dict[Any, int] = defaultdict(int)
    for r in rows:
        counts[r.get("model")] += 1
    xs = [r["x"][feature] for r in rows]
    ys = [r["residual"] for r in rows]
    ms = [r.get("model") for r in rows]
    slopes: list[float] = []
    weights: list[float] = []
    per_model_pairs: dict[Any, int] = defaultdict(int)
    pairs = []
    for i in range(len(rows)):
        for j in range(i + 1, len(rows)):
            if xs[j] == xs[i] or (within and ms[i] != ms[j]):
                continue
            pairs.append((i, j))
            per_model_pairs[ms[i]] += 1
    for i, j in pairs:
        slopes.append((ys[j] - ys[i]) / (xs[j] - xs[i]))
        weights.append(1.0 / per_model_pairs[ms[i]] if within else 1.0 / (counts[ms[i]] * counts[ms[j]]))
    return weighted_quantile(slopes, weights, 0.5) if slopes else 0.0


def _terms(rows: list[dict[str, Any]], method: Method) -> dict[str, list[dict[str, Any]]]:
    """Per phase the fitted slopes (load, then the optional extra feature); detrends rows in place."""
    terms: dict[str, list[dict[str, Any]]] = {}
    for phase in PHASES:
        members = [r for r in rows if r["phase"] == phase]
        phase_terms = []
        pm = method.phase(phase)
        for name, shrink in ((LOAD, pm.slope_shrink), (pm.extra, 1.0)):
            if not name or (pm.raw and name != LOAD):
                continue
            if pm.raw:
                shrink = 0.0
            have = [r for r in members if name in r["x"]]
            if not shrink:
                b = 0.0
            elif pm.balanced:
                b = balanced_theil_sen(have, name, within=pm.within)
            elif pm.within:
                b = within_model_slope(have, name)
            else:
                b = theil_sen([r["x"][name] for r in have], [r["residual"] for r in have])
            centre = statistics.median(r["x"][name] for r in have) if have else 0.0
            anchor = centre if (pm.centred and name == LOAD) else 0.0
            for r in members:  # the offsets are fitted on the detrended residuals
                r["residual"] -= b * (r["x"].get(name, centre) - anchor)
            phase_terms.append({"feature": name, "fitted": round(b, 6), "coefficient": round(shrink * b, 6),
                                "centre": round(centre, 6), "anchor": round(anchor, 6)})
        terms[phase] = phase_terms
    return terms


def fit(records: Iterable[Mapping[str, Any]], *, fitted: str, source: str, method: Method | None = None,
        lomo_bands: bool = True, fallback: bool = True) -> dict[str, Any]:
    """A profile (JSON-able, format 2) from calibration-split bench records; refuses held-out rows.

    lomo_bands: bands from leave-one-model-out residuals (each row scored by a profile fitted
    without its model), because the profile is used on models it never saw; in-sample residuals
    covered only 58 % (TTFT) / 42 % (TPOT) of unseen-model rows with a nominal 80 % band.
    fallback: False leaves out a client-basis method's sweep_fallback (the inner fits of leave-one-model-out
    scores and bands read only the main factors).
    """
    method = method or CHOSEN
    records = list(records)
    # before anything is fitted on them (a client mix's weight, an overhead's leave-one-model-out choice)
    plain = replace(method, client_mix=(), overhead_ms=())
    held = sorted({r["id"] for r in residual_rows(records, plain) if r["split"] != "calibration"})
    if held:
        raise ProfileError(f"calibration may only use calibration-split rows; got held-out {held[:3]}")
    method = resolve_overhead(records, resolve_mix(records, method))
    if method.client_mix and method.decoupled:
        return _fit_decoupled(records, fitted=fitted, source=source, method=method, lomo_bands=lomo_bands)
    if method.per_backend:
        return _fit_per_backend(records, fitted=fitted, source=source, method=method, lomo_bands=lomo_bands)
    rows = residual_rows(records, method)
    if not rows:
        raise ProfileError("no calibration rows with replayed and measured TTFT/TPOT")
    terms = _terms(rows, method)
    by_phase: dict[str, list[dict[str, Any]]] = defaultdict(list)
    by_backend: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    by_slice: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_phase[r["phase"]].append(r)
        by_backend[(r["backend"], r["phase"])].append(r)
        if method.phase(r["phase"]).slices:
            by_slice[(r["system"], r["backend"], r["phase"])].append(r)
    # a raw phase (PhaseMethod.raw) keeps every offset at 1: its residuals are already uncorrected
    phase_m = {p: 0.0 if method.phase(p).raw else _offset_median(v, method.phase(p)) for p, v in by_phase.items()}
    backend_m = {k: 0.0 if method.phase(k[1]).raw else _shrunk(v, phase_m[k[1]], method.phase(k[1]))
                 for k, v in by_backend.items()}
    slices: dict[str, Any] = {}
    for (system, backend, phase), members in sorted(by_slice.items()):
        m = 0.0 if method.phase(phase).raw else _shrunk(members, backend_m[(backend, phase)], method.phase(phase))
        slices[f"{system}/{backend}/{phase}"] = {"factor": round(math.exp(m), 6), "rows": len(members)}
    profile: dict[str, Any] = {
        "format": PROFILE_FORMAT, "method": method.describe(), "method_name": method.name, "fitted": fitted,
        "source": source, "rows_used": sorted({r["id"] for r in rows}), "terms": terms, "slices": slices,
        "backend": {f"{b}/{p}": {"factor": round(math.exp(m), 6), "rows": len(by_backend[(b, p)])}
                    for (b, p), m in sorted(backend_m.items())},
        "phase": {p: {"factor": round(math.exp(m), 6), "rows": len(by_phase[p])} for p, m in sorted(phase_m.items())},
        "replay": {p: method.phase(p).replay for p in PHASES},
    }
    mixes = {f"{b}/{p}": mix.entry() for b, p, mix in method.client_mix if method.phase_for(p, b).replay == "client"}
    if mixes:
        profile["format"], profile["client_mix"] = MIX_FORMAT, mixes
    if method.overhead_ms:
        profile["format"] = OVERHEAD_FORMAT
        profile["overhead_ms"] = {f"{b}/{p}": ms for b, p, ms in method.overhead_ms}
    # bands from calibrated residuals (each row corrected by a profile fitted without the row's
    # model, or in sample by its own profile)
    calibrated: dict[tuple[str, str, str], list[tuple[float, str]]] = defaultdict(list)
    if lomo_bands and len({str(r.get("model")) for r in rows}) > 1:
        scored: Iterable[tuple[dict[str, Any], float]] = lomo_residuals(records, method)
    else:
        scored = ((x, x["residual"] - math.log(_factor(profile, x["system"], x["backend"], x["phase"], x["x"])[0]))
                  for x in residual_rows(records, method))
    for x, residual in scored:
        calibrated[(x["system"], x["backend"], x["phase"])].append((residual, str(x.get("model"))))
    backend_res: dict[tuple[str, str], list[tuple[float, str]]] = defaultdict(list)
    phase_res: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for (system, backend, phase), res in calibrated.items():
        backend_res[(backend, phase)] += res
        phase_res[phase] += res
    for (system, backend, phase), res in calibrated.items():
        entry = slices.get(f"{system}/{backend}/{phase}")
        if entry is None:
            continue
        bm = method.band(phase)
        if bm.level == "slice":
            pool, source_rows = res, "slice"
            if len(pool) < MIN_BAND_ROWS:
                pool, source_rows = backend_res[(backend, phase)], "backend"
            if len(pool) < MIN_BAND_ROWS:
                pool, source_rows = phase_res[phase], "phase"
            widen = math.sqrt(1 + SHRINK_K / len(res))
        else:
            pool = backend_res[(backend, phase)] if bm.level == "backend" else phase_res[phase]
            source_rows = bm.level
            widen = math.sqrt(1 + SHRINK_K / len(pool))
        lo, hi = pool_band(pool, bm)
        entry["band"] = [round(lo * widen, 6), round(hi * widen, 6)]
        entry["band_from"] = source_rows
    for (b, p), entry in ((k.split("/"), v) for k, v in profile["backend"].items()):
        entry["band"] = _band(backend_res[(b, p)], FALLBACK_WIDEN if method.phase(p).slices else 1.0, method.band(p))
        entry["offset"] = not method.phase(p).slices
    for p, entry in profile["phase"].items():
        entry["band"] = _band(phase_res[p], FALLBACK_WIDEN, method.band(p))
    if not (method.ttft_band.is_reference and method.tpot_band.is_reference):
        profile["band_method"] = {p: vars(method.band(p)).copy() for p in PHASES}
    if fallback and any(method.phase(p).replay == "client" for p in PHASES):
        # for a sweep without a client replay (open loop, trace, planner): the same method on the sweep basis
        # (its own overheads: the sweep's replayed values are other numbers)
        sweep_method = replace(method, name=f"{method.name}-sweep", ttft=replace(method.ttft, replay="sweep"),
                               tpot=replace(method.tpot, replay="sweep"), client_mix=(), overhead_ms=None)
        profile["sweep_fallback"] = fit(records, fitted=fitted, source=source, method=sweep_method,
                                        lomo_bands=lomo_bands)
    return profile


def _fit_decoupled(records: list[Mapping[str, Any]], *, fitted: str, source: str, method: Method,
                   lomo_bands: bool) -> dict[str, Any]:
    """Method.decoupled: the fit without the mix, with each client_mix (backend, phase)'s slices, backend entry
    and load term ("<backend>/<phase>") from the pooled fit with that mix alone (format 4; round 8: alone, so a
    second entry cannot move the first's through the shared parent or slope; one entry, as v6: the same fit)."""
    profile = fit(records, fitted=fitted, source=source, method=replace(method, client_mix=(), decoupled=False),
                  lomo_bands=lomo_bands)
    for entry in method.client_mix:
        backend, phase, _ = entry
        key = f"{backend}/{phase}"
        mixed = fit(records, fitted=fitted, source=source, method=replace(method, client_mix=(entry,), decoupled=False),
                    lomo_bands=lomo_bands)
        if key not in mixed["backend"]:
            continue
        profile["slices"] = {k: v for k, v in profile["slices"].items() if k.split("/")[1:] != [backend, phase]}
        profile["slices"].update({k: v for k, v in mixed["slices"].items() if k.split("/")[1:] == [backend, phase]})
        profile["backend"][key] = mixed["backend"][key]
        profile["terms"][key] = mixed["terms"][phase]
        if mixed.get("client_mix"):
            profile["format"] = MIX_FORMAT
            profile.setdefault("client_mix", {}).update(mixed["client_mix"])
    profile["slices"] = dict(sorted(profile["slices"].items()))
    profile["method"], profile["method_name"] = method.describe(), method.name
    return profile


def _fit_per_backend(records: list[Mapping[str, Any]], *, fitted: str, source: str, method: Method,
                     lomo_bands: bool) -> dict[str, Any]:
    """Format 3: the pooled fit of `method` without overrides (the phase level, and every backend
    without an override), then each (backend, phase) override fitted on that backend's rows only and
    put in place of the pooled entries of that backend and phase: its slices, backend offset, terms
    ("<backend>/<phase>") and replay basis; the sweep fallback likewise."""
    import copy

    base_method = replace(method, per_backend=())
    profile = fit(records, fitted=fitted, source=source, method=base_method, lomo_bands=lomo_bands)
    fallback = copy.deepcopy(profile.get("sweep_fallback") or {k: v for k, v in profile.items()
                                                                 if k != "sweep_fallback"})
    for backend, phase, pm in method.per_backend:
        part = [r for r in records if r.get("backend") == backend]
        if not any(replayed(r, phase, pm.replay) for r in part):
            continue
        sub_method = replace(base_method, name=f"{method.name}-{backend}-{phase}",
                             ttft=pm if phase == "ttft" else base_method.ttft,
                             tpot=pm if phase == "tpot" else base_method.tpot)
        sub = fit(part, fitted=fitted, source=source, method=sub_method, lomo_bands=lomo_bands)
        for target, own in ((profile, sub), (fallback, sub.get("sweep_fallback") or sub)):
            for key in [k for k in target["slices"] if k.split("/")[1:] == [backend, phase]]:
                del target["slices"][key]
            target["slices"].update({k: v for k, v in own["slices"].items() if k.split("/")[1:] == [backend, phase]})
            target["backend"][f"{backend}/{phase}"] = own["backend"][f"{backend}/{phase}"]
            target["terms"][f"{backend}/{phase}"] = own["terms"][phase]
            target["replay"][f"{backend}/{phase}"] = own["replay"][phase]
    for target in (profile, fallback):
        target["format"] = OVERHEAD_FORMAT if "overhead_ms" in target else PER_BACKEND_FORMAT
        target["slices"] = dict(sorted(target["slices"].items()))
    profile["method"], profile["method_name"] = method.describe(), method.name
    fallback["method"], fallback["method_name"] = method.describe() + " [sweep fallback]", f"{method.name}-sweep"
    profile["rows_used"] = sorted({r["id"] for r in residual_rows(records, method)})
    profile.pop("sweep_fallback", None)
    if needs_client(profile):
        fallback.pop("sweep_fallback", None)
        fallback["replay"] = {k: "sweep" for k in fallback["replay"]}
        profile["sweep_fallback"] = fallback
    return profile


def replay_basis(profile: Mapping[str, Any], phase: str, backend: str | None = None) -> str:
    """Which replay a profile corrects for one phase of a candidate on `backend` (REPLAYS)."""
    replay = profile.get("replay") or {}
    return str(replay.get(f"{backend}/{phase}", replay.get(phase, "sweep")))


def needs_client(profile: Mapping[str, Any], backend: str | None = None) -> bool:
    """Whether a profile corrects the benchmark-client replay in some phase (a sweep then runs it);
    with `backend`: for a candidate on that backend."""
    replay = profile.get("replay") or {}
    if backend is None:
        return any(v == "client" for v in replay.values())
    return any(replay_basis(profile, p, backend) == "client" for p in PHASES)


def _band(res: list[tuple[float, str]], widen: float, bm: BandMethod | None = None) -> list[float]:
    if not res:
        return [-1.0, 1.0]
    lo, hi = pool_band(res, bm or BandMethod())
    return [round(lo * widen, 6), round(hi * widen, 6)]


def _number(v: Any) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def validate(profile: Any) -> dict[str, Any]:
    """Raise ProfileError unless `profile` is a usable profile of a readable format (1, 2 or 3)."""
    if not isinstance(profile, dict):
        raise ProfileError("not a JSON object")
    fmt = profile.get("format")
    if fmt not in READABLE_FORMATS:
        raise ProfileError(f"format {fmt!r} is not one of {list(READABLE_FORMATS)}")
    for key in ("slices", "backend", "phase", "rows_used", "method", "fitted",
                "load_slope" if fmt == 1 else "terms"):
        if key not in profile:
            raise ProfileError(f"missing key {key!r}")
    for section in ("slices", "backend", "phase"):
        for name, entry in profile[section].items():
            f = entry.get("factor") if isinstance(entry, dict) else None
            band = entry.get("band") if isinstance(entry, dict) else None
            if not _number(f) or f <= 0:
                raise ProfileError(f"{section}.{name}.factor must be a positive number, got {f!r}")
            if not isinstance(band, list) or len(band) != 2 or not all(_number(x) for x in band) or band[0] > band[1]:
                raise ProfileError(f"{section}.{name}.band must be [lo, hi] with lo <= hi, got {band!r}")
    if set(profile["phase"]) != set(PHASES):
        raise ProfileError(f"phase must cover {list(PHASES)}")
    replay = profile.get("replay", {})
    if not isinstance(replay, dict) or any(replay.get(p, "sweep") not in REPLAYS for p in PHASES):
        raise ProfileError(f"replay must map phases to one of {list(REPLAYS)}, got {replay!r}")
    overrides = sorted(k for k in (*replay, *(profile["terms"] if fmt != 1 and isinstance(profile["terms"], dict)
                                             else ())) if k not in PHASES)
    for key in overrides:  # "<backend>/<phase>" (format 3 only)
        if fmt not in (PER_BACKEND_FORMAT, MIX_FORMAT, OVERHEAD_FORMAT) or key.count("/") != 1 \
                or key.split("/")[1] not in PHASES:
            raise ProfileError(f"{key!r}: per-backend keys are '<backend>/<phase>' and need format "
                               f"{PER_BACKEND_FORMAT}, {MIX_FORMAT} or {OVERHEAD_FORMAT}")
        if replay.get(key, "sweep") not in REPLAYS:
            raise ProfileError(f"replay.{key} must be one of {list(REPLAYS)}, got {replay[key]!r}")
    mixes = profile.get("client_mix")
    if mixes is not None or fmt == MIX_FORMAT:
        if fmt not in (MIX_FORMAT, OVERHEAD_FORMAT) or not isinstance(mixes, dict) or not mixes:
            raise ProfileError(f"client_mix (a non-empty object) and format {MIX_FORMAT} (or {OVERHEAD_FORMAT}) "
                               "go together")
        for key, mix in mixes.items():
            backend, _, phase = key.partition("/")
            if phase not in PHASES or not backend or replay_basis(profile, phase, backend) != "client":
                raise ProfileError(f"client_mix.{key}: keys are '<backend>/<phase>' of a client-basis phase")
            cap = mix.get("max_passes") if isinstance(mix, dict) else None
            if not isinstance(mix, dict) or not _number(mix.get("weight")) or not 0 <= mix["weight"] <= 1 \
                    or (cap is not None and not _number(cap)) or not _number(mix.get("chunk_tokens", CHUNK_TOKENS)) \
                    or not all(_number(w) and 0 <= w <= 1 for w in (mix.get("above_weight", 0.0),
                                                                    mix.get("native_weight", 0.0))):
                raise ProfileError(f"client_mix.{key} must be {{weight: 0-1, max_passes: number|null, "
                                   f"chunk_tokens, optional above_weight / native_weight: 0-1}}, got {mix!r}")
    overhead = profile.get("overhead_ms")
    if overhead is not None or fmt == OVERHEAD_FORMAT:  # round 18: ms added to the replayed value before the factors
        if fmt != OVERHEAD_FORMAT or not isinstance(overhead, dict) or not overhead:
            raise ProfileError(f"overhead_ms (a non-empty object) and format {OVERHEAD_FORMAT} go together")
        for key, ms in overhead.items():
            backend, _, phase = key.partition("/")
            if phase not in PHASES or not backend or not _number(ms) or ms < 0:
                raise ProfileError(f"overhead_ms.{key}: keys are '<backend>/<phase>', values ms >= 0, got {ms!r}")
    band_method = profile.get("band_method")
    if band_method is not None:  # how the bands were built (provenance; lookups read only the bands)
        if not isinstance(band_method, dict) or set(band_method) != set(PHASES):
            raise ProfileError(f"band_method must map {list(PHASES)} to band methods, got {band_method!r}")
        for phase, bm in band_method.items():
            if not isinstance(bm, dict) or bm.get("level") not in BAND_LEVELS \
                    or not isinstance(bm.get("balanced"), bool) or not _number(bm.get("spread")) or bm["spread"] <= 0:
                raise ProfileError(f"band_method.{phase} must be {{level: one of {list(BAND_LEVELS)}, balanced: "
                                   f"true|false, spread > 0}}, got {bm!r}")
    fixed = profile.get(FIXED_LENGTHS)
    if fixed is not None:  # round 14: the factors for a benchmark client that sends fixed lengths
        if not isinstance(fixed, dict) or FIXED_LENGTHS in fixed:
            raise ProfileError(f"{FIXED_LENGTHS} must be a profile without a {FIXED_LENGTHS} of its own")
        try:
            validate(fixed)
        except ProfileError as exc:
            raise ProfileError(f"{FIXED_LENGTHS}: {exc}") from None
    if needs_client(profile):
        fallback = profile.get("sweep_fallback")
        if not isinstance(fallback, dict):
            raise ProfileError("a profile with a client phase needs 'sweep_fallback' (for sweeps without that replay)")
        try:
            validate(fallback)
        except ProfileError as exc:
            raise ProfileError(f"sweep_fallback: {exc}") from None
        if needs_client(fallback):
            raise ProfileError("sweep_fallback must correct the sweep replay only")
    for phase in (*PHASES, *(k for k in overrides if fmt != 1 and k in profile["terms"])):
        if fmt == 1:
            b = profile["load_slope"].get(phase) if isinstance(profile["load_slope"], dict) else None
            if not _number(b):
                raise ProfileError(f"load_slope.{phase} must be a number, got {b!r}")
            continue
        terms = profile["terms"].get(phase) if isinstance(profile["terms"], dict) else None
        if not isinstance(terms, list):
            raise ProfileError(f"terms.{phase} must be a list")
        for i, t in enumerate(terms):
            if not isinstance(t, dict) or t.get("feature") not in FEATURES or not _number(t.get("coefficient")) \
                    or not _number(t.get("centre")) or not _number(t.get("anchor", 0.0)):
                raise ProfileError(f"terms.{phase}[{i}] must be {{feature: one of {list(FEATURES)}, coefficient, "
                                   f"centre}}, got {t!r}")
    return profile


def fixed_length_backends(profile: Mapping[str, Any]) -> frozenset[str]:
    """The backends a profile has fixed-length factors for: those its FIXED_LENGTHS entry was fitted on."""
    fixed = profile.get(FIXED_LENGTHS) or {}
    return frozenset(key.split("/", 1)[0] for key in fixed.get("backend", {}))


def uses_fixed_lengths(profile: Mapping[str, Any], client_lengths: str | None, backend: str | None) -> bool:
    """Whether a workload whose benchmark client sends `client_lengths` ('spread' or 'fixed', the evaluation
    section) on `backend` is replayed with fixed lengths and corrected by the FIXED_LENGTHS sub-profile: a
    'fixed' client replayed in lockstep is another quantity than the spread replay the main factors correct,
    so only where that sub-profile was fitted on the backend's rows (round 15: SGLang, whose fixed-length
    clients stay in lockstep); elsewhere the main factors on the spread replay."""
    return client_lengths == "fixed" and backend in fixed_length_backends(profile)


def for_client(profile: Mapping[str, Any], client_lengths: str | None, backend: str | None) -> Mapping[str, Any]:
    """The factors for that workload (`uses_fixed_lengths`): the FIXED_LENGTHS sub-profile or the main ones."""
    return profile[FIXED_LENGTHS] if uses_fixed_lengths(profile, client_lengths, backend) else profile


def _factor(profile: Mapping[str, Any], system: str, backend: str, phase: str,
            x: Mapping[str, float]) -> tuple[float, dict[str, Any], str]:
    """(factor, the offset entry, its source) for one phase at the given features."""
    if profile["format"] == 1:  # replay-v1/v2 as they were applied: exp(m) c^b
        log_load = profile["load_slope"][phase] * math.log(2) * x.get(LOAD, 0.0)
    else:
        terms = profile["terms"].get(f"{backend}/{phase}", profile["terms"][phase])  # format 3: the backend's own
        log_load = sum(t["coefficient"] * (x.get(t["feature"], t["centre"]) - t.get("anchor", 0.0)) for t in terms)
    entry = profile["slices"].get(f"{system}/{backend}/{phase}")
    source = "slice"
    if entry is None:
        entry, source = profile["backend"].get(f"{backend}/{phase}"), "backend"
    if entry is None:
        entry, source = profile["phase"][phase], "phase"
    return entry["factor"] * math.exp(log_load), entry, source


def lookup(profile: Mapping[str, Any], system: str, backend: str, phase: str,
           concurrency_per_engine: float | None = None, *, isl: float | None = None,
           osl: float | None = None) -> dict[str, Any]:
    """{factor, band: [lo, hi] (log), rows, source}: the slice, else its backend, else the phase.

    A phase fitted without slices (PhaseMethod.slices False) has its backend level as the offset
    ("offset": true), so its backend band is not widened as a fallback."""
    factor, entry, source = _factor(profile, system, backend, phase, features(concurrency_per_engine, isl, osl))
    if source == "slice" or (source == "backend" and entry.get("offset")):
        return {"factor": factor, "band": list(entry["band"]), "rows": entry["rows"], "source": source}
    lo, hi = entry["band"]
    return {"factor": factor, "band": [lo * FALLBACK_WIDEN, hi * FALLBACK_WIDEN], "rows": 0,
            "source": f"fallback:{source}"}


def calibrate(report: Mapping[str, Any], profile: Mapping[str, Any], *, system: str, backend: str,
              concurrency: Mapping[str, float] | float | None = None, extra_widen: float = 1.0,
              isl: float | None = None, osl: float | None = None, closed_loop: bool = False,
              per_request: list[dict[str, Any]] | None = None,
              sla: Mapping[str, float] | None = None,
              client: Mapping[str, float | None] | None = None,
              prefill_passes: float | None = None, attention_fallback: bool | None = None) -> dict[str, Any]:
    """`calibrated_<key>` for every calibrated key present, the goal metrics at calibrated TTFT/TPOT
    (`_calibrated_goal`), and `band_<phase>_lo/hi` multipliers.

    concurrency: per-engine concurrency, one number or {"ttft": prefill-side, "tpot": decode-side}.
    isl/osl: the workload's mean lengths (read by profiles with ISL/OSL terms).
    A disagg candidate's TTFT is prefill-bound and its TPOT decode-bound; both use the
    (system, backend) slices (the measured rows have no finer split). `extra_widen` > 1 widens the
    bands further (e.g. a fidelity fallback was used for this candidate).
    client: the same candidate's benchmark-client replay, mean {"ttft", "tpot"} (ms). A phase the
    profile fits on that replay ("replay": "client") is calibrated as client value x factor; the
    phase's factor on this report is then that over the report's own mean, so every key of the phase
    and the goal metrics follow it. Without a client value such a phase uses the profile's
    `sweep_fallback` (the same method fitted on the sweep replay). A phase with a `client_mix` entry for
    the backend (format 4) corrects sweep x (client / sweep)^w instead, w from the entry,
    `prefill_passes` (the candidate's first-wave prefill passes, calibration.prefill_passes) and
    `attention_fallback` (its attention timed with bf16 fallback data, attention_fallback; None: unknown).
    A profile with "overhead_ms" (format 5) corrects (replayed + a): the phase's factor on this report is then
    factor x (replayed + a) / the report's own mean (the phase's other keys take that factor too, so their a
    scales with their value: exact for the mean the profile was fitted on, close for medians and percentiles).
    """
    out: dict[str, Any] = {}
    per_phase = concurrency if isinstance(concurrency, Mapping) else {p: concurrency for p in PHASES}
    looked: dict[str, dict[str, Any]] = {}
    for p in PHASES:
        basis = replay_basis(profile, p, backend)
        own = _finite(report.get(f"mean_{p}_ms"))
        seen = _finite((client or {}).get(p))
        corrected, base = profile, own  # the profile whose factors (and overhead) apply, and the value they correct
        if basis == "client" and seen is not None and seen > 0 and own is not None and own > 0:
            info = lookup(profile, system, backend, p, per_phase.get(p), isl=isl, osl=osl)
            mix = (profile.get("client_mix") or {}).get(f"{backend}/{p}")
            w = 1.0 if mix is None else mix_weight(mix, prefill_passes, attention_fallback)
            info = {**info, "factor": info["factor"] * (seen / own) ** w}
            base = own * (seen / own) ** w
            out[f"client_mean_{p}_ms"] = seen
        elif basis == "client":
            corrected = profile["sweep_fallback"]
            info = lookup(corrected, system, backend, p, per_phase.get(p), isl=isl, osl=osl)
            info = {**info, "source": f"sweep_fallback:{info['source']}"}
        else:
            info = lookup(profile, system, backend, p, per_phase.get(p), isl=isl, osl=osl)
        overhead = (corrected.get("overhead_ms") or {}).get(f"{backend}/{p}", 0.0)
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
    out["calibration_fallback"] = float(any(i["source"].removeprefix("sweep_fallback:").startswith("fallback")
                                            for i in looked.values()))
    if needs_client(profile, backend):  # 1: the client replay's means were corrected; 0: the sweep fallback was used
        out["calibration_client_replay"] = float(any(f"client_mean_{p}_ms" in out for p in PHASES))
    out.update(_calibrated_goal(report, out, looked["ttft"]["factor"], looked["tpot"]["factor"],
                                closed_loop=closed_loop, per_request=per_request, sla=sla))
    return out


def _calibrated_goal(report: Mapping[str, Any], calibrated: Mapping[str, Any], f_ttft: float, f_tpot: float, *,
                     closed_loop: bool, per_request: list[dict[str, Any]] | None,
                     sla: Mapping[str, float] | None) -> dict[str, float]:
    """The goal metrics at calibrated TTFT/TPOT, so picks rank on them (search/scoring.ranked_value).

    E2E = TTFT + the decode part: ttft x f_ttft + (e2e - ttft) x f_tpot (its P90 scaled by the same
    ratio). A closed loop's clients send the next request when one completes, so its throughputs
    scale with raw E2E / calibrated E2E; an open loop's arrivals are fixed, so its throughputs stay.
    Goodput: the share of the window's output tokens from requests that meet the SLA with their
    TTFT x f_ttft and ITL x f_tpot (E2E rescaled likewise), times the calibrated output throughput.
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
        share, good = sla_token_share(per_request, start, end, sla, ttft_scale=f_ttft, itl_scale=f_tpot,
                                      e2e_scale=1.0 / ratio)
        out["calibrated_sla_token_share"] = share
        out["calibrated_goodput_completed_requests"] = float(good)
        if "calibrated_output_throughput_tok_s" in out:
            out[f"calibrated_{GOODPUT_KEY}"] = out["calibrated_output_throughput_tok_s"] * share
    return out


def _finite(v: Any) -> float | None:
    return float(v) if _number(v) else None


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
