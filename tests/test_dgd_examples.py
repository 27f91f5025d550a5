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


def test_a_hugging_face_id_is_served_as_written(tmp_path, monkeypatch):
    """sla.yaml names meta-llama/Llama-3.1-70B-Instruct: the sweep times aiconfigurator-core's Meta-Llama-3.1-70B,
    and dgd.yaml and bench.sh serve the instruct checkpoint the user asked for."""
    from spica_pipeline.evaluate.scoring import Candidate as Pick
    from spica_pipeline.report.deploy import write_deploy_folder

    monkeypatch.chdir(REPO)
    asked = "meta-llama/Llama-3.1-70B-Instruct"
    config, renamed = resolve_names(load_config(REPO / "examples" / "configs" / "sla.yaml"))
    assert config.search_space.model_name != asked and renamed
    assert config.deploy.served_model == asked
    branch = enumerate_branches(filter_policies(config).config).branches[0]
    selection = {k: v[0] for k, v in branch.knob_choices.items()}
    selection.update(backend=branch.supported_backends[0][0], deployment_mode=branch.deployment_mode)
    candidate = build_candidate(config.search_space, selection, branch.parallel_configs[0])
    pick = Pick(config=candidate.to_dict(), used_gpus=candidate.used_gpus, score=1.0, metrics={})
    write_deploy_folder(tmp_path, pick, 1, target="throughput", description="", options=deploy_options(config))
    dgd = (tmp_path / "dgd.yaml").read_text()
    assert asked in dgd and "Meta-Llama-3.1-70B\n" not in dgd
    assert f'MODEL="${{MODEL:-{asked}}}"' in (tmp_path / "bench.sh").read_text()


def test_a_served_model_given_in_deploy_is_kept(monkeypatch):
    monkeypatch.chdir(REPO)
    config = load_config(REPO / "examples" / "configs" / "sla.yaml")
    config = config.model_copy(update={"deploy": config.deploy.model_copy(update={"served_model": "my-org/tuned"})})
    assert resolve_names(config)[0].deploy.served_model == "my-org/tuned"
