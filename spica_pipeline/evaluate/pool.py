"""Evaluation backends: where candidate replays run, behind one small interface.

`EvaluationBackend` is the seam between the study loop and the machines: submit one candidate,
receive completions as they finish (no barrier), cancel one, close. Two implementations:
`EvaluationPool` below (spawned processes on this machine, the default) and
`evaluate/ray_pool.py` (warm actors on a Ray cluster). `evaluate_wave` is a helper on top of the
interface for callers that still think in waves.

Why the local pool has this shape:
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

import abc
import multiprocessing as mp
import os
import sys
import time
import traceback
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.context import SpawnContext
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import EllipsisType
from typing import Any, Iterator, Sequence

from spica_pipeline.errors import BackendStartError, one_line
from spica_pipeline.evaluate.evaluator import EvalOutcome, EvalRequest, Evaluator

STARTUP_TIMEOUT_S = 300.0
_READY = "ready"


# --------------------------------------------------------------------------------------------
# the interface
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Completion:
    """One finished candidate: the ticket `submit` returned, its request and its outcome."""

    ticket: int
    request: EvalRequest
    outcome: EvalOutcome


class EvaluationBackend(abc.ABC):
    """Runs candidates on `workers` evaluators at once, each capped at a per-candidate deadline.

    * `submit(request, max_seconds=...)` queues one candidate and returns its ticket. Its deadline
      (default `max_eval_seconds`; None = unbounded) starts when a worker takes it, not at submit.
    * `wait(timeout)` blocks until at least one candidate finished and returns every completion
      ready so far; [] when nothing is pending or `timeout` passed. `completions()` streams them.
    * `cancel(ticket)` drops a queued candidate or stops a running one; it yields no completion.
    * `close()` stops the workers; also on leaving a `with` block.

    A candidate never raises: an evaluator exception is `failed`, a deadline is `timed_out` with
    reason "exceed runtime: replay > Ns", a lost worker is `failed` naming why. Only a backend that
    cannot run anything at all (workers that never start, a Ray it cannot start or reach) raises,
    from `submit` or `wait`: `BackendStartError`, an environment failure (CLI exit 4).
    """

    workers: int
    max_eval_seconds: float | None

    def __init__(self, workers: int, max_eval_seconds: float | None):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        _check_limit(max_eval_seconds, "max_eval_seconds")
        self.workers = int(workers)
        self.max_eval_seconds = max_eval_seconds
        self._closed = False
        self._next_ticket = 0
        self._outstanding: set[int] = set()
        self._stash: list[Completion] = []  # completions evaluate_wave received for other tickets
        # completions an implementation collected while submitting (it hands work to an idle worker
        # at once); the next wait returns them before asking `_wait` for more
        self._early: list[Completion] = []

    # ---- what an implementation provides --------------------------------------------------

    @abc.abstractmethod
    def _submit(self, ticket: int, request: EvalRequest, max_seconds: float | None) -> None: ...

    @abc.abstractmethod
    def _wait(self, timeout: float | None) -> list[Completion]:
        """Block until a completion is ready or `timeout` passed; only called with work pending."""

    @abc.abstractmethod
    def _cancel(self, ticket: int) -> None: ...

    @abc.abstractmethod
    def _close(self) -> None: ...

    # ---- the interface --------------------------------------------------------------------

    def __enter__(self) -> "EvaluationBackend":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def pending(self) -> int:
        """Submitted, not yet returned by `wait` and not cancelled."""
        return len(self._outstanding)

    def submit(self, request: EvalRequest, *, max_seconds: float | None | EllipsisType = ...) -> int:
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed")
        limit = self.max_eval_seconds if max_seconds is ... else max_seconds
        _check_limit(limit, "max_seconds")
        self._next_ticket += 1
        ticket = self._next_ticket
        self._outstanding.add(ticket)
        self._submit(ticket, request, limit)
        return ticket

    def wait(self, timeout: float | None = None) -> list[Completion]:
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed")
        if self._stash:
            done, self._stash = self._stash, []
            return done
        if not self._outstanding:
            return []
        done = [c for c in self._ready(timeout) if c.ticket in self._outstanding]
        self._outstanding.difference_update(c.ticket for c in done)
        return done

    def completions(self, timeout: float | None = None) -> Iterator[Completion]:
        """Each completion as it finishes, until nothing is pending (tickets submitted while
        iterating are included) or `timeout` passed without one."""
        while self.pending or self._stash:
            batch = self.wait(timeout)
            if not batch:
                return
            yield from batch

    def cancel(self, ticket: int) -> bool:
        """True when `ticket` was pending; a running candidate's worker is stopped and replaced."""
        self._stash = [c for c in self._stash if c.ticket != ticket]
        self._early = [c for c in self._early if c.ticket != ticket]
        if ticket not in self._outstanding:
            return False
        self._outstanding.discard(ticket)
        self._cancel(ticket)
        return True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._outstanding.clear()
        self._early.clear()
        self._close()

    def evaluate_wave(self, requests: Sequence[EvalRequest]) -> list[EvalOutcome]:
        """Outcomes in the order of `requests` (a helper over submit/wait); never raises for a candidate."""
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed")
        tickets = {self.submit(request): i for i, request in enumerate(requests)}
        results: list[EvalOutcome | None] = [None] * len(requests)
        others, self._stash = self._stash, []  # earlier completions of other tickets stay for `wait`
        left = len(tickets)
        try:
            while left:
                for completion in self._wait_own():
                    if completion.ticket in tickets:
                        results[tickets[completion.ticket]] = completion.outcome
                        left -= 1
                    else:
                        others.append(completion)
        finally:
            self._stash = others + self._stash
        return [r if r is not None else EvalOutcome("failed", reason="no result") for r in results]

    def _ready(self, timeout: float | None) -> list[Completion]:
        if self._early:
            done, self._early = self._early, []
            return done
        return self._wait(timeout)

    def _wait_own(self) -> list[Completion]:
        done = [c for c in self._ready(None) if c.ticket in self._outstanding]
        self._outstanding.difference_update(c.ticket for c in done)
        return done


