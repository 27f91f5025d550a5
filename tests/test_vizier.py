"""VizierClient: algorithm selection, seeding, history replay, infeasible handling (fast designers)."""

import json
import os
import subprocess
import sys

import pytest
from branch_stub import Branch

from spica_pipeline.errors import ConfigError
from spica_pipeline.optimize.encoding import CONSTANT_PARAM, build_encoding
from spica_pipeline.optimize.vizier import ALGO_ENV, VizierClient, derive_seed, resolve_algorithm
from spica_pipeline.space.shapes import RoleShape as R

POOL = (R(tp=1, replicas=4), R(tp=2, replicas=2), R(tp=2, attention_dp=2), R(tp=4), R(tp=1, replicas=2))
BRANCH = Branch(
    "agg", POOL, tuple(("vllm",) for _ in POOL),
    {"backend": ["vllm"], "router_mode": ["kv_router", "round_robin"], "agg_max_num_seqs": [64, 128, 256],
     "planner_scaling_policy": ["none", {"enable_throughput_scaling": True}]},
    4, {"kv_load_ratio": (0.2, 0.8)},
)
ENC = build_encoding(BRANCH)
SINGLE = [("objective", "max")]
PARETO = [("throughput", "max"), ("latency", "min")]


@pytest.fixture(autouse=True)
def _no_env_override(monkeypatch, tmp_path):
    monkeypatch.delenv(ALGO_ENV, raising=False)


def client(algo, **kw):
    kw.setdefault("jax_cache_dir", "")
    return VizierClient(algorithm=algo, **kw)


def fake_eval(params, metrics=SINGLE):
    """Deterministic outcome per suggestion: every third one infeasible."""
    sel, _ = ENC.decode(params)
    score = sel["agg_max_num_seqs"] / 64 + (sel["router_mode"] == "kv_router") + sel["kv_load_ratio"]
    if sel["agg_max_num_seqs"] == 256 and sel["kv_load_ratio"] > 0.6:
        return None, "kv capacity"
    if len(metrics) == 1:
        return {"objective": score}, None
    return {"throughput": score, "latency": 10 - score}, None


def run_rounds(study, rounds=3, count=4, metrics=SINGLE):
    history = []
    batches = []
    for _ in range(rounds):
        batch = study.suggest(count, history)
        batches.append(batch)
        for p in batch:
            m, reason = fake_eval(p, metrics)
            history.append((p, m, reason))
    return batches, history


def test_resolve_algorithm_env_overrides(monkeypatch):
    assert resolve_algorithm("DEFAULT") == "DEFAULT"
    assert resolve_algorithm("gp_ucb_pe") == "DEFAULT"
    assert resolve_algorithm("DEFAULT", "NSGA2") == "NSGA2"
    monkeypatch.setenv(ALGO_ENV, "random_search")
    assert resolve_algorithm("DEFAULT", "NSGA2") == "RANDOM_SEARCH"
    study = client("DEFAULT").open_study(ENC, SINGLE, seed=0)
    assert study.algorithm == "RANDOM_SEARCH"
    monkeypatch.setenv(ALGO_ENV, "EAGLE")
    with pytest.raises(ConfigError, match=ALGO_ENV):
        client("DEFAULT").open_study(ENC, SINGLE, seed=0)


def test_unknown_configured_algorithm_names_the_field():
    with pytest.raises(ConfigError, match="algorithm: unknown Vizier algorithm 'CMA'"):
        client("CMA").open_study(ENC, SINGLE, seed=0)


def test_bad_metric_goal():
    with pytest.raises(ValueError, match="goal must be"):
        client("RANDOM_SEARCH").open_study(ENC, [("objective", "maximize")], seed=0)


@pytest.mark.parametrize("algo", ["QUASI_RANDOM_SEARCH", "RANDOM_SEARCH"])
def test_same_seed_and_history_give_same_suggestions(algo):
    a, _ = run_rounds(client(algo).open_study(ENC, SINGLE, seed=7))
    b, _ = run_rounds(client(algo).open_study(ENC, SINGLE, seed=7))
    c, _ = run_rounds(client(algo).open_study(ENC, SINGLE, seed=8))
    assert a == b
    assert a != c
    for batch in a:
        assert len(batch) == 4
        for p in batch:
            ENC.decode(p)  # every suggestion lies in the space


def test_resume_reproduces_next_batch():
    """A new process with the same ledger asks for the same next batch (state = ledger)."""
    _, history = run_rounds(client("RANDOM_SEARCH").open_study(ENC, SINGLE, seed=3), rounds=2)
    again = client("RANDOM_SEARCH").open_study(ENC, SINGLE, seed=3).suggest(4, history)
    assert again == client("RANDOM_SEARCH").open_study(ENC, SINGLE, seed=3).suggest(4, history)
    assert derive_seed(3, "agg", 8) == derive_seed(3, "agg", 8) != derive_seed(3, "agg", 9)
    assert derive_seed(3, "agg", 8) != derive_seed(3, "disagg", 8)


@pytest.mark.parametrize("algo", ["DEFAULT", "GAUSSIAN_PROCESS_BANDIT", "NSGA2", "RANDOM_SEARCH"])
def test_first_batch_is_quasi_random_for_every_algorithm(algo):
    study = client(algo).open_study(ENC, SINGLE, seed=1)
    first = study.suggest(4, [])
    assert study.last_designer == "QUASI_RANDOM_SEARCH"
    assert first == client("QUASI_RANDOM_SEARCH").open_study(ENC, SINGLE, seed=1).suggest(4, [])
    assert study.last_suggest_seconds < 30


