"""optimize/cost.py: the predictions the default cost-aware fill decides on (no clock involved)."""

from spica_pipeline.optimize import cost


def test_suggest_cost_follows_the_padding_bucket_and_the_batch():
    p = cost.predicted_ask_seconds
    # history + pending + batch <= 32 rows: one bucket, one price
    assert p(0, 8) == p(8, 8) == p(24, 8) == cost.SUGGEST_COST[1][32][0] + 8 * cost.SUGGEST_COST[1][32][1]
    assert p(24, 8) < p(25, 8) < p(100, 8) < p(200, 8)  # 32 -> 64 -> 128 -> 256 (extrapolated)
    assert p(16, 4) < p(16, 8) < p(16, 16)  # each suggestion is one acquisition optimisation
    assert p(100, 8, objectives=2) != p(100, 8)  # a table per objective count


def test_suggest_cost_at_eight_is_the_measured_median():
    """The table's k = 8 level is bench/results/vizier_after_first.json's median CPU seconds, the
    higher of the trial counts that share a bucket (optimize/cost.py docstring)."""
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "bench" / "results" / "vizier_after_first.json"
    medians = json.loads(path.read_text())["median_suggest_cpu_s_after_first"]
    for objectives in (1, 2):
        for ns in ((8, 16), (32,), (64, 100)):
            want = max(medians[f"DEFAULT|n_trials={n}|objectives={objectives}"] for n in ns)
            assert abs(cost.predicted_ask_seconds(ns[-1], 8, objectives) - want) < 0.01


def test_the_bucket_is_the_vizier_adapters_padding():
    from spica_pipeline.optimize.vizier import trial_bucket

    for rows in (1, 8, 31, 32, 33, 64, 65, 100, 128, 129, 300):
        assert cost.suggest_bucket(rows) == trial_bucket(rows)


def test_replay_estimate_grows_with_requests_and_repeats():
    r = cost.predicted_replay_seconds
    assert r(None) == r(0) == cost.DEFAULT_REPLAY_S
    assert r(240) < r(10_000) and r(240, repeats=3) == 3 * r(240)


def test_the_share_rule():
    # 2 s of model time against 6 s of replays per worker: 25 % exactly fits, a little more does not
    assert cost.model_ask_fits(0.0, 2.0, replay_seconds=12.0, workers=2, share=0.25)
    assert not cost.model_ask_fits(0.1, 2.0, replay_seconds=12.0, workers=2, share=0.25)


def test_a_finished_trial_is_predicted_from_the_request_count_its_outcome_records():
    f = cost.outcome_replay_seconds
    assert f(None, {"request_count": 1896}, 1, 9.9) == cost.predicted_replay_seconds(1896)
    assert f({"num_requests": 240.0}, {}, 3, 9.9) == cost.predicted_replay_seconds(240, 3)
    assert f(None, None, 0, 9.9) == 9.9  # a failure without a request count: the a-priori estimate


def test_an_ask_is_charged_as_a_model_ask_only_when_a_model_answered_a_trial():
    """A model's seed batch handed to the neighbourhood designer (SEED_BATCH_TO_LOCAL) ran no
    model: charged as the designer that answered (round H), from the recorded designers only."""
    from spica_pipeline.optimize.neighbourhood import NEIGHBOURHOOD
    from spica_pipeline.optimize.study import _model_answered

    assert not _model_answered([NEIGHBOURHOOD] * 3 + ["QUASI_RANDOM_SEARCH"])  # seed batch, answered locally
    assert not _model_answered(["QUASI_RANDOM_SEARCH"] * 4)  # seed batch kept
    assert _model_answered(["DEFAULT", NEIGHBOURHOOD, "DEFAULT", NEIGHBOURHOOD])  # look-alikes replaced
    assert _model_answered(["GP_UCB_PE"])


class _ReplacingSampler:
    """A model whose every suggestion comes back answered by the neighbourhood designer (all
    look-alikes replaced): the model ran (`last_model_ran`), no trial names it."""

    def __new__(cls, ran, **kw):
        from test_async_dispatch import DesignerSampler

        class Sampler(DesignerSampler):
            def suggest_pending(self, count, history, pending, cheap):
                out, designer = super().suggest_pending(count, history, pending, cheap)
                self.last_model_ran = ran and not cheap
                return out, designer if cheap else "NEIGHBOURHOOD"

        return Sampler(**kw)


def _replacing_run(ran, journal=None, backend=None):
    from test_async_dispatch import SimBackend
    from test_study import build, score

    from spica_pipeline.optimize.study import run_branch_study
    from spica_pipeline.optimize.trial import StudySettings

    sampler = _ReplacingSampler(ran, seed=4, menu=range(2000))
    settings = StudySettings(per_round=4, max_rounds=20, workers=2, replay_estimate_s=0.2)
    result = run_branch_study("agg", sampler, build, None, score, settings, journal=journal,
                              backend=backend or SimBackend(2))
    return result, sampler


def test_a_model_ask_is_charged_when_the_model_ran_whoever_answered_its_trials():
    """Round I (study.CHARGE_MODEL_RAN): a model batch whose every suggestion was replaced still
    ran the model, so it is charged: the model keeps to its share of predicted wall time."""
    from spica_pipeline.optimize import study

    assert study.CHARGE_MODEL_RAN
    charged, sampler = _replacing_run(ran=True)
    model = sum(cost.predicted_ask_seconds(h + p, 4) for h, p, cheap in sampler.asks if not cheap and h)
    assert 0 < model <= 0.25 * (model + len(charged.records) * 0.2 / 2)
    # the same answers from a sampler that says no model ran: uncharged, so the model is asked more
    _, free = _replacing_run(ran=False)
    assert sum(not c for *_, c in sampler.asks) < sum(not c for *_, c in free.asks)


def test_the_model_ran_flag_is_journalled_so_a_resume_charges_the_same():
    import pytest
    from test_async_dispatch import SimBackend, rows

    from spica_pipeline.optimize.trial import MemoryJournal

    clean, _ = _replacing_run(ran=True)
    for kill_after in (3, 11, 25):
        journal = MemoryJournal()
        with pytest.raises(KeyboardInterrupt):
            _replacing_run(ran=True, journal=journal, backend=SimBackend(2, kill_after=kill_after))
        resumed, _ = _replacing_run(ran=True, journal=journal)
        assert rows(resumed) == rows(clean)
    assert any(e.get("model_ran") for entries, _ in journal.suggestions.values() for e in entries)
