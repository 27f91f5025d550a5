"""VizierClient: OSS Vizier designers in-process, seeded, with the trial ledger as the study state.

No Vizier server and no sqlite: every `Study.suggest` builds a fresh designer, replays the caller's
history (parameters, metrics or infeasible reason) into it and asks for a batch. The same config,
seed and history therefore give the same suggestions, also after a resume in a new process.

Speed on a 2-core CPU (measure with bench/bench_vizier.py). Profiling one GP-UCB-PE suggest(4) at
N=8 showed ~2/3 of the time in the ARD hyper-parameter fit (scipy L-BFGS-B, 500 iterations x 5
starts, ~3000 jitted loss evaluations), the rest in 4 sequential acquisition optimisations
(75,000 evaluations each) and ~270 XLA compiles. So the GP designers here get:
  * an ARD fit capped at 50 iterations per start (what Vizier's own GP bandit uses);
  * a 4,000-evaluation acquisition budget (`acquisition_evaluations`);
  * trial padding to a floor of 32 rows, so shapes repeat between rounds (fewer recompiles) and
    the persistent JAX compilation cache can serve later calls and later runs;
  * a quasi-random first batch for every algorithm (a GP has nothing to model yet; it costs ms).
Compile once (`compile_once`): Vizier re-traced and re-compiled its acquisition optimiser for
every suggestion, because the Eagle strategy's random sampler and projection are fresh objects
hashed by identity in the jitted program's static part; the scipy ARD fit dispatched ~450 small
programs; and padding / pending-trial joins compiled a small program per distinct trial count.
Here the sampler and projection compare by shape bucket (one instance per bucket), the ARD fit is
one jitted pure-JAX L-BFGS-B over all restarts, and padding and joins run in numpy. A process
compiles each program once per shape bucket and reuses it across suggestions, rounds, branches
and batches; history is still replayed statelessly, so determinism and resume are unchanged.
Two objectives are padded too: Vizier's multi-task ARD loss ignored the padding mask (padded NaN
rows entered the likelihood, which is why padding once changed the suggestions); the masked loss
here equals the unpadded one (tests/test_vizier_padding.py), so two objectives also compile once
per bucket instead of once per trial count.
Past 32 trials (2026-12-04, bench/results/vizier_after_first.json): the cost was not recompiles
but (a) scipy's OpenBLAS spinning its threads on the busy 2-core box inside JAX's CPU Cholesky and
triangular solves (117 ms instead of 0.18 ms for a 128x128 float64 Cholesky), now pinned to one
thread during a GP suggest, and (b) GP-UCB-PE's pure-exploration score recomputing its UCB
threshold (a GP prediction at every trial, O(n^3)) in every acquisition-optimiser step, now once
per optimisation; then (c) XLA's triangular-solve expander (a 127-step loop per 128-row solve) for
every batched solve, now LAPACK trsm (`_batched_lapack_triangular_solve`), (d) the one-program jaxopt
ARD fit, now scipy's L-BFGS-B over a compiled value-and-gradient (`scipy_ard_optimizer`), and (e) a
(history, history + pending) PAIR of padded shapes per suggest, now one `trial_bucket` per suggest.
Two objectives (16:00 UTC): with rows that hold every metric or none, the masked ARD loss and the
posterior share ONE n x n Cholesky factor across metrics (`_shared_rows`, `_precompute_predictive`)
instead of one per metric / one (n m) x (n m) factor: 4.2 -> 3.0 s CPU per suggest(8) at 100 trials.
GP-UCB-PE's UCB score (first point) and PE score (the rest) are one score class with a traced
flag (`shared_acquisition`, `_shared_score_class`): the Eagle acquisition optimiser is traced,
lowered and compiled once per bucket instead of twice (cold first call ~17 -> ~14 s CPU).
Acquisition step (22:00 UTC): the optimiser's GP mean and stddevs are computed directly
(`_posterior_terms`) instead of through TFP's posterior distributions, which evaluated the
candidate-to-trial kernel three times per step and, with two objectives, went through the
flattened (25 m) x (n m) task kernel and m x 2 right-hand sides per candidate: one kernel
evaluation per step now serves both predictives, same suggestions (`fast_posterior`).
docs/performance.md ("compile once") has the profiles and the numbers.
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
_batched_trsm: list[str] = []  # non-empty once the LAPACK lowering is registered
_executor: ThreadPoolExecutor | None = None


def _runtime_setup(cache_dir: str | None) -> None:
    """Once per process, at the first study (never at import): CPU JAX unless a CUDA plugin is
    installed, x64 like the Vizier service, quiet logs, and the persistent compilation cache."""
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
        _batched_lapack_triangular_solve()
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


def _batched_lapack_triangular_solve() -> bool:
    """Batched triangular solves on CPU through LAPACK's trsm instead of XLA's expander.

    jax 0.4.38 sends a triangular solve to LAPACK only when the matrix is 2-D; any batch dimension
    (Vizier's one-member GP ensemble gives its Cholesky factor the shape [1, n, n], and the vmapped
    ARD restarts batch every solve of the loss and of the Cholesky gradient) falls back to XLA's
    TriangularSolveExpander, a 127-step while loop per 128-row solve: ~1.2 ms per solve at 128
    rows vs 0.09 ms for trsm, and most of a GP-UCB-PE suggest past 64 trials (each acquisition
    step solves twice per predictive). jaxlib's FFI trsm kernel loops over batch dimensions
    itself; this registers a CPU lowering that uses it for batched real solves (same results to
    ~1e-14: tests/test_vizier_speed.py) and keeps jax's own lowering otherwise. Process-wide and
    idempotent; False when this jax/jaxlib does not have the expected internals."""
    if _batched_trsm:
        return True
    try:
        import numpy as np
        from jax._src.interpreters import mlir
        from jax._src.lax import linalg as jax_linalg
        from jax._src.lib.mlir.dialects import chlo
        from jaxlib import lapack

        stock = jax_linalg._triangular_solve_cpu_lower
        real_types = (np.dtype(np.float32), np.dtype(np.float64))
    except (ImportError, AttributeError):  # pragma: no cover - other jax versions
        return False

    def lower(ctx, a, b, *, left_side, lower, transpose_a, conjugate_a, unit_diagonal):
        a_aval, b_aval = ctx.avals_in
        if (len(a_aval.shape) > 2 and np.dtype(a_aval.dtype) in real_types
                and not ctx.is_forward_compat()):
            if conjugate_a and not transpose_a:
                a = chlo.conj(a)  # a no-op for real types, as in jax's own lowering
                conjugate_a = False
            alpha = mlir.ir_constant(np.array(1, dtype=a_aval.dtype))
            b_shape_vals = mlir.eval_dynamic_shape_as_ivals(ctx, b_aval.shape)
            return lapack.trsm_hlo(ctx, a_aval.dtype, alpha, a, b, left_side, lower, transpose_a,
                                   conjugate_a, unit_diagonal, b_shape_vals=b_shape_vals)
        return stock(ctx, a, b, left_side=left_side, lower=lower, transpose_a=transpose_a,
                     conjugate_a=conjugate_a, unit_diagonal=unit_diagonal)

    mlir.register_lowering(jax_linalg.triangular_solve_p, lower, platform="cpu")
    _batched_trsm.append("lapack")
    return True


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
    """Vizier designers in-process."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    algorithm: str = "DEFAULT"
    # Eagle-strategy evaluations per acquisition optimisation (Vizier's default is 75,000).
    acquisition_evaluations: int = 4000
    # GP hyper-parameter (ARD) fit: L-BFGS-B iterations per start and random restarts. GP-UCB-PE's
    # own default is 500 iterations x (1 + 4) starts, which was ~2/3 of its suggest time here;
    # 50 is what Vizier's GP bandit uses (`optimizers.default_optimizer`).
    ard_max_iterations: int = 50
    ard_random_restarts: int = 4
    # Pad the trial axis (history + pending) to max(min_padded_trials, next power of two): the
    # GP programs then keep one shape across the rounds and the batch, so XLA compiles them once
    # per process (and once ever with the persistent cache) instead of once per suggestion.
    trial_padding: bool = True
    min_padded_trials: int = BUCKET_FLOOR
    # One padded row count per suggest: trial_bucket(history + pending + count). Else history and
    # history + pending (which grows through the batch) pad separately, and every (history bucket,
    # history + pending bucket) PAIR met compiles its own programs (~400 MB each).
    shared_trial_bucket: bool = True
    # Pad multi-objective GP-UCB-PE as well (else every trial count compiles its own programs).
    # Needs compile_once + jit_ard: Vizier's multi-task ARD loss does not mask padded rows, ours does.
    pad_multi_objective: bool = True
    # Drop every compiled program before each GP suggest. Off: with `compile_once` the programs
    # are reused, not re-made per call, so memory stays flat (bench_vizier --after-first --rss-suggests).
    clear_jax_cache: bool = False
    # Persistent JAX compilation cache (on by default; under $XDG_CACHE_HOME when set); empty string
    # turns it off, and so does SPICA_JAX_CACHE_DIR=off (that variable overrides this field).
    jax_cache_dir: str = "~/.cache/spica-pipeline/jax"
    # GP-UCB-PE, single objective: one UCB point plus ONE joint pure-exploration optimisation for
    # the rest of the batch (Vizier's `optimize_set_acquisition_for_exploration`), instead of one
    # sequential optimisation (and one re-trace of the acquisition program) per suggestion.
    set_exploration: bool = False
    # GP-UCB-PE with compile_once: its UCB score (first point) and pure-exploration score (the rest)
    # as one score class, so the acquisition optimiser is traced and compiled once per bucket, not
    # twice (off: one program per score, as Vizier's two classes give).
    shared_acquisition: bool = True
    # With shared_acquisition: the acquisition optimiser's GP mean and stddevs computed directly
    # (one kernel evaluation per step for both predictives, one right-hand side per candidate and
    # solve) instead of through TFP's posterior distributions; same values (`_posterior_terms`).
    fast_posterior: bool = True
    # Compile once: stable acquisition-optimiser parts, numpy padding and pending joins (off: stock
    # Vizier classes, e.g. to benchmark against them).
    compile_once: bool = True
    # ARD fit as ONE compiled program (pure-JAX L-BFGS-B over all restarts, compiled once per shape
    # bucket) instead of scipy's L-BFGS-B driving ~450 separately dispatched loss evaluations.
    jit_ard: bool = True
    # With jit_ard: the whole L-BFGS-B fit as one compiled jaxopt program (True), or scipy's
    # L-BFGS-B driving a compiled value-and-gradient (False: far cheaper to compile, and the
    # restarts do not wait for each other's line searches).
    ard_one_program: bool = False
    # Batches come from a quasi-random designer until this many feasible trials exist.
    min_feasible_for_model: int = 1

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
        # Seed batch: no history at all (every algorithm), or too few feasible trials for a model.
        if n_seen == 0 or (algo != "RANDOM_SEARCH" and n_feasible < max(1, self.client.min_feasible_for_model)):
            algo = SEED_BATCH
        self.last_designer = algo

        self.last_acquisition = []
        if algo in ("RANDOM_SEARCH", SEED_BATCH):
            seen = {_param_key(p) for p, _, _ in history} | {_param_key(p) for p in pending}
            return self._cheap_batch(algo, count, n_seen, call_seed, seen)

        if algo == "NSGA2":
            from vizier._src.algorithms.evolution import nsga2

            designer = nsga2.NSGA2Designer(problem, seed=call_seed)
        else:
            # every trial-axis array of this suggest (history, history + pending + the batch so far,
            # trust region, Eagle prior) pads to ONE row count, so programs compile per bucket
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
        from vizier._src.algorithms.designers import quasi_random
        from vizier._src.algorithms.designers import random as random_designer

        space = self.problem().search_space
        if algo == SEED_BATCH:
            designer = quasi_random.QuasiRandomDesigner(
                space, skip_points=1000 + n_seen, seed=derive_seed(self.seed, self.name, -1)
            )
        else:
            designer = random_designer.RandomDesigner(space, seed=call_seed)
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

    def _gp_designer(self, algo: str, problem, rng, rows: int = 0):
        from vizier._src.algorithms.designers import gp_bandit, gp_ucb_pe
        from vizier._src.algorithms.optimizers import eagle_strategy as es
        from vizier._src.algorithms.optimizers import vectorized_base as vb
        c = self.client
        multi = len(self.metrics) > 1
        from vizier._src.jax.optimizers import jaxopt_wrappers

        if c.jit_ard and c.compile_once:
            ard = (stable_ard_optimizer(c.ard_max_iterations) if c.ard_one_program
                   else scipy_ard_optimizer(c.ard_max_iterations))
        else:
            ard = jaxopt_wrappers.JaxoptScipyLbfgsB(
                jaxopt_wrappers.LbfgsBOptions(maxiter=c.ard_max_iterations, best_n=None))
        kw: dict[str, Any] = {"rng": rng, "ard_random_restarts": c.ard_random_restarts, "ard_optimizer": ard}
        # Stock GP-UCB-PE refuses trial padding for multi-objective problems; the floor schedule
        # keeps an empty history unpadded (what its check tests) and padded rows are masked.
        # Several metrics: padded only with the masked multi-task ARD loss (jit_ard), see _masked_loss.
        pad_multi = c.pad_multi_objective and c.compile_once and c.jit_ard
        if c.trial_padding and not (multi and algo == "DEFAULT" and not pad_multi):
            floor = trial_bucket(rows, c.min_padded_trials) if c.shared_trial_bucket else c.min_padded_trials
            kw["padding_schedule"] = _floor_padding(floor, numpy=c.compile_once)
        if algo == "DEFAULT":
            eagle = gp_ucb_pe.VizierGPUCBPEBandit.default_eagle_config
        else:
            eagle = es.EagleStrategyConfig()
        kw["acquisition_optimizer_factory"] = vb.VectorizedOptimizerFactory(
            strategy_factory=es.VectorizedEagleStrategyFactory(
                eagle_config=eagle, random_sampler_factory=stable_random_sampler,
                projection_factory=stable_projection) if c.compile_once
            else es.VectorizedEagleStrategyFactory(eagle_config=eagle),
            max_evaluations=c.acquisition_evaluations,
            suggestion_batch_size=25,
        )
        if algo == "DEFAULT":
            if c.set_exploration and not multi:
                kw["config"] = gp_ucb_pe.UCBPEConfig(optimize_set_acquisition_for_exploration=True)
            if not c.compile_once:
                return gp_ucb_pe.VizierGPUCBPEBandit(problem, clear_jax_cache=c.clear_jax_cache, **kw)
            designer = _ucb_pe_class()(problem, clear_jax_cache=c.clear_jax_cache, **kw)
            designer._spica_shared_acquisition = c.shared_acquisition
            designer._spica_fast_posterior = c.fast_posterior
            return designer
        if c.clear_jax_cache:
            import jax

            jax.clear_caches()
        return gp_bandit.VizierGPBandit(problem, **kw)

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


