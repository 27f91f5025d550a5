"""Padding must not change what the GP sees: the multi-task ARD loss and the acquisition scores,
padded vs unpadded and ours vs Vizier's, on the same trials (pure functions, no suggest: seconds,
not minutes)."""

import pytest
from branch_stub import Branch

from spica_pipeline.optimize.encoding import build_encoding
from spica_pipeline.optimize.vizier import VizierClient
from spica_pipeline.space.shapes import RoleShape as R

POOL = (R(tp=1, replicas=4), R(tp=2, replicas=2), R(tp=2, attention_dp=2), R(tp=4), R(tp=1, replicas=2))
BRANCH = Branch(
    "agg", POOL, tuple(("vllm",) for _ in POOL),
    {"backend": ["vllm"], "router_mode": ["kv_router", "round_robin"], "agg_max_num_seqs": [64, 128, 256]},
    4, {"kv_load_ratio": (0.2, 0.8)},
)
ENC = build_encoding(BRANCH)
PARETO = [("throughput", "max"), ("latency", "min")]


def _history(n):
    import random

    rng = random.Random(7)
    rows = []
    for _ in range(n):
        p = {q.name: rng.uniform(*q.bounds) if q.kind == "double" else rng.choice(q.values) for q in ENC.params}
        sel, _ = ENC.decode(p)
        score = sel["agg_max_num_seqs"] / 64 + (sel["router_mode"] == "kv_router") + sel["kv_load_ratio"]
        rows.append((p, {"throughput": score, "latency": 10 - score ** 0.5 + sel["kv_load_ratio"]}, None))
    return rows


def _model(pad: bool, metrics, n=11):
    """(designer, data, model with the data, initial parameters): our padded GP-UCB-PE, or with
    `pad` false Vizier's own designer on the unpadded trials."""
    import jax
    from vizier import pyvizier as vz

    from spica_pipeline.optimize import vizier_private as vp

    study = VizierClient(algorithm="DEFAULT", jax_cache_dir="").open_study(ENC, metrics, seed=0)
    if pad:
        designer = study._gp_designer("DEFAULT", study.problem(), jax.random.PRNGKey(0), rows=n)
    else:
        designer = vp.VizierGPUCBPEBandit(study.problem(), rng=jax.random.PRNGKey(0))
    trials, _ = study._to_trials(_history(n), study.problem().search_space, vz)
    data = designer._trials_to_data(trials)
    coroutine = designer._gp_model_class.build_model(data, multitask_type=designer._config.multitask_type).coroutine
    model = vp.CoroutineWithData(coroutine, data)
    params = model.setup(jax.random.PRNGKey(3))
    return designer, data, model, params


def _stock_and_shared_scores(designer, data, predictive, predictive_all, trust_region):
    """GP-UCB-PE's score keywords as its designer sets them, then (Vizier's UCB, PE) and ours (UCB,
    PE: the one shared class with use_ucb on and off), all on the same posteriors and weights."""
    import jax

    from spica_pipeline.optimize import vizier_private as vp
    from spica_pipeline.optimize.gp_acquisition import SharedUCBPEScore

    cfg = designer._config
    pe_kw = dict(ucb_coefficient=cfg.ucb_coefficient, explore_ucb_coefficient=cfg.explore_region_ucb_coefficient,
                 penalty_coefficient=cfg.cb_violation_penalty_coefficient, trust_region=trust_region,
                 multimetric_promising_region_penalty_type=cfg.multimetric_promising_region_penalty_type)
    rng = jax.random.PRNGKey(5)
    stock = (vp.UCBScoreFunction(predictive, predictive_all, ucb_coefficient=cfg.ucb_coefficient,
                                 trust_region=trust_region, scalarization_weights_rng=rng, labels=data.labels),
             vp.PEScoreFunction(predictive, predictive_all, **pe_kw))
    ours = (SharedUCBPEScore(predictive, predictive_all, use_ucb=True, labels=data.labels,
                             scalarization_weights_rng=rng, **pe_kw),
            SharedUCBPEScore(predictive, predictive_all, use_ucb=False, labels=data.labels, **pe_kw))
    return pe_kw, stock, ours


