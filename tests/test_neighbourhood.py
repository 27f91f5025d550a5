"""The cost-aware fill's neighbourhood designer (optimize/neighbourhood.py), alone and in the study loop.

Fakes: `FakeStudy` stands in for the Vizier study (a seeded pick of unseen points, named like the
quasi-random designer), `SimBackend` (test_async_dispatch) for the evaluation backend; the designer,
the sampler and the study loop are the real ones."""

import random

import pytest
from branch_stub import Branch
from test_async_dispatch import SimBackend
from test_study import seqs, study_candidate

from spica_pipeline.evaluate.evaluator import EvalOutcome, EvalRequest
from spica_pipeline.optimize.branch_plan import StudySampler, SuggestingStudy, propose
from spica_pipeline.optimize.encoding import build_encoding, enumerate_space
from spica_pipeline.optimize.ledger import content_view
from spica_pipeline.optimize.neighbourhood import (
    NEIGHBOURHOOD,
    NeighbourhoodDesigner,
    config_steps,
    crowding,
    hv_contributions,
)
from spica_pipeline.optimize.study import run_branch_study
from spica_pipeline.optimize.trial import MemoryJournal, Scored, StudySettings, point_key
from spica_pipeline.space.shapes import RoleShape

POOL = tuple([RoleShape(tp=1, replicas=r) for r in range(1, 9)] + [RoleShape(tp=2, replicas=r) for r in range(1, 5)]
             + [RoleShape(tp=4, replicas=1), RoleShape(tp=4, replicas=2), RoleShape(tp=8, replicas=1)])
ENCODING = build_encoding(Branch("agg", POOL, (("vllm",),) * len(POOL),
                                 {"backend": ["vllm"], "agg_max_num_seqs": [256, 512, 1024],
                                  "agg_max_num_batched_tokens": [8192, 16384]}, 8))
SPACE = list(enumerate_space(ENCODING))  # 15 configs x 6 knob pairs = 90 points
SCALAR = [("objective", "max")]
PARETO = [("throughput", "max"), ("speed", "max")]


def objective(selection, config):
    """A single peak at tp2 x3 (6 GPUs), whatever the batched tokens (an inert knob)."""
    return 100.0 - 10 * abs(config.used_gpus - 6) - 15 * abs(config.tp - 2) + selection["agg_max_num_seqs"] / 1024


def pareto_metrics(selection, config):
    """Throughput grows with GPUs, per-user speed falls with them (and grows with tp): a front."""
    return {"throughput": float(config.used_gpus * 10 + config.tp + selection["agg_max_num_seqs"] / 1024),
            "speed": float(100 / config.used_gpus + 2 * config.tp)}


def known(points, metrics=lambda s, c: {"objective": objective(s, c)}):
    return [(s, c, metrics(s, c)) for s, c in points]


def keys(points):
    return {point_key(s, c) for s, c in points}


def landed(parameters, taken=()):
    p = propose(ENCODING, parameters, taken)
    return p.selection, p.parallel_config


def test_the_designer_is_deterministic_and_ignores_nothing_it_is_told():
    rng = random.Random(3)
    seen = rng.sample(SPACE, 10)
    a = NeighbourhoodDesigner(ENCODING, SCALAR, seed=7).suggest(8, known(seen[:8]), seen[8:], keys(seen))
    b = NeighbourhoodDesigner(ENCODING, SCALAR, seed=7).suggest(8, known(seen[:8]), seen[8:], keys(seen))
    assert a == b and len(a) == 8  # trials 11-18: 7 neighbours, one (trial 16) exploring
    designer = NeighbourhoodDesigner(ENCODING, SCALAR, seed=7)
    assert [designer.local_count(4, p) for p in range(0, 16, 4)] == [4, 3, 4, 3]  # one in eight explores


@pytest.mark.parametrize("metrics", [SCALAR, PARETO])
def test_it_never_proposes_a_taken_or_pending_point_nor_one_twice(metrics):
    fn = pareto_metrics if metrics is PARETO else (lambda s, c: {"objective": objective(s, c)})
    rng = random.Random(5)
    for _ in range(20):
        seen = rng.sample(SPACE, rng.randrange(3, 60))
        cut = rng.randrange(1, len(seen))
        out = NeighbourhoodDesigner(ENCODING, metrics, seed=1).suggest(12, known(seen[:cut], fn), seen[cut:],
                                                                       keys(seen))
        points = [landed(p) for p in out]
        assert not keys(points) & keys(seen)
        assert len(keys(points)) == len(points)


