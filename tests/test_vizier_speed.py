"""Pure pieces of the GP speed-ups (optimize/gp_*.py): the LAPACK lowering of batched triangular
solves, the scipy-driven ARD optimiser and the shared trial bucket (no suggest: seconds)."""

import itertools

import numpy as np
import pytest
from branch_stub import Branch

from spica_pipeline.optimize.encoding import build_encoding
from spica_pipeline.optimize.vizier import VizierClient
from spica_pipeline.space.shapes import RoleShape as R

ENC = build_encoding(Branch("agg", (R(tp=1), R(tp=2)), (("vllm",), ("vllm",)), {}, 2, {"x": (0.0, 1.0)}))


@pytest.fixture(scope="module")
def jax_setup():
    # the client's one-time runtime setup: x64 and the batched LAPACK triangular solve
    VizierClient(jax_cache_dir="").open_study(ENC, [("o", "max")], seed=0).problem()
    import jax

    return jax


CASES = [
    (bd, left, lower, trans, unit)
    for bd in [(), (1,), (5,), (2, 3)]
    for left, lower, trans, unit in itertools.product([True, False], repeat=4)
]


@pytest.mark.parametrize("bd,left,lower,trans,unit", CASES)
def test_batched_triangular_solve_matches_numpy(jax_setup, bd, left, lower, trans, unit):
    jax = jax_setup
    from jax.lax import linalg

    rng = np.random.default_rng(len(bd) * 16 + left * 8 + lower * 4 + trans * 2 + unit)
    m, k = 6, 3
    a = rng.normal(size=bd + (m, m)) + 4 * np.eye(m)
    b = rng.normal(size=bd + ((m, k) if left else (k, m)))
    got = np.asarray(jax.jit(lambda a_, b_: linalg.triangular_solve(
        a_, b_, left_side=left, lower=lower, transpose_a=trans, unit_diagonal=unit))(a, b))
    tri = np.tril(a) if lower else np.triu(a)
    if unit:
        tri = tri - np.eye(m) * np.diagonal(tri, axis1=-2, axis2=-1)[..., None, :] + np.eye(m)
    op = np.swapaxes(tri, -1, -2) if trans else tri
    # left: op(a) x = b; right: x op(a) = b
    want = np.linalg.solve(op, b) if left else np.swapaxes(
        np.linalg.solve(np.swapaxes(op, -1, -2), np.swapaxes(b, -1, -2)), -1, -2)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_batched_triangular_solve_lowers_to_lapack(jax_setup):
    jax = jax_setup
    from jax.lax import linalg

    a = np.eye(4)[None].repeat(3, axis=0)
    text = jax.jit(lambda a_, b_: linalg.triangular_solve(a_, b_, left_side=True, lower=True)).lower(
        a, np.ones((3, 4, 2))).as_text()
    assert "trsm" in text


def test_batched_solve_gradient_matches_unbatched(jax_setup):
    """The ARD loss is vmapped over restarts: its Cholesky gradient solves batched systems."""
    jax = jax_setup
    import jax.numpy as jnp

    rng = np.random.default_rng(3)
    x = rng.normal(size=(8, 2))

    def nll(ls):
        k = jnp.exp(-jnp.sum((x[:, None] - x[None]) ** 2, -1) / ls) + 0.1 * jnp.eye(8)
        chol = jnp.linalg.cholesky(k)
        sol = jax.scipy.linalg.solve_triangular(chol, jnp.ones(8), lower=True)
        return jnp.sum(sol ** 2) + 2 * jnp.sum(jnp.log(jnp.diagonal(chol)))

    ls = jnp.array([0.5, 1.0, 2.0])
    batched = jax.jit(jax.vmap(jax.value_and_grad(nll)))(ls)
    one = [jax.jit(jax.value_and_grad(nll))(v) for v in ls]
    np.testing.assert_allclose(np.asarray(batched[0]), [float(v) for v, _ in one], rtol=1e-12)
    np.testing.assert_allclose(np.asarray(batched[1]), [float(g) for _, g in one], rtol=1e-10)


def test_scipy_ard_optimizer_respects_bounds_and_is_deterministic(jax_setup):
    import jax.numpy as jnp
    from vizier.jax import models

    from spica_pipeline.optimize.gp_ard import scipy_ard_optimizer

    target = {"a": jnp.array([0.3, -2.0]), "b": jnp.array([5.0])}

    def loss(p):
        return jnp.sum((p["a"] - target["a"]) ** 2) + jnp.sum((p["b"] - target["b"]) ** 2), {}

    init = {"a": jnp.array([[0.0, 0.0], [1.0, 1.0], [-1.0, 0.5]]), "b": jnp.array([[0.0], [1.0], [2.0]])}
    bounds = ({"a": jnp.array([-1.0, -1.0]), "b": None}, {"a": jnp.array([1.0, 1.0]), "b": jnp.array([3.0])})
    opt = scipy_ard_optimizer(50)
    best, metrics = opt(init, loss, None, constraints=models.Constraint(bounds=bounds))
    again, _ = opt(init, loss, None, constraints=models.Constraint(bounds=bounds))
    np.testing.assert_allclose(np.asarray(best["a"]), [0.3, -1.0], atol=1e-6)  # -2 clipped to the bound -1
    np.testing.assert_allclose(np.asarray(best["b"]), [3.0], atol=1e-6)
    assert np.asarray(metrics["loss"]).shape == (1, 3)
    for k in best:
        np.testing.assert_array_equal(np.asarray(best[k]), np.asarray(again[k]))


def test_trial_bucket_rule():
    from spica_pipeline.optimize.vizier import trial_bucket

    assert [trial_bucket(n) for n in (0, 1, 8, 32, 33, 64, 65, 108, 128, 129)] == [
        32, 32, 32, 32, 64, 64, 128, 128, 128, 256]
    assert trial_bucket(5, floor=16) == 16 and trial_bucket(17, floor=16) == 32
    # 8-100 trials with a batch of 8 meet three buckets
    assert {trial_bucket(n + 8) for n in range(8, 101)} == {32, 64, 128}


def test_one_padded_row_count_per_suggest(jax_setup):
    """History, history + pending and the batch pad to the same rows, so a suggest compiles one
    bucket's programs, not a (history, history + pending) pair."""
    import numpy as np

    from spica_pipeline.optimize.gp_designer import floor_padding
    from spica_pipeline.optimize.vizier import trial_bucket

    pad = floor_padding(trial_bucket(60 + 8))
    for n in (1, 30, 60, 67):
        assert pad.pad_features(np.ones((n, 3))).padded_array.shape == (128, 3)
    assert pad.pad_labels(np.ones((0, 1))).padded_array.shape == (0, 1)


def test_persistent_cache_dir_resolution():
    from spica_pipeline.optimize.vizier import resolve_cache_dir

    default = VizierClient.model_fields["jax_cache_dir"].default
    home = resolve_cache_dir(default, {})
    assert home.endswith("/.cache/spica-pipeline/jax") and not home.startswith("~")
    assert resolve_cache_dir(default, {"XDG_CACHE_HOME": "/x/cache"}) == "/x/cache/spica-pipeline/jax"
    assert resolve_cache_dir("/tmp/c", {"XDG_CACHE_HOME": "/x/cache"}) == "/tmp/c"
    assert resolve_cache_dir("", {"XDG_CACHE_HOME": "/x/cache"}) == ""
    for off in ("off", "0", "", "none"):
        assert resolve_cache_dir(default, {"SPICA_JAX_CACHE_DIR": off}) == ""
    assert resolve_cache_dir("", {"SPICA_JAX_CACHE_DIR": "/y"}) == "/y"
