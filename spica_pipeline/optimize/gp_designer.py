"""Vizier's GP designers built to compile each program once per process and shape bucket.

Stock Vizier re-traced and re-compiled its acquisition optimiser for every suggestion (the Eagle
strategy's random sampler and projection are fresh objects hashed by identity in the jitted
program's static part), dispatched ~450 small programs per ARD fit, and compiled a small program
per distinct trial count for padding and pending-trial joins. `gp_designer` builds GP-UCB-PE
(`StableUCBPE`) and the GP bandit with:
  * every trial-axis array of a suggest padded to ONE row count, the bucket optimize/cost.py
    prices (`FloorPadding`, in numpy), so the GP programs keep their shapes across rounds;
  * a random sampler and projection that compare by shape bucket, one instance per bucket
    (`stable_random_sampler`, `stable_projection`);
  * the ARD fit of optimize/gp_ard.py (scipy L-BFGS-B over one compiled value and gradient, the
    multi-task loss masking padded rows);
  * GP-UCB-PE's UCB and PE scores as one class (optimize/gp_acquisition.py) and its posterior
    with a shared n x n factor for two objectives (optimize/gp_posterior.py);
  * pending-trial joins, trust-region features and warped labels in numpy.
The designer itself is still built fresh for every suggest and fed the whole history, so the
suggestions stay a function of (seed, history) and resume is exact.

Imports jax and the private names (optimize/vizier_private.py): import it after the runtime setup.
"""

import copy
import threading
from typing import Any

import attrs
import jax
import numpy as np
from vizier import pyvizier as vz
from vizier.pyvizier import converters
from vizier.pyvizier.converters import padding

from spica_pipeline.optimize import vizier_private as vp
from spica_pipeline.optimize.gp_acquisition import SharedUCBPEScore
from spica_pipeline.optimize.gp_ard import scipy_ard_optimizer
from spica_pipeline.optimize.gp_posterior import precompute_predictive

_lock = threading.Lock()
_samplers: dict[tuple, "StableRandomSampler"] = {}


# ----- padding ---------------------------------------------------------------------------------
def numpy_padded(array, shape: tuple, fill):
    """`PaddedArray.from_array` computed in numpy (no per-shape XLA program)."""
    array = np.asarray(array)
    region = tuple(slice(0, n) for n in array.shape)
    padded = np.full(shape, fill, dtype=array.dtype)  # np.full + a slice: ~10x cheaper than np.pad
    padded[region] = array
    mask = np.zeros(shape, dtype=bool)
    mask[region] = True
    return vp.PaddedArray(
        padded_array=padded,
        fill_value=fill,
        _original_shape=array.shape,
        _mask=mask,
        _nopadding_done=tuple(array.shape) == tuple(shape),
    )


def unpad(x) -> np.ndarray:
    """A PaddedArray's original region, in numpy."""
    return np.asarray(x.padded_array)[tuple(slice(0, int(d)) for d in np.asarray(x._original_shape))]


@attrs.define(frozen=True, kw_only=True, hash=True, eq=True)
class FloorPadding(padding.PaddingSchedule):
    """Vizier's padding schedule with the trial axis padded to at least `min_trials` rows, in
    numpy: jnp.pad would compile a small XLA program for every distinct trial count. Padded rows
    are masked out by Vizier's GP (PaddedArray), so results do not change."""

    _min_trials: int = 32

    def _pad_trailing_dims(self, array, padding_types):
        array = np.asarray(array)
        k = len(padding_types)
        shape = list(array.shape[:-k] + vp.padded_dimensions(array.shape[-k:], padding_types))
        n_axis = len(array.shape) - k  # the trial axis
        if 0 < shape[n_axis] < self._min_trials:
            shape[n_axis] = self._min_trials
        fill = self._int_default if np.issubdtype(array.dtype, np.integer) else np.nan
        return numpy_padded(array, tuple(shape), fill)


def floor_padding(min_trials: int) -> FloorPadding:
    """Trial axis padded to max(min_trials, next power of two); an empty axis stays empty."""
    # num_trials is a field of the untyped vizier base class: mypy's attrs plugin cannot see it
    return FloorPadding(  # type: ignore[call-arg]
        num_trials=padding.PaddingType.POWERS_OF_2, min_trials=min_trials)


# ----- the acquisition optimiser's parts, one per shape bucket ----------------------------------
def _feature_bucket(converter) -> tuple:
    dims = vp.compute_feature_dimensions_from_converter(converter)
    return (dims.max_categorical_size, tuple(int(c) for c in dims.categorical_sizes),
            int(dims.n_feature_dimensions_with_padding.continuous),
            int(dims.n_feature_dimensions_with_padding.categorical))