def test_multi_task_ard_loss_ignores_padded_rows():
    """Vizier's own multi-task loss does not mask padding; ours must equal the unpadded loss."""
    import jax
    import numpy as np

    from spica_pipeline.optimize.gp_ard import masked_loss

    _, data0, m0, params = _model(False, PARETO)
    _, data1, m1, _ = _model(True, PARETO)
    assert data1.labels.padded_array.shape[0] == 32 > data0.labels.padded_array.shape[0] == 11
    stock = float(m0.loss_with_aux(params)[0])
    masked = masked_loss(m1.loss_with_aux)
    assert type(masked).__name__ == "MaskedMultiTaskLoss"
    assert float(masked(params)[0]) == pytest.approx(stock, rel=1e-10)
    g0 = jax.grad(lambda p: m0.loss_with_aux(p)[0])(params)
    g1 = jax.grad(lambda p: masked(p)[0])(params)
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
        assert np.all(np.isfinite(np.asarray(b)))
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-8, atol=1e-10)


def test_single_metric_loss_passes_through():
    from spica_pipeline.optimize.gp_ard import masked_loss

    _, _, model, _ = _model(True, [("throughput", "max")])
    fn = model.loss_with_aux
    assert masked_loss(fn) is fn


@pytest.mark.parametrize("metrics", [PARETO, [("throughput", "max")]])
def test_shared_ucb_pe_score_matches_vizier(metrics):
    """One score class for UCB and PE (a traced use_ucb flag): each flag value gives the stock
    class's score, and both flag values have one pytree structure (one compiled program). Vizier's
    own two-metric precomputation (a dense factor) is not one `posterior_terms` covers: those
    scores go through TFP's distributions, with the same values."""
    import jax
    import numpy as np

    from spica_pipeline.optimize import vizier_private as vp

    designer, data, model, params = _model(True, metrics)
    predictive = vp.UniformEnsemblePredictive(
        vp.StochasticProcessWithCoroutine(model.coroutine, params).precompute_predictive(data))
    _, (stock_ucb, stock_pe), (ucb, pe) = _stock_and_shared_scores(designer, data, predictive, predictive, None)
    assert ucb.fast == pe.fast == (len(metrics) == 1)
    xs = designer._converter.to_features(designer._quasi_random_sampler.suggest(5))
    for ours, stock in ((ucb, stock_ucb), (pe, stock_pe)):
        np.testing.assert_allclose(np.asarray(ours.score(xs)), np.asarray(stock.score(xs)), rtol=1e-10, atol=1e-12)
        for k, v in stock.aux(xs).items():
            np.testing.assert_allclose(np.asarray(ours.aux(xs)[k]), np.asarray(v), rtol=1e-10, atol=1e-12)
    assert jax.tree.structure(ucb) == jax.tree.structure(pe)
    assert [np.shape(x) for x in jax.tree.leaves(ucb)] == [np.shape(x) for x in jax.tree.leaves(pe)]


def test_shared_row_loss_equals_per_metric_loss():
    """Rows with all metrics or none: one n x n Cholesky for every metric, same loss and gradient."""
    import jax
    import numpy as np

    from spica_pipeline.optimize.gp_ard import masked_loss

    _, _, model, params = _model(True, PARETO)
    shared = masked_loss(model.loss_with_aux)
    assert shared.shared_rows
    per_metric = type(shared)(shared.coroutine, shared.data, shared_rows=False)
    assert float(shared(params)[0]) == pytest.approx(float(per_metric(params)[0]), rel=1e-10)
    g0 = jax.grad(lambda p: per_metric(p)[0])(params)
    g1 = jax.grad(lambda p: shared(p)[0])(params)
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-8, atol=1e-10)


