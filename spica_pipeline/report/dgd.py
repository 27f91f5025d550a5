"""DynamoGraphDeployment (DGD) manifests for the picks: what `kubectl apply` takes.

Built from the candidate alone (space/candidate.py), the way the replay saw it: one Frontend carrying the
router mode and settings as `dynamo.frontend` flags, one component per worker role with its replica
count and `nvidia.com/gpu` per pod, `python3 -m dynamo.vllm` / `dynamo.sglang` with the backend's
own flag names, a Planner when a scaling policy is on, and `multinode` when an engine spans more GPUs
than one node of the hardware has. With prefill and decode on two GPU types each worker service selects
its type's nodes (`nodeSelector` on the GPU product label GPU Feature Discovery sets) and sizes its pods
by that type's node. Every manifest is checked against the vendored CRD schema subset and flag lists in
`dgd_data/` (see SOURCES.md) before it is written.
"""

import json
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Mapping

from spica_pipeline.errors import ModelHardwareError
from spica_pipeline.space.candidate import ADMISSION_FIELDS, Candidate, Role
from spica_pipeline.space.model_hw import hardware_facts

API_VERSIONS = ("v1beta1", "v1alpha1")
DEFAULT_API_VERSION = "v1beta1"
# The Dynamo runtime this project pins (ai-dynamo-runtime==1.6.1): its images run the same code.
DYNAMO_VERSION = "1.6.1"
IMAGE_REPO = "nvcr.io/nvidia/ai-dynamo"
DEFAULT_HF_SECRET = "hf-token-secret"
FRONTEND_PORT = 8000
_SEMVER_TAG = re.compile(r":v?\d+\.\d+\.\d+[^/:]*$")

_ROUTER_MODE = {"kv_router": "kv", "kv": "kv", "round_robin": "round-robin", "random": "random"}
# KV router knob or admission scalar -> dynamo.frontend flag (Frontend Configuration Reference, router section)
_ROUTER_FLAGS = (
    ("overlap_score_credit", "--router-kv-overlap-score-credit"),
    ("prefill_load_scale", "--router-prefill-load-scale"),
    ("router_temperature", "--router-temperature"),
    ("host_cache_hit_weight", "--router-host-cache-hit-weight"),
    ("disk_cache_hit_weight", "--router-disk-cache-hit-weight"),
    ("active_decode_blocks_threshold", "--active-decode-blocks-threshold"),
    ("active_prefill_tokens_threshold", "--active-prefill-tokens-threshold"),
    ("active_prefill_tokens_threshold_frac", "--active-prefill-tokens-threshold-frac"),
)
# planner config keys that only the offline replay planner reads; a cluster planner is not given them
_REPLAY_ONLY_PLANNER_KEYS = ("report_interval_hours", "live_dashboard_port",
                             "metric_pulling_prometheus_extra_query_params")