# ----- compile once ---------------------------------------------------------------------------
# Vizier's Eagle strategy keeps its random sampler and projection as static (hashed) parts of the
# jitted acquisition optimiser. The stock ones are fresh objects hashed by identity, so every
# acquisition optimisation (8 per suggest(8)) re-traced and re-compiled the whole optimiser (~20 s
# of CPU each). These replacements compare by their shape bucket, and one instance is kept per
# bucket, so the program compiled for a bucket is reused across suggestions, rounds and branches.
_STABLE: dict[Any, Any] = {}  # keys: (kind, shape) tuples and class-name strings


def _feature_bucket(converter) -> tuple:
    from vizier._src.algorithms.optimizers import eagle_strategy as es

    dims = es.compute_feature_dimensions_from_converter(converter)
    return (dims.max_categorical_size, tuple(int(c) for c in dims.categorical_sizes),
            int(dims.n_feature_dimensions_with_padding.continuous),
            int(dims.n_feature_dimensions_with_padding.categorical))


def _stable_classes():
    if "classes" not in _STABLE:
        from vizier._src.algorithms.optimizers import eagle_strategy as es

        class StableRandomSampler(es.DefaultRandomSampler):
            """DefaultRandomSampler that compares equal for equal feature shapes."""

            def __init__(self, converter, bucket: tuple):
                super().__init__(converter)
                self.bucket = bucket

            def __eq__(self, other):
                return type(other) is type(self) and other.bucket == self.bucket

            def __hash__(self):
                return hash(("StableRandomSampler", self.bucket))

        class StableProjection(es.DefaultProjection):
            """DefaultProjection (a clip to [0, 1]); all instances are interchangeable."""

            def __eq__(self, other):
                return type(other) is type(self)

            def __hash__(self):
                return hash("StableProjection")

        _STABLE["classes"] = (StableRandomSampler, StableProjection)
    return _STABLE["classes"]


