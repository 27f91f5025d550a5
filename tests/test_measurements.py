"""fidelity/readers: users' benchmark files as typed measured points.

The client files under tests/data/measurements/ were written by the real tools (AIPerf, `vllm bench serve`,
SGLang bench_serving) against the Dynamo mocker (scripts/make_measurement_fixtures.py; PRODUCED_BY.txt names the
versions); the deployment files by `spica sweep` on examples/configs/quickstart.yaml. Each reader must give back
exactly what the file says; each bad input must be one line naming the file and the line or field.
"""

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from spica_pipeline.errors import SpicaError
from spica_pipeline.fidelity.readers import (
    Deployment,
    MeasurementError,
    read_deployment,
    read_measurement_file,
    read_measurements,
)
from spica_pipeline.space.shapes import DisaggShape, RoleShape

DATA = Path(__file__).parent / "data" / "measurements"
AGG = DATA / "deploy" / "agg"
DISAGG = DATA / "deploy" / "disagg"
AIPERF_RUNS = {"c1": (1, None), "c4": (4, None), "rate4": (None, 4.0)}
SUMMARY_RUNS = [(1, None), (4, None), (None, 4.0)]  # vllm c1, c4, rate4; the SGLang lines in that order


@pytest.fixture(scope="module")
def agg() -> Deployment:
    return read_deployment(AGG / "simulation_record.yaml")


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


# ---- the formats -------------------------------------------------------------------------------------------

def test_csv_rows_read_as_written():
    points = read_measurements([DATA / "measurements.csv"])
    assert [p.where for p in points] == ["line 3", "line 4", "line 5"]
    first, _, moe = points
    assert (first.concurrency, first.request_rate, first.isl, first.osl, first.ttft_ms, first.tpot_ms) == (
        4, None, 2000.0, 200.0, 182.5, 14.25)
    d = first.deployment
    assert (d.model, d.system, d.backend, d.mode, d.precision) == ("Qwen/Qwen3-32B", "h200_sxm", "vllm", "agg", ())
    assert d.shape == RoleShape(tp=2)
    assert moe.deployment.shape == RoleShape(tp=2, attention_dp=2, moe_tp=1, moe_ep=4)
    assert moe.deployment.precision_dict == {"weights": "fp8", "kv_cache": "fp8"}
    assert moe.deployment.key == ("Qwen/Qwen3-30B-A3B", "h200_sxm", "sglang", (("kv_cache", "fp8"), ("weights", "fp8")))
    assert all(p.tool == "csv" and p.ttft_p90_ms is None for p in points)


@pytest.mark.parametrize("run", sorted(AIPERF_RUNS))
def test_aiperf_export_reads_what_the_file_says(run, agg):
    path = DATA / "aiperf" / run / "profile_export_aiperf.json"
    doc = _json(path)
    (point,) = read_measurement_file(path, agg)
    assert (point.concurrency, point.request_rate) == AIPERF_RUNS[run]
    assert point.isl == doc["input_sequence_length"]["avg"] and point.osl == doc["output_sequence_length"]["avg"]
    assert point.ttft_ms == doc["time_to_first_token"]["avg"] and point.tpot_ms == doc["inter_token_latency"]["avg"]
    assert point.ttft_p90_ms == doc["time_to_first_token"]["p90"]
    assert point.tpot_p90_ms == doc["inter_token_latency"]["p90"]
    assert point.requests == doc["request_count"]["avg"] == 8
    assert (point.tool, point.where, point.served_model, point.deployment) == ("aiperf", "", "Qwen/Qwen3-32B", agg)


@pytest.mark.parametrize("run,load", list(zip(("c1", "c4", "rate4"), SUMMARY_RUNS)))
def test_vllm_save_result_reads_what_the_file_says(run, load, agg):
    path = DATA / "vllm" / f"{run}.json"
    doc = _json(path)
    (point,) = read_measurement_file(path, agg)
    assert (point.concurrency, point.request_rate) == load
    assert point.isl == doc["total_input_tokens"] / doc["completed"] == 128
    assert point.osl == doc["total_output_tokens"] / doc["completed"] == 32
    assert (point.ttft_ms, point.tpot_ms) == (doc["mean_ttft_ms"], doc["mean_tpot_ms"])
    assert (point.ttft_p90_ms, point.tpot_p90_ms) == (doc["p90_ttft_ms"], doc["p90_tpot_ms"])
    assert (point.tool, point.requests, point.served_model) == ("vllm", 8, "Qwen/Qwen3-32B")


