"""The sweep's preflight: every check that can refuse a config before its first replay, in one place.

`spica validate`, `spica sweep` (`sweep.prepare`) and the Dagster validated_config asset all call
`preflight`, so the three give the same verdict with the same line, and no sweep replays and then
fails on something knowable at start. In order:

    algorithm (SPICA_VIZIER_ALGO included) -> the ray extra for `executor: ray` -> the trace file
    exists -> model and GPU names resolve (space/model_hw.py) -> `calibration: auto` takes an own
    profile of this model, system and precision from the profile directory -> every backend has a
    deploy writer (report/dgd.py) -> precision the model and GPU can run -> the workload (trace read
    whole, input + output or a session's longest history within the context, resource limits,
    calibration profile (an own profile of another model, system or precision is refused),
    the speculative acceptance a searched speculative method needs) -> planner policies left
    by the goal -> the branch enumeration (perf data per system/backend/precision, KV fit, pins)

A refusal is a `PreflightError` (exit 2) whose `line(where)` is the one line both commands print.

With prefill and decode on their own GPU types, their names and the budget's types resolve with the
model's, and right after (`check_gpu_types`) every type a role may run on has perf data for a
searched backend and a budget per type names each type a role runs on, and only those.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spica_pipeline.config import SmartSearchConfig
from spica_pipeline.config.limits import MAX_REQUESTS_PER_REPLAY, check_resource_limits
from spica_pipeline.config.search_space import SearchSpace
from spica_pipeline.config.sweep import resolve_algorithm
from spica_pipeline.errors import ConfigError, PolicyFilterError, ResourceLimitError, SpicaError, TraceError
from spica_pipeline.evaluate.ray_pool import require_ray
from spica_pipeline.fidelity.profile import (
    FIXED_LENGTHS,
    deployment_text,
    find_own_profile,
    fixed_length_backends,
    load_profile,
    own_mismatch,
    own_of,
)
from spica_pipeline.report.dgd import DEPLOY_BACKENDS
from spica_pipeline.space.branches import BranchEnumeration, enumerate_branches
from spica_pipeline.space.model_hw import (
    ResolvedName,
    check_precision,
    perf_databases,
    resolve_hardware,
    resolve_model,
)
from spica_pipeline.space.parallel import resolve_max_seq_len
from spica_pipeline.space.policies import PolicyFilterResult, filter_scaling_policies
from spica_pipeline.traces import path_problem, read_mooncake_trace


class PreflightError(ConfigError):
    """A config the sweep would refuse, found before any replay. `line(where)` prefixes the config
    file, except for a trace problem, whose message starts with the trace file and line."""

    def __init__(self, message: str, *, names_config: bool = True):
        super().__init__(message)
        self.names_config = names_config

    def line(self, where: str | Path | None) -> str:
        if not self.names_config or where is None:
            return str(self)
        return f"invalid config {where}: {self}"


def refusal_line(err: SpicaError, where: str | Path | None) -> str:
    """The one line a command prints for `err` (a preflight refusal names the config file)."""
    return err.line(where) if isinstance(err, PreflightError) else str(err)


@dataclass(frozen=True)
class Preflight:
    """What the checks found: the config with its names resolved (every later stage reads this one),
    the planner-policy filter's result, the branch enumeration, and what to tell the user."""

    config: SmartSearchConfig
    filtered: PolicyFilterResult
    enumeration: BranchEnumeration
    algorithm: str
    renamed: list[str] = field(default_factory=list)  # "model X -> Y (why)", one per resolved name
    workload_warnings: list[str] = field(default_factory=list)

    @property
    def warnings(self) -> list[str]:
        """Every warning of the checks, in the order they ran (names, workload, policies, branches)."""
        dropped = [self.filtered.summary()] if self.filtered.dropped else []
        return self.renamed + self.workload_warnings + dropped + list(self.enumeration.warnings)


def preflight(config: SmartSearchConfig) -> Preflight:
    """Run every check in the module docstring's order; raises PreflightError (exit 2) on the first
    refusal. Cheap where the config is good: the enumeration it runs is memoised for the sweep."""
    try:
        return _preflight(config)
    except PreflightError:
        raise
    except TraceError as err:  # names the trace file and line itself
        raise PreflightError(str(err), names_config=False) from None
    except PolicyFilterError as err:
        raise PreflightError(f"search_space.planner_scaling_policy: {err}") from None
    except SpicaError as err:
        if err.exit_code != ConfigError.exit_code:
            raise
        raise PreflightError(str(err)) from None


