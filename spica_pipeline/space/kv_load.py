"""`kv_load_ratio` -> per-candidate closed-loop concurrency.

The load is relative to the candidate's own KV capacity so one ratio means the same KV pressure for
a TP1 and a TP8 candidate; the capacity comes from the same AIC estimator the evaluator uses.
"""

from collections.abc import Callable
from typing import Any

from spica_pipeline.config.precision import precision_of, quant_modes
from spica_pipeline.errors import InfeasibleKVCapacity
from spica_pipeline.space.kv import estimate_kv_tokens
from spica_pipeline.space.plan import active_roles, role_replicas, role_shape


def role_kv_capacity_tokens(
    sample: dict[str, Any], role: str, estimate: Callable[..., int] = estimate_kv_tokens
) -> int:
    """Usable KV tokens of a whole role: block-rounded per-rank tokens x attention_dp x replicas.

    TP and EP ranks shard the same sequences, so they are not multipliers.
    """
    shape = role_shape(sample, role)
    per_rank = estimate(
        sample["model_name"], sample["hardware_sku"], sample["backend"], sample["backend_version"], shape,
        max_num_tokens=int(sample[f"{role}_max_num_batched_tokens"]),
        max_batch_size=int(sample[f"{role}_max_num_seqs"]),
        memory_fraction=float(sample[f"{role}_gpu_memory_utilization"]),
        nextn=int(sample.get("aic_nextn") or 0),
        **({"precision": quant_modes(sample)} if precision_of(sample) else {}),
    )
    block_size = int(sample.get(f"{role}_block_size") or 0)
    if block_size <= 0:
        raise ValueError(f"{role}_block_size must be greater than zero, got {block_size}")
    usable_per_rank = (int(per_rank) // block_size) * block_size
    return usable_per_rank * shape[2] * role_replicas(sample, role)


def resolve_kv_load(
    sample: dict[str, Any],
    isl: int,
    osl: int,
    ratio: float,
    estimate: Callable[..., int] = estimate_kv_tokens,
) -> dict[str, Any]:
    """The load fields to record on the sample (`concurrency`, capacities) for a KV-load ratio.

    Every active role is estimated (prefill before decode) so an infeasible prefill shape still
    fails the candidate; the load role is decode for disagg and agg for agg.
    Raises InfeasibleKVCapacity when the load role cannot hold one average request.
    """
    roles = active_roles(sample)
    capacities = {role: role_kv_capacity_tokens(sample, role, estimate) for role in roles}
    load_role = "agg" if roles == ("agg",) else "decode"
    load_capacity = capacities[load_role]
    avg_tokens = int(isl) + int(osl) // 2
    if avg_tokens <= 0:
        raise InfeasibleKVCapacity(
            f"kv_load_ratio needs positive average tokens per request, got isl={isl}, osl={osl}"
        )
    capacity_concurrency = load_capacity // avg_tokens
    if capacity_concurrency < 1:
        raise InfeasibleKVCapacity(
            f"{load_role} KV capacity of {load_capacity} tokens cannot hold the estimated "
            f"{avg_tokens} tokens per in-flight request"
        )
    concurrency = max(1, int(float(ratio) * capacity_concurrency))
    fields: dict[str, Any] = {
        "kv_load_ratio": float(ratio),
        "concurrency": concurrency,
        "kv_load_concurrency_capacity": int(capacity_concurrency),
        "kv_load_capacity_tokens": int(load_capacity),
    }
    for role in roles:
        fields[f"{role}_kv_capacity_tokens"] = int(capacities[role])
    return fields
