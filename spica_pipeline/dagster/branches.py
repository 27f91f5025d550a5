"""Stage 4 asset: one branch space per deployment mode, with the search plan."""

import hashlib
import json

import dagster as dg
import pandas as pd

from spica_pipeline.dagster.config import config_from_frame, fail
from spica_pipeline.dagster.spec import SweepSpec
from spica_pipeline.errors import SpicaError
from spica_pipeline.jsonvalue import canonical_json
from spica_pipeline.optimize.branch_plan import plan_branch
from spica_pipeline.sweep import enumerate_branch_spaces

BRANCH_COLUMNS = ["deployment_mode", "space_json", "space_hash", "finite_size", "pool_size", "exhaustive",
                  "plan", "warnings_json"]


def space_hash(space_dict: dict) -> str:
    """Identity of a search space (the warm-start guard): same hash, same encoding."""
    body = {k: v for k, v in space_dict.items() if k != "diagnostics"}
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()


def branch_spaces_from_frame(frame: pd.DataFrame) -> dict[str, dict]:
    return {str(r["deployment_mode"]): json.loads(r["space_json"]) for r in frame.to_dict("records")}


def build_branch_spaces(spec: SweepSpec) -> dg.AssetsDefinition:
    @dg.asset(**spec.common("branch_spaces"), kinds={"pandas", "parquet"},
              ins={"filtered_config": dg.AssetIn(spec.key("filtered_config"))},
              description="Stage 4: the legal parallel pool and knobs per mode, with the search plan; "
              "modes with no viable config are dropped with a warning")
    def branch_spaces(context: dg.AssetExecutionContext, filtered_config: pd.DataFrame) -> dg.Output[pd.DataFrame]:
        config = config_from_frame(filtered_config)
        try:
            enumeration = enumerate_branch_spaces(config)
            plans = [plan_branch(b, config) for b in enumeration.branches]
        except SpicaError as err:
            raise fail(err) from None
        for warning in enumeration.warnings:
            context.log.warning(warning)
        rows = []
        for branch, plan in zip(enumeration.branches, plans):
            d = branch.to_dict()
            rows.append({
                "deployment_mode": branch.deployment_mode,
                "space_json": json.dumps(d, sort_keys=True, default=str),
                "space_hash": space_hash(json.loads(json.dumps(d, default=str))),
                "finite_size": plan.finite_size if plan.finite_size is not None else -1,
                "pool_size": len(branch.parallel_configs),
                "exhaustive": bool(plan.exhaustive),
                "plan": plan.why,
                "warnings_json": json.dumps(list(enumeration.warnings)),
            })
        frame = pd.DataFrame(rows, columns=BRANCH_COLUMNS)
        return dg.Output(frame, metadata={
            "branches": ", ".join(frame["deployment_mode"]),
            "warnings": len(enumeration.warnings),
            "plans": dg.MetadataValue.md("\n".join(
                f"* **{r['deployment_mode']}**: {r['pool_size']} parallel configs; {r['plan']}" for r in rows)
                + ("\n\nWarnings:\n" + "\n".join(f"* {w}" for w in enumeration.warnings)
                   if enumeration.warnings else "")),
        })

    return branch_spaces
