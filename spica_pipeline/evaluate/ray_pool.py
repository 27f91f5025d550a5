"""Candidate replays on a Ray cluster: the `EvaluationBackend` of the local pool, on warm actors.

Why this shape:
* Warm, long-lived actors, one CPU each, run the same evaluator as the local pool: it is put in the
  object store once and each actor calls `warm_up()` before it reports ready, so runtimes and the
  in-process timing/KV memo are built once per actor, and the on-disk cache (`cache_dir`, default
  `$SPICA_CACHE_DIR`) once per node.
* The driver keeps the queue, the deadlines and the journal; a candidate goes to an idle, ready
  actor and its deadline starts then. Past it the actor is killed and replaced and the candidate is
  `timed_out` with the local pool's reason text.
* A lost actor or node (process crash, node death) is retried once on a fresh actor; a second loss
  is `failed` naming both causes. A retry is recorded in `outcome.derived["evaluation_retry"]`.
* Completions stream back as each actor answers (ray.wait on the in-flight refs): no barrier.
* `ray` is imported only when the backend starts (the `[ray]` extra). With no address it starts a
  local Ray on this machine's CPUs, bound to 127.0.0.1 and without the dashboard, and shuts it down
  on `close()`; with `address` (or `RAY_ADDRESS`) it connects and only disconnects. `ray://host:port`
  goes through the Ray Client server of the head node (docs/ray.md).
* What the sweep's input cannot fix is an environment failure (`BackendStartError`, CLI exit 4): a
  Ray that does not start here, an address nothing answers at, actors that never start. The ray
  package missing while `sweep.executor: ray` is bad input (exit 2, `require_ray`): the config
  asks for an extra this install lacks, and `spica validate` says so before any replay.
"""

import logging
import os
import socket
import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from spica_pipeline.errors import BackendStartError, ConfigError
from spica_pipeline.evaluate.evaluator import EvalOutcome, EvalRequest, Evaluator
from spica_pipeline.evaluate.pool import (
    STARTUP_TIMEOUT_S,
    Completion,
    EvaluationBackend,
    evaluate_safely,
    send_engine_output,
    timed_out_outcome,
    warm_up,
)

log = logging.getLogger("spica_pipeline.ray_pool")

RAY_ADDRESS_ENV = "RAY_ADDRESS"
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
LOCAL_OBJECT_STORE_BYTES = 256 * 1024 * 1024  # requests and outcomes are small JSON-like values
MAX_RETRIES = 1
# Ray's own connect to a GCS address retries for minutes when nothing listens there; a plain TCP
# connect first answers a wrong host or port in at most this long
CONNECT_PROBE_S = 10.0
# exception types that mean a bug in spica, not the machine: they keep their traceback (exit 3)
_BUGS = (TypeError, AttributeError, NameError, KeyError, IndexError, AssertionError)


class EvaluatorActor:
    """One warm worker: holds the evaluator, answers one candidate at a time (wrapped by ray.remote)."""

    def __init__(self, evaluator: Evaluator, log_path: str | None = None):
        self.evaluator = evaluator
        send_engine_output(log_path)
        warm_up(evaluator)

    def where(self) -> dict[str, Any]:
        import ray

        ctx = ray.get_runtime_context()
        return {"pid": os.getpid(), "node_id": ctx.get_node_id(), "ip": ray.util.get_node_ip_address()}

    def evaluate(self, request: EvalRequest) -> EvalOutcome:
        return evaluate_safely(self.evaluator, request)


@dataclass
class _Item:
    ticket: int
    limit: float | None
    lost: str | None = None  # why the first attempt was lost (set once it is being retried)


class _Actor:
    """Driver-side state of one actor: starting (probe pending), idle, or busy with one item."""

    def __init__(self, handle: Any, probe: Any):
        self.handle = handle
        self.probe = probe  # ObjectRef of where(); None once ready
        self.started = time.monotonic()
        self.info: dict[str, Any] = {}
        self.item: _Item | None = None
        self.ref: Any = None
        self.deadline = float("inf")

    @property
    def ready(self) -> bool:
        return self.probe is None

    def describe(self) -> str:
        if not self.info:
            return "Ray worker"
        return f"Ray worker pid {self.info.get('pid')} on node {self.info.get('ip')}"