AGG = {"deployment_mode": "agg", "backend": "vllm", "agg_max_num_seqs": 512, "agg_max_num_batched_tokens": 8192}


def steps(anchor, point):
    knobs = ("agg_max_num_seqs", "agg_max_num_batched_tokens")
    return config_steps(anchor[1], point[1]) + sum(point[0][k] != anchor[0][k] for k in knobs)


def test_near_equal_anchors_step_in_turn_and_a_poor_one_waits():
    # three anchors more than two steps apart: the best, a runner-up within 0.5 %, a poor one
    best, runner_up, poor = (AGG, RoleShape(tp=2, replicas=2)), (AGG, RoleShape(tp=1, replicas=8)), \
        (AGG, RoleShape(tp=8, replicas=1))
    values = {best[1]: 100.0, runner_up[1]: 99.5, poor[1]: 0.0}
    seen = [poor, runner_up, best]
    told = [(s, c, {"objective": values[c]}) for s, c in seen]
    designer = NeighbourhoodDesigner(ENCODING, SCALAR, seed=0, explore_share=0)
    out = [landed(p) for p in designer.suggest(8, told, [], keys(seen))]
    assert [steps(best, p) for p in out[0:4:2]] == [1, 1]  # best first
    assert [steps(runner_up, p) for p in out[1:4:2]] == [1, 1]  # then the runner-up, in turn
    # the poor anchor's ring 1 costs 1 + GAP_WEIGHT: the good anchors' rings 1-2 come first
    assert all(min(steps(best, p), steps(runner_up, p)) <= 2 for p in out)
    old = NeighbourhoodDesigner(ENCODING, SCALAR, seed=0, explore_share=0, gap_weight=0.0)
    assert any(steps(poor, landed(p)) == 1 for p in old.suggest(3, told, [], keys(seen)))  # no gap: all take turns


def test_on_a_front_the_points_holding_the_hypervolume_step_first():
    # (1, 10) and (10, 1) are ends of the front, (9, 9) holds most of its area
    assert hv_contributions([(1.0, 10.0), (9.0, 9.0), (10.0, 1.0)]) == [1.0, 64.0, 1.0]
    points = [(AGG, RoleShape(tp=1, replicas=1)), (AGG, RoleShape(tp=2, replicas=2)), (AGG, RoleShape(tp=8, replicas=1))]
    values = dict(zip((c for _, c in points), [(1.0, 10.0), (9.0, 9.0), (10.0, 1.0)]))
    told = [(s, c, {"throughput": values[c][0], "speed": values[c][1]}) for s, c in points]
    designer = NeighbourhoodDesigner(ENCODING, PARETO, seed=0, explore_share=0)
    out = [landed(p) for p in designer.suggest(3, told, [], keys(points))]
    assert all(steps(points[1], p) == 1 for p in out)


def test_a_knob_that_changed_nothing_is_stepped_last():
    base = {"deployment_mode": "agg", "backend": "vllm", "agg_max_num_seqs": 512}
    seen = [({**base, "agg_max_num_batched_tokens": t}, RoleShape(tp=2, replicas=2)) for t in (8192, 16384)]
    designer = NeighbourhoodDesigner(ENCODING, SCALAR, seed=0, explore_share=0)
    rows = designer._rows(known(seen))
    # batched tokens changed nothing; max_num_seqs was never varied on one config: inert too (the prior)
    assert designer.inert_knobs(rows) == {"agg_max_num_batched_tokens", "agg_max_num_seqs"}
    out = [landed(p) for p in designer.suggest(4, known(seen), [], keys(seen))]
    # new points first: the anchor's one-step layouts, none equal to a seen point or to another
    # proposal but for the inert knobs
    assert len({c for _, c in out} | {seen[0][1]}) == len(out) + 1
    assert all(config_steps(seen[0][1], c) == 1 for _, c in out)


def test_a_knob_is_inert_on_the_study_scale_until_a_pair_shows_it_matters():
    base = {"deployment_mode": "agg", "backend": "vllm", "agg_max_num_seqs": 512}
    poor, good = RoleShape(tp=8, replicas=1), RoleShape(tp=2, replicas=2)
    designer = NeighbourhoodDesigner(ENCODING, SCALAR, seed=0, explore_share=0)

    def told(poor_values, good_values):
        return designer._rows([({**base, "agg_max_num_batched_tokens": t}, c, {"objective": v})
                               for c, vals in ((poor, poor_values), (good, good_values))
                               for t, v in zip((8192, 16384), vals)])

    both = {"agg_max_num_batched_tokens", "agg_max_num_seqs"}
    assert designer.inert_knobs([]) == both  # nothing known: every knob starts inert
    # 11.84 vs 11.75 on a poor config (0.8 % of its own value) when the best is 470: no change
    assert designer.inert_knobs(told((11.84, 11.75), (470.0, 470.0))) == both
    # 470 vs 465 on the best config (1 %): batched tokens matters, for good
    assert designer.inert_knobs(told((11.84, 11.84), (470.0, 465.0))) == {"agg_max_num_seqs"}


