"""Trace -> traffic windows (spec §9.2)."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from spica_pipeline.space.load_predictor.windows import Windows, build_windows

ROOT = Path(__file__).resolve().parents[1]


def _sine_module():
    spec = importlib.util.spec_from_file_location("gen_sine_trace", ROOT / "scripts" / "gen_sine_trace.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_densified_example_from_spec():
    w = build_windows(np.array([0.0, 35_000.0]), np.array([100, 300]), np.array([10, 30]), 10)
    assert w.num_req.tolist() == [1, 0, 0, 1]
    assert w.avg_isl.tolist() == [100, 0, 0, 300]
    assert w.avg_osl.tolist() == [10, 0, 0, 30]
    assert list(w.rows())[1] == (0.0, 0.0, 0.0)


def test_averages_and_window_index_from_absolute_time():
    ts = np.array([20_000.0, 21_000.0, 29_999.0, 30_000.0])
    w = build_windows(ts, np.array([100, 200, 300, 50]), np.array([1, 2, 3, 4]), 10)
    assert w.first_index == 2  # floor(20000 / 10000): windows are not rebased to the first row
    assert w.num_req.tolist() == [3, 1]
    assert w.avg_isl.tolist() == [200, 50]
    assert w.avg_osl.tolist() == [2, 4]


def test_empty_trace_gives_no_windows():
    w = build_windows(np.array([]), np.array([], dtype=int), np.array([], dtype=int), 180)
    assert len(w) == 0


@pytest.mark.parametrize(
    "ts, isl, osl, match",
    [
        ([0.0, float("nan")], [1, 1], [1, 1], "row 1 has a non-finite timestamp"),
        ([0.0, 1.0], [1, -2], [1, 1], "row 1 input_length must be an integer >= 0"),
        ([0.0, 1.0], [1, 1], [1.5, 1], "row 0 output_length must be an integer >= 0"),
        ([0.0], [1, 1], [1, 1], "equally long"),
    ],
)
def test_bad_rows_raise_value_error(ts, isl, osl, match):
    with pytest.raises(ValueError, match=match):
        build_windows(np.array(ts), np.array(isl), np.array(osl), 10)


def test_bad_interval_raises():
    with pytest.raises(ValueError, match="interval_s must be a positive number"):
        build_windows(np.array([0.0]), np.array([1]), np.array([1]), 0)


def test_from_rows_round_trip():
    w = Windows.from_rows([(2, 100, 10), (0, 0, 0)], 60)
    assert len(w) == 2 and w.interval_s == 60.0
    assert list(w.rows()) == [(2.0, 100.0, 10.0), (0.0, 0.0, 0.0)]


def test_sine_trace_windows_follow_the_rate():
    gen = _sine_module()
    rows = gen.sine_trace_rows(duration_s=600, period_s=300, base_rps=4, amplitude_rps=4, isl=1000, osl=50)
    ts = np.array([r["timestamp"] for r in rows])
    assert np.all(np.diff(ts) >= 0)
    assert all(len(r["hash_ids"]) == 2 for r in rows)  # ceil(1000 / 512)
    w = build_windows(ts, np.array([r["input_length"] for r in rows]),
                      np.array([r["output_length"] for r in rows]), 75)
    expected = [sum(max(0, round(4 + 4 * np.sin(2 * np.pi * s / 300))) for s in range(k * 75, (k + 1) * 75))
                for k in range(8)]
    assert w.num_req.tolist() == expected
    assert w.num_req[0] + w.num_req[1] > w.num_req[2] + w.num_req[3]  # peak first, then the trough
    assert set(w.avg_isl.tolist()) == {1000.0}


def test_sine_trace_clamps_negative_rate(tmp_path):
    gen = _sine_module()
    rows = gen.sine_trace_rows(duration_s=100, period_s=100, base_rps=1, amplitude_rps=5, isl=10, osl=5)
    seconds = {int(r["timestamp"] // 1000) for r in rows}
    negative = {s for s in range(100) if 1 + 5 * np.sin(2 * np.pi * s / 100) < 0}
    assert negative and not seconds & negative  # a negative rate sends nothing
    assert len(rows) == sum(round(max(0.0, 1 + 5 * np.sin(2 * np.pi * s / 100))) for s in range(100))
    path = gen.write_sine_trace(tmp_path / "t.jsonl", duration_s=10, base_rps=2, amplitude_rps=0)
    assert len(path.read_text().splitlines()) == 20
