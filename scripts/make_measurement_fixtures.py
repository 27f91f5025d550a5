#!/usr/bin/env python3
"""Regenerate tests/data/measurements/ with the real benchmark clients against a local mock server.

The server is the Dynamo mocker from the `ai-dynamo` package: `python -m dynamo.frontend` (the
OpenAI-compatible HTTP frontend) and `python -m dynamo.mocker` (an engine with simulated timing),
both on 127.0.0.1, discovering each other through a file store in a temporary folder. The mocker
serves the model named by the agg deployment fixture (deploy/agg/simulation_record.yaml), with a
small byte-level BPE tokenizer trained here on the text corpus AIPerf ships (no model download).

Against it run, each at concurrency 1 and 4 and at 4 requests per second:
  * AIPerf (`aiperf profile`): profile_export_aiperf.json per run, under aiperf/<run>/;
  * `vllm bench serve --save-result`: vllm/<run>.json;
  * SGLang's `python -m sglang.bench_serving --output-file`: one JSONL line per run,
    sglang/bench_serving.jsonl.
PRODUCED_BY.txt records the tool versions and every command. The clients live in separate virtual
environments (not the project's .venv); README.md beside the fixtures says how they were built. A
client whose environment is not given is skipped and its files are left as they are.

Every child process has a time limit, and the servers are stopped (process group, SIGTERM then
SIGKILL) however the script ends.

  python3 scripts/make_measurement_fixtures.py --tools-venv /tmp/mfix-venv \
      --vllm-venv /tmp/mfix-vllm --sglang-venv /tmp/mfix-sglang [--run-dir RUN]

--run-dir copies deploy/1 (agg) and the first disagg pick of a `spica sweep` output folder into
deploy/agg and deploy/disagg first.
"""

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "tests" / "data" / "measurements"
ISL, OSL = 128, 32
REQUESTS = 8
RUNS = (("c1", {"concurrency": 1}), ("c4", {"concurrency": 4}), ("rate4", {"rate": 4.0}))
SEED = 7
READY_S = 180  # the frontend and mocker start and find each other
RUN_S = 300  # one client run
LOOPBACK = "127.0.0.1"