def test_sglang_jsonl_reads_one_point_per_line(agg):
    path = DATA / "sglang" / "bench_serving.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    points = read_measurement_file(path, agg)
    assert [p.where for p in points] == ["line 1", "line 2", "line 3"]
    for point, doc, load in zip(points, lines, SUMMARY_RUNS):
        assert (point.concurrency, point.request_rate) == load
        assert point.isl == doc["total_input_tokens"] / doc["completed"]
        assert point.osl == doc["total_output_tokens"] / doc["completed"]
        assert (point.ttft_ms, point.tpot_ms, point.ttft_p90_ms, point.tpot_p90_ms) == (
            doc["mean_ttft_ms"], doc["mean_tpot_ms"], doc["p90_ttft_ms"], doc["p90_tpot_ms"])
        assert point.tool == "sglang" and point.served_model is None and point.origin == f"{path}, {point.where}"


def test_read_measurements_keeps_order_and_expands_an_aiperf_folder():
    points = read_measurements([DATA / "aiperf", DATA / "vllm" / "c1.json"], AGG / "simulation_record.yaml")
    assert [(p.tool, Path(p.source).parent.name) for p in points] == [
        ("aiperf", "c1"), ("aiperf", "c4"), ("aiperf", "rate4"), ("vllm", "vllm")]
    assert len({p.campaign for p in points}) == 4  # one source file each


def test_aiperf_loadgen_layout_of_earlier_versions(tmp_path, agg):
    doc = _json(DATA / "aiperf" / "c4" / "profile_export_aiperf.json")
    config = doc["input_config"]
    doc["input_config"] = {"endpoint": {"model_names": ["Qwen/Qwen3-32B"], "type": "chat", "streaming": True},
                           "loadgen": {"concurrency": 4, "request_count": 8}}
    assert "phases" in config
    path = tmp_path / "profile_export_aiperf.json"
    path.write_text(json.dumps(doc))
    (point,) = read_measurement_file(path, agg)
    assert (point.concurrency, point.request_rate, point.served_model) == (4, None, "Qwen/Qwen3-32B")


# ---- deployments -------------------------------------------------------------------------------------------

def test_record_manifest_and_one_candidate_config_name_the_same_deployment(agg):
    from_dgd = read_deployment(AGG / "dgd.yaml")
    from_config = read_deployment(DATA / "one_candidate.yaml")
    assert agg == replace(from_dgd, source=agg.source)
    assert (agg.model, agg.system, agg.backend, agg.mode, agg.shape) == (
        "Qwen/Qwen3-32B", "h200_sxm", "vllm", "agg", RoleShape(tp=2))
    assert (from_config.key, from_config.shape, from_config.mode) == (agg.key, agg.shape, agg.mode)
    assert agg.sample is not None and agg.sample["tp"] == 2 and from_config.sweep_config is not None
    assert agg.pin() == {"tp": 2, "pp": 1, "attention_dp": 1, "moe_tp": 1, "moe_ep": 1, "replicas": 1}
    assert agg.gpus == 2


def test_disagg_record_and_manifest():
    record = read_deployment(DISAGG / "simulation_record.yaml")
    manifest = read_deployment(DISAGG / "dgd.yaml")
    assert record.mode == manifest.mode == "disagg"
    assert record.shape == manifest.shape == DisaggShape(RoleShape(tp=2), RoleShape(tp=1))
    assert set(record.roles()) == {"prefill", "decode"} and "prefill 1 x tp2 + decode 1 x tp1" in record.describe()


def test_a_min_gpus_fleet_multiplies_the_record_workers(tmp_path):
    doc = yaml.safe_load((AGG / "simulation_record.yaml").read_text())
    doc["expected"]["metrics"]["fleet_replicas"] = 3.0
    path = tmp_path / "simulation_record.yaml"
    path.write_text(yaml.safe_dump(doc))
    d = read_deployment(path)
    assert d.fleet == 3 and d.shape == RoleShape(tp=2, replicas=3) and d.gpus == 6