def test_the_best_anchors_inert_knobs_are_tried_early_another_anchors_last():
    enc = build_encoding(Branch("agg", POOL, (("vllm",),) * len(POOL),
                                {"backend": ["vllm"], "agg_max_num_seqs": [512],
                                 "agg_max_num_batched_tokens": [8192, 16384, 32768]}, 8))
    base = {"deployment_mode": "agg", "backend": "vllm", "agg_max_num_seqs": 512,
            "agg_max_num_batched_tokens": 16384}
    best, poor = RoleShape(tp=2, replicas=2), RoleShape(tp=8, replicas=1)
    seen = [(base, best), (base, poor)]
    told = [(base, best, {"objective": 1.0}), (base, poor, {"objective": 0.5})]
    designer = NeighbourhoodDesigner(enc, SCALAR, seed=0, explore_share=0)
    out = [propose(enc, p) for p in designer.suggest(40, told, [], keys(seen))]
    assert len(out) > 10
    on = {c: [i for i, p in enumerate(out) if p.parallel_config == c] for c in (best, poor)}
    first = {p.parallel_config: i for i, p in reversed(list(enumerate(out)))}
    rings = [i for c, i in first.items()
             if c not in (best, poor) and min(config_steps(best, c), config_steps(poor, c)) <= 2]
    # the best anchor's untried batched tokens (a look-alike: the knob has shown no effect yet) come
    # at one ring more, early; the poor anchor's only after a first point on every config its
    # rings or the best's reach
    assert on[best] and on[best][0] < 12
    assert on[poor] and all(i > max(rings) for i in on[poor])


TRACE_LIKE = build_encoding(Branch("agg", POOL, (("vllm",),) * len(POOL),
                                  {"backend": ["vllm"], "agg_max_num_seqs": [256, 512, 1024],
                                   "agg_max_num_batched_tokens": [8192, 16384, 32768]}, 8))


def probe_scenario():
    """trace_agg's slow runs: the incumbent is on the best config but at batched tokens 32768 (8192
    would be better, which no pair has shown yet, so both knobs count as inert); a poorer config one
    step away was tried at other knob values, so its untried values there are look-alikes too."""
    base = {"deployment_mode": "agg", "backend": "vllm", "agg_max_num_seqs": 512}
    best, near = RoleShape(tp=2, replicas=2), RoleShape(tp=1, replicas=4)  # one step apart
    told = [({**base, "agg_max_num_batched_tokens": 32768}, best, {"objective": 1.0}),
            ({**base, "agg_max_num_batched_tokens": 16384}, near, {"objective": 0.9})]
    return base, best, near, told


def knobs_moved(a, b):
    return sum(a[k] != b[k] for k in ("agg_max_num_seqs", "agg_max_num_batched_tokens"))


def probe_order(told, probe=True, metrics=SCALAR):
    """The designer's order; probe=False: as if the best config never led (no probe queue)."""
    seen = [(s, c) for s, c, _ in told]
    with pytest.MonkeyPatch.context() as patch:
        if not probe:
            patch.setattr(NeighbourhoodDesigner, "_leads", lambda self, rows, config: False)
        designer = NeighbourhoodDesigner(TRACE_LIKE, metrics, seed=0, explore_share=0)
        return [propose(TRACE_LIKE, p) for p in designer.suggest(60, told, [], keys(seen))]


def test_the_own_config_probe_tries_the_best_configs_knob_values_before_look_alikes_elsewhere():
    base, best, near, told = probe_scenario()
    designer = NeighbourhoodDesigner(TRACE_LIKE, SCALAR, seed=0)
    assert designer.inert_knobs(designer._rows(told)) == {"agg_max_num_seqs", "agg_max_num_batched_tokens"}
    out = probe_order(told)
    own = [i for i, p in enumerate(out) if p.parallel_config == best]
    elsewhere = [i for i, p in enumerate(out) if p.parallel_config == near]
    # per knob its farthest values only: batched tokens 8192 (not 16384), seqs 256 and 1024;
    # the first three points on the best config, all before any look-alike elsewhere
    assert sorted((out[i].selection["agg_max_num_batched_tokens"], out[i].selection["agg_max_num_seqs"])
                  for i in own[:3]) == [(8192, 512), (32768, 256), (32768, 1024)]
    assert max(own[:3]) < min(elsewhere)


