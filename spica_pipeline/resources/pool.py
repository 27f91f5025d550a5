"""A pool of long-lived spawned worker processes that evaluate candidates with a wall-clock cap.

Why this shape (spec §7.5):
* "spawn", never fork: Dynamo's replay runs a Tokio runtime that does not survive a fork.
* The evaluator is pickled once per worker at start; each task ships only its `EvalRequest`, and a
  worker serves many requests, so a replay pays a pipe round trip, not a process start.
* A request is handed to a worker only when that worker is idle and has finished starting, and its
  deadline starts then: queue time and interpreter start-up never eat a candidate's budget (the
  same guarantee as Spica's waves of at most `workers` requests, without the wave barrier).
* Past its deadline a request becomes `timed_out` and its worker is killed and replaced; a worker
  that dies (segfault, os._exit) turns its request into `failed` naming the exit code, and is
  replaced. The caller never sees an exception from a candidate.
"""

import multiprocessing as mp
import os
import time
import traceback
from collections import deque
from multiprocessing.connection import Connection, wait
from typing import Any, Sequence

from spica_pipeline.search.evaluation import EvalOutcome, EvalRequest

STARTUP_TIMEOUT_S = 300.0
_READY = "ready"


def _worker_main(conn: Connection, evaluator: Any) -> None:
    """Worker loop: warm up once, then evaluate requests until a None arrives or the pipe closes."""
    os.environ.setdefault("DYN_LOG", "warn")
    try:
        warm = getattr(evaluator, "warm_up", None)
        if callable(warm):
            warm()
        conn.send((_READY, None))
    except Exception as exc:  # report and exit: the parent turns this into failed outcomes
        conn.send(("startup_error", f"{type(exc).__name__}: {exc}"))
        return
    while True:
        try:
            item = conn.recv()
        except (EOFError, OSError):
            return
        if item is None:
            return
        index, request = item
        started = time.perf_counter()
        try:
            outcome = evaluator.evaluate(request)
        except Exception as exc:
            last = traceback.extract_tb(exc.__traceback__)[-1:] or []
            where = f" at {os.path.basename(last[0].filename)}:{last[0].lineno}" if last else ""
            text = " ".join(str(exc).split())
            outcome = EvalOutcome("failed", reason=f"evaluator raised {type(exc).__name__}: {text}{where}",
                                  replay_seconds=time.perf_counter() - started)
        try:
            conn.send((index, outcome))
        except Exception as exc:  # e.g. an unpicklable report: still answer
            conn.send((index, EvalOutcome("failed", reason=f"outcome not transferable: {type(exc).__name__}: {exc}")))


class _Worker:
    def __init__(self, ctx: Any, evaluator: Any):
        parent, child = ctx.Pipe(duplex=True)
        self.conn: Connection = parent
        self.process = ctx.Process(target=_worker_main, args=(child, evaluator), daemon=True)
        self.process.start()
        child.close()
        self.ready = False
        self.task: tuple[int, float] | None = None  # (request index, deadline)

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=10)
        self.conn.close()

    def stop(self, timeout: float = 5.0) -> None:
        try:
            self.conn.send(None)
        except (OSError, ValueError, BrokenPipeError):
            pass
        self.process.join(timeout=timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5)
        self.conn.close()


def _exit_reason(process: Any) -> str:
    code = process.exitcode
    if code is None:
        return "worker process died (exit code unknown)"
    if code < 0:
        try:
            import signal

            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"worker process died (exit code {code}, {name})"
    return f"worker process died (exit code {code})"


