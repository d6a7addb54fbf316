"""The JSON Lines form of a materialised split (what a run's `data/*.jsonl` hold) and its keys in the run layout."""

from __future__ import annotations

import pytest

from asyncrl.storage.run_layout import RunPaths
from asyncrl.tasks.arithmetic import Problem
from asyncrl.tasks.jsonl import DatasetError
from asyncrl.tasks.rows import Row, decode_rows, digest, encode_rows, to_problems


def test_rows_round_trip_as_stable_bytes() -> None:
    rows = [Row("Calculate 2 + 3.", "5", {"z": 1, "a": [1, "é"]}), Row("x ✓", "-7")]
    data = encode_rows(rows)
    assert data == ('{"answer":"5","metadata":{"a":[1,"é"],"z":1},"prompt":"Calculate 2 + 3."}\n'
                    '{"answer":"-7","prompt":"x ✓"}\n').encode()
    assert decode_rows(data, "k") == rows and encode_rows(decode_rows(data, "k")) == data
    assert digest(data) == digest(encode_rows(list(rows))) and len(digest(data)) == 64
    assert to_problems(rows) == [Problem(0, "Calculate 2 + 3.", "5"), Problem(1, "x ✓", "-7")]
    assert encode_rows([]) == b"" and decode_rows(b"", "k") == []


@pytest.mark.parametrize("line", ['{"prompt": "a"}', '{"prompt": "a", "answer": ""}', '{"prompt": "a", "answer": 1}',
                                  '{"prompt": "a", "answer": "b", "x": 1}', '{"prompt": "a", "answer": "b", '
                                  '"metadata": [1]}', "[1]", "not json", '"s"'])
def test_anything_else_is_a_damaged_copy(line: str) -> None:
    data = b'{"answer":"5","prompt":"ok"}\n' + line.encode() + b"\n"
    with pytest.raises(DatasetError, match=r"^b/run/data/train.jsonl:2: expected a JSON object"):
        decode_rows(data, "b/run/data/train.jsonl")
    with pytest.raises(DatasetError, match="not UTF-8"):
        decode_rows(b"\xff\n", "k")


def test_run_layout_keys() -> None:
    paths = RunPaths("runs/x", "r1")
    assert paths.task_data() == "runs/x/r1/data/dataset.json"
    assert (paths.task_split("train"), paths.task_split("eval")) == ("runs/x/r1/data/train.jsonl",
                                                                     "runs/x/r1/data/eval.jsonl")
    with pytest.raises(ValueError, match="split: expected 'train' or 'eval', got 'test'"):
        paths.task_split("test")
