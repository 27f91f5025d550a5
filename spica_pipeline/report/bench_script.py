"""deploy/<rank>/bench.sh: the AIPerf command(s) that measure a deployed pick at the sweep's workload and save what
`spica calibrate` reads (the loop: sweep -> deploy -> bench -> calibrate -> sweep).

The script runs `aiperf profile` (AIPerf 0.13's flags) against the pick's Frontend, once per concurrency, each
run's artifacts in bench/c<C>/ beside it (profile_export_aiperf.json among them); `spica calibrate deploy/<rank>`
reads every export under that folder with its simulation_record.yaml as the deployment. A closed loop sends
requests of the workload's ISL and OSL (`ignore_eos`, `min_tokens`: every response is OSL tokens long), 10 x C of
them after C warm-up requests, as the benchmark client the calibration replays does (fidelity/measurement.py). A
request-rate workload runs at its rate; a trace workload replays the trace on its timestamps (AIPerf reads the
Mooncake format). `spica calibrate` fits on closed-loop runs, so those workloads' scripts say how to add one.
"""

import math
import shlex
from typing import Any, Mapping

from spica_pipeline.fidelity.measurement import CLIENT_REQUEST_RATIO
from spica_pipeline.report.dgd import FRONTEND_PORT, manifest_name

BENCH_DIR = "bench"
JITTER_TO_STDDEV = 1 / math.sqrt(3)  # a uniform spread of +- j has standard deviation j / sqrt(3)


def _lengths(workload: Mapping[str, Any]) -> list[str]:
    isl, osl = int(workload["isl"]), int(workload["osl"])
    isl_sd = round(isl * float(workload.get("isl_jitter") or 0.0) * JITTER_TO_STDDEV)
    osl_sd = round(osl * float(workload.get("osl_jitter") or 0.0) * JITTER_TO_STDDEV)
    return ["--synthetic-input-tokens-mean", str(isl), "--synthetic-input-tokens-stddev", str(isl_sd),
            "--output-tokens-mean", str(osl), "--output-tokens-stddev", str(osl_sd),
            "--extra-inputs", "ignore_eos:true", "--extra-inputs", f"min_tokens:{osl}"]


def _line(args: list[str], indent: str = "") -> str:
    """One shell command over several lines, each flag beside its value; "$VAR" words stay unquoted so the
    shell expands them."""
    words = [a if a.startswith('"$') or a.startswith("$((") else shlex.quote(a) for a in args]
    groups: list[str] = []
    for w in words:
        if groups and not w.startswith("-") and groups[-1].startswith("--") and " " not in groups[-1]:
            groups[-1] += " " + w
        else:
            groups.append(w)
    out, line = [], indent
    for g in groups:
        if len(line) + len(g) > 100 and line.strip():
            out.append(line.rstrip() + " \\")
            line = indent + "  "
        line += g + " "
    out.append(line.rstrip())
    return "\n".join(out)


def bench_script(config: Mapping[str, Any], rank: int, workload: Mapping[str, Any] | None,
                 model: str | None = None) -> str:
    """bench.sh for the pick whose flat candidate is `config`, at `workload` (the sweep's workload section as
    report.md states it); `model`: the name the manifest serves (None: the candidate's model)."""
    workload = dict(workload or {})
    model = model or str(config.get("model_name"))
    name = manifest_name(model, rank, str(config.get("deployment_mode")))
    shape = str(workload.get("shape") or "")
    concurrency = config.get("concurrency") or workload.get("concurrency")
    head = [
        "#!/usr/bin/env bash",
        f"# Measure Spica pick #{rank} on real GPUs with AIPerf, at the sweep's workload, and save what",
        "# `spica calibrate` reads. The loop: sweep -> deploy -> bench -> calibrate -> sweep.",
        "#   1. kubectl apply -f dgd.yaml, wait until its Frontend serves the model, and reach it, e.g.",
        f"#        kubectl port-forward svc/{name}-frontend {FRONTEND_PORT}:{FRONTEND_PORT}",
        "#   2. pip install aiperf; bash bench.sh        (URL=... to point elsewhere)",
        "#   3. spica calibrate <this folder> --output PROFILE.json, then sweep with",
        "#        evaluation.calibration: PROFILE.json (or put PROFILE.json in the profile directory for `auto`)",
        "set -euo pipefail",
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        f'URL="${{URL:-http://localhost:{FRONTEND_PORT}}}"',
        f'MODEL="${{MODEL:-{model}}}"  # the name the Frontend serves',
        f'TOKENIZER="${{TOKENIZER:-{model}}}"',
    ]
    common = ["aiperf", "profile", "--model", '"$MODEL"', "--url", '"$URL"', "--endpoint-type", "chat", "--streaming",
              "--tokenizer", '"$TOKENIZER"', "--random-seed", "42", "--ui-type", "none"]
    if shape in ("concurrency", "kv_load") and concurrency and workload.get("isl") and workload.get("osl"):
        return "\n".join(head + [
            "# more loads give the own correction its slope over load, e.g. CONCURRENCIES=\"8 16 32 64\"",
            f'CONCURRENCIES="${{CONCURRENCIES:-{concurrency}}}"',
            'for C in $CONCURRENCIES; do',
            _line([*common, *_lengths(workload), "--concurrency", '"$C"', "--request-count",
                   f"$(({int(CLIENT_REQUEST_RATIO)} * C))", "--warmup-request-count", '"$C"',
                   "--artifact-dir", f'"$HERE/{BENCH_DIR}/c$C"'], "  "),
            "done", ""])
    if shape == "request_rate" and workload.get("isl") and workload.get("osl"):
        rate = float(workload["request_rate"])
        count = max(100, round(float(workload.get("num_request_ratio") or 10.0) * rate))
        return "\n".join(head + [
            "# an open loop at the sweep's rate; spica calibrate fits on closed-loop runs: add one at the",
            "# concurrency this pick held in replay (simulation_record.yaml, expected.metrics) with the",
            "# CONCURRENCIES loop of a concurrency workload's bench.sh",
            _line([*common, *_lengths(workload), "--request-rate", f"{rate:g}", "--request-count", str(count),
                   "--artifact-dir", f'"$HERE/{BENCH_DIR}/rate{rate:g}"']), ""])
    if shape in ("trace", "capped_trace") and workload.get("trace_path"):
        cap = ["--concurrency", str(workload["replay_concurrency"])] if workload.get("replay_concurrency") else []
        speedup = float(workload.get("arrival_speedup_ratio") or 1.0)
        note = [f"# the sweep sped the trace's arrivals up {speedup:g}x; AIPerf replays its own timestamps"] \
            if speedup != 1.0 else []
        return "\n".join(head + note + [
            "# the sweep's trace on its timestamps; spica calibrate fits on closed-loop runs: add one at the",
            "# trace's mean ISL/OSL with the CONCURRENCIES loop of a concurrency workload's bench.sh",
            f'TRACE="${{TRACE:-{workload["trace_path"]}}}"  # relative to where the sweep ran',
            _line([*common, "--input-file", '"$TRACE"', "--custom-dataset-type", "mooncake_trace", "--fixed-schedule",
                   *cap, "--extra-inputs", "ignore_eos:true", "--artifact-dir", f'"$HERE/{BENCH_DIR}/trace"']), ""])
    return "\n".join(head + [f"# a {shape or 'this'} workload has no one AIPerf command: measure closed loops at",
                             "# its ISL/OSL with the CONCURRENCIES loop of a concurrency workload's bench.sh", ""])