def _preflight(config: SmartSearchConfig) -> Preflight:
    algorithm = resolve_algorithm(config.sweep.algorithm)
    if config.sweep.executor == "ray":
        require_ray()
    check_trace_path(config)
    config, renamed = resolve_names(config)
    check_gpu_types(config)
    config, found = resolve_calibration(config)
    renamed += found
    check_backends(config)
    space = config.search_space
    check_precision(space.precision, space.model_name, space.hardware_sku)
    workload_warnings = check_workload(config)
    filtered = filter_scaling_policies(config)
    enumeration = enumerate_branches(filtered.config)
    return Preflight(config=config, filtered=filtered, enumeration=enumeration, algorithm=algorithm,
                     renamed=renamed, workload_warnings=workload_warnings)


def check_trace_path(config: SmartSearchConfig) -> None:
    """A trace workload's file exists and is a regular file (before anything reads the model)."""
    trace = config.workload.trace_path
    problem = path_problem(trace) if trace is not None else None
    if problem is None:
        return
    hint = (f" (relative paths resolve against the working directory {Path.cwd()})"
            if problem.startswith("does not exist") and not Path(str(trace)).is_absolute() else "")
    raise PreflightError(f"workload.trace_path {trace!r} {problem}{hint}")


def resolve_names(config: SmartSearchConfig) -> tuple[SmartSearchConfig, list[str]]:
    """The config with search_space.model_name and hardware_sku as aiconfigurator-core names them
    (a Hugging Face id, an alias or a local config.json -> the name every stage uses), and one
    line per name that changed."""
    space = config.search_space
    model: ResolvedName = resolve_model(space.model_name)
    hardware: ResolvedName = resolve_hardware(space.hardware_sku)
    renamed = [note for note in (model.note("model"), hardware.note("hardware")) if note]
    update, types = _resolve_gpu_types(space)
    renamed += types
    if not renamed:
        return config, []
    space = space.model_copy(update={"model_name": model.name, "hardware_sku": hardware.name, **update})
    deploy = config.deploy
    if deploy.served_model is None and model.served is not None:
        # the sweep times the shipped config of the same shape; the manifest serves the checkpoint asked for
        deploy = deploy.model_copy(update={"served_model": model.served})
        renamed.append(f"deploy.served_model {model.served} (dgd.yaml and bench.sh serve the checkpoint as named)")
    return config.model_copy(update={"search_space": space, "deploy": deploy}), renamed


def _resolve_gpu_types(space: SearchSpace) -> tuple[dict[str, Any], list[str]]:
    """A disagg role's own GPU types and the budget's types as aiconfigurator-core names them: the fields to
    update (none when every name is as written) and one line per name that changed."""
    update: dict[str, Any] = {}
    notes: list[str] = []

    def resolved(field: str, given: str) -> str:
        try:
            found = resolve_hardware(given)
        except SpicaError as err:  # the message names hardware_sku: say which field it is
            raise PreflightError(str(err).replace("search_space.hardware_sku", f"search_space.{field}")) from None
        note = found.note(field)
        if note:
            notes.append(note)
        return found.name

    for role_field in ("prefill_hardware_sku", "decode_hardware_sku"):
        listed = getattr(space, role_field)
        if listed:
            names = [resolved(role_field, name) for name in listed]
            if names != list(listed):
                update[role_field] = names
    if space.gpu_budget_by_type is not None:
        budgets: dict[str, int] = {}
        for name, gpus in space.gpu_budget_by_type.items():
            key = resolved("gpu_budget", name)
            if key in budgets:
                raise PreflightError(f"search_space.gpu_budget names {key} twice ({name!r} is {key} too)")
            budgets[key] = gpus
        if list(budgets) != list(space.gpu_budget_by_type):
            update["gpu_budget_by_type"] = budgets
    return update, notes


