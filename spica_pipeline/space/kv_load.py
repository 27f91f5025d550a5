"""`kv_load_ratio` -> per-candidate closed-loop concurrency.

The load is relative to the candidate's own KV capacity so one ratio means the same KV pressure for
a TP1 and a TP8 candidate; the capacity comes from the same AIC estimator the evaluator uses.
"""

from collections.abc import Callable
from typing import Any

from spica_pipeline.errors import InfeasibleKVCapacity
from spica_pipeline.space.candidate import Candidate
from spica_pipeline.space.kv import estimate_kv_tokens


def role_kv_capacity_tokens(
    candidate: Candidate, role: str, estimate: Callable[..., int] = estimate_kv_tokens
) -> int:
    """Usable KV tokens of a whole role: block-rounded per-rank tokens x attention_dp x replicas.

    TP and EP ranks shard the same sequences, so they are not multipliers. The candidate's
    `backend_version` must be resolved.
    """
    r = candidate.role(role)
    per_rank = estimate(
        candidate.model, candidate.role_system(r), candidate.backend, candidate.backend_version,
        r.shape.engine_key(),
        max_num_tokens=int(r.engine.max_num_batched_tokens),
        max_batch_size=int(r.engine.max_num_seqs),
        memory_fraction=float(r.engine.gpu_memory_utilization),
        nextn=int(candidate.aic_nextn or 0),
        **({"precision": candidate.quant_modes()} if candidate.precision else {}),
    )
    block_size = int(r.engine.block_size or 0)
    if block_size <= 0:
        raise ValueError(f"{role}_block_size must be greater than zero, got {block_size}")
    usable_per_rank = (int(per_rank) // block_size) * block_size
    return usable_per_rank * r.shape.attention_dp * r.replicas


def resolve_kv_load(
    candidate: Candidate,
    isl: int,
    osl: int,
    ratio: float,
    estimate: Callable[..., int] = estimate_kv_tokens,
) -> dict[str, Any]:
    """The load fields a KV-load ratio gives the candidate (`concurrency`, capacities), for its config.

    Every active role is estimated (prefill before decode) so an infeasible prefill shape still
    fails the candidate; the load role is decode for disagg and agg for agg.
    Raises InfeasibleKVCapacity when the load role cannot hold one average request.
    """
    roles = candidate.role_names
    capacities = {role: role_kv_capacity_tokens(candidate, role, estimate) for role in roles}
    load_role = candidate.load_role.name
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
