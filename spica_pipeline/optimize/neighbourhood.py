"""Neighbourhood fill: a cheap, deterministic, model-free designer for the cost-aware study loop.

Why: when replays are cheap, a model-based (GP-UCB-PE) ask never fits the optimizer's share of wall
time (optimize/cost.py), and a quasi-random fill of every ask would ignore every outcome.
This designer uses the outcomes without a model: it proposes unevaluated points one step away from
the best points found so far, and explores with a share of each batch (and the whole batch while no
trial is feasible yet): random points on parallel configs no trial has used, never a look-alike of
a proposed point (the caller fills what it cannot answer quasi-randomly, so a used-up space falls
back to quasi-random).

* Anchors. Pareto goal: the non-dominated front of the feasible trials, the least-explored first
  (fewest one-step neighbours already taken), then by crowding distance. Scalar goal: the feasible
  trials by score, best first (at most MAX_ANCHORS).
* Steps. A knob moves to its next value (discrete: the neighbour in sorted order; categorical: any
  other entry; a float range: 1/8 of the range); the parallel config moves one role by one step:
  replicas +-1, or one engine dimension (tp, pp, attention_dp, moe_tp, moe_ep) x2 or /2, keeping
  the replicas or the role's GPU count. Ring 1 is every point one step away from an anchor, ring 2
  two steps.
* Which anchor steps next: best-first over (anchor, ring) queues, each costing
      ring + GAP_WEIGHT x gap(anchor) + EXPLORED_WEIGHT x (neighbours already taken around it),
  gap in [0, 1]: the score's normalised distance to the best (scalar), or one minus the point's
  share of the front's hypervolume relative to the largest share (two maximised objectives). So
  the incumbent's ring 2 comes before a half-way anchor's ring 1 (an anchor far below the best
  seldom leads to 99 % of it, and with every feasible trial as an anchor, as before, the poorest
  took a turn in each batch), near-equal anchors take turns (each neighbour taken costs 1/8 ring),
  and on a front the points that hold most of the hypervolume are stepped from first (the end of
  a flat tail adds almost none). Within a queue, candidates come in a fixed order shuffled by
  (seed, anchor).
* Inert knobs. A knob no pair of known trials on one parallel config has shown to matter (metrics
  within INERT_TOL of the best known |value| of each metric: the study's scale) counts as inert,
  every value of it; a knob starts inert (the layout decides most: on the benchmark spaces the
  batching knobs move no outcome on most configs) and one pair whose metrics moved clears it for
  good. Points equal to a proposed one but for inert knobs (look-alikes) come after every new
  point, except the best anchor's, which cost INCUMBENT_LOOKALIKE rings more: near the optimum a
  small knob effect can decide it (trace_agg: batched tokens 8192 on the best config, +3 %).
  Own-config probe (scalar goal, while the best config leads every other by > PROBE_LEAD): the
  best anchor's farthest untried value of each inert knob, on its own config, comes at
  INCUMBENT_LOOKALIKE rings more, before any of its look-alikes on other configs (`_probe`).
* Exploration: points drawn uniformly over the encoding (features and knobs, as the quasi-random
  designer spreads them), projected onto the pool, kept only on a config no trial has used (while
  one remains) and never a look-alike. Quasi-random exploration repeated used configs (three of
  the first eight trials on tp4 x1 in one goodput_agg run).

Deterministic: the proposals are a function of the encoding, the seed, the known outcomes (in
trial order) and the taken points, never of timing, so the same seed gives the same ledger.
No Dagster, no I/O: the study loop (optimize/study.py) calls it through the sampler.
"""

import hashlib
import heapq
import math
import random
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spica_pipeline.evaluate.scoring import dominates
from spica_pipeline.optimize.encoding import SearchEncoding
from spica_pipeline.optimize.trial import point_key
from spica_pipeline.space.shapes import SHAPE_KEYS, DisaggShape, ParallelConfig, RoleShape

