"""VizierClient: OSS Vizier designers in-process, seeded, with the trial ledger as the study state.

No Vizier server and no sqlite: every `Study.suggest` builds a fresh designer, replays the caller's
history (parameters, metrics or infeasible reason) into it and asks for a batch. The same config,
seed and history therefore give the same suggestions, also after a resume in a new process.

The first batch of every algorithm is quasi-random (a model has nothing to fit yet; it costs ms),
and so is every batch while no trial is feasible. Random search, quasi-random search and NSGA2
are Vizier's own designers, run as they are. The GP designers (GP-UCB-PE, the default, and the GP
bandit) come from optimize/gp_designer.py, built to compile each program once per process and
trial bucket. Trials, problems and the designer interface are Vizier's public API; every private
Vizier or jax name (the designers among them) is in optimize/vizier_private.py, nowhere else.
docs/performance.md has the profiles behind the GP code; bench/bench_vizier.py measures a suggest.
`Study.suggest_async` runs the next ask on a background thread while the current batch replays.

vizier and jax are imported lazily: importing this module must not start JAX or set JAX_PLATFORMS.
"""

import hashlib
import importlib.util
import logging
import math
import os
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from pydantic import BaseModel, ConfigDict

# resolve_algorithm lives with the config so `spica validate` resolves the env override too
from spica_pipeline.config.sweep import ALGO_ENV, ALGORITHMS, resolve_algorithm  # noqa: F401
from spica_pipeline.optimize.cost import BUCKET_FLOOR, suggest_bucket
from spica_pipeline.optimize.encoding import ParamSpec, SearchEncoding

SEED_BATCH = "QUASI_RANDOM_SEARCH"

# One history row: (parameters, metrics or None, infeasible reason or None).
HistoryRow = tuple[Mapping[str, Any], Mapping[str, float] | None, str | None]

_log = logging.getLogger(__name__)
_setup_lock = threading.Lock()
_setup_done: dict[str, str] = {}
_executor: ThreadPoolExecutor | None = None


def _runtime_setup(cache_dir: str | None) -> None:
    """Once per process, at the first study (never at import): CPU JAX unless a CUDA plugin is
    installed, x64 like the Vizier service, quiet logs, the batched LAPACK triangular solve
    (optimize/gp_lapack.py) and the persistent compilation cache."""
    with _setup_lock:
        if _setup_done:
            return
        if "JAX_PLATFORMS" not in os.environ and not any(
            importlib.util.find_spec(m) for m in ("jax_cuda12_plugin", "jax_cuda13_plugin")
        ):
            os.environ["JAX_PLATFORMS"] = "cpu"
        for mod in ("jax", "jaxlib", "equinox", "jaxopt", "flax", "tensorflow_probability", "typeguard"):
            warnings.filterwarnings("ignore", category=DeprecationWarning, module=mod)
            warnings.filterwarnings("ignore", category=FutureWarning, module=mod)
        warnings.filterwarnings("ignore", message=".*Explicitly requested dtype.*")
        for name in ("jax", "absl", "jax._src.xla_bridge", "vizier"):
            logging.getLogger(name).setLevel(logging.ERROR)
        try:
            import absl.logging

            absl.logging.set_verbosity(absl.logging.ERROR)
        except ImportError:  # pragma: no cover - absl ships with jax
            pass
        import jax

        jax.config.update("jax_enable_x64", True)
        from spica_pipeline.optimize import gp_lapack

        gp_lapack.register()
        path = resolve_cache_dir(cache_dir)
        if path:
            os.makedirs(path, exist_ok=True)
            jax.config.update("jax_compilation_cache_dir", path)
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
            jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
            _setup_done["cache_dir"] = path
        _setup_done["platforms"] = os.environ.get("JAX_PLATFORMS", "")


CACHE_ENV = "SPICA_JAX_CACHE_DIR"


def resolve_cache_dir(cache_dir: str | None, env: Mapping[str, str] | None = None) -> str:
    """Where the persistent JAX compilation cache lives ("" = off). On by default: the default
    `~/.cache/spica-pipeline/jax` follows $XDG_CACHE_HOME when that is set. $SPICA_JAX_CACHE_DIR
    overrides the configured value (`off`, `0` or empty: no persistent cache). The cache serves
    the XLA compiles of a bucket's programs to every later process (not the tracing)."""
    env = os.environ if env is None else env
    if CACHE_ENV in env:
        cache_dir = env[CACHE_ENV]
        if cache_dir.strip().lower() in ("", "0", "off", "none", "false"):
            return ""
    if not cache_dir:
        return ""
    xdg = env.get("XDG_CACHE_HOME", "")
    if xdg and (cache_dir == "~/.cache" or cache_dir.startswith("~/.cache/")):
        cache_dir = xdg + cache_dir[len("~/.cache"):]
    return os.path.expanduser(cache_dir)