def _ard_fit_impl(init_params, loss_fn, bounds, maxiter: int, maxls: int, tol: float):
    import jax
    import jaxopt

    solver = jaxopt.LBFGSB(fun=loss_fn, maxls=maxls, tol=tol, maxiter=maxiter, has_aux=True)
    # vmap, not lax.map: the restarts run as one batched loop (finished ones are masked), which
    # halved the CPU time of a warm GP-UCB-PE suggest(8) here (4.5 -> 2.2 s at 9-20 trials)
    params, state = jax.vmap(lambda p: solver.run(init_params=p, bounds=bounds))(init_params)
    return state.value, params


def stable_ard_optimizer(maxiter: int):
    """An ARD optimiser (Vizier's `core.Optimizer` interface) that runs every random restart of
    the L-BFGS-B fit inside one jitted program. The program's cache key is the loss function's
    static structure and the array shapes, so with trial padding it compiles once per bucket."""
    with _setup_lock:
        key = ("ard", int(maxiter))
        if key in _STABLE:
            return _STABLE[key]
    import equinox as eqx
    import jax.numpy as jnp
    from vizier._src.jax.optimizers import core, jaxopt_wrappers

    if "ard_fn" not in _STABLE:
        _STABLE["ard_fn"] = eqx.filter_jit(_ard_fit_impl)
    fit = _STABLE["ard_fn"]

    class StableJaxLbfgsB(_lbfgsb_base()):  # type: ignore[misc]  # frozen attrs fields and hash from the base
        def __call__(self, init_params, loss_fn, rng, *, constraints=None, best_n=None):
            del rng  # L-BFGS-B is deterministic given the initial parameters
            loss_fn = _masked_loss(loss_fn)
            bounds = jaxopt_wrappers._get_bounds(jaxopt_wrappers._unbatch_params(init_params)[0], constraints)
            losses, all_params = fit(init_params, loss_fn, bounds, self.maxiter, self.maxls, self.tol)
            losses = jnp.where(jnp.isfinite(losses), losses, jnp.inf)
            return core.get_best_params(losses, all_params, best_n=best_n), {"loss": losses[jnp.newaxis, :]}

    opt = StableJaxLbfgsB(maxiter=int(maxiter))
    with _setup_lock:
        return _STABLE.setdefault(key, opt)


def _lbfgsb_base() -> Any:
    """What both ARD optimisers share: L-BFGS-B's options and Vizier's `best_n` (one best start)."""
    if "lbfgsb_base" not in _STABLE:
        import attrs
        from vizier._src.jax.optimizers import core

        @attrs.define(frozen=True)
        class LbfgsBOptimizer(core.Optimizer):
            maxiter: int = 50
            maxls: int = 20
            tol: float = 1e-8

            @property
            def best_n(self) -> int:
                return 1

        _STABLE["lbfgsb_base"] = LbfgsBOptimizer
    return _STABLE["lbfgsb_base"]


def _split_vector(x, shapes: list, sizes: list, reshape) -> list:
    """A flat parameter vector cut back into its leaves (`reshape`: np.reshape or jnp.reshape)."""
    out, i = [], 0
    for shape, size in zip(shapes, sizes):
        out.append(reshape(x[i:i + size], shape))
        i += size
    return out


def _ard_value_and_grad(loss_fn, params):
    import jax

    return jax.value_and_grad(lambda p: loss_fn(p)[0])(params)


def _interleave(is_arr: tuple, static: tuple) -> list:
    """Static leaves placed at their positions (None where an array goes)."""
    it = iter(static)
    return [None if a else next(it) for a in is_arr]


def scipy_ard_optimizer(maxiter: int):
    """An ARD optimiser (Vizier's `core.Optimizer` interface): scipy's L-BFGS-B drives each random
    restart in turn, and only the loss's value and gradient are compiled (one small program per
    loss structure and shape bucket, cached like the rest).

    Against the single compiled jaxopt L-BFGS-B program (`stable_ard_optimizer`): that program
    took ~30 s of a cold first call to compile and ~15 s more per new bucket, and, vmapped over
    the restarts, every restart paid for the slowest one's line searches (3.1 s CPU at 128 rows
    vs ~1 s here). Same options as Vizier's scipy wrapper (`JaxoptScipyLbfgsB`: gtol 1e-8,
    20 line-search steps); deterministic given the initial parameters."""
    with _setup_lock:
        key = ("ard_scipy", int(maxiter))
        if key in _STABLE:
            return _STABLE[key]
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import numpy as np
    from vizier._src.jax.optimizers import jaxopt_wrappers

    def flat_value_and_grad(loss_fn, params_treedef, shapes: list, dtype):
        """(x: flat parameter vector) -> [loss, gradient...] as ONE numpy vector. The loss's arrays
        are bound once per fit and the compiled function is looked up by the loss's static
        structure (what eqx.filter_jit keys on), so each of the ~400 evaluations is one plain
        jax.jit dispatch of two arguments (eqx.filter_jit re-partitioned the loss module every
        call: ~0.5 ms, a third of an evaluation at 128 rows)."""
        leaves, treedef = jax.tree_util.tree_flatten(loss_fn)
        is_arr = tuple(eqx.is_array(x) for x in leaves)
        arrays = [x for x, a in zip(leaves, is_arr) if a]
        static = tuple(x for x, a in zip(leaves, is_arr) if not a)
        key = ("ard_vg", treedef, is_arr, static, params_treedef, tuple(shapes), np.dtype(dtype).str)
        with _setup_lock:
            fn = _STABLE.get(key)
        if fn is None:
            sizes = [int(np.prod(sh)) for sh in shapes]

            def vg(arrays_, x):
                it = iter(arrays_)
                loss = jax.tree_util.tree_unflatten(treedef, [next(it) if a else st for a, st in zip(
                    is_arr, _interleave(is_arr, static))])
                parts = _split_vector(x, shapes, sizes, jnp.reshape)
                value, grad = _ard_value_and_grad(loss, jax.tree_util.tree_unflatten(params_treedef, parts))
                return jnp.concatenate([jnp.reshape(value, (1,))] + [
                    jnp.ravel(g) for g in jax.tree_util.tree_leaves(grad)]).astype(dtype)

            fn = jax.jit(vg)
            with _setup_lock:
                fn = _STABLE.setdefault(key, fn)
        return lambda x: np.asarray(fn(arrays, x))

    class ScipyLbfgsB(_lbfgsb_base()):  # type: ignore[misc]  # frozen attrs fields and hash from the base
        def __call__(self, init_params, loss_fn, rng, *, constraints=None, best_n=None):
            from scipy import optimize  # type: ignore[import-untyped]

            del rng  # L-BFGS-B is deterministic given the initial parameters
            loss_fn = _masked_loss(loss_fn)
            # numpy from here on: jnp indexing / stacking of the concrete restarts compiled ~30 tiny
            # eager-op programs in the first call of a process (same values, no program)
            init_np = jax.tree_util.tree_map(np.asarray, init_params)
            n_starts = int(np.shape(jax.tree_util.tree_leaves(init_np)[0])[0])
            starts = [jax.tree_util.tree_map(lambda p, i=i: p[i], init_np) for i in range(n_starts)]
            leaves, treedef = jax.tree_util.tree_flatten(starts[0])
            shapes = [np.shape(x) for x in leaves]
            sizes = [int(np.prod(s)) for s in shapes]
            dtype = np.result_type(*[np.asarray(x).dtype for x in leaves])

            def flat(tree) -> np.ndarray:
                return np.concatenate([np.ravel(np.asarray(x, dtype)) for x in jax.tree_util.tree_leaves(tree)])

            def unflat(x: np.ndarray):
                return jax.tree_util.tree_unflatten(treedef, _split_vector(x, shapes, sizes, np.reshape))

            bounds = None
            if constraints is not None:
                lb, ub = jaxopt_wrappers._get_bounds(starts[0], constraints)
                bounds = optimize.Bounds(flat(lb), flat(ub))

            value_and_grad = flat_value_and_grad(loss_fn, treedef, shapes, dtype)

            def fun(x: np.ndarray):
                out = value_and_grad(np.asarray(x, dtype))
                value = float(out[0])
                if not math.isfinite(value):
                    return np.inf, np.zeros_like(x)
                return value, np.asarray(out[1:], dtype=np.float64)

            losses, params = [], []
            for start in starts:
                res = optimize.minimize(fun, flat(start), jac=True, method="L-BFGS-B", bounds=bounds,
                                        options={"maxiter": self.maxiter, "gtol": self.tol, "maxls": self.maxls})
                losses.append(float(res.fun) if math.isfinite(float(res.fun)) else np.inf)
                params.append(unflat(np.asarray(res.x)))
            all_params = jax.tree_util.tree_map(lambda *x: np.stack(x), *params)
            losses_arr = np.asarray(losses, dtype=np.float64)
            # core.get_best_params in numpy (jnp.argsort is stable, so is this)
            best_idx = np.argsort(losses_arr, kind="stable")[:best_n or 1]
            best = jax.tree_util.tree_map(lambda p: p[best_idx], all_params)
            if best_n is None:
                best = jax.tree_util.tree_map(lambda p: np.squeeze(p, axis=0), best)
            return best, {"loss": losses_arr[np.newaxis, :]}

    opt = ScipyLbfgsB(maxiter=int(maxiter))
    with _setup_lock:
        return _STABLE.setdefault(key, opt)


