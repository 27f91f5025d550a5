"""Stage 3 asset: the load-predictor sub-sweep, stored as its JSON dict."""

import importlib
import json
from typing import TYPE_CHECKING, Any

import dagster as dg
import pandas as pd

from spica_pipeline.dagster.config import config_from_frame, fail
from spica_pipeline.dagster.spec import SweepSpec
from spica_pipeline.errors import SpicaError
from spica_pipeline.sweep import predict_load

if TYPE_CHECKING:
    from spica_pipeline.space.load_predictor import LoadPredictorResult


def load_predictor_frame(result: "LoadPredictorResult | None") -> pd.DataFrame:
    """One row: the result's class (so it can be rebuilt) and its `to_dict()` as JSON; null when
    the config needs no predictor."""
    if result is None:
        return pd.DataFrame([{"result_class": None, "result_json": None}])
    cls = type(result)
    return pd.DataFrame([{"result_class": f"{cls.__module__}:{cls.__qualname__}",
                          "result_json": json.dumps(result.to_dict(), sort_keys=True, default=str)}])


def load_predictor_from_frame(frame: pd.DataFrame) -> "LoadPredictorResult | None":
    row = frame.iloc[0]
    if not row["result_class"] or row["result_json"] is None:
        return None
    module, _, qualname = str(row["result_class"]).partition(":")
    cls: Any = importlib.import_module(module)
    for part in qualname.split("."):
        cls = getattr(cls, part)
    return cls.from_dict(json.loads(row["result_json"]))


def _numbers(d: dict[str, Any], prefix: str = "", depth: int = 0) -> dict[str, float]:
    """Top-level numeric fields, so Dagster plots them across runs."""
    out: dict[str, float] = {}
    for key, value in d.items():
        if isinstance(value, bool):
            continue
        if isinstance(value, (int, float)) and value == value:
            out[f"{prefix}{key}"] = round(float(value), 4)
        elif isinstance(value, dict) and depth < 1:
            out.update(_numbers(value, f"{prefix}{key}.", depth + 1))
    return out


def build_load_predictor_result(spec: SweepSpec) -> dg.AssetsDefinition:
    @dg.asset(**spec.common("load_predictor_result"), kinds={"pandas", "parquet"},
              ins={"filtered_config": dg.AssetIn(spec.key("filtered_config"))},
              description="Stage 3: which load predictor (and settings) the planner candidates use; "
              "null without a planner")
    def load_predictor_result(context: dg.AssetExecutionContext,
                              filtered_config: pd.DataFrame) -> dg.Output[pd.DataFrame]:
        config = config_from_frame(filtered_config)
        try:
            result = predict_load(config)
        except SpicaError as err:
            raise fail(err) from None
        frame = load_predictor_frame(result)
        if result is None:
            return dg.Output(frame, metadata={"status": "not needed: no planner policy uses a load predictor"})
        data = result.to_dict()
        metadata: dict[str, Any] = dict(_numbers(data))
        metadata["result"] = dg.MetadataValue.json(json.loads(json.dumps(data, default=str)))
        return dg.Output(frame, metadata=metadata)

    return load_predictor_result