def test_independent_precompute_predicts_like_vizier():
    """Two metrics: the Kronecker (one n x n factor) precomputation gives Vizier's dense
    (2n x 2n) posterior mean and stddev, padded rows included."""
    import jax
    import numpy as np

    from spica_pipeline.optimize import vizier_private as vp
    from spica_pipeline.optimize.gp_posterior import precompute_predictive

    designer, data, model, params = _model(True, PARETO)
    assert data.labels.padded_array.shape[0] == 32
    gp = vp.StochasticProcessWithCoroutine(model.coroutine, jax.tree.map(lambda a: a[None], params))
    stock = vp.UniformEnsemblePredictive(gp.precompute_predictive(data))
    ours = vp.UniformEnsemblePredictive(precompute_predictive(gp, data))
    assert "independent" in ours.predictives.precomputed_divisor_matrix_cholesky
    xs = designer._converter.to_features(designer._quasi_random_sampler.suggest(7))
    a, b = stock.predict(xs), ours.predict(xs)
    np.testing.assert_allclose(np.asarray(b.mean()), np.asarray(a.mean()), rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(np.asarray(b.stddev()), np.asarray(a.stddev()), rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("noise_is_high", [False, True])
@pytest.mark.parametrize("metrics", [PARETO, [("throughput", "max")]])
def test_fast_posterior_score_matches_vizier(metrics, noise_is_high):
    """The acquisition step's GP quantities computed directly (`_posterior_terms`: one kernel
    evaluation shared by the history and history + pending posteriors) give the stock UCB and PE
    scores and aux, as GP-UCB-PE builds them in a suggest: a one-member ensemble, padded rows,
    pending trials, the trust region, and a high-noise study's noiseless pending posterior."""
    import jax
    import numpy as np
    from vizier import pyvizier as vz

    from spica_pipeline.optimize import vizier_private as vp
    from spica_pipeline.optimize.gp_posterior import precompute_predictive

    designer, data, model, params = _model(True, metrics)
    gp = vp.StochasticProcessWithCoroutine(model.coroutine, jax.tree.map(lambda a: np.asarray(a)[None], params))
    predictive = vp.UniformEnsemblePredictive(precompute_predictive(gp, data))
    pending = [vz.Trial(id=100 + i, parameters=s.parameters)
               for i, s in enumerate(designer._quasi_random_sampler.suggest(3))]
    predictive_all = designer._get_predictive_all_features(
        designer._converter.to_features(pending), data, gp, noise_is_high)
    assert predictive_all.predictives.observed_data.labels.padded_array.shape[0] == 32
    tr = vp.TrustRegion(trusted=predictive_all.predictives.observed_data.features)
    _, (stock_ucb, stock_pe), (ucb, pe) = _stock_and_shared_scores(designer, data, predictive, predictive_all, tr)
    assert ucb.fast and ucb.share_kernel and pe.fast and pe.share_kernel
    xs = designer._converter.to_features(designer._quasi_random_sampler.suggest(9))
    for ours, stock in ((ucb, stock_ucb), (pe, stock_pe)):
        np.testing.assert_allclose(np.asarray(ours.score(xs)), np.asarray(stock.score(xs)), rtol=1e-10, atol=1e-12)
        for k, v in stock.aux(xs).items():
            assert np.shape(ours.aux(xs)[k]) == np.shape(v)
            np.testing.assert_allclose(np.asarray(ours.aux(xs)[k]), np.asarray(v), rtol=1e-10, atol=1e-12)
    assert jax.tree.structure(ucb) == jax.tree.structure(pe)
    assert [np.shape(x) for x in jax.tree.leaves(ucb)] == [np.shape(x) for x in jax.tree.leaves(pe)]


def test_shares_kernel_needs_equal_kernel_parameters():
    """One kernel evaluation for both posteriors only when their kernels agree on every history row."""
    import jax
    import numpy as np

    from spica_pipeline.optimize import vizier_private as vp
    from spica_pipeline.optimize.gp_posterior import precompute_predictive, shares_kernel

    _, data, model, params = _model(True, PARETO)
    batched = jax.tree.map(lambda a: np.asarray(a)[None], params)
    gp = vp.StochasticProcessWithCoroutine(model.coroutine, batched)
    predictive = vp.UniformEnsemblePredictive(precompute_predictive(gp, data))
    assert shares_kernel(predictive, predictive)
    noisier = dict(batched, observation_noise_variance=np.asarray(batched["observation_noise_variance"]) * 2)
    other = vp.UniformEnsemblePredictive(precompute_predictive(
        vp.StochasticProcessWithCoroutine(model.coroutine, noisier), data))
    assert shares_kernel(predictive, other)  # the noise is not part of the kernel
    key = next(k for k in batched if k != "observation_noise_variance")
    changed = dict(batched, **{key: np.asarray(batched[key]) * 1.5})
    other = vp.UniformEnsemblePredictive(precompute_predictive(
        vp.StochasticProcessWithCoroutine(model.coroutine, changed), data))
    assert not shares_kernel(predictive, other)
