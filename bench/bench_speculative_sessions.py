"""What speculative decoding and agentic sessions do in replay: the two examples swept, and the silicon check.

* examples/configs/speculative.yaml (GLM-5-FP8, one TP8 SGLang engine on 8 H200, 16 closed-loop clients,
  1024/1024 tokens, acceptance 0.7): replayed TPOT, TTFT and tok/s/user for 0-3 MTP draft tokens, the tokens
  a step yields, KV tokens per rank, and whether the pick's dgd.yaml carries SGLang's speculative flags;
* examples/configs/sessions.yaml (Qwen3-32B as 4 x TP2 vLLM, 48 agentic sessions): the prefix-cache hit
  rate and TTFT under round robin and the KV router;
* one decode pass with 3 drafts as AIC's forward-pass estimate prices it, as spica's table does and as
  AIC's static step does; the replay's tokens per step for given acceptance against the conditional rule;
* aiconfigurator-core's silicon_sample.csv: the rows that state MTP / speculative decoding (a column or a
  value naming it), i.e. what a replayed MTP TPOT could be checked against.

    DYN_LOG=warn .venv/bin/python bench/bench_speculative_sessions.py [--json bench/results/speculative_sessions.json]
"""

import argparse
import csv
import json
import re
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from spica_pipeline.config import load_config  # noqa: E402
from spica_pipeline.space.speculative import expected_tokens_per_step  # noqa: E402
from spica_pipeline.sweep import run_sweep  # noqa: E402

SPECULATIVE = re.compile(r"mtp|nextn|specul|eagle|draft", re.IGNORECASE)


def _sweep(name: str, out: Path) -> tuple[pd.DataFrame, float]:
    started = time.perf_counter()
    run_sweep(load_config(REPO / "examples" / "configs" / f"{name}.yaml"), out)
    return pd.read_parquet(out / "ledger.parquet"), time.perf_counter() - started


def speculative(out: Path) -> dict:
    ledger, wall = _sweep("speculative", out)
    rows = []
    for _, r in ledger.iterrows():
        cfg, rep = json.loads(r["config"]), json.loads(r["report"])
        spec = cfg.get("speculative") or {}
        rows.append({"draft_tokens": int(cfg.get("speculative_num_tokens") or 0),
                     "tokens_per_step": spec.get("tokens_per_step", 1.0),
                     "mean_tpot_ms": rep["mean_tpot_ms"], "mean_ttft_ms": rep["mean_ttft_ms"],
                     "tok_s_per_user": rep["mean_output_token_throughput_per_user"],
                     "agg_kv_tokens_per_rank": cfg["agg_kv_tokens_per_rank"]})
    rows.sort(key=lambda x: x["draft_tokens"])
    none = next(x for x in rows if x["draft_tokens"] == 0)["mean_tpot_ms"]
    for x in rows:
        x["tpot_vs_none"] = round(x["mean_tpot_ms"] / none, 4)
    dgd = (out / "deploy" / "1" / "dgd.yaml").read_text()
    pick = pd.read_csv(out / "candidates.csv").iloc[0].get("cfg.speculative_num_tokens")
    return {"config": "examples/configs/speculative.yaml", "candidates": rows, "sweep_wall_s": round(wall, 1),
            "pick_draft_tokens": 0 if pd.isna(pick) else int(pick),
            "pick_dgd_has_speculative_algorithm": "--speculative-algorithm" in dgd}


def sessions(out: Path) -> dict:
    ledger, wall = _sweep("sessions", out)
    rows = []
    for _, r in ledger.iterrows():
        cfg, rep = json.loads(r["config"]), json.loads(r["report"])
        rows.append({"router_mode": cfg["router_mode"], "prefix_cache_reused_ratio": rep["prefix_cache_reused_ratio"],
                     "mean_ttft_ms": rep["mean_ttft_ms"], "mean_e2e_latency_ms": rep["mean_e2e_latency_ms"],
                     "requests": cfg["sessions"]["requests"]})
    return {"config": "examples/configs/sessions.yaml", "candidates": rows, "sweep_wall_s": round(wall, 1)}


