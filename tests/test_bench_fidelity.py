"""bench/bench_fidelity.py replays real silicon rows: JSON shape and finite errors (no thresholds)."""

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

pytestmark = pytest.mark.integration

ROWS = (
    "qwen_qwen3_32b_qwen_qwen3_32b_h100_sxm_vllm_agg_1024x128_c8_tp2_epnone_1",
    "qwen_qwen3_235b_a22b_fp8_qwen_qwen3_235b_a22b_fp8_h200_sxm_sglang_agg_1000x100_c3_tp2_epnone_2",
    "2026_04_06_llama_3_1_70b_b200_sxm_vllm_fp8_agg_1024x1024_c4_tp1_ep1_805",
)


def test_three_silicon_rows(tmp_path):
    import bench_fidelity

    out = tmp_path / "fidelity.json"
    code = bench_fidelity.main(["--ids", ",".join(ROWS), "--json", str(out), "--cache-dir", str(tmp_path / "c")])
    assert code == 0
    data = json.loads(out.read_text())
    assert set(data["splits"]) == {"calibration", "heldout", "all"}
    cal = data["splits"]["calibration"]
    assert cal["rows"] > cal["expressible"] > 0
    assert cal["evaluated"] == 3 and data["splits"]["heldout"]["evaluated"] == 0
    for side in ("ours", "aic"):
        for metric in ("ttft", "tpot"):
            stats = cal[side][metric]
            assert set(stats) >= {"mdape", "p90", "bias"}
            assert all(math.isfinite(stats[k]) for k in ("mdape", "p90", "bias")), (side, metric, stats)
    assert {r["id"] for r in data["records"]} == set(ROWS)