def _to_sglang_moe(manifest: dict) -> dict:
    """The agg manifest as SGLang would run Qwen3-30B-A3B: tp 4 over 2 attention-DP ranks, ep 4, 2 replicas."""
    manifest["spec"]["backendFramework"] = "sglang"
    worker = next(c for c in manifest["spec"]["components"] if c["type"] == "worker")
    worker["replicas"] = 2
    worker["podTemplate"]["spec"]["containers"][0]["args"] = [
        "--model-path", "Qwen/Qwen3-30B-A3B", "--tp-size", "4", "--dp-size", "2", "--enable-dp-attention",
        "--ep-size", "4", "--max-running-requests", "64"]
    return manifest


def _to_v1alpha1(manifest: dict) -> dict:
    services = {}
    for c in manifest["spec"]["components"]:
        main = c["podTemplate"]["spec"]["containers"][0]
        kind = "worker" if c["type"] in ("prefill", "decode") else c["type"]
        svc = {"componentType": kind, "replicas": c["replicas"], "extraPodSpec": {"mainContainer": main}}
        if c["type"] in ("prefill", "decode"):
            svc["subComponentType"] = c["type"]
        services[c["name"]] = svc
    return {"apiVersion": "nvidia.com/v1alpha1", "kind": manifest["kind"], "metadata": manifest["metadata"],
            "spec": {"backendFramework": manifest["spec"]["backendFramework"], "services": services}}


def test_manifest_in_sglang_words_reads_back_the_canonical_moe_shape(tmp_path):
    doc = _to_sglang_moe(yaml.safe_load((AGG / "dgd.yaml").read_text()))
    record = yaml.safe_load((AGG / "simulation_record.yaml").read_text())
    record.update({"model": "Qwen/Qwen3-30B-A3B", "backend": "sglang"})
    (tmp_path / "simulation_record.yaml").write_text(yaml.safe_dump(record))
    (tmp_path / "dgd.yaml").write_text(yaml.safe_dump(doc))
    d = read_deployment(tmp_path / "dgd.yaml")
    assert (d.model, d.backend, d.system) == ("Qwen/Qwen3-30B-A3B", "sglang", "h200_sxm")
    assert d.shape == RoleShape(tp=2, attention_dp=2, moe_tp=1, moe_ep=4, replicas=2)
    (tmp_path / "dgd.yaml").write_text(yaml.safe_dump(_to_v1alpha1(doc)))
    assert read_deployment(tmp_path / "dgd.yaml").shape == d.shape


def test_v1alpha1_disagg_manifest(tmp_path):
    shutil.copyfile(DISAGG / "simulation_record.yaml", tmp_path / "simulation_record.yaml")
    doc = _to_v1alpha1(yaml.safe_load((DISAGG / "dgd.yaml").read_text()))
    (tmp_path / "dgd.yaml").write_text(yaml.safe_dump(doc))
    assert read_deployment(tmp_path / "dgd.yaml").shape == DisaggShape(RoleShape(tp=2), RoleShape(tp=1))


def test_one_candidate_config_in_vllm_words(tmp_path):
    doc = yaml.safe_load((DATA / "one_candidate.yaml").read_text())
    doc["search_space"].update({"model_name": "Qwen/Qwen3-30B-A3B", "gpu_budget": 4,
                                "precision": {"weights": "fp8"},
                                "parallel_configs": [{"tp": 2, "data_parallel": 2, "enable_expert_parallel": True}]})
    path = tmp_path / "one.yaml"
    path.write_text(yaml.safe_dump(doc))
    d = read_deployment(path)
    assert d.shape == RoleShape(tp=2, attention_dp=2, moe_tp=1, moe_ep=4) and d.precision == (("weights", "fp8"),)


# ---- bad input: one line naming the file and the line or field ----------------------------------------------

def _error(fn, *args) -> str:
    with pytest.raises(MeasurementError) as info:
        fn(*args)
    text = str(info.value)
    assert "\n" not in text and "Traceback" not in text
    return text


CSV_HEADER = "model,system,backend,precision,tp,pp,attention_dp,moe_tp,moe_ep,concurrency,isl,osl,ttft_ms,tpot_ms"
CSV_ROW = "Qwen/Qwen3-32B,h200_sxm,vllm,,2,1,1,1,1,4,2000,200,182.5,14.25"


