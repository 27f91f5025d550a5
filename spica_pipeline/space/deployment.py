"""One deployment through the CLI's own path: a one-candidate sweep config, validated and enumerated exactly as
`spica validate` / `spica sweep` do (no replay), accepted or refused with the rule that refused it.

Benches use it so a deployment the CLI refuses cannot be counted as evaluated (bench/bench_coverage.py over
AIC's silicon deployments; the fidelity bench can check each row it replays the same way).
"""

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from spica_pipeline.config import SmartSearchConfig
from spica_pipeline.config.messages import render_validation_error
from spica_pipeline.errors import ModelHardwareError, NoPerfDatabase, NoViableParallelConfig, SpicaError, one_line
from spica_pipeline.space.branches import enumerate_branches
from spica_pipeline.space.parallel import config_label
from spica_pipeline.space.pins import PinRefused
from spica_pipeline.space.policies import filter_scaling_policies


@dataclass(frozen=True)
class DeploymentCheck:
    """The CLI's verdict on one pinned deployment: `rule` None when accepted; `config` is the canonical shape
    it ran as, `notes` the warnings the sweep would print (how a pin was read, timing substitutions)."""

    rule: str | None
    message: str
    config: str | None = None
    nearest: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def accepted(self) -> bool:
        return self.rule is None

    def to_dict(self) -> dict[str, Any]:
        return {"accepted": self.accepted, "rule": self.rule, "message": self.message, "config": self.config,
                "nearest": self.nearest, "notes": list(self.notes)}


def deployment_config(*, model: str, system: str, backend: str, mode: str, pin: dict[str, Any], gpus: int,
                      isl: int, osl: int, concurrency: int, context_length: int | None = None,
                      memory_fraction: float | None = None, precision: dict[str, str] | None = None,
                      ) -> dict[str, Any]:
    """The sweep config (as its YAML would hold it) that pins one deployment: one backend, one mode, one
    parallel_configs entry, gpu_budget its GPUs, a closed loop at its concurrency, round robin, no planner."""
    space: dict[str, Any] = {
        "model_name": model, "hardware_sku": system, "backend": [backend], "deployment_mode": [mode],
        "gpu_budget": int(gpus), "parallel_configs": [pin], "router_mode": ["round_robin"],
        "planner_scaling_policy": ["disabled"],
    }
    if context_length:
        space["context_length"] = int(context_length)
    if memory_fraction is not None:
        for role in ("agg", "prefill", "decode"):
            space[f"{role}_gpu_memory_utilization"] = float(memory_fraction)
    if precision:
        space["precision"] = dict(precision)
    workload = {"isl": int(isl), "osl": int(osl), "concurrency": int(concurrency), "num_request_ratio": 10.0}
    return {"search_space": space, "workload": workload}


def check_deployment(data: dict[str, Any]) -> DeploymentCheck:
    """Validate and enumerate a (one-pin) sweep config the way the CLI does; the first refusal's rule:
    'config' (validation), 'model_hardware', 'perf_data' (no perf database), a pin rule (space/pins.py:
    shape, ladder, backend, budget, memory, perf_data) or 'enumeration'."""
    try:
        config = SmartSearchConfig.from_dict(data)
    except ValidationError as err:
        return DeploymentCheck("config", render_validation_error(err))
    try:
        filtered = filter_scaling_policies(config).config
        result = enumerate_branches(filtered)
    except PinRefused as exc:
        return DeploymentCheck(exc.rule, one_line(exc), nearest=config_label(exc.nearest) if exc.nearest else None)
    except ModelHardwareError as exc:
        return DeploymentCheck("model_hardware", one_line(exc))
    except NoPerfDatabase as exc:
        return DeploymentCheck("perf_data", one_line(exc))
    except NoViableParallelConfig as exc:
        return DeploymentCheck("enumeration", one_line(exc))
    except SpicaError as exc:
        return DeploymentCheck("config", one_line(exc))
    branch = result.branches[0]
    return DeploymentCheck(None, "accepted", config_label(branch.parallel_configs[0]),
                           notes=tuple(result.warnings))
