"""Stage 2: drop planner scaling policies the goal cannot drive (no SLA; an e2e-only SLA).

The planner's throughput scaling needs an SLA to aim at, and its ttft/itl targets are seeded from
the goal's SLA; a policy that would fail when its deployment plan is built is removed here, so
neither the study nor the load-predictor sub-sweep ever sees it. Every drop is recorded with a
reason.
"""

from dataclasses import dataclass, field
from typing import Any

from spica_pipeline.config.goal import planner_target
from spica_pipeline.config.presets import expand_scaling_policy
from spica_pipeline.errors import PolicyFilterError

PolicyEntry = str | dict[str, Any]


def policy_flags(entry: PolicyEntry) -> tuple[bool, bool, int | float | None, int | float | None]:
    """(throughput scaling, load scaling, throughput interval, load interval) of a preset or dict."""
    try:
        p = expand_scaling_policy(entry)
    except ValueError as exc:
        raise PolicyFilterError(str(exc)) from None
    return (p["enable_throughput_scaling"], p["enable_load_scaling"],
            p["throughput_adjustment_interval_seconds"], p["load_adjustment_interval_seconds"])


def throughput_intervals(entries: list[PolicyEntry]) -> list[float]:
    """Sorted distinct throughput intervals of the throughput-scaling entries (None intervals dropped)."""
    found: set[float] = set()
    for entry in entries:
        throughput, _load, interval, _ = policy_flags(entry)
        if throughput and interval is not None:
            found.add(int(interval) if float(interval).is_integer() else interval)
    return sorted(found)


def is_static(entry: PolicyEntry) -> bool:
    """Both flags off: the planner is off (same as `disabled`)."""
    throughput, load, _, _ = policy_flags(entry)
    return not (throughput or load)


@dataclass(frozen=True)
class PolicyFilterResult:
    """The config holding only the kept policies, and what was dropped and why."""

    config: Any
    dropped: list[dict[str, Any]] = field(default_factory=list)

    @property
    def kept(self) -> list[PolicyEntry]:
        return list(self.config.search_space.planner_scaling_policy)

    def summary(self) -> str:
        """The one progress line of stage 2 ('' when nothing was dropped)."""
        if not self.dropped:
            return ""
        names = ", ".join(repr(d["policy"]) for d in self.dropped)
        return f"smart-sweep: dropped planner_scaling_policy entries {names}: {self.dropped[0]['reason']}"


def filter_policies(
    policies: list[PolicyEntry],
    goal_target: str,
    sla_ttft_ms: float | None = None,
    sla_itl_ms: float | None = None,
    sla_set: bool = False,
) -> tuple[list[PolicyEntry], list[dict[str, Any]]]:
    """Filters 2a then 2b on plain values: (kept, dropped). Raises PolicyFilterError if none is left."""
    target = getattr(goal_target, "value", goal_target)
    planner = planner_target(target)
    kept = list(policies)
    dropped: list[dict[str, Any]] = []

    if planner != "sla":  # 2a: throughput scaling aims at an SLA this goal does not have
        reason = (f"throughput scaling needs an SLA target, but goal '{target}' maps to planner target "
                  f"'{planner}'")
        drop = [p for p in kept if policy_flags(p)[0]]
        kept = [p for p in kept if not policy_flags(p)[0]]
        dropped += [{"policy": p, "reason": reason} for p in drop]
        if drop and not kept:
            raise PolicyFilterError(
                f"every planner_scaling_policy entry enables throughput scaling, which a '{target}' sweep "
                "cannot use (it has no SLA); use a goodput target or include 'disabled' / a load_* policy"
            )

    e2e_only = sla_set and (sla_ttft_ms is None or sla_itl_ms is None)
    if planner == "sla" and e2e_only:  # 2b: the planner's ttft/itl target cannot be seeded
        reason = "planner scaling needs goal.sla ttft_ms and itl_ms; this SLA is e2e-only"
        drop = [p for p in kept if not is_static(p)]
        kept = [p for p in kept if is_static(p)]
        dropped += [{"policy": p, "reason": reason} for p in drop]
        if not kept:
            raise PolicyFilterError(
                "an e2e-only SLA cannot seed the planner's ttft/itl target; "
                "use ttft_ms+itl_ms or include 'disabled' in planner_scaling_policy"
            )
    return kept, dropped


def filter_scaling_policies(config: Any) -> PolicyFilterResult:
    """Stage 2 on a SmartSearchConfig: a model_copy with only the kept policies, plus the drop record."""
    sla = config.goal.sla
    kept, dropped = filter_policies(
        list(config.search_space.planner_scaling_policy),
        config.goal.target,
        sla_ttft_ms=getattr(sla, "ttft_ms", None),
        sla_itl_ms=getattr(sla, "itl_ms", None),
        sla_set=sla is not None,
    )
    if not dropped:
        return PolicyFilterResult(config=config, dropped=[])
    space = config.search_space.model_copy(update={"planner_scaling_policy": kept})
    return PolicyFilterResult(config=config.model_copy(update={"search_space": space}), dropped=dropped)