def _masked_loss(loss_fn):
    """Vizier's ARD loss ignores the padding mask for a multi-task (several metrics) GP ("TODO:
    Enable `is_missing` for MTGP"): padded rows (NaN labels) entered the likelihood, which is why
    padding changed two-objective suggestions. Swap in `MaskedMultiTaskLoss` there; other losses
    pass through unchanged."""
    from vizier._src.jax import stochastic_process_model as sp

    model = getattr(loss_fn, "__self__", None)
    if not isinstance(model, sp.CoroutineWithData) or getattr(loss_fn, "__func__", None) is not type(
            model).loss_with_aux or model.data.labels.shape[-1] < 2:
        return loss_fn
    return _masked_mt_loss_class()(model.coroutine, model.data, shared_rows=_shared_rows(model.data.labels))


def _shared_rows(labels) -> bool:
    """True when every row has all metrics or none (concrete mask): the ledger only completes a
    trial with every metric finite, and padded rows have none, so this is the usual case."""
    import numpy as np

    mask = np.asarray(labels._mask)  # pylint: disable=protected-access
    return bool(mask.ndim == 2 and mask.size and (mask == mask[:, :1]).all())


def _masked_mt_loss_class():
    if "mt_loss" not in _STABLE:
        import equinox as eqx
        import jax
        import jax.numpy as jnp
        import numpy as np
        from vizier._src.jax import stochastic_process_model as sp
        from vizier._src.jax import types

        class MaskedMultiTaskLoss(eqx.Module):
            """Negative log marginal likelihood of a multi-task GP over the OBSERVED (row, metric)
            entries only, plus the parameter regularisers: what the unpadded loss computes, at a
            padded shape. Padded entries get identity covariance rows and a zero residual, as TFP
            does for `observations_is_missing` in the posterior; padded features are zeroed first
            so no NaN reaches the gradient. An eqx.Module, so one compiled program per bucket."""

            coroutine: Any = eqx.field(static=True)
            data: Any
            # every row observes all metrics or none (`_shared_rows`): with Vizier's INDEPENDENT
            # kernel all metrics then share ONE masked n x n covariance, so one Cholesky factor
            # and one solve with m right-hand sides replace m factors (half the 2-objective fit)
            shared_rows: bool = eqx.field(static=True, default=False)

            def __call__(self, params, seed=None):
                del seed
                f = self.data.features
                clean = types.ModelInput(
                    continuous=f.continuous.replace_fill_value(0.0),
                    categorical=f.categorical.replace_fill_value(0),
                )
                dist, aux = sp.StochasticProcessWithCoroutine(self.coroutine, params).call_with_aux(clean)
                x = dist.index_points
                labels = self.data.labels
                n, m = labels.padded_array.shape
                missing = ~jnp.asarray(labels._mask)  # [n, m]  # pylint: disable=protected-access
                y = jnp.asarray(labels.padded_array)
                diff = jnp.where(missing, 0.0, jnp.where(missing, 0.0, y) - jnp.broadcast_to(dist.mean_fn(x), (n, m)))
                noise = jnp.reshape(dist.observation_noise_variance, (-1,))[0]
                if type(dist.kernel).__name__ == "Independent" and self.shared_rows:
                    chol = _shared_row_cholesky(dist, x, noise, missing[:, 0])
                    sol = jax.scipy.linalg.solve_triangular(chol, diff, lower=True)  # [n, m]
                    log_prob = (-0.5 * jnp.sum(sol**2) - m * jnp.sum(jnp.log(jnp.diagonal(chol)))
                                - 0.5 * jnp.sum(~missing) * np.log(2 * np.pi))
                    return -log_prob + jax.tree_util.tree_reduce(jnp.add, aux["losses"]), aux
                if type(dist.kernel).__name__ == "Independent":
                    # Vizier's default (INDEPENDENT): one n x n covariance shared by the metrics,
                    # masked per metric; m Cholesky factors of n x n instead of one of nm x nm
                    cov = dist.kernel.base_kernel.matrix(x, x)
                    cov = jnp.broadcast_to(cov + noise * jnp.eye(n, dtype=cov.dtype), (m, n, n))
                    miss, res = missing.T, diff.T  # [m, n]
                else:
                    cov = dist.kernel.matrix_over_all_tasks(x, x).to_dense()
                    cov = (cov + noise * jnp.eye(n * m, dtype=cov.dtype))[None]
                    miss, res = jnp.reshape(missing, (1, -1)), jnp.reshape(diff, (1, -1))
                # TFP's mask_matrix: missing rows / columns become those of the identity
                eye = jnp.eye(cov.shape[-1], dtype=cov.dtype)
                cov = jnp.where(miss[:, :, None] | miss[:, None, :], eye, cov)
                chol = jax.vmap(dist.cholesky_fn if dist.cholesky_fn is not None else jnp.linalg.cholesky)(cov)
                sol = jax.vmap(lambda c, r: jax.scipy.linalg.solve_triangular(c, r, lower=True))(chol, res)
                log_prob = (-0.5 * jnp.sum(sol**2) - jnp.sum(jnp.log(jnp.diagonal(chol, axis1=-2, axis2=-1)))
                            - 0.5 * jnp.sum(~missing) * np.log(2 * np.pi))
                return -log_prob + jax.tree_util.tree_reduce(jnp.add, aux["losses"]), aux

        _STABLE["mt_loss"] = MaskedMultiTaskLoss
    return _STABLE["mt_loss"]


def _precompute_predictive(model, data):
    """`model.precompute_predictive(data)`, compiled once per shape bucket. Several metrics with
    shared rows (`_shared_rows`) under Vizier's INDEPENDENT multi-task kernel: the posterior's
    divisor matrix is kron(masked K_nn + noise, I_m), so it is factored as ONE n x n Cholesky and
    handed to TFP as its own 'independent' (Kronecker) precomputation, instead of the dense
    (n m) x (n m) factor TFP builds whenever a mask is given. Every acquisition step then solves
    against n x n instead of 2n x 2n (two objectives). Same predictive mean and stddev
    (tests/test_vizier_padding.py)."""
    import equinox as eqx

    labels = data.labels
    if labels.shape[-1] < 2 or not _shared_rows(labels):
        return eqx.filter_jit(model.precompute_predictive)(data)
    with _setup_lock:
        if "indep_precompute" not in _STABLE:
            _STABLE["indep_precompute"] = eqx.filter_jit(_independent_precompute)
        fn = _STABLE["indep_precompute"]
    return fn(model, data)


