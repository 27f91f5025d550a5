"""Peer comparison: AI Configurator's default agg-vs-disagg search vs our sweep, both replayed.

AI Configurator (`aiconfigurator` on PyPI, 0.12.0) is installed into its own venv at
bench/.venv-aic (never a dependency of the product) and run as `aiconfigurator cli default` for
the model, GPU type, GPU budget, ISL/OSL and SLA of bench/spaces/peer_aic.yaml. Its top picks per
mode (the generated Dynamo deployment: workers, TP, max-num-seqs, max-num-batched-tokens per role)
are turned into our candidates with `optimize.branch_plan.candidate_builder` and replayed by `ReplayEvaluator`
under the config's workload; our sweep runs on the same config. Both are scored on the same
replayed metric, goodput per GPU under the SLA, and the ratio ours / AIC's best is reported.

If AI Configurator cannot be installed or run here, the JSON says why in one line; no number is
made up.

usage:
  .venv/bin/python bench/bench_peer_aic.py [--quick] [--algorithm DEFAULT] [--top-n 3]
      [--out bench/results/peer_aic.json]
--quick: our sweep with QUASI_RANDOM_SEARCH and 2 rounds per branch.
"""

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("DYN_LOG", "warn")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from spica_pipeline.storage import write_json_result  # noqa: E402

AIC_VERSION = "0.12.0"
VENV = ROOT / "bench" / ".venv-aic"
CONFIG = ROOT / "bench" / "spaces" / "peer_aic.yaml"


class PeerUnavailable(Exception):
    """AI Configurator could not be installed or run; the message is the one-line reason."""


def _tail(text: str, n: int = 300) -> str:
    return " ".join(text.split())[-n:]


def ensure_aic() -> Path:
    """bench/.venv-aic/bin/aiconfigurator, installing aiconfigurator==0.12.0 there if needed."""
    exe = VENV / "bin" / "aiconfigurator"
    if exe.exists():
        return exe
    made = subprocess.run([sys.executable, "-m", "venv", str(VENV)], capture_output=True, text=True)
    if made.returncode != 0:
        raise PeerUnavailable(f"cannot create {VENV}: {_tail(made.stderr)}")
    pip = subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", f"aiconfigurator=={AIC_VERSION}"],
                         capture_output=True, text=True, timeout=1800)
    if pip.returncode != 0 or not exe.exists():
        raise PeerUnavailable(f"pip install aiconfigurator=={AIC_VERSION} failed: {_tail(pip.stderr)}")
    return exe


def run_aic(exe: Path, config: Any, save_dir: Path, top_n: int) -> tuple[Path, list[str], float]:
    space, workload, sla = config.search_space, config.workload, config.goal.sla
    cmd = [str(exe), "cli", "default", "--model-path", space.model_name, "--system", space.hardware_sku,
           "--total-gpus", str(space.gpu_budget), "--backend", space.backend[0], "--isl", str(workload.isl),
           "--osl", str(workload.osl), "--ttft", str(sla.ttft_ms), "--tpot", str(sla.itl_ms),
           "--save-dir", str(save_dir), "--top-n", str(top_n), "--log-level", "ERROR"]
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise PeerUnavailable(f"aiconfigurator cli default exited {done.returncode}: {_tail(done.stderr)}")
    results = [p.parent for p in save_dir.rglob("best_config_topn.csv")]
    if not results:
        raise PeerUnavailable("aiconfigurator cli default wrote no best_config_topn.csv")
    return results[0].parent, cmd, seconds


def _walk_args(obj: Any):
    if isinstance(obj, dict):
        for value in obj.values():
            yield from _walk_args(value)
    elif isinstance(obj, list):
        if "--max-num-seqs" in obj:
            yield obj
        for value in obj:
            yield from _walk_args(value)


def _arg(args: list[str], flag: str, default: int | None = None) -> int | None:
    return int(args[args.index(flag) + 1]) if flag in args else default