@pytest.mark.parametrize("text,expected", [
    (CSV_HEADER.replace(",tpot_ms", "") + "\n" + CSV_ROW.rsplit(",", 1)[0] + "\n", "line 1: missing column tpot_ms"),
    (CSV_HEADER + "\n" + CSV_ROW.replace("182.5", "fast") + "\n", "line 2: ttft_ms: 'fast' is not a number"),
    (CSV_HEADER + "\n" + CSV_ROW + "\n" + CSV_ROW.replace(",14.25", ",-3") + "\n",
     "line 3: tpot_ms: '-3' must be above 0"),
    (CSV_HEADER + "\n" + CSV_ROW.replace(",2,1,1,1,1,", ",2.5,1,1,1,1,") + "\n",
     "line 2: tp: '2.5' is not a whole number"),
    (CSV_HEADER + "\n" + CSV_ROW.replace(",,", ",fp8,", 1) + "\n", "line 2: precision: 'fp8' is not field=mode pairs"),
    (CSV_HEADER + "\n" + CSV_ROW.replace(",,", ",weights=fp9,", 1) + "\n", "line 2: precision: weights:"),
    (CSV_HEADER + "\n" + CSV_ROW.replace(",vllm,", ",tensorrt,") + "\n", "line 2: backend: 'tensorrt' is not one of"),
    (CSV_HEADER + ",ttft_p95\n" + CSV_ROW + ",1\n", "line 1: unknown column 'ttft_p95'"),
    (CSV_HEADER + "\n" + CSV_ROW + ",1\n", "line 2: 15 cells but the header has 14 columns"),
    (CSV_HEADER + "\n", "a header but no measured row"),
    (CSV_HEADER + "\n" + CSV_ROW.replace("Qwen/Qwen3-32B", "") + "\n", "line 2: model: empty"),
])
def test_bad_csv(tmp_path, text, expected):
    path = tmp_path / "mine.csv"
    path.write_text(text)
    message = _error(read_measurements, [path])
    assert message.startswith(str(path)) and expected in message


def _mutated(tmp_path: Path, source: Path, change, name: str | None = None) -> Path:
    doc = _json(source)
    change(doc)
    path = tmp_path / (name or source.name)
    path.write_text(json.dumps(doc))
    return path


AIPERF_C1 = DATA / "aiperf" / "c1" / "profile_export_aiperf.json"
VLLM_C1 = DATA / "vllm" / "c1.json"


@pytest.mark.parametrize("source,change,expected", [
    (AIPERF_C1, lambda d: d.pop("time_to_first_token"), "no time_to_first_token.avg (was the run streamed?"),
    (AIPERF_C1, lambda d: d["inter_token_latency"].update(avg="n/a"), "inter_token_latency.avg: 'n/a' is not a number"),
    (AIPERF_C1, lambda d: d["input_config"].pop("phases"), "input_config has neither phases nor loadgen"),
    (AIPERF_C1, lambda d: d.update(was_cancelled=True), "was_cancelled is true"),
    (AIPERF_C1, lambda d: d["input_config"]["phases"][1].update(concurrency=0),
     "input_config.phases[profiling].concurrency: 0 must be above 0"),
    (VLLM_C1, lambda d: d.update(mean_ttft_ms="abc"), "mean_ttft_ms: 'abc' is not a number"),
    (VLLM_C1, lambda d: d.pop("total_input_tokens"), "no total_input_tokens"),
    (VLLM_C1, lambda d: d.update(max_concurrency=None), "records neither a concurrency nor a finite request rate"),
    (VLLM_C1, lambda d: d.update(model_id="meta-llama/Llama-3.1-8B"),
     "measured model 'meta-llama/Llama-3.1-8B' but the deployment"),
    (VLLM_C1, lambda d: d.pop("model_id"), "not a measurement file of a known format"),
])
def test_bad_client_files(tmp_path, agg, source, change, expected):
    path = _mutated(tmp_path, source, change)
    message = _error(read_measurement_file, path, agg)
    assert message.startswith(str(path)) and expected in message


def test_bad_jsonl_lines_are_named(tmp_path, agg):
    lines = (DATA / "sglang" / "bench_serving.jsonl").read_text().splitlines()
    path = tmp_path / "bench.jsonl"
    path.write_text("\n".join([lines[0], lines[1][:40], lines[2]]) + "\n")
    assert f"{path}, line 2: not JSON" in _error(read_measurement_file, path, agg)
    third = json.loads(lines[2])
    del third["completed"]
    path.write_text("\n".join([lines[0], lines[1], json.dumps(third)]) + "\n")
    assert f"{path}, line 3: no completed" in _error(read_measurement_file, path, agg)