NEIGHBOURHOOD = "NEIGHBOURHOOD"  # the designer name recorded on the trials it proposed
EXPLORE_SHARE = 0.125  # share of the trials left to quasi-random exploration (one in eight)
FLOAT_STEPS = 8  # a float knob's step: 1/8 of its range
GAP_WEIGHT = 2.0  # an anchor's normalised gap to the best (0-1) costs this many rings
EXPLORED_WEIGHT = 0.125  # each neighbour already taken around an anchor costs 1/8 ring
MAX_ANCHORS = 64  # the best anchors stepped from (bounds an ask's work on long studies)
INERT_TOL = 2e-3  # a knob's effect this small, relative to the best |value| of each metric, counts as none
INCUMBENT_LOOKALIKE = 1.0  # the best anchor's look-alikes cost this many rings more (every other one waits)
# Own-config probe (docs/performance.md, "own-config probe"): the best anchor's untried values of its inert
# knobs on its own parallel config form one queue of their own, at ring 1 + PROBE_EXTRA, ahead of its
# look-alikes on other configs (likely known outcomes again: the knob was inert there): per knob only
# its farthest value within two steps (an end of its range: from 32768 batched tokens 8192, from
# 16384 both ends), one knob moved at a time, scalar goals only. Why: a knob inert on the configs
# tried so far can still matter on the best config, and its look-alikes elsewhere mostly repeat
# known outcomes. In simulated studies the probe reaches 99 % of the optimum sooner on trace_agg and
# leaves the other scalar spaces about even; on pareto_disagg it moves seeds both ways with no net
# gain, so a Pareto goal does not probe.
PROBE_EXTRA = 1.0  # the probe queue's extra cost in rings (1.0: as the best anchor's look-alikes)
# scalar goal: probe only while the best config leads the best trial on any other config by more than
# this share of its score (goodput_agg: configs within 0.2 % of each other, the optimum on another
# one; trace_agg: the best config 0.97 of the optimum, every other <= 0.72). 0.02, 0.05 and 0.10
# gave the same 60 dev-seed counts.
PROBE_LEAD = 0.05
EXPLORE_TRIES = 8  # draws per exploration point before giving up (the caller fills the rest quasi-randomly)
# A model-based ask (GP-UCB-PE) that proposes a look-alike of a proposed point (equal but for knobs
# this designer believes inert: likely a known outcome again; common on pareto_disagg) has each
# look-alike swapped in place for one of this designer's points, the model's other suggestions kept
# (StudySampler._route_look_alikes in optimize/branch_plan.py): no evaluation goes to a likely repeat,
# and the model's informative suggestions still run. In simulated pareto_disagg studies this reaches
# 99 % of the optimum sooner than keeping the ask as is, handing the whole ask to this designer or
# dropping the look-alikes (docs/performance.md); the other spaces are unchanged.
# While the model has too few feasible trials it answers with a quasi-random seed batch; True hands
# that batch to this designer (its exploration: unused configs, no look-alikes). Why: with the
# suggest costs of optimize/cost.py a model-based ask fits early on the trace spaces and
# pareto_disagg, and a quasi-random seed batch there would take the place of this designer's
# exploration; in simulated studies the hand-over reaches 99 % of the optimum sooner on those spaces
# and removes the slowest seeds (docs/performance.md), the other spaces unchanged.
SEED_BATCH_TO_LOCAL = True

# One trial the designer learns from: (selection, parallel config, told metrics or None).
Known = tuple[dict[str, Any], ParallelConfig, Mapping[str, float] | None]
PointKey = tuple[str, ParallelConfig]


def _log_steps(a: int, b: int) -> float:
    return abs(math.log2(max(1, a)) - math.log2(max(1, b)))


def role_steps(a: RoleShape, b: RoleShape) -> float:
    """Steps between two layouts of one role: x2 / /2 per engine dimension, plus replicas +-1
    unless the engine changed and the role kept its GPU count (tp2 x3 -> tp1 x6 is one step)."""
    engine = sum(_log_steps(getattr(a, k), getattr(b, k)) for k in SHAPE_KEYS)
    if engine > 0 and a.used_gpus == b.used_gpus:
        return engine
    return engine + abs(a.replicas - b.replicas)


def config_steps(a: ParallelConfig, b: ParallelConfig) -> float:
    if isinstance(a, DisaggShape) and isinstance(b, DisaggShape):
        return role_steps(a.prefill, b.prefill) + role_steps(a.decode, b.decode)
    if isinstance(a, RoleShape) and isinstance(b, RoleShape):
        return role_steps(a, b)
    return math.inf


