"""The contract of optimize/vizier_private.py: the installed google-vizier, jax and jaxlib are the
pinned versions, every private name the package uses is there with the signature and attributes
the code relies on, the stock bodies the GP code re-implements are the ones it copied, and no other
module imports a private name."""

import ast
import hashlib
import importlib.metadata
import inspect
from pathlib import Path

import pytest
from branch_stub import Branch

from spica_pipeline.optimize.encoding import build_encoding
from spica_pipeline.optimize.vizier import VizierClient
from spica_pipeline.space.shapes import RoleShape as R

ROOT = Path(__file__).resolve().parents[1]
PRIVATE = ROOT / "spica_pipeline" / "optimize" / "vizier_private.py"
ENC = build_encoding(Branch("agg", (R(tp=1), R(tp=2)), (("vllm",), ("vllm",)), {}, 2, {"x": (0.0, 1.0)}))
UPGRADE = ("optimize/vizier_private.py is checked against {want}; after an upgrade re-check every name in "
           "tests/test_vizier_private.py and the equality tests (tests/test_vizier_padding.py, "
           "tests/test_vizier_speed.py), then move PINNED")


def _pinned() -> dict[str, str]:
    """PINNED read from the source, so this check runs even when the module no longer imports."""
    for node in ast.parse(PRIVATE.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "PINNED" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("optimize/vizier_private.py has no PINNED")


@pytest.mark.parametrize("dist", sorted(_pinned()))
def test_installed_version_is_the_pinned_one(dist):
    want = _pinned()[dist]
    got = importlib.metadata.version(dist)
    assert got == want, f"{dist} {got} is installed: " + UPGRADE.format(want=want)


@pytest.fixture(scope="module")
def vp():
    VizierClient(jax_cache_dir="").open_study(ENC, [("o", "max")], seed=0).problem()  # the runtime setup
    from spica_pipeline.optimize import vizier_private

    assert vizier_private.version_mismatches() == []
    return vizier_private


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def test_every_exported_name_is_there(vp):
    missing = [n for n in vp.__all__ if getattr(vp, n, None) is None]
    assert not missing


SIGNATURES = {
    # GP-UCB-PE helpers the shared score calls
    "apply_trust_region": ["tr", "xs", "acq_values"],
    "compute_ucb_threshold": ["gprm", "is_missing", "ucb_coefficient"],
    "create_hv_scalarization": ["num_scalarizations", "labels", "rng"],
    "create_default_warper": ["half_rank_warp", "log_warp", "infeasible_warp"],
    "HyperVolumeScalarization": ["weights", "reference_point", "enforce_nonnegativity"],
    "TrustRegion": ["trusted"],
    # what gp_designer's ucb_score / pe_score stand in for: _suggest_one calls them with these
    "UCBScoreFunction": ["predictive", "predictive_all_features", "ucb_coefficient", "trust_region",
                         "scalarization_weights_rng", "labels", "num_scalarizations"],
    "PEScoreFunction": ["predictive", "predictive_all_features", "ucb_coefficient", "explore_ucb_coefficient",
                        "penalty_coefficient", "trust_region", "multimetric_promising_region_penalty_type"],
    # the GP's types, built positionally or by these keywords
    "PaddedArray": ["padded_array", "fill_value", "_original_shape", "_mask", "_nopadding_done"],
    "PrecomputedPredictive": ["prior", "observed_data", "precomputed_divisor_matrix_cholesky",
                              "precomputed_solve_on_observation"],
    "UniformEnsemblePredictive": ["predictives"],
    "StochasticProcessWithCoroutine": ["coroutine", "params"],
    "CoroutineWithData": ["coroutine", "data"],
    "ModelData": ["features", "labels"],
    # the acquisition optimiser
    "DefaultRandomSampler": ["converter"],
    "DefaultProjection": ["converter"],
    "compute_feature_dimensions_from_converter": ["converter"],
    "VectorizedEagleStrategyFactory": ["eagle_config", "random_sampler_factory", "projection_factory"],
    "VectorizedOptimizerFactory": ["strategy_factory", "max_evaluations", "suggestion_batch_size", "use_fori"],
    # the ARD fit and padding
    "ard_bounds": ["params", "constraints"],
    "padded_dimensions": ["dims", "padding_types"],
    # designers, as optimize/vizier.py constructs them
    "QuasiRandomDesigner": ["search_space", "skip_points", "seed"],
    "RandomDesigner": ["search_space", "dtype", "seed"],
    # jax / jaxlib: the triangular-solve lowering
    "triangular_solve_cpu_lower": ["ctx", "a", "b", "left_side", "lower", "transpose_a", "conjugate_a",
                                   "unit_diagonal"],
    "trsm_hlo": ["ctx", "dtype", "alpha", "a", "b", "left_side", "lower", "trans_a", "conj_a", "diag",
                 "b_shape_vals"],
    "eval_dynamic_shape_as_ivals": ["ctx", "shape"],
    "unregister_event_duration_listener": ["callback"],
}


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signature(vp, name):
    assert _params(getattr(vp, name)) == SIGNATURES[name], f"vizier_private.{name}: the parameters changed"


def test_designer_keywords(vp):
    """The keywords gp_designer and optimize/vizier.py pass to Vizier's designers."""
    passed = {"rng", "ard_random_restarts", "ard_optimizer", "padding_schedule", "acquisition_optimizer_factory"}
    for designer in (vp.VizierGPUCBPEBandit, vp.VizierGPBandit):
        assert passed <= set(_params(designer)), designer.__name__
    assert {"problem", "seed"} <= set(_params(vp.NSGA2Designer))


def test_gp_ucb_pe_internals_the_subclass_uses(vp):
    """StableUCBPE (optimize/gp_designer.py) overrides four methods with these signatures and reads
    these attributes of the stock designer."""
    import attr
    import jax

    cls = vp.VizierGPUCBPEBandit
    assert _params(cls._get_predictive_all_features) == ["self", "pending_features", "data", "model", "noise_is_high"]
    assert _params(cls._suggest_one) == ["self", "active_trials", "data", "model", "predictive", "tr",
                                         "acquisition_problem"]
    assert _params(cls._trials_to_data) == ["self", "trials"]
    assert _params(cls.suggest) == ["self", "count"]
    fields = {f.name for f in attr.fields(cls)}
    assert {"_problem", "_config", "_rng", "_padding_schedule", "_all_completed_trials", "_all_active_trials",
            "_num_seed_trials", "_gp_model_class"} <= fields
    for method in ("_generate_seed_trials", "_build_gp_model_and_optimize_parameters", "__attrs_post_init__"):
        assert callable(getattr(cls, method))
    assert isinstance(cls.default_eagle_config, vp.EagleStrategyConfig)
    config = cls(_problem(), rng=jax.random.PRNGKey(0))._config
    # StableUCBPE.suggest keeps the one-point-at-a-time path: the set acquisition stays off
    assert config.optimize_set_acquisition_for_exploration is False
    for name in ("ucb_coefficient", "explore_region_ucb_coefficient", "cb_violation_penalty_coefficient",
                 "multimetric_promising_region_penalty_type"):
        assert hasattr(config, name), name
    assert {k.name for k in vp.MultimetricPromisingRegionPenaltyType} >= {"UNION", "INTERSECTION", "AVERAGE"}


def test_score_classes_are_module_globals_that_suggest_one_reads(vp):
    """gp_ucb_pe_scores swaps the classes GP-UCB-PE's `_suggest_one` builds its scores from."""
    suggest_one = vp.VizierGPUCBPEBandit._suggest_one
    assert {"UCBScoreFunction", "PEScoreFunction"} <= set(suggest_one.__code__.co_names)

    def ucb(*a, **k):
        return None

    def pe(*a, **k):
        return None

    with vp.gp_ucb_pe_scores(ucb, pe):
        assert suggest_one.__globals__["UCBScoreFunction"] is ucb
        assert suggest_one.__globals__["PEScoreFunction"] is pe
    assert suggest_one.__globals__["UCBScoreFunction"] is vp.UCBScoreFunction
    assert suggest_one.__globals__["PEScoreFunction"] is vp.PEScoreFunction


def test_attributes_the_gp_code_reads(vp):
    import numpy as np
    from jax.interpreters import mlir
    from vizier.pyvizier.converters import padding

    arr = vp.PaddedArray.from_array(np.ones((3, 2)), (4, 2), fill_value=np.nan)
    for name in ("padded_array", "fill_value", "_original_shape", "_mask", "_nopadding_done", "is_missing",
                 "replace_fill_value", "unpad"):
        assert hasattr(arr, name), name
    for name in ("observed_data", "precomputed_divisor_matrix_cholesky", "precomputed_solve_on_observation",
                 "prior", "predict"):
        assert name in dir(vp.PrecomputedPredictive) or name in vp.PrecomputedPredictive.__dataclass_fields__, name
    for name in ("precompute_predictive", "call_with_aux"):
        assert callable(getattr(vp.StochasticProcessWithCoroutine, name)), name
    for name in ("loss_with_aux", "setup"):
        assert callable(getattr(vp.CoroutineWithData, name)), name
    schedule = padding.PaddingSchedule()
    assert schedule._int_default == -1
    assert _params(padding.PaddingSchedule._pad_trailing_dims) == ["self", "array", "padding_types"]
    assert callable(mlir.LoweringRuleContext.is_forward_compat)
    assert callable(vp.chlo.conj)


# The stock bodies the GP code copies or re-implements (vizier 0.1.24, jax 0.4.38): a new body is
# to be read against its copy before the hash here moves.
COPIED = {
    "VizierGPUCBPEBandit.suggest": ("VizierGPUCBPEBandit", "suggest", "4012921ae05f68a8"),
    "VizierGPUCBPEBandit._trials_to_data": ("VizierGPUCBPEBandit", "_trials_to_data", "dff377857a8f23f9"),
    "VizierGPUCBPEBandit._get_predictive_all_features": (
        "VizierGPUCBPEBandit", "_get_predictive_all_features", "8da108337e7d9167"),
    "UCBScoreFunction.__init__": ("UCBScoreFunction", "__init__", "f20f19546063a426"),
    "UCBScoreFunction.score_with_aux": ("UCBScoreFunction", "score_with_aux", "74ed26d1beda32a6"),
    "PEScoreFunction.score_with_aux": ("PEScoreFunction", "score_with_aux", "d8dce9a8cae2e2fe"),
}


@pytest.mark.parametrize("what", sorted(COPIED))
def test_copied_bodies_are_unchanged(vp, what):
    owner, method, digest = COPIED[what]
    source = inspect.getsource(getattr(getattr(vp, owner), method))
    assert hashlib.sha256(source.encode()).hexdigest()[:16] == digest, (
        f"{what} changed: compare it with its copy in optimize/gp_designer.py / gp_acquisition.py")


def test_private_names_are_imported_in_one_module():
    """Only optimize/vizier_private.py imports vizier._src, jax._src, jaxlib or an underscore name
    (the package, the vizier bench and the vizier tests)."""
    paths = [p for p in (ROOT / "spica_pipeline").rglob("*.py") if p != PRIVATE]
    paths += [ROOT / "bench" / "bench_vizier.py"] + sorted((ROOT / "tests").glob("test_vizier*.py"))
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                parts = name.split(".")
                if parts[0] in ("vizier", "jax", "jaxlib") and (
                        parts[0] == "jaxlib" or "_src" in parts or any(p.startswith("_") for p in parts)):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    assert not found


def _problem():
    from vizier import pyvizier as vz

    problem = vz.ProblemStatement()
    problem.search_space.root.add_float_param("x", 0.0, 1.0)
    problem.metric_information.append(vz.MetricInformation("o", goal=vz.ObjectiveMetricGoal.MAXIMIZE))
    return problem
