"""`spica validate --config F`: the sweep's preflight on a config file (the same checks and the same one-line
refusal as `spica sweep` before its first replay), then a summary of what it searches."""

import argparse
import sys
from typing import Any

from spica_pipeline.cli.common import EXIT_OK, fail, load_or_report
from spica_pipeline.config import presets
from spica_pipeline.config.sweep import ALGO_ENV, resolve_algorithm
from spica_pipeline.preflight import PreflightError, preflight
from spica_pipeline.space.speculative import speculative_choices


def _choices_text(values: list[Any]) -> str:
    shown = [v if isinstance(v, str) else (f"custom_{i}" if isinstance(v, dict) else repr(v))
             for i, v in enumerate(values)]
    return ", ".join(shown)


def _inert_reason(space: Any, name: str) -> str | None:
    """Why a list knob never reaches the study (pruned as a dependent knob or swept elsewhere), or None."""
    if name == "load_predictor_candidates":
        return f"{len(space.load_predictor_candidates)} entries, swept by the load-predictor sub-sweep"
    if name in presets.ROUTER_CHOICES and space.round_robin_only:
        return "router_mode is round_robin only"
    if name in presets.OFFLOAD_ROUTER_KNOBS and not space.offload_enabled:
        return "num_g2_blocks is 0"
    if name in ("planner_fpm_sampling", "planner_load_sensitivity") and all(
        presets.is_static_policy(p) for p in space.planner_scaling_policy
    ):
        return "every scaling policy is static"
    modes = set(space.deployment_mode)
    if name.startswith(("prefill_", "decode_")) and name in presets.ENGINE_CHOICES and "disagg" not in modes:
        return "no disagg branch"
    if name.startswith("agg_") and "agg" not in modes:
        return "no agg branch"
    return None