def test_all_infeasible_history_stays_on_quasi_random_for_gp():
    study = client("DEFAULT").open_study(ENC, SINGLE, seed=1)
    first = study.suggest(4, [])
    second = study.suggest(4, [(p, None, "kv capacity") for p in first])
    assert study.last_designer == "QUASI_RANDOM_SEARCH"
    assert not {json.dumps(p, sort_keys=True) for p in first} & {json.dumps(p, sort_keys=True) for p in second}


def test_quasi_random_rounds_continue_the_sequence():
    batches, _ = run_rounds(client("QUASI_RANDOM_SEARCH").open_study(ENC, SINGLE, seed=0), rounds=4)
    keys = [json.dumps(p, sort_keys=True) for b in batches for p in b]
    assert len(keys) == len(set(keys)) == 16


def test_pending_parameters_are_not_resuggested():
    study = client("QUASI_RANDOM_SEARCH").open_study(ENC, SINGLE, seed=0)
    first = study.suggest(4, [])
    nxt = study.suggest(4, [], pending=first)
    assert not {json.dumps(p, sort_keys=True) for p in first} & {json.dumps(p, sort_keys=True) for p in nxt}


@pytest.mark.parametrize("metrics", [SINGLE, PARETO], ids=["single", "pareto"])
def test_nsga2_with_infeasible_history_does_not_crash(metrics):
    study = client("NSGA2").open_study(ENC, metrics, seed=0)
    batches, history = run_rounds(study, rounds=4, metrics=metrics)
    assert any(reason for _, _, reason in history)
    assert study.last_designer == "NSGA2"
    assert all(len(b) == 4 for b in batches)


def test_non_finite_metrics_count_as_infeasible_and_foreign_rows_are_skipped():
    study = client("NSGA2").open_study(ENC, SINGLE, seed=0)
    first = study.suggest(4, [])
    history = [(first[0], {"objective": float("-inf")}, None), (first[1], {"objective": 1.0}, None),
               ({"no_such_param": 1.0}, {"objective": 2.0}, None)]
    out = study.suggest(4, history)
    assert len(out) == 4 and study.skipped_history == 1


def test_suggest_async_matches_suggest():
    study = client("RANDOM_SEARCH").open_study(ENC, SINGLE, seed=5)
    _, history = run_rounds(study, rounds=1)
    fut = study.suggest_async(4, history)
    assert fut.result(timeout=60) == study.suggest(4, history)


def test_zero_parameter_space_works():
    enc = build_encoding(Branch("agg", (R(tp=2),), (("vllm",),), {"backend": ["vllm"]}, 2))
    study = client("RANDOM_SEARCH").open_study(enc, SINGLE, seed=0)
    out = study.suggest(2, [])
    assert out and all(p == {CONSTANT_PARAM: "0"} for p in out)


def test_import_does_not_touch_jax():
    code = ("import os, sys; import spica_pipeline.optimize.vizier as v; "
            "print(os.environ.get('JAX_PLATFORMS'), 'jax' in sys.modules, 'vizier' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == ["None", "False", "False"]


def test_open_study_sets_cpu_platform_and_cache(tmp_path):
    code = (
        "import os; from types import SimpleNamespace as NS\n"
        "from spica_pipeline.optimize.vizier import VizierClient\n"
        "from spica_pipeline.optimize.encoding import build_encoding\n"
        "from spica_pipeline.space.shapes import RoleShape\n"
        "b = NS(deployment_mode='agg', parallel_configs=(RoleShape(tp=1), RoleShape(tp=2)), "
        "supported_backends=(('vllm',), ('vllm',)), knob_choices={}, gpu_budget=2, float_ranges={})\n"
        f"c = VizierClient(algorithm='QUASI_RANDOM_SEARCH', jax_cache_dir={str(tmp_path)!r})\n"
        "c.open_study(build_encoding(b), [('o', 'max')], seed=0).suggest(1, [])\n"
        "import jax\n"
        "print(os.environ.get('JAX_PLATFORMS'), jax.config.jax_enable_x64, "
        "jax.config.jax_compilation_cache_dir)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=os.path.join(os.path.dirname(__file__), ".."))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["cpu", "True", str(tmp_path)]


@pytest.mark.slow
def test_gp_bandit_is_seeded():
    """GP bandit (the cheaper GP: ~10-15 s CPU per call here) with a tiny acquisition budget;
    GP-UCB-PE is seeded the same way (rng=PRNGKey(derived seed)) but costs ~30-50 s per call."""
    kw = dict(acquisition_evaluations=200, ard_random_restarts=1, ard_max_iterations=20)
    _, history = run_rounds(client("QUASI_RANDOM_SEARCH").open_study(ENC, SINGLE, seed=0), rounds=2)
    a = client("GAUSSIAN_PROCESS_BANDIT", **kw).open_study(ENC, SINGLE, seed=11)
    b = client("GAUSSIAN_PROCESS_BANDIT", **kw).open_study(ENC, SINGLE, seed=11)
    sa, sb = a.suggest(2, history), b.suggest(2, history)
    assert a.last_designer == "GAUSSIAN_PROCESS_BANDIT"
    assert sa == sb
    for p in sa:
        ENC.decode(p)


def test_floor_padding_keeps_one_trial_shape_across_rounds():
    import numpy as np

    client("QUASI_RANDOM_SEARCH").open_study(ENC, SINGLE, seed=0).problem()  # the runtime setup first
    from spica_pipeline.optimize.gp_designer import floor_padding

    pad = floor_padding(32)
    for n in (1, 5, 17, 32):
        arr = pad.pad_features(np.ones((n, 3)))
        assert arr.padded_array.shape == (32, 3)
        assert np.asarray(arr.unpad()).shape == (n, 3)
    assert pad.pad_features(np.ones((33, 3))).padded_array.shape == (64, 3)
    assert pad.pad_labels(np.ones((0, 1))).padded_array.shape == (0, 1)
