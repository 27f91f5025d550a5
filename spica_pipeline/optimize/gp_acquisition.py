"""GP-UCB-PE's acquisition scores as ONE class, so the Eagle acquisition optimiser compiles once.

Vizier scores the first point of a batch with `UCBScoreFunction` and the rest with
`PEScoreFunction`: two classes, so a process traced, lowered and compiled the whole acquisition
optimiser twice (and the `aux` program twice). `SharedUCBPEScore` is both, picked by a traced
boolean (`use_ucb`, a `lax.cond`): both scores use the same three GP quantities (the history
predictive's mean, its stddev, the history + pending predictive's stddev) and differ only in the
final formula; the cond runs one branch per optimiser step (the UCB steps do not compute the
history stddev, as in Vizier). The bodies are the stock ones (vizier 0.1.24
UCBScoreFunction / PEScoreFunction.score_with_aux) with two things computed once per optimisation
instead of in each of its ~160 steps: PE's UCB threshold (a GP prediction at every observed and
pending trial, O(n^3) in the padded trial count) and, with several metrics, UCB's hypervolume
bound over the observed labels (1000 scalarisations x n rows). The GP quantities come from
optimize/gp_posterior.py `posterior_terms` when it covers the predictives. Equal values to
Vizier's (tests/test_vizier_padding.py).
"""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from spica_pipeline.optimize import vizier_private as vp
from spica_pipeline.optimize.gp_posterior import fast_posterior_ok, posterior_terms, shares_kernel


@eqx.filter_jit
def ucb_threshold(predictive, predictive_all_features, ucb_coefficient):
    """PE's UCB threshold (a GP prediction at every observed and pending trial), jitted once."""
    features = predictive_all_features.predictives.observed_data.features
    is_missing = features.continuous.is_missing[0] | features.categorical.is_missing[0]
    return vp.compute_ucb_threshold(predictive.predict(features), is_missing, ucb_coefficient)


@eqx.filter_jit
def observed_label_max(scalarizer, labels):
    """GP-UCB-PE's UCB bound over the observed labels (vizier 0.1.24 UCBScoreFunction: the max of
    each hypervolume scalarisation over the labels, padded rows -inf), jitted once."""
    return jnp.max(scalarizer(labels.replace_fill_value(-np.inf).padded_array), axis=-1)


def pe_acquisition(score, mean, stddev, stddev_from_all):
    """GP-UCB-PE's pure-exploration value (vizier 0.1.24 PEScoreFunction.score_with_aux's formula,
    before the trust region) from a score's coefficients, its precomputed UCB threshold and the
    three GP quantities."""
    explore_ucb = mean + stddev * score.explore_ucb_coefficient
    penalty = score.penalty_coefficient * jnp.minimum(explore_ucb - score.threshold, 0.0)
    if stddev_from_all.ndim <= 1:
        return stddev_from_all + penalty
    kind = score.multimetric_promising_region_penalty_type
    kinds = vp.MultimetricPromisingRegionPenaltyType
    if kind == kinds.UNION:
        scalarized_penalty = jnp.max(penalty, axis=-1)
    elif kind == kinds.INTERSECTION:
        scalarized_penalty = jnp.min(penalty, axis=-1)
    elif kind == kinds.AVERAGE:
        scalarized_penalty = jnp.mean(penalty, axis=-1)
    else:
        raise ValueError(f"Unsupported multimetric promising region penalty type: {kind}")
    return jnp.mean(stddev_from_all, axis=-1) + scalarized_penalty


class SharedUCBPEScore(eqx.Module):
    """GP-UCB-PE's UCB score (`use_ucb` true) or pure-exploration score (false) in one class."""

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
    fast: bool = eqx.field(static=True)  # `posterior_terms` instead of TFP's distributions
    share_kernel: bool = eqx.field(static=True)  # one kernel evaluation for both predictives

    def __init__(self, predictive, predictive_all_features, *, use_ucb: bool, ucb_coefficient,
                 explore_ucb_coefficient, penalty_coefficient, trust_region,
                 multimetric_promising_region_penalty_type, labels, scalarization_weights_rng=None,
                 num_scalarizations: int = 1000):
        self.predictive = predictive
        self.predictive_all_features = predictive_all_features
        self.use_ucb = np.asarray(bool(use_ucb))
        self.ucb_coefficient = ucb_coefficient
        self.explore_ucb_coefficient = explore_ucb_coefficient
        self.penalty_coefficient = penalty_coefficient
        self.trust_region = trust_region
        self.multimetric_promising_region_penalty_type = multimetric_promising_region_penalty_type
        self.labels = labels
        self.threshold = ucb_threshold(predictive, predictive_all_features, ucb_coefficient)
        dtype = np.asarray(labels.padded_array).dtype
        m = labels.shape[1]
        if scalarization_weights_rng is not None:  # UCB: Vizier's random hypervolume weights
            self.scalarizer = vp.create_hv_scalarization(
                num_scalarizations, labels, scalarization_weights_rng)
        else:  # PE never reads them: same shapes and dtypes, no random draw, no eager op
            reference = np.zeros((m,), dtype) if labels.shape[0] > 0 else None
            self.scalarizer = vp.HyperVolumeScalarization(np.ones((num_scalarizations, m), dtype), reference)
        if scalarization_weights_rng is not None and m > 1 and labels.shape[0] > 0:
            self.label_max = observed_label_max(self.scalarizer, labels)
        else:  # unused (PE, one metric or no rows): same shape, so one program
            self.label_max = np.zeros((num_scalarizations,), dtype)
        self.fast = fast_posterior_ok(predictive) and fast_posterior_ok(predictive_all_features)
        self.share_kernel = self.fast and shares_kernel(predictive, predictive_all_features)

    def score(self, xs, seed=None):
        return self._scores(xs, with_aux=False)[0]

    def aux(self, xs, seed=None):
        return self._scores(xs, with_aux=True)[1]

    def score_with_aux(self, xs, seed=None):
        return self._scores(xs, with_aux=True)

    def _gp(self, xs):
        """(history mean, a function giving the history stddev, history + pending stddev)."""
        if self.fast:
            return posterior_terms(self.predictive, self.predictive_all_features, xs, self.share_kernel)
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
            return pe_acquisition(self, mean, stddev_fn(), stddev_from_all)

        acq_values = jax.lax.cond(self.use_ucb, ucb, pe)
        if self.trust_region is not None:
            acq_values = vp.apply_trust_region(self.trust_region, xs, acq_values)
        if not with_aux:
            return acq_values, None
        return acq_values, {"mean": mean, "stddev": stddev_fn(), "stddev_from_all": stddev_from_all}


__all__ = ["SharedUCBPEScore", "observed_label_max", "pe_acquisition", "ucb_threshold"]