def test_without_the_probe_the_own_config_values_mix_with_look_alikes_elsewhere():
    _, best, near, told = probe_scenario()
    out = probe_order(told, probe=False)
    own = [i for i, p in enumerate(out) if p.parallel_config == best]
    elsewhere = [i for i, p in enumerate(out) if p.parallel_config == near]
    assert own and elsewhere and min(elsewhere) < max(own)  # the seeded order of rings 1-2, look-alikes mixed
    assert probe_order(told) != out


def test_the_probe_waits_while_another_config_is_level_and_a_front_never_probes():
    from spica_pipeline.optimize import neighbourhood

    base, best, near, told = probe_scenario()
    # the best config leads by 10 % (> PROBE_LEAD): probed; by 1 %: as without the probe
    assert neighbourhood.PROBE_LEAD == 0.05 and probe_order(told) != probe_order(told, probe=False)
    level = [told[0], (told[1][0], near, {"objective": 0.99})]
    assert probe_order(level) == probe_order(level, probe=False)
    # a Pareto goal never probes
    front = [(s, c, {"throughput": v, "speed": 2.0 - v}) for s, c, v in
             [(told[0][0], best, 1.0), (told[1][0], near, 0.9)]]
    assert not NeighbourhoodDesigner(TRACE_LIKE, PARETO, seed=0)._leads([], best)
    assert probe_order(front, metrics=PARETO) == probe_order(front, probe=False, metrics=PARETO)


def test_pareto_anchors_are_the_front_with_its_ends_first():
    seen = [({"deployment_mode": "agg", "backend": "vllm", "agg_max_num_seqs": 512,
              "agg_max_num_batched_tokens": 8192}, c) for c in POOL]
    anchors = NeighbourhoodDesigner(ENCODING, PARETO, seed=0).anchors(known(seen, pareto_metrics))
    values = [pareto_metrics(s, c) for s, c in anchors]
    every = [pareto_metrics(s, c) for s, c in seen]
    assert len(values) >= 4
    for v in values:  # non-dominated
        assert not any(o["throughput"] >= v["throughput"] and o["speed"] >= v["speed"] and o != v for o in every)
    assert {values[0]["throughput"], values[1]["throughput"]} == {min(v["throughput"] for v in values),
                                                                  max(v["throughput"] for v in values)}
    assert crowding([(1.0, 3.0), (2.0, 2.0), (3.0, 1.0)]) == [float("inf"), 2.0, float("inf")]


def test_with_no_feasible_trial_it_explores_configs_no_trial_used():
    designer = NeighbourhoodDesigner(ENCODING, SCALAR, seed=0)
    tried = SPACE[:5]
    out = [landed(p) for p in designer.suggest(4, [(s, c, None) for s, c in tried], [], keys(tried))]
    assert len(out) == 4 and len({c for _, c in out}) == 4 and not {c for _, c in out} & {c for _, c in tried}
    assert designer.suggest(4, known(SPACE), [], keys(SPACE)) == []  # a used-up space: nothing


# --------------------------------------------------------------------------------------------
# in the study loop
# --------------------------------------------------------------------------------------------

class FakeStudy(SuggestingStudy):
    """A seeded pick of points not yet in history or pending (position-seeded, stateless)."""

    def __init__(self, seed=0):
        self.seed = seed
        self.last_designer = ""

    def suggest(self, count, history=(), pending=(), algorithm=None):
        seen = [p for p, _, _ in history] + [dict(p) for p in pending]
        rng = random.Random(self.seed * 7919 + len(seen))
        order = list(range(len(SPACE)))
        rng.shuffle(order)
        out = []
        for i in order:
            params = ENCODING.encode(*SPACE[i])
            if params not in seen and params not in out:
                out.append(params)
            if len(out) == count:
                break
        self.last_designer = "QUASI_RANDOM_SEARCH" if (algorithm or not history) else "DEFAULT"
        return out


def build(selection, config):
    return EvalRequest(candidate=study_candidate(selection, config), workload={"isl": 100},
                       goal={"target": "throughput"})


def outcome(candidate):
    config = candidate.role("agg").shape
    value = objective({"agg_max_num_seqs": seqs(candidate)}, config)
    return EvalOutcome("feasible", report={"objective": value, "agg_max_num_seqs": seqs(candidate)},
                       replay_seconds=0.01)


def score(result):
    value = float(result.report["objective"])
    return Scored(score=value, objectives=None, told_metrics={"objective": value})