def _one_blas_thread():
    """BLAS/LAPACK pinned to one thread for the GP's small matrices. JAX's CPU Cholesky and
    triangular solves call scipy's OpenBLAS, whose worker threads spin on a busy 2-core box: a
    128x128 float64 Cholesky took 117 ms instead of 0.18 ms, which made a padded bucket of 128
    trials 10x slower than one of 64. Restored on exit."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas")


def derive_seed(seed: int, branch: str, n_history: int) -> int:
    """Per-call seed from (study seed, branch, history length): a resume with the same ledger
    reproduces the suggestion, and successive rounds differ."""
    digest = hashlib.sha256(f"{seed}|{branch}|{n_history}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def _param_key(params: Mapping[str, Any]) -> tuple:
    return tuple(sorted((k, round(v, 12) if isinstance(v, float) else v) for k, v in params.items()))


class VizierClient(BaseModel):
    """Vizier designers in-process: a plain settings model (the Dagster asset receives it as a
    resource parameter); `open_study` gives one branch's `Study`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    algorithm: str = "DEFAULT"
    # Eagle-strategy evaluations per acquisition optimisation (Vizier's default is 75,000).
    acquisition_evaluations: int = 4000
    # GP hyper-parameter (ARD) fit: L-BFGS-B iterations per start and random restarts. GP-UCB-PE's
    # own default is 500 iterations x (1 + 4) starts, which was ~2/3 of its suggest time here;
    # 50 is what Vizier's GP bandit uses (`vizier.jax.optimizers.default_optimizer`).
    ard_max_iterations: int = 50
    ard_random_restarts: int = 4
    # Persistent JAX compilation cache (on by default; under $XDG_CACHE_HOME when set); empty string
    # turns it off, and so does SPICA_JAX_CACHE_DIR=off (that variable overrides this field).
    jax_cache_dir: str = "~/.cache/spica-pipeline/jax"

    def open_study(
        self,
        encoding: SearchEncoding,
        metrics: Sequence[tuple[str, str]],
        *,
        seed: int,
        algorithm: str | None = None,
        name: str | None = None,
    ) -> "Study":
        """A study over one branch's encoding; `metrics` are (name, 'max'|'min') pairs."""
        algo = resolve_algorithm(self.algorithm, algorithm)
        return Study(self, encoding, list(metrics), seed=seed, algorithm=algo, name=name)


