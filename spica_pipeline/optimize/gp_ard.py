"""The GP's ARD (hyper-parameter) fit: scipy's L-BFGS-B over a compiled value and gradient, and a
multi-task loss that masks padded rows.

Vizier's scipy wrapper dispatched ~450 small programs per fit and, for several metrics, its loss
ignored the padding mask ("TODO: Enable `is_missing` for MTGP"): padded NaN rows entered the
likelihood, so padding changed two-objective suggestions. Here the loss's value and gradient are
ONE compiled program per loss structure and shape bucket, scipy drives each random restart in turn
(restarts do not wait for each other's line searches), and the multi-task loss is
`MaskedMultiTaskLoss`, equal to the unpadded loss (tests/test_vizier_padding.py).

Imports jax and the private names (optimize/vizier_private.py): import it after the runtime setup.
"""

import math
import threading
from typing import Any

import attrs
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from scipy import optimize  # type: ignore[import-untyped]
from vizier.jax import optimizers

from spica_pipeline.optimize import vizier_private as vp
from spica_pipeline.optimize.gp_posterior import shared_row_cholesky, shared_rows

_lock = threading.Lock()
_compiled: dict[tuple, Any] = {}  # value-and-gradient programs by loss structure and shapes
_optimizers: dict[int, "ScipyLbfgsB"] = {}  # one optimiser per iteration cap


def _split_vector(x, shapes: list, sizes: list, reshape) -> list:
    """A flat parameter vector cut back into its leaves (`reshape`: np.reshape or jnp.reshape)."""
    out, i = [], 0
    for shape, size in zip(shapes, sizes):
        out.append(reshape(x[i:i + size], shape))
        i += size
    return out


def _interleave(is_arr: tuple, static: tuple) -> list:
    """Static leaves placed at their positions (None where an array goes)."""
    it = iter(static)
    return [None if a else next(it) for a in is_arr]


def _flat_value_and_grad(loss_fn, params_treedef, shapes: list, dtype):
    """(x: flat parameter vector) -> [loss, gradient...] as ONE numpy vector. The loss's arrays are
    bound once per fit and the compiled function is looked up by the loss's static structure (what
    eqx.filter_jit keys on), so each of the ~400 evaluations is one plain jax.jit dispatch of two
    arguments (eqx.filter_jit re-partitioned the loss module every call: ~0.5 ms, a third of an
    evaluation at 128 rows)."""
    leaves, treedef = jax.tree_util.tree_flatten(loss_fn)
    is_arr = tuple(eqx.is_array(x) for x in leaves)
    arrays = [x for x, a in zip(leaves, is_arr) if a]
    static = tuple(x for x, a in zip(leaves, is_arr) if not a)
    key = (treedef, is_arr, static, params_treedef, tuple(shapes), np.dtype(dtype).str)
    with _lock:
        fn = _compiled.get(key)
    if fn is None:
        sizes = [int(np.prod(sh)) for sh in shapes]

        def value_and_grad(arrays_, x):
            it = iter(arrays_)
            loss = jax.tree_util.tree_unflatten(treedef, [next(it) if a else st for a, st in zip(
                is_arr, _interleave(is_arr, static))])
            parts = _split_vector(x, shapes, sizes, jnp.reshape)
            params = jax.tree_util.tree_unflatten(params_treedef, parts)
            value, grad = jax.value_and_grad(lambda p: loss(p)[0])(params)
            return jnp.concatenate([jnp.reshape(value, (1,))] + [
                jnp.ravel(g) for g in jax.tree_util.tree_leaves(grad)]).astype(dtype)

        with _lock:
            fn = _compiled.setdefault(key, jax.jit(value_and_grad))
    return lambda x: np.asarray(fn(arrays, x))