class StableRandomSampler(vp.DefaultRandomSampler):
    """DefaultRandomSampler that compares equal for equal feature shapes."""

    def __init__(self, converter, bucket: tuple):
        super().__init__(converter)
        self.bucket = bucket

    def __eq__(self, other):
        return type(other) is type(self) and other.bucket == self.bucket

    def __hash__(self):
        return hash(("StableRandomSampler", self.bucket))


class StableProjection(vp.DefaultProjection):
    """DefaultProjection (a clip to [0, 1]); all instances are interchangeable."""

    def __eq__(self, other):
        return type(other) is type(self)

    def __hash__(self):
        return hash("StableProjection")


_projection: list[StableProjection] = []


def stable_random_sampler(converter) -> StableRandomSampler:
    bucket = _feature_bucket(converter)
    with _lock:
        if bucket not in _samplers:
            _samplers[bucket] = StableRandomSampler(converter, bucket)
        return _samplers[bucket]


def stable_projection(converter) -> StableProjection:
    with _lock:
        if not _projection:
            _projection.append(StableProjection(converter))
        return _projection[0]


# ----- GP-UCB-PE --------------------------------------------------------------------------------
class StableUCBPE(vp.VizierGPUCBPEBandit):
    """GP-UCB-PE with padded multi-objective data, the shared UCB/PE score class, the shared-factor
    posterior, and its array joins in numpy (Vizier joins the unpadded arrays with jnp ops,
    compiling a small program per distinct (trials, pending) count)."""

    def __attrs_post_init__(self):
        # The stock check refuses any trial padding with several metrics (its probe is a one-row
        # label array). Padded rows are masked (labels filled with -inf for the hypervolume
        # scalarisation), so run the checks unpadded and pad afterwards.
        # an attrs field of the untyped vizier base class: mypy cannot see its type
        schedule = self._padding_schedule  # type: ignore[has-type]
        self._padding_schedule = padding.PaddingSchedule()
        super().__attrs_post_init__()
        self._padding_schedule = schedule
        self._converter = converters.TrialToModelInputConverter.from_problem(
            self._problem, scale=True, max_discrete_indices=0,
            flip_sign_for_minimization_metrics=True, padding_schedule=schedule)

    def _get_predictive_all_features(self, pending_features, data, model, noise_is_high):
        pad = self._padding_schedule
        all_features = vp.ModelInput(
            continuous=pad.pad_features(np.concatenate(
                [unpad(data.features.continuous), unpad(pending_features.continuous)], axis=0)),
            categorical=pad.pad_features(np.concatenate(
                [unpad(data.features.categorical), unpad(pending_features.categorical)], axis=0)),
        )
        labels = unpad(data.labels)
        dummy = np.zeros((unpad(pending_features.continuous).shape[0], labels.shape[-1]), labels.dtype)
        all_labels = pad.pad_labels(np.concatenate([labels, dummy], axis=0))
        all_data = vp.ModelData(features=all_features, labels=all_labels)
        if noise_is_high:
            pe_params = dict(copy.deepcopy(model.params))
            pe_params["observation_noise_variance"] = np.array([1e-10])
            pe_model = vp.StochasticProcessWithCoroutine(model.coroutine, pe_params)
        else:
            pe_model = model
        return vp.UniformEnsemblePredictive(predictives=precompute_predictive(pe_model, all_data))

    def _suggest_one(self, active_trials, data, model, predictive, tr, acquisition_problem):
        cfg = self._config

        def ucb_score(predictive, predictive_all_features, ucb_coefficient, trust_region,
                      scalarization_weights_rng, labels, num_scalarizations=1000):
            return SharedUCBPEScore(
                predictive, predictive_all_features, use_ucb=True, ucb_coefficient=ucb_coefficient,
                explore_ucb_coefficient=cfg.explore_region_ucb_coefficient,
                penalty_coefficient=cfg.cb_violation_penalty_coefficient, trust_region=trust_region,
                multimetric_promising_region_penalty_type=cfg.multimetric_promising_region_penalty_type,
                labels=labels, scalarization_weights_rng=scalarization_weights_rng,
                num_scalarizations=num_scalarizations)

        def pe_score(predictive, predictive_all_features, ucb_coefficient, explore_ucb_coefficient,
                     penalty_coefficient, trust_region, multimetric_promising_region_penalty_type):
            return SharedUCBPEScore(
                predictive, predictive_all_features, use_ucb=False, ucb_coefficient=ucb_coefficient,
                explore_ucb_coefficient=explore_ucb_coefficient, penalty_coefficient=penalty_coefficient,
                trust_region=trust_region,
                multimetric_promising_region_penalty_type=multimetric_promising_region_penalty_type,
                labels=data.labels)

        with vp.gp_ucb_pe_scores(ucb_score, pe_score):
            return super()._suggest_one(active_trials, data, model, predictive, tr, acquisition_problem)

    def _trials_to_data(self, trials):
        # the stock body (vizier 0.1.24), unpadding and re-padding the warped labels in numpy:
        # jnp.pad / lax.slice on the unpadded shapes compiled small programs at every trial count
        data = self._converter.to_xy(trials)
        unpadded_labels = unpad(data.labels)
        warped_labels = []
        self._output_warpers = []
        for i in range(data.labels.shape[1]):
            output_warper = vp.create_default_warper()
            warped_labels.append(output_warper.warp(unpadded_labels[:, i: i + 1]))
            self._output_warpers.append(output_warper)
        labels = numpy_padded(np.concatenate(warped_labels, axis=-1), tuple(data.labels.padded_array.shape),
                              data.labels.fill_value)
        return vp.ModelData(features=data.features, labels=labels)

    def suggest(self, count=None):
        # the stock body (vizier 0.1.24 VizierGPUCBPEBandit.suggest, one point at a time: the
        # set-acquisition option stays off) with the trust region's features joined in numpy
        # (jnp.concatenate compiled a program per trial count)
        count = count or 1
        num_total = len(self._all_completed_trials) + len(self._all_active_trials)
        if num_total < self._num_seed_trials:
            return self._generate_seed_trials(count)
        self._rng, rng = jax.random.split(self._rng, 2)  # type: ignore[has-type]
        data = self._trials_to_data(self._all_completed_trials)
        model = self._build_gp_model_and_optimize_parameters(data, rng)
        predictive = vp.UniformEnsemblePredictive(predictives=precompute_predictive(model, data))
        active_features = self._converter.to_features(self._all_active_trials)
        pad = self._padding_schedule
        tr_features = vp.ModelInput(
            continuous=pad.pad_features(np.concatenate(
                [unpad(data.features.continuous), unpad(active_features.continuous)], axis=0)),
            categorical=pad.pad_features(np.concatenate(
                [unpad(data.features.categorical), unpad(active_features.categorical)], axis=0)),
        )
        tr = vp.TrustRegion(trusted=tr_features)
        acquisition_problem = copy.deepcopy(self._problem)
        acquisition_problem.metric_information = [
            vz.MetricInformation(name="acquisition", goal=vz.ObjectiveMetricGoal.MAXIMIZE)]
        active_trials = list(self._all_active_trials)
        suggestions = []
        for _ in range(count):
            suggestions.append(
                self._suggest_one(active_trials, data, model, predictive, tr, acquisition_problem))
            active_trials.append(suggestions[-1].to_trial())
        return suggestions


