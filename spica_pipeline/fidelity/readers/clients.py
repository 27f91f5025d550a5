"""Benchmark clients' result files: one Measurement per run, the deployment given separately.

The field names are the tools' own, as their real output has them (tests/data/measurements/ holds files the
tools wrote; PRODUCED_BY.txt there names the versions):

* AIPerf `profile_export_aiperf.json`: each metric is {"unit", "avg", "p90", ...}; TTFT is
  `time_to_first_token`, TPOT `inter_token_latency` (per request (latency - TTFT) / (output tokens - 1)),
  ISL and OSL `input_sequence_length` / `output_sequence_length` (the server's counts with
  --use-server-token-count, the client tokenizer's otherwise). The load is the profiling phase of
  `input_config.phases` ("concurrency", "rate"); files of AIPerf versions before phases record it under
  `input_config.loadgen` ("concurrency", "request_rate").
* `vllm bench serve --save-result` JSON and SGLang `bench_serving --output-file` JSONL (one line per run): the
  same summary keys: `mean_ttft_ms`, `mean_tpot_ms`, `p90_ttft_ms` / `p90_tpot_ms` (vLLM only with 90 in
  --metric-percentiles), `completed`, `total_input_tokens` and `total_output_tokens` (ISL and OSL are their
  means over completed requests), `max_concurrency` (null without --max-concurrency) and `request_rate`
  (inf, written "inf" or Infinity, without --request-rate). vLLM's file also has `model_id`; SGLang's line
  has `dataset_name` and no model.
"""

import math
from collections.abc import Mapping
from typing import Any

from spica_pipeline.fidelity.readers.points import Deployment, Measurement, MeasurementError, number, whole


def _metric(doc: Mapping[str, Any], name: str, stat: str, origin: str, hint: str = "") -> float:
    m = doc.get(name)
    if not isinstance(m, Mapping) or m.get(stat) is None:
        raise MeasurementError(f"{origin}: no {name}.{stat}{hint}")
    return number(m[stat], origin, f"{name}.{stat}")


def _optional_metric(doc: Mapping[str, Any], name: str, stat: str, origin: str) -> float | None:
    m = doc.get(name)
    if not isinstance(m, Mapping) or m.get(stat) is None:
        return None
    return number(m[stat], origin, f"{name}.{stat}")


def _rate(value: Any, origin: str, name: str) -> float | None:
    """A request rate, None for an unbounded one (inf, "inf", Infinity) or none at all."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("inf", "infinity", "")):
        return None
    if isinstance(value, float) and math.isinf(value) and value > 0:
        return None
    return number(value, origin, name)


def _load(concurrency: int | None, rate: float | None, origin: str, hint: str) -> None:
    if concurrency is None and rate is None:
        raise MeasurementError(f"{origin}: records neither a concurrency nor a finite request rate (every request "
                               f"was sent at once); rerun with {hint}")


def aiperf_point(doc: Mapping[str, Any], deployment: Deployment, source: str) -> Measurement:
    """One AIPerf profile export (the profiling phase; warmup requests are not in its metrics)."""
    if doc.get("was_cancelled") is True:
        raise MeasurementError(f"{source}: was_cancelled is true: the run stopped early, its statistics are partial")
    raw_config = doc.get("input_config")
    config: Mapping[str, Any] = raw_config if isinstance(raw_config, Mapping) else {}
    concurrency: int | None = None
    rate: float | None = None
    phases = config.get("phases")
    if isinstance(phases, list):
        profiling = [p for p in phases if isinstance(p, Mapping) and p.get("kind", p.get("name")) == "profiling"]
        if len(profiling) != 1:
            raise MeasurementError(f"{source}: input_config.phases has {len(profiling)} profiling phases "
                                   "(expected one)")
        phase = profiling[0]
        if phase.get("concurrency") is not None:
            concurrency = whole(phase["concurrency"], source, "input_config.phases[profiling].concurrency")
        rate = _rate(phase.get("rate"), source, "input_config.phases[profiling].rate")
    elif isinstance(config.get("loadgen"), Mapping):
        loadgen = config["loadgen"]
        if loadgen.get("concurrency") is not None:
            concurrency = whole(loadgen["concurrency"], source, "input_config.loadgen.concurrency")
        rate = _rate(loadgen.get("request_rate"), source, "input_config.loadgen.request_rate")
    else:
        raise MeasurementError(f"{source}: input_config has neither phases nor loadgen: the load it ran at is unknown")
    _load(concurrency, rate, source, "--concurrency or --request-rate")
    streamed = " (was the run streamed? TTFT and TPOT need --streaming)"
    models = (config.get("models") or {}).get("items") if isinstance(config.get("models"), Mapping) else None
    served = models[0].get("name") if isinstance(models, list) and models and isinstance(models[0], Mapping) else None
    if served is None:  # the layout before model items
        endpoint = config.get("endpoint")
        names = endpoint.get("model_names") if isinstance(endpoint, Mapping) else None
        served = names[0] if isinstance(names, list) and names else None
    requests = _optional_metric(doc, "request_count", "avg", source)
    return Measurement(
        deployment=deployment, concurrency=concurrency, request_rate=rate,
        isl=_metric(doc, "input_sequence_length", "avg", source),
        osl=_metric(doc, "output_sequence_length", "avg", source),
        ttft_ms=_metric(doc, "time_to_first_token", "avg", source, streamed),
        tpot_ms=_metric(doc, "inter_token_latency", "avg", source, streamed),
        ttft_p90_ms=_optional_metric(doc, "time_to_first_token", "p90", source),
        tpot_p90_ms=_optional_metric(doc, "inter_token_latency", "p90", source),
        requests=int(requests) if requests is not None else None,
        source=source, where="", tool="aiperf", served_model=str(served) if served else None)


def summary_point(doc: Mapping[str, Any], deployment: Deployment, source: str, where: str, tool: str) -> Measurement:
    """One `vllm bench serve` result or one SGLang bench_serving line (their summary keys are the same)."""
    origin = f"{source}, {where}" if where else source
    for key in ("mean_ttft_ms", "mean_tpot_ms", "completed", "total_input_tokens", "total_output_tokens"):
        if doc.get(key) is None:
            raise MeasurementError(f"{origin}: no {key}")
    completed = whole(doc["completed"], origin, "completed")
    cap = doc.get("max_concurrency")
    concurrency = whole(cap, origin, "max_concurrency") if cap is not None else None
    rate = _rate(doc.get("request_rate"), origin, "request_rate")
    _load(concurrency, rate, origin, "--max-concurrency or --request-rate")

    def optional(key: str) -> float | None:
        return number(doc[key], origin, key) if doc.get(key) is not None else None

    served = doc.get("model_id")
    return Measurement(
        deployment=deployment, concurrency=concurrency, request_rate=rate,
        isl=number(doc["total_input_tokens"], origin, "total_input_tokens") / completed,
        osl=number(doc["total_output_tokens"], origin, "total_output_tokens") / completed,
        ttft_ms=number(doc["mean_ttft_ms"], origin, "mean_ttft_ms"),
        tpot_ms=number(doc["mean_tpot_ms"], origin, "mean_tpot_ms"),
        ttft_p90_ms=optional("p90_ttft_ms"), tpot_p90_ms=optional("p90_tpot_ms"), requests=completed,
        source=source, where=where, tool=tool, served_model=str(served) if served else None)
