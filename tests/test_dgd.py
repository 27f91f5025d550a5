"""DGD manifests: agg/disagg x vLLM/SGLang x TP/DEP/TEP validate against the vendored CRD schema subset
and flag lists; multinode when an engine outgrows a node; the deploy folder layout."""

import json

import pytest
import yaml

from spica_pipeline.report import dgd
from spica_pipeline.report.dgd import DeployOptions, dgd_manifest, manifest_gpus, validate_manifest
from spica_pipeline.space.candidate import Candidate

# shape name -> (tp, attention_dp, moe_tp, moe_ep): TP, data+expert parallel (DEP), TP + expert parallel (TEP)
SHAPES = {"TP": (4, 1, 4, 1), "DEP": (1, 8, 1, 8), "TEP": (8, 1, 1, 8)}


def sample(mode: str, backend: str, shape: str, **over):
    tp, dp, mtp, mep = SHAPES[shape]
    s = {"deployment_mode": mode, "backend": backend, "backend_version": "0.12.0",
         "model_name": "deepseek-ai/DeepSeek-V3", "hardware_sku": "h200_sxm", "router_mode": "round_robin",
         "enable_throughput_scaling": False, "enable_load_scaling": False}
    roles = ("agg",) if mode == "agg" else ("prefill", "decode")
    for role in roles:
        p = "" if role == "agg" else f"{role}_"
        s.update({f"{p}tp": tp, f"{p}pp": 1, f"{p}attention_dp": dp, f"{p}moe_tp": mtp, f"{p}moe_ep": mep,
                  f"{p}replicas": 2,
                  f"{role}_max_num_seqs": 256, f"{role}_max_num_batched_tokens": 8192, f"{role}_block_size": 64,
                  f"{role}_gpu_memory_utilization": 0.9, f"{role}_enable_prefix_caching": role != "decode"})
    s.update(over)
    return Candidate.from_dict(s)


def args_of(doc, component_type):
    for c in doc["spec"]["components"]:
        if c["type"] == component_type:
            return c["podTemplate"]["spec"]["containers"][0]["args"], c
    raise AssertionError(component_type)