_MODULES = {"vllm": "dynamo.vllm", "sglang": "dynamo.sglang"}
# The backends this writer renders a manifest for (the sweep's preflight refuses any other).
DEPLOY_BACKENDS: tuple[str, ...] = tuple(_MODULES)
_COMPONENT_NAMES = {
    "vllm": {"agg": "VllmWorker", "prefill": "VllmPrefillWorker", "decode": "VllmDecodeWorker"},
    "sglang": {"agg": "SglangWorker", "prefill": "SglangPrefillWorker", "decode": "SglangDecodeWorker"},
}
# search_space.precision -> engine flags, only where the flag value is certain for both engines:
# fp8 weights are `--quantization fp8` in vLLM and SGLang; an fp8 KV cache is `--kv-cache-dtype fp8` in
# vLLM and `fp8_e4m3` in SGLang. Other modes come from the checkpoint's own quantization config, so no
# flag is written for them (the simulation record still names them).
QUANTIZATION_FLAGS = {"fp8": "fp8"}
# speculative method -> SGLang's --speculative-algorithm (NEXTN runs the checkpoint's MTP layers)
_SGLANG_SPECULATIVE = {"mtp": "NEXTN", "eagle3": "EAGLE3"}
KV_CACHE_DTYPE_FLAGS = {"vllm": {"fp8": "fp8"}, "sglang": {"fp8": "fp8_e4m3"}}
# The node label NVIDIA GPU Feature Discovery sets to the GPU's product name (nvidia-smi's, spaces as dashes)
# and its value per AIC system (dgd_data/SOURCES.md); a worker on its own GPU type selects nodes by it.
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_PRODUCTS = {
    "a100_sxm": "NVIDIA-A100-SXM4-80GB", "b200_sxm": "NVIDIA-B200", "b300_sxm": "NVIDIA-B300-SXM6-AC",
    "gb200": "NVIDIA-GB200", "gb300": "NVIDIA-GB300", "h100_sxm": "NVIDIA-H100-80GB-HBM3", "h200_sxm": "NVIDIA-H200",
    "l40s": "NVIDIA-L40S", "rtx_pro_6000_server": "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition",
}


@dataclass(frozen=True)
class DeployOptions:
    """How to render manifests: API version, images and the node size that decides multinode."""

    api_version: str = DEFAULT_API_VERSION
    image: str | None = None
    planner_image: str | None = None
    gpus_per_node: int | None = None
    hf_token_secret: str | None = DEFAULT_HF_SECRET
    # The model the workers load and the Frontend serves; None: the candidate's model.
    served_model: str | None = None

    def __post_init__(self) -> None:
        if self.api_version not in API_VERSIONS:
            raise ValueError(f"DGD api_version must be one of {list(API_VERSIONS)}, got {self.api_version!r}")


def default_image(backend: str) -> str:
    """The Dynamo runtime image of a backend, at the Dynamo version this project pins."""
    return f"{IMAGE_REPO}/{backend}-runtime:{DYNAMO_VERSION}"


def default_planner_image() -> str:
    return f"{IMAGE_REPO}/dynamo-planner:{DYNAMO_VERSION}"


# --------------------------------------------------------------------------- engine arguments

