"""Compile once, counted: a second GP-UCB-PE suggest in the same trial bucket (new trial count, new
history) compiles no XLA program, for one and two objectives (no timings asserted)."""

import random

import pytest
from test_vizier import ENC, PARETO, SINGLE, client, fake_eval

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def _history(n, metrics, seed):
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        p = {q.name: rng.uniform(*q.bounds) if q.kind == "double" else rng.choice(q.values) for q in ENC.params}
        m, reason = fake_eval(p, metrics)
        rows.append((p, m, reason))
    return rows


@pytest.mark.slow
@pytest.mark.parametrize("metrics", [SINGLE, PARETO], ids=["one-objective", "two-objectives"])
def test_second_suggest_in_a_bucket_compiles_nothing(metrics):
    compiles: list[float] = []

    def on_event(event, duration, **_):
        if event == COMPILE_EVENT:
            compiles.append(duration)

    study = client("DEFAULT").open_study(ENC, metrics, seed=0)
    study.problem()  # the runtime setup: JAX on CPU, then the private names may be imported
    import jax.monitoring

    from spica_pipeline.optimize import vizier_private as vp

    jax.monitoring.register_event_duration_secs_listener(on_event)
    try:
        study.suggest(4, _history(10, metrics, seed=0))  # 14 rows -> the 32-row bucket: compiles
        assert study.last_designer == "DEFAULT"
        first = len(compiles)
        assert first > 0
        again = study.suggest(4, _history(13, metrics, seed=1))  # 17 rows, same bucket
        assert study.last_designer == "DEFAULT" and len(again) == 4
        assert len(compiles) == first, f"{len(compiles) - first} programs compiled in the second suggest"
    finally:
        vp.unregister_event_duration_listener(on_event)