def check_gpu_types(config: SmartSearchConfig) -> None:
    """Every GPU type a disagg role may run on has aiconfigurator-core perf data for a searched backend, and a
    budget per GPU type names each type a role runs on and no other."""
    space = config.search_space
    databases = perf_databases()
    if space.split_systems:
        for role in ("prefill", "decode"):
            for system in space.role_systems(role):
                have = databases.get(system, {})
                if not any(backend in have for backend in space.backend):
                    with_data = [s for s, found in databases.items() if any(b in found for b in space.backend)]
                    raise PreflightError(
                        f"search_space.{role}_hardware_sku: {system} has no aiconfigurator-core perf data for "
                        f"backend {', '.join(space.backend)} (it has {', '.join(sorted(have)) or 'none'}), so its "
                        f"{role} passes cannot be timed; GPU types with that data: {', '.join(with_data)}")
    if space.gpu_budget_by_type is None:
        return
    used = {space.hardware_sku} if "agg" in space.deployment_mode or not space.split_systems else set()
    if "disagg" in space.deployment_mode:
        used |= {s for role in ("prefill", "decode") for s in space.role_systems(role)}
    named = dict.fromkeys([space.hardware_sku, *space.role_systems("prefill"), *space.role_systems("decode")])
    missing = [s for s in named if s in used and s not in space.gpu_budget_by_type]
    if missing:
        raise PreflightError(f"search_space.gpu_budget gives GPUs of {', '.join(space.gpu_budget_by_type)} but the "
                             f"candidates also run on {', '.join(missing)}; give each GPU type its GPUs")
    unused = [s for s in space.gpu_budget_by_type if s not in used]
    if unused:
        raise PreflightError(f"search_space.gpu_budget gives GPUs of {', '.join(unused)}, which no role runs on "
                             f"(roles run on {', '.join(sorted(used))}); remove it or list it in "
                             "prefill_hardware_sku / decode_hardware_sku")


def _precision(config: SmartSearchConfig) -> dict[str, str]:
    """The sweep's set precision fields ({} for the checkpoint's own), as a candidate carries them."""
    precision = config.search_space.precision
    return {k: v for k, v in (precision.model_dump() if precision else {}).items() if v is not None}


def resolve_calibration(config: SmartSearchConfig) -> tuple[SmartSearchConfig, list[str]]:
    """`evaluation.calibration: auto` with an own profile of the sweep's model, system, precision and one of its
    backends in the profile directory (fidelity/profile.find_own_profile): the config with that file, and one
    line saying so (plus a line per profile found but not used)."""
    if config.evaluation.calibration != "auto":
        return config, []
    space = config.search_space
    path, notes = find_own_profile(model=space.model_name, system=space.hardware_sku, backends=list(space.backend),
                                   precision=_precision(config))
    if path is None:
        return config, notes
    evaluation = config.evaluation.model_copy(update={"calibration": str(path)})
    return config.model_copy(update={"evaluation": evaluation}), [f"calibration auto -> {path} (an own profile of "
                                                                  "this model, system and precision)", *notes]


def check_backends(config: SmartSearchConfig) -> None:
    """Every searched backend has a deploy writer: each pick is written as a DynamoGraphDeployment,
    so a backend without one would replay and then fail at the end."""
    missing = [b for b in config.search_space.backend if b not in DEPLOY_BACKENDS]
    if missing:
        raise PreflightError(
            f"search_space.backend: no DynamoGraphDeployment writer for {', '.join(map(repr, missing))} "
            f"(the picks' deploy/<rank>/dgd.yaml is written for {', '.join(DEPLOY_BACKENDS)}); "
            "remove it from search_space.backend")


def check_workload(config: SmartSearchConfig) -> list[str]:
    """The workload checks: a trace is read whole once, so a malformed line or a request whose
    input + output is longer than the model's context is one error naming file and line; a synthetic
    isl + osl over the context is one error naming the fields; the resource sanity limits
    (config/limits.py) refuse what no replay can serve; the calibration profile loads and serves the
    benchmark client's lengths (`check_calibration`). Never a failure per candidate.
    Returns the trace's and the calibration's warnings (one line each, with a count)."""

    space = config.search_space
    workload = config.workload
    calibration_warnings = check_calibration(config) + check_speculative(config)
    if workload.sessions is not None:
        check_sessions(config)
        return calibration_warnings
    if not workload.trace_path:
        check_resource_limits(config)
        if workload.isl is not None and workload.osl is not None:
            try:
                context = resolve_max_seq_len(space.model_name, space.context_length)
            except SpicaError:
                return calibration_warnings  # an unknown model or context: the enumeration reports it
            if workload.isl + workload.osl > context:
                raise ConfigError(f"workload.isl {workload.isl} + workload.osl {workload.osl} = "
                                  f"{workload.isl + workload.osl} tokens exceeds the context length {context} "
                                  "of the model (search_space.context_length or the model's own): input and "
                                  "output must both fit")
        return calibration_warnings
    trace = read_mooncake_trace(workload.trace_path,
                                max_input_length=resolve_max_seq_len(space.model_name, space.context_length))
    check_resource_limits(config, trace)
    return list(trace.warnings) + calibration_warnings


