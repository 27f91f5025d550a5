"""The branch study loop with fakes: spec §11 items 21-23, exhaustive mode, dedup and resume."""

import random

import pytest

from dataclasses import replace

from spica_pipeline.config import SearchSpace
from spica_pipeline.evaluate.evaluator import EvalOutcome, EvalRequest
from spica_pipeline.optimize.ledger import TrialRecord, content_view
from spica_pipeline.optimize.study import run_branch_study
from spica_pipeline.optimize.trial import MemoryJournal, Proposal, Scored, StudySettings, TrialCounter
from spica_pipeline.space.candidate import build_candidate
from spica_pipeline.space.shapes import RoleShape

SHAPE = RoleShape(tp=4, replicas=2)
# an agg space whose only knobs are the ones the fake samplers select; the rest are pinned
STUDY_SPACE = SearchSpace(model_name="m", hardware_sku="h200_sxm", deployment_mode=["agg"], backend=["vllm"],
                          agg_max_num_batched_tokens=[8192], router_mode=["round_robin"],
                          planner_scaling_policy=["disabled"])


def seqs(candidate):
    """The candidate's agg max_num_seqs: the knob the fake samplers choose and the fake evaluators score."""
    return candidate.role("agg").engine.max_num_seqs


class ScriptedSampler:
    """Returns scripted batches, then random picks seeded by (seed, history length).

    Like a Vizier designer rebuilt from the ledger, it is stateless between calls: the same
    history gives the same suggestions, which is what makes resume exact.
    """

    def __init__(self, batches=(), menu=(256, 512, 768), seed=0, shape=SHAPE, supported=True):
        self.batches = [list(b) for b in batches]
        self.menu = list(menu)
        self.seed = seed
        self.shape = shape
        self.supported = supported
        self.calls = []

    def suggest(self, count, history):
        self.calls.append((count, len(history)))
        if self.batches:
            return [{"seqs": s} for s in self.batches.pop(0)][:count]
        rng = random.Random(self.seed * 100_003 + len(history))
        return [{"seqs": rng.choice(self.menu)} for _ in range(count)]

    def propose(self, parameters, taken=()):
        selection = {"deployment_mode": "agg", "backend": "vllm", "agg_max_num_seqs": parameters["seqs"]}
        return Proposal(parameters, selection, self.shape, supported=self.supported)


class CountingEvaluator:
    def __init__(self, fn=None, fail_after=None):
        self.fn = fn or (lambda candidate: EvalOutcome("feasible", report={"throughput": seqs(candidate)},
                                                       replay_seconds=0.01))
        self.calls = []
        self.fail_after = fail_after

    def __call__(self, requests):
        out = []
        for request in requests:
            if self.fail_after is not None and len(self.calls) >= self.fail_after:
                raise KeyboardInterrupt("simulated kill")
            self.calls.append(seqs(request.candidate))
            out.append(self.fn(request.candidate))
        return out


def study_candidate(selection, shape):
    return build_candidate(STUDY_SPACE, selection, shape)


def build(selection, shape):
    candidate = replace(study_candidate(selection, shape), backend_version="0.24.0")
    return EvalRequest(candidate=candidate, workload={"isl": 100}, goal={"target": "throughput"})


def score(outcome):
    value = float(outcome.report["throughput"])
    return Scored(score=value, objectives=None, told_metrics={"objective": value})


def run(sampler, evaluator, per_round=3, max_rounds=1, workers=1, journal=None, failure_breaker=5, **kw):
    return run_branch_study("agg", sampler, build, evaluator, score,
                            StudySettings(per_round=per_round, max_rounds=max_rounds, workers=workers,
                                          failure_breaker=failure_breaker),
                            journal=journal, **kw)


def test_scores_follow_the_evaluator_and_configs_carry_backend_version():
    result = run(ScriptedSampler(batches=[[256, 512, 768]]), CountingEvaluator())
    feasible = sorted((r for r in result.records if r.status == "feasible"), key=lambda r: -r.score)
    assert [r.score for r in feasible] == [768, 512, 256]
    assert all(r.used_gpus == 8 and r.config["backend_version"] == "0.24.0" for r in feasible)


def test_budget_counts_infeasible_trials():
    """Issue 20: the budget (per_round x max_rounds) counts every trial, whatever its outcome
    (Spica replaced non-feasible trials up to 10x per round: 33 tells for a budget of 3)."""
    over = CountingEvaluator(lambda s: EvalOutcome("infeasible", reason="over gpu_budget: used_gpus=64 > gpu_budget=32"))
    result = run(ScriptedSampler(menu=range(1000)), over, max_rounds=2)
    assert len(result.records) == 6 and result.evaluated == 6
    assert all("over gpu_budget" in r.reason for r in result.records)
    assert not result.stalled and result.stopped is None