@attrs.define(frozen=True)
class ScipyLbfgsB(optimizers.Optimizer):
    """An ARD optimiser (Vizier's `Optimizer` interface): scipy's L-BFGS-B drives each random
    restart in turn over the compiled value and gradient. Same options as Vizier's scipy wrapper
    (`JaxoptScipyLbfgsB`: gtol 1e-8, 20 line-search steps); deterministic given the initial
    parameters; keeps the one best start (`best_n`)."""

    maxiter: int = 50
    maxls: int = 20
    tol: float = 1e-8

    @property
    def best_n(self) -> int:
        return 1

    def __call__(self, init_params, loss_fn, rng, *, constraints=None, best_n=None):
        del rng  # L-BFGS-B is deterministic given the initial parameters
        loss_fn = masked_loss(loss_fn)
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
            lb, ub = vp.ard_bounds(starts[0], constraints)
            bounds = optimize.Bounds(flat(lb), flat(ub))

        value_and_grad = _flat_value_and_grad(loss_fn, treedef, shapes, dtype)

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
        # Vizier's core.get_best_params in numpy (jnp.argsort is stable, so is this)
        best_idx = np.argsort(losses_arr, kind="stable")[:best_n or 1]
        best = jax.tree_util.tree_map(lambda p: p[best_idx], all_params)
        if best_n is None:
            best = jax.tree_util.tree_map(lambda p: np.squeeze(p, axis=0), best)
        return best, {"loss": losses_arr[np.newaxis, :]}


def scipy_ard_optimizer(maxiter: int) -> ScipyLbfgsB:
    """The process's `ScipyLbfgsB` for this iteration cap."""
    with _lock:
        return _optimizers.setdefault(int(maxiter), ScipyLbfgsB(maxiter=int(maxiter)))


def masked_loss(loss_fn):
    """Vizier's ARD loss ignores the padding mask for a multi-task (several metrics) GP: padded
    rows (NaN labels) entered the likelihood. Swap in `MaskedMultiTaskLoss` there; other losses
    pass through unchanged."""
    model = getattr(loss_fn, "__self__", None)
    if not isinstance(model, vp.CoroutineWithData) or getattr(loss_fn, "__func__", None) is not type(
            model).loss_with_aux or model.data.labels.shape[-1] < 2:
        return loss_fn
    return MaskedMultiTaskLoss(model.coroutine, model.data, shared_rows=shared_rows(model.data.labels))


class MaskedMultiTaskLoss(eqx.Module):
    """Negative log marginal likelihood of a multi-task GP over the OBSERVED (row, metric) entries
    only, plus the parameter regularisers: what the unpadded loss computes, at a padded shape.
    Padded entries get identity covariance rows and a zero residual, as TFP does for
    `observations_is_missing` in the posterior; padded features are zeroed first so no NaN reaches
    the gradient. An eqx.Module, so one compiled program per bucket."""

    coroutine: Any = eqx.field(static=True)
    data: Any
    # every row observes all metrics or none (`shared_rows`): with Vizier's INDEPENDENT kernel all
    # metrics then share ONE masked n x n covariance, so one Cholesky factor and one solve with m
    # right-hand sides replace m factors (half the 2-objective fit)
    shared_rows: bool = eqx.field(static=True, default=False)

    def __call__(self, params, seed=None):
        del seed
        f = self.data.features
        clean = vp.ModelInput(
            continuous=f.continuous.replace_fill_value(0.0),
            categorical=f.categorical.replace_fill_value(0),
        )
        dist, aux = vp.StochasticProcessWithCoroutine(self.coroutine, params).call_with_aux(clean)
        x = dist.index_points
        labels = self.data.labels
        n, m = labels.padded_array.shape
        missing = ~jnp.asarray(labels._mask)  # [n, m]  # pylint: disable=protected-access
        y = jnp.asarray(labels.padded_array)
        diff = jnp.where(missing, 0.0, jnp.where(missing, 0.0, y) - jnp.broadcast_to(dist.mean_fn(x), (n, m)))
        noise = jnp.reshape(dist.observation_noise_variance, (-1,))[0]
        if type(dist.kernel).__name__ == "Independent" and self.shared_rows:
            chol = shared_row_cholesky(dist, x, noise, missing[:, 0])
            sol = jax.scipy.linalg.solve_triangular(chol, diff, lower=True)  # [n, m]
            log_prob = (-0.5 * jnp.sum(sol**2) - m * jnp.sum(jnp.log(jnp.diagonal(chol)))
                        - 0.5 * jnp.sum(~missing) * np.log(2 * np.pi))
            return -log_prob + jax.tree_util.tree_reduce(jnp.add, aux["losses"]), aux
        if type(dist.kernel).__name__ == "Independent":
            # Vizier's default (INDEPENDENT): one n x n covariance shared by the metrics, masked
            # per metric; m Cholesky factors of n x n instead of one of nm x nm
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


__all__ = ["MaskedMultiTaskLoss", "ScipyLbfgsB", "masked_loss", "scipy_ard_optimizer"]
