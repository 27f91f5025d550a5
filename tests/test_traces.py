import json
from pathlib import Path

import numpy as np
import pytest
from shared_data import REAL_TRACE, require

from spica_pipeline.errors import TraceError
from spica_pipeline.traces import read_mooncake_trace, trace_content_hash


def _row(ts=0, isl=1000, osl=10, hash_ids="auto"):
    row = {"timestamp": ts, "input_length": isl, "output_length": osl}
    if hash_ids == "auto":
        row["hash_ids"] = list(range(-(-isl // 512)))
    elif hash_ids is not None:
        row["hash_ids"] = hash_ids
    return row


def _write(tmp_path, lines, name="t.jsonl"):
    p = tmp_path / name
    p.write_text("\n".join(l if isinstance(l, str) else json.dumps(l) for l in lines) + "\n")
    return p


def test_reads_columns(tmp_path):
    p = _write(tmp_path, [_row(0, 1000, 10), _row(5.5, 512, 3, hash_ids=[7]), _row(9, 0, 0, hash_ids=None)])
    t = read_mooncake_trace(p)
    assert t.n_requests == 3
    assert t.path == str(p)
    np.testing.assert_array_equal(t.timestamp_ms, [0, 5.5, 9])
    np.testing.assert_array_equal(t.input_length, [1000, 512, 0])
    np.testing.assert_array_equal(t.output_length, [10, 3, 0])


def test_blank_lines_skipped_but_line_numbers_physical(tmp_path):
    p = _write(tmp_path, [_row(), "", "   ", '{"timestamp": 1, "input_length": 1.5, "output_length": 1}'])
    with pytest.raises(TraceError, match=r"t\.jsonl:4: 'input_length' must be a non-negative integer"):
        read_mooncake_trace(p)


@pytest.mark.parametrize(
    "line, reason",
    [
        ("not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        ('{"input_length": 1, "output_length": 1}', "missing 'timestamp'"),
        ('{"timestamp": "0", "input_length": 1, "output_length": 1}', "'timestamp' must be a number"),
        ('{"timestamp": true, "input_length": 1, "output_length": 1}', "'timestamp' must be a number"),
        ('{"timestamp": NaN, "input_length": 1, "output_length": 1}', "'timestamp' must be finite"),
        ('{"timestamp": Infinity, "input_length": 1, "output_length": 1}', "'timestamp' must be finite"),
        ('{"timestamp": 0, "output_length": 1}', "missing 'input_length'"),
        ('{"timestamp": 0, "input_length": -1, "output_length": 1}', "'input_length' must be a non-negative"),
        ('{"timestamp": 0, "input_length": 1, "output_length": 2.0}', "'output_length' must be a non-negative"),
        ('{"timestamp": 0, "input_length": 1, "output_length": "3"}', "'output_length' must be a non-negative"),
        ('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": 5}', "'hash_ids' must be a list"),
        ('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1, "a"]}', "'hash_ids' must be a list"),
        ('{"timestamp": 0, "input_length": 1025, "output_length": 1, "hash_ids": [1, 2]}',
         "input_length 1025 exceeds hash_ids capacity 1024"),
    ],
)
def test_bad_line_names_file_and_line(tmp_path, line, reason):
    p = _write(tmp_path, [_row(), _row(1), line])
    with pytest.raises(TraceError) as exc:
        read_mooncake_trace(p)
    msg = str(exc.value)
    assert msg.startswith(f"{p}:3: "), msg
    assert reason in msg
    assert "\n" not in msg


def test_max_input_length(tmp_path):
    p = _write(tmp_path, [_row(0, 4096, osl=0), _row(1, 4097, osl=0, hash_ids=None)])
    read_mooncake_trace(p, max_input_length=4097)
    with pytest.raises(TraceError, match=r":2: input_length 4097 exceeds the model context length 4096"):
        read_mooncake_trace(p, max_input_length=4096)


def test_block_size_changes_hash_capacity(tmp_path):
    p = _write(tmp_path, [_row(0, 600, hash_ids=[1, 2])])
    read_mooncake_trace(p)
    with pytest.raises(TraceError, match="exceeds hash_ids capacity 512"):
        read_mooncake_trace(p, block_size=256)


def test_file_level_errors(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(TraceError, match=rf"^{missing}: trace file does not exist$"):
        read_mooncake_trace(missing)
    with pytest.raises(TraceError, match="is a directory"):
        read_mooncake_trace(tmp_path)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(TraceError, match=rf"^{empty}: trace file is empty$"):
        read_mooncake_trace(empty)
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n \n\n")
    with pytest.raises(TraceError, match="trace file is empty"):
        read_mooncake_trace(blank)


def test_binary_garbage_names_line(tmp_path):
    p = tmp_path / "bin.jsonl"
    p.write_bytes(json.dumps(_row()).encode() + b"\n\xff\xfe\x00garbage\n")
    with pytest.raises(TraceError, match=rf"^{p}:2: not valid UTF-8"):
        read_mooncake_trace(p)


def test_content_hash(tmp_path):
    p = _write(tmp_path, [_row()])
    h1 = trace_content_hash(p)
    assert len(h1) == 64 and h1 == trace_content_hash(p)
    p.write_text(p.read_text() + json.dumps(_row(3)) + "\n")
    assert trace_content_hash(p) != h1
    with pytest.raises(TraceError, match="does not exist"):
        trace_content_hash(tmp_path / "x")


def test_4k_lines(tmp_path):
    rows = [_row(i * 10, 4000 + i % 100, 200) for i in range(4000)]
    p = _write(tmp_path, rows)
    t = read_mooncake_trace(p)
    assert t.n_requests == 4000


def test_real_trace():
    t = read_mooncake_trace(require(REAL_TRACE))
    assert t.n_requests > 1000
    assert (t.input_length > 0).all()
    assert t.timestamp_ms.min() >= 0


def test_context_check_counts_input_and_output(tmp_path):
    """40,904 + 283 tokens does not fit a 40,960 context even though the input alone does."""
    p = _write(tmp_path, [_row(0, 100), _row(1, 40904, osl=283, hash_ids=None)])
    with pytest.raises(TraceError, match=r":2: input_length 40904 \+ output_length 283 = 41187 tokens exceeds "
                                         r"the model context length 40960"):
        read_mooncake_trace(p, max_input_length=40960)
    read_mooncake_trace(p, max_input_length=41187)