def test_unsupported_backend_never_reaches_the_evaluator():
    evaluator = CountingEvaluator()
    result = run(ScriptedSampler(menu=range(1000), supported=False), evaluator, max_rounds=2)
    assert len(result.records) == 6 and evaluator.calls == []
    assert all("does not support" in r.reason for r in result.records)


def test_build_failure_is_recorded_not_raised():
    def bad_build(selection, shape):
        raise KeyError("agg_max_num_seqs")
    result = run_branch_study("agg", ScriptedSampler(menu=range(1000)), bad_build, CountingEvaluator(), score,
                              StudySettings(per_round=3, max_rounds=1))
    assert len(result.records) == 3
    assert all(r.reason.startswith("candidate build failed: KeyError") for r in result.records)


@pytest.mark.parametrize("status,reason", [
    ("timed_out", "exceed runtime: replay > 5s"),
    ("failed", "replay failed: ValueError: failed to parse line 5 as JSON"),
])
def test_budget_holds_under_timeouts_and_failures(status, reason):
    """Issue 20 item 1: 2 rounds x 2 with every candidate timing out (or failing) runs 4 trials,
    not 22, and every outcome is journalled so a resume replays none of them."""
    journal = MemoryJournal()
    evaluator = CountingEvaluator(lambda s: EvalOutcome(status, reason=reason, replay_seconds=5.0))
    result = run(ScriptedSampler(menu=range(1000)), evaluator, per_round=2, max_rounds=2, journal=journal,
                 failure_breaker=0)
    assert len(result.records) == 4 and len(evaluator.calls) == 4
    assert {r.status for r in result.records} == {status}
    assert len(journal.outcomes) == 4
    again = CountingEvaluator()
    resumed = run(ScriptedSampler(menu=range(1000)), again, per_round=2, max_rounds=2, journal=journal,
                  failure_breaker=0)
    assert again.calls == []
    assert [content_view(r.to_row()) for r in resumed.records] == [content_view(r.to_row()) for r in result.records]


def test_circuit_breaker_stops_a_branch_whose_first_candidates_all_fail_alike():
    evaluator = CountingEvaluator(lambda s: EvalOutcome(
        "failed", reason=f"worker process died (exit code -9) on seqs={seqs(s)}"))
    result = run(ScriptedSampler(menu=range(1000)), evaluator, per_round=2, max_rounds=10, failure_breaker=5)
    assert len(evaluator.calls) == 6  # the round that trips it finishes its batch
    assert result.stopped.startswith("circuit breaker: the first 5 candidates all failed for the same reason")
    assert "worker process died" in result.stopped


def test_circuit_breaker_ignores_mixed_reasons_and_early_successes():
    reasons = iter(["replay failed: A", "replay failed: B"] * 50)
    mixed = run(ScriptedSampler(menu=range(1000)), CountingEvaluator(lambda s: EvalOutcome("failed", reason=next(reasons))),
                per_round=2, max_rounds=5, failure_breaker=3)
    assert mixed.stopped is None and len(mixed.records) == 10

    calls = {"n": 0}

    def first_ok(candidate):
        calls["n"] += 1
        if calls["n"] == 1:
            return EvalOutcome("feasible", report={"throughput": 1.0})
        return EvalOutcome("failed", reason="replay failed: boom")
    ok = run(ScriptedSampler(menu=range(1000)), CountingEvaluator(first_ok), per_round=2, max_rounds=5,
             failure_breaker=3)
    assert ok.stopped is None and len(ok.records) == 10


def test_duplicates_in_a_batch_replay_once_and_replacements_fill_the_round():
    evaluator = CountingEvaluator()
    sampler = ScriptedSampler(batches=[[256, 256, 256], [512, 768]])
    result = run(sampler, evaluator)
    assert sorted(evaluator.calls) == [256, 512, 768]
    assert len(result.records) == 5
    assert [r.status for r in result.records].count("cached") == 2
    assert {r.score for r in result.records} == {256, 512, 768}
    # the duplicates are told with the same metrics as their primary
    assert all(r.told_metrics == {"objective": 256.0} for r in result.records[:3])


def test_identical_spec_across_rounds_is_never_replayed_twice():
    evaluator = CountingEvaluator()
    result = run(ScriptedSampler(menu=(256, 512, 768, 1024), seed=3), evaluator, max_rounds=4)
    assert len(evaluator.calls) == len(set(evaluator.calls))
    replayed = [r for r in result.records if r.status == "feasible"]
    assert len({r.spec_hash for r in replayed}) == len(replayed)