def _shared_row_cholesky(dist, x, noise, row_missing):
    """The one n x n factor that metrics with shared rows (`_shared_rows`) share under Vizier's
    INDEPENDENT kernel: K_nn + noise, masked as TFP's mask_matrix does (a missing row / column
    becomes the identity's). Used by the ARD loss and by the posterior, so both factor the same."""
    import jax.numpy as jnp

    cov = dist.kernel.base_kernel.matrix(x, x)
    eye = jnp.eye(cov.shape[-1], dtype=cov.dtype)
    if noise is not None:
        cov = cov + jnp.asarray(noise)[..., None, None] * eye
    cov = jnp.where(row_missing[:, None] | row_missing[None, :], eye, cov)
    return (dist.cholesky_fn if dist.cholesky_fn is not None else jnp.linalg.cholesky)(cov)


def _independent_precompute(model, data):
    import jax
    import jax.numpy as jnp
    from vizier._src.jax import stochastic_process_model as sp

    prior = model(data.features)
    if type(prior.kernel).__name__ != "Independent":  # e.g. a separable multi-task kernel
        return model.precompute_predictive(data)
    x = prior.index_points
    missing = ~jnp.asarray(data.labels._mask)  # [n, m]; rows all-or-nothing  # pylint: disable=protected-access
    chol = _shared_row_cholesky(prior, x, prior.observation_noise_variance, missing[:, 0])
    diff = jnp.where(missing, 0.0, jnp.asarray(data.labels.padded_array) - prior.mean_fn(x))
    diff = jnp.broadcast_to(diff, chol.shape[:-2] + diff.shape[-2:])
    half = jax.scipy.linalg.solve_triangular(chol, diff, lower=True)
    solve = jax.scipy.linalg.solve_triangular(chol, half, lower=True, trans=1)
    solve = jnp.reshape(solve, solve.shape[:-2] + (-1,))  # TFP's vec: row-major, task fastest
    return sp.PrecomputedPredictive(model, data, {"independent": {"chol_tril": chol}}, solve)


def _threshold_pe_class():
    """GP-UCB-PE's pure-exploration score with its UCB threshold computed ONCE per optimisation.
    The stock score recomputes it (a GP prediction at every observed and pending trial, O(n^3) in
    the padded trial count) inside each of the ~160 acquisition-optimiser steps; at 128 padded
    rows that was most of a suggest. Same formula, same value."""
    if "pe_score" not in _STABLE:
        from vizier._src.algorithms.designers import gp_ucb_pe

        threshold_fn = _threshold_fn()
        base = gp_ucb_pe.PEScoreFunction

        class ThresholdPEScore(base):  # type: ignore[misc, valid-type]
            threshold: Any

            def __init__(self, predictive, predictive_all_features, ucb_coefficient, explore_ucb_coefficient,
                         penalty_coefficient, trust_region, multimetric_promising_region_penalty_type):
                self.predictive = predictive
                self.predictive_all_features = predictive_all_features
                self.ucb_coefficient = ucb_coefficient
                self.explore_ucb_coefficient = explore_ucb_coefficient
                self.penalty_coefficient = penalty_coefficient
                self.trust_region = trust_region
                self.multimetric_promising_region_penalty_type = multimetric_promising_region_penalty_type
                self.threshold = threshold_fn(predictive, predictive_all_features, ucb_coefficient)

            def score_with_aux(self, xs, seed=None):
                # the stock body (vizier 0.1.24 PEScoreFunction.score_with_aux), threshold precomputed
                del seed
                gprm = self.predictive.predict(xs)
                mean = gprm.mean()
                stddev = gprm.stddev()
                stddev_from_all = self.predictive_all_features.predict(xs).stddev()
                acq_values = _pe_acquisition(self, mean, stddev, stddev_from_all)
                if self.trust_region is not None:
                    acq_values = gp_ucb_pe._apply_trust_region(self.trust_region, xs, acq_values)
                return acq_values, {"mean": mean, "stddev": stddev, "stddev_from_all": stddev_from_all}

        _STABLE["pe_score"] = ThresholdPEScore
    return _STABLE["pe_score"]


def _pe_acquisition(score, mean, stddev, stddev_from_all):
    """GP-UCB-PE's pure-exploration value (vizier 0.1.24 PEScoreFunction.score_with_aux's formula,
    before the trust region) from a score's coefficients, its precomputed UCB threshold and the
    three GP quantities: one body for the two-program and the shared score classes."""
    import jax.numpy as jnp
    from vizier._src.algorithms.designers import gp_ucb_pe

    explore_ucb = mean + stddev * score.explore_ucb_coefficient
    penalty = score.penalty_coefficient * jnp.minimum(explore_ucb - score.threshold, 0.0)
    if stddev_from_all.ndim <= 1:
        return stddev_from_all + penalty
    kind = score.multimetric_promising_region_penalty_type
    kinds = gp_ucb_pe.MultimetricPromisingRegionPenaltyType
    if kind == kinds.UNION:
        scalarized_penalty = jnp.max(penalty, axis=-1)
    elif kind == kinds.INTERSECTION:
        scalarized_penalty = jnp.min(penalty, axis=-1)
    elif kind == kinds.AVERAGE:
        scalarized_penalty = jnp.mean(penalty, axis=-1)
    else:
        raise ValueError(f"Unsupported multimetric promising region penalty type: {kind}")
    return jnp.mean(stddev_from_all, axis=-1) + scalarized_penalty


def _threshold_fn():
    """PE's UCB threshold (a GP prediction at every observed and pending trial), jitted once."""
    if "threshold_fn" not in _STABLE:
        import equinox as eqx
        from vizier._src.algorithms.designers import gp_ucb_pe

        def threshold(predictive, predictive_all_features, ucb_coefficient):
            features = predictive_all_features.predictives.observed_data.features
            is_missing = features.continuous.is_missing[0] | features.categorical.is_missing[0]
            return gp_ucb_pe._compute_ucb_threshold(predictive.predict(features), is_missing, ucb_coefficient)

        _STABLE["threshold_fn"] = eqx.filter_jit(threshold)
    return _STABLE["threshold_fn"]