def read_picks(result_dir: Path) -> list[dict[str, Any]]:
    """Each top-k pick of each mode as its deployed roles: {role: replicas, tp, max_num_seqs, mnbt}."""
    import yaml

    picks = []
    for mode in ("agg", "disagg"):
        rows = []
        table = result_dir / mode / "best_config_topn.csv"
        if table.exists():
            with open(table) as fh:
                rows = list(csv.DictReader(fh))
        for k, row in enumerate(rows, start=1):
            deploy = result_dir / mode / f"top{k}" / "k8s_deploy.yaml"
            if not deploy.exists():
                continue
            roles: dict[str, dict[str, int | None]] = {}
            for doc in yaml.safe_load_all(deploy.read_text()):
                for name, service in ((doc or {}).get("spec", {}).get("services", {}) or {}).items():
                    role = service.get("subComponentType") or ("agg" if "Worker" in name else None)
                    for args in _walk_args(service):
                        roles["agg" if mode == "agg" else role] = {
                            "replicas": int(service.get("replicas") or 1),
                            "tp": _arg(args, "--tensor-parallel-size", 1),
                            "max_num_seqs": _arg(args, "--max-num-seqs"),
                            "max_num_batched_tokens": _arg(args, "--max-num-batched-tokens"),
                        }
            picks.append({"mode": mode, "rank": k, "roles": roles,
                          "aic_tokens_per_s_per_gpu": float(row.get("tokens/s/gpu") or "nan"),
                          "aic_tokens_per_s_per_user": float(row.get("tokens/s/user") or "nan")})
    return picks


