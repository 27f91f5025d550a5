"""Stage 2 asset: drop planner scaling policies the goal cannot drive (with the reasons)."""

import json

import dagster as dg
import pandas as pd

from spica_pipeline.dagster.config import config_frame, config_from_frame, fail, frame_value
from spica_pipeline.dagster.spec import SweepSpec
from spica_pipeline.errors import SpicaError
from spica_pipeline.sweep import filter_policies


def build_filtered_config(spec: SweepSpec) -> dg.AssetsDefinition:
    @dg.asset(**spec.common("filtered_config"), kinds={"pandas", "parquet"},
              ins={"validated_config": dg.AssetIn(spec.key("validated_config"))},
              description="Stage 2: the config holding only the kept planner policies; `dropped_json` "
              "lists what went and why")
    def filtered_config(context: dg.AssetExecutionContext, validated_config: pd.DataFrame) -> dg.Output[pd.DataFrame]:
        config = config_from_frame(validated_config)
        try:
            result = filter_policies(config)
        except SpicaError as err:
            raise fail(err) from None
        dropped = [{"policy": d["policy"] if isinstance(d["policy"], str) else json.dumps(d["policy"], sort_keys=True),
                    "reason": d["reason"]} for d in result.dropped]
        if result.summary():
            context.log.warning(result.summary())
        frame = config_frame(result.config, source=frame_value(validated_config, "source"),
                             sweep_name=frame_value(validated_config, "sweep_name"), dropped=dropped)
        kept = [p if isinstance(p, str) else json.dumps(p, sort_keys=True) for p in result.kept]
        return dg.Output(frame, metadata={
            "config_hash": frame_value(frame, "config_hash"),
            "kept_policies": ", ".join(kept),
            "dropped_count": len(dropped),
            "dropped_policies": dg.MetadataValue.table(
                records=[dg.TableRecord(d) for d in dropped],
                schema=dg.TableSchema(columns=[dg.TableColumn("policy", "string"),
                                               dg.TableColumn("reason", "string")]),
            ),
        })

    return filtered_config