def _shared_score_class():
    """GP-UCB-PE's UCB score (the first point of a batch) and its pure-exploration score (the rest)
    as ONE eqx.Module class whose choice is a traced boolean (`use_ucb`) picked by `lax.cond`.

    Vizier scores the two with two classes, so a process traced, lowered and compiled the whole
    Eagle acquisition optimiser twice (and the `aux` program twice): about half of the acquisition
    compile of a cold first call. Both scores use the same three GP quantities (the history
    predictive's mean, its stddev, the history + pending predictive's stddev); only the final
    formula differs, and the cond runs one branch per optimiser step (the UCB steps do not compute
    the history stddev, as in Vizier). The bodies are the stock ones (vizier 0.1.24
    UCBScoreFunction / PEScoreFunction.score_with_aux), the PE threshold precomputed once per
    optimisation as in `_threshold_pe_class`; equal values to Vizier's (tests/test_vizier_padding.py).

    Per optimiser step (`fast_posterior`, on by default): the three GP quantities come from
    `_posterior_terms` instead of TFP's posterior distributions, which evaluated the kernel
    between the 25 candidates and the observed rows three times (mean, history stddev, all-rows
    stddev; the two-objective mean through TFP's flattened (25 m) x (n m) task kernel), solved
    against the Kronecker factor with m x 2 right-hand sides per candidate (m^2 x the work) and
    re-masked the Cholesky factor every step. Here the kernel is evaluated ONCE per step and shared
    by both predictives when they share the kernel (same parameters but the noise, the history's
    rows are the first rows of history + pending: `_shares_kernel`, checked on concrete arrays),
    and each stddev is one triangular solve with one right-hand side per candidate. And the UCB's
    hypervolume bound over the observed labels (1000 scalarisations x n rows, independent of the
    candidates) is computed once per optimisation (`label_max`), not in every step. Same formulas:
    equal to TFP's values to ~1e-15 (tests/test_vizier_padding.py)."""
    if "shared_score" not in _STABLE:
        import equinox as eqx
        import jax
        import jax.numpy as jnp
        import numpy as np
        from vizier._src.algorithms.designers import gp_ucb_pe, scalarization
        from vizier._src.algorithms.designers.gp import acquisitions

        class SharedUCBPEScore(eqx.Module):
            predictive: Any
            predictive_all_features: Any
            use_ucb: Any  # a bool array: dynamic, so UCB and PE share one compiled program
            ucb_coefficient: Any
            explore_ucb_coefficient: Any
            penalty_coefficient: Any
            trust_region: Any
            multimetric_promising_region_penalty_type: Any = eqx.field(static=True)
            threshold: Any
            labels: Any
            scalarizer: Any
            label_max: Any  # UCB, several metrics: max over the observed labels per scalarisation
            fast: bool = eqx.field(static=True)  # `_posterior_terms` instead of TFP's distributions
            share_kernel: bool = eqx.field(static=True)  # one kernel evaluation for both predictives

            def __init__(self, predictive, predictive_all_features, *, use_ucb: bool, ucb_coefficient,
                         explore_ucb_coefficient, penalty_coefficient, trust_region,
                         multimetric_promising_region_penalty_type, labels, scalarization_weights_rng=None,
                         num_scalarizations: int = 1000, fast_posterior: bool = True):
                self.predictive = predictive
                self.predictive_all_features = predictive_all_features
                self.use_ucb = np.asarray(bool(use_ucb))
                self.ucb_coefficient = ucb_coefficient
                self.explore_ucb_coefficient = explore_ucb_coefficient
                self.penalty_coefficient = penalty_coefficient
                self.trust_region = trust_region
                self.multimetric_promising_region_penalty_type = multimetric_promising_region_penalty_type
                self.labels = labels
                self.threshold = _threshold_fn()(predictive, predictive_all_features, ucb_coefficient)
                dtype = np.asarray(labels.padded_array).dtype
                m = labels.shape[1]
                if scalarization_weights_rng is not None:  # UCB: Vizier's random hypervolume weights
                    self.scalarizer = acquisitions.create_hv_scalarization(
                        num_scalarizations, labels, scalarization_weights_rng)
                else:  # PE never reads them: same shapes and dtypes, no random draw, no eager op
                    self.scalarizer = scalarization.HyperVolumeScalarization(
                        np.ones((num_scalarizations, m), dtype),
                        np.zeros((m,), dtype) if labels.shape[0] > 0 else None)
                if scalarization_weights_rng is not None and m > 1 and labels.shape[0] > 0:
                    self.label_max = _label_max_fn()(self.scalarizer, labels)
                else:  # unused (PE, one metric or no rows): same shape, so one program
                    self.label_max = np.zeros((num_scalarizations,), dtype)
                self.fast = bool(fast_posterior) and _fast_posterior_ok(predictive) and _fast_posterior_ok(
                    predictive_all_features)
                self.share_kernel = self.fast and _shares_kernel(predictive, predictive_all_features)

            def score(self, xs, seed=None):
                return self._scores(xs, with_aux=False)[0]

            def aux(self, xs, seed=None):
                return self._scores(xs, with_aux=True)[1]

            def score_with_aux(self, xs, seed=None):
                return self._scores(xs, with_aux=True)

            def _gp(self, xs):
                """(history mean, a function giving the history stddev, history + pending stddev)."""
                if self.fast:
                    return _posterior_terms(self.predictive, self.predictive_all_features, xs, self.share_kernel)
                gprm = self.predictive.predict(xs)
                return gprm.mean(), gprm.stddev, self.predictive_all_features.predict(xs).stddev()

            def _scores(self, xs, with_aux: bool):
                mean, stddev_fn, stddev_from_all = self._gp(xs)

                def ucb():
                    acq_values = mean + self.ucb_coefficient * stddev_from_all
                    if self.labels.shape[1] > 1:
                        scalarized = self.scalarizer(acq_values)
                        if self.labels.shape[0] > 0:
                            # the stock max over the observed labels, precomputed (see __init__)
                            max_scalarized = self.label_max
                            shape_mismatch = len(scalarized.shape) - len(max_scalarized.shape)
                            expand_max = jnp.expand_dims(max_scalarized, axis=range(-shape_mismatch, 0))
                            scalarized = jnp.maximum(scalarized, expand_max)
                        return jnp.mean(scalarized, axis=0)
                    return acq_values

                def pe():
                    return _pe_acquisition(self, mean, stddev_fn(), stddev_from_all)

                acq_values = jax.lax.cond(self.use_ucb, ucb, pe)
                if self.trust_region is not None:
                    acq_values = gp_ucb_pe._apply_trust_region(self.trust_region, xs, acq_values)
                if not with_aux:
                    return acq_values, None
                return acq_values, {"mean": mean, "stddev": stddev_fn(), "stddev_from_all": stddev_from_all}

        _STABLE["shared_score"] = SharedUCBPEScore
    return _STABLE["shared_score"]


def _label_max_fn():
    """GP-UCB-PE's UCB bound over the observed labels (vizier 0.1.24 UCBScoreFunction: the max of
    each hypervolume scalarisation over the labels, padded rows -inf), jitted once."""
    if "label_max" not in _STABLE:
        import equinox as eqx
        import jax.numpy as jnp
        import numpy as np

        def label_max(scalarizer, labels):
            return jnp.max(scalarizer(labels.replace_fill_value(-np.inf).padded_array), axis=-1)

        _STABLE["label_max"] = eqx.filter_jit(label_max)
    return _STABLE["label_max"]


def _fast_posterior_ok(predictive) -> bool:
    """Whether `_posterior_terms` covers this predictive (structure only, so also under tracing):
    a uniform ensemble of ONE precomputed posterior (Vizier's GP-UCB-PE default), one metric with
    TFP's dense factor, or several with `_independent_precompute`'s shared n x n factor."""
    import numpy as np
    from vizier._src.jax import stochastic_process_model as sp

    p: Any = getattr(predictive, "predictives", None)
    if type(predictive) is not sp.UniformEnsemblePredictive or type(p) is not sp.PrecomputedPredictive:
        return False
    solve_shape = np.shape(p.precomputed_solve_on_observation)
    if len(solve_shape) > 2 or (len(solve_shape) == 2 and solve_shape[0] != 1):
        return False  # an ensemble of several members: TFP's mixture
    chol = p.precomputed_divisor_matrix_cholesky
    if p.observed_data.labels.shape[-1] > 1:
        return isinstance(chol, dict) and set(chol) == {"independent"}
    return not isinstance(chol, dict)


def _shares_kernel(predictive, predictive_all_features) -> bool:
    """True when both posteriors evaluate the SAME kernel between candidates and observed rows on
    every history row: one coroutine, equal parameters except the observation noise (GP-UCB-PE's
    history + pending predictive differs from the history one only in its rows, and in a high-noise
    study its noise), equal padded row count and feature masks, and each history row also a row of
    history + pending at the same index. Checked on concrete arrays; False under tracing."""
    import jax
    import numpy as np

    h, a = predictive.predictives, predictive_all_features.predictives
    if h.prior.coroutine != a.prior.coroutine:
        return False
    for x in (h.prior.params, a.prior.params, h.observed_data, a.observed_data):
        if any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(x)):
            return False
    hp = {k: v for k, v in dict(h.prior.params).items() if k != "observation_noise_variance"}
    ap = {k: v for k, v in dict(a.prior.params).items() if k != "observation_noise_variance"}
    if jax.tree_util.tree_structure(hp) != jax.tree_util.tree_structure(ap):
        return False
    for x, y in zip(jax.tree_util.tree_leaves(hp), jax.tree_util.tree_leaves(ap)):
        if np.shape(x) != np.shape(y) or not np.array_equal(np.asarray(x), np.asarray(y)):
            return False
    h_rows = ~_row_missing(h.observed_data.labels)
    a_rows = ~_row_missing(a.observed_data.labels)
    if h_rows.shape != a_rows.shape or not np.all(a_rows[h_rows]):
        return False
    for hf, af in ((h.observed_data.features.continuous, a.observed_data.features.continuous),
                   (h.observed_data.features.categorical, a.observed_data.features.categorical)):
        hx, ax = np.asarray(hf.padded_array), np.asarray(af.padded_array)
        if hx.shape != ax.shape or not np.array_equal(np.asarray(hf._mask)[h_rows], np.asarray(af._mask)[h_rows]):
            return False
        if not np.array_equal(np.asarray(hf.is_missing[1]), np.asarray(af.is_missing[1])):
            return False  # the kernel masks padded feature dimensions
        if not np.array_equal(hx[h_rows], ax[h_rows], equal_nan=np.issubdtype(hx.dtype, np.floating)):
            return False
    return True