def _check_limit(value: float | None, name: str) -> None:
    if value is not None and not value > 0:
        raise ValueError(f"{name} must be > 0 or None, got {value}")


def timed_out_outcome(limit: float | None) -> EvalOutcome:
    """The one way a deadline is recorded, whatever the backend."""
    return EvalOutcome("timed_out", reason=f"exceed runtime: replay > {limit or 0:g}s",
                       replay_seconds=float(limit or 0.0))


def _where(exc: BaseException) -> str:
    """" at file.py:LINE" of the frame that raised, or ""."""
    last = traceback.extract_tb(exc.__traceback__)[-1:] or []
    return f" at {os.path.basename(last[0].filename)}:{last[0].lineno}" if last else ""


def evaluate_safely(evaluator: Evaluator, request: EvalRequest) -> EvalOutcome:
    """Run one candidate in a worker; an evaluator exception becomes `failed` naming type and line
    (the same text on every backend, so ledgers compare equal)."""
    started = time.perf_counter()
    try:
        return evaluator.evaluate(request)
    except Exception as exc:
        return EvalOutcome("failed", reason=f"evaluator raised {type(exc).__name__}: {one_line(str(exc))}{_where(exc)}",
                           replay_seconds=time.perf_counter() - started)


ENGINE_LOG = "logs/engine.log"  # the replay runtime's own output, under the run directory
# the replay runtime's logger and its per-replay progress bar: no colour codes, even on a terminal
_PLAIN_OUTPUT = {"NO_COLOR": "1", "DYN_SDK_DISABLE_ANSI_LOGGING": "1"}


def send_engine_output(log_path: str | os.PathLike[str] | None) -> None:
    """Point this worker's stdout and stderr at `log_path` (appended; None keeps them), before the
    replay runtime starts. Its Rust logger (DYN_LOG) and per-replay progress bar write to file
    descriptors 1 and 2 directly, so the descriptors move, not only sys.stderr: the console is left
    to the sweep's own lines. Colour codes are off either way."""
    for name, value in _PLAIN_OUTPUT.items():
        os.environ.setdefault(name, value)
    if log_path is None:
        return
    path = Path(log_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)  # one file, whole lines, many writers
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)
    os.write(2, f"--- replay worker pid {os.getpid()} started\n".encode())


def warm_up(evaluator: Evaluator) -> None:
    """Import runtimes and build per-process tables once, before the first candidate's clock starts."""
    os.environ.setdefault("DYN_LOG", "warn")
    for name, value in _PLAIN_OUTPUT.items():
        os.environ.setdefault(name, value)
    warm = getattr(evaluator, "warm_up", None)
    if callable(warm):
        warm()