@pytest.mark.parametrize("api", ["v1beta1", "v1alpha1"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("backend", ["vllm", "sglang"])
@pytest.mark.parametrize("mode", ["agg", "disagg"])
def test_every_combination_validates(mode, backend, shape, api):
    cfg = sample(mode, backend, shape)
    doc = dgd_manifest(cfg, name="spica-test-1", options=DeployOptions(api_version=api, gpus_per_node=8))
    assert validate_manifest(doc) == []
    assert doc["apiVersion"] == f"nvidia.com/{api}" and doc["kind"] == "DynamoGraphDeployment"
    per_engine = SHAPES[shape][0] * SHAPES[shape][1]
    assert manifest_gpus(doc) == per_engine * 2 * (1 if mode == "agg" else 2)
    yaml.safe_load(yaml.safe_dump(doc))  # plain YAML


def test_v1beta1_layout_and_vllm_flags():
    doc = dgd_manifest(sample("disagg", "vllm", "DEP"), name="x-1", options=DeployOptions(gpus_per_node=8))
    types = [c["type"] for c in doc["spec"]["components"]]
    assert types == ["frontend", "prefill", "decode"]
    args, comp = args_of(doc, "prefill")
    main = comp["podTemplate"]["spec"]["containers"][0]
    assert main["name"] == "main" and main["command"] == ["python3", "-m", "dynamo.vllm"]
    assert main["image"] == f"nvcr.io/nvidia/ai-dynamo/vllm-runtime:{dgd.DYNAMO_VERSION}"
    assert main["resources"] == {"limits": {"nvidia.com/gpu": "8"}} and comp["replicas"] == 2
    a = " ".join(args)
    for flag in ("--tensor-parallel-size 1", "--data-parallel-size 8", "--enable-expert-parallel",
                 "--max-num-seqs 256", "--max-num-batched-tokens 8192", "--gpu-memory-utilization 0.9",
                 "--disaggregation-mode prefill", "--kv-transfer-config"):
        assert flag in a
    cfg = json.loads(args[args.index("--kv-transfer-config") + 1])
    assert cfg["kv_connector"] == "NixlConnector"
    d_args, _ = args_of(doc, "decode")
    assert "--no-enable-prefix-caching" in d_args


def test_sglang_dp_attention_means_whole_engine_tp():
    """SGLang's tp is the engine's GPU count: tp 1 x attention_dp 8 is --tp-size 8 --dp-size 8 --enable-dp-attention."""
    doc = dgd_manifest(sample("agg", "sglang", "DEP"), name="x-1", options=DeployOptions(gpus_per_node=8))
    args, comp = args_of(doc, "worker")
    a = " ".join(args)
    assert "--tp-size 8" in a and "--dp-size 8" in a and "--enable-dp-attention" in args and "--ep-size 8" in a
    assert "--max-running-requests 256" in a and "--chunked-prefill-size 8192" in a
    assert "--mem-fraction-static 0.9" in a and "--page-size 64" in a
    assert "gpu_memory_utilization" not in a and "--max-num-seqs" not in a
    assert comp["podTemplate"]["spec"]["containers"][0]["command"] == ["python3", "-m", "dynamo.sglang"]


def test_multinode_when_engine_spans_nodes():
    cfg = sample("agg", "vllm", "TP", tp=16, moe_tp=16)
    doc = dgd_manifest(cfg, name="x-1", options=DeployOptions(gpus_per_node=8))
    _, comp = args_of(doc, "worker")
    assert comp["multinode"] == {"nodeCount": 2}
    assert comp["podTemplate"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert validate_manifest(doc) == [] and manifest_gpus(doc) == 16 * 2
    small = dgd_manifest(sample("agg", "vllm", "TP"), name="x-1", options=DeployOptions(gpus_per_node=8))
    assert "multinode" not in args_of(small, "worker")[1]
    alpha = dgd_manifest(cfg, name="x-1", options=DeployOptions(api_version="v1alpha1", gpus_per_node=4))
    svc = alpha["spec"]["services"]["VllmWorker"]
    assert svc["multinode"] == {"nodeCount": 4} and svc["resources"]["limits"]["gpu"] == "4"
    assert validate_manifest(alpha) == []


def test_kv_router_settings_become_frontend_flags():
    cfg = sample("agg", "vllm", "TP", router_mode="kv_router", overlap_score_credit=0.5, prefill_load_scale=2.0,
                 router_temperature=0.1)
    doc = dgd_manifest(cfg, name="x-1")
    args, comp = args_of(doc, "frontend")
    a = " ".join(args)
    assert "--router-mode kv" in a and "--router-kv-overlap-score-credit 0.5" in a
    assert "--router-prefill-load-scale 2.0" in a and "--router-temperature 0.1" in a
    assert "--kv-cache-block-size 64" in a
    assert "resources" not in comp["podTemplate"]["spec"]["containers"][0]
    rr = args_of(dgd_manifest(sample("agg", "vllm", "TP"), name="x-1"), "frontend")[0]
    assert rr[rr.index("--router-mode") + 1] == "round-robin"


def test_planner_component_when_scaling_is_on():
    cfg = sample("disagg", "vllm", "TP", enable_throughput_scaling=True, planner_scaling_policy="throughput_60_5")
    doc = dgd_manifest(cfg, name="x-1", planner_config={"optimization_target": "throughput", "mode": "disagg",
                                                        "enable_throughput_scaling": True,
                                                        "live_dashboard_port": 0})
    args, comp = args_of(doc, "planner")
    body = json.loads(args[1])
    assert body["environment"] == "kubernetes" and body["backend"] == "vllm" and "live_dashboard_port" not in body
    assert comp["podTemplate"]["spec"]["containers"][0]["image"].endswith(f"dynamo-planner:{dgd.DYNAMO_VERSION}")
    assert validate_manifest(doc) == []


def test_precision_seam_maps_to_both_backends():
    for backend, kv in (("vllm", "fp8"), ("sglang", "fp8_e4m3")):
        doc = dgd_manifest(sample("agg", backend, "TP", precision_weights="fp8", precision_kv_cache="fp8"),
                           name="x-1")
        a = " ".join(args_of(doc, "worker")[0])
        assert "--quantization fp8" in a and f"--kv-cache-dtype {kv}" in a
        assert validate_manifest(doc) == []


def test_validation_catches_invented_fields_and_flags():
    doc = dgd_manifest(sample("agg", "vllm", "TP"), name="x-1")
    doc["spec"]["components"][1]["gpus"] = 4
    doc["spec"]["components"][1]["podTemplate"]["spec"]["containers"][0]["args"].append("--max-num-seq")
    doc["spec"]["components"][1]["type"] = "aggregated"
    problems = " | ".join(validate_manifest(doc))
    assert "'gpus' is not in the CRD schema" in problems
    assert "no flag --max-num-seq" in problems
    assert "'aggregated' is not one of" in problems
    assert validate_manifest({"apiVersion": "nvidia.com/v2", "kind": "DynamoGraphDeployment"})


def test_names_are_dns_labels():
    name = dgd.manifest_name("Qwen/Qwen3-235B-A22B_FP8" + "x" * 80, 10, "disagg")
    assert len(name) <= 63 and name.endswith("-disagg-10") and name == name.lower()


def test_custom_image_without_a_version_tag_gets_the_runtime_version():
    cfg = sample("agg", "vllm", "TP")
    doc = dgd_manifest(cfg, name="x-1", options=DeployOptions(image="registry.local/dynamo:latest"))
    assert {c["runtimeVersionOverride"] for c in doc["spec"]["components"]} == {dgd.DYNAMO_VERSION}
    assert validate_manifest(doc) == []
    tagged = dgd_manifest(cfg, name="x-1", options=DeployOptions(image="registry.local/dynamo:1.6.1"))
    assert all("runtimeVersionOverride" not in c for c in tagged["spec"]["components"])
