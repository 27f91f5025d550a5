"""Asset checks on the sweep result: what must hold for a sweep's answer to be trusted.

Each check is a plain function over frames (unit-testable) wrapped as a Dagster asset check.
"""

from typing import Any

import dagster as dg
import pandas as pd

from spica_pipeline.config import SmartSearchConfig, Target
from spica_pipeline.dagster.config import config_from_frame
from spica_pipeline.dagster.result import as_ledgers, merged_ledger
from spica_pipeline.dagster.spec import SweepSpec
from spica_pipeline.evaluate import scoring

REPLAY_STATUSES = ("feasible", "infeasible", "failed", "timed_out")


def feasible_candidate_check(candidates: pd.DataFrame) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        passed=len(candidates) > 0,
        metadata={"candidates": len(candidates)},
        description=None if len(candidates) else "no feasible candidate: see report.md for the failure reasons",
    )


def gpu_budget_check(candidates: pd.DataFrame, gpu_budget: int) -> dg.AssetCheckResult:
    if candidates.empty or "used_gpus" not in candidates.columns:
        return dg.AssetCheckResult(passed=True, metadata={"over_budget": 0, "gpu_budget": int(gpu_budget)})
    used = pd.to_numeric(candidates["used_gpus"], errors="coerce")
    over = candidates[(used > gpu_budget) | used.isna()]
    return dg.AssetCheckResult(
        passed=over.empty,
        metadata={"over_budget": len(over), "gpu_budget": int(gpu_budget),
                  "max_used_gpus": int(used.max()) if used.notna().any() else 0},
    )


def unique_replays_check(ledger: pd.DataFrame) -> dg.AssetCheckResult:
    """Each replayed (non-cached) trial has its own spec hash: the dedup cache never let a spec replay twice."""
    if ledger.empty:
        return dg.AssetCheckResult(passed=True, metadata={"replayed": 0, "duplicate_hashes": 0})
    replay_seconds = pd.to_numeric(ledger["replay_seconds"], errors="coerce").fillna(0.0)
    replayed = ledger[ledger["status"].isin(REPLAY_STATUSES) & (replay_seconds > 0)]
    counts = replayed["spec_hash"].value_counts()
    dupes = counts[counts > 1]
    return dg.AssetCheckResult(
        passed=dupes.empty,
        metadata={"replayed": len(replayed), "duplicate_hashes": len(dupes),
                  "examples": ", ".join(str(h)[:12] for h in dupes.index[:5]) or "-"},
    )


def front_check(candidates: pd.DataFrame, target: str, objectives: list[str]) -> dg.AssetCheckResult:
    """Pareto goal: no front point dominates another. Scalar goal: the ranking is best-first."""
    if candidates.empty:
        return dg.AssetCheckResult(passed=True, metadata={"points": 0})
    if target != Target.PARETO:
        scores = pd.to_numeric(candidates["score"], errors="coerce").tolist()
        bad = sum(1 for a, b in zip(scores, scores[1:]) if not a >= b)
        return dg.AssetCheckResult(passed=bad == 0, metadata={"points": len(scores), "out_of_order": bad},
                                   description="scalar goal: checks the ranking is sorted best-first")
    dirs = [scoring.direction(o) for o in objectives]
    cols = [f"obj.{o}" for o in objectives]
    vectors = [tuple(float(v) for v in row) for row in candidates[cols].itertuples(index=False)]
    dominated = sum(1 for i, b in enumerate(vectors)
                    if any(j != i and scoring.dominates(a, b, dirs) for j, a in enumerate(vectors)))
    return dg.AssetCheckResult(passed=dominated == 0,
                               metadata={"points": len(vectors), "dominated_points": dominated})


def _objectives(config: SmartSearchConfig) -> list[str]:
    return config.goal.objective_names()


def build_checks(spec: SweepSpec) -> list[dg.AssetChecksDefinition]:
    """The four checks on one sweep's result; the first two are blocking (deploy waits on them)."""
    result_key = spec.key("sweep_result")
    config_in = {"filtered_config": dg.AssetIn(spec.key("filtered_config"))}

    @dg.asset_check(asset=result_key, blocking=True, automation_condition=dg.AutomationCondition.eager(),
                    description="Blocking: at least one feasible candidate came out of the sweep")
    def has_feasible_candidate(sweep_result: pd.DataFrame) -> dg.AssetCheckResult:
        return feasible_candidate_check(sweep_result)

    @dg.asset_check(asset=result_key, blocking=True, additional_ins=config_in,
                    automation_condition=dg.AutomationCondition.eager(),
                    description="Blocking: no candidate uses more GPUs than search_space.gpu_budget")
    def within_gpu_budget(sweep_result: pd.DataFrame, filtered_config: pd.DataFrame) -> dg.AssetCheckResult:
        return gpu_budget_check(sweep_result, int(config_from_frame(filtered_config).search_space.gpu_budget))

    @dg.asset_check(
        asset=result_key, automation_condition=dg.AutomationCondition.eager(),
        description="Spec hashes are unique among replayed (non-cached) trials of the ledger",
        additional_ins={**config_in, "branch_study": dg.AssetIn(spec.key("branch_study"),
                                                                metadata={"allow_missing_partitions": True})},
    )
    def unique_replayed_spec_hashes(filtered_config: pd.DataFrame, branch_study: Any) -> dg.AssetCheckResult:
        return unique_replays_check(merged_ledger(config_from_frame(filtered_config),
                                                  as_ledgers(spec, branch_study)))

    @dg.asset_check(asset=result_key, additional_ins=config_in, automation_condition=dg.AutomationCondition.eager(),
                    description="Pareto front is non-dominated (scalar goal: ranking is best-first)")
    def front_non_dominated(sweep_result: pd.DataFrame, filtered_config: pd.DataFrame) -> dg.AssetCheckResult:
        config = config_from_frame(filtered_config)
        return front_check(sweep_result, config.goal.target.value, _objectives(config))

    return [has_feasible_candidate, within_gpu_budget, unique_replayed_spec_hashes, front_non_dominated]


CHECK_NAMES = ["has_feasible_candidate", "within_gpu_budget", "unique_replayed_spec_hashes", "front_non_dominated"]