def crowding(values: Sequence[Sequence[float]]) -> list[float]:
    """NSGA-II crowding distance of each point of a front (inf at each objective's ends)."""
    n = len(values)
    out = [0.0] * n
    if n <= 2:
        return [math.inf] * n
    for m in range(len(values[0])):
        order = sorted(range(n), key=lambda i: (values[i][m], i))
        lo, hi = values[order[0]][m], values[order[-1]][m]
        out[order[0]] = out[order[-1]] = math.inf
        if hi <= lo:
            continue
        for j in range(1, n - 1):
            out[order[j]] += (values[order[j + 1]][m] - values[order[j - 1]][m]) / (hi - lo)
    return out


def hv_contributions(values: Sequence[Sequence[float]]) -> list[float]:
    """Each point's exclusive share of a two-objective front's hypervolume (both maximised, from
    the origin): the area only it dominates."""
    n = len(values)
    order = sorted(range(n), key=lambda i: (values[i][0], -values[i][1], i))
    out = [0.0] * n
    for pos, i in enumerate(order):
        x_prev = values[order[pos - 1]][0] if pos > 0 else 0.0
        y_next = values[order[pos + 1]][1] if pos + 1 < n else 0.0
        out[i] = max(0.0, values[i][0] - x_prev) * max(0.0, values[i][1] - y_next)
    return out


@dataclass(frozen=True)
class _Candidate:
    key: PointKey
    parameters: dict[str, Any]
    selection: dict[str, Any]


_Row = tuple[dict[str, Any], ParallelConfig, tuple[float, ...]]  # a feasible trial: selection, config, metrics