def test_client_file_without_a_deployment():
    message = _error(read_measurements, [AIPERF_C1])
    assert message.startswith(str(AIPERF_C1)) and "does not say which deployment it measured" in message


@pytest.mark.parametrize("content,expected", [
    ("hello world\n", "not a measurement file of a known format"),
    ("", "empty"),
    ('{"foo": 1}', "not a measurement file of a known format"),
    ("Metric,avg,min,max,sum,p1,p5,p10,p25,p50,p75,p90,p95,p99,std\n", "AIPerf's CSV export does not record the load"),
])
def test_files_of_no_known_format(tmp_path, content, expected):
    path = tmp_path / "some.file"
    path.write_text(content)
    message = _error(read_measurements, [path], AGG / "simulation_record.yaml")
    assert message.startswith(str(path)) and expected in message


def test_missing_file_and_empty_folder(tmp_path):
    assert "does not exist" in _error(read_measurements, [tmp_path / "nope.json"])
    assert f"measurement folder {tmp_path} holds no profile_export_aiperf.json" in _error(read_measurements, [tmp_path])
    assert "no measurement file given" in _error(read_measurements, [])


def _record_without(tmp_path: Path, field: str) -> Path:
    doc = yaml.safe_load((AGG / "simulation_record.yaml").read_text())
    del doc[field]
    path = tmp_path / "simulation_record.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("field", ["model", "hardware_sku", "backend"])
def test_record_that_does_not_say_model_system_backend(tmp_path, field):
    path = _record_without(tmp_path, field)
    message = _error(read_deployment, path)
    assert str(path) in message and f"{field} is missing" in message


def test_manifest_without_its_record_names_the_missing_system(tmp_path):
    shutil.copyfile(AGG / "dgd.yaml", tmp_path / "dgd.yaml")
    message = _error(read_deployment, tmp_path / "dgd.yaml")
    assert str(tmp_path / "dgd.yaml") in message and "does not name the system (hardware_sku)" in message


def test_manifest_beside_another_pick_record(tmp_path):
    doc = yaml.safe_load((AGG / "simulation_record.yaml").read_text())
    doc["model"] = "Qwen/Qwen3-8B"
    (tmp_path / "simulation_record.yaml").write_text(yaml.safe_dump(doc))
    shutil.copyfile(AGG / "dgd.yaml", tmp_path / "dgd.yaml")
    assert "serves Qwen/Qwen3-32B on vllm but" in _error(read_deployment, tmp_path / "dgd.yaml")


def test_manifest_without_backend(tmp_path):
    shutil.copyfile(AGG / "simulation_record.yaml", tmp_path / "simulation_record.yaml")
    doc = yaml.safe_load((AGG / "dgd.yaml").read_text())
    del doc["spec"]["backendFramework"]
    (tmp_path / "dgd.yaml").write_text(yaml.safe_dump(doc))
    assert "spec.backendFramework is missing" in _error(read_deployment, tmp_path / "dgd.yaml")


@pytest.mark.parametrize("change,expected", [
    (lambda s: s.update(backend=["vllm", "sglang"]), "search_space.backend lists 2 entries"),
    (lambda s: s.pop("hardware_sku"), "hardware_sku"),
    (lambda s: s.update(parallel_configs=[{"tp": 2}, {"tp": 1}]), "search_space.parallel_configs lists 2 entries"),
    (lambda s: s.update(model_name="acme/no-such-model"), "acme/no-such-model"),
])
def test_one_candidate_config_that_is_not_one(tmp_path, change, expected):
    doc = yaml.safe_load((DATA / "one_candidate.yaml").read_text())
    change(doc["search_space"])
    path = tmp_path / "one.yaml"
    path.write_text(yaml.safe_dump(doc))
    message = _error(read_deployment, path)
    assert str(path) in message and expected in message


def test_deployment_file_of_no_known_kind(tmp_path):
    path = tmp_path / "what.yaml"
    path.write_text("kind: Pod\n")
    assert "not a simulation_record.yaml" in _error(read_deployment, path)
    path.write_text("[1, 2]\n")
    assert "expected a YAML mapping" in _error(read_deployment, path)
    path.write_text("a: [\n")
    assert "malformed YAML" in _error(read_deployment, path)


def test_errors_exit_two_at_the_cli():
    assert issubclass(MeasurementError, SpicaError) and MeasurementError.exit_code == 2