class Backend(SimBackend):
    def __init__(self, duration=lambda candidate: 1.0, kill_after=None):
        super().__init__(2, duration=duration, outcome=outcome, kill_after=kill_after)


def sweep(backend, seed=0, local=True, journal=None, rounds=6):
    sampler = StudySampler(FakeStudy(seed), ENCODING,
                           NeighbourhoodDesigner(ENCODING, SCALAR, seed=seed) if local else None)
    settings = StudySettings(per_round=4, max_rounds=rounds, workers=2, replay_estimate_s=0.01)
    return run_branch_study("agg", sampler, build, None, score, settings, journal=journal, backend=backend)


def rows(result):
    return [content_view(r.to_row()) for r in result.records]


def test_the_fill_records_its_designer_on_every_trial_and_never_repeats_a_point():
    result = sweep(Backend())
    designers = [r.designer for r in result.records]
    assert designers[:8] == [NEIGHBOURHOOD] * 8  # seeding, no outcome known yet: the designer explores
    assert designers.count(NEIGHBOURHOOD) >= 20
    assert all(d in (NEIGHBOURHOOD, "QUASI_RANDOM_SEARCH") for d in designers)
    assert len({r.spec_hash for r in result.records}) == len(result.records) == 24
    plain = sweep(Backend(), local=False)
    assert {r.designer for r in plain.records} == {"QUASI_RANDOM_SEARCH"}


def test_a_seeded_sweep_gives_the_same_ledger_whatever_the_timings():
    fast_first = Backend(duration=lambda s: 1.0 + s.role("agg").replicas % 3)
    slow_first = Backend(duration=lambda s: 5.0 - s.role("agg").replicas % 3)
    a, b = sweep(fast_first, seed=3), sweep(slow_first, seed=3)
    assert fast_first.completed != slow_first.completed
    assert rows(a) == rows(b)


@pytest.mark.parametrize("kill_after", [3, 10, 17])
def test_kill_then_resume_gives_an_equal_ledger(kill_after):
    clean = sweep(Backend(), seed=2)
    journal = MemoryJournal()
    with pytest.raises(KeyboardInterrupt):
        sweep(Backend(kill_after=kill_after), seed=2, journal=journal)
    assert rows(sweep(Backend(), seed=2, journal=journal)) == rows(clean)


@pytest.mark.parametrize("probe", [True, False])
def test_with_or_without_the_probe_the_ledger_ignores_timings_and_a_kill_resumes_exactly(monkeypatch, probe):
    if not probe:
        monkeypatch.setattr(NeighbourhoodDesigner, "_leads", lambda self, rows, config: False)
    fast_first = Backend(duration=lambda s: 1.0 + s.role("agg").replicas % 3)
    slow_first = Backend(duration=lambda s: 5.0 - s.role("agg").replicas % 3)
    clean = sweep(fast_first, seed=4)
    assert rows(clean) == rows(sweep(slow_first, seed=4))
    journal = MemoryJournal()
    with pytest.raises(KeyboardInterrupt):
        sweep(Backend(kill_after=11), seed=4, journal=journal)
    assert rows(sweep(Backend(), seed=4, journal=journal)) == rows(clean)
    assert len({r.spec_hash for r in clean.records}) == len(clean.records)


def test_an_exhausted_neighbourhood_falls_back_to_the_quasi_random_fill():
    # the designer alone answers nothing once every point is taken or a look-alike (see above); in
    # the loop the quasi-random fill then covers the rest, and the sweep ends when the space is used up
    result = sweep(Backend(), rounds=30)  # 120 asks for a 90-point space
    assert len(result.records) == len({r.spec_hash for r in result.records}) == len(SPACE)
    exhausted = sweep(Backend(), rounds=30, local=False)
    assert len(exhausted.records) == len(SPACE)


class OneNeighbour(NeighbourhoodDesigner):
    """A neighbourhood with room for one point per ask (what an almost used-up one answers)."""

    def suggest(self, count, known, pending, taken):
        return super().suggest(count, known, pending, taken)[:1]


def test_a_short_local_answer_is_filled_quasi_randomly_and_each_trial_names_its_designer():
    sampler = StudySampler(FakeStudy(1), ENCODING, OneNeighbour(ENCODING, SCALAR, seed=1))
    settings = StudySettings(per_round=4, max_rounds=5, workers=2, replay_estimate_s=0.01)
    result = run_branch_study("agg", sampler, build, None, score, settings, backend=Backend())
    designers = [r.designer for r in result.records]
    assert designers[8:] == [NEIGHBOURHOOD, "QUASI_RANDOM_SEARCH", "QUASI_RANDOM_SEARCH", "QUASI_RANDOM_SEARCH"] * 3
    assert len({r.spec_hash for r in result.records}) == 20  # the fill was told the local point as pending