class Study:
    """One branch's study. Stateless between calls: the caller's ledger is the state.

    Pipelined rounds (hide the ask behind the replays of the current batch):
        batch = study.suggest(n, history)
        while rounds left:
            nxt = study.suggest_async(n, history, pending=batch)  # GP-UCB-PE explores around `batch`
            history += evaluate(batch)                           # replays run in worker processes
            batch = nxt.result()
    """

    def __init__(
        self,
        client: VizierClient,
        encoding: SearchEncoding,
        metrics: list[tuple[str, str]],
        *,
        seed: int,
        algorithm: str,
        name: str | None = None,
    ) -> None:
        if not metrics:
            raise ValueError("a study needs at least one metric")
        for m, goal in metrics:
            if goal not in ("max", "min"):
                raise ValueError(f"metric {m!r}: goal must be 'max' or 'min', got {goal!r}")
        self.client = client
        self.encoding = encoding
        self.metrics = metrics
        self.seed = int(seed)
        self.algorithm = algorithm
        self.name = name or encoding.deployment_mode
        self.last_suggest_seconds = 0.0
        self.last_designer = ""  # which designer produced the last batch ("QUASI_RANDOM_SEARCH" for seed batches)
        self.skipped_history = 0  # history rows outside this search space (e.g. an older ledger)
        self.last_acquisition: list[float] = []  # GP-UCB-PE acquisition value per suggestion (diagnostics)
        self._problem = None

    # ----- problem ---------------------------------------------------------------------------
    def problem(self):
        if self._problem is None:
            _runtime_setup(self.client.jax_cache_dir)
            self._problem = _to_problem(self.encoding, self.metrics)
        return self._problem

    # ----- suggest ---------------------------------------------------------------------------
    def suggest(
        self,
        count: int,
        history: Sequence[HistoryRow] = (),
        pending: Sequence[Mapping[str, Any]] = (),
        algorithm: str | None = None,
    ) -> list[dict[str, Any]]:
        """`count` parameter dicts (decode them with `encoding.decode`). `pending` are parameters
        being evaluated right now (asked for but not yet in history): GP-UCB-PE explores away from
        them, the others skip past them. `algorithm` overrides the study's for this one call
        (the cost-aware loop fills asks from QUASI_RANDOM_SEARCH); `last_designer` says who answered."""
        if count <= 0:
            return []
        t0 = time.perf_counter()
        try:
            return self._suggest(count, list(history), list(pending), algorithm)
        finally:
            self.last_suggest_seconds = time.perf_counter() - t0

    def suggest_async(
        self,
        count: int,
        history: Sequence[HistoryRow] = (),
        pending: Sequence[Mapping[str, Any]] = (),
    ) -> "Future[list[dict[str, Any]]]":
        """`suggest` on a background thread, to overlap the next ask with the current replays.
        Calls from all studies run one at a time on one thread (JAX work is not shared)."""
        global _executor
        with _setup_lock:
            if _executor is None:
                _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spica-vizier")
        return _executor.submit(self.suggest, count, list(history), [dict(p) for p in pending])

    def _suggest(self, count: int, history: list[HistoryRow], pending: list[Mapping[str, Any]],
                 override: str | None = None) -> list[dict]:
        import jax
        from vizier import algorithms as vza
        from vizier import pyvizier as vz

        problem = self.problem()
        space = problem.search_space
        completed, n_feasible = self._to_trials(history, space, vz)
        active = []
        for j, p in enumerate(pending, start=len(completed) + 1):
            if space.contains(vz.ParameterDict(dict(p))):
                active.append(vz.Trial(id=j, parameters=dict(p)))
        n_seen = len(history) + len(pending)
        call_seed = derive_seed(self.seed, self.name, n_seen)

        algo = override.upper() if override and override.upper() in ALGORITHMS else self.algorithm
        # Seed batch: no history at all (every algorithm), or no feasible trial for a model yet.
        if n_seen == 0 or (algo != "RANDOM_SEARCH" and n_feasible == 0):
            algo = SEED_BATCH
        self.last_designer = algo

        self.last_acquisition = []
        if algo in ("RANDOM_SEARCH", SEED_BATCH):
            seen = {_param_key(p) for p, _, _ in history} | {_param_key(p) for p in pending}
            return self._cheap_batch(algo, count, n_seen, call_seed, seen)

        if algo == "NSGA2":
            from spica_pipeline.optimize import vizier_private as vp

            designer = vp.NSGA2Designer(problem, seed=call_seed)
        else:
            rows = len(completed) + len(active) + count
            designer = self._gp_designer(algo, problem, jax.random.PRNGKey(call_seed), rows=rows)
        designer.update(vza.CompletedTrials(completed), vza.ActiveTrials(active))
        with _one_blas_thread():
            suggestions = list(designer.suggest(count=count))[:count]  # NSGA2 may hand out a population
        self.last_acquisition = [_acquisition_value(s) for s in suggestions]
        return [dict(s.parameters.as_dict()) for s in suggestions]

    def _cheap_batch(self, algo: str, count: int, n_seen: int, call_seed: int, seen: set) -> list[dict]:
        """Random / quasi-random: skip points already in history or pending, oversampling up to 8x.

        Quasi-random keeps one Halton sequence per (seed, branch) and fast-forwards past every
        trial already seen, so successive rounds continue the sequence instead of repeating it."""
        from spica_pipeline.optimize import vizier_private as vp

        space = self.problem().search_space
        designer: Any
        if algo == SEED_BATCH:
            designer = vp.QuasiRandomDesigner(
                space, skip_points=1000 + n_seen, seed=derive_seed(self.seed, self.name, -1)
            )
        else:
            designer = vp.RandomDesigner(space, seed=call_seed)
        out: list[dict] = []
        fallback: list[dict] = []
        for s in designer.suggest(count * 8):
            p = dict(s.parameters.as_dict())
            key = _param_key(p)
            if key in seen:
                fallback.append(p)
                continue
            seen.add(key)
            out.append(p)
            if len(out) == count:
                break
        return (out + fallback)[:count]  # a tiny space may have fewer new points than asked

    def _gp_designer(self, algo: str, problem, rng, rows: int):
        """The GP designer of one suggest that sees `rows` trials (history + pending + the batch):
        every trial-axis array pads to their bucket, so its programs compile once per bucket."""
        from spica_pipeline.optimize.gp_designer import gp_designer

        c = self.client
        return gp_designer(algo, problem, rng, padded_rows=trial_bucket(rows),
                           acquisition_evaluations=c.acquisition_evaluations,
                           ard_max_iterations=c.ard_max_iterations, ard_random_restarts=c.ard_random_restarts)

    # ----- history ---------------------------------------------------------------------------
    def _to_trials(self, history: list[HistoryRow], space, vz) -> tuple[list, int]:
        """Ledger rows -> completed Vizier trials. Feasible rows need every metric finite (else
        they count as infeasible); NSGA2 gets sentinel worst metrics on infeasible rows (it
        raises KeyError without them). Rows outside the space are skipped and counted."""
        names = [m for m, _ in self.metrics]
        rows: list[tuple[dict, dict | None, str | None]] = []
        skipped = 0
        for params, metrics, reason in history:
            params = dict(params)
            if not space.contains(vz.ParameterDict(params)):
                skipped += 1
                continue
            good = None
            if reason is None and metrics is not None:
                vals = {m: metrics.get(m) for m in names}
                nums = {m: float(v) for m, v in vals.items() if isinstance(v, (int, float)) and math.isfinite(v)}
                if len(nums) == len(vals):
                    good = nums
                else:
                    reason = "non-finite or missing metric"
            rows.append((params, good, reason or (None if good else "infeasible")))
        self.skipped_history = skipped
        if skipped:
            _log.warning("study %s: %d history rows are outside the search space and were skipped", self.name, skipped)

        sentinel = self._sentinel(rows) if self.algorithm == "NSGA2" else None
        trials = []
        n_feasible = 0
        for i, (params, good, reason) in enumerate(rows, start=1):
            t = vz.Trial(id=i, parameters=params)
            if good is not None:
                t.complete(vz.Measurement(metrics=good))
                n_feasible += 1
            else:
                t.complete(vz.Measurement(metrics=sentinel) if sentinel else None, infeasibility_reason=reason)
            trials.append(t)
        return trials, n_feasible

    def _sentinel(self, rows) -> dict[str, float]:
        """Worse than anything observed: NSGA2 ranks infeasible trials last."""
        out = {}
        for m, goal in self.metrics:
            vals = [g[m] for _, g, _ in rows if g is not None]
            lo, hi = (min(vals), max(vals)) if vals else (0.0, 0.0)
            pad = max(1.0, hi - lo)
            out[m] = lo - 10 * pad if goal == "max" else hi + 10 * pad
        return out