def loopback_only() -> None:
    """Make a Ray started from this process use 127.0.0.1 for every node and server.

    Ray on Linux replaces 127.0.0.1 by the host's routable address and its servers then listen on
    all interfaces; with `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` (read once at import, inherited by
    the GCS, raylets and workers) it keeps the loopback address, as it does on a laptop. Call
    before `ray.init` / `ray.cluster_utils.Cluster` for a single-machine Ray; never for a cluster."""
    os.environ[LOOPBACK_ENV] = "0"
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:  # ray was imported before: its node-address rule reads this flag
        setattr(constants, "ENABLE_RAY_CLUSTER", False)


def require_ray() -> Any:
    """The ray module, or bad input (exit 2) naming the field and the extra to install."""
    try:
        import ray
    except ImportError as err:  # the optional extra is missing (or broken)
        raise ConfigError(f"sweep.executor: 'ray' needs the ray package, which cannot be imported here "
                          f"({type(err).__name__}: {err}): pip install 'spica-pipeline[ray]', "
                          "or set sweep.executor: local") from err
    return ray


def _host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of "ray://host:port" or "host:port"; None for "auto", "local" and other forms."""
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def _probe(address: str, source: str) -> None:
    """Fail within `CONNECT_PROBE_S` when nothing accepts a TCP connection at `address`."""
    target = _host_port(address)
    if target is None:
        return
    try:
        socket.create_connection(target, timeout=CONNECT_PROBE_S).close()
    except OSError as err:
        raise BackendStartError(
            f"cannot reach Ray at {address} ({source}): {type(err).__name__}: {err.strerror or err}",
            "start the Ray cluster (the head's Ray Client port for ray://, its GCS port otherwise) or correct "
            "the address") from err


def _send_token_if_available() -> None:
    """Send the cluster's token through the Ray Client as `ray.init` does for a GCS address.

    Ray 2.60 starts clusters with token authentication by default; `ray.init("host:port")` turns it
    on in the driver when a token is available (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token)
    and RAY_AUTH_MODE is unset, but `ray.init("ray://...")` does not, and the client server then
    refuses every call until the connection times out (docs/ray.md). An explicit RAY_AUTH_MODE wins."""
    try:
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:  # another Ray version: its own rules apply
        return
    noisy = logging.getLogger("ray._private.authentication.authentication_token_setup")
    level = noisy.level
    noisy.setLevel(logging.ERROR)  # "token authentication is enabled" is not news for a sweep
    try:
        maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    finally:
        noisy.setLevel(level)


def _short(exc: BaseException) -> str:
    """One line: the exception type and the first line of its message (Ray's are pages long); a
    message "...:" followed by a remote traceback keeps that traceback's last line (its error)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else ""
    if len(lines) > 1 and text.endswith(":"):
        text += " " + (lines[-1] if lines[1].startswith("Traceback") else lines[1])
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


class RayEvaluationPool(EvaluationBackend):
    """Evaluate candidates on `workers` Ray actors (one CPU each), each capped at its deadline.

    address: a Ray cluster ("ray://host:10001" or "host:6379"); None reads `RAY_ADDRESS`, and with
        neither a local Ray is started on this machine's CPUs. A driver already connected
        (`ray.is_initialized()`) is used as it is and left connected.
    log_path: where the actors' stdout and stderr (the replay runtime's output) are appended, when
        the Ray is one this pool starts on this machine; on a cluster the path is not this
        machine's, so the output stays in Ray's own worker logs on each node (never on this console:
        the driver connects with log_to_driver off).
    """

    def __init__(self, evaluator: Evaluator, workers: int, max_eval_seconds: float | None = None, *,
                 address: str | None = None, num_cpus: int | None = None,
                 log_path: str | os.PathLike[str] | None = None):
        super().__init__(workers, max_eval_seconds)
        self.evaluator = evaluator
        self.log_path = None if log_path is None else str(log_path)
        self._actor_log: str | None = None  # log_path once the Ray turns out to be local
        self.address = address or os.environ.get(RAY_ADDRESS_ENV) or None
        self.address_source = ("sweep.ray_address" if address else f"${RAY_ADDRESS_ENV}" if self.address
                               else "a local Ray")
        require_ray()  # a missing extra is refused at sweep start, before any replay
        self.num_cpus = num_cpus  # only for a locally started Ray; None = all of this machine's
        self._ray: Any = None
        self._owns_connection = False
        self._evaluator_ref: Any = None
        self._actor_class: Any = None
        self._actors: list[_Actor] = []
        self._queue: deque[_Item] = deque()
        self._requests: dict[int, EvalRequest] = {}
        self._startup_failures = 0
        self.replaced = 0  # actors killed or lost and replaced
        self.retried = 0  # candidates retried after a lost actor

    # ---- lifecycle -----------------------------------------------------------------------

    def _start(self) -> None:
        if self._ray is not None:
            return
        connected = getattr(sys.modules.get("ray"), "is_initialized", lambda: False)()
        if not connected and not self.address:  # a Ray of our own on this machine: loopback only
            loopback_only()
        ray = require_ray()
        if not ray.is_initialized():
            quiet = dict(log_to_driver=False, logging_level=logging.WARNING)  # also valid for ray:// clients
            if self.address:
                self._connect(ray, quiet, self.address)
            else:
                self._start_local(ray, quiet)
                self._actor_log = self.log_path  # its actors run here and can write the run's log
            self._owns_connection = True
        self._ray = ray
        try:
            self._evaluator_ref = ray.put(self.evaluator)
            total = int(ray.cluster_resources().get("CPU", 0))
        except _BUGS:
            raise
        except Exception as err:  # the connection broke right after it was made
            raise BackendStartError(f"Ray at {self.address or 'this machine'} stopped answering: {_short(err)}",
                                    "check the Ray cluster") from err
        self._actor_class = ray.remote(EvaluatorActor).options(
            num_cpus=1, max_restarts=0, max_task_retries=0, max_concurrency=1)
        if total < self.workers:
            log.warning("Ray cluster has %d CPUs for %d workers: %d wait for a CPU", total, self.workers,
                        self.workers - total)
        self._fill()

    def _connect(self, ray: Any, quiet: dict[str, Any], address: str) -> None:
        """Connect to the cluster at `address`: exit 4 naming the address and where it came from when
        it cannot (ray:// gives up after ~30 s by itself; a GCS address is probed first)."""
        _probe(address, self.address_source)
        client = address.startswith("ray://")
        if client:
            _send_token_if_available()
        for attempt in (1, 2):
            try:
                ray.init(address=address, **quiet)
                return
            except _BUGS:
                raise
            except Exception as err:
                ray.shutdown()
                # the client server answered, but its server for this driver did not come up within
                # Ray's 30 s (a busy head): once more, as for a local Ray
                if client and attempt == 1 and isinstance(err, ConnectionAbortedError):
                    log.warning("Ray Client at %s refused the session (%s); trying once more", address,
                                _short(err))
                    continue
                todo = "check that the cluster runs and that this driver's ray version matches the cluster's"
                if client:
                    todo += (" (a cluster with token authentication, Ray's default, also needs its token here: "
                             "RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)")
                raise BackendStartError(
                    f"cannot connect to Ray at {address} ({self.address_source}): {_short(err)}", todo) from err

    def _start_local(self, ray: Any, quiet: dict[str, Any]) -> None:
        """Start a Ray of our own; a raylet has a fixed 30 s to register, which a busy host can miss
        once, so one more try before giving up."""
        for attempt in (1, 2):
            try:
                ray.init(address="local", num_cpus=self.num_cpus, object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                         include_dashboard=False, **quiet)
                return
            except Exception as err:
                ray.shutdown()
                if attempt == 2:
                    raise BackendStartError(f"a local Ray could not start on this machine: {_short(err)}",
                                            "free CPU and memory here (a Ray node must register within 30 s), "
                                            "or use sweep.executor: local") from err
                log.warning("local Ray did not start (%s); trying once more", _short(err))

    def _close(self) -> None:
        ray = self._ray
        if ray is None:
            return
        for actor in self._actors:
            self._kill(actor)
        self._actors.clear()
        self._queue.clear()
        self._requests.clear()
        if self._owns_connection:
            ray.shutdown()
        self._ray = None

    def _fill(self) -> None:
        while len(self._actors) < self.workers:
            handle = self._actor_class.remote(self._evaluator_ref, self._actor_log)
            self._actors.append(_Actor(handle, handle.where.remote()))

    def _kill(self, actor: _Actor) -> None:
        try:
            self._ray.kill(actor.handle, no_restart=True)
        except Exception:  # already gone
            pass

    def _replace(self, actor: _Actor) -> None:
        self._kill(actor)
        self._actors.remove(actor)
        self.replaced += 1
        self._fill()

    def workers_info(self) -> list[dict[str, Any]]:
        """pid / node of each ready actor (for tests and the bench)."""
        return [dict(a.info) for a in self._actors if a.ready]

    def running(self) -> dict[int, dict[str, Any]]:
        """ticket -> pid / node of the actor evaluating it."""
        return {a.item.ticket: dict(a.info) for a in self._actors if a.item is not None}

    # ---- the interface ---------------------------------------------------------------------

    def _submit(self, ticket: int, request: EvalRequest, max_seconds: float | None) -> None:
        self._start()
        self._requests[ticket] = request
        self._queue.append(_Item(ticket, max_seconds))
        self._early.extend(self._wait(0.0))

    def _cancel(self, ticket: int) -> None:
        self._requests.pop(ticket, None)
        self._queue = deque(item for item in self._queue if item.ticket != ticket)
        for actor in self._actors:
            if actor.item is not None and actor.item.ticket == ticket:
                self._replace(actor)
                break

    # ---- internals ---------------------------------------------------------------------------

    def _wait(self, timeout: float | None) -> list[Completion]:
        ray = self._ray
        end = None if timeout is None else time.monotonic() + timeout
        done: list[Completion] = []
        while True:
            self._dispatch()
            running = [a for a in self._actors if a.ref is not None]
            if not (self._queue or running):
                return done
            refs = {a.ref: a for a in running} | {a.probe: a for a in self._actors if a.probe is not None}
            now = time.monotonic()
            deadlines = [a.deadline for a in running]
            if not any(a.ready for a in self._actors):
                deadlines.append(self._startup_deadline())
            if end is not None:
                deadlines.append(end)
            finite = [d for d in deadlines if d != float("inf")]
            wait_s = max(0.0, min(finite) - now) if finite else None
            ready, rest = ray.wait(list(refs), num_returns=1, timeout=wait_s)
            if ready and rest:
                more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
                ready += more
            for ref in ready:
                actor = refs[ref]
                if actor not in self._actors:
                    continue
                if actor.probe is not None and ref == actor.probe:
                    self._on_probe(actor)
                else:
                    self._on_result(actor, done)
            self._expire(done)
            if done or (end is not None and time.monotonic() >= end):
                return done

    def _startup_deadline(self) -> float:
        return min((a.started for a in self._actors), default=time.monotonic()) + STARTUP_TIMEOUT_S

    def _dispatch(self) -> None:
        for actor in self._actors:
            if actor.ready and actor.item is None and self._queue:
                item = self._queue.popleft()
                actor.item = item
                actor.ref = actor.handle.evaluate.remote(self._requests[item.ticket])
                actor.deadline = float("inf") if item.limit is None else time.monotonic() + item.limit

    def _on_probe(self, actor: _Actor) -> None:
        try:
            actor.info = self._ray.get(actor.probe)
            actor.probe = None
        except Exception as exc:  # the actor could not start (warm_up raised, node gone)
            self._startup_failures += 1
            reason = _short(exc)
            self._replace(actor)
            if self._startup_failures > 3 * self.workers:
                raise BackendStartError(f"Ray evaluation workers failed to start ({self._startup_failures} tries): "
                                        f"{reason}", "check that the replay runtime imports on the Ray nodes "
                                        "(same spica-pipeline and ray versions as this driver)") from None

    def _on_result(self, actor: _Actor, done: list[Completion]) -> None:
        item, ref = actor.item, actor.ref
        actor.item, actor.ref, actor.deadline = None, None, float("inf")
        assert item is not None
        try:
            outcome = self._ray.get(ref)
        except Exception as exc:  # the actor or its node was lost mid-candidate
            reason = f"{actor.describe()} lost ({_short(exc)})"
            self._replace(actor)
            if item.lost is None and MAX_RETRIES > 0:
                self.retried += 1
                item.lost = reason
                self._queue.appendleft(item)
                log.warning("candidate %d: %s; retrying once", item.ticket, reason)
                return
            outcome = EvalOutcome("failed", reason=f"{reason} while evaluating this candidate"
                                  + (f"; retried once after: {item.lost}" if item.lost else ""))
        self._complete(item, outcome, done)

    def _complete(self, item: _Item, outcome: EvalOutcome, done: list[Completion]) -> None:
        if item.lost is not None:
            outcome.derived = {**outcome.derived, "evaluation_retry": f"retried once after: {item.lost}"}
        request = self._requests.pop(item.ticket, None)
        if request is not None:
            done.append(Completion(item.ticket, request, outcome))

    def _expire(self, done: list[Completion]) -> None:
        now = time.monotonic()
        for actor in list(self._actors):
            if actor.item is not None and now >= actor.deadline:
                item = actor.item
                actor.item, actor.ref = None, None
                self._replace(actor)
                self._complete(item, timed_out_outcome(item.limit), done)
        if not any(a.ready for a in self._actors) and now >= self._startup_deadline():
            raise BackendStartError(f"no Ray evaluation worker started within {STARTUP_TIMEOUT_S:g}s",
                                    "give the Ray cluster a free CPU (each worker takes one)")