def test_the_incumbent_improves_on_the_plain_fill():
    best = max(objective(s, c) for s, c in SPACE)

    def evals_to_best(result):
        return next(i for i, r in enumerate(result.records, 1) if r.score == best)

    local = [evals_to_best(sweep(Backend(), seed=s, rounds=23)) for s in range(6)]
    plain = [evals_to_best(sweep(Backend(), seed=s, local=False, rounds=23)) for s in range(6)]
    assert sum(local) < sum(plain)


def test_only_a_model_based_algorithm_gets_the_local_fill():
    from test_config import build as config

    from spica_pipeline.optimize.branch_plan import local_designer

    assert local_designer(config(), ENCODING, 0) is not None  # DEFAULT: GP-UCB-PE, filled when it costs too much
    for algorithm in ("RANDOM_SEARCH", "QUASI_RANDOM_SEARCH"):
        assert local_designer(config(sweep={"algorithm": algorithm}), ENCODING, 0) is None


# --------------------------------------------------------------------------------------------
# a model-based ask that proposes a look-alike goes to the local designer
# --------------------------------------------------------------------------------------------

class LookAlikeGP(FakeStudy):
    """A model-based designer (FakeStudy's picks, named DEFAULT once it has a history) whose every
    suggestion from trial `honest` on is a look-alike: a proposed point with its batched tokens
    (inert in `objective`) moved, as GP-UCB-PE proposes when it cannot know the knob changes nothing."""

    def __init__(self, seed=0, honest=12):
        super().__init__(seed)
        self.honest = honest

    def suggest(self, count, history=(), pending=(), algorithm=None):
        seen = [p for p, _, _ in history] + [dict(p) for p in pending]
        out = []
        if len(seen) < self.honest or not history:  # a seeded pick of points on configs not yet used
            used = {landed(p)[1] for p in seen}
            rng = random.Random(self.seed * 7919 + len(seen))
            for s, c in rng.sample(SPACE, len(SPACE)):
                if c not in used and len(out) < count:
                    out.append(ENCODING.encode(s, c))
                    used.add(c)
            self.last_designer = "QUASI_RANDOM_SEARCH" if (algorithm or not history) else "DEFAULT"
            return out
        for params in seen:
            sel, cfg = landed(params)
            other = 8192 if sel["agg_max_num_batched_tokens"] == 16384 else 16384
            moved = ENCODING.encode({**sel, "agg_max_num_batched_tokens": other}, cfg)
            if moved not in seen and moved not in out:
                out.append(moved)
            if len(out) == count:
                break
        self.last_designer = "DEFAULT"
        return out


def layout_outcome(candidate):
    """`outcome` with every knob inert: the layout alone decides."""
    config = candidate.role("agg").shape
    value = objective({"agg_max_num_seqs": 0}, config)
    return EvalOutcome("feasible", report={"objective": value}, replay_seconds=0.01)


class LayoutBackend(SimBackend):
    def __init__(self, duration=lambda candidate: 1.0, kill_after=None):
        super().__init__(2, duration=duration, outcome=layout_outcome, kill_after=kill_after)


def gp_sweep(backend, seed=0, journal=None, study=None):
    sampler = StudySampler(study or LookAlikeGP(seed), ENCODING, NeighbourhoodDesigner(ENCODING, SCALAR, seed=seed))
    settings = StudySettings(per_round=4, max_rounds=6, workers=2, optimizer_share=None)  # every ask: the model
    return run_branch_study("agg", sampler, build, None, score, settings, journal=journal, backend=backend), sampler


def test_a_model_asks_look_alikes_go_to_the_local_designer_and_each_trial_names_it(monkeypatch):
    from spica_pipeline.optimize import neighbourhood

    monkeypatch.setattr(neighbourhood, "SEED_BATCH_TO_LOCAL", False)  # the model's seed batches kept (below)
    result, sampler = gp_sweep(LayoutBackend())
    designers = [r.designer for r in result.records]
    assert designers[:8] == ["QUASI_RANDOM_SEARCH"] * 8 and designers[8:12] == ["DEFAULT"] * 4  # honest asks kept
    # the look-alike asks: each look-alike swapped for a local point, the model's other points kept
    assert designers[12:20].count(NEIGHBOURHOOD) >= 6 and set(designers[12:20]) == {NEIGHBOURHOOD, "DEFAULT"}
    assert sampler.look_alikes_seen >= 8
    configs = [RoleShape(**r.parallel_config) for r in result.records]
    assert set(POOL) - set(configs[:12]) <= set(configs[12:16])  # the layouts no trial had used come first
    assert len({r.spec_hash for r in result.records}) == len(result.records) == 24
    # where the neighbourhood has fewer points left than the ask wants, the model's batch is kept
    assert set(designers[20:]) <= {NEIGHBOURHOOD, "DEFAULT"}


