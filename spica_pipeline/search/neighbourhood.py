"""Neighbourhood fill: a cheap, deterministic, model-free designer for the cost-aware study loop.

Why: when replays are cheap, a model-based (GP-UCB-PE) ask never fits the optimizer's share of wall
time (search/cost.py), so every ask used to be filled quasi-randomly, which ignores every outcome.
This designer uses the outcomes without a model: it proposes unevaluated points one step away from
the best points found so far, and leaves a share of each batch to quasi-random exploration (the
caller fills the rest of the batch, so a space whose neighbourhoods are exhausted falls back to
quasi-random).

* Anchors. Pareto goal: the non-dominated front of the feasible trials, the least-explored first
  (fewest one-step neighbours already taken), then by crowding distance (the front's ends and its
  sparse parts first), so the whole front moves. Scalar goal: the feasible trials by score, best
  first (a beam: the incumbent and the runners-up step in turn, so a plateau of near-equal
  points is left along several paths at once).
* Steps. A knob moves to its next value (discrete: the neighbour in sorted order; categorical: any
  other entry; a float range: 1/8 of the range); the parallel config moves one role by one step:
  replicas +-1, or one engine dimension (tp, pp, attention_dp, moe_tp, moe_ep) x2 or /2, keeping
  the replicas or the role's GPU count. Ring 1 is every point one step away from an anchor, ring 2
  two steps; ring 2 is used only when ring 1 of every anchor is taken.
* Within a ring, an anchor's candidates come in a fixed order shuffled by (seed, anchor), and the
  anchors take turns, one candidate each.
* Inert knobs. A knob that has changed no outcome so far (every pair of known trials on one
  parallel config that differ in it gave the same metrics) is likely to change none: points equal
  to a proposed one but for inert knobs come after every new point (rings 1-2 again).

Deterministic: the proposals are a function of the encoding, the seed, the known outcomes (in
trial order) and the taken points, never of timing, so the same seed gives the same ledger.
No Dagster, no I/O: the study loop (search/study.py) calls it through the sampler.
"""

import hashlib
import math
import random
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spica_pipeline.search.encoding import SearchEncoding
from spica_pipeline.search.scoring import dominates
from spica_pipeline.search.shapes import SHAPE_KEYS, DisaggShape, ParallelConfig, RoleShape
from spica_pipeline.search.study import point_key

NEIGHBOURHOOD = "NEIGHBOURHOOD"  # the designer name recorded on the trials it proposed
EXPLORE_SHARE = 0.125  # share of the trials left to quasi-random exploration (one in eight)
FLOAT_STEPS = 8  # a float knob's step: 1/8 of its range
INERT_TOL = 1e-3  # relative: metrics this close count as unchanged (a knob that did nothing)

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
                 explore_share: float = EXPLORE_SHARE):
        if not metrics:
            raise ValueError("the neighbourhood designer needs at least one metric")
        self.encoding = encoding
        self.metrics = [(str(n), str(d)) for n, d in metrics]
        self.seed = int(seed)
        self.explore_share = explore_share
        self._adjacent: dict[ParallelConfig, list[tuple[float, ParallelConfig]]] = {}
        self._rings: dict[tuple[PointKey, int], list[_Candidate]] = {}

    # ----- the ask ---------------------------------------------------------------------------
    def local_count(self, count: int, position: int = 0) -> int:
        """How many of a batch of `count` trials starting at trial `position` of the branch go to
        neighbours; the rest, `explore_share` of the trials counted over the whole branch (so a
        share below 1 / batch still explores every few batches), to quasi-random exploration."""
        explore = math.floor((position + count) * self.explore_share + 1e-9) - math.floor(
            position * self.explore_share + 1e-9)
        return max(0, count - explore)

    def suggest(self, count: int, known: Sequence[Known], pending: Sequence[tuple[dict[str, Any], ParallelConfig]],
                taken: Collection[PointKey]) -> list[dict[str, Any]]:
        """Up to `local_count(count)` parameter dicts of points not in `taken` (fewer, or none,
        when no trial is feasible yet or every neighbourhood is used up). `known`: the trials
        whose outcomes the ask may use, in trial order; `pending`: the trials proposed since."""
        want = self.local_count(count, len(known) + len(pending))
        rows = self._rows(known)
        anchors = self._anchors(rows)
        if want <= 0 or not anchors:
            return []
        inert = self.inert_knobs(rows)
        used = set(taken)
        # points equal to a proposed one but for inert knobs: likely a known outcome again
        alike = {self._reduced(sel, cfg, inert) for sel, cfg, _ in known}
        alike |= {self._reduced(sel, cfg, inert) for sel, cfg in pending}
        out: list[dict[str, Any]] = []
        for tier in (1, 2, 3, 4):  # rings 1, 2 of new points; then rings 1, 2 of look-alikes
            queues = [self._tier(anchor, tier, inert, alike, used) for anchor in self._order(anchors, used)]
            while queues and len(out) < want:
                alive = []
                for queue in queues:
                    cand = next(queue, None)
                    if cand is None:
                        continue
                    alive.append(queue)
                    used.add(cand.key)
                    alike.add(self._reduced(cand.selection, cand.key[1], inert))
                    out.append(cand.parameters)
                    if len(out) == want:
                        return out
                queues = alive
        return out

    @staticmethod
    def _reduced(selection: Mapping[str, Any], config: ParallelConfig, inert: frozenset[str]) -> PointKey:
        return point_key({k: v for k, v in selection.items() if k not in inert}, config)

    # ----- anchors ---------------------------------------------------------------------------
    def anchors(self, known: Sequence[Known]) -> list[tuple[dict[str, Any], ParallelConfig]]:
        """The points to step from, in priority order (see the module docstring)."""
        return self._anchors(self._rows(known))

    def _rows(self, known: Sequence[Known]) -> list[_Row]:
        """The feasible known trials with every metric finite, one per point, in trial order."""
        names = [n for n, _ in self.metrics]
        rows: list[_Row] = []
        seen: set[PointKey] = set()
        for selection, config, metrics in known:
            if not metrics:
                continue
            values = [metrics.get(n) for n in names]
            if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
                continue
            key = point_key(selection, config)
            if key in seen:
                continue
            seen.add(key)
            rows.append((selection, config, tuple(float(v) for v in values)))  # type: ignore[arg-type]
        return rows

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
        """Knobs that have changed nothing so far: every pair of known trials on the same parallel
        config that differ in that knob (other knobs may differ too) gave the same metrics (within
        INERT_TOL), and there is at least one such pair. Conservative: a pair whose metrics
        changed clears every knob it differs in. Their moves go last: stepping them again would
        likely repeat a known outcome."""
        knobs = [p.name for p in self.encoding.params if p.role in ("knob", "float")]
        by_config: dict[ParallelConfig, list[_Row]] = {}
        for row in rows:
            by_config.setdefault(row[1], []).append(row)
        seen: set[str] = set()
        changed: set[str] = set()
        for members in by_config.values():
            for i, (sa, _, va) in enumerate(members):
                for sb, _, vb in members[i + 1:]:
                    differ = {k for k in knobs if sa.get(k) != sb.get(k)}
                    seen |= differ
                    if any(abs(x - y) > INERT_TOL * max(abs(x), abs(y), 1e-12) for x, y in zip(va, vb)):
                        changed |= differ
        return frozenset(seen - changed)

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
                index = enc.parallel_configs.index(cfg)
                backend = sel.get("backend")
                if backend is not None and backend not in enc.supported_backends[index]:
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