def _row_missing(labels):
    """Observed-row mask of a label PaddedArray as numpy: a row is missing when it has no metric."""
    import numpy as np

    mask = np.asarray(labels._mask)  # pylint: disable=protected-access
    return ~mask.reshape(mask.shape[0], -1).any(axis=1)


def _gp_terms(predictive):
    """What a posterior prediction needs from one `_fast_posterior_ok` predictive: the kernel (the
    base kernel of Vizier's INDEPENDENT multi-task kernel), the observed index points with missing
    rows zeroed (as TFP's SchurComplement does), the missing-row mask, the Cholesky factor of the
    masked K_nn + noise, the precomputed solve as [..., n] (one metric) or [..., n, m], the
    observation noise and the prior mean function."""
    import jax
    import jax.numpy as jnp

    p = predictive.predictives
    prior = p.prior(p.observed_data.features)
    labels = p.observed_data.labels
    solve = p.precomputed_solve_on_observation
    chol = p.precomputed_divisor_matrix_cholesky
    if labels.shape[-1] > 1:
        kernel = prior.kernel.base_kernel
        chol = chol["independent"]["chol_tril"]
        missing = ~jnp.asarray(labels._mask)[:, 0]  # pylint: disable=protected-access
        n, m = labels.padded_array.shape
        solve = jnp.reshape(solve, solve.shape[:-1] + (n, m))  # TFP's vec: row-major, task fastest
    else:
        kernel = prior.kernel
        missing = labels.is_missing[0]
    z = jax.tree_util.tree_map(
        lambda v: jnp.where(jnp.reshape(missing, missing.shape + (1,) * (v.ndim - 1)), jnp.zeros((), v.dtype), v),
        prior.index_points)
    return kernel, z, missing, chol, solve, prior.observation_noise_variance, prior.mean_fn


def _posterior_terms(predictive, predictive_all_features, xs, share_kernel: bool):
    """GP-UCB-PE's three GP quantities at the candidates `xs`: the history predictive's mean, a
    function giving its stddev, and the history + pending predictive's stddev, with the shapes
    and values of TFP's posterior (vizier 0.1.24 PrecomputedPredictive.predict: mean() and stddev()
    of a GaussianProcessRegressionModel, or of a MultiTaskGaussianProcessRegressionModel with the
    Kronecker factor, for the one-member ensemble). Per predictive: mean = m(x) + K_xZ alpha,
    variance = k(x, x) - |L^-1 K_Zx|^2 + noise, K_xZ with missing rows zeroed. The kernel and
    k(x, x) are evaluated once when `share_kernel` (`_shares_kernel`)."""
    import jax
    import jax.numpy as jnp
    from tensorflow_probability.substrates.jax.experimental import psd_kernels as tfpke  # type: ignore[import-untyped]

    x = tfpke.ContinuousAndCategoricalValues(continuous=xs.continuous.padded_array,
                                             categorical=xs.categorical.padded_array)
    h_kernel, h_z, h_missing, h_chol, h_solve, h_noise, h_mean_fn = _gp_terms(predictive)
    a_kernel, a_z, a_missing, a_chol, a_solve, a_noise, _ = _gp_terms(predictive_all_features)
    multi = h_solve.ndim > h_chol.ndim - 1  # [..., n, m] against [..., n, n]

    def cross(kernel, z, missing):
        return jnp.where(missing, jnp.zeros((), z.continuous.dtype), kernel.matrix(x, z))  # [..., b, n]

    k_all = cross(a_kernel, a_z, a_missing)
    kxx_all = a_kernel.apply(x, x, example_ndims=1)  # [..., b]
    if share_kernel:
        k_hist, kxx_hist = jnp.where(h_missing, jnp.zeros((), k_all.dtype), k_all), kxx_all
    else:
        k_hist, kxx_hist = cross(h_kernel, h_z, h_missing), h_kernel.apply(x, x, example_ndims=1)

    def stddev(chol, k, kxx, noise):
        half = jax.scipy.linalg.solve_triangular(chol, jnp.swapaxes(k, -1, -2), lower=True)  # [..., n, b]
        var = kxx - jnp.sum(half * half, axis=-2) + jnp.asarray(noise)[..., None]
        return finish(jnp.sqrt(var), broadcast=True)

    def finish(v, broadcast=False):
        if v.ndim > (2 if multi and not broadcast else 1):
            v = v[0]  # the one-member ensemble
        if multi and broadcast:
            v = jnp.broadcast_to(v[..., None], v.shape + (h_solve.shape[-1],))
        return v

    if multi:
        mean = finish(h_mean_fn(x) + jnp.matmul(k_hist, h_solve))  # [..., b, m]
    else:
        mean = finish(h_mean_fn(x) + jnp.einsum("...bn,...n->...b", k_hist, h_solve))
    return mean, lambda: stddev(h_chol, k_hist, kxx_hist, h_noise), stddev(a_chol, k_all, kxx_all, a_noise)