class NeighbourhoodDesigner:
    """Proposes unevaluated neighbours of the best trials (module docstring). `metrics`: the
    study's (name, 'max'|'min') pairs; one pair is a scalar goal, more a Pareto goal."""

    name = NEIGHBOURHOOD

    def __init__(self, encoding: SearchEncoding, metrics: Sequence[tuple[str, str]], *, seed: int,
                 explore_share: float = EXPLORE_SHARE, gap_weight: float = GAP_WEIGHT,
                 explored_weight: float = EXPLORED_WEIGHT):
        if not metrics:
            raise ValueError("the neighbourhood designer needs at least one metric")
        self.encoding = encoding
        self.metrics = [(str(n), str(d)) for n, d in metrics]
        self.seed = int(seed)
        self.explore_share = explore_share
        self.gap_weight = gap_weight
        self.explored_weight = explored_weight
        self._adjacent: dict[ParallelConfig, list[tuple[float, ParallelConfig]]] = {}
        self._rings: dict[tuple[PointKey, int], list[_Candidate]] = {}
        # point keys of the trials the study hands in, by dict identity (see `_key`)
        self._keys: dict[int, tuple[dict[str, Any], ParallelConfig, PointKey]] = {}
        self._reduced_keys: dict[int, tuple[dict[str, Any], ParallelConfig, frozenset[str], PointKey]] = {}
        # the last call's known trials and rows (`_rows`), and rows, tolerances, rows per config
        # and knobs shown to matter (`inert_knobs`): both extended, never recomputed, on a longer ask
        self._rows_cache: tuple[list[Known], list[_Row], set[PointKey]] = ([], [], set())
        self._inert_cache: tuple[list[_Row], list[float], dict[ParallelConfig, list[_Row]], set[str]] = (
            [], [], {}, set())

    # ----- the ask ---------------------------------------------------------------------------
    def local_count(self, count: int, position: int = 0) -> int:
        """How many of a batch of `count` trials starting at trial `position` of the branch go to
        neighbours; the rest, `explore_share` of the trials counted over the whole branch (so a
        share below 1 / batch still explores every few batches), to exploration (`_explore`)."""
        explore = math.floor((position + count) * self.explore_share + 1e-9) - math.floor(
            position * self.explore_share + 1e-9)
        return max(0, count - explore)

    def suggest(self, count: int, known: Sequence[Known], pending: Sequence[tuple[dict[str, Any], ParallelConfig]],
                taken: Collection[PointKey]) -> list[dict[str, Any]]:
        """Up to `count` parameter dicts of points not in `taken`: `local_count(count)` neighbours
        (none while no trial is feasible), then exploration points for the rest (fewer when the
        space has no unused config and no point unlike every proposed one). `known`: the trials
        whose outcomes the ask may use, in trial order; `pending`: the trials proposed since."""
        position = len(known) + len(pending)
        want = self.local_count(count, position)
        rows = self._rows(known)
        anchors = self._anchors(rows)
        inert = self.inert_knobs(rows)
        used = set(taken)
        # points equal to a proposed one but for inert knobs: likely a known outcome again
        alike = {self._reduced_trial(sel, cfg, inert) for sel, cfg, _ in known}
        alike |= {self._reduced_trial(sel, cfg, inert) for sel, cfg in pending}
        out = self._local(want, rows, anchors, inert, used, alike) if want > 0 and anchors else []
        visited = {cfg for _, cfg in used} | {cfg for _, cfg, _ in known} | {cfg for _, cfg in pending}
        return out + self._explore(count - len(out), position, inert, used, alike, visited)

    def look_alikes(self, suggested: Sequence[tuple[dict[str, Any], ParallelConfig]], known: Sequence[Known],
                    pending: Sequence[tuple[dict[str, Any], ParallelConfig]]) -> list[bool]:
        """For each suggested point (another designer's batch, in order): whether it is a look-alike
        of a known or pending trial or of an earlier point of the batch, equal to it but for knobs
        this designer believes inert (`inert_knobs`), so likely a known outcome again."""
        inert = self.inert_knobs(self._rows(known))
        alike = {self._reduced_trial(sel, cfg, inert) for sel, cfg, _ in known}
        alike |= {self._reduced_trial(sel, cfg, inert) for sel, cfg in pending}
        out: list[bool] = []
        for sel, cfg in suggested:
            reduced = self._reduced(sel, cfg, inert)
            out.append(reduced in alike)
            alike.add(reduced)
        return out

    def _local(self, want: int, rows: list[_Row], anchors: list[tuple[dict[str, Any], ParallelConfig]],
               inert: frozenset[str], used: set[PointKey], alike: set[PointKey]) -> list[dict[str, Any]]:
        """Up to `want` unevaluated neighbours of the anchors, best-first (module docstring)."""
        gaps = self._gaps(rows, anchors)
        ordered = self._order(anchors, used)[:MAX_ANCHORS]
        explored = [-1] * len(ordered)  # counted when the anchor's turn first comes (-1: not yet)
        gap = [gaps[self._key(*a)] for a in ordered]
        # one queue per (anchor, tier); the cheapest queue gives the next candidate (module docstring)
        heap: list[tuple[int, float, int, int]] = []
        queues: dict[tuple[int, int], Iterator[_Candidate]] = {}
        # the best anchor's look-alikes (its untried knob values) mix in at a cost, so the knobs get
        # tried where they could still matter; every other look-alike waits for every new point
        top = min(range(len(ordered)), key=lambda j: (gap[j], j))
        for i, anchor in enumerate(ordered):
            tiers: tuple[int, ...] = (1, 2, 3, 4)  # rings 1, 2 of new points; then rings 1, 2 of look-alikes
            if i == top and self._leads(rows, anchor[1]):
                tiers = (0,) + tiers  # tier 0: the own-config probe (`_probe`)
            for tier in tiers:
                queues[(i, tier)] = (self._probe(anchor, inert, alike, used) if tier == 0
                                     else self._tier(anchor, tier, inert, alike, used))
                heap.append((tier > 2 and i != top, self._priority(tier, gap[i], explored[i], i == top), i, tier))
        heapq.heapify(heap)
        out: list[dict[str, Any]] = []
        while heap and len(out) < want:
            late, key, i, tier = heapq.heappop(heap)
            if explored[i] < 0:
                explored[i] = self._explored(ordered[i], used)
            now = self._priority(tier, gap[i], explored[i], i == top)
            if now > key + 1e-12:  # the anchor was stepped from since: re-queue at its new cost
                heapq.heappush(heap, (late, now, i, tier))
                continue
            cand = next(queues[(i, tier)], None)
            if cand is None:
                continue
            used.add(cand.key)
            alike.add(self._reduced(cand.selection, cand.key[1], inert))
            out.append(cand.parameters)
            explored[i] += 1
            heapq.heappush(heap, (late, self._priority(tier, gap[i], explored[i], i == top), i, tier))
        return out

    def _priority(self, tier: int, gap: float, explored: int, top: bool = False) -> float:
        """A queue's cost: its ring, plus the anchor's score gap to the best (0 best, 1 worst,
        x gap_weight), plus explored_weight per neighbour already taken around the anchor; the
        incumbent's look-alike tiers also INCUMBENT_LOOKALIKE, its own-config probe (tier 0) ring 1
        plus PROBE_EXTRA."""
        if tier == 0:
            return 1.0 + PROBE_EXTRA + self.gap_weight * gap + self.explored_weight * max(0, explored)
        ring = tier if tier <= 2 else tier - 2
        extra = INCUMBENT_LOOKALIKE if (top and tier > 2) else 0.0
        return ring + extra + self.gap_weight * gap + self.explored_weight * max(0, explored)

    def _explore(self, count: int, position: int, inert: frozenset[str], used: set[PointKey],
                 alike: set[PointKey], visited: set[ParallelConfig]) -> list[dict[str, Any]]:
        """Up to `count` exploration points, drawn uniformly over the encoding (the optimizer's own
        parameters: structural features and knobs) and projected onto the pool like a suggestion,
        kept only on a parallel config no trial has used (while one remains) and never a taken
        point or a look-alike of a proposed one. Seeded by (seed, position). Quasi-random
        exploration, unaware of what was proposed, lands on a used config again and again (three
        of the first eight trials on tp4 x1 in one goodput_agg run) and re-tries its knobs."""
        enc = self.encoding
        if count <= 0:
            return []
        rng = random.Random(int.from_bytes(hashlib.sha256(f"{self.seed}:explore:{position}".encode()).digest()[:8],
                                           "big"))
        fresh = set(enc.parallel_configs) - visited
        out: list[dict[str, Any]] = []
        budget = EXPLORE_TRIES * count
        for attempt in range(2 * budget):
            if len(out) >= count:
                break
            try:
                sel, requested = enc.decode(self._random_params(rng))
                cfg = enc.project(sel, requested).config
                params = enc.encode(sel, cfg)
            except ValueError:
                continue
            if fresh and cfg not in fresh and attempt < budget:  # a used config: draw again (for a while)
                continue
            if not enc.supports(sel, cfg):  # only a one-config pool (a strict pin) can miss
                continue
            key = point_key(sel, cfg)
            reduced = self._reduced(sel, cfg, inert)
            if key in used or reduced in alike:
                continue
            used.add(key)
            alike.add(reduced)
            fresh.discard(cfg)
            out.append(params)
        return out

    def _random_params(self, rng: random.Random) -> dict[str, Any]:
        """Optimizer parameters drawn uniformly over the encoding (features and knobs)."""
        out: dict[str, Any] = {}
        for p in self.encoding.params:
            if p.role == "internal":
                out[p.name] = "0"
            elif p.kind == "double" and p.bounds is not None:
                out[p.name] = rng.uniform(*p.bounds)
            elif p.values:
                out[p.name] = p.values[rng.randrange(len(p.values))]
        return out

    def _gaps(self, rows: list[_Row], anchors: list[tuple[dict[str, Any], ParallelConfig]]) -> dict[PointKey, float]:
        """Each anchor's normalised gap, 0 (best) to 1 (worst). Scalar goal: its score's gap to the
        best feasible trial over the spread of the feasible scores. Two maximised objectives: one
        minus its exclusive hypervolume contribution over the front's largest (a front point that
        adds almost no area, like the end of a flat tail, is almost the worst anchor); other Pareto
        goals: 0 (every front point alike)."""
        keys = [self._key(a[0], a[1]) for a in anchors]
        if len(self.metrics) == 2 and all(d == "max" for _, d in self.metrics) and rows:
            vectors = {self._key(r[0], r[1]): r[2] for r in rows}
            contrib = hv_contributions([vectors[k] for k in keys])
            top = max(contrib, default=0.0)
            return {k: (1.0 - c / top if top > 0 else 0.0) for k, c in zip(keys, contrib)}
        if len(self.metrics) > 1 or not rows:
            return dict.fromkeys(keys, 0.0)
        sign = 1.0 if self.metrics[0][1] == "max" else -1.0
        value = {self._key(r[0], r[1]): sign * r[2][0] for r in rows}
        hi, lo = max(value.values()), min(value.values())
        span = hi - lo
        return {k: ((hi - value[k]) / span if span > 0 else 0.0) for k in keys}

    def _explored(self, anchor: tuple[dict[str, Any], ParallelConfig], used: set[PointKey]) -> int:
        """How many of the anchor's ring-1 and ring-2 points are taken already."""
        return sum(1 for ring in (1, 2) for c in self._candidates(anchor, ring) if c.key in used)

    def _key(self, selection: dict[str, Any], config: ParallelConfig) -> PointKey:
        """`point_key` of a trial the study handed in, memoised by the selection dict's identity
        (the study passes the same trial dicts on every ask, and a trial's selection never changes
        once proposed). Serialising every known trial again on each ask would make a long sweep's
        asks quadratic in its trials: at thousands of trials it is most of an ask's time."""
        hit = self._keys.get(id(selection))
        if hit is not None and hit[0] is selection and hit[1] == config:
            return hit[2]
        key = point_key(selection, config)
        self._keys[id(selection)] = (selection, config, key)  # holding the dict keeps its id unique
        return key

    def _reduced_trial(self, selection: dict[str, Any], config: ParallelConfig, inert: frozenset[str]) -> PointKey:
        """`_reduced` of a trial the study handed in, memoised like `_key` (per inert set)."""
        hit = self._reduced_keys.get(id(selection))
        if hit is not None and hit[0] is selection and hit[1] == config and hit[2] == inert:
            return hit[3]
        key = self._reduced(selection, config, inert)
        self._reduced_keys[id(selection)] = (selection, config, inert, key)
        return key

    @staticmethod
    def _reduced(selection: Mapping[str, Any], config: ParallelConfig, inert: Collection[str]) -> PointKey:
        """The point with every inert knob made one value (its look-alikes share this key)."""
        return point_key({k: ("~inert" if k in inert else v) for k, v in selection.items()}, config)

    # ----- anchors ---------------------------------------------------------------------------
    def anchors(self, known: Sequence[Known]) -> list[tuple[dict[str, Any], ParallelConfig]]:
        """The points to step from, in priority order (see the module docstring)."""
        return self._anchors(self._rows(known))

    def _rows(self, known: Sequence[Known]) -> list[_Row]:
        """The feasible known trials with every metric finite, one per point, in trial order.

        Incremental: the study hands in the same trials in the same order on every ask, one ask
        more each time, so the rows of a prefix identical to the last call's (checked entry by
        entry, by identity) are kept and only the new trials are read."""
        done, rows, seen = self._rows_cache
        if len(known) >= len(done) and all(a[0] is b[0] and a[1] is b[1] and a[2] is b[2]
                                           for a, b in zip(known, done)):
            start = len(done)
        else:
            start, rows, seen = 0, [], set()
        names = [n for n, _ in self.metrics]
        for selection, config, metrics in known[start:]:
            if not metrics:
                continue
            values = [metrics.get(n) for n in names]
            if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
                continue
            key = self._key(selection, config)
            if key in seen:
                continue
            seen.add(key)
            rows.append((selection, config, tuple(float(v) for v in values)))  # type: ignore[arg-type]
        self._rows_cache = (list(known), rows, seen)
        return list(rows)

    def _anchors(self, rows: list[_Row]) -> list[tuple[dict[str, Any], ParallelConfig]]:
        dirs = [d for _, d in self.metrics]
        if len(self.metrics) == 1:
            sign = 1.0 if dirs[0] == "max" else -1.0
            order = sorted(range(len(rows)), key=lambda i: (-sign * rows[i][2][0], i))
            return [(rows[i][0], rows[i][1]) for i in order]
        front = [i for i, r in enumerate(rows) if not any(dominates(o[2], r[2], dirs) for o in rows)]
        dist = crowding([rows[i][2] for i in front])
        ranked = sorted(range(len(front)), key=lambda j: (-dist[j], front[j]))
        return [(rows[front[j]][0], rows[front[j]][1]) for j in ranked]

    def _order(self, anchors: list[tuple[dict[str, Any], ParallelConfig]], used: set[PointKey]):
        """Pareto: the least-explored anchors first (stable: the crowding order breaks ties), so
        every part of the front gets its turn; scalar: best first, as given."""
        if len(self.metrics) == 1:
            return anchors
        explored = [sum(1 for c in self._candidates(a, 1) if c.key in used) for a in anchors]
        order = sorted(range(len(anchors)), key=lambda i: (explored[i], i))
        return [anchors[i] for i in order]

    def inert_knobs(self, rows: list[_Row]) -> frozenset[str]:
        """Knobs not shown to matter so far: no pair of known trials on the same parallel config
        that differ in the knob (other knobs may differ too) gave metrics further apart than
        INERT_TOL x that metric's largest |value| among the known trials. The scale is the
        study's, not the pair's: a knob that moves a poor config's goodput from 11.84 to 11.75
        when the best known is 470 changed nothing that could decide where 99 % of the optimum is.
        A knob starts inert (the prior: the layout decides most; on every benchmark space the
        batching knobs move no outcome on most configs) and is cleared for good by one pair whose
        metrics moved. Moves of inert knobs make look-alikes: stepped from the best anchor at
        INCUMBENT_LOOKALIKE rings more (where a small effect could still decide the optimum, as
        batched tokens 8192 vs 16384 on trace_agg's best config, +3 %), from any other anchor
        only after every new point."""
        knobs = [p.name for p in self.encoding.params if p.role in ("knob", "float")]
        scale = [max((abs(r[2][m]) for r in rows), default=0.0) for m in range(len(self.metrics))]
        tol = [INERT_TOL * max(s, 1e-12) for s in scale]
        # incremental, like `_rows`: while the tolerances are unchanged, the pairs of an identical
        # row prefix were judged already; only pairs with a new row are (a union: order-free)
        done, done_tol, by_config, changed = self._inert_cache
        if done_tol == tol and len(rows) >= len(done) and all(a is b for a, b in zip(rows, done)):
            start = len(done)
        else:
            start, by_config, changed = 0, {}, set()
        for row in rows[start:]:
            sb, config, vb = row
            members = by_config.setdefault(config, [])
            if len(changed) < len(knobs):  # else every knob matters: nothing left to learn
                for sa, _, va in members:
                    new = [k for k in knobs if k not in changed and sa.get(k) != sb.get(k)]
                    if new and any(abs(x - y) > t for x, y, t in zip(va, vb, tol)):
                        changed.update(new)
            members.append(row)
        self._inert_cache = (list(rows), tol, by_config, changed)
        return frozenset(k for k in knobs if k not in changed)

    # ----- neighbours ------------------------------------------------------------------------
    def _tier(self, anchor: tuple[dict[str, Any], ParallelConfig], tier: int, inert: frozenset[str],
              alike: set[PointKey], used: set[PointKey]) -> Iterator[_Candidate]:
        """Tier 1-2: ring 1-2 points unlike any proposed one; tier 3-4: ring 1-2 look-alikes
        (equal to a proposed point but for inert knobs). Checked lazily: `used` and `alike` grow
        while the batch fills."""
        ring, look_alike = (tier, False) if tier <= 2 else (tier - 2, True)
        for cand in self._candidates(anchor, ring):
            if cand.key in used:
                continue
            if (self._reduced(cand.selection, cand.key[1], inert) in alike) == look_alike:
                yield cand

    def _leads(self, rows: list[_Row], config: ParallelConfig) -> bool:
        """Whether the best anchor's config leads the best trial on any other config by more than
        PROBE_LEAD of its |score| (scalar goal; a Pareto goal never probes)."""
        if len(self.metrics) != 1:
            return False
        if PROBE_LEAD <= 0 or not rows:
            return True
        sign = 1.0 if self.metrics[0][1] == "max" else -1.0
        best = max(sign * r[2][0] for r in rows if r[1] is config or r[1] == config)
        other = max((sign * r[2][0] for r in rows if not (r[1] is config or r[1] == config)), default=-math.inf)
        return best - other > PROBE_LEAD * abs(best)

    def _probe(self, anchor: tuple[dict[str, Any], ParallelConfig], inert: frozenset[str],
               alike: set[PointKey], used: set[PointKey]) -> Iterator[_Candidate]:
        """The own-config probe: the anchor's look-alikes on its own parallel config (untried values
        of knobs believed inert), per knob only its farthest value within two steps (an end of its
        range), one knob moved at a time. A knob counts as inert until a pair on one config shows it
        matters, and the only pair that could show it may be the one that holds the optimum
        (trace_agg: batched tokens 8192 on the best config, +3 %, while 16384 and 32768 tie); the
        same values on other configs are likely known outcomes again. Checked lazily, as `_tier`."""
        selection, config = anchor
        rings = [(ring, c) for ring in (1, 2) for c in self._candidates(anchor, ring) if c.key[1] == config]

        def moved(c: _Candidate) -> list[str]:
            return [k for k, v in c.selection.items() if selection.get(k) != v]

        ones = [(ring, c, moved(c)[0]) for ring, c in rings if len(moved(c)) == 1]
        far = {k: max(r for r, _, kk in ones if kk == k) for _, _, k in ones}
        own = [c for r, c, k in ones if r == far[k]]
        for cand in own:
            if cand.key in used:
                continue
            if self._reduced(cand.selection, config, inert) in alike:
                yield cand

    def _candidates(self, anchor: tuple[dict[str, Any], ParallelConfig], ring: int) -> list[_Candidate]:
        """Every legal point exactly `ring` steps from `anchor`, in a fixed (seed, anchor) order
        (memoised: an anchor's rings never change)."""
        selection, config = anchor
        memo = (point_key(selection, config), ring)
        hit = self._rings.get(memo)
        if hit is not None:
            return hit
        enc = self.encoding
        knob_moves = self._knob_moves(enc.encode(selection, config))  # (steps, {param: raw value})
        out: list[_Candidate] = []
        seen: set[PointKey] = set()
        for c_steps, cfg in [(0.0, config)] + self._adjacent_configs(config):
            encoded = enc.encode(selection, cfg)
            for k_steps, change in [(0.0, {})] + knob_moves:
                if abs(c_steps + k_steps - ring) > 1e-9:
                    continue
                params = {**encoded, **change}
                try:
                    sel, _ = enc.decode(params)
                except ValueError:
                    continue
                if not enc.supports(sel, cfg):
                    continue
                key = point_key(sel, cfg)
                if key in seen:
                    continue
                seen.add(key)
                out.append(_Candidate(key, params, sel))
        tag = f"{self.seed}:{ring}:{point_key(selection, config)[0]}:{sorted(config.to_dict().items())}"
        rng = random.Random(int.from_bytes(hashlib.sha256(tag.encode()).digest()[:8], "big"))
        rng.shuffle(out)
        self._rings[memo] = out
        return out

    def _adjacent_configs(self, config: ParallelConfig) -> list[tuple[float, ParallelConfig]]:
        """Pool configs one or two steps away, in pool order (memoised per config)."""
        hit = self._adjacent.get(config)
        if hit is None:
            hit = []
            for other in self.encoding.parallel_configs:
                if other == config:
                    continue
                steps = config_steps(config, other)
                if steps <= 2 + 1e-9:
                    hit.append((float(round(steps)) if abs(steps - round(steps)) < 1e-9 else steps, other))
            self._adjacent[config] = hit
        return hit

    def _knob_moves(self, base: Mapping[str, Any]) -> list[tuple[float, dict[str, Any]]]:
        """One-knob moves (1 step each) and two-knob / two-step moves (2 steps) from `base`."""
        singles: list[tuple[str, float, Any]] = []  # (param, steps, raw value)
        for p in self.encoding.params:
            if p.role not in ("knob", "float") or p.name not in base:
                continue
            raw = base[p.name]
            if p.kind == "discrete":
                values = list(p.values)
                i = min(range(len(values)), key=lambda j: abs(values[j] - float(raw)))
                for j in (i - 2, i - 1, i + 1, i + 2):
                    if 0 <= j < len(values):
                        singles.append((p.name, float(abs(j - i)), values[j]))
            elif p.kind == "categorical":
                singles.extend((p.name, 1.0, v) for v in p.values if v != raw)
            elif p.bounds is not None:
                lo, hi = p.bounds
                step = (hi - lo) / FLOAT_STEPS
                for k in (-2, -1, 1, 2):
                    v = float(raw) + k * step
                    if lo - 1e-12 <= v <= hi + 1e-12:
                        singles.append((p.name, float(abs(k)), min(max(v, lo), hi)))
        moves: list[tuple[float, dict[str, Any]]] = [(s, {n: v}) for n, s, v in singles]
        ones = [(n, v) for n, s, v in singles if s == 1.0]
        for i, (n1, v1) in enumerate(ones):
            for n2, v2 in ones[i + 1:]:
                if n1 != n2:
                    moves.append((2.0, {n1: v1, n2: v2}))
        return moves


__all__ = ["EXPLORE_SHARE", "NEIGHBOURHOOD", "Known", "NeighbourhoodDesigner", "config_steps", "crowding",
           "role_steps"]