TOKENIZER_CODE = r"""
import json, pathlib, sys
import aiperf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
out = pathlib.Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
corpus = pathlib.Path(aiperf.__file__).parent / "dataset" / "generator" / "assets" / "shakespeare.txt"
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=4096, special_tokens=["<|bos|>", "<|eos|>"], show_progress=False,
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
tok.train([str(corpus)], trainer)
tok.save(str(out / "tokenizer.json"))
(out / "config.json").write_text(json.dumps({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 4096, "hidden_size": 256,
    "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
    "max_position_embeddings": 8192, "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "bfloat16"}))
(out / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}))
(out / "tokenizer_config.json").write_text(json.dumps({
    "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|bos|>", "eos_token": "<|eos|>",
    "model_max_length": 8192,
    "chat_template": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                     "{% if add_generation_prompt %}assistant: {% endif %}"}))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def model_of(record: Path) -> str:
    m = re.search(r"^model: (.+)$", record.read_text(), re.MULTILINE)
    if not m:
        sys.exit(f"{record}: no `model:` line")
    return m.group(1).strip().strip("'\"")


def copy_deployments(run_dir: Path, out: Path) -> None:
    deploy = run_dir / "deploy"
    picks = sorted((p for p in deploy.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    disagg = next((p for p in picks if "deployment_mode: disagg" in (p / "simulation_record.yaml").read_text()), None)
    for name, pick in (("agg", deploy / "1"), ("disagg", disagg)):
        if pick is None:
            continue
        (out / "deploy" / name).mkdir(parents=True, exist_ok=True)
        for f in ("dgd.yaml", "simulation_record.yaml"):
            shutil.copyfile(pick / f, out / "deploy" / name / f)


class Servers:
    """The Dynamo frontend and mocker, each in its own process group, stopped on exit."""

    def __init__(self, venv: Path, work: Path, model: str, tokenizer: Path, port: int):
        self.procs: list[subprocess.Popen] = []
        self.logs = []
        # every endpoint the runtime advertises (request plane, response streams, event plane) on loopback
        self.env = {"DYN_FILE_KV": str(work / "discovery"), "DYN_TCP_RPC_HOST": LOOPBACK,
                    "DYN_TCP_RESPONSE_STREAM_HOST": LOOPBACK, "DYN_EVENT_PLANE_HOST": LOOPBACK,
                    "DYN_SYSTEM_HOST": LOOPBACK}
        env = {**os.environ, **self.env}
        common = ["--discovery-backend", "file", "--request-plane", "tcp"]
        py = str(venv / "bin" / "python")
        self.commands = [
            [py, "-m", "dynamo.frontend", "--http-host", LOOPBACK, "--http-port", str(port), *common],
            [py, "-m", "dynamo.mocker", "--model-path", str(tokenizer), "--model-name", model, *common],
        ]
        for i, cmd in enumerate(self.commands):
            log = open(work / f"server{i}.log", "wb")  # noqa: SIM115 (closed in stop())
            self.logs.append(log)
            self.procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                               start_new_session=True))

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for log in self.logs:
            log.close()


def wait_ready(base: str, model: str, servers: Servers) -> None:
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in servers.procs):
            sys.exit("a server exited before it was ready (see server*.log in the work folder)")
        try:
            with urllib.request.urlopen(f"{base}/v1/models", timeout=5) as r:
                if model in [m.get("id") for m in json.load(r).get("data", [])]:
                    return
        except OSError:
            pass
        time.sleep(1)
    sys.exit(f"the mock server did not list {model} within {READY_S} s")


def run(cmd: list[str], log: list[str], cwd: Path, shown: str | None = None) -> None:
    log.append(shown or " ".join(cmd))
    print("+", log[-1], flush=True)
    done = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=RUN_S)
    if done.returncode:
        sys.stdout.write(done.stdout.decode(errors="replace")[-3000:])
        sys.exit(f"exit {done.returncode}: {cmd[0]} ...")


def versions(venv: Path, names: tuple[str, ...]) -> str:
    code = ("import importlib.metadata as m\nfor n in %r:\n    try: print(n, m.version(n))\n"
            "    except m.PackageNotFoundError: pass\n") % (names,)
    return subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True,
                          timeout=60).stdout


def aiperf_runs(venv: Path, base: str, model: str, tok: Path, work: Path, out: Path, log: list[str]) -> None:
    for name, load in RUNS:
        art = work / "aiperf" / name
        cmd = [str(venv / "bin" / "aiperf"), "profile", "--model", model, "--url", base, "--endpoint-type", "chat",
               "--streaming", "--tokenizer", str(tok), "--isl", str(ISL), "--osl", str(OSL),
               "--extra-inputs", "ignore_eos:true", "--use-server-token-count", "--request-count", str(REQUESTS),
               "--warmup-request-count", "1", "--random-seed", str(SEED), "--ui-type", "none",
               "--no-server-metrics", "--no-gpu-telemetry", "--artifact-dir", str(art)]
        cmd += (["--concurrency", str(load["concurrency"])] if "concurrency" in load
                else ["--request-rate", str(load["rate"])])
        run(cmd, log, work)
        (out / "aiperf" / name).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(art / "profile_export_aiperf.json", out / "aiperf" / name / "profile_export_aiperf.json")


def vllm_runs(venv: Path, base: str, model: str, tok: Path, work: Path, out: Path, log: list[str]) -> None:
    (out / "vllm").mkdir(parents=True, exist_ok=True)
    for name, load in RUNS:
        cmd = [str(venv / "bin" / "python"), "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--backend", "vllm",
               "--base-url", base, "--model", model, "--tokenizer", str(tok), "--dataset-name", "random",
               "--random-input-len", str(ISL), "--random-output-len", str(OSL), "--num-prompts", str(REQUESTS),
               "--ignore-eos", "--seed", str(SEED), "--percentile-metrics", "ttft,tpot,itl,e2el",
               "--metric-percentiles", "50,90,99", "--disable-tqdm", "--save-result",
               "--result-dir", str(out / "vllm"), "--result-filename", f"{name}.json"]
        cmd += (["--max-concurrency", str(load["concurrency"])] if "concurrency" in load
                else ["--request-rate", str(load["rate"])])
        run(cmd, log, work)


def sglang_runs(venv: Path, base: str, model: str, tok: Path, work: Path, out: Path, log: list[str]) -> None:
    (out / "sglang").mkdir(parents=True, exist_ok=True)
    target = out / "sglang" / "bench_serving.jsonl"
    target.unlink(missing_ok=True)  # the client appends one line per run
    for name, load in RUNS:
        cmd = [str(venv / "bin" / "python"), "-m", "sglang.bench_serving", "--backend", "sglang-oai",
               "--base-url", base, "--model", model, "--tokenizer", str(tok), "--dataset-name", "random-ids",
               "--random-input-len", str(ISL), "--random-output-len", str(OSL), "--random-range-ratio", "1",
               "--num-prompts", str(REQUESTS), "--seed", str(SEED), "--warmup-requests", "1", "--disable-tqdm",
               "--output-file", str(target)]
        cmd += (["--max-concurrency", str(load["concurrency"])] if "concurrency" in load
                else ["--request-rate", str(load["rate"])])
        run(cmd, log, work)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tools-venv", type=Path, required=True, help="venv with aiperf and ai-dynamo (the mocker)")
    ap.add_argument("--vllm-venv", type=Path, help="venv whose vllm runs `vllm bench serve` (skipped when absent)")
    ap.add_argument("--sglang-venv", type=Path, help="venv whose sglang runs bench_serving (skipped when absent)")
    ap.add_argument("--output", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--run-dir", type=Path, help="a `spica sweep` output folder to copy deploy/ picks from")
    args = ap.parse_args()
    out: Path = args.output
    if args.run_dir:
        copy_deployments(args.run_dir, out)
    model = model_of(out / "deploy" / "agg" / "simulation_record.yaml")
    work = Path(tempfile.mkdtemp(prefix="spica-mfix-"))
    print(f"work folder (server logs; removed on success): {work}", flush=True)
    log: list[str] = []
    tok = work / "tokenizer"
    py = str(args.tools_venv / "bin" / "python")
    run([py, "-c", TOKENIZER_CODE, str(tok)], log, work,
        shown=f"{py} -c TOKENIZER_CODE {tok}    (TOKENIZER_CODE: scripts/make_measurement_fixtures.py)")
    port = free_port()
    base = f"http://{LOOPBACK}:{port}"
    servers = Servers(args.tools_venv, work, model, tok, port)
    prefix = " ".join(f"{k}={v}" for k, v in servers.env.items())
    log += [f"{prefix} {' '.join(c)}" for c in servers.commands]
    try:
        wait_ready(base, model, servers)
        aiperf_runs(args.tools_venv, base, model, tok, work, out, log)
        if args.vllm_venv:
            vllm_runs(args.vllm_venv, base, model, tok, work, out, log)
        if args.sglang_venv:
            sglang_runs(args.sglang_venv, base, model, tok, work, out, log)
    finally:
        servers.stop()
    text = ["# Written by scripts/make_measurement_fixtures.py", "", "## versions", ""]
    text += [versions(args.tools_venv, ("ai-dynamo", "ai-dynamo-runtime", "aiperf", "transformers", "tokenizers"))]
    for venv, names in ((args.vllm_venv, ("vllm", "torch", "transformers")),
                        (args.sglang_venv, ("sglang", "torch", "transformers"))):
        if venv:
            text.append(versions(venv, names))
    text += ["## commands (the work folder was " + str(work) + ")", ""] + log + [""]
    (out / "PRODUCED_BY.txt").write_text("\n".join(text))
    shutil.rmtree(work, ignore_errors=True)
    print(f"fixtures written under {out}")


if __name__ == "__main__":
    main()