def _ucb_pe_class():
    """GP-UCB-PE whose pending-trial conditioning joins the arrays in numpy. Vizier joins the
    unpadded arrays with jnp ops, compiling a small program per distinct (trials, pending) count."""
    if "ucb_pe" not in _STABLE:
        import copy

        import numpy as np
        from vizier._src.algorithms.designers import gp_ucb_pe
        from vizier._src.jax import stochastic_process_model as sp
        from vizier._src.jax import types

        def unpad(x):
            return np.asarray(x.padded_array)[tuple(slice(0, int(d)) for d in np.asarray(x._original_shape))]

        class StableUCBPE(gp_ucb_pe.VizierGPUCBPEBandit):
            def __attrs_post_init__(self):
                # The stock check refuses any trial padding with several metrics (its probe is a
                # one-row label array). Padded rows are masked (labels filled with -inf for the
                # hypervolume scalarisation), so run the checks unpadded and pad afterwards.
                from vizier.pyvizier import converters
                from vizier.pyvizier.converters import padding

                # an attrs field of the untyped vizier base class: mypy cannot see its type
                schedule = self._padding_schedule  # type: ignore[has-type]
                self._padding_schedule = padding.PaddingSchedule()
                super().__attrs_post_init__()
                self._padding_schedule = schedule
                self._converter = converters.TrialToModelInputConverter.from_problem(
                    self._problem, scale=True, max_discrete_indices=0,
                    flip_sign_for_minimization_metrics=True, padding_schedule=schedule)

            def _get_predictive_all_features(self, pending_features, data, model, noise_is_high):
                import equinox as eqx

                pad = self._padding_schedule
                all_features = types.ModelInput(
                    continuous=pad.pad_features(np.concatenate(
                        [unpad(data.features.continuous), unpad(pending_features.continuous)], axis=0)),
                    categorical=pad.pad_features(np.concatenate(
                        [unpad(data.features.categorical), unpad(pending_features.categorical)], axis=0)),
                )
                labels = unpad(data.labels)
                dummy = np.zeros((unpad(pending_features.continuous).shape[0], labels.shape[-1]), labels.dtype)
                all_data = types.ModelData(features=all_features,
                                           labels=pad.pad_labels(np.concatenate([labels, dummy], axis=0)))
                if noise_is_high:
                    pe_params = dict(copy.deepcopy(model.params))
                    pe_params["observation_noise_variance"] = np.array([1e-10])
                    pe_model = sp.StochasticProcessWithCoroutine(model.coroutine, pe_params)
                else:
                    pe_model = model
                return sp.UniformEnsemblePredictive(
                    predictives=_precompute_predictive(pe_model, all_data))

            def _suggest_one(self, active_trials, data, model, predictive, tr, acquisition_problem):
                # PE scores built here precompute their UCB threshold (see _threshold_pe_class); with
                # `shared_acquisition` UCB and PE are one score class (see _shared_score_class)
                stock = gp_ucb_pe.PEScoreFunction, gp_ucb_pe.UCBScoreFunction
                if getattr(self, "_spica_shared_acquisition", True):
                    shared, cfg = _shared_score_class(), self._config
                    fast = getattr(self, "_spica_fast_posterior", True)

                    def ucb_score(predictive, predictive_all_features, ucb_coefficient, trust_region,
                                  scalarization_weights_rng, labels, num_scalarizations=1000):
                        return shared(
                            predictive, predictive_all_features, use_ucb=True, ucb_coefficient=ucb_coefficient,
                            explore_ucb_coefficient=cfg.explore_region_ucb_coefficient,
                            penalty_coefficient=cfg.cb_violation_penalty_coefficient, trust_region=trust_region,
                            multimetric_promising_region_penalty_type=cfg.multimetric_promising_region_penalty_type,
                            labels=labels, scalarization_weights_rng=scalarization_weights_rng,
                            num_scalarizations=num_scalarizations, fast_posterior=fast)

                    def pe_score(predictive, predictive_all_features, ucb_coefficient, explore_ucb_coefficient,
                                 penalty_coefficient, trust_region, multimetric_promising_region_penalty_type):
                        return shared(
                            predictive, predictive_all_features, use_ucb=False, ucb_coefficient=ucb_coefficient,
                            explore_ucb_coefficient=explore_ucb_coefficient, penalty_coefficient=penalty_coefficient,
                            trust_region=trust_region,
                            multimetric_promising_region_penalty_type=multimetric_promising_region_penalty_type,
                            labels=data.labels, fast_posterior=fast)

                    gp_ucb_pe.PEScoreFunction, gp_ucb_pe.UCBScoreFunction = pe_score, ucb_score
                else:
                    gp_ucb_pe.PEScoreFunction = _threshold_pe_class()
                try:
                    return super()._suggest_one(active_trials, data, model, predictive, tr, acquisition_problem)
                finally:
                    gp_ucb_pe.PEScoreFunction, gp_ucb_pe.UCBScoreFunction = stock

            def _trials_to_data(self, trials):
                # the stock body (vizier 0.1.24), unpadding and re-padding the warped labels in numpy:
                # jnp.pad / lax.slice on the unpadded shapes compiled small programs at every trial count
                from vizier._src.algorithms.designers.gp import output_warpers

                data = self._converter.to_xy(trials)
                unpadded_labels = unpad(data.labels)
                warped_labels = []
                self._output_warpers = []
                for i in range(data.labels.shape[1]):
                    output_warper = output_warpers.create_default_warper()
                    warped_labels.append(output_warper.warp(unpadded_labels[:, i: i + 1]))
                    self._output_warpers.append(output_warper)
                labels = _numpy_padded(np.concatenate(warped_labels, axis=-1), tuple(data.labels.padded_array.shape),
                                       data.labels.fill_value)
                return types.ModelData(features=data.features, labels=labels)

            def suggest(self, count=None):
                # the stock body (vizier 0.1.24 VizierGPUCBPEBandit.suggest) with the trust region's
                # features joined in numpy (jnp.concatenate compiled a program per trial count)
                import equinox as eqx
                import jax
                from vizier import pyvizier as vz
                from vizier._src.algorithms.designers.gp import acquisitions

                count = count or 1
                num_total = len(self._all_completed_trials) + len(self._all_active_trials)
                if num_total < self._num_seed_trials:
                    return self._generate_seed_trials(count)
                if self._clear_jax_cache:
                    jax.clear_caches()
                self._rng, rng = jax.random.split(self._rng, 2)  # type: ignore[has-type]
                data = self._trials_to_data(self._all_completed_trials)
                model = self._build_gp_model_and_optimize_parameters(data, rng)
                predictive = sp.UniformEnsemblePredictive(
                    predictives=_precompute_predictive(model, data))
                active_features = self._converter.to_features(self._all_active_trials)
                pad = self._padding_schedule
                tr_features = types.ModelInput(
                    continuous=pad.pad_features(np.concatenate(
                        [unpad(data.features.continuous), unpad(active_features.continuous)], axis=0)),
                    categorical=pad.pad_features(np.concatenate(
                        [unpad(data.features.categorical), unpad(active_features.categorical)], axis=0)),
                )
                tr = acquisitions.TrustRegion(trusted=tr_features)
                acquisition_problem = copy.deepcopy(self._problem)
                acquisition_problem.metric_information = [
                    vz.MetricInformation(name="acquisition", goal=vz.ObjectiveMetricGoal.MAXIMIZE)]
                active_trials = list(self._all_active_trials)
                if count <= 1:
                    return [self._suggest_one(active_trials, data, model, predictive, tr, acquisition_problem)]
                suggestions = []
                if self._config.optimize_set_acquisition_for_exploration:
                    if gp_ucb_pe._has_new_completed_trials(completed_trials=self._all_completed_trials,
                                                           active_trials=active_trials):
                        suggestions.append(self._suggest_one(active_trials, data, model, predictive, tr,
                                                             acquisition_problem))
                        active_trials.append(suggestions[-1].to_trial())
                    return suggestions + self._suggest_batch_with_exploration(
                        count - len(suggestions), active_trials, data, model, predictive, tr)
                for _ in range(count):
                    suggestions.append(self._suggest_one(active_trials, data, model, predictive, tr,
                                                         acquisition_problem))
                    active_trials.append(suggestions[-1].to_trial())
                return suggestions

        _STABLE["ucb_pe"] = StableUCBPE
    return _STABLE["ucb_pe"]


def stable_random_sampler(converter):
    bucket = _feature_bucket(converter)
    with _setup_lock:
        key = ("sampler", bucket)
        if key not in _STABLE:
            _STABLE[key] = _stable_classes()[0](converter, bucket)
        return _STABLE[key]


def stable_projection(converter):
    with _setup_lock:
        if "projection" not in _STABLE:
            _STABLE["projection"] = _stable_classes()[1](converter)
        return _STABLE["projection"]


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


def _floor_padding(min_trials: int, numpy: bool = True):
    """A PaddingSchedule whose trial axis is padded to max(min_trials, next power of two).
    Padded rows are masked out by Vizier's GP (PaddedArray), so results do not change."""
    import attrs
    import numpy as np
    from vizier.pyvizier.converters import padding

    global _FloorPadding
    if _FloorPadding is None:
        @attrs.define(frozen=True, kw_only=True, hash=True, eq=True)
        class FloorPadding(padding.PaddingSchedule):
            _min_trials: int = 32
            _numpy: bool = True

            def _pad_trailing_dims(self, array, padding_types):
                if not self._numpy:
                    out = super()._pad_trailing_dims(array, padding_types)
                    n_axis = len(array.shape) - len(padding_types)
                    n = out.padded_array.shape[n_axis]
                    if n == 0 or n >= self._min_trials:
                        return out
                    shape = list(out.padded_array.shape)
                    shape[n_axis] = self._min_trials
                    return type(out).from_array(array, tuple(shape), fill_value=out.fill_value)
                # Same shapes as the stock schedule, but padded in numpy: jnp.pad would compile a
                # small XLA program for every distinct trial count (dozens per suggest).
                array = np.asarray(array)
                k = len(padding_types)
                shape = list(array.shape[:-k] + padding._padded_dimensions(array.shape[-k:], padding_types))
                n_axis = len(array.shape) - k  # the trial axis
                if 0 < shape[n_axis] < self._min_trials:
                    shape[n_axis] = self._min_trials
                fill = self._int_default if np.issubdtype(array.dtype, np.integer) else np.nan
                return _numpy_padded(array, tuple(shape), fill)

        _FloorPadding = FloorPadding
    return _FloorPadding(num_trials=padding.PaddingType.POWERS_OF_2, min_trials=min_trials, numpy=numpy)


_FloorPadding: Any = None


def _numpy_padded(array, shape: tuple, fill):
    """`PaddedArray.from_array` computed in numpy (no per-shape XLA program)."""
    import numpy as np
    from vizier._src.jax import types

    array = np.asarray(array)
    region = tuple(slice(0, n) for n in array.shape)
    padded = np.full(shape, fill, dtype=array.dtype)  # np.full + a slice: ~10x cheaper than np.pad
    padded[region] = array
    mask = np.zeros(shape, dtype=bool)
    mask[region] = True
    return types.PaddedArray(
        padded_array=padded,
        fill_value=fill,
        _original_shape=array.shape,
        _mask=mask,
        _nopadding_done=tuple(array.shape) == tuple(shape),
    )


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