def summarize(config: Any) -> list[str]:
    """A short human summary: branches, searched knobs, pins, workload and goal."""
    space, workload, goal, sweep = config.search_space, config.workload, config.goal, config.sweep
    budget = (" + ".join(f"{gpus} {system}" for system, gpus in space.gpu_budget_by_type.items())
              if space.gpu_budget_by_type else str(space.gpu_budget))
    lines = [f"model {space.model_name} on {space.hardware_sku}, gpu_budget {budget}"
             + (f" (min {space.min_gpu_budget})" if space.min_gpu_budget else "")]
    if space.split_systems:  # disagg roles on their own GPU types (searched when one lists several)
        lines.append("disagg roles on: " + "; ".join(f"{role} {' | '.join(space.role_systems(role))}"
                                                      for role in ("prefill", "decode")))
    lines.append(f"branches: {', '.join(dict.fromkeys(space.deployment_mode))}")
    searched, pinned, inert = [], [], []
    for name, values in space.choice_lists().items():
        if name in ("deployment_mode",):
            continue
        why = _inert_reason(space, name)
        if why:
            inert.append(f"  {name} ({why})")
        elif len(values) > 1:
            searched.append(f"  {name}: {len(values)} choices [{_choices_text(values)}]")
        else:
            pinned.append(f"  {name} = {_choices_text(values)}")
    spec = speculative_choices(space)
    if space.speculative_on and not spec.searched:
        inert.append(f"  speculative_method ({'; '.join(spec.dropped.values()) or 'no method left'})")
    for name, values in spec.knobs().items():
        (searched if len(values) > 1 else pinned).append(
            f"  {name}: {len(values)} choices [{_choices_text(values)}]" if len(values) > 1
            else f"  {name} = {_choices_text(values)}")
    for role in ("prefill", "decode") if "disagg" in space.deployment_mode else ():
        if len(space.role_systems(role)) > 1:
            searched.append(f"  {role}_hardware_sku: {len(space.role_systems(role))} choices "
                            f"[{_choices_text(space.role_systems(role))}]")
    lines.append(f"searched knobs ({len(searched)}):")
    lines += searched or ["  (none)"]
    lines.append(f"pinned knobs ({len(pinned)}):")
    lines += pinned
    if inert:
        lines.append(f"inactive knobs ({len(inert)}):")
        lines += inert
    if space.parallel_configs:
        lines.append(f"parallel_configs: {len(space.parallel_configs)} pinned shape(s)")
    else:
        lines.append("parallel_configs: derived by enumeration")
    shape = workload.shape
    if workload.sessions is not None:
        ss = workload.sessions
        wl = (f"sessions: {ss.count} at {ss.session_rate:g}/s, turns {ss.turns}, first_isl {ss.first_isl}, "
              f"turn_isl {ss.turn_isl}, osl {ss.osl}, think_time_s {ss.think_time_s}")
    elif workload.is_trace:
        wl = f"trace {workload.trace_path} (speedup {workload.arrival_speedup_ratio})"
        if workload.replay_concurrency is not None:
            wl += f", capped at {workload.replay_concurrency} in flight"
    else:
        load = {
            "request_rate": f"request_rate {workload.request_rate} req/s",
            "concurrency": f"concurrency {workload.concurrency}",
            "kv_load": f"kv_load_ratio {workload.kv_load_ratio}",
        }[shape]
        wl = f"synthetic isl {workload.isl} osl {workload.osl}, {load}, num_request_ratio {workload.num_request_ratio}"
    if workload.speculative_acceptance is not None:
        wl += f", speculative_acceptance {workload.speculative_acceptance}"
    lines.append(f"workload: {wl}")
    objectives = ", ".join(t.value for t in goal.objectives())
    g = f"goal: {goal.target.value}" + (f" [{objectives}]" if goal.is_pareto else "")
    if goal.sla is not None:
        sla = {k: v for k, v in goal.sla.model_dump().items() if v is not None}
        g += f", sla {sla}"
    if getattr(goal, "load", None) is not None:
        g += f", load {goal.load.kind} {goal.load.value:g}"
    lines.append(g)
    lines.append(
        f"sweep: policy {sweep.policy}, algorithm {sweep.algorithm}, max_rounds {sweep.max_rounds}, "
        f"time_budget {'-' if sweep.time_budget is None else f'{sweep.time_budget:g}s'}, "
        f"per_round {sweep.per_round}, parallel_evals {sweep.parallel_evals}, seed {sweep.seed}"
    )
    return lines


def cmd_validate(args: argparse.Namespace) -> int:
    """Validate a config file the way the sweep would before its first replay (preflight.py), and
    print what it would sweep."""
    config = load_or_report(args.config)
    if isinstance(config, int):
        return config
    try:
        checked = preflight(config)
    except PreflightError as err:
        return fail(err.line(args.config))
    config = checked.config
    try:
        lines = summarize(config)
    except Exception as err:  # a summary bug must not turn into a traceback either
        return fail(f"could not summarise config {args.config}: {type(err).__name__}: {err}")

    for warning in checked.workload_warnings + list(checked.enumeration.warnings):
        print(f"warning: {warning}", file=sys.stderr)
    print(f"config {args.config} is valid")
    for line in checked.renamed:
        print(line)
    for line in lines:
        print(line)
    if checked.algorithm != config.sweep.algorithm:
        print(f"algorithm {checked.algorithm} (from {ALGO_ENV}, overriding sweep.algorithm {config.sweep.algorithm})")
    if checked.filtered.dropped:
        print(checked.filtered.summary())
    return EXIT_OK


def algorithm_of(config: Any) -> str:
    """The Vizier algorithm a study would use, SPICA_VIZIER_ALGO included (ConfigError if unknown)."""
    return resolve_algorithm(config.sweep.algorithm)


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    validate = sub.add_parser(
        "validate", parents=[common], help="[EXPERIMENTAL] validate a sweep config and summarise it",
        description="[EXPERIMENTAL] Validate a sweep config and print a short summary.",
    )
    validate.add_argument("--config", required=True, help="path to the sweep YAML")
    validate.set_defaults(func=cmd_validate)