class EvaluationPool:
    """Evaluate requests on `workers` spawned processes, each capped at `max_eval_seconds`.

    Use as a context manager (or call `close()`); workers start on the first wave.
    """

    def __init__(self, evaluator: Any, workers: int, max_eval_seconds: float | None = None):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if max_eval_seconds is not None and not max_eval_seconds > 0:
            raise ValueError(f"max_eval_seconds must be > 0 or None, got {max_eval_seconds}")
        self.evaluator = evaluator
        self.workers = int(workers)
        self.max_eval_seconds = max_eval_seconds
        self._ctx = mp.get_context("spawn")
        self._pool: list[_Worker] = []
        self._closed = False
        self.replaced = 0  # workers killed or lost and replaced (observability)

    # ---- lifecycle -----------------------------------------------------------------------

    def __enter__(self) -> "EvaluationPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for worker in self._pool:
            worker.stop()
        self._pool.clear()

    def _fill(self) -> None:
        while len(self._pool) < self.workers:
            self._pool.append(_Worker(self._ctx, self.evaluator))

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        self._pool.remove(worker)
        self.replaced += 1
        self._fill()

    # ---- evaluation ------------------------------------------------------------------------

    def evaluate_wave(self, requests: Sequence[EvalRequest]) -> list[EvalOutcome]:
        """Outcomes in the order of `requests`; never raises for a candidate."""
        if self._closed:
            raise RuntimeError("EvaluationPool is closed")
        results: list[EvalOutcome | None] = [None] * len(requests)
        todo = deque(range(len(requests)))
        self._fill()
        startup_deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while todo or any(w.task for w in self._pool):
            for worker in self._pool:
                if worker.ready and worker.task is None and todo:
                    index = todo.popleft()
                    deadline = math_inf if self.max_eval_seconds is None else time.monotonic() + self.max_eval_seconds
                    try:
                        worker.conn.send((index, requests[index]))
                        worker.task = (index, deadline)
                    except (OSError, ValueError, BrokenPipeError) as exc:
                        results[index] = EvalOutcome("failed", reason=f"could not send request to worker: {exc}")
                        self._replace(worker)
                        break
            waiting = {w.conn: w for w in self._pool}
            sentinels = {w.process.sentinel: w for w in self._pool}
            now = time.monotonic()
            deadlines = [w.task[1] for w in self._pool if w.task]
            if not any(w.ready for w in self._pool):
                deadlines.append(startup_deadline)
            timeout = max(0.0, min(deadlines) - now) if deadlines else None
            if timeout is not None and timeout == float("inf"):
                timeout = None
            ready = wait(list(waiting) + list(sentinels), timeout=timeout)
            handled: set[int] = set()
            for obj in ready:
                worker = waiting.get(obj) or sentinels.get(obj)
                if worker is None or id(worker) in handled or worker not in self._pool:
                    continue
                handled.add(id(worker))
                self._on_ready(worker, results)
            self._expire(results, startup_deadline)
        return [r if r is not None else EvalOutcome("failed", reason="no result") for r in results]

    def _on_ready(self, worker: _Worker, results: list[EvalOutcome | None]) -> None:
        try:
            if worker.conn.poll():
                message = worker.conn.recv()
            else:
                message = None
        except (EOFError, OSError):
            message = None
        if message is None:  # pipe closed or process exited without answering
            worker.process.join(timeout=5)
            reason = _exit_reason(worker.process)
            if worker.task is not None:
                index, _ = worker.task
                results[index] = EvalOutcome("failed", reason=f"{reason} while evaluating this candidate")
            elif not worker.ready:
                self._startup_failed(reason, results)
            self._replace(worker)
            return
        tag, payload = message
        if tag == _READY:
            worker.ready = True
        elif tag == "startup_error":
            self._startup_failed(f"worker failed to start: {payload}", results)
            self._replace(worker)
        else:
            results[tag] = payload
            worker.task = None

    def _startup_failed(self, reason: str, results: list[EvalOutcome | None]) -> None:
        """Workers that cannot start at all would loop forever: give up loudly on repeated failure."""
        self._startup_failures = getattr(self, "_startup_failures", 0) + 1
        if self._startup_failures > 3 * self.workers:
            raise RuntimeError(f"evaluation worker pool failed to start: {reason}; guard a script entrypoint "
                               "with `if __name__ == \"__main__\":` or evaluate sequentially")

    def _expire(self, results: list[EvalOutcome | None], startup_deadline: float) -> None:
        now = time.monotonic()
        for worker in list(self._pool):
            if worker.task is not None and now >= worker.task[1]:
                index, _ = worker.task
                results[index] = EvalOutcome(
                    "timed_out", reason=f"exceed runtime: replay > {self.max_eval_seconds:g}s",
                    replay_seconds=float(self.max_eval_seconds or 0.0))
                worker.task = None
                self._replace(worker)
        if not any(w.ready for w in self._pool) and now >= startup_deadline:
            raise RuntimeError(f"evaluation worker pool did not start within {STARTUP_TIMEOUT_S:g}s")


math_inf = float("inf")