def verify_width() -> dict:
    """One GLM-5-FP8 TP8 SGLang decode pass (batch 16, context 4096): AIC's forward-pass estimate with no
    drafts and with 3 (draft layers only), spica's table entry for 3 drafts, and AIC's own static step."""
    from aiconfigurator_core.sdk.engine import EngineHandle

    from spica_pipeline.evaluate.timing import _AicStep
    from spica_pipeline.space.engine import EngineIdentity
    from spica_pipeline.space.model_hw import QuietAIC, latest_backend_version
    from spica_pipeline.space.perf_data import aic_model, estimate_ms

    model, system, backend = "zai-org/GLM-5-FP8", "h200_sxm", "sglang"
    ver = latest_backend_version(system, backend)

    def ident(k: int) -> EngineIdentity:
        return EngineIdentity(model, system, backend, ver, tp=8, moe_tp=8, nextn=k)

    def fpm(k: int) -> float:
        return estimate_ms(aic_model(ident(k)), num_decode_requests=16, sum_decode_kv_tokens=16 * 4096)

    with QuietAIC():
        handle = EngineHandle.compile(model, system, backend, backend_version=ver, tp_size=8, moe_tp_size=8,
                                      moe_ep_size=1, nextn=3)
        static = handle.decode_step_latency(16, 4096, 2)
    return {"model": model, "system": system, "backend": f"{backend} {ver}", "batch": 16, "context": 4096,
            "forward_pass_no_drafts_ms": fpm(0), "forward_pass_3_drafts_layers_only_ms": fpm(3),
            "table_3_drafts_ms": _AicStep(ident(3)).decode(16, 4096), "aic_static_step_3_drafts_ms": static}


def replay_acceptance() -> dict:
    """Tokens a step yields in the replay for given per-position acceptance (a flat 10 ms step, one request
    of 20,000 output tokens): the replay's sampling rule, read back."""
    import numpy as np
    import dynamo._core as core

    with tempfile.TemporaryDirectory() as tmp:
        table = Path(tmp) / "flat.npz"
        np.savez(table, prefill_isl=np.array([1.0, 1e5]), prefill_ttft_ms=np.array([100.0, 100.0]),
                 decode_active_kv_tokens=np.array([1.0, 1e7]), decode_context_length=np.array([1.0, 1e6]),
                 decode_itl=np.full((2, 2), 100.0))
        out = {}
        for rates in ("0.8,0.5", "0.5,1.0,1.0", "0.7,0.7,0.7"):
            engine = {"backend": "vllm", "num_gpu_blocks": 100000, "block_size": 16, "max_num_seqs": 256,
                      "max_num_batched_tokens": 8192, "speedup_ratio": 10.0, "aic_nextn": len(rates.split(",")),
                      "aic_nextn_accept_rates": rates,
                      "timing_model": {"type": "external", "provider": "dynamo_profile", "config": {"path": str(table)}}}
            r = core.run_mocker_synthetic_trace_replay(100, 20000, 1, extra_engine_args={"engine": engine},
                                                       replay_concurrency=1)
            out[rates] = {"tokens_per_step": round(10.0 / r.summary["mean_tpot_ms"], 4),
                          "conditional_rule": round(expected_tokens_per_step([float(a) for a in rates.split(",")]), 4)}
    return out


def silicon_rows_stating_mtp() -> dict:
    import aiconfigurator_core

    path = Path(aiconfigurator_core.__file__).parent / "systems" / "silicon_sample.csv"
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        columns = list(reader.fieldnames or [])
        rows = list(reader)
    stating = [r["id"] for r in rows if any(SPECULATIVE.search(str(v)) for v in r.values())]
    return {"file": "aiconfigurator_core/systems/silicon_sample.csv", "rows": len(rows),
            "columns_naming_it": [c for c in columns if SPECULATIVE.search(c)], "rows_stating_it": len(stating)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", help="write the result here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = {
            "command": " ".join(["bench/bench_speculative_sessions.py", *sys.argv[1:]]),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "versions": {p: version(p) for p in ("ai-dynamo-runtime", "aiconfigurator-core")},
            "speculative": speculative(Path(tmp) / "speculative"),
            "sessions": sessions(Path(tmp) / "sessions"),
            "verify_width": verify_width(),
            "replay_acceptance": replay_acceptance(),
            "silicon": silicon_rows_stating_mtp(),
        }
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
