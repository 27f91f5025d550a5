"""The Dagster resource that chooses where a run's candidate replays go (local pool or Ray).

Why a resource and not a Dagster executor: Dagster's executors give one process or pod per step,
far too coarse for thousands of replays of 0.2-60 s inside one study step. The study step stays
one step; this resource opens the `EvaluationBackend` it evaluates on. Unset fields defer to the
sweep config (`sweep.executor`, `sweep.ray_address`), so a deployment can move every sweep of a
code location onto a Ray cluster without touching the sweep YAMLs.
"""

from typing import TYPE_CHECKING

import dagster as dg
from pydantic import Field, field_validator

from spica_pipeline.sweep import make_pool

if TYPE_CHECKING:
    from spica_pipeline.config.sweep import SweepConfig
    from spica_pipeline.evaluate.evaluator import Evaluator
    from spica_pipeline.evaluate.pool import EvaluationBackend

EXECUTORS = ("local", "ray")


class EvaluationBackendResource(dg.ConfigurableResource):
    """executor: local | ray, or None to follow each sweep's `sweep.executor`.
    ray_address: a Ray cluster for `ray`; None follows `sweep.ray_address`, then `RAY_ADDRESS`, and
        with neither a local Ray is started in the run's process."""

    executor: str | None = Field(
        default=None, description="local | ray; None = the sweep config's sweep.executor")
    ray_address: str | None = Field(
        default=None, description="Ray cluster address; None = sweep.ray_address, then $RAY_ADDRESS")

    @field_validator("executor")
    @classmethod
    def _known(cls, value: str | None) -> str | None:
        if value is not None and value not in EXECUTORS:
            raise ValueError(f"evaluation_backend.executor must be one of {list(EXECUTORS)}, got {value!r}")
        return value

    def open(self, evaluator: "Evaluator", sweep: "SweepConfig") -> "EvaluationBackend":
        """The backend for one run of `sweep` (a SweepConfig); use it as a context manager."""

        return make_pool(evaluator, sweep.eval_workers, sweep.max_eval_seconds, executor=self.executor or sweep.executor,
                         ray_address=self.ray_address or sweep.ray_address)
