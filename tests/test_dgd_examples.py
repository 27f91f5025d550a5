"""Every manifest an example sweep can write validates: for each example config, every parallel
config of every branch, on every backend that supports it, under each router mode and scaling policy
the config searches, rendered exactly as write_outputs renders a pick."""

from pathlib import Path

import pytest

from spica_pipeline.config import load_config
from spica_pipeline.preflight import resolve_names
from spica_pipeline.report.dgd import dgd_manifest, manifest_gpus, manifest_name, validate_manifest
from spica_pipeline.space.branches import enumerate_branches
from spica_pipeline.space.candidate import build_candidate
from spica_pipeline.space.plan import planner_config_for
from spica_pipeline.sweep import deploy_options, filter_policies

pytestmark = pytest.mark.integration  # real aiconfigurator-core data for the pools

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((REPO / "examples" / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_manifest_validates(path, monkeypatch):
    monkeypatch.chdir(REPO)
    config, _ = resolve_names(load_config(path))  # as the sweep does: Hugging Face ids -> shipped names
    config = filter_policies(config).config
    options = deploy_options(config)
    goal = config.goal
    sla = goal.sla.model_dump(exclude_none=True) if goal.sla else None
    checked = 0
    for branch in enumerate_branches(config).branches:
        base = {k: v[0] for k, v in branch.knob_choices.items()}
        variants = [dict(base, router_mode=r, planner_scaling_policy=p)
                    for r in branch.knob_choices["router_mode"] for p in branch.knob_choices["planner_scaling_policy"]]
        for pc, backends in zip(branch.parallel_configs, branch.supported_backends):
            for backend in backends:
                for selection in variants:
                    sel = {**selection, "backend": backend, "deployment_mode": branch.deployment_mode}
                    candidate = build_candidate(config.search_space, sel, pc)
                    planner = planner_config_for(candidate, planner_target=goal.planner_target, sla=sla)
                    doc = dgd_manifest(candidate, name=manifest_name(candidate.model, 1, branch.deployment_mode),
                                       options=options, planner_config=planner)
                    assert validate_manifest(doc) == [], (path.name, candidate)
                    assert manifest_gpus(doc) == candidate.used_gpus
                    checked += 1
    assert checked > 0
    print(f"{path.name}: {checked} manifests validated")