# ----- the designer of one suggest --------------------------------------------------------------
def gp_designer(algorithm: str, problem, rng, *, padded_rows: int, acquisition_evaluations: int,
                ard_max_iterations: int, ard_random_restarts: int) -> Any:
    """GP-UCB-PE (`algorithm` "DEFAULT") or the GP bandit ("GAUSSIAN_PROCESS_BANDIT") for one
    suggest: every trial-axis array (history, history + pending + the batch so far, trust region,
    Eagle prior) padded to `padded_rows`, the Eagle acquisition optimiser limited to
    `acquisition_evaluations` (Vizier's default is 75,000), the ARD fit to `ard_max_iterations`
    L-BFGS-B iterations per start over 1 + `ard_random_restarts` starts."""
    ucb_pe = algorithm == "DEFAULT"
    eagle = vp.VizierGPUCBPEBandit.default_eagle_config if ucb_pe else vp.EagleStrategyConfig()
    kw: dict[str, Any] = {
        "rng": rng,
        "ard_random_restarts": ard_random_restarts,
        "ard_optimizer": scipy_ard_optimizer(ard_max_iterations),
        "padding_schedule": floor_padding(padded_rows),
        "acquisition_optimizer_factory": vp.VectorizedOptimizerFactory(
            strategy_factory=vp.VectorizedEagleStrategyFactory(
                eagle_config=eagle, random_sampler_factory=stable_random_sampler,
                projection_factory=stable_projection),
            max_evaluations=acquisition_evaluations,
            suggestion_batch_size=25,
        ),
    }
    if ucb_pe:
        return StableUCBPE(problem, **kw)
    return vp.VizierGPBandit(problem, **kw)


__all__ = ["FloorPadding", "StableProjection", "StableRandomSampler", "StableUCBPE", "floor_padding",
           "gp_designer", "numpy_padded", "stable_projection", "stable_random_sampler", "unpad"]