# --------------------------------------------------------------------------------------------
# the local spawned pool
# --------------------------------------------------------------------------------------------

def _worker_main(conn: Connection, evaluator: Evaluator, log_path: str | None = None) -> None:
    """Worker loop: warm up once, then evaluate requests until a None arrives or the pipe closes.
    `log_path`: where the replay runtime's output goes (see `send_engine_output`)."""
    try:
        send_engine_output(log_path)
        warm_up(evaluator)
        conn.send((_READY, None))
    except Exception as exc:  # report and exit: the parent gives up after repeated start failures
        conn.send(("startup_error", (one_line(f"{type(exc).__name__}: {exc}") + _where(exc),
                                     traceback.format_exc())))
        return
    while True:
        try:
            item = conn.recv()
        except (EOFError, OSError):
            return
        if item is None:
            return
        ticket, request = item
        outcome = evaluate_safely(evaluator, request)
        try:
            conn.send((ticket, outcome))
        except Exception as exc:  # e.g. an unpicklable report: still answer
            conn.send((ticket, EvalOutcome("failed", reason=f"outcome not transferable: {type(exc).__name__}: {exc}")))


@dataclass
class _Task:
    ticket: int
    deadline: float
    limit: float | None


class _Worker:
    def __init__(self, ctx: SpawnContext, evaluator: Evaluator, log_path: str | None = None):
        parent, child = ctx.Pipe(duplex=True)
        self.conn: Connection = parent
        self.process = ctx.Process(target=_worker_main, args=(child, evaluator, log_path), daemon=True)
        self.process.start()
        child.close()
        self.started = time.monotonic()
        self.ready = False
        self.task: _Task | None = None

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


def _exit_reason(process: BaseProcess) -> str:
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


