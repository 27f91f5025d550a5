"""Contract suites run over every implementation of an interface, real and fake, so a fake cannot
drift from what the product path relies on (the Optuna `testing/storages.py` pattern).

* Evaluators: the real `ReplayEvaluator` on a tiny case and every test fake. Each subclasses
  `Evaluator`, survives pickling (the spawned pool ships it to workers), never raises for a
  candidate, and returns an `EvalOutcome` whose status is known, whose feasible report is numbers,
  which survives the journal's JSON round trip, and which is the same for the same request.
* Journals: `MemoryJournal` and `FileJournal` memoise suggestions and outcomes the same way (first
  outcome per spec wins); the file journal also reads them back after a reopen.
"""

import json
import math
import pickle
from typing import get_args

import pytest
from dagster_fakes import FakeEvaluator as DagsterFake
from dagster_fakes import InfeasibleEvaluator
from pool_fakes import PROBE
from pool_fakes import FakeEvaluator as PoolFake
from reliability_fakes import FaultyEvaluator
from sweep_fakes import AggFailsEvaluator, CapacityEvaluator
from test_deploy import agg_candidate, disagg_candidate

from spica_pipeline.evaluate.evaluator import EvalOutcome, EvalRequest, Evaluator, Status
from spica_pipeline.optimize.journal import FileJournal
from spica_pipeline.optimize.trial import Journal, MemoryJournal

THROUGHPUT = {"target": "throughput"}
TINY = {"isl": 256, "osl": 8, "concurrency": 1, "num_request_ratio": 1}


def _replay():
    from spica_pipeline.evaluate.replay import ReplayEvaluator

    return ReplayEvaluator()


def _version():
    from spica_pipeline.space.model_hw import latest_backend_version

    return latest_backend_version("h200_sxm", "vllm")


# (id, factory, request factory): each evaluator on a candidate it handles normally
EVALUATORS = [
    ("replay", _replay, lambda: EvalRequest(agg_candidate(backend_version=_version(), tp=1, replicas=1, used_gpus=1),
                                            TINY, THROUGHPUT)),
    ("dagster-fake", DagsterFake, lambda: EvalRequest(agg_candidate(), TINY, THROUGHPUT)),
    ("dagster-infeasible", InfeasibleEvaluator, lambda: EvalRequest(agg_candidate(), TINY, THROUGHPUT)),
    ("sweep-agg-fails", AggFailsEvaluator, lambda: EvalRequest(agg_candidate(), TINY, THROUGHPUT)),
    ("sweep-agg-fails-disagg", AggFailsEvaluator, lambda: EvalRequest(disagg_candidate(), TINY, THROUGHPUT)),
    ("sweep-capacity", CapacityEvaluator, lambda: EvalRequest(agg_candidate(), TINY, THROUGHPUT)),
    ("pool-fake", PoolFake, lambda: EvalRequest(PROBE, TINY, THROUGHPUT, {"behaviour": "ok", "value": 3})),
    ("reliability-faulty", FaultyEvaluator, lambda: EvalRequest(agg_candidate(replicas=1), TINY, THROUGHPUT)),
]


@pytest.fixture(params=EVALUATORS, ids=[e[0] for e in EVALUATORS])
def evaluator_case(request):
    name, factory, make_request = request.param
    if name == "replay":
        request.applymarker(pytest.mark.integration)
    return name, factory(), make_request()


def test_evaluator_contract(evaluator_case):
    name, evaluator, request = evaluator_case
    assert isinstance(evaluator, Evaluator), f"{name}: a fake subclasses the interface it stands in for"
    evaluator = pickle.loads(pickle.dumps(evaluator))  # what the spawned pool does

    outcome = evaluator.evaluate(request)
    assert isinstance(outcome, EvalOutcome)
    assert outcome.status in get_args(Status), outcome.status
    if outcome.status == "feasible":
        assert outcome.report, f"{name}: a feasible outcome carries its report"
        assert all(isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
                   and math.isfinite(v) for k, v in outcome.report.items()), outcome.report
    else:
        assert isinstance(outcome.reason, str) and outcome.reason, f"{name}: a non-feasible outcome says why"
    assert outcome.replay_seconds >= 0
    # the journal stores it as JSON and reads it back
    assert EvalOutcome.from_dict(json.loads(json.dumps(outcome.to_dict()))) == outcome
    # same request, same answer (resume and dedup rely on it)
    again = evaluator.evaluate(request)
    assert (again.status, again.reason, again.report) == (outcome.status, outcome.reason, outcome.report)


# --------------------------------------------------------------------------------------------
# journals

def _memory(tmp_path):
    return MemoryJournal()


def _file(tmp_path):
    return FileJournal(tmp_path / "journal.jsonl")


@pytest.fixture(params=[_memory, _file], ids=["memory", "file"])
def journal(request, tmp_path):
    j = request.param(tmp_path)
    yield j
    if hasattr(j, "close"):
        j.close()


def test_journal_contract(journal):
    assert Journal in type(journal).__mro__  # subclassed, not merely duck-typed
    assert journal.get_suggestions("k") is None and journal.get_outcome("h") is None
    journal.put_suggestions("k", [{"x": 1.0}, {"x": 2.0}], 0.5)
    assert journal.get_suggestions("k") == [{"x": 1.0}, {"x": 2.0}]
    first = EvalOutcome("feasible", report={"v": 1.0}, replay_seconds=0.1)
    journal.put_outcome(3, "h", first)
    journal.put_outcome(9, "h", EvalOutcome("failed", reason="later"))  # the first outcome per spec wins
    assert journal.get_outcome("h") == (3, first)
    assert journal.get_outcome("other") is None


def test_file_journal_reads_back_after_a_reopen(tmp_path):
    j = FileJournal(tmp_path / "journal.jsonl")
    outcome = EvalOutcome("infeasible", reason="over gpu_budget", report={"v": 2.0})
    j.put_suggestions("k", [{"x": 1.0}], 0.2)
    j.put_outcome(1, "h", outcome)
    j.close()
    again = FileJournal(tmp_path / "journal.jsonl")
    assert again.loaded_records == 2
    assert again.get_suggestions("k") == [{"x": 1.0}] and again.get_outcome("h") == (1, outcome)
    again.close()