def _acquisition_value(suggestion) -> float:
    """The acquisition value GP-UCB-PE records in the suggestion metadata (NaN elsewhere)."""
    try:
        ns = suggestion.metadata.ns("google_gp_ucb_pe_bandit").ns("prediction_in_warped_y_space")
        return float(ns.get("acquisition", "nan"))
    except (TypeError, ValueError):
        return float("nan")


def trial_bucket(rows: int, floor: int = BUCKET_FLOOR) -> int:
    """Padded trial rows for a suggest that will see `rows` trials (history + pending + batch):
    optimize/cost.py's `suggest_bucket`, the rule the cost model prices, so the two cannot drift.
    With doubling buckets, 8-100 trials meet at most 3 (32, 64, 128), so a process compiles at
    most 3 sets of GP programs there."""
    return suggest_bucket(rows, floor)


def _to_problem(encoding: SearchEncoding, metrics: Sequence[tuple[str, str]]):
    from vizier import pyvizier as vz

    problem = vz.ProblemStatement()
    root = problem.search_space.root
    for p in encoding.params:
        _add_param(root, p, vz)
    for name, goal in metrics:
        g = vz.ObjectiveMetricGoal.MAXIMIZE if goal == "max" else vz.ObjectiveMetricGoal.MINIMIZE
        problem.metric_information.append(vz.MetricInformation(name, goal=g))
    return problem


def _add_param(root, p: ParamSpec, vz) -> None:
    scale = vz.ScaleType.LOG if p.scale == "log" else vz.ScaleType.LINEAR
    if p.kind == "double":
        lo, hi = p.bounds  # type: ignore[misc]
        root.add_float_param(p.name, lo, hi, default_value=p.default, scale_type=scale)
    elif p.kind == "discrete":
        root.add_discrete_param(p.name, list(p.values), default_value=p.default, scale_type=scale)
    else:
        root.add_categorical_param(p.name, list(p.values), default_value=p.default)