def pick_request(pick: dict[str, Any], config: Any, build: Any):
    """Our EvalRequest for an AI Configurator pick (its engine args override our knob values)."""
    from spica_pipeline.space.shapes import DisaggShape, RoleShape

    space = config.search_space
    selection = {name: values[0] for name, values in space.choice_lists().items()}
    selection["deployment_mode"] = pick["mode"]
    roles = pick["roles"]
    for role, args in roles.items():
        if args["max_num_seqs"] is not None:
            selection[f"{role}_max_num_seqs"] = args["max_num_seqs"]
        if args["max_num_batched_tokens"] is not None:
            selection[f"{role}_max_num_batched_tokens"] = args["max_num_batched_tokens"]
    if pick["mode"] == "agg":
        shape: Any = RoleShape(tp=roles["agg"]["tp"], replicas=roles["agg"]["replicas"])
    else:
        shape = DisaggShape(prefill=RoleShape(tp=roles["prefill"]["tp"], replicas=roles["prefill"]["replicas"]),
                            decode=RoleShape(tp=roles["decode"]["tp"], replicas=roles["decode"]["replicas"]))
    return build(selection, shape)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--algorithm", default=None, help="our sweep's algorithm (default DEFAULT, quick QUASI)")
    parser.add_argument("--policy", choices=["rapid", "thorough"], default=None,
                        help="our sweep's policy (default: thorough, the exhaustive optimum of our space; "
                             "--quick: rapid)")
    parser.add_argument("--top-n", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    out = Path(args.out) if args.out else ROOT / "bench" / "results" / ("peer_aic_quick.json" if args.quick
                                                                        else "peer_aic.json")
    from spica_pipeline.config import SmartSearchConfig, load_config

    config = load_config(CONFIG)
    algorithm = args.algorithm or ("QUASI_RANDOM_SEARCH" if args.quick else "DEFAULT")
    data = config.model_dump(mode="json", exclude_unset=True)
    data.setdefault("sweep", {})["algorithm"] = algorithm
    if args.quick:
        data["sweep"]["max_rounds"] = 2
    data["sweep"]["policy"] = args.policy or ("rapid" if args.quick else "thorough")
    config = SmartSearchConfig.from_dict(data)
    result: dict[str, Any] = {
        "benchmark": "peer_aic", "command": " ".join(["bench/bench_peer_aic.py", *sys.argv[1:]]),
        "quick": args.quick, "config": str(CONFIG.relative_to(ROOT)),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(),
        "metric": "goodput_per_gpu (replayed, SLA ttft_ms/itl_ms from the config)",
        "our_algorithm": algorithm, "our_max_rounds": config.sweep.max_rounds, "our_policy": config.sweep.policy,
    }
    with tempfile.TemporaryDirectory(prefix="spica-bench-aic-") as tmp:
        try:
            exe = ensure_aic()
            result_dir, cmd, aic_seconds = run_aic(exe, config, Path(tmp) / "aic", args.top_n)
            picks = read_picks(result_dir)
            if not picks:
                raise PeerUnavailable(f"no deployable pick found under {result_dir.name}")
        except (PeerUnavailable, subprocess.TimeoutExpired, OSError) as exc:
            reason = " ".join(str(exc).split())
            result.update(status="unavailable", reason=reason)
            print(f"peer comparison unavailable: {reason}")
            write_json_result(out, result)
            return 0
        shown = [Path(c).name if i == 0 else ("<tmp>/aic" if c == str(Path(tmp) / "aic") else c)
                 for i, c in enumerate(cmd)]
        result.update(aic_version=AIC_VERSION, aic_command=" ".join(shown),
                      aic_seconds=round(aic_seconds, 1))

        from spica_pipeline.evaluate.replay import ReplayEvaluator
        from spica_pipeline.optimize.branch_plan import candidate_builder, scorer
        from spica_pipeline.sweep import evaluation_context, predict_load, run_sweep

        load_predictor = predict_load(config)
        build = candidate_builder(config, load_predictor, evaluation_context(config, load_predictor))
        score = scorer(config.goal)
        evaluator = ReplayEvaluator()
        replayed = []
        for pick in picks:
            outcome = evaluator.evaluate(pick_request(pick, config, build))
            value = score(outcome).score if outcome.status == "feasible" else None
            replayed.append({**pick, "status": outcome.status, "reason": outcome.reason,
                             "replayed_goodput_per_gpu": value,
                             "replayed_ttft_p90_ms": (outcome.report or {}).get("p90_ttft_ms"),
                             "replayed_itl_p90_ms": (outcome.report or {}).get("p90_itl_ms")})
            print(f"AIC {pick['mode']} top{pick['rank']}: {outcome.status} goodput/GPU {value}", flush=True)
        started = time.perf_counter()
        ours = run_sweep(config, Path(tmp) / "ours")
        our_seconds = time.perf_counter() - started
    best_aic = max((r for r in replayed if r["replayed_goodput_per_gpu"] is not None),
                   key=lambda r: r["replayed_goodput_per_gpu"], default=None)
    best_ours = ours.merge.candidates[0] if ours.merge.candidates else None
    ours_cfg = None
    if best_ours is not None:
        keep = ("deployment_mode", "used_gpus", "tp", "replicas", "prefill_tp", "prefill_replicas", "decode_tp",
                "decode_replicas", "agg_max_num_seqs", "agg_max_num_batched_tokens", "prefill_max_num_seqs",
                "prefill_max_num_batched_tokens", "decode_max_num_seqs", "decode_max_num_batched_tokens")
        ours_cfg = {k: best_ours.config.get(k) for k in keep if best_ours.config.get(k) is not None}
    result.update(
        status="ok", aic_picks=replayed,
        aic_best={"mode": best_aic["mode"], "rank": best_aic["rank"], "roles": best_aic["roles"],
                  "goodput_per_gpu": best_aic["replayed_goodput_per_gpu"]} if best_aic else None,
        ours_best={"config": ours_cfg, "goodput_per_gpu": best_ours.score} if best_ours else None,
        our_sweep_seconds=round(our_seconds, 1), our_trials=len(ours.ledger),
        ratio_ours_over_aic=(round(best_ours.score / best_aic["replayed_goodput_per_gpu"], 4)
                             if best_ours and best_aic and best_aic["replayed_goodput_per_gpu"] > 0 else None),
    )
    print(f"ours {result['ours_best']} vs AIC {result['aic_best']}: ratio {result['ratio_ours_over_aic']}")
    write_json_result(out, result)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