def test_the_models_seed_batch_goes_to_the_local_designer_deterministically_and_resumes_exactly():
    """SEED_BATCH_TO_LOCAL: while the model answers with its quasi-random seed batch, the
    neighbourhood designer's exploration answers instead (new layouts first), and each trial names it."""
    result, _ = gp_sweep(LayoutBackend())
    designers = [r.designer for r in result.records]
    assert designers[:8] == [NEIGHBOURHOOD] * 8 and "QUASI_RANDOM_SEARCH" not in designers
    configs = [RoleShape(**r.parallel_config) for r in result.records[:8]]
    assert len(set(configs)) == min(8, len(POOL))  # exploration: a layout no trial has used, each time
    fast_first = LayoutBackend(duration=lambda s: 1.0 + s.role("agg").replicas % 3)
    slow_first = LayoutBackend(duration=lambda s: 5.0 - s.role("agg").replicas % 3)
    assert rows(gp_sweep(fast_first, seed=3)[0]) == rows(gp_sweep(slow_first, seed=3)[0])
    clean = gp_sweep(LayoutBackend(), seed=2)[0]
    journal = MemoryJournal()
    with pytest.raises(KeyboardInterrupt):
        gp_sweep(LayoutBackend(kill_after=5), seed=2, journal=journal)
    assert rows(gp_sweep(LayoutBackend(), seed=2, journal=journal)[0]) == rows(clean)


def test_look_alike_routing_is_deterministic_whatever_the_timings_and_resumes_exactly():
    fast_first = LayoutBackend(duration=lambda s: 1.0 + s.role("agg").replicas % 3)
    slow_first = LayoutBackend(duration=lambda s: 5.0 - s.role("agg").replicas % 3)
    a, b = gp_sweep(fast_first, seed=3)[0], gp_sweep(slow_first, seed=3)[0]
    assert fast_first.completed != slow_first.completed and rows(a) == rows(b)
    clean = gp_sweep(LayoutBackend(), seed=2)[0]
    journal = MemoryJournal()
    with pytest.raises(KeyboardInterrupt):
        gp_sweep(LayoutBackend(kill_after=11), seed=2, journal=journal)
    assert rows(gp_sweep(LayoutBackend(), seed=2, journal=journal)[0]) == rows(clean)


def test_a_model_ask_without_look_alikes_is_kept():
    honest, sampler = gp_sweep(LayoutBackend(), study=LookAlikeGP(0, honest=99))
    assert {r.designer for r in honest.records[8:]} == {"DEFAULT"} and sampler.look_alikes_seen == 0


class FixedGP(FakeStudy):
    """A model-based designer answering every ask with `batch`."""

    def __init__(self, batch):
        super().__init__(0)
        self.batch = batch

    def suggest(self, count, history=(), pending=(), algorithm=None):
        self.last_designer = "DEFAULT"
        return [dict(p) for p in self.batch[:count]]


def look_alike_scenario():
    """Four trials on four layouts (no pair on one layout, so every knob is believed inert), two
    fresh points on two new layouts, and two look-alikes: one of a known layout, one of fresh_a's."""
    from spica_pipeline.optimize.trial import HistoryItem

    by_config: dict = {}
    for s, c in SPACE:
        by_config.setdefault(c, []).append(s)
    configs = list(by_config)
    history = [HistoryItem(ENCODING.encode(by_config[c][0], c), {"objective": objective(by_config[c][0], c)}, None)
               for c in configs[:4]]
    fresh_a, fresh_b = (ENCODING.encode(by_config[c][0], c) for c in configs[4:6])
    alike_known = ENCODING.encode(by_config[configs[0]][3], configs[0])  # a known layout, other knobs
    alike_batch = ENCODING.encode(by_config[configs[4]][5], configs[4])  # fresh_a's layout, other knobs
    return configs, history, fresh_a, fresh_b, alike_known, alike_batch


