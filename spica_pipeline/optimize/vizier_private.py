"""Every private name of google-vizier, jax and jaxlib that the package uses, in one place.

Vizier's public API (`vizier.pyvizier`, `vizier.algorithms`, `vizier.jax`) has the trial and
problem types, the designer interface and the optimiser interface, and the package uses it for
those. Its designers module (`vizier.algorithms.designers`) imports every designer, BOCS among
them, which needs cvxpy (not a dependency here), so that import fails: the five designers the
package runs are taken from their own modules below. Nor does the public API have what the
compile-once GP code (optimize/gp_*.py) builds on: the Eagle acquisition optimiser's parts,
GP-UCB-PE's score functions and helpers, the GP posterior and padded-array types, the output
warper and the ARD optimiser's bounds helper. jax has no public hook for the pieces of its CPU
lowering of a triangular solve. They are imported here and nowhere else.
tests/test_vizier_private.py checks each one (existence, signature, attributes) against the versions
in `PINNED`, so an upgrade fails there, naming what moved, instead of deep inside a suggest.

Importing this module imports jax and Vizier's GP stack: import it only after the runtime setup
(optimize/vizier.py `_runtime_setup`), never at package import.
"""

import importlib.metadata
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# jax / jaxlib: the CPU lowering of lax.linalg.triangular_solve_p and what a lowering rule calls
from jax._src import monitoring
from jax._src.interpreters.mlir import eval_dynamic_shape_as_ivals
from jax._src.lax.linalg import _triangular_solve_cpu_lower
from jax._src.lib.mlir.dialects import chlo
from jaxlib.lapack import trsm_hlo

# google-vizier: the designers (what `vizier.algorithms.designers` re-exports)
from vizier._src.algorithms.designers.gp_bandit import VizierGPBandit
from vizier._src.algorithms.designers.gp_ucb_pe import VizierGPUCBPEBandit
from vizier._src.algorithms.designers.quasi_random import QuasiRandomDesigner
from vizier._src.algorithms.designers.random import RandomDesigner
from vizier._src.algorithms.evolution.nsga2 import NSGA2Designer

# google-vizier: GP-UCB-PE's module, whose `_suggest_one` reads the score classes as module globals
from vizier._src.algorithms.designers import gp_ucb_pe
from vizier._src.algorithms.designers.gp.acquisitions import TrustRegion, create_hv_scalarization
from vizier._src.algorithms.designers.gp.output_warpers import create_default_warper
from vizier._src.algorithms.designers.scalarization import HyperVolumeScalarization
from vizier._src.algorithms.optimizers.eagle_strategy import (
    DefaultProjection,
    DefaultRandomSampler,
    EagleStrategyConfig,
    VectorizedEagleStrategyFactory,
    compute_feature_dimensions_from_converter,
)
from vizier._src.algorithms.optimizers.vectorized_base import VectorizedOptimizerFactory
from vizier._src.jax.optimizers.jaxopt_wrappers import _get_bounds
from vizier._src.jax.stochastic_process_model import (
    CoroutineWithData,
    PrecomputedPredictive,
    StochasticProcessWithCoroutine,
    UniformEnsemblePredictive,
)
from vizier._src.jax.types import ModelData, ModelInput, PaddedArray
from vizier.pyvizier.converters.padding import _padded_dimensions

PINNED = {"google-vizier": "0.1.24", "jax": "0.4.38", "jaxlib": "0.4.38"}

# GP-UCB-PE (vizier 0.1.24 gp_ucb_pe.py)
PEScoreFunction = gp_ucb_pe.PEScoreFunction
UCBScoreFunction = gp_ucb_pe.UCBScoreFunction
MultimetricPromisingRegionPenaltyType = gp_ucb_pe.MultimetricPromisingRegionPenaltyType
apply_trust_region = gp_ucb_pe._apply_trust_region
compute_ucb_threshold = gp_ucb_pe._compute_ucb_threshold
# the ARD optimiser's (lower, upper) bound trees from a model's constraints
ard_bounds = _get_bounds
# a padding schedule's padded sizes of the trailing dimensions
padded_dimensions = _padded_dimensions
# jax's own CPU lowering of the triangular solve (the 2-D LAPACK path and the expander)
triangular_solve_cpu_lower = _triangular_solve_cpu_lower
# removes a listener added with jax.monitoring.register_event_duration_secs_listener
unregister_event_duration_listener = monitoring._unregister_event_duration_listener_by_callback

_log = logging.getLogger(__name__)


def version_mismatches() -> list[str]:
    """One line per pinned distribution whose installed version differs from `PINNED`."""
    out = []
    for dist, want in PINNED.items():
        try:
            got = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            got = "not installed"
        if got != want:
            out.append(f"{dist} {got} is installed; optimize/vizier_private.py is checked against {want}")
    return out


@contextmanager
def gp_ucb_pe_scores(ucb: Any, pe: Any) -> Iterator[None]:
    """GP-UCB-PE's `_suggest_one` builds its scores from the module globals `UCBScoreFunction` and
    `PEScoreFunction`; within this block it builds `ucb` and `pe` instead (suggests run one at a
    time on one thread). Restored on exit."""
    gp_ucb_pe.UCBScoreFunction, gp_ucb_pe.PEScoreFunction = ucb, pe
    try:
        yield
    finally:
        gp_ucb_pe.UCBScoreFunction, gp_ucb_pe.PEScoreFunction = UCBScoreFunction, PEScoreFunction


for _line in version_mismatches():
    _log.warning(_line)

__all__ = [
    "PINNED", "CoroutineWithData", "DefaultProjection", "DefaultRandomSampler", "EagleStrategyConfig",
    "HyperVolumeScalarization", "ModelData", "ModelInput", "MultimetricPromisingRegionPenaltyType",
    "NSGA2Designer", "PEScoreFunction", "PaddedArray", "PrecomputedPredictive", "QuasiRandomDesigner",
    "RandomDesigner", "StochasticProcessWithCoroutine", "TrustRegion", "UCBScoreFunction",
    "UniformEnsemblePredictive", "VectorizedEagleStrategyFactory", "VectorizedOptimizerFactory",
    "VizierGPBandit", "VizierGPUCBPEBandit", "apply_trust_region", "ard_bounds", "chlo",
    "compute_feature_dimensions_from_converter", "compute_ucb_threshold", "create_default_warper",
    "create_hv_scalarization", "eval_dynamic_shape_as_ivals", "gp_ucb_pe", "gp_ucb_pe_scores",
    "padded_dimensions", "triangular_solve_cpu_lower", "trsm_hlo", "unregister_event_duration_listener",
    "version_mismatches",
]
