"""The GP posterior of the compile-once GP-UCB-PE: its precomputation and the acquisition step's
mean and stddevs computed directly.

Two objectives whose rows hold every metric or none (`shared_rows`, the ledger's usual case: a
trial completes with every metric finite, padded rows have none) share ONE n x n Cholesky factor
under Vizier's INDEPENDENT multi-task kernel (`shared_row_cholesky`), in the ARD loss
(optimize/gp_ard.py) and in the posterior (`precompute_predictive`), instead of TFP's dense
(n m) x (n m) factor.

Per acquisition-optimiser step, `posterior_terms` gives GP-UCB-PE's three GP quantities (the
history predictive's mean and stddev, the history + pending predictive's stddev) with one kernel
evaluation between the candidates and the observed rows, where TFP's posterior distributions
evaluated it three times and, with two objectives, went through the flattened (25 m) x (n m) task
kernel with m x 2 right-hand sides per candidate. Same values (tests/test_vizier_padding.py).
"""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from tensorflow_probability.substrates.jax.experimental import psd_kernels as tfpke  # type: ignore[import-untyped]

from spica_pipeline.optimize import vizier_private as vp


def shared_rows(labels) -> bool:
    """True when every row has all metrics or none (concrete mask): the ledger only completes a
    trial with every metric finite, and padded rows have none, so this is the usual case."""
    mask = np.asarray(labels._mask)  # pylint: disable=protected-access
    return bool(mask.ndim == 2 and mask.size and (mask == mask[:, :1]).all())


def row_missing(labels):
    """Observed-row mask of a label PaddedArray as numpy: a row is missing when it has no metric."""
    mask = np.asarray(labels._mask)  # pylint: disable=protected-access
    return ~mask.reshape(mask.shape[0], -1).any(axis=1)


def shared_row_cholesky(dist, x, noise, missing_rows):
    """The one n x n factor that metrics with shared rows (`shared_rows`) share under Vizier's
    INDEPENDENT kernel: K_nn + noise, masked as TFP's mask_matrix does (a missing row / column
    becomes the identity's). Used by the ARD loss and by the posterior, so both factor the same."""
    cov = dist.kernel.base_kernel.matrix(x, x)
    eye = jnp.eye(cov.shape[-1], dtype=cov.dtype)
    if noise is not None:
        cov = cov + jnp.asarray(noise)[..., None, None] * eye
    cov = jnp.where(missing_rows[:, None] | missing_rows[None, :], eye, cov)
    return (dist.cholesky_fn if dist.cholesky_fn is not None else jnp.linalg.cholesky)(cov)


def _independent_precompute(model, data):
    prior = model(data.features)
    if type(prior.kernel).__name__ != "Independent":  # e.g. a separable multi-task kernel
        return model.precompute_predictive(data)
    x = prior.index_points
    missing = ~jnp.asarray(data.labels._mask)  # [n, m]; rows all-or-nothing  # pylint: disable=protected-access
    chol = shared_row_cholesky(prior, x, prior.observation_noise_variance, missing[:, 0])
    diff = jnp.where(missing, 0.0, jnp.asarray(data.labels.padded_array) - prior.mean_fn(x))
    diff = jnp.broadcast_to(diff, chol.shape[:-2] + diff.shape[-2:])
    half = jax.scipy.linalg.solve_triangular(chol, diff, lower=True)
    solve = jax.scipy.linalg.solve_triangular(chol, half, lower=True, trans=1)
    solve = jnp.reshape(solve, solve.shape[:-2] + (-1,))  # TFP's vec: row-major, task fastest
    return vp.PrecomputedPredictive(model, data, {"independent": {"chol_tril": chol}}, solve)


_independent_precompute_jit = eqx.filter_jit(_independent_precompute)


def precompute_predictive(model, data):
    """`model.precompute_predictive(data)`, compiled once per shape bucket. Several metrics with
    shared rows (`shared_rows`) under Vizier's INDEPENDENT multi-task kernel: the posterior's
    divisor matrix is kron(masked K_nn + noise, I_m), so it is factored as ONE n x n Cholesky and
    handed to TFP as its own 'independent' (Kronecker) precomputation, instead of the dense
    (n m) x (n m) factor TFP builds whenever a mask is given. Every acquisition step then solves
    against n x n instead of 2n x 2n (two objectives). Same predictive mean and stddev
    (tests/test_vizier_padding.py)."""
    labels = data.labels
    if labels.shape[-1] < 2 or not shared_rows(labels):
        return eqx.filter_jit(model.precompute_predictive)(data)
    return _independent_precompute_jit(model, data)


def fast_posterior_ok(predictive) -> bool:
    """Whether `posterior_terms` covers this predictive (structure only, so also under tracing):
    a uniform ensemble of ONE precomputed posterior (Vizier's GP-UCB-PE default), one metric with
    TFP's dense factor, or several with `_independent_precompute`'s shared n x n factor. Else the
    scores go through TFP's posterior distributions (e.g. two objectives whose rows do not share
    their metrics)."""
    p: Any = getattr(predictive, "predictives", None)
    if type(predictive) is not vp.UniformEnsemblePredictive or type(p) is not vp.PrecomputedPredictive:
        return False
    solve_shape = np.shape(p.precomputed_solve_on_observation)
    if len(solve_shape) > 2 or (len(solve_shape) == 2 and solve_shape[0] != 1):
        return False  # an ensemble of several members: TFP's mixture
    chol = p.precomputed_divisor_matrix_cholesky
    if p.observed_data.labels.shape[-1] > 1:
        return isinstance(chol, dict) and set(chol) == {"independent"}
    return not isinstance(chol, dict)


def shares_kernel(predictive, predictive_all_features) -> bool:
    """True when both posteriors evaluate the SAME kernel between candidates and observed rows on
    every history row: one coroutine, equal parameters except the observation noise (GP-UCB-PE's
    history + pending predictive differs from the history one only in its rows, and in a high-noise
    study its noise), equal padded row count and feature masks, and each history row also a row of
    history + pending at the same index. Checked on concrete arrays; False under tracing."""
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
    h_rows = ~row_missing(h.observed_data.labels)
    a_rows = ~row_missing(a.observed_data.labels)
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


def _gp_terms(predictive):
    """What a posterior prediction needs from one `fast_posterior_ok` predictive: the kernel (the
    base kernel of Vizier's INDEPENDENT multi-task kernel), the observed index points with missing
    rows zeroed (as TFP's SchurComplement does), the missing-row mask, the Cholesky factor of the
    masked K_nn + noise, the precomputed solve as [..., n] (one metric) or [..., n, m], the
    observation noise and the prior mean function."""
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


def posterior_terms(predictive, predictive_all_features, xs, share_kernel: bool):
    """GP-UCB-PE's three GP quantities at the candidates `xs`: the history predictive's mean, a
    function giving its stddev, and the history + pending predictive's stddev, with the shapes
    and values of TFP's posterior (vizier 0.1.24 PrecomputedPredictive.predict: mean() and stddev()
    of a GaussianProcessRegressionModel, or of a MultiTaskGaussianProcessRegressionModel with the
    Kronecker factor, for the one-member ensemble). Per predictive: mean = m(x) + K_xZ alpha,
    variance = k(x, x) - |L^-1 K_Zx|^2 + noise, K_xZ with missing rows zeroed. The kernel and
    k(x, x) are evaluated once when `share_kernel` (`shares_kernel`)."""
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


__all__ = ["fast_posterior_ok", "posterior_terms", "precompute_predictive", "row_missing", "shared_row_cholesky",
           "shared_rows", "shares_kernel"]