def test_replace_mode_swaps_each_look_alike_in_place_and_names_each_trials_designer(monkeypatch):
    from spica_pipeline.optimize import neighbourhood

    configs, history, fresh_a, fresh_b, alike_known, alike_batch = look_alike_scenario()

    def ask():
        sampler = StudySampler(FixedGP([fresh_a, alike_known, fresh_b, alike_batch]), ENCODING,
                               NeighbourhoodDesigner(ENCODING, SCALAR, seed=0))
        return sampler.suggest_pending(4, history, [], cheap=False), sampler

    (out, designers), sampler = ask()
    assert designers == ["DEFAULT", NEIGHBOURHOOD, "DEFAULT", NEIGHBOURHOOD] and sampler.look_alikes_seen == 2
    assert out[0] == fresh_a and out[2] == fresh_b  # the model's other suggestions, in place
    keys = [point_key(*landed(p)) for p in out]
    assert len(set(keys)) == 4 and not {landed(out[1])[1], landed(out[3])[1]} & set(configs[:5])
    assert ask()[0] == (out, designers)  # deterministic


class MixedGP(LookAlikeGP):
    """LookAlikeGP whose look-alike asks lead with one honest point (a layout not yet used): mixed batches."""

    def suggest(self, count, history=(), pending=(), algorithm=None):
        seen = [p for p, _, _ in history] + [dict(p) for p in pending]
        if len(seen) < self.honest or not history:
            return super().suggest(count, history, pending, algorithm)
        used = {landed(p)[1] for p in seen}
        fresh = [ENCODING.encode(s, c) for s, c in SPACE if c not in used][:1]
        return fresh + super().suggest(count - len(fresh), history, pending, algorithm)


def test_replace_mode_in_the_loop_records_mixed_designers_per_trial_and_resumes_exactly(monkeypatch):
    from spica_pipeline.optimize import neighbourhood

    result, sampler = gp_sweep(LayoutBackend(), study=MixedGP(0))
    asks: dict[int, set[str]] = {}
    for r in result.records[8:]:
        asks.setdefault(r.round, set()).add(r.designer)
    assert any(names == {"DEFAULT", NEIGHBOURHOOD} for names in asks.values())  # one ask, two designers
    assert sampler.look_alikes_seen > 0
    assert len({r.spec_hash for r in result.records}) == len(result.records)
    slow_first = LayoutBackend(duration=lambda s: 5.0 - s.role("agg").replicas % 3)
    assert rows(gp_sweep(slow_first, study=MixedGP(0))[0]) == rows(result)  # same seed, same ledger
    journal = MemoryJournal()
    with pytest.raises(KeyboardInterrupt):
        gp_sweep(LayoutBackend(kill_after=13), journal=journal, study=MixedGP(0))
    assert rows(gp_sweep(LayoutBackend(), journal=journal, study=MixedGP(0))[0]) == rows(result)


def test_the_round_loop_records_each_trials_own_designer(monkeypatch):
    """The barrier path (no backend) takes the designers per suggestion too."""
    from spica_pipeline.optimize import neighbourhood

    sampler = StudySampler(MixedGP(0), ENCODING, NeighbourhoodDesigner(ENCODING, SCALAR, seed=0))

    def wave(requests):
        return [outcome(r.candidate) for r in requests]

    settings = StudySettings(per_round=4, max_rounds=6, workers=2, optimizer_share=None)
    result = run_branch_study("agg", sampler, build, wave, score, settings)
    names = {}
    for r in result.records:
        names.setdefault(r.round, set()).add(r.designer)
    assert any(n == {"DEFAULT", NEIGHBOURHOOD} for n in names.values())


@pytest.mark.parametrize("metrics", [SCALAR, PARETO])
def test_a_designer_kept_across_asks_answers_as_a_fresh_one(metrics):
    """The designer extends its rows and inert-knob pairs from one ask to the next (the study hands
    in the same trials, one batch more each time); any other history, e.g. a reordered one or a
    shorter one after a resume, is read from scratch. Every answer equals a fresh designer's."""
    fn = (lambda s, c: {"objective": objective(s, c)}) if metrics == SCALAR else pareto_metrics
    order = random.Random(5).sample(SPACE, 60)
    kept = NeighbourhoodDesigner(ENCODING, metrics, seed=3)
    told = known(order, fn)
    histories = [told[:n] for n in range(0, 57, 4)] + [told[:20], list(reversed(told[:30])), told[:40]]
    for history in histories:
        pending = order[len(history):len(history) + 4]
        taken = keys(order[:len(history) + 4])
        fresh = NeighbourhoodDesigner(ENCODING, metrics, seed=3)
        assert kept.suggest(8, history, pending, taken) == fresh.suggest(8, history, pending, taken)
        assert kept.inert_knobs(kept._rows(history)) == fresh.inert_knobs(fresh._rows(history))