def _fmt(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def vllm_args(c: Candidate, role: Role) -> list[str]:
    """vLLM flag names: TP/PP/DP sizes, expert parallel for MoE EP, batching and memory knobs."""
    s, e = role.shape, role.engine
    args = ["--model", str(c.model)]
    if role.name != "agg":
        args += ["--disaggregation-mode", role.name]
    args += ["--tensor-parallel-size", str(s.tp)]
    if s.pp > 1:
        args += ["--pipeline-parallel-size", str(s.pp)]
    if s.attention_dp > 1:
        args += ["--data-parallel-size", str(s.attention_dp)]
    if s.moe_ep > 1:
        args.append("--enable-expert-parallel")
    args += ["--max-num-seqs", _fmt(e.max_num_seqs), "--max-num-batched-tokens", _fmt(e.max_num_batched_tokens),
             "--gpu-memory-utilization", _fmt(e.gpu_memory_utilization), "--block-size", _fmt(e.block_size)]
    args.append("--enable-prefix-caching" if e.enable_prefix_caching else "--no-enable-prefix-caching")
    if role.name != "agg":
        args += ["--kv-transfer-config", json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"})]
    args += _precision_args(c)
    if c.draft_method:  # every role: a disaggregated pair must agree on the draft layers' KV
        spec: dict[str, Any] = {"method": c.draft_method, "num_speculative_tokens": c.draft_tokens}
        if c.draft_method == "eagle3":
            spec["model"] = c.speculative_draft_model
        args += ["--speculative-config", json.dumps(spec)]
    return args


def sglang_args(c: Candidate, role: Role) -> list[str]:
    """SGLang flag names. SGLang's TP is the engine's whole GPU count; attention DP splits it."""
    s, e = role.shape, role.engine
    args = ["--model-path", str(c.model), "--tp-size", str(s.tp * s.attention_dp)]
    if s.pp > 1:
        args += ["--pp-size", str(s.pp)]
    if s.attention_dp > 1:
        args += ["--dp-size", str(s.attention_dp), "--enable-dp-attention"]
    if s.moe_ep > 1:
        args += ["--ep-size", str(s.moe_ep)]
    args += ["--max-running-requests", _fmt(e.max_num_seqs), "--chunked-prefill-size", _fmt(e.max_num_batched_tokens),
             "--mem-fraction-static", _fmt(e.gpu_memory_utilization), "--page-size", _fmt(e.block_size)]
    if e.enable_prefix_caching is False:
        args.append("--disable-radix-cache")
    if role.name != "agg":
        args += ["--disaggregation-mode", role.name, "--disaggregation-transfer-backend", "nixl"]
    args += _precision_args(c)
    if c.draft_method:  # a chain of k drafts (top-k 1) verified as k + 1 tokens, as the replay models it
        args += ["--speculative-algorithm", _SGLANG_SPECULATIVE[c.draft_method]]
        if c.draft_method == "eagle3":
            args += ["--speculative-draft-model-path", str(c.speculative_draft_model)]
        args += ["--speculative-num-steps", str(c.draft_tokens), "--speculative-eagle-topk", "1",
                 "--speculative-num-draft-tokens", str(c.draft_tokens + 1)]
    return args


def _precision_args(c: Candidate) -> list[str]:
    """`--quantization` / `--kv-cache-dtype` for the candidate's precision where the flag value is known."""
    out: list[str] = []
    weights = QUANTIZATION_FLAGS.get(c.precision.get("weights", ""))
    if weights:
        out += ["--quantization", weights]
    kv = KV_CACHE_DTYPE_FLAGS.get(c.backend, {}).get(c.precision.get("kv_cache", ""))
    if kv:
        out += ["--kv-cache-dtype", kv]
    return out


def engine_args(c: Candidate, role: Role) -> list[str]:
    if c.backend == "vllm":
        return vllm_args(c, role)
    if c.backend == "sglang":
        return sglang_args(c, role)
    raise ValueError(f"no DGD writer for backend {c.backend!r} (vllm and sglang are supported)")


def frontend_args(c: Candidate) -> list[str]:
    """`dynamo.frontend` flags: the router mode, and the KV router's settings when it is on."""
    mode = c.router.mode or "round_robin"
    try:
        flag_mode = _ROUTER_MODE[mode]
    except KeyError:
        raise ValueError(f"router_mode {mode!r} has no dynamo.frontend --router-mode equivalent") from None
    args = ["--http-port", str(FRONTEND_PORT), "--router-mode", flag_mode]
    if flag_mode == "kv":
        for key, flag in _ROUTER_FLAGS:
            value = getattr(c.router.admission if key in ADMISSION_FIELDS else c.router, key, None)
            if value is not None:
                args += [flag, _fmt(value)]
        args += ["--kv-cache-block-size", _fmt(c.load_role.engine.block_size)]
    return args


def planner_args(c: Candidate, planner_config: Mapping[str, Any]) -> list[str]:
    """One JSON `--config`: the candidate's planner settings for a Kubernetes planner."""
    body = {"environment": "kubernetes", "backend": c.backend}
    body.update({k: v for k, v in planner_config.items() if k not in _REPLAY_ONLY_PLANNER_KEYS and v is not None})
    return ["--config", json.dumps(body, sort_keys=True)]


# --------------------------------------------------------------------------- layout

@dataclass(frozen=True)
class WorkerLayout:
    """How one role's engines land on pods: `nodes` pods of `gpus_per_pod` GPUs per replica."""

    role: str
    replicas: int
    engine_gpus: int
    nodes: int
    gpus_per_pod: int


def worker_layout(role: Role, gpus_per_node: int | None) -> WorkerLayout:
    """Multinode when an engine needs more GPUs than a node has; each pod then takes an equal share."""
    gpus, replicas = role.gpus_per_engine, role.replicas
    nodes = 1
    if gpus_per_node and gpus > gpus_per_node:
        nodes = math.ceil(gpus / gpus_per_node)
        while gpus % nodes:  # equal pods: the smallest node count that divides the engine
            nodes += 1
    return WorkerLayout(role.name, replicas, gpus, nodes, gpus // nodes)


def manifest_name(model: str, rank: int, mode: str) -> str:
    """A DNS-1123 name: `spica-<model tail>-<mode>-<rank>`, at most 63 characters."""
    tail = re.sub(r"[^a-z0-9-]+", "-", str(model).split("/")[-1].lower()).strip("-") or "model"
    suffix = f"-{mode}-{rank}"
    return ("spica-" + tail)[: 63 - len(suffix)].rstrip("-") + suffix


def _container(image: str, module: str, args: list[str], gpus: int | None, secret: str | None) -> dict[str, Any]:
    c: dict[str, Any] = {"name": "main", "image": image, "command": ["python3", "-m", module], "args": args}
    if secret and module != "dynamo.frontend" and module != "dynamo.planner":
        c["envFrom"] = [{"secretRef": {"name": secret}}]
    if gpus:
        c["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return c


def node_selector(c: Candidate, role: Role) -> dict[str, str] | None:
    """The nodes a worker role's pods may land on: its GPU type's product label when the candidate runs on
    two types (None otherwise, or for a type without a known label: the manifest header names it)."""
    if len(c.systems) < 2:
        return None
    product = GPU_PRODUCTS.get(c.role_system(role))
    return {GPU_PRODUCT_LABEL: product} if product else None


def _node_size(c: Candidate, role: Role, opts: DeployOptions) -> int | None:
    """GPUs per node of the role's type: the deploy options' (hardware_sku's, or as configured), or for a
    role on its own GPU type that type's AIC system spec."""
    system = c.role_system(role)
    if system == c.system or len(c.systems) < 2:
        return opts.gpus_per_node
    try:
        return hardware_facts(system).gpus_per_node
    except ModelHardwareError:
        return opts.gpus_per_node


@dataclass(frozen=True)
class _Component:
    name: str
    kind: str  # frontend | worker | prefill | decode | planner
    replicas: int
    container: dict[str, Any]
    nodes: int = 1
    gpus_per_pod: int = 0
    node_selector: dict[str, str] | None = None


def _components(c: Candidate, opts: DeployOptions,
                planner_config: Mapping[str, Any] | None) -> list[_Component]:
    backend = c.backend
    if backend not in _MODULES:
        raise ValueError(f"no DGD writer for backend {backend!r} (vllm and sglang are supported)")
    image = opts.image or default_image(backend)
    comps = [_Component("Frontend", "frontend", 1,
                        _container(image, "dynamo.frontend", frontend_args(c), None, None))]
    for role in c.roles:
        lay = worker_layout(role, _node_size(c, role, opts))
        kind = "worker" if role.name == "agg" else role.name
        comps.append(_Component(_COMPONENT_NAMES[backend][role.name], kind, lay.replicas,
                                _container(image, _MODULES[backend], engine_args(c, role), lay.gpus_per_pod,
                                           opts.hf_token_secret),
                                nodes=lay.nodes, gpus_per_pod=lay.gpus_per_pod,
                                node_selector=node_selector(c, role)))
    if planner_config:
        comps.append(_Component("Planner", "planner", 1,
                                _container(opts.planner_image or default_planner_image(), "dynamo.planner",
                                           planner_args(c, planner_config), None, None)))
    return comps


def dgd_manifest(candidate: Candidate, *, name: str, options: DeployOptions | None = None,
                 planner_config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The DGD document of one candidate (`planner_config`: the plan's, None when static)."""
    opts = options or DeployOptions()
    comps = _components(candidate, opts, planner_config)
    backend = candidate.backend
    if opts.api_version == "v1beta1":
        items = []
        for c in comps:
            item: dict[str, Any] = {"name": c.name, "type": c.kind, "replicas": c.replicas}
            if c.nodes > 1:
                item["multinode"] = {"nodeCount": c.nodes}
            if not _SEMVER_TAG.search(str(c.container.get("image", ""))):
                # DGD admission needs the runtime version when the image tag does not carry one
                item["runtimeVersionOverride"] = DYNAMO_VERSION
            pod: dict[str, Any] = {"nodeSelector": dict(c.node_selector)} if c.node_selector else {}
            item["podTemplate"] = {"spec": {**pod, "containers": [c.container]}}
            items.append(item)
        spec: dict[str, Any] = {"backendFramework": backend, "components": items}
    else:
        services: dict[str, Any] = {}
        for c in comps:
            svc: dict[str, Any] = {"componentType": "worker" if c.kind in ("prefill", "decode") else c.kind}
            if c.kind in ("prefill", "decode"):
                svc["subComponentType"] = c.kind
            svc["replicas"] = c.replicas
            if c.nodes > 1:
                svc["multinode"] = {"nodeCount": c.nodes}
            main = {k: v for k, v in c.container.items() if k not in ("resources", "envFrom")}
            if "envFrom" in c.container:
                svc["envFromSecret"] = c.container["envFrom"][0]["secretRef"]["name"]
            if c.gpus_per_pod:
                svc["resources"] = {"limits": {"gpu": str(c.gpus_per_pod)}}
            extra: dict[str, Any] = {"nodeSelector": dict(c.node_selector)} if c.node_selector else {}
            svc["extraPodSpec"] = {**extra, "mainContainer": main}
            services[c.name] = svc
        spec = {"backendFramework": backend, "services": services}
    return {"apiVersion": f"nvidia.com/{opts.api_version}", "kind": "DynamoGraphDeployment",
            "metadata": {"name": name}, "spec": spec}


# --------------------------------------------------------------------------- validation

@lru_cache(maxsize=None)
def _data(name: str) -> str:
    return resources.files("spica_pipeline.report").joinpath("dgd_data", name).read_text()


def schema(api_version: str) -> dict[str, Any]:
    return json.loads(_data(f"dgd-{api_version}.schema.json"))


@lru_cache(maxsize=None)
def known_flags(module: str) -> frozenset[str]:
    """The vendored flag names of `dynamo.<module>` (vllm, sglang, frontend, planner)."""
    lines = _data(f"flags-{module.removeprefix('dynamo.')}.txt").splitlines()
    return frozenset(s.strip() for s in lines if s.strip() and not s.lstrip().startswith("#"))


def schema_errors(instance: Any, sch: Mapping[str, Any], path: str = "") -> list[str]:
    """Check the OpenAPI v3 structural keywords our vendored subsets use; '<path>: <problem>' each."""
    errors: list[str] = []
    where = path or "<root>"
    if "anyOf" in sch:
        if all(schema_errors(instance, s, path) for s in sch["anyOf"]):
            errors.append(f"{where}: {instance!r} matches none of the allowed forms")
        return errors
    t = sch.get("type")
    checks = {"object": lambda v: isinstance(v, dict), "array": lambda v: isinstance(v, list),
              "string": lambda v: isinstance(v, str), "boolean": lambda v: isinstance(v, bool),
              "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
              "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)}
    if t is not None and not checks[t](instance):
        return [f"{where}: expected {t}, got {type(instance).__name__}"]
    if "enum" in sch and instance not in sch["enum"]:
        errors.append(f"{where}: {instance!r} is not one of {sch['enum']}")
    if isinstance(instance, str):
        if "pattern" in sch and not re.search(sch["pattern"], instance):
            errors.append(f"{where}: {instance!r} does not match {sch['pattern']}")
        if "maxLength" in sch and len(instance) > sch["maxLength"]:
            errors.append(f"{where}: longer than {sch['maxLength']}")
        if "minLength" in sch and len(instance) < sch["minLength"]:
            errors.append(f"{where}: shorter than {sch['minLength']}")
    if isinstance(instance, (int, float)) and not isinstance(instance, bool) and "minimum" in sch:
        if instance < sch["minimum"]:
            errors.append(f"{where}: {instance} is below the minimum {sch['minimum']}")
    if isinstance(instance, dict):
        props = sch.get("properties", {})
        for req in sch.get("required", []):
            if req not in instance:
                errors.append(f"{where}: missing required field {req!r}")
        extra = sch.get("additionalProperties", True)
        for key, value in instance.items():
            sub = f"{path}.{key}" if path else key
            if key in props:
                errors += schema_errors(value, props[key], sub)
            elif extra is False:
                errors.append(f"{where}: field {key!r} is not in the CRD schema")
            elif isinstance(extra, dict):
                errors += schema_errors(value, extra, sub)
    if isinstance(instance, list):
        if "maxItems" in sch and len(instance) > sch["maxItems"]:
            errors.append(f"{where}: more than {sch['maxItems']} items")
        if "items" in sch:
            for i, item in enumerate(instance):
                errors += schema_errors(item, sch["items"], f"{path}[{i}]")
    return errors


def _containers(doc: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    spec = doc.get("spec") or {}
    if "components" in spec:
        return [(c.get("name", "?"), ct) for c in spec["components"]
                for ct in ((c.get("podTemplate") or {}).get("spec") or {}).get("containers", [])]
    return [(n, (s.get("extraPodSpec") or {}).get("mainContainer") or {}) for n, s in (spec.get("services") or {}).items()]


def flag_errors(doc: Mapping[str, Any]) -> list[str]:
    """Every `--flag` a `dynamo.<module>` container passes must be in that module's vendored list."""
    errors = []
    for comp, c in _containers(doc):
        cmd = list(c.get("command") or [])
        if len(cmd) < 3 or cmd[:2] != ["python3", "-m"]:
            continue
        module = cmd[2]
        try:
            known = known_flags(module)
        except FileNotFoundError:
            errors.append(f"{comp}: no vendored flag list for {module}")
            continue
        for a in c.get("args") or []:
            if isinstance(a, str) and a.startswith("--") and a not in known:
                errors.append(f"{comp}: {module} has no flag {a}")
    return errors


def validate_manifest(doc: Mapping[str, Any]) -> list[str]:
    """Schema and flag problems of one manifest; empty when it is fine."""
    version = str(doc.get("apiVersion", "")).removeprefix("nvidia.com/")
    if version not in API_VERSIONS:
        return [f"apiVersion: {doc.get('apiVersion')!r} is not one of {[f'nvidia.com/{v}' for v in API_VERSIONS]}"]
    return schema_errors(doc, schema(version)) + flag_errors(doc)


def manifest_gpus(doc: Mapping[str, Any]) -> int:
    """Total GPUs a manifest asks for: replicas x nodes x per-pod limit, summed over components."""
    spec = doc["spec"]
    total = 0
    if "components" in spec:
        for c in spec["components"]:
            for ct in c["podTemplate"]["spec"]["containers"]:
                g = int(((ct.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu", 0))
                total += g * int(c.get("replicas", 1)) * int((c.get("multinode") or {}).get("nodeCount", 1))
    else:
        for s in spec["services"].values():
            g = int(((s.get("resources") or {}).get("limits") or {}).get("gpu", 0))
            total += g * int(s.get("replicas", 1)) * int((s.get("multinode") or {}).get("nodeCount", 1))
    return total