def test_waves_respect_the_worker_count():
    sizes = []

    def evaluator(requests):
        sizes.append(len(requests))
        return [EvalOutcome("feasible", report={"throughput": seqs(r.candidate)}) for r in requests]
    run(ScriptedSampler(batches=[[1, 2, 3]]), evaluator, workers=2)
    assert sizes == [2, 1]


def test_exhaustive_mode_covers_every_point_exactly_once():
    points = [Proposal({"seqs": s}, {"deployment_mode": "agg", "backend": "vllm", "agg_max_num_seqs": s}, SHAPE)
              for s in range(1, 11)]
    evaluator = CountingEvaluator()
    result = run_branch_study("agg", ScriptedSampler(), build, evaluator, score,
                              StudySettings(per_round=3, max_rounds=1),
                              exhaustive_points=points)
    assert sorted(evaluator.calls) == list(range(1, 11))
    assert result.mode == "exhaustive" and result.rounds == 4


def test_same_seed_same_ledger():
    a = run(ScriptedSampler(seed=7, menu=range(50)), CountingEvaluator(), max_rounds=5)
    b = run(ScriptedSampler(seed=7, menu=range(50)), CountingEvaluator(), max_rounds=5)
    assert [content_view(r.to_row()) for r in a.records] == [content_view(r.to_row()) for r in b.records]


def test_resume_after_interruption_equals_uninterrupted_run():
    """A kill mid-sweep loses no finished evaluation; the rerun's ledger equals a clean run's."""
    clean = run(ScriptedSampler(seed=11, menu=range(40)), CountingEvaluator(), max_rounds=6)

    journal = MemoryJournal()
    first = CountingEvaluator(fail_after=7)
    with pytest.raises(KeyboardInterrupt):
        run(ScriptedSampler(seed=11, menu=range(40)), first, max_rounds=6, journal=journal)
    second = CountingEvaluator()
    resumed = run(ScriptedSampler(seed=11, menu=range(40)), second, max_rounds=6, journal=journal)

    assert [content_view(r.to_row()) for r in resumed.records] == [content_view(r.to_row()) for r in clean.records]
    assert not set(first.calls) & set(second.calls)  # nothing finished was replayed again
    assert sorted(first.calls + second.calls) == sorted(
        r.config["agg_max_num_seqs"] for r in clean.records if r.status == "feasible")


def test_trial_numbers_are_sweep_wide_and_rows_round_trip():
    counter = TrialCounter()
    a = run(ScriptedSampler(batches=[[1, 2, 3]]), CountingEvaluator(), counter=counter)
    b = run(ScriptedSampler(batches=[[4, 5, 6]]), CountingEvaluator(), counter=counter)
    assert [r.trial for r in a.records + b.records] == [1, 2, 3, 4, 5, 6]
    row = b.records[0].to_row()
    assert TrialRecord.from_row(row).to_row() == row


def test_time_budget_ends_the_branch_between_batches_with_no_round_cap():
    """max_rounds None + a deadline: rounds continue until the clock passes the deadline; the
    batch in progress finishes, so every record is complete (a valid anytime result)."""
    now = {"t": 0.0}

    def evaluator(requests):
        now["t"] += 10.0 * len(requests)  # each replay takes 10 fake seconds
        return [EvalOutcome("feasible", report={"throughput": seqs(r.candidate)}) for r in requests]
    snapshots = []
    result = run_branch_study("agg", ScriptedSampler(menu=range(10_000)), build, evaluator, score,
                              StudySettings(per_round=2, max_rounds=None, deadline=55.0, clock=lambda: now["t"]),
                              on_round=lambda r: snapshots.append(len(r.records)))
    assert result.out_of_time and not result.stalled
    assert len(result.records) == 6 and now["t"] == 60.0  # 3 batches of 2: the third starts at t=40
    assert snapshots == [2, 4, 6]
    assert all(r.status == "feasible" for r in result.records)


def test_a_journal_from_before_designers_were_recorded_still_resumes():
    """Suggestions journalled as bare parameter dicts (older journals) are read back as such."""
    journal = MemoryJournal()
    first = run(ScriptedSampler(seed=3, menu=range(100)), CountingEvaluator(), max_rounds=2, journal=journal)
    for key, (entries, seconds) in list(journal.suggestions.items()):
        journal.suggestions[key] = ([e["parameters"] for e in entries], seconds)
    again = CountingEvaluator()
    resumed = run(ScriptedSampler(seed=99, menu=range(100)), again, max_rounds=2, journal=journal)
    assert again.calls == []
    assert [r.parameters for r in resumed.records] == [r.parameters for r in first.records]