def check_speculative(config: SmartSearchConfig) -> list[str]:
    """Speculative decoding the sweep searches needs the traffic's acceptance, one number or one per draft
    position up to the most draft tokens searched; acceptance without any speculation is a warning."""
    space, workload = config.search_space, config.workload
    acceptance = workload.speculative_acceptance
    most = max([k for k in space.speculative_num_tokens if space.speculative_on] + [int(space.aic_nextn or 0)])
    if most == 0:
        if acceptance is None:
            return []
        return ["workload.speculative_acceptance changes nothing: no candidate speculates (search_space."
                "speculative_method is none)"]
    if acceptance is None:
        if not space.speculative_on:
            return []  # a pinned aic_nextn alone keeps the replay's own acceptance rates
        raise ConfigError("workload.speculative_acceptance is required with search_space.speculative_method "
                          f"{space.speculative_method}: the probability that a draft token is accepted (one number, "
                          "or one per draft position), a property of the traffic")
    if isinstance(acceptance, list) and len(acceptance) < most:
        raise ConfigError(f"workload.speculative_acceptance gives {len(acceptance)} draft position(s) but up to "
                          f"{most} draft tokens are searched; give one number or at least {most} values")
    return []


def check_sessions(config: SmartSearchConfig) -> None:
    """A sessions workload's longest history fits the model context, and its turns stay under the
    requests-per-replay limit (config/limits.py)."""
    sessions = config.workload.sessions
    assert sessions is not None
    space = config.search_space
    check_resource_limits(config)  # the GPU budget (a sessions workload has no synthetic request count)
    longest = sessions.max_history()
    try:
        context = resolve_max_seq_len(space.model_name, space.context_length)
    except SpicaError:
        context = None  # an unknown model or context: the enumeration reports it
    if context is not None and longest > context:
        raise ConfigError(f"workload.sessions: the longest session reaches {longest} tokens (first_isl + (turns - 1) "
                          f"x (osl + turn_isl) + osl at their maxima), over the context length {context} of the "
                          "model (search_space.context_length or the model's own)")
    requests = sessions.count * int(sessions.bounds("turns")[1])
    if requests > MAX_REQUESTS_PER_REPLAY:
        raise ResourceLimitError(f"workload.sessions: count {sessions.count} x up to {int(sessions.bounds('turns')[1])} "
                                 f"turns = {requests:,} requests, over the limit of {MAX_REQUESTS_PER_REPLAY:,} "
                                 "requests per replay")


def check_calibration(config: SmartSearchConfig) -> list[str]:
    """The profile loads (a ConfigError names a missing or corrupt file), an own profile is of this sweep's
    model, system and precision (else a ConfigError naming both), and `client_lengths: fixed` has fixed-length
    factors to select; a warning names the searched backends the profile changes nothing for."""

    profile, _ = load_profile(config.evaluation.calibration)
    space = config.search_space
    why = own_mismatch(profile, model=space.model_name, system=space.hardware_sku, precision=_precision(config))
    if why:
        raise ConfigError(f"evaluation.calibration: {config.evaluation.calibration} {why}")
    own = own_of(profile)
    warnings = [] if own is None or own["backend"] in space.backend else [
        f"evaluation.calibration: {config.evaluation.calibration} is the own profile of "
        f"{deployment_text(own['model'], own['system'], own.get('precision'), own['backend'])}; this sweep searches "
        f"{', '.join(space.backend)}, whose candidates read the packaged corrections it carries"]
    if config.evaluation.client_lengths != "fixed":
        return warnings
    covered = fixed_length_backends(profile) if profile is not None else frozenset()
    if not covered:
        raise ConfigError(f"evaluation.client_lengths: 'fixed' needs a calibration profile with {FIXED_LENGTHS} "
                          f"factors (calibration: auto has them); {config.evaluation.calibration!r} has none")
    others = [b for b in config.search_space.backend if b not in covered]
    if not others:
        return warnings
    return warnings + [
        f"evaluation.client_lengths 'fixed' changes nothing for backend {', '.join(others)}: the profile has "
        f"fixed-length factors for {', '.join(sorted(covered))} only (a fixed-length client there drifts apart "
        "like the spread replay; docs/fidelity.md)"]
