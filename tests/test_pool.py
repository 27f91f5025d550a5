import time

import pytest
from pool_fakes import BrokenWarmUp, FakeEvaluator, probe

from spica_pipeline.errors import BackendStartError
from spica_pipeline.evaluate.pool import EvaluationPool


def req(behaviour="ok", **extra):
    return probe(behaviour, **extra)


@pytest.fixture(scope="module")
def pool():
    with EvaluationPool(FakeEvaluator("shipped"), workers=2, max_eval_seconds=3.0) as p:
        yield p


def test_normal_in_order_and_evaluator_shipped_once(pool):
    outs = pool.evaluate_wave([req(value=i) for i in range(6)])
    assert [o.status for o in outs] == ["feasible"] * 6
    assert [o.report["value"] for o in outs] == list(range(6))
    pids = {o.report["pid"] for o in outs}
    assert len(pids) <= 2  # long-lived workers serve several requests
    assert all(o.derived["tag"] == "shipped" and o.derived["warm_pid"] == o.report["pid"] for o in outs)


def test_exception_becomes_failed(pool):
    outs = pool.evaluate_wave([req("raise"), req(value=1)])
    assert outs[0].status == "failed"
    assert "ValueError: candidate exploded" in outs[0].reason
    assert outs[1].status == "feasible"


def test_hang_times_out_and_worker_is_replaced(pool):
    before = pool.replaced
    t0 = time.monotonic()
    outs = pool.evaluate_wave([req("hang"), req(value=2)])
    elapsed = time.monotonic() - t0
    assert outs[0].status == "timed_out"
    assert outs[0].reason == "exceed runtime: replay > 3s"
    assert outs[1].status == "feasible" and outs[1].report["value"] == 2
    assert elapsed < 20
    assert pool.replaced == before + 1
    # the pool goes on with a fresh worker
    assert [o.status for o in pool.evaluate_wave([req(value=i) for i in range(3)])] == ["feasible"] * 3


@pytest.mark.parametrize("behaviour, code", [("exit", "exit code 7"), ("segv", "SIGSEGV")])
def test_dead_worker_fails_its_request_only(pool, behaviour, code):
    outs = pool.evaluate_wave([req(behaviour), req(value=5), req(value=6)])
    assert outs[0].status == "failed"
    assert "worker process died" in outs[0].reason and code in outs[0].reason
    assert [o.status for o in outs[1:]] == ["feasible", "feasible"]
    assert [o.status for o in pool.evaluate_wave([req(value=1), req(value=2)])] == ["feasible"] * 2


def test_queue_time_does_not_eat_budget():
    # 4 requests of 1.2 s on 2 workers with a 2 s cap: the second pair waits ~1.2 s in the queue
    # but must not time out, because its clock starts when a worker takes it.
    with EvaluationPool(FakeEvaluator(), workers=2, max_eval_seconds=2.0) as p:
        outs = p.evaluate_wave([req("slow", seconds=1.2, value=i) for i in range(4)])
    assert [o.status for o in outs] == ["feasible"] * 4


def test_no_timeout_when_unbounded():
    with EvaluationPool(FakeEvaluator(), workers=1, max_eval_seconds=None) as p:
        outs = p.evaluate_wave([req("slow", seconds=0.3), req()])
    assert [o.status for o in outs] == ["feasible", "feasible"]


def test_worker_that_cannot_start_is_an_environment_failure():
    """Exit 4 (BackendStartError), naming the worker's exception and where it was raised; the
    worker's traceback is kept for --debug."""
    with EvaluationPool(BrokenWarmUp(), workers=1, max_eval_seconds=5) as p:
        with pytest.raises(BackendStartError, match="failed to start: RuntimeError: no runtime here at pool_fakes.py") as err:
            p.evaluate_wave([req()])
    assert err.value.exit_code == 4 and str(err.value).startswith("environment failure: ")
    assert "Traceback" in err.value.debug_text and "no runtime here" in err.value.debug_text


def test_validation_and_closed():
    with pytest.raises(ValueError):
        EvaluationPool(FakeEvaluator(), workers=0)
    with pytest.raises(ValueError):
        EvaluationPool(FakeEvaluator(), workers=1, max_eval_seconds=0)
    p = EvaluationPool(FakeEvaluator(), workers=1)
    p.close()
    with pytest.raises(RuntimeError, match="closed"):
        p.evaluate_wave([req()])


# ---- the backend interface: submit one, stream completions, cancel, close ------------------

def test_completions_stream_as_they_finish_without_a_barrier(pool):
    slow = pool.submit(req("slow", seconds=1.0, value=1))
    fast = pool.submit(req(value=2))
    first = pool.wait()
    assert [c.ticket for c in first] == [fast]  # the quick one comes back while the slow one runs
    assert first[0].request.context["value"] == 2 and first[0].outcome.report["value"] == 2
    later = pool.submit(req(value=3))  # submitted while iterating: streamed too
    rest = {c.ticket: c.outcome.status for c in pool.completions()}
    assert rest == {slow: "feasible", later: "feasible"}
    assert pool.pending == 0 and pool.wait() == []


def test_wait_timeout_returns_empty_then_the_result(pool):
    ticket = pool.submit(req("slow", seconds=0.8))
    assert pool.wait(timeout=0.05) == []
    assert pool.pending == 1
    assert [c.ticket for c in pool.completions()] == [ticket]


def test_per_candidate_deadline_overrides_the_pool_default(pool):
    short = pool.submit(req("slow", seconds=2.0), max_seconds=0.5)
    normal = pool.submit(req("slow", seconds=0.2))
    out = {c.ticket: c.outcome for c in pool.completions()}
    assert out[short].status == "timed_out" and out[short].reason == "exceed runtime: replay > 0.5s"
    assert out[normal].status == "feasible"
    with pytest.raises(ValueError):
        pool.submit(req(), max_seconds=0)


def test_cancel_queued_and_running(pool):
    before = pool.replaced
    running = [pool.submit(req("hang")) for _ in range(2)]
    queued = pool.submit(req(value=9))
    assert pool.wait(timeout=1.5) == []  # both workers busy (or one still starting): nothing finishes
    assert pool.cancel(queued) and not pool.cancel(queued)
    assert all(pool.cancel(t) for t in running)  # running: the workers are stopped and replaced
    assert pool.pending == 0 and list(pool.completions()) == []
    assert pool.replaced >= before + 1
    assert [o.status for o in pool.evaluate_wave([req(value=1), req(value=2)])] == ["feasible"] * 2


def test_wave_helper_keeps_other_completions_for_wait(pool):
    streamed = pool.submit(req(value=7))
    outs = pool.evaluate_wave([req("slow", seconds=0.3, value=i) for i in range(2)])
    assert [o.report["value"] for o in outs] == [0, 1]
    (completion,) = pool.wait()
    assert completion.ticket == streamed and completion.outcome.report["value"] == 7


def test_closed_backend_refuses_work():
    p = EvaluationPool(FakeEvaluator(), workers=1)
    p.close()
    with pytest.raises(RuntimeError, match="closed"):
        p.submit(req())