class EvaluationPool(EvaluationBackend):
    """Evaluate requests on `workers` spawned processes, each capped at `max_eval_seconds`.

    Use as a context manager (or call `close()`); workers start on the first submit.
    `log_path`: the file every worker's stdout and stderr (the replay runtime's log lines and
    progress bars) is appended to; None leaves them on this process's stderr.
    """

    def __init__(self, evaluator: Evaluator, workers: int, max_eval_seconds: float | None = None, *,
                 log_path: str | os.PathLike[str] | None = None):
        super().__init__(workers, max_eval_seconds)
        self.evaluator = evaluator
        self.log_path = None if log_path is None else str(log_path)
        self._ctx = mp.get_context("spawn")
        self._pool: list[_Worker] = []
        self._queue: deque[tuple[int, float | None]] = deque()  # (ticket, limit), in submit order
        self._requests: dict[int, EvalRequest] = {}
        self._startup_failures = 0
        self._startup_traceback: str | None = None  # the last worker start-up traceback, for --debug
        self.replaced = 0  # workers killed or lost and replaced (observability)

    # ---- lifecycle -----------------------------------------------------------------------

    def _close(self) -> None:
        # A busy or still-starting worker would not read the stop message for as long as its replay
        # runs: kill it (its result is discarded anyway), so SIGTERM / Ctrl-C stop within seconds.
        for worker in self._pool:
            if worker.task is not None or not worker.ready:
                worker.kill()
            else:
                worker.stop()
        self._pool.clear()
        self._queue.clear()
        self._requests.clear()

    def _fill(self) -> None:
        while len(self._pool) < self.workers:
            try:
                self._pool.append(_Worker(self._ctx, self.evaluator, self.log_path))
            except OSError as exc:  # fork/exec refused: process or memory limits (EAGAIN, ENOMEM)
                raise BackendStartError(
                    f"the local worker pool cannot start a process: {type(exc).__name__}: {one_line(str(exc))}",
                    "free memory or processes on this machine (ulimit -u), or lower sweep.parallel_evals",
                ) from exc

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        self._pool.remove(worker)
        self.replaced += 1
        self._fill()

    # ---- the interface ---------------------------------------------------------------------

    def _submit(self, ticket: int, request: EvalRequest, max_seconds: float | None) -> None:
        self._requests[ticket] = request
        self._queue.append((ticket, max_seconds))
        self._fill()
        self._early.extend(self._wait(0.0))  # hand it to an idle worker now, not at the next wait

    def _cancel(self, ticket: int) -> None:
        self._requests.pop(ticket, None)
        self._queue = deque(item for item in self._queue if item[0] != ticket)
        for worker in self._pool:
            if worker.task is not None and worker.task.ticket == ticket:
                worker.task = None
                self._replace(worker)
                break

    def _wait(self, timeout: float | None) -> list[Completion]:
        """Dispatch, then collect answers, deaths and deadlines until one completes or `timeout`."""
        end = None if timeout is None else time.monotonic() + timeout
        done: list[Completion] = []
        self._fill()
        while True:
            self._dispatch(done)
            if done or not (self._queue or any(w.task for w in self._pool)):
                return done
            now = time.monotonic()
            deadlines = [w.task.deadline for w in self._pool if w.task]
            if not any(w.ready for w in self._pool):
                deadlines.append(self._startup_deadline())
            if end is not None:
                deadlines.append(end)
            finite = [d for d in deadlines if d != float("inf")]
            ready = wait([w.conn for w in self._pool] + [w.process.sentinel for w in self._pool],
                         timeout=max(0.0, min(finite) - now) if finite else None)
            by_handle: dict[object, _Worker] = {w.conn: w for w in self._pool}
            by_handle.update({w.process.sentinel: w for w in self._pool})
            handled: set[int] = set()
            for obj in ready:
                worker = by_handle.get(obj)
                if worker is None or id(worker) in handled or worker not in self._pool:
                    continue
                handled.add(id(worker))
                self._on_ready(worker, done)
            self._expire(done)
            if done or (end is not None and time.monotonic() >= end):
                return done

    # ---- internals ---------------------------------------------------------------------------

    def _startup_deadline(self) -> float:
        return min((w.started for w in self._pool), default=time.monotonic()) + STARTUP_TIMEOUT_S

    def _complete(self, ticket: int, outcome: EvalOutcome, done: list[Completion]) -> None:
        request = self._requests.pop(ticket, None)
        if request is not None:  # else cancelled meanwhile
            done.append(Completion(ticket, request, outcome))

    def _dispatch(self, done: list[Completion]) -> None:
        for worker in list(self._pool):
            if not (worker.ready and worker.task is None and self._queue):
                continue
            ticket, limit = self._queue.popleft()
            deadline = float("inf") if limit is None else time.monotonic() + limit
            try:
                worker.conn.send((ticket, self._requests[ticket]))
                worker.task = _Task(ticket, deadline, limit)
            except (OSError, ValueError, BrokenPipeError) as exc:
                self._complete(ticket, EvalOutcome("failed", reason=f"could not send request to worker: {exc}"), done)
                self._replace(worker)

    def _on_ready(self, worker: _Worker, done: list[Completion]) -> None:
        try:
            message = worker.conn.recv() if worker.conn.poll() else None
        except (EOFError, OSError):
            message = None
        if message is None:  # pipe closed or process exited without answering
            worker.process.join(timeout=5)
            reason = _exit_reason(worker.process)
            if worker.task is not None:
                self._complete(worker.task.ticket,
                               EvalOutcome("failed", reason=f"{reason} while evaluating this candidate"), done)
            elif not worker.ready:
                self._startup_failed(reason)
            self._replace(worker)
            return
        tag, payload = message
        if tag == _READY:
            worker.ready = True
        elif tag == "startup_error":
            reason, self._startup_traceback = payload
            self._startup_failed(f"worker failed to start: {reason}")
            self._replace(worker)
        else:
            worker.task = None
            self._complete(tag, payload, done)

    def _startup_failed(self, reason: str) -> None:
        """Workers that cannot start at all would loop forever: give up loudly on repeated failure."""
        self._startup_failures += 1
        if self._startup_failures > 3 * self.workers:
            raise BackendStartError(
                f"the local worker pool cannot start its workers ({self._startup_failures} tries): {reason}",
                "check that the replay runtime imports in a fresh Python process (--debug prints the worker's "
                "traceback); a script calling spica must guard its entry point with `if __name__ == \"__main__\":`",
                debug_text=self._startup_traceback)

    def _expire(self, done: list[Completion]) -> None:
        now = time.monotonic()
        for worker in list(self._pool):
            if worker.task is not None and now >= worker.task.deadline:
                self._complete(worker.task.ticket, timed_out_outcome(worker.task.limit), done)
                worker.task = None
                self._replace(worker)
        if not any(w.ready for w in self._pool) and now >= self._startup_deadline():
            raise BackendStartError(f"no local worker process started within {STARTUP_TIMEOUT_S:g}s",
                                    "the machine is overloaded or short of memory: free it or lower "
                                    "sweep.parallel_evals")
